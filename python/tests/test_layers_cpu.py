"""kdaguard.fla and kdaguard.sglang on the CPU (the f64 reference) against the independent
pure-torch oracle, on those projects' layouts; their declines; fla's dispatch when fla is
installed (skipped otherwise)."""

import importlib.util

import pytest
import torch

import kdaguard
from kdaguard import fla as kfla
from kdaguard import ops
from kdaguard.sglang import KdaguardKDAKernel

import kda_oracle as oracle
from test_ops_cpu import decode_problem, expected_decode, storage_bytes


def _gen(seed):
    gen = torch.Generator().manual_seed(seed)
    return gen, (lambda *s, dt=torch.float32: torch.randn(*s, generator=gen).to(dt))


def _oracle_dense(q, k, v, g, beta, h0_vk, cu, scale=None, l2norm=False):
    """o [T, HV, V] and final states {n: [HV, V, K]} for token-flattened inputs."""
    rows = [n for n in range(len(cu) - 1) for _ in range(cu[n + 1] - cu[n])]
    states = {n: h0_vk[n].double().clone() for n in range(len(cu) - 1)}
    o = oracle.run_rows(states, q, k, v, g, beta, scale=scale, l2norm=l2norm, row_of_token=rows)
    return o, states


# ---- kdaguard.fla ----

@pytest.mark.parametrize("state_v_first", [False, True])
def test_fla_chunk_kda_dense_state_matches_oracle(state_v_first):
    gen, rnd = _gen(11)
    B, T, H, HV, K, V = 2, 7, 1, 2, 64, 128
    q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, HV, V)
    g = -torch.rand(B, T, HV, K, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    h0_kv = rnd(B, HV, K, V) * 0.1
    h0 = h0_kv.transpose(-1, -2).contiguous() if state_v_first else h0_kv
    h0_before = h0.clone()
    o, ht = kfla.chunk_kda(q, k, v, g, beta, scale=0.3, initial_state=h0, output_final_state=True,
                           use_qk_l2norm_in_kernel=True, state_v_first=state_v_first,
                           compat=not state_v_first)
    flat = lambda x: x.reshape(B * T, *x.shape[2:])  # noqa: E731
    o_ref, states = _oracle_dense(flat(q), flat(k), flat(v), flat(g).double(), flat(beta).double(),
                                  h0_kv.transpose(-1, -2), [0, T, 2 * T], scale=0.3, l2norm=True)
    assert o.shape == (B, T, HV, V)
    assert oracle.rms_ratio(flat(o), o_ref) <= 1e-6
    for n in range(B):
        got = ht[n] if state_v_first else ht[n].transpose(-1, -2)
        assert oracle.rms_ratio(got, states[n]) <= 1e-6
    assert torch.equal(h0, h0_before), "fla's dense initial_state is never modified"


def test_fla_k_first_state_is_declined_without_compat():
    _, rnd = _gen(12)
    q, k, v = rnd(1, 3, 1, 64), rnd(1, 3, 1, 64), rnd(1, 3, 1, 64)
    g, beta = -torch.rand(1, 3, 1, 64), torch.rand(1, 3, 1)
    ok, reason = kfla.verify("chunk_kda", q, k, v, g, beta, initial_state=rnd(1, 1, 64, 64))
    assert not ok and "K-first" in reason
    with pytest.raises(kdaguard.Unsupported, match="K-first"):
        kfla.chunk_kda(q, k, v, g, beta, initial_state=rnd(1, 1, 64, 64))


@pytest.mark.parametrize("io", [torch.bfloat16, torch.float32])
def test_fla_fused_recurrent_kda_fwd_in_place_pool(io):
    """fla's serving call (vLLM-style decode) on a V-first pool whose unused slots hold 1e30:
    outputs and used slots against the oracle, unused slots bit-identical, the pool mutated in
    place; gate in kernel with lower_bound and no A_log, beta logits."""
    gen, rnd = _gen(13)
    B, H, HV, K, V, S = 5, 2, 4, 64, 64, 15
    q, k, v = rnd(1, B, H, K, dt=io), rnd(1, B, H, K, dt=io), rnd(1, B, HV, V, dt=io)
    g_raw = rnd(1, B, HV, K, dt=torch.float32)
    b = rnd(1, B, HV, dt=io)
    dt_bias = rnd(HV * K) * 0.1
    pool = torch.full((S, HV, V, K), 1e30)
    idx = torch.randperm(S, generator=gen)[:B].to(torch.int32)
    pool[idx.long()] = rnd(B, HV, V, K) * 0.1
    before = pool.clone()
    cu = torch.arange(B + 1, dtype=torch.int32)
    o, state = kfla.fused_recurrent_kda_fwd(
        q, k, v, g_raw, b, A_log=None, dt_bias=dt_bias, initial_state=pool, scale=None,
        inplace_final_state=True, state_v_first=True, cu_seqlens=cu, ssm_state_indices=idx,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        lower_bound=-5.0)
    assert state is pool and o.shape == v.shape
    g = oracle.gate_values(a=g_raw[0], A_log=torch.zeros(HV), dt_bias=dt_bias, lower_bound=-5.0)
    states = {n: before[s].double().clone() for n, s in enumerate(idx.tolist())}
    o_ref = oracle.run_rows(states, q[0], k[0], v[0], g, torch.sigmoid(b[0].double()),
                            l2norm=True, row_of_token=list(range(B)))
    assert oracle.rms_ratio(o[0], o_ref) <= (1e-6 if io == torch.float32 else 1e-2)
    for n, s in enumerate(idx.tolist()):
        assert oracle.rms_ratio(pool[s], states[n]) <= 1e-6
    unused = torch.ones(S, dtype=torch.bool)
    unused[idx.long()] = False
    assert torch.equal(pool[unused], before[unused])


def test_fla_fused_recurrent_k_first_compat_keeps_unused_slots_exact():
    gen, rnd = _gen(14)
    B, H, K = 3, 2, 128
    pool_kv = torch.full((3 * B, H, K, K), 1e30)
    idx = torch.randperm(3 * B, generator=gen)[:B].to(torch.int32)
    pool_kv[idx.long()] = rnd(B, H, K, K) * 0.1
    before = pool_kv.clone()
    q, k, v = rnd(1, B, H, K), rnd(1, B, H, K), rnd(1, B, H, K)
    g, beta = -torch.rand(1, B, H, K, generator=gen), torch.rand(1, B, H, generator=gen)
    o, _ = kfla.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool_kv,
                                        cu_seqlens=torch.arange(B + 1), ssm_state_indices=idx,
                                        compat=True)
    states = {n: before[s].transpose(-1, -2).double().clone() for n, s in enumerate(idx.tolist())}
    o_ref = oracle.run_rows(states, q[0], k[0], v[0], g[0].double(), beta[0].double(),
                            row_of_token=list(range(B)))
    assert oracle.rms_ratio(o[0], o_ref) <= 1e-6
    for n, s in enumerate(idx.tolist()):
        assert oracle.rms_ratio(pool_kv[s].transpose(-1, -2), states[n]) <= 1e-6
    unused = torch.ones(3 * B, dtype=torch.bool)
    unused[idx.long()] = False
    assert torch.equal(pool_kv[unused], before[unused])


