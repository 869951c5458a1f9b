#!/usr/bin/env python3
"""Times the peer prefill, flash-linear-attention's chunk_kda (fla-core wheel), on the shapes of
bench/bench_prefill.cu: K = V = 128, bf16 inputs, f32 initial state, raw gate with
lower_bound -5 (safe_gate), beta logits and the L2 norm in the kernel.

Run on the GPU machine with fla on PYTHONPATH. Prints one line per shape as it goes (median of
triton.testing.do_bench, after a warm-up that includes Triton's autotuning), each followed by the
JSON summary of the shapes so far (the last such line is the run's). Shapes run in order of
importance, so a timeout still leaves the headline figures; arguments, when given, select shapes by
substring of their names.
"""
import json
import sys

import torch
import triton.testing
from fla.ops.kda import chunk_kda

K = V = 128
RAGGED = [1500, 37, 900, 1, 2048, 640, 113, 1200, 753, 1000]  # as in bench_prefill.cu


def shapes():
    # Issue 13's shapes, the small head counts first (where the split matters).
    yield "T=8192 H=12 B=1", [8192], 12
    yield "T=65536 H=4 B=1", [65536], 4
    yield "T=8192 H=64 B=1", [8192], 64
    for H in (24, 32, 96):
        yield f"T=8192 H={H} B=1", [8192], H
    for T in (32768, 65536, 131072):
        for H in (4, 12):
            if (T, H) != (65536, 4):
                yield f"T={T} H={H} B=1", [T], H
    yield "T=8192 H=12 B=2", [8192] * 2, 12
    yield "T=8192 H=64 B=2", [8192] * 2, 64
    yield "ragged10 H=12", RAGGED, 12
    yield "ragged10 H=64", RAGGED, 64


def time_shape(lens, H):
    dev = "cuda"
    T = sum(lens)
    g = torch.Generator(device=dev).manual_seed(0)

    def uniform(shape, lo, hi, dtype=torch.bfloat16):
        return (torch.rand(shape, generator=g, device=dev) * (hi - lo) + lo).to(dtype)

    q = uniform((1, T, H, K), -1, 1)
    k = uniform((1, T, H, K), -1, 1)
    v = uniform((1, T, H, V), -1, 1)
    a = uniform((1, T, H, K), -4, 4)
    b = uniform((1, T, H), -3, 3)
    A_log = uniform((H,), -0.5, 0.5, torch.float32)
    dt_bias = uniform((H * K,), -6, -2, torch.float32)
    h0 = uniform((len(lens), H, K, V), -0.1, 0.1, torch.float32)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.long, device=dev)
    cu_cpu = cu.cpu()

    def run():
        return chunk_kda(q, k, v, a, b, initial_state=h0, output_final_state=True,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                         use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                         A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)

    with torch.inference_mode():
        run()
        torch.cuda.synchronize()
        return triton.testing.do_bench(run, warmup=50, rep=300, return_mode="median")


def main():
    only = sys.argv[1:]  # optional: run only shapes whose name contains one of these strings
    results = {}
    for name, lens, H in shapes():
        if only and not any(o in name for o in only):
            continue
        ms = time_shape(lens, H)
        token_heads = sum(lens) * H
        results[name] = {"ms": ms, "token_heads_per_s": token_heads / (ms * 1e-3)}
        print(f"[peer chunk_kda] {name:18s} {ms:8.3f} ms  {token_heads / (ms * 1e-3):.3e} token-heads/s",
              flush=True)
        # The summary so far after every shape, so a run cut off by its time limit keeps it.
        print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
