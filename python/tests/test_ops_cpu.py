"""kdaguard's PyTorch ops on the CPU (the f64 reference): schemas, opcheck, refusals by rule with
every buffer untouched, numerics against the pure-torch oracle, no hidden copies, torch.compile,
and the module's ABI."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

import kdaguard
from kdaguard import ops

import kda_oracle as oracle

REPO = Path(__file__).resolve().parents[2]


def decode_problem(*, B=3, H=2, HV=4, K=64, V=64, io=torch.bfloat16, state_dtype=torch.float32,
                   gate="softplus", S=8, slot_pad=64, packed=True, padding=True, seed=0,
                   beta_logits=True):
    """An SGLang-shaped decode on the CPU: q/k/v strided views of one packed [B, ...] buffer,
    raw a [B, HV*K] or activated g, an envelope pool (slot stride HV*V*K + slot_pad), -1 rows."""
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s, dt=torch.float32: torch.randn(*s, generator=gen).to(dt)  # noqa: E731
    if packed:
        mixed = rnd(B, 2 * H * K + HV * V, dt=io)
        q = mixed[:, :H * K].view(B, H, K)
        k = mixed[:, H * K:2 * H * K].view(B, H, K)
        v = mixed[:, 2 * H * K:].view(B, HV, V)
    else:
        q, k, v = rnd(B, H, K, dt=io), rnd(B, H, K, dt=io), rnd(B, HV, V, dt=io)
    kw = {}
    if gate == "activated":
        kw["g"] = (-torch.rand(B, HV, K, generator=gen)).to(io)
    else:
        kw["a"] = rnd(B, HV * K, dt=io)
        kw["A_log"] = rnd(1, 1, HV, 1) * 0.5
        kw["dt_bias"] = rnd(HV * K) * 0.1
        if gate == "bounded":
            kw["lower_bound"] = -5.0
    if beta_logits:
        kw["b"] = rnd(B, HV, dt=io)
    else:
        kw["beta"] = torch.rand(B, HV, generator=gen).to(io)
    slot = HV * V * K + slot_pad
    storage = rnd(S * slot, dt=state_dtype) * 0.1
    state = storage.as_strided((S, HV, V, K), (slot, V * K, K, 1))
    perm = torch.randperm(S, generator=gen)[:B].to(torch.int32)
    if padding and B > 1:
        perm[1] = -1
    return dict(q=q, k=k, v=v, state=state, cache_indices=perm, use_qk_l2norm=True, **kw)


def expected_decode(p):
    """The oracle's outputs and post-states for a decode problem (a copy of its state)."""
    B, H, K = p["q"].shape
    HV = p["v"].shape[1]
    g = oracle.gate_values(a=None if "a" not in p else p["a"].view(B, HV, K), g=p.get("g"),
                           A_log=p.get("A_log"), dt_bias=p.get("dt_bias"),
                           lower_bound=p.get("lower_bound"))
    beta = oracle.beta_values(b=p.get("b"), beta=p.get("beta"))
    idx = p["cache_indices"].tolist()
    states = {i: p["state"][s].double().clone() for i, s in enumerate(idx) if s >= 0}
    o = oracle.run_rows(states, p["q"], p["k"], p["v"], g, beta, l2norm=p["use_qk_l2norm"],
                        row_of_token=[i if s >= 0 else None for i, s in enumerate(idx)])
    return o, states


def storage_bytes(t):
    """Every byte of t's allocation (views included), as bytes."""
    raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return raw.numpy().tobytes()


