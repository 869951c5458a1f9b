"""fla's KDA call signatures (flash-linear-attention 0.6.0, ``fla.ops.kda``) over kdaguard's
entry points, forward only, and a backend for fla's dispatch.

* ``fused_recurrent_kda_fwd(..., inplace_final_state=True, ssm_state_indices=...)`` (the serving
  call) runs ``decode`` (one token per sequence) or ``prefill`` (no indices: slot n per sequence)
  in place on the caller's pool; a V-first pool (``state_v_first=True``) is used as it is.
* Dense-state calls (``chunk_kda``, ``fused_recurrent_kda``, ``fused_recurrent_kda_fwd`` with
  ``inplace_final_state=False``) return a new final state, as fla does: the initial states are
  copied into a V-first working pool and run by ``prefill`` with ``initial_state_indices =
  arange(N)``.
* fla's default state layout is K-first (``[N, HV, K, V]``). kdaguard's pools are V-first, and
  with K == V the shapes cannot tell them apart, so a K-first state is declined unless
  ``compat=True``, which transposes it into a V-first copy and back (exact: no arithmetic).

fla itself is an optional import: only ``register()`` and ``backend_class()`` need it. Every
decision is also available as ``verify(function_name, *args, **kwargs) -> (ok, reason)``; a
refusal's reason names the kdaguard rule ids (``kdaguard: decode rejected [dims.head_dim] ...``)
or the feature kdaguard lacks, and calls fla itself rejects are declined so that fla raises.
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from . import ContractViolation, KdaguardError, Unsupported, ops

#: (function, "ran" | "declined", reason) for every call the fla backend saw, in order; a
#: harness reads and clears it (``events.clear()``) to tell which calls reached kdaguard.
events: list[tuple[str, str, str]] = []


class _FlaRejects(Exception):
    """fla's own function refuses this call (fla raises its error once we decline)."""


def _unsupported(function, what):
    return Unsupported(f"kdaguard: {function} unsupported: {what}", function)


def _tokens(x, cu_seqlens, function):
    """[B, T, ...] -> [B*T, ...] as a view (B must be 1 with cu_seqlens, as in fla)."""
    if cu_seqlens is not None:
        return x[0]
    try:
        return x.view(x.shape[0] * x.shape[1], *x.shape[2:])
    except RuntimeError:
        raise _unsupported(function, f"a [B, T, ...] input of strides {tuple(x.stride())} cannot "
                                     "be viewed as [B*T, ...] without a copy") from None


def _seqlens(q, cu_seqlens, cu_seqlens_cpu=None):
    """int32 cu_seqlens on q's device (fla passes int64), and its host copy when given."""
    if cu_seqlens is None:
        B, T = q.shape[0], q.shape[1]
        cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=q.device)
        return cu, None
    cu = cu_seqlens.to(torch.int32)
    cpu = cu_seqlens_cpu.to(torch.int32) if cu_seqlens_cpu is not None else None
    return cu, cpu


def _gate(function, g, beta, A_log, dt_bias, lower_bound, use_gate_in_kernel,
          use_beta_sigmoid_in_kernel, allow_neg_eigval, HV):
    if allow_neg_eigval:
        raise _unsupported(function, "allow_neg_eigval (beta in (0, 2)) has no kdaguard form")
    kw = {}
    if use_gate_in_kernel:
        if A_log is None and lower_bound is None:
            raise _FlaRejects("use_gate_in_kernel=True needs A_log or lower_bound")
        if A_log is None:  # fla: lower_bound * sigmoid(g + dt_bias), i.e. exp(A_log) = 1
            A_log = torch.zeros(HV, dtype=torch.float32, device=g.device)
        kw.update(a=g, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound)
    else:  # fla ignores lower_bound for an activated g
        kw["g"] = g
    kw["b" if use_beta_sigmoid_in_kernel else "beta"] = beta
    return kw


def _grad_scope(forward_only, tensors):
    if forward_only and torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        return torch.no_grad()
    return contextlib.nullcontext()


class _Plan:
    """One fla call translated: the kdaguard entry, its keyword arguments (with a placeholder
    pool for a check) and how to shape the result as fla returns it."""

    def __init__(self, entry, kwargs, finish, grad_tensors):
        self.entry, self.kwargs, self.finish, self.grad_tensors = entry, kwargs, finish, grad_tensors


