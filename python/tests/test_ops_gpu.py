"""kdaguard's ops on the H200: the CUDA op against the CPU op (the f64 reference) on SGLang's
decode layout, a side stream, and CUDA graph capture with new index values between replays."""

import pytest
import torch

import kdaguard
from kdaguard import ops

import kda_oracle as oracle
from test_ops_cpu import decode_problem

pytestmark = pytest.mark.gpu


def _to(p, device):
    moved = {}
    for n, t in p.items():
        if isinstance(t, torch.Tensor) and n != "state":
            moved[n] = t.to(device)
        else:
            moved[n] = t
    # the envelope pool keeps its strides on the device
    st = p["state"]
    storage = torch.empty(st.untyped_storage().nbytes() // st.element_size(), dtype=st.dtype,
                          device=device)
    dev_state = storage.as_strided(st.shape, st.stride())
    dev_state.copy_(st)
    moved["state"] = dev_state
    return moved


@pytest.mark.parametrize("io,state_dtype,tol", [(torch.bfloat16, torch.float32, 5e-3),
                                                (torch.bfloat16, torch.bfloat16, 1e-2),
                                                (torch.float32, torch.float32, 1e-5)])
def test_cuda_decode_matches_cpu_on_sglang_layout(io, state_dtype, tol):
    p = decode_problem(B=8, H=2, HV=8, K=128, V=128, io=io, state_dtype=state_dtype, S=32)
    d = _to(p, "cuda")
    before = d["state"].clone()
    word = torch.zeros(1, dtype=torch.int64, device="cuda")
    out = ops.decode(**d, error_word=word)
    ref = ops.decode(**p)
    torch.cuda.synchronize()
    assert oracle.rms_ratio(out.cpu(), ref) <= tol
    for s in p["cache_indices"].tolist():
        if s >= 0:
            assert oracle.rms_ratio(d["state"][s].cpu(), p["state"][s]) <= tol
    for s in range(32):
        if s not in p["cache_indices"].tolist():
            assert torch.equal(d["state"][s], before[s])
    ops.check_error_word(word)


def test_side_stream_equals_default_stream():
    p = decode_problem(B=4, K=128, V=128, S=16)
    d1, d2 = _to(p, "cuda"), _to(p, "cuda")
    o1 = ops.decode(**d1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o2 = ops.decode(**d2)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(o1, o2) and torch.equal(d1["state"], d2["state"])


def test_graph_replay_reads_new_indices_and_a_bad_one_trips_only_its_row():
    p = decode_problem(B=4, K=128, V=128, S=16, padding=False)
    d = _to(p, "cuda")
    ops.warm_up("cuda", K=128, V=128, io_dtype=torch.bfloat16, state_dtype=torch.float32)
    word = torch.zeros(1, dtype=torch.int64, device="cuda")
    idx = d["cache_indices"]
    out = torch.empty(4, p["v"].shape[1], 128, dtype=torch.bfloat16, device="cuda")
    ops.decode(**d, out=out, error_word=word)  # uncaptured call
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.decode(**d, out=out, error_word=word)
    idx.copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    before = d["state"].clone()
    graph.replay()
    torch.cuda.synchronize()
    ops.check_error_word(word)
    for s in (1, 2, 3, 4):
        assert not torch.equal(d["state"][s], before[s])
    idx.copy_(torch.tensor([5, 99, 6, 7], dtype=torch.int32))  # 99 is outside the pool
    before = d["state"].clone()
    graph.replay()
    torch.cuda.synchronize()
    with pytest.raises(kdaguard.DeviceGuardTripped) as info:
        ops.check_error_word(word)
    assert "index.range" in info.value.rules
    for s in (5, 6, 7):
        assert not torch.equal(d["state"][s], before[s])
    untouched = [s for s in range(16) if s not in (5, 6, 7)]
    for s in untouched:
        assert torch.equal(d["state"][s], before[s])


def test_unprepared_first_call_under_capture_is_refused_clearly():
    p = decode_problem(B=2, K=64, V=128, io=torch.float16, S=4, padding=False)
    d = _to(p, "cuda")
    word = torch.zeros(1, dtype=torch.int64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(kdaguard.Unsupported, match="not prepared"):
        with torch.cuda.graph(graph):
            ops.decode(**d, error_word=word)


def test_host_copies_of_index_values_are_checked_on_the_host():
    p = decode_problem(B=4, K=128, V=128, S=16, padding=False)
    guarded, hosted = _to(p, "cuda"), _to(p, "cuda")
    out_guarded = ops.decode(**guarded)
    out_hosted = ops.decode(**hosted, cache_indices_cpu=p["cache_indices"])
    torch.cuda.synchronize()
    assert torch.equal(out_guarded, out_hosted) and torch.equal(guarded["state"], hosted["state"])
    bad = p["cache_indices"].clone()
    bad[1] = 99  # outside the pool: refused on the host, before anything runs
    d = _to(p, "cuda")
    out = torch.full((4, p["v"].shape[1], 128), 7.0, dtype=torch.bfloat16, device="cuda")
    before = d["state"].clone()
    with pytest.raises(kdaguard.ContractViolation) as info:
        ops.decode(**d, out=out, cache_indices_cpu=bad)
    assert info.value.rules == ("index.range",)
    torch.cuda.synchronize()
    assert torch.equal(d["state"], before) and bool((out == 7.0).all())
    ops.check_error_word(ops.error_word("cuda"))
