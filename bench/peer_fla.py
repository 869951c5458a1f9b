#!/usr/bin/env python3
"""The peer, timed on the same GPU in the same run: flash-linear-attention's fused_recurrent_kda
(fla-core wheel) on the shapes of bench_decode: H = HV = 32, K = V = 128, bf16 inputs, raw gate
with A_log and dt_bias, beta logits and the L2 norm in the kernel, state pool [S, HV, V, K]
(state_v_first) updated through ssm_state_indices, f32 and bf16 state.

decode B: one token per request, slot per request, in place.
verify B x T: fla reads the state of ssm_state_indices[n, 0] and writes step t to
ssm_state_indices[n, t]; with T distinct slots per row that is 1 read + T writes, the (1 + T)
states our verify moves.

Pool slots rotate between calls over more than 8x the L2, like bench_decode. Time per call is the
median of CUDA-event-timed bursts; small decodes time 20 calls per burst (launch cost included).
Writes JSON: {"copy_TBps": ..., "results": [{"name", "us", "TBps", "pct_copy"}]}.
"""
import argparse
import json
import math
import statistics
import sys

import torch

from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

H = HV = 32
K = V = 128
ROTATE_BYTES = 512 << 20


def copy_ceiling():
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return 2 * n / statistics.median(times) / 1e12


def timed(fn, sets, calls, reps=30):
    for i in range(3):
        fn(i % sets)
    torch.cuda.synchronize()
    per_call = []
    s = 0
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn(s)
            s = (s + 1) % sets
        b.record()
        b.synchronize()
        per_call.append(a.elapsed_time(b) * 1e-3 / calls)
    return statistics.median(per_call)


def make_inputs(tokens):
    dev = "cuda"
    q = torch.empty(1, tokens, H, K, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    k = torch.empty_like(q).uniform_(-1, 1)
    v = torch.empty(1, tokens, HV, V, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    a = torch.empty(1, tokens, HV, K, dtype=torch.bfloat16, device=dev).uniform_(-3, 3)
    b = torch.empty(1, tokens, HV, dtype=torch.bfloat16, device=dev).uniform_(-3, 3)
    A_log = torch.empty(HV, dtype=torch.float32, device=dev).uniform_(0, 2.7)
    dt_bias = torch.empty(HV * K, dtype=torch.float32, device=dev).uniform_(-1, 1)
    out = torch.empty_like(v)
    return q, k, v, a, b, A_log, dt_bias, out


def run_case(rows, T, state_dtype, copy_tbps, verify):
    slot_bytes = HV * V * K * (4 if state_dtype == torch.float32 else 2)
    per_set = rows * (T if verify else 1)
    sets = max(2, math.ceil(ROTATE_BYTES / (per_set * slot_bytes)))
    pool = torch.empty(sets * per_set, HV, V, K, dtype=state_dtype, device="cuda").uniform_(-1, 1)
    tokens = rows * (T if verify else 1)
    q, k, v, a, b, A_log, dt_bias, out = make_inputs(tokens)
    step = T if verify else 1
    cu = torch.arange(0, tokens + 1, step, dtype=torch.int32, device="cuda")
    perm = torch.randperm(sets * per_set, device="cuda").to(torch.int32)
    indices = [perm[s * per_set:(s + 1) * per_set].view(rows, T) if verify
               else perm[s * per_set:(s + 1) * per_set] for s in range(sets)]

    def call(s):
        fused_recurrent_kda_fwd(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, initial_state=pool,
                                inplace_final_state=True, state_v_first=True, cu_seqlens=cu,
                                ssm_state_indices=indices[s], use_qk_l2norm_in_kernel=True,
                                use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, out=out)

    seconds = timed(call, sets, 20 if rows <= 8 else 1)
    moved = (1 + T if verify else 2) * rows * slot_bytes
    tbps = moved / seconds / 1e12
    del pool
    torch.cuda.empty_cache()
    return seconds, tbps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", choices=("decode", "verify"),
                        help="time one family (the verify shapes are bench_spec's step shapes)")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_tbps = copy_ceiling()
    print(f"peer: copy ceiling {copy_tbps:.3f} TB/s", flush=True)
    results = []
    for state_dtype, tag in ((torch.float32, 0), (torch.bfloat16, 1)):
        for B in (1, 8, 64, 128, 256, 512) if args.only != "verify" else ():
            s, tbps = run_case(B, 1, state_dtype, copy_tbps, verify=False)
            results.append({"name": f"BM_Decode/B:{B}/bf16_state:{tag}", "us": s * 1e6,
                            "TBps": tbps, "pct_copy": 100 * tbps / copy_tbps})
            print(f"peer {results[-1]}", flush=True)
        for B in (64, 256) if args.only != "decode" else ():
            for T in (2, 4, 8):
                s, tbps = run_case(B, T, state_dtype, copy_tbps, verify=True)
                results.append({"name": f"BM_Verify/B:{B}/T:{T}/bf16_state:{tag}", "us": s * 1e6,
                                "TBps": tbps, "pct_copy": 100 * tbps / copy_tbps})
                print(f"peer {results[-1]}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"copy_TBps": copy_tbps, "torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
