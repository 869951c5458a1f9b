"""The contract layout of kda.h with keyword arguments (shared/spec/contracts.md).

Engines' shapes are accepted as views, never copies: a leading batch dim of 1 (``[1, T, H, K]``),
``A_log`` as ``[1, 1, HV, 1]``, a raw gate ``a`` or ``g`` as ``[T, HV*K]``, ``b``/``beta`` as
``[1, T, HV]`` or ``[T, HV, 1]``. The ops take these layouts themselves, as the views torch would
make of them, so no view is created per call. A tensor that cannot be viewed so is passed on as it
is and refused with its rule.
Mutated tensors (state, out, scratch) are never reshaped, copied or made contiguous.

Every entry point returns ``out`` (allocated as ``[T, HV, V]`` in v's dtype when not given).
The ops are inference-only: an input that requires grad while grad mode is on is refused.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import (ContractViolation, DeviceGuardTripped, Unsupported, Violation, error_from_text,
               rules)

_ops = torch.ops.kdaguard
_decode, _prefill, _verify, _commit = (_ops.decode.default, _ops.prefill.default,
                                       _ops.verify.default, _ops.commit.default)
_record_verify, _replay_commit, _accept_verify = (_ops.record_verify.default,
                                                  _ops.replay_commit.default,
                                                  _ops.accept_verify.default)
_error_words: dict[torch.device, torch.Tensor] = {}


def error_word(device) -> torch.Tensor:
    """The default error word of `device` (int64[1]), which the device guard ORs rule bits into.
    Created on first use, which must not be under CUDA graph capture (``warm_up`` creates it)."""
    word = _error_words.get(device)  # a tensor's .device names an existing word as it is
    if word is not None:
        return word
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    word = _error_words.get(device)
    if word is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise Unsupported("kdaguard: the default error word of "
                              f"{device} would be created under CUDA graph capture; call "
                              "kdaguard.ops.warm_up(...) or pass error_word= before capturing")
        word = torch.zeros(1, dtype=torch.int64, device=device)
        _error_words[device] = word
    return word


_default_error_word = error_word


def rules_in(word: int) -> tuple[str, ...]:
    """The rule ids whose bits are set in an error word's value, in catalogue order."""
    return tuple(r.id for r in rules() if word & r.bit)


def check_error_word(word: torch.Tensor, *, reset: bool = True) -> None:
    """Reads the error word (one device sync) and raises DeviceGuardTripped naming the rules the
    device guard found broken; clears the word first when `reset`."""
    value = int(word.reshape(-1)[0].item())
    if reset and value:
        word.zero_()
    if value:
        fired = rules_in(value)
        text = (f"kdaguard: device guard tripped [{', '.join(fired)}]\n" +
                "".join(f"{r} (device): rows breaking it were skipped\n" for r in fired))
        raise DeviceGuardTripped(text, "device", fired,
                                 tuple(Violation(r, "device", "rows breaking it were skipped")
                                       for r in fired))


def warm_up(device, *, K: int, V: int, io_dtype: torch.dtype, state_dtype: torch.dtype,
            entries=("decode", "prefill", "verify", "commit", "record_verify", "replay_commit",
                     "accept_verify")) -> None:
    """Readies the entry points for these dims and dtypes on a CUDA device, so that the next
    calls may be captured in a CUDA graph (kda.h: prepare), and creates the default error word."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    for entry in entries:
        _run(_ops.prepare.default, None, (entry, K, V, io_dtype, state_dtype, index))
    error_word(torch.device("cuda", index))


def prefill_workspace_bytes(total_tokens: int, num_seqs: int, *, HV: int, K: int, V: int,
                            io_dtype: torch.dtype) -> int:
    """Bytes of workspace a CUDA prefill of that size needs (0 for f32 inputs; -1 for dims
    without kernels). A workspace sized for the largest call serves every smaller one."""
    return int(_ops.prefill_workspace_bytes.default(total_tokens, num_seqs, HV, K, V, io_dtype))


def prefill_workspace(total_tokens: int, num_seqs: int, *, HV: int, K: int, V: int,
                      io_dtype: torch.dtype, device) -> torch.Tensor:
    """A workspace from torch's caching allocator for prefills up to that size."""
    nbytes = prefill_workspace_bytes(total_tokens, num_seqs, HV=HV, K=K, V=V, io_dtype=io_dtype)
    if nbytes < 0:
        raise Unsupported(f"kdaguard: prefill unsupported: no kernels for HV={HV}, K={K}, V={V}, "
                          f"{io_dtype}")
    return torch.empty(max(nbytes, 16), dtype=torch.uint8, device=device)