def test_fla_fused_recurrent_kda_varlen_prefill():
    gen, rnd = _gen(15)
    cu = [0, 4, 4, 13]
    T, H, HV, K, V = cu[-1], 1, 2, 64, 64
    q, k, v = rnd(1, T, H, K), rnd(1, T, H, K), rnd(1, T, HV, V)
    g, beta = -torch.rand(1, T, HV, K, generator=gen), torch.rand(1, T, HV, generator=gen)
    h0 = rnd(3, HV, V, K) * 0.1
    o, ht = kfla.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                     state_v_first=True, cu_seqlens=torch.tensor(cu))
    o_ref, states = _oracle_dense(q[0], k[0], v[0], g[0].double(), beta[0].double(), h0, cu)
    assert oracle.rms_ratio(o[0], o_ref) <= 1e-6
    for n in range(3):
        assert oracle.rms_ratio(ht[n], states[n]) <= 1e-6


def _fla_small(D=64, **extra):
    _, rnd = _gen(16)
    return (rnd(1, 4, 1, D), rnd(1, 4, 1, D), rnd(1, 4, 1, D), -torch.rand(1, 4, 1, D),
            torch.rand(1, 4, 1)), extra


@pytest.mark.parametrize("function,kwargs,needle", [
    ("chunk_kda", dict(chunk_size=16), "fla rejects this call itself: chunk_size=16"),
    ("chunk_kda", dict(return_intermediate_states=True), "return_intermediate_states"),
    ("chunk_kda", dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
     "allow_neg_eigval"),
    ("chunk_kda", dict(allow_neg_eigval=True), "fla rejects"),
    ("chunk_kda", dict(cu_seqlens=torch.tensor([0, 4]), initial_state=torch.zeros(2, 1, 64, 64),
                       state_v_first=True), "fla rejects"),
    ("fused_recurrent_kda_fwd", dict(inplace_final_state=True, state_v_first=True,
                                     initial_state=torch.zeros(4, 1, 64, 64),
                                     ssm_state_indices=torch.zeros(1, 4, dtype=torch.int32)),
     "speculative"),
    ("fused_recurrent_kda_fwd", dict(inplace_final_state=True, state_v_first=True,
                                     initial_state=torch.zeros(8, 1, 64, 64),
                                     cu_seqlens=torch.tensor([0, 4], dtype=torch.int32),
                                     ssm_state_indices=torch.tensor([2], dtype=torch.int32)),
     "another row's slot"),
    ("fused_recurrent_kda_fwd", dict(inplace_final_state=True, state_v_first=False,
                                     initial_state=torch.zeros(4, 1, 64, 64)), "K-first"),
])
def test_fla_declines_name_the_reason(function, kwargs, needle):
    args, _ = _fla_small()
    ok, reason = kfla.verify(function, *args, **kwargs)
    assert not ok and needle in reason, reason
    with pytest.raises(kdaguard.Unsupported):
        kfla.run(function, *args, **kwargs)