@pytest.mark.parametrize("io,state_dtype,gate,tol", [
    (torch.float32, torch.float32, "softplus", 1e-6),
    (torch.bfloat16, torch.float32, "bounded", 1e-6),
    (torch.bfloat16, torch.bfloat16, "activated", 1e-2),
    (torch.float16, torch.float32, "softplus", 1e-6),
])
@pytest.mark.parametrize("K,V", [(64, 64), (128, 64)])
def test_decode_matches_oracle(io, state_dtype, gate, tol, K, V):
    p = decode_problem(io=io, state_dtype=state_dtype, gate=gate, K=K, V=V, seed=K + V)
    before = p["state"].clone()
    pool_before = storage_bytes(p["state"])
    v_before = storage_bytes(p["v"])
    ptr = p["state"].data_ptr()
    o_ref, states = expected_decode(p)
    out = torch.full((p["q"].shape[0], p["v"].shape[1], V), float("nan"), dtype=io)
    got = ops.decode(**p, out=out)
    assert got is out and p["state"].data_ptr() == ptr
    out_tol = tol if io == torch.float32 else 1e-2
    assert oracle.rms_ratio(out.double(), o_ref) <= out_tol
    idx = p["cache_indices"].tolist()
    assert torch.all(out[1] == 0), "a padding row's output is zero"
    for row, slot in enumerate(idx):
        if slot >= 0:
            assert oracle.rms_ratio(p["state"][slot].double(), states[row]) <= tol
    untouched = [s for s in range(p["state"].shape[0]) if s not in idx]
    for s in untouched:
        assert torch.equal(p["state"][s], before[s])
    assert storage_bytes(p["v"]) == v_before, "v is never written"
    # the envelope padding between slots is untouched
    slot = p["state"].stride(0)
    inner = p["state"][0].numel()
    raw_now = storage_bytes(p["state"])
    es = p["state"].element_size()
    for s in range(p["state"].shape[0]):
        lo, hi = (s * slot + inner) * es, ((s + 1) * slot) * es
        assert raw_now[lo:hi] == pool_before[lo:hi]


def test_decode_accepts_engine_leading_dims_as_views():
    p = decode_problem()
    q4, k4, v4 = p["q"].unsqueeze(0), p["k"].unsqueeze(0), p["v"].unsqueeze(0)
    b3 = p["b"].unsqueeze(0)
    ref = ops.decode(**{**p, "state": p["state"].clone()})
    got = ops.decode(**{**p, "q": q4, "k": k4, "v": v4, "b": b3})
    assert torch.equal(ref, got)