def _dense_plan(function, check, q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
                output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first,
                cu_seqlens, cu_seqlens_cpu, compat):
    B, T, HV, V, K = q.shape[0], q.shape[1], v.shape[2], v.shape[-1], q.shape[-1]
    if cu_seqlens is not None and B != 1:
        raise _FlaRejects(f"batch {B} with cu_seqlens")
    cu, cu_cpu = _seqlens(q, cu_seqlens, cu_seqlens_cpu)
    N = cu.shape[0] - 1
    if initial_state is not None:
        if initial_state.shape[0] != N:
            raise _FlaRejects(f"{initial_state.shape[0]} initial states for {N} sequences")
        if not state_v_first and not compat:
            raise _unsupported(function, "a K-first initial_state [N, HV, K, V] (fla's default); "
                                         "kdaguard's pools are V-first: pass state_v_first=True, "
                                         "or register(compat=True) for a transposed copy")
    if check:
        pool = torch.empty(N, HV, V, K, dtype=torch.float32, device=q.device)
    elif initial_state is None:
        pool = torch.zeros(N, HV, V, K, dtype=torch.float32, device=q.device)
    elif state_v_first:
        pool = initial_state.detach().clone(memory_format=torch.contiguous_format)
    else:
        pool = initial_state.detach().transpose(-1, -2).contiguous()
    kwargs = dict(q=_tokens(q, cu_seqlens, function), k=_tokens(k, cu_seqlens, function),
                  v=_tokens(v, cu_seqlens, function),
                  **_gate(function, _tokens(g, cu_seqlens, function),
                          _tokens(beta, cu_seqlens, function), A_log, dt_bias, lower_bound,
                          use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, HV),
                  cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, initial_state=pool,
                  initial_state_indices=torch.arange(N, dtype=torch.int32, device=q.device),
                  scale=scale, use_qk_l2norm=use_qk_l2norm_in_kernel)

    def finish(out):
        o = out.view(B, T, HV, V)
        if not output_final_state:
            return o, None
        return o, (pool if state_v_first else pool.transpose(-1, -2).contiguous())

    return _Plan("prefill", kwargs, finish, (q, k, v, g, beta, A_log, dt_bias, initial_state))


def _pool_plan(function, check, q, k, v, g, beta, A_log, dt_bias, initial_state, scale,
               state_v_first, cu_seqlens, ssm_state_indices, num_accepted_tokens,
               use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
               allow_neg_eigval, lower_bound, out, compat):
    if initial_state is None:
        raise _FlaRejects("inplace_final_state=True without initial_state")
    if num_accepted_tokens is not None or (ssm_state_indices is not None
                                           and ssm_state_indices.dim() != 1):
        raise _unsupported(function, "2-D ssm_state_indices / num_accepted_tokens (speculative "
                                     "decoding in one pool) has no kdaguard entry point; use "
                                     "kdaguard.ops.verify and commit")
    if not state_v_first and not compat:
        raise _unsupported(function, "a K-first pool [S, HV, K, V] (fla's default); kdaguard's "
                                     "pools are V-first: pass state_v_first=True, or "
                                     "register(compat=True) for a transposed copy")
    B, T, HV, V, K = q.shape[0], q.shape[1], v.shape[2], v.shape[-1], q.shape[-1]
    if cu_seqlens is not None and B != 1:
        raise _unsupported(function, f"batch {B} with cu_seqlens (fla flattens to batch 1)")
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    tokens = B * T
    one_token = tokens == N
    if ssm_state_indices is not None and not one_token:
        raise _unsupported(function, "several tokens per sequence with 1-D ssm_state_indices: fla "
                                     "stores token t's state in slot indices[n + t] (another row's "
                                     "slot), which kdaguard does not reproduce; decode takes one "
                                     "token per sequence (decode.one_token)")
    if state_v_first:
        pool = initial_state
    elif check:
        S = initial_state.shape[0]
        pool = torch.empty(S, HV, V, K, dtype=initial_state.dtype, device=q.device)
    else:
        pool = initial_state.detach().transpose(-1, -2).contiguous()
    qt, kt, vt = (_tokens(x, cu_seqlens, function) for x in (q, k, v))
    gate = _gate(function, _tokens(g, cu_seqlens, function), _tokens(beta, cu_seqlens, function),
                 A_log, dt_bias, lower_bound, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                 allow_neg_eigval, HV)
    out_tokens = None if out is None else _tokens(out, cu_seqlens, function)
    indices = ssm_state_indices
    if indices is None:
        indices = torch.arange(N, dtype=torch.int32, device=q.device)
    common = dict(q=qt, k=kt, v=vt, **gate, scale=scale, use_qk_l2norm=use_qk_l2norm_in_kernel,
                  out=out_tokens)
    if one_token:
        entry = "decode"
        kwargs = dict(common, state=pool, cache_indices=indices,
                      cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(torch.int32))
    else:
        cu, _ = _seqlens(q, cu_seqlens)
        entry = "prefill"
        kwargs = dict(common, initial_state=pool, initial_state_indices=indices, cu_seqlens=cu)

    def finish(result):
        if pool is not initial_state:
            initial_state.copy_(pool.transpose(-1, -2))
        o = out if out is not None else result.view(B, T, HV, V)
        return o, initial_state

    return _Plan(entry, kwargs, finish, (q, k, v, g, beta, A_log, dt_bias))


