"""The record-based speculative path through the PyTorch ops on the GPU: the CUDA ops against the
CPU ops (the f64 reference), f32 state (tensor-core kernels) and bf16 state (step form), with a
padding row; the error word stays clear."""

import pytest
import torch

from kdaguard import ops

import kda_oracle as oracle
from test_ops_cpu import verify_problem
from test_records_cpu import record_args, records_for

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("io,state_dtype,tol", [(torch.bfloat16, torch.float32, 5e-3),
                                                (torch.float32, torch.float32, 1e-5),
                                                (torch.bfloat16, torch.bfloat16, 1e-2)])
def test_cuda_record_ops_match_cpu(io, state_dtype, tol):
    p = verify_problem(N=3, T=4, H=2, HV=4, K=128, V=128, io=io, S=8, seed=9)
    p["cache_indices"] = torch.tensor([5, -1, 2], dtype=torch.int32)  # a padding row
    p["cu_seqlens"] = torch.arange(0, 13, 4, dtype=torch.int32)
    p["state"] = p["state"].to(state_dtype)
    d = {n: t.to("cuda") if isinstance(t, torch.Tensor) else t for n, t in p.items()}
    word = torch.zeros(1, dtype=torch.int64, device="cuda")
    cpu_records, cuda_records = records_for(p), records_for(p).cuda()
    out_cpu = ops.record_verify(**record_args(p, cpu_records))
    out_cuda = ops.record_verify(**record_args(d, cuda_records), error_word=word)
    assert oracle.rms_ratio(out_cuda.cpu().double(), out_cpu.double()) <= tol
    assert torch.all(out_cuda[4:8] == 0), "a padding row's outputs are zero"
    rows = [0, 2]  # the padding row writes no record
    assert oracle.rms_ratio(cuda_records[rows].cpu().double(),
                            cpu_records[rows].double()) <= tol
    assert torch.isnan(cuda_records[1]).all()

    accepted = torch.tensor([3, 2, 4], dtype=torch.int32)
    ops.replay_commit(records=cpu_records, state=p["state"], cache_indices=p["cache_indices"],
                      accepted=accepted, draft_token_num=4)
    ops.replay_commit(records=cuda_records, state=d["state"], cache_indices=d["cache_indices"],
                      accepted=accepted.cuda(), draft_token_num=4, error_word=word)
    assert oracle.rms_ratio(d["state"].cpu().double(), p["state"].double()) <= tol

    fused_cpu, fused_cuda = records_for(p), records_for(p).cuda()
    prior = torch.tensor([1, 0, 2], dtype=torch.int32)
    out_cpu = ops.accept_verify(**record_args(p, fused_cpu), prior_records=cpu_records,
                                prior_accepted=prior)
    out_cuda = ops.accept_verify(**record_args(d, fused_cuda), prior_records=cuda_records,
                                 prior_accepted=prior.cuda(), error_word=word)
    assert oracle.rms_ratio(out_cuda.cpu().double(), out_cpu.double()) <= tol
    assert oracle.rms_ratio(d["state"].cpu().double(), p["state"].double()) <= tol
    ops.check_error_word(word)