# An eager call through an OpOverload first scans every argument for __torch_function__
# overrides, in Python, at about as much host time as the rest of the dispatch for a B = 1
# decode. Where nothing can override the call (torch._C._has_torch_function, torch's own test in
# C: no torch function mode is active and no argument is a tensor subclass with an override; a
# Parameter's is disabled), the op is called through its dispatcher handle directly, with the
# same boxing, dispatch keys and kernels, so torch dispatch modes (fake tensors, make_fx) still
# see it. Only Dynamo, which cannot trace that call, gets the OpOverload. The handles are looked
# up once here: an OpOverload hashes in Python.
_call_boxed = torch._C._dispatch_call_boxed
_has_torch_function = torch._C._has_torch_function
_decode_handle, _prefill_handle, _verify_handle, _commit_handle = (
    op._handle for op in (_decode, _prefill, _verify, _commit))
_record_verify_handle, _replay_commit_handle, _accept_verify_handle = (
    op._handle for op in (_record_verify, _replay_commit, _accept_verify))
_is_dynamo_compiling = torch.compiler.is_dynamo_compiling
_is_grad_enabled = torch.is_grad_enabled


def _run(op, handle, args):
    # `args` is one tuple, so the arguments are packed once between the entry point and the op
    if _is_dynamo_compiling():
        return op(*args)
    try:
        if handle is None or _has_torch_function(args):
            return op(*args)
        return _call_boxed(handle, *args)
    except (ValueError, RuntimeError) as e:
        err = error_from_text(str(e))
        if err is None:
            raise
    # Raised outside the handler and the local dropped as it leaves: a traceback holds this frame,
    # and a frame that still held the error would make a cycle that keeps the call's tensors
    # (the whole state pool) alive until the garbage collector runs.
    try:
        raise err from None
    finally:
        del err


# The engine layouts (a leading batch dim of 1, a gate [T, HV*K], beta [T, HV, 1], A_log of HV
# elements) are taken by the ops themselves, as the views torch would make of them: a view made
# here would cost about as much host time as the op's own bookkeeping for a B = 1 decode.


def _refuse_grad(entry, tensors):
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise Unsupported(
                f"kdaguard: {entry} unsupported: kdaguard is inference-only (no backward); "
                f"{name} requires grad while grad mode is on: run under torch.no_grad() or "
                "torch.inference_mode(), or detach it")


def _refuse_layout(entry, state_layout):
    raise Unsupported(
        f"kdaguard: {entry} unsupported: state_layout={state_layout!r}; kdaguard's pools are "
        "V-first, [S, HV, V, K] ('vk'); a K-first pool ('kv', vLLM's) would be read "
        "transposed, which the shapes alone cannot reveal when K == V")


def _new_out(v):
    # [T, HV, V] in v's dtype, for v [T, HV, V] or [1, T, HV, V]
    shape = v.shape
    if len(shape) == 4 and shape[0] == 1:
        shape = shape[1:]
    return torch.empty(shape[0], shape[1], shape[2], dtype=v.dtype, device=v.device)


def _rows(out):
    # the [T, HV, V] view of an out given as [1, T, HV, V]
    return out[0] if out.dim() == 4 and out.shape[0] == 1 else out


def decode(q, k, v, *, state, cache_indices, a=None, g=None, A_log=None, dt_bias=None, b=None,
           beta=None, cu_seqlens=None, out=None, scale=None, lower_bound=None,
           use_qk_l2norm=False, error_word=None, cache_indices_cpu=None, state_layout="vk",
           chunks_per_block=0):
    """One token per request; state slot cache_indices[i] updated in place; -1 rows get zero
    output and no state access. Returns out ``[B, HV, V]``."""
    if state_layout != "vk":
        _refuse_layout("decode", state_layout)
    if _is_grad_enabled():
        _refuse_grad("decode", {"q": q, "k": k, "v": v, "a": a, "g": g, "b": b, "beta": beta,
                                "state": state})
    if error_word is None:
        error_word = _default_error_word(q.device)
    out = _new_out(v) if out is None else out
    # the schema's trailing defaults are left to the dispatcher: each one passed costs host time
    if cache_indices_cpu is None and chunks_per_block == 0:
        _run(_decode, _decode_handle,
             (q, k, v, a, g, A_log, dt_bias, b, beta, state, cache_indices, cu_seqlens, out,
              error_word, scale, lower_bound, use_qk_l2norm))
    else:
        _run(_decode, _decode_handle,
             (q, k, v, a, g, A_log, dt_bias, b, beta, state, cache_indices, cu_seqlens, out,
              error_word, scale, lower_bound, use_qk_l2norm, cache_indices_cpu,
              chunks_per_block))
    return out if out.ndim == 3 else _rows(out)


