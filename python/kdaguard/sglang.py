"""A kernel object with SGLang's linear-attention kernel interface (``LinearAttnKernelBase``:
decode, extend, target_verify, packed_decode) over kdaguard's ops.

SGLang's ``KDAAttnBackend`` passes q/k/v as ``[1, T, H, K]`` strided views of the packed conv
output, a raw gate ``a [T, HV*K]`` with ``A_log [1, 1, HV, 1]`` and ``dt_bias [HV*K]``, beta
logits for decode/verify and a sigmoided beta for extend, and a V-first pool ``[S, HV, V, K]``
(f32 or bf16, slot stride possibly above HV*V*K). All of it is taken as views; outputs come back
as ``[1, T, HV, V]`` views of a fresh ``out`` (``v`` is never written).

What kdaguard cannot do raises ``kdaguard.Unsupported`` naming it, for the dispatcher to fall
back on: tree verify (``retrieve_parent_token``), ReplaySSM / ring-cache arguments,
intermediate-state outputs (``return_intermediate_states``), and extend for speculative drafts
(``is_spec_decode``: kdaguard's prefill writes the pool in place, which must stay rollback-able).
Commit stays SGLang's own (one fused kernel over all layers).
"""

from __future__ import annotations

import torch

from . import Unsupported, ops

# Keyword arguments SGLang may pass that this kernel does not implement; any value other than
# None / False declines the call.
_REPLAYSSM_PREFIXES = ("replayssm", "cache_ring")


def _decline_extras(entry, extras):
    active = {n: v for n, v in extras.items() if v is not None and v is not False}
    if not active:
        return
    replay = sorted(n for n in active if n.startswith(_REPLAYSSM_PREFIXES))
    if replay:
        raise Unsupported(f"kdaguard: {entry} unsupported: ReplaySSM / ring-cache arguments "
                          f"{replay}", entry)
    raise Unsupported(f"kdaguard: {entry} unsupported: arguments {sorted(active)}", entry)


def _host_seqlens(lens):
    """A host cu_seqlens from SGLang's extend_seq_lens_cpu (a list), used only outside capture."""
    if lens is None or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        return None
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(list(lens), dtype=torch.int64).cumsum(0)
    return cu


class KdaguardKDAKernel:
    """SGLang KDA kernel backend on kdaguard (decode, extend, target_verify, packed_decode)."""

    supports_packed_decode = True
    uses_state_checkpoints = False

    def __init__(self, *, error_word=None):
        # the error word the device guard reports into (default: kdaguard's per device)
        self.error_word = error_word

    def decode(self, q, k, v, a, b, *, A_log, dt_bias, ssm_states, cache_indices,
               query_start_loc, lower_bound=None, **kwargs):
        _decline_extras("decode", kwargs)
        out = ops.decode(q, k, v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=ssm_states,
                         cache_indices=cache_indices, cu_seqlens=query_start_loc,
                         lower_bound=lower_bound, use_qk_l2norm=True, error_word=self.error_word)
        return out.unsqueeze(0)

    def packed_decode(self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states, cache_indices,
                      num_v_heads, head_v_dim, lower_bound=None, **kwargs):
        _decline_extras("decode", kwargs)
        B = mixed_qkv.shape[0]
        HV, V, K = num_v_heads, head_v_dim, ssm_states.shape[-1]
        qk = mixed_qkv.shape[1] - HV * V
        if qk <= 0 or qk % (2 * K):
            raise Unsupported(f"kdaguard: decode unsupported: mixed_qkv width {mixed_qkv.shape[1]}"
                              f" is not 2*H*{K} + {HV}*{V}", "decode")
        H = qk // (2 * K)
        q = mixed_qkv[:, :H * K].view(B, H, K)
        k = mixed_qkv[:, H * K:2 * H * K].view(B, H, K)
        v = mixed_qkv[:, 2 * H * K:].view(B, HV, V)
        out = ops.decode(q, k, v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=ssm_states,
                         cache_indices=cache_indices, scale=scale, lower_bound=lower_bound,
                         use_qk_l2norm=True, error_word=self.error_word)
        return out.unsqueeze(0)

    def extend(self, q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc,
               A_log=None, dt_bias=None, lower_bound=None, extend_seq_lens_cpu=None,
               is_spec_decode=False, return_intermediate_states=False, track_ssm_h_src=None,
               **kwargs):
        if return_intermediate_states or track_ssm_h_src is not None:
            raise Unsupported("kdaguard: prefill unsupported: intermediate-state outputs "
                              "(return_intermediate_states / track_ssm_h_src)", "prefill")
        if is_spec_decode:
            raise Unsupported("kdaguard: prefill unsupported: is_spec_decode (kdaguard's prefill "
                              "commits the pool in place; a draft extend must stay "
                              "rollback-able)", "prefill")
        _decline_extras("prefill", kwargs)
        gate = dict(a=g, A_log=A_log, dt_bias=dt_bias) if A_log is not None else dict(g=g)
        out = ops.prefill(q, k, v, **gate, beta=beta, cu_seqlens=query_start_loc,
                          initial_state=ssm_states, initial_state_indices=cache_indices,
                          lower_bound=lower_bound, use_qk_l2norm=True,
                          cu_seqlens_cpu=_host_seqlens(extend_seq_lens_cpu),
                          error_word=self.error_word)
        return out.unsqueeze(0)

    def target_verify(self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices,
                      query_start_loc, intermediate_states_buffer, intermediate_state_indices,
                      cache_steps, retrieve_parent_token=None, lower_bound=None, **kwargs):
        if retrieve_parent_token is not None:
            raise Unsupported("kdaguard: verify unsupported: tree verify (retrieve_parent_token);"
                              " kdaguard verifies chains", "verify")
        _decline_extras("verify", kwargs)
        out = ops.verify(q, k, v, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                         cu_seqlens=query_start_loc, state=ssm_states,
                         cache_indices=cache_indices, scratch=intermediate_states_buffer,
                         scratch_row_map=intermediate_state_indices, draft_token_num=cache_steps,
                         lower_bound=lower_bound, use_qk_l2norm=True, error_word=self.error_word)
        return out.unsqueeze(0)


__all__ = ["KdaguardKDAKernel"]