def test_fla_verifier_names_rule_ids_and_accepts_what_runs():
    args, _ = _fla_small(D=60)
    ok, reason = kfla.verify("chunk_kda", *args, state_v_first=True)
    assert not ok and "[dims.head_dim]" in reason.splitlines()[0], reason
    args, _ = _fla_small(D=64)
    assert kfla.verify("chunk_kda", *args) == (True, None)
    grad_args = [a.clone().requires_grad_() for a in args]
    ok, reason = kfla.verify("chunk_kda", *grad_args)
    assert not ok and "inference-only" in reason
    assert kfla.verify("chunk_kda", *grad_args, forward_only=True) == (True, None)
    o, _ = kfla.run("chunk_kda", *grad_args, forward_only=True)
    assert not o.requires_grad


_HAVE_FLA = importlib.util.find_spec("fla") is not None


@pytest.mark.skipif(not _HAVE_FLA, reason="fla (fla-core 0.6.0) is not installed")
def test_fla_dispatch_routes_to_kdaguard_and_keeps_fla_errors():
    from fla.ops.kda.chunk import chunk_kda
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    kfla.register()
    kfla.events.clear()
    gen, rnd = _gen(17)
    T, H, K = 6, 1, 64
    q, k, v = rnd(1, T, H, K), rnd(1, T, H, K), rnd(1, T, H, K)
    g, beta = -torch.rand(1, T, H, K, generator=gen), torch.rand(1, T, H, generator=gen)
    h0 = rnd(1, H, K, K) * 0.1
    with torch.inference_mode():
        o, ht = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                          state_v_first=True)  # fla's Triton cannot run on the CPU: kdaguard did
    assert kfla.events == [("chunk_kda", "ran", "")]
    o_ref, states = _oracle_dense(q[0], k[0], v[0], g[0].double(), beta[0].double(), h0, [0, T])
    assert oracle.rms_ratio(o[0], o_ref) <= 1e-6 and oracle.rms_ratio(ht[0], states[0]) <= 1e-6
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_kda(q, k, v, g, beta, chunk_size=16)
    assert kfla.events[-1][1] == "declined" and "chunk_size" in kfla.events[-1][2]
    pool = rnd(4, H, K, K) * 0.1
    before = pool.clone()
    idx = torch.tensor([2], dtype=torch.int32)
    fused_recurrent_kda_fwd(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1],
                            initial_state=pool, state_v_first=True, ssm_state_indices=idx,
                            cu_seqlens=torch.tensor([0, 1], dtype=torch.int32))
    assert kfla.events[-1] == ("fused_recurrent_kda_fwd", "ran", "")
    assert not torch.equal(pool[2], before[2]) and torch.equal(pool[:2], before[:2])


# ---- kdaguard.sglang ----

def _sglang_decode_args(p):
    """SGLang's decode arguments for a decode_problem: [1, B, ...] views, a [B, HV*K]."""
    B = p["q"].shape[0]
    return dict(q=p["q"].unsqueeze(0), k=p["k"].unsqueeze(0), v=p["v"].unsqueeze(0), a=p["a"],
                b=p["b"], A_log=p["A_log"], dt_bias=p["dt_bias"], ssm_states=p["state"],
                cache_indices=p["cache_indices"],
                query_start_loc=torch.arange(B + 1, dtype=torch.int32),
                lower_bound=p.get("lower_bound"))


@pytest.mark.parametrize("state_dtype,gate", [(torch.float32, "softplus"),
                                              (torch.bfloat16, "bounded")])
