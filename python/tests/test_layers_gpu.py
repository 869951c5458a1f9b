"""kdaguard.sglang on the H200: SGLang's decode through KdaguardKDAKernel on the CUDA op against
the CPU op (the f64 reference), and against fla's Triton fused_recurrent_kda_fwd on the same
V-first pool (when fla is installed), untouched slots bit-identical."""

import importlib.util

import pytest
import torch

from kdaguard import ops
from kdaguard.sglang import KdaguardKDAKernel

import kda_oracle as oracle
from test_layers_cpu import _sglang_decode_args
from test_ops_cpu import decode_problem
from test_ops_gpu import _to

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("state_dtype,gate,tol", [(torch.float32, "softplus", 5e-3),
                                                  (torch.float32, "bounded", 5e-3),
                                                  (torch.bfloat16, "softplus", 1e-2)])
def test_sglang_decode_cuda_vs_cpu_and_fla(state_dtype, gate, tol):
    B, H, HV, K, V, S = 16, 2, 8, 128, 128, 40
    p = decode_problem(B=B, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype, gate=gate, S=S,
                       seed=31)
    d = _to(p, "cuda")
    before = d["state"].clone()
    word = torch.zeros(1, dtype=torch.int64, device="cuda")
    args = _sglang_decode_args(d)
    args["query_start_loc"] = args["query_start_loc"].cuda()  # SGLang's is on the device
    out = KdaguardKDAKernel(error_word=word).decode(**args)
    ref = ops.decode(**p)  # the CPU op (f64 reference) on the same problem
    torch.cuda.synchronize()
    ops.check_error_word(word)
    assert oracle.rms_ratio(out[0].cpu(), ref) <= tol
    idx = p["cache_indices"].tolist()
    for s in idx:
        if s >= 0:
            assert oracle.rms_ratio(d["state"][s].cpu(), p["state"][s]) <= tol
    for s in range(S):
        if s not in idx:
            assert torch.equal(d["state"][s], before[s])
    if importlib.util.find_spec("fla") is None:
        pytest.skip("fla is not installed: the CUDA-vs-CPU half passed, fla's half not run")
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    # fla addresses slots by stride(0): it gets the same envelope pool, from the same values
    fla_pool = torch.empty_strided(before.shape, before.stride(), dtype=before.dtype,
                                   device="cuda")
    fla_pool.copy_(before)
    active = torch.tensor([s >= 0 for s in idx])
    a_idx = d["cache_indices"][active.cuda()]
    rows = active.nonzero().flatten().tolist()
    sub = lambda t: t[rows]  # noqa: E731  fla has no -1 rows: the active rows only
    fla_out, _ = fused_recurrent_kda_fwd(
        q=sub(d["q"]).unsqueeze(0).contiguous(), k=sub(d["k"]).unsqueeze(0).contiguous(),
        v=sub(d["v"]).unsqueeze(0).contiguous(),
        g=sub(d["a"]).view(1, len(rows), HV, K).contiguous(),
        beta=sub(d["b"]).unsqueeze(0).contiguous(), A_log=d["A_log"].reshape(HV),
        dt_bias=d["dt_bias"], initial_state=fla_pool, inplace_final_state=True,
        state_v_first=True, cu_seqlens=torch.arange(len(rows) + 1, dtype=torch.int32,
                                                    device="cuda"),
        ssm_state_indices=a_idx, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True, lower_bound=p.get("lower_bound"))
    torch.cuda.synchronize()
    assert oracle.rms_ratio(out[0][rows].double(), fla_out[0].double()) <= tol
    for s in a_idx.tolist():
        assert oracle.rms_ratio(d["state"][s].double(), fla_pool[s].double()) <= tol
    for s in range(S):
        if s not in idx:
            assert torch.equal(fla_pool[s], before[s])