def _prologue(entry, state_layout, device, error_word, grads):
    # An entry point's checks before its op, in this order: the pool layout, grad mode (`grads`:
    # the inputs by name, passed only while grad mode is on, so no dict is built otherwise), then
    # the default error word. decode spells them out instead: its host time is measured per call.
    if state_layout != "vk":
        _refuse_layout(entry, state_layout)
    if grads:
        _refuse_grad(entry, grads)
    return _default_error_word(device) if error_word is None else error_word


def prefill(q, k, v, *, cu_seqlens, initial_state, initial_state_indices, a=None, g=None,
            A_log=None, dt_bias=None, b=None, beta=None, out=None, workspace=None, scale=None,
            lower_bound=None, use_qk_l2norm=False, error_word=None, cu_seqlens_cpu=None,
            initial_state_indices_cpu=None, state_layout="vk"):
    """Varlen prefill: sequence n's tokens [cu_seqlens[n], cu_seqlens[n+1]) start from slot
    initial_state_indices[n], whose final state is written back in place. Returns out."""
    error_word = _prologue("prefill", state_layout, q.device, error_word, _is_grad_enabled() and {
        "q": q, "k": k, "v": v, "a": a, "g": g, "b": b, "beta": beta,
        "initial_state": initial_state})
    out = _new_out(v) if out is None else out
    _run(_prefill, _prefill_handle,
         (q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, initial_state,
          initial_state_indices, out, error_word, workspace, scale, lower_bound, use_qk_l2norm,
          cu_seqlens_cpu, initial_state_indices_cpu))
    return _rows(out)


def verify(q, k, v, *, cu_seqlens, state, cache_indices, scratch, draft_token_num,
           scratch_row_map=None, scratch_indices=None, a=None, g=None, A_log=None, dt_bias=None,
           b=None, beta=None, out=None, scale=None, lower_bound=None, use_qk_l2norm=False,
           error_word=None, cu_seqlens_cpu=None, cache_indices_cpu=None, state_layout="vk",
           chunks_per_block=0):
    """N rows of up to T draft tokens from the committed state (read only); the state after step
    t of row n goes to its scratch slot. Returns out."""
    error_word = _prologue("verify", state_layout, q.device, error_word, _is_grad_enabled() and {
        "q": q, "k": k, "v": v, "a": a, "g": g, "b": b, "beta": beta})
    out = _new_out(v) if out is None else out
    _run(_verify, _verify_handle,
         (q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, state, cache_indices, scratch,
          scratch_row_map, scratch_indices, out, error_word, draft_token_num, scale, lower_bound,
          use_qk_l2norm, cu_seqlens_cpu, cache_indices_cpu, chunks_per_block))
    return _rows(out)


def commit(*, scratch, state, cache_indices, accepted, draft_token_num, scratch_row_map=None,
           scratch_indices=None, cu_seqlens=None, error_word=None, state_layout="vk"):
    """Copies the state after row n's last accepted step into slot cache_indices[n]."""
    error_word = _prologue("commit", state_layout, state.device, error_word, None)
    _run(_commit, _commit_handle,
         (scratch, scratch_row_map, scratch_indices, state, cache_indices, accepted, cu_seqlens,
          error_word, draft_token_num))


def record_verify(q, k, v, *, cu_seqlens, state, cache_indices, records, draft_token_num, a=None,
                  g=None, A_log=None, dt_bias=None, b=None, beta=None, out=None, scale=None,
                  lower_bound=None, use_qk_l2norm=False, error_word=None, state_layout="vk"):
    """verify's outputs from the committed state (read only), with per (row, step, value head)
    the record g | k | u in records [S_rec, T_alloc, HV, 2K+V] (f32) instead of the step's
    state. Returns out."""
    error_word = _prologue("record_verify", state_layout, q.device, error_word,
                           _is_grad_enabled() and {"q": q, "k": k, "v": v, "a": a, "g": g,
                                                   "b": b, "beta": beta})
    out = _new_out(v) if out is None else out
    _run(_record_verify, _record_verify_handle,
         (q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, state, cache_indices, records, out,
          error_word, draft_token_num, scale, lower_bound, use_qk_l2norm))
    return _rows(out)


def replay_commit(*, records, state, cache_indices, accepted, draft_token_num, cu_seqlens=None,
                  error_word=None, state_layout="vk"):
    """Replays row n's first accepted[n] records onto slot cache_indices[n], in place."""
    error_word = _prologue("replay_commit", state_layout, state.device, error_word, None)
    _run(_replay_commit, _replay_commit_handle,
         (records, state, cache_indices, accepted, cu_seqlens, error_word, draft_token_num))