def _engine_layouts(B, HV, K, gen):
    """(argument, tensor in an engine's layout, the contract view torch makes of it) triples,
    strided so that a stride computed differently from torch's view would show."""
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    wide = rnd(B, 2 * HV * K + 8).to(torch.bfloat16)
    gates = [wide[:, :HV * K], wide[:, 8:8 + HV * K], wide[:, ::2][:, :HV * K],
             rnd(HV * K, B).to(torch.bfloat16).t(),
             rnd(B * HV * K + 3).to(torch.bfloat16).as_strided(
                 (B, HV * K), (3 if B == 1 else HV * K, 1))]  # any row stride when B == 1
    cases = [("a", t, t.view(B, HV, K)) for t in gates]
    gate4 = rnd(1, B, HV, 2 * K).to(torch.bfloat16)[..., :K]
    cases.append(("a", gate4, gate4[0]))
    col = rnd(1, 2 * HV, 1)[:, ::2]
    # size-1 dims join any run of evenly spaced elements, whatever their stride
    odd = rnd(HV * 50).as_strided((HV // 2, 1, 2), (2, 99, 1))
    A_logs = [rnd(1, 1, HV, 1), col, rnd(HV), rnd(HV // 2, 2).t(), rnd(1, HV, 2)[..., :1], odd]
    for t in A_logs:
        try:
            cases.append(("A_log", t, t.view(HV)))
        except RuntimeError:  # torch cannot view it: the op takes it as it is
            cases.append(("A_log", t, t))
    b = rnd(B, HV).to(torch.bfloat16)
    cases += [("b", b.unsqueeze(0), b), ("b", rnd(B, HV, 3).to(torch.bfloat16)[..., 1:2],
                                         None)]
    return [(n, t, t[..., 0] if view is None else view) for n, t, view in cases]


@pytest.mark.parametrize("B", [1, 3])
def test_the_ops_take_engine_layouts_as_the_views_torch_makes(B):
    gen = torch.Generator().manual_seed(11)
    p = decode_problem(B=B, HV=4, K=64, V=64, padding=False)
    HV, K = p["v"].shape[1], p["q"].shape[2]
    for name, engine, contract in _engine_layouts(B, HV, K, gen):
        got = ops.can_implement("decode", **{**p, name: engine})
        want = ops.can_implement("decode", **{**p, name: contract})
        assert got.text == want.text, (name, engine.shape, engine.stride())
        if not want.ok:
            continue
        state_got, state_want = p["state"].clone(), p["state"].clone()
        out_got = ops.decode(**{**p, name: engine, "state": state_got})
        out_want = ops.decode(**{**p, name: contract, "state": state_want})
        assert torch.equal(out_got, out_want) and torch.equal(state_got, state_want), name


def test_torch_function_modes_and_overrides_still_see_the_ops():
    seen = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    class Tagged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs)

    p = decode_problem(B=2, padding=False)
    expect = ops.decode(**{**p, "state": p["state"].clone()})
    with Record():
        got = ops.decode(**{**p, "state": p["state"].clone()})
    assert torch.ops.kdaguard.decode.default in seen and torch.equal(got, expect)
    seen.clear()
    got = ops.decode(**{**p, "state": p["state"].clone(),
                        "dt_bias": p["dt_bias"].as_subclass(Tagged)})
    assert torch.ops.kdaguard.decode.default in seen and torch.equal(got, expect)
    got = ops.decode(**{**p, "state": p["state"].clone(),
                        "dt_bias": torch.nn.Parameter(p["dt_bias"], requires_grad=False)})
    assert torch.equal(got, expect)



def test_eager_calls_skip_the_python_scan_only_where_nothing_can_override(monkeypatch):
    # kdaguard.ops calls the dispatcher handle directly (no __torch_function__ scan in Python)
    # for plain tensors and Parameters, and goes through the OpOverload for anything else
    direct = []
    call_boxed = ops._call_boxed
    monkeypatch.setattr(ops, "_call_boxed", lambda *args: direct.append(1) or call_boxed(*args))

    class Tagged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return super().__torch_function__(func, types, args, kwargs)

    class Passing(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    p = decode_problem(B=2, padding=False)
    ops.decode(**{**p, "state": p["state"].clone()})
    ops.decode(**{**p, "state": p["state"].clone(),
                  "dt_bias": torch.nn.Parameter(p["dt_bias"], requires_grad=False)})
    assert len(direct) == 2
    ops.decode(**{**p, "state": p["state"].clone(), "dt_bias": p["dt_bias"].as_subclass(Tagged)})
    with Passing():
        ops.decode(**{**p, "state": p["state"].clone()})
    assert len(direct) == 2


def test_calls_give_back_every_tensor_reference_they_take():
    # The entry points' boxed kernels borrow each tensor's handle and release it after the call,
    # under one hold of the GIL (KDAGUARD_BOX, python/csrc/boxing.h): an accepted call, a refused
    # one (released while its exception unwinds) and a query leave every reference count as it
    # was, and a tensor dropped after a call is freed.
    import sys
    import weakref

    p = decode_problem(B=2, padding=False)
    p["state"] = p["state"].clone()
    out = torch.empty(p["q"].shape[0], p["v"].shape[1], p["v"].shape[2], dtype=p["q"].dtype)
    word = torch.zeros(1, dtype=torch.int64)
    tensors = {n: t for n, t in {**p, "out": out, "error_word": word}.items()
               if isinstance(t, torch.Tensor)}
    bad = {**p, "cache_indices": p["cache_indices"].to(torch.float32)}
    counts = {n: sys.getrefcount(t) for n, t in tensors.items()}
    refused = 0
    for _ in range(20):
        ops.decode(**p, out=out, error_word=word)
        try:
            ops.decode(**bad, out=out, error_word=word)
        except kdaguard.ContractViolation:
            refused += 1
        assert ops.can_implement("decode", **p, out=out).ok
    assert refused == 20
    # no collection first: a refusal must not leave its tensors in a reference cycle either
    assert {n: sys.getrefcount(t) for n, t in tensors.items()} == counts

    q = p["q"].clone()
    alive = weakref.ref(q)
    ops.decode(**{**p, "q": q}, out=out, error_word=word)
    del q
    assert alive() is None


def prefill_problem(*, lens=(5, 0, 17), H=1, HV=2, K=64, V=128, io=torch.bfloat16,
                    state_dtype=torch.float32, S=6, seed=1):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    rnd = lambda *s, dt=torch.float32: torch.randn(*s, generator=gen).to(dt)  # noqa: E731
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    pool = rnd(S, HV, V, K, dt=state_dtype) * 0.1
    idx = torch.randperm(S, generator=gen)[:len(lens)].to(torch.int32)
    return dict(q=rnd(T, H, K, dt=io), k=rnd(T, H, K, dt=io), v=rnd(T, HV, V, dt=io),
                a=rnd(T, HV, K, dt=torch.float32), A_log=rnd(HV) * 0.3, dt_bias=rnd(HV * K) * 0.1,
                beta=torch.rand(T, HV, generator=gen).to(torch.float32), cu_seqlens=cu,
                initial_state=pool, initial_state_indices=idx, use_qk_l2norm=True)


def test_prefill_matches_oracle_with_f32_raw_gate_and_16bit_q():
    p = prefill_problem()
    before = p["initial_state"].clone()
    cu = p["cu_seqlens"].tolist()
    rows = [n for n in range(len(cu) - 1) for _ in range(cu[n + 1] - cu[n])]
    idx = p["initial_state_indices"].tolist()
    states = {n: p["initial_state"][s].double().clone() for n, s in enumerate(idx)}
    g = oracle.gate_values(a=p["a"], A_log=p["A_log"], dt_bias=p["dt_bias"])
    o_ref = oracle.run_rows(states, p["q"], p["k"], p["v"], g, p["beta"].double(), l2norm=True,
                            row_of_token=rows)
    out = ops.prefill(**p)
    assert oracle.rms_ratio(out.double(), o_ref) <= 1e-2
    for n, s in enumerate(idx):
        assert oracle.rms_ratio(p["initial_state"][s].double(), states[n]) <= 1e-6
    for s in range(p["initial_state"].shape[0]):
        if s not in idx:
            assert torch.equal(p["initial_state"][s], before[s])


def verify_problem(*, N=2, T=3, H=1, HV=2, K=64, V=64, io=torch.float32, S=5, seed=2):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s, dt=torch.float32: torch.randn(*s, generator=gen).to(dt)  # noqa: E731
    NT = N * T
    return dict(q=rnd(NT, H, K, dt=io), k=rnd(NT, H, K, dt=io), v=rnd(NT, HV, V, dt=io),
                g=-torch.rand(NT, HV, K, generator=gen).to(io), b=rnd(NT, HV, dt=io),
                cu_seqlens=torch.arange(0, NT + 1, T, dtype=torch.int32),
                state=rnd(S, HV, V, K) * 0.1, cache_indices=torch.tensor([3, 0], dtype=torch.int32),
                scratch=torch.full((N, T, HV, V, K), float("nan")),
                scratch_row_map=torch.arange(N, dtype=torch.int32), draft_token_num=T,
                use_qk_l2norm=True)


def test_verify_equals_decodes_and_commit_keeps_the_accepted_prefix():
    p = verify_problem()
    committed = p["state"].clone()
    out = ops.verify(**p)
    assert torch.equal(p["state"], committed), "verify never writes the committed pool"
    # T decodes of the same tokens from a copy of the pool give the same outputs and states
    pool = committed.clone()
    N, T = 2, p["draft_token_num"]
    for t in range(T):
        rows = [n * T + t for n in range(N)]
        step = dict(q=p["q"][rows], k=p["k"][rows], v=p["v"][rows], g=p["g"][rows],
                    b=p["b"][rows], state=pool, cache_indices=p["cache_indices"],
                    use_qk_l2norm=True)
        o = ops.decode(**step)
        assert torch.equal(o, out[rows])
        for n in range(N):
            assert torch.equal(p["scratch"][n, t], pool[p["cache_indices"][n]])
    accepted = torch.tensor([2, 0], dtype=torch.int32)
    target = committed.clone()
    ops.commit(scratch=p["scratch"], scratch_row_map=p["scratch_row_map"], state=target,
               cache_indices=p["cache_indices"], accepted=accepted, draft_token_num=T)
    assert torch.equal(target[3], p["scratch"][0, 1])
    assert torch.equal(target[0], committed[0]), "a row that accepted nothing is left alone"


# ---- refusals: one rule broken at a time, every buffer bit-identical afterwards ----

def _bad_decode(rule):
    p = decode_problem(B=2, padding=False)
    B, H, K = p["q"].shape
    if rule == "arg.missing":
        p.pop("b")
    elif rule == "arg.exclusive":
        p["g"] = -torch.rand(B, 4, K).to(p["q"].dtype)
    elif rule == "arg.rank":
        p["cache_indices"] = p["cache_indices"].view(B, 1)
    elif rule == "arg.shape":
        p["dt_bias"] = p["dt_bias"][:-1]
    elif rule == "arg.dtype":
        p["cache_indices"] = p["cache_indices"].long()
    elif rule == "arg.last_dim_contiguous":
        p["k"] = torch.randn(B, H, K * 2).to(p["q"].dtype)[:, :, ::2]
    elif rule == "arg.alignment":
        p["q"] = torch.randn(B * H * K + 1).to(p["q"].dtype)[1:].view(B, H, K)
    elif rule == "alias.overlap":
        p["out"] = p["v"].view(B, 4, 64)  # out written over v (same storage)
    elif rule == "dims.heads":
        p["q"] = torch.randn(B, 3, K).to(p["q"].dtype)
        p["k"] = torch.randn(B, 3, K).to(p["q"].dtype)
    elif rule == "scalar.scale":
        p["scale"] = -1.0
    elif rule == "scalar.lower_bound":
        p["lower_bound"] = 1.0
    elif rule == "gate.params":
        p.pop("A_log")
    elif rule == "state.rank":
        p["state"] = p["state"][0]
    elif rule == "state.inner_strides":
        p["state"] = torch.randn(8, 4, 64, 64).transpose(2, 3)
    elif rule == "state.slot_stride_min":
        st = torch.randn(8 * 4 * 64 * 64)
        p["state"] = st.as_strided((8, 4, 64, 64), (4 * 64 * 64 - 16, 64 * 64, 64, 1))
    elif rule == "state.slot_stride_align":
        st = torch.randn(8 * (4 * 64 * 64 + 8))
        p["state"] = st.as_strided((8, 4, 64, 64), (4 * 64 * 64 + 8, 64 * 64, 64, 1))
    elif rule == "state.base_align":
        st = torch.randn(8 * 4 * 64 * 64 + 4)
        p["state"] = st[4:].view(8, 4, 64, 64)
    elif rule == "state.empty":
        p["state"] = p["state"][:0]
    elif rule == "index.length":
        p["cache_indices"] = p["cache_indices"][:1]
    elif rule == "index.range":
        p["cache_indices"] = torch.tensor([0, 99], dtype=torch.int32)
    elif rule == "index.unique":
        p["cache_indices"] = torch.tensor([2, 2], dtype=torch.int32)
    elif rule == "decode.one_token":
        p["cu_seqlens"] = torch.tensor([0, 2, 2], dtype=torch.int32)
    elif rule == "dims.head_dim":
        return None
    return p


DECODE_RULES = ["arg.missing", "arg.exclusive", "arg.rank", "arg.shape", "arg.dtype",
                "arg.last_dim_contiguous", "arg.alignment", "alias.overlap", "dims.heads",
                "scalar.scale", "scalar.lower_bound", "gate.params", "state.rank",
                "state.inner_strides", "state.slot_stride_min", "state.slot_stride_align",
                "state.base_align", "state.empty", "index.length", "index.range", "index.unique",
                "decode.one_token"]


def _snapshot(p):
    return {n: storage_bytes(t) for n, t in p.items() if isinstance(t, torch.Tensor)}


@pytest.mark.parametrize("rule", DECODE_RULES)
def test_decode_refusal_names_the_rule_and_touches_nothing(rule):
    p = _bad_decode(rule)
    out = p.pop("out", None)
    if out is None:
        out = torch.full((p["q"].shape[0], p["v"].shape[1], p["v"].shape[2]), 7.0,
                         dtype=p["q"].dtype)
    before = _snapshot({**p, "out": out})
    with pytest.raises(kdaguard.ContractViolation) as info:
        ops.decode(**p, out=out)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, RuntimeError)
    assert err.entry == "decode" and err.rules == (rule,), err
    assert err.violations and err.violations[0].rule == rule
    assert _snapshot({**p, "out": out}) == before
    verdict = ops.can_implement("decode", **p, out=out)
    assert not verdict.ok and verdict.rules == (rule,)


def test_prefill_value_rules():
    for rule, change in [
        ("seqlens.start", lambda p: p.update(
            cu_seqlens=torch.tensor([1, 5, 5, 22], dtype=torch.int32))),
        ("seqlens.monotone", lambda p: p.update(
            cu_seqlens=torch.tensor([0, 9, 5, 22], dtype=torch.int32))),
        ("seqlens.total", lambda p: p.update(
            cu_seqlens=torch.tensor([0, 5, 5, 21], dtype=torch.int32))),
        ("index.padding", lambda p: p["initial_state_indices"].__setitem__(0, -1)),
    ]:
        p = prefill_problem()
        change(p)
        before = _snapshot(p)
        with pytest.raises(kdaguard.ContractViolation) as info:
            ops.prefill(**p)
        assert info.value.rules == (rule,), info.value
        assert _snapshot(p) == before


def test_verify_rules():
    p = verify_problem()
    p["draft_token_num"] = 0
    with pytest.raises(kdaguard.ContractViolation) as info:
        ops.verify(**p)
    assert "verify.draft_tokens" in info.value.rules


def test_raw_op_raises_value_error_with_the_machine_readable_first_line():
    p = _bad_decode("state.inner_strides")
    B = p["q"].shape[0]
    out = torch.empty(B, 4, 64, dtype=p["q"].dtype)
    with pytest.raises(ValueError) as info:
        torch.ops.kdaguard.decode(p["q"], p["k"], p["v"], p["a"].view(B, 4, 64), None,
                                  p["A_log"].view(-1), p["dt_bias"], p["b"], None, p["state"],
                                  p["cache_indices"], None, out, torch.zeros(1, dtype=torch.long))
    first = str(info.value).splitlines()[0]
    assert first == "kdaguard: decode rejected [state.inner_strides]"
    assert "state inner strides must be compact" in str(info.value)  # the seed text


def test_inference_only_and_layout_refusals():
    p = decode_problem()
    p["q"] = p["q"].detach().clone().requires_grad_()
    with pytest.raises(kdaguard.Unsupported, match="inference-only"):
        ops.decode(**p)
    with torch.no_grad():
        ops.decode(**p)
    p = decode_problem()
    with pytest.raises(kdaguard.Unsupported, match="V-first") as info:
        ops.decode(**p, state_layout="kv")
    assert isinstance(info.value, NotImplementedError)


def test_cuda_call_without_kernels_or_device_is_unsupported():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(NotImplementedError if not kdaguard.built_with_cuda() else Exception):
        ops.warm_up("cuda:0", K=64, V=64, io_dtype=torch.bfloat16, state_dtype=torch.float32,
                    entries=("decode",))


def test_rules_come_from_the_one_table():
    table = (REPO / "README.md").read_text()
    block = table.split("<!-- rules:begin -->")[1].split("<!-- rules:end -->")[0]
    readme_ids = re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \|", block, re.M)
    assert [r.id for r in kdaguard.rules()] == readme_ids
    bits = [r.bit for r in kdaguard.rules()]
    assert len(set(bits)) == len(bits)
    assert ops.rules_in(bits[3] | bits[5]) == (kdaguard.rules()[3].id, kdaguard.rules()[5].id)


# ---- schemas, opcheck, torch.compile ----

def test_schemas_annotate_every_written_tensor():
    s = str(torch.ops.kdaguard.decode.default._schema)
    assert "Tensor(s!) state" in s and "Tensor(o!) out" in s and "Tensor(e!) error_word" in s
    assert s.endswith("-> ()")
    s = str(torch.ops.kdaguard.prefill.default._schema)
    assert "Tensor(s!) initial_state" in s and "Tensor(w!)? workspace" in s
    s = str(torch.ops.kdaguard.verify.default._schema)
    assert "Tensor(x!) scratch" in s and "Tensor state," in s
    assert "Tensor(s!) state" in str(torch.ops.kdaguard.commit.default._schema)


def _decode_args(p):
    B, H, K = p["q"].shape
    HV = p["v"].shape[1]
    out = torch.empty(B, HV, p["v"].shape[2], dtype=p["q"].dtype)
    return (p["q"], p["k"], p["v"], p["a"].view(B, HV, K), None, p["A_log"].view(-1),
            p["dt_bias"], p["b"], None, p["state"], p["cache_indices"], None, out,
            torch.zeros(1, dtype=torch.long)), {"use_qk_l2norm": True}


def test_opcheck_every_op():
    p = decode_problem(B=2, padding=True, packed=False)
    args, kw = _decode_args(p)
    torch.library.opcheck(torch.ops.kdaguard.decode.default, args, kw)
    q = prefill_problem()
    out = torch.empty(q["v"].shape, dtype=q["v"].dtype)
    torch.library.opcheck(torch.ops.kdaguard.prefill.default,
                          (q["q"], q["k"], q["v"], q["a"], None, q["A_log"], q["dt_bias"], None,
                           q["beta"], q["cu_seqlens"], q["initial_state"],
                           q["initial_state_indices"], out, torch.zeros(1, dtype=torch.long)))
    r = verify_problem()
    out = torch.empty(r["v"].shape, dtype=r["v"].dtype)
    r["scratch"].zero_()
    torch.library.opcheck(torch.ops.kdaguard.verify.default,
                          (r["q"], r["k"], r["v"], None, r["g"], None, None, r["b"], None,
                           r["cu_seqlens"], r["state"], r["cache_indices"], r["scratch"],
                           r["scratch_row_map"], None, out, torch.zeros(1, dtype=torch.long),
                           r["draft_token_num"]))
    torch.library.opcheck(torch.ops.kdaguard.commit.default,
                          (r["scratch"], r["scratch_row_map"], None, r["state"].clone(),
                           r["cache_indices"], torch.tensor([1, 3], dtype=torch.int32), None,
                           torch.zeros(1, dtype=torch.long), r["draft_token_num"]))


def test_compile_fullgraph_no_graph_break_same_result():
    p = decode_problem(B=2, packed=False, padding=False)
    eager_state = p["state"].clone()
    expect = ops.decode(**{**p, "state": eager_state})

    def step(q, k, v, a, A_log, dt_bias, b, state, idx):
        return ops.decode(q, k, v, a=a, A_log=A_log, dt_bias=dt_bias, b=b, state=state,
                          cache_indices=idx, use_qk_l2norm=True)

    args = (p["q"], p["k"], p["v"], p["a"], p["A_log"], p["dt_bias"], p["b"], p["state"],
            p["cache_indices"])
    explain = torch._dynamo.explain(step)(*[a.clone() if a is p["state"] else a for a in args])
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(*args)
    assert torch.equal(got, expect) and torch.equal(p["state"], eager_state)


def test_module_uses_only_the_stable_abi():
    so = next(Path(kdaguard.__file__).parent.glob("_C*.so"))
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(so)], check=True,
                               capture_output=True, text=True).stdout
    unstable = [line for line in undefined.splitlines() if "_ZN3c10" in line or "_ZN2at" in line]
    assert not unstable, unstable[:5]
    assert "aoti_torch_" in undefined