def test_sglang_decode_and_packed_decode_match_oracle(state_dtype, gate):
    p = decode_problem(B=4, H=2, HV=4, K=64, V=64, state_dtype=state_dtype, gate=gate, S=10,
                       seed=21)
    o_ref, states = expected_decode(p)
    before = p["state"].clone()
    kernel = KdaguardKDAKernel()
    out = kernel.decode(**_sglang_decode_args(p))
    assert out.shape == (1, 4, 4, 64)
    tol = 1e-6 if state_dtype == torch.float32 else 1e-2
    assert oracle.rms_ratio(out[0], o_ref) <= 1e-2
    idx = p["cache_indices"].tolist()
    for row, slot in enumerate(idx):
        if slot >= 0:
            assert oracle.rms_ratio(p["state"][slot], states[row]) <= tol
    for s in range(10):
        if s not in idx:
            assert torch.equal(p["state"][s], before[s])
    # packed decode on the same packed buffer from the same pool gives the same bits
    q = p["q"]
    mixed = torch.empty(0, dtype=q.dtype).set_(q.untyped_storage()).view(4, -1)
    pool = before.clone()
    packed = kernel.packed_decode(mixed, p["a"], p["b"], A_log=p["A_log"], dt_bias=p["dt_bias"],
                                  scale=None, ssm_states=pool, cache_indices=p["cache_indices"],
                                  num_v_heads=4, head_v_dim=64, lower_bound=p.get("lower_bound"))
    assert torch.equal(packed, out)
    for slot in idx:
        if slot >= 0:
            assert torch.equal(pool[slot], p["state"][slot])


def test_sglang_extend_matches_oracle():
    gen, rnd = _gen(22)
    lens = [3, 0, 9]
    cu = [0, 3, 3, 12]
    T, H, HV, K, V, S = 12, 1, 2, 64, 64, 6
    q, k, v = rnd(1, T, H, K, dt=torch.bfloat16), rnd(1, T, H, K, dt=torch.bfloat16), \
        rnd(1, T, HV, V, dt=torch.bfloat16)
    g_raw = rnd(1, T, HV, K, dt=torch.bfloat16)
    beta = torch.rand(1, T, HV, generator=gen)
    A_log, dt_bias = rnd(1, 1, HV, 1) * 0.3, rnd(HV * K) * 0.1
    pool = rnd(S, HV, V, K) * 0.1
    idx = torch.tensor([4, 1, 2], dtype=torch.int32)
    before = pool.clone()
    out = KdaguardKDAKernel().extend(q, k, v, g_raw, beta, ssm_states=pool, cache_indices=idx,
                                     query_start_loc=torch.tensor(cu, dtype=torch.int32),
                                     A_log=A_log, dt_bias=dt_bias, extend_seq_lens_cpu=lens)
    g = oracle.gate_values(a=g_raw[0], A_log=A_log, dt_bias=dt_bias)
    states = {n: before[s].double().clone() for n, s in enumerate(idx.tolist())}
    rows = [n for n in range(3) for _ in range(cu[n + 1] - cu[n])]
    o_ref = oracle.run_rows(states, q[0], k[0], v[0], g, beta[0].double(), l2norm=True,
                            row_of_token=rows)
    assert out.shape == (1, T, HV, V) and oracle.rms_ratio(out[0], o_ref) <= 1e-2
    for n, s in enumerate(idx.tolist()):
        assert oracle.rms_ratio(pool[s], states[n]) <= 1e-6
    for s in (0, 3, 5):
        assert torch.equal(pool[s], before[s])


def test_sglang_target_verify_matches_oracle_and_leaves_the_pool():
    gen, rnd = _gen(23)
    N, T, H, HV, K, V, S = 2, 3, 1, 2, 64, 64, 5
    q, k, v = rnd(1, N * T, H, K), rnd(1, N * T, H, K), rnd(1, N * T, HV, V)
    a, b = rnd(N * T, HV * K), rnd(1, N * T, HV)
    A_log, dt_bias = rnd(1, 1, HV, 1) * 0.3, rnd(HV * K) * 0.1
    pool = rnd(S, HV, V, K) * 0.1
    committed = pool.clone()
    idx = torch.tensor([3, 0], dtype=torch.int32)
    scratch = torch.full((N + 1, T + 1, HV, V, K), float("nan"))
    row_map = torch.tensor([0, 1, 3], dtype=torch.int32)[:N]
    out = KdaguardKDAKernel().target_verify(
        A_log, dt_bias, q, k, v, a, b, ssm_states=pool, cache_indices=idx,
        query_start_loc=torch.arange(0, N * T + 1, T, dtype=torch.int32),
        intermediate_states_buffer=scratch, intermediate_state_indices=row_map, cache_steps=T)
    assert torch.equal(pool, committed)
    g = oracle.gate_values(a=a.view(N * T, HV, K), A_log=A_log, dt_bias=dt_bias)
    states = {n: committed[s].double().clone() for n, s in enumerate(idx.tolist())}
    o = torch.zeros(N * T, HV, V, dtype=torch.float64)
    for t in range(T):  # step by step, to compare every intermediate state
        rows = [n * T + t for n in range(N)]
        o[rows] = oracle.run_rows(states, q[0, rows], k[0, rows], v[0, rows], g[rows],
                                  torch.sigmoid(b[0, rows].double()), l2norm=True,
                                  row_of_token=list(range(N)))
        for n in range(N):
            assert oracle.rms_ratio(scratch[n, t], states[n]) <= 1e-6
    assert oracle.rms_ratio(out[0], o) <= 1e-6