def _fwd_plan(check, compat, q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None,
              scale=None, output_final_state=False, inplace_final_state=True,
              state_v_first=False, cu_seqlens=None, ssm_state_indices=None,
              num_accepted_tokens=None, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
              use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
              out=None, **kwargs):
    function = "fused_recurrent_kda_fwd"
    if kwargs:
        raise _unsupported(function, f"arguments {sorted(kwargs)}")
    if v.dim() == beta.dim():
        raise _unsupported(function, "a per-channel (headwise) beta [B, T, HV, V]")
    if inplace_final_state:
        return _pool_plan(function, check, q, k, v, g, beta, A_log, dt_bias, initial_state,
                          scale, state_v_first, cu_seqlens, ssm_state_indices,
                          num_accepted_tokens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                          use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, out, compat)
    if ssm_state_indices is not None or num_accepted_tokens is not None or out is not None:
        raise _unsupported(function, "ssm_state_indices, num_accepted_tokens or out with "
                                     "inplace_final_state=False")
    return _dense_plan(function, check, q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
                       output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                       use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first,
                       cu_seqlens, None, compat)


def _chunk_plan(check, compat, q, k, v, g, beta, scale=None, initial_state=None,
                output_final_state=False, use_qk_l2norm_in_kernel=False,
                use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                allow_neg_eigval=False, safe_gate=False, lower_bound=None,
                disable_recompute=False, return_intermediate_states=False, state_v_first=False,
                cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None, use_graph=False,
                max_num_seqs=None, **kwargs):
    function = "chunk_kda"
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    chunk_size = kwargs.pop("chunk_size", 64)
    # what fla's chunk_kda raises for, declined so that fla raises it
    if "transpose_state_layout" in kwargs:
        raise _FlaRejects("the deprecated transpose_state_layout (fla maps or rejects it)")
    if chunk_size not in (32, 64):
        raise _FlaRejects(f"chunk_size={chunk_size}")
    if safe_gate and use_gate_in_kernel and (lower_bound is None or not -5 <= lower_bound < 0):
        raise _FlaRejects(f"safe_gate with lower_bound={lower_bound}")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise _FlaRejects("allow_neg_eigval without use_beta_sigmoid_in_kernel")
    if initial_state is not None and initial_state.dtype != torch.float32:
        raise _FlaRejects("an initial_state that is not float32")
    if kwargs:
        raise _unsupported(function, f"arguments {sorted(kwargs)}")
    if cp_context is not None:
        raise _unsupported(function, "context parallelism (cp_context)")
    if return_intermediate_states:
        raise _unsupported(function, "return_intermediate_states (per-chunk states)")
    if use_graph:
        raise _unsupported(function, "use_graph (Ascend graph mode)")
    # chunk_size, safe_gate and disable_recompute choose fla's chunking: one result here
    return _dense_plan(function, check, q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
                       output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                       use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first,
                       cu_seqlens, cu_seqlens_cpu, compat)


_PLANS = {"chunk_kda": _chunk_plan, "fused_recurrent_kda_fwd": _fwd_plan}


def verify(function_name, *args, compat=False, forward_only=False, **kwargs):
    """(True, None) when kdaguard can run this fla call, else (False, reason) naming the rule ids
    or the missing feature. Launches nothing (a dense call's check allocates an empty pool)."""
    try:
        plan = _PLANS[function_name](True, compat, *args, **kwargs)
        with _grad_scope(forward_only, plan.grad_tensors):
            verdict = ops.can_implement(plan.entry, **plan.kwargs)
    except _FlaRejects as e:
        return False, f"fla rejects this call itself: {e}"
    except KdaguardError as e:
        return False, str(e)
    if verdict.ok:
        return True, None
    return False, verdict.text


def run(function_name, *args, compat=False, forward_only=False, **kwargs):
    """Runs the fla call on kdaguard; raises ContractViolation / Unsupported where it cannot."""
    try:
        plan = _PLANS[function_name](False, compat, *args, **kwargs)
    except _FlaRejects as e:
        raise _unsupported(function_name, f"fla rejects this call itself: {e}") from None
    with _grad_scope(forward_only, plan.grad_tensors):
        entry = getattr(ops, plan.entry)
        return plan.finish(entry(**plan.kwargs))


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
              use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
              lower_bound=None, disable_recompute=False, return_intermediate_states=False,
              state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None,
              use_graph=False, max_num_seqs=None, **kwargs):
    """fla's ``chunk_kda`` (forward only) -> ``(o [B, T, HV, V], final_state or None)``.
    ``A_log``, ``dt_bias``, ``chunk_size`` and ``compat`` travel in kwargs."""
    compat = kwargs.pop("compat", False)
    return run("chunk_kda", q, k, v, g, beta, scale, initial_state, output_final_state,
               use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
               allow_neg_eigval, safe_gate, lower_bound, disable_recompute,
               return_intermediate_states, state_v_first, cu_seqlens, cu_seqlens_cpu, cp_context,
               use_graph, max_num_seqs, compat=compat, **kwargs)