def accept_verify(q, k, v, *, cu_seqlens, state, cache_indices, prior_records, prior_accepted,
                  records, draft_token_num, a=None, g=None, A_log=None, dt_bias=None, b=None,
                  beta=None, out=None, scale=None, lower_bound=None, use_qk_l2norm=False,
                  error_word=None, state_layout="vk"):
    """The fused step: replay_commit of prior_records / prior_accepted onto each row's slot in
    place, then record_verify of the new draft from it into records. Returns out."""
    error_word = _prologue("accept_verify", state_layout, q.device, error_word,
                           _is_grad_enabled() and {"q": q, "k": k, "v": v, "a": a, "g": g,
                                                   "b": b, "beta": beta, "state": state})
    out = _new_out(v) if out is None else out
    _run(_accept_verify, _accept_verify_handle,
         (q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, state, cache_indices, prior_records,
          prior_accepted, records, out, error_word, draft_token_num, scale, lower_bound,
          use_qk_l2norm))
    return _rows(out)


class Verdict(NamedTuple):
    ok: bool
    text: str                    # empty when ok, else the text the call would raise
    error: Exception | None      # the ContractViolation / Unsupported the call would raise

    @property
    def rules(self) -> tuple[str, ...]:
        return getattr(self.error, "rules", ())


def can_implement(entry: str, q=None, k=None, v=None, **kw) -> Verdict:
    """Whether the call can run, without launching anything; never raises for a refusal."""
    grad = {n: t for n, t in dict(q=q, k=k, v=v, **kw).items() if isinstance(t, torch.Tensor)}
    try:
        if "state_layout" in kw and kw["state_layout"] != "vk":
            _refuse_layout(entry, kw["state_layout"])
        if torch.is_grad_enabled():
            _refuse_grad(entry, grad)
    except Unsupported as e:
        return Verdict(False, str(e), e)
    for name in ("state_layout", "error_word", "workspace", "cu_seqlens_cpu",
                 "cache_indices_cpu", "initial_state_indices_cpu", "chunks_per_block"):
        kw.pop(name, None)
    if entry not in ("commit", "replay_commit"):
        out = kw.pop("out", None)
        tok = (q, k, v, kw.pop("a", None), kw.pop("g", None), kw.pop("A_log", None),
               kw.pop("dt_bias", None), kw.pop("b", None), kw.pop("beta", None))
        out = _new_out(v) if out is None else out
        sc = (kw.pop("scale", None), kw.pop("lower_bound", None), kw.pop("use_qk_l2norm", False))
    if entry == "decode":
        text = _ops.can_decode.default(*tok, kw.pop("state"), kw.pop("cache_indices"),
                                       kw.pop("cu_seqlens", None), out, *sc)
    elif entry == "prefill":
        text = _ops.can_prefill.default(*tok, kw.pop("cu_seqlens"), kw.pop("initial_state"),
                                        kw.pop("initial_state_indices"), out, *sc)
    elif entry == "verify":
        text = _ops.can_verify.default(*tok, kw.pop("cu_seqlens"), kw.pop("state"),
                                       kw.pop("cache_indices"), kw.pop("scratch"),
                                       kw.pop("scratch_row_map", None),
                                       kw.pop("scratch_indices", None), out,
                                       kw.pop("draft_token_num"), *sc)
    elif entry == "commit":
        text = _ops.can_commit.default(kw.pop("scratch"), kw.pop("scratch_row_map", None),
                                       kw.pop("scratch_indices", None), kw.pop("state"),
                                       kw.pop("cache_indices"), kw.pop("accepted"),
                                       kw.pop("cu_seqlens", None), kw.pop("draft_token_num"))
    elif entry == "record_verify":
        text = _ops.can_record_verify.default(*tok, kw.pop("cu_seqlens"), kw.pop("state"),
                                              kw.pop("cache_indices"), kw.pop("records"), out,
                                              kw.pop("draft_token_num"), *sc)
    elif entry == "replay_commit":
        text = _ops.can_replay_commit.default(kw.pop("records"), kw.pop("state"),
                                              kw.pop("cache_indices"), kw.pop("accepted"),
                                              kw.pop("cu_seqlens", None), kw.pop("draft_token_num"))
    elif entry == "accept_verify":
        text = _ops.can_accept_verify.default(*tok, kw.pop("cu_seqlens"), kw.pop("state"),
                                              kw.pop("cache_indices"), kw.pop("prior_records"),
                                              kw.pop("prior_accepted"), kw.pop("records"), out,
                                              kw.pop("draft_token_num"), *sc)
    else:
        raise ValueError(f"kdaguard: unknown entry point {entry!r}")
    if kw:
        raise TypeError(f"kdaguard.ops.can_implement({entry!r}): unexpected {sorted(kw)}")
    if not text:
        return Verdict(True, "", None)
    err = error_from_text(text)
    return Verdict(False, text, err)


__all__ = ["ContractViolation", "Verdict", "accept_verify", "can_implement", "check_error_word",
           "commit", "decode", "error_word", "prefill", "prefill_workspace",
           "prefill_workspace_bytes", "record_verify", "replay_commit", "rules_in", "verify",
           "warm_up"]