@pytest.mark.parametrize("call,needle", [
    ("verify_tree", "tree verify"),
    ("verify_replay", "ReplaySSM"),
    ("decode_replay", "ReplaySSM"),
    ("extend_intermediate", "intermediate-state"),
    ("extend_spec", "is_spec_decode"),
    ("decode_unknown", "arguments ['layer_scale']"),
])
def test_sglang_declines_clearly_and_touches_nothing(call, needle):
    p = decode_problem(B=2, S=6, seed=24, padding=False)
    args = _sglang_decode_args(p)
    before = storage_bytes(p["state"])
    kernel = KdaguardKDAKernel()
    scratch = torch.zeros(2, 1, 4, 64, 64)
    verify_args = dict(args, intermediate_states_buffer=scratch,
                       intermediate_state_indices=torch.arange(2, dtype=torch.int32),
                       cache_steps=1)
    verify_args.pop("lower_bound")
    A_log, dt_bias = verify_args.pop("A_log"), verify_args.pop("dt_bias")
    extend = dict(ssm_states=p["state"], cache_indices=p["cache_indices"],
                  query_start_loc=args["query_start_loc"], A_log=p["A_log"], dt_bias=p["dt_bias"])
    tok = (args["q"], args["k"], args["v"], p["a"].view(1, 2, 4, 64), torch.rand(1, 2, 4))
    with pytest.raises(kdaguard.Unsupported, match=needle.replace("[", r"\[")):
        if call == "verify_tree":
            kernel.target_verify(A_log, dt_bias, **verify_args,
                                 retrieve_parent_token=torch.zeros(2, 1, dtype=torch.int64))
        elif call == "verify_replay":
            kernel.target_verify(A_log, dt_bias, **verify_args, replayssm_enabled=True)
        elif call == "decode_replay":
            kernel.decode(**args, cache_ring=torch.zeros(1))
        elif call == "extend_intermediate":
            kernel.extend(*tok, **extend, return_intermediate_states=True)
        elif call == "extend_spec":
            kernel.extend(*tok, **extend, is_spec_decode=True)
        else:
            kernel.decode(**args, layer_scale=2.0)
    assert storage_bytes(p["state"]) == before and torch.isfinite(scratch).all()
    assert torch.equal(scratch, torch.zeros_like(scratch))


def test_sglang_decode_compiles_fullgraph_without_graph_break():
    p = decode_problem(B=2, packed=False, padding=False, seed=25)
    kernel = KdaguardKDAKernel()
    eager_state = p["state"].clone()
    expect = kernel.decode(**_sglang_decode_args({**p, "state": eager_state}))

    def step(q, k, v, a, b, A_log, dt_bias, state, idx, qsl):
        return kernel.decode(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=state,
                             cache_indices=idx, query_start_loc=qsl)

    args = _sglang_decode_args(p)
    call = (args["q"], args["k"], args["v"], args["a"], args["b"], args["A_log"],
            args["dt_bias"], args["ssm_states"], args["cache_indices"], args["query_start_loc"])
    explain = torch._dynamo.explain(step)(*[x.clone() if x is p["state"] else x for x in call])
    assert explain.graph_break_count == 0, explain.break_reasons
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*call)
    assert torch.equal(got, expect) and torch.equal(p["state"], eager_state)


def test_readme_decode_example_runs():
    """The README's Python decode example, run as written (on the CPU here)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = readme.split("## Python (PyTorch)")[1].split("```python\n")[1].split("```")[0]
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    out, idx = scope["out"], scope["idx"].tolist()
    assert out.shape == (4, 4, 128) and torch.isfinite(out).all()
    assert torch.all(out[idx.index(-1)] == 0) and out[0].abs().sum() > 0