def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None,
                            scale=None, output_final_state=False, inplace_final_state=True,
                            state_v_first=False, cu_seqlens=None, ssm_state_indices=None,
                            num_accepted_tokens=None, use_qk_l2norm_in_kernel=False,
                            use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                            allow_neg_eigval=False, lower_bound=None, out=None, **kwargs):
    """fla's ``fused_recurrent_kda_fwd`` -> ``(out, final_state)``; with
    ``inplace_final_state=True`` the pool ``initial_state`` is updated in place and returned."""
    compat = kwargs.pop("compat", False)
    return run("fused_recurrent_kda_fwd", q, k, v, g, beta, A_log, dt_bias, initial_state, scale,
               output_final_state, inplace_final_state, state_v_first, cu_seqlens,
               ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel,
               use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, out,
               compat=compat, **kwargs)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None,
                        initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                        lower_bound=None, state_v_first=False, cu_seqlens=None, **kwargs):
    """fla's ``fused_recurrent_kda`` (forward only) -> ``(o, final_state or None)``: a dense
    initial state, never modified."""
    compat = kwargs.pop("compat", False)
    if kwargs:
        raise _unsupported("fused_recurrent_kda", f"arguments {sorted(kwargs)}")
    return run("fused_recurrent_kda_fwd", q, k, v, g, beta, A_log, dt_bias, initial_state, scale,
               output_final_state, False, state_v_first, cu_seqlens,
               use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
               use_gate_in_kernel=use_gate_in_kernel,
               use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
               allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, compat=compat)


def backend_class(*, strict=False, forward_only=False, compat=False):
    """A subclass of fla's ``fla.backends.BaseBackend`` serving ``chunk_kda`` and
    ``fused_recurrent_kda_fwd``. Its verifiers decline with the kdaguard reason; with
    ``strict`` they accept every call fla itself would run, so that kdaguard raises instead
    (a harness then sees each refusal as an error naming its rules)."""
    from fla.backends import BaseBackend

    def make_verifier(function_name):
        def verifier(self, *args, **kwargs):
            ok, reason = verify(function_name, *args, compat=compat, forward_only=forward_only,
                                **kwargs)
            if not ok and strict and not reason.startswith("fla rejects"):
                return True, None
            if not ok:
                events.append((function_name, "declined", reason))
            return ok, reason
        verifier.__name__ = f"{function_name}_verifier"
        return verifier

    def make_impl(function_name):
        def implementation(self, *args, **kwargs):
            try:
                result = run(function_name, *args, compat=compat, forward_only=forward_only,
                             **kwargs)
            except (ContractViolation, Unsupported) as e:
                events.append((function_name, "refused", str(e)))
                raise
            events.append((function_name, "ran", ""))
            return result
        implementation.__name__ = function_name
        return implementation

    body = {"backend_type": "kdaguard", "package_name": "kdaguard", "env_var": "FLA_KDAGUARD",
            # registering is the opt-in; FLA_KDAGUARD=0 still turns it off
            "default_enable": True, "priority": 0,
            "__doc__": "kdaguard's KDA kernels behind its contract layer (forward only)."}
    for name in _PLANS:
        body[name] = make_impl(name)
        body[f"{name}_verifier"] = make_verifier(name)
    return type("KdaguardBackend", (BaseBackend,), body)


def register(*, strict=False, forward_only=False, compat=False):
    """Registers kdaguard with fla's KDA dispatch (fla >= 0.6.0: ``chunk_kda`` is dispatched per
    function, ``fused_recurrent_kda_fwd`` through the ``kda`` operation registry) at the highest
    priority. ``forward_only`` runs calls whose inputs require grad under no_grad (for tests that
    never call backward); ``compat`` accepts K-first states through transposed copies."""
    import fla.backends as fla_backends
    import fla.ops.kda.chunk as fla_chunk
    import fla.ops.kda.fused_recurrent  # noqa: F401  (creates the 'kda' operation registry)

    if "register" not in vars(fla_backends) or not inspect.isfunction(fla_backends.register):
        raise ImportError("kdaguard.fla.register needs fla >= 0.6.0 (fla.backends.register)")
    cls = backend_class(strict=strict, forward_only=forward_only, compat=compat)
    fla_backends.register(fla_chunk.chunk_kda)(cls)
    fla_backends.register("kda")(cls)
    return cls


__all__ = ["backend_class", "chunk_kda", "events", "fused_recurrent_kda",
           "fused_recurrent_kda_fwd", "register", "run", "verify"]
