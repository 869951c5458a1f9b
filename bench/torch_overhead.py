"""Eager host time of a B = 1 decode through PyTorch against the same call through kda.h.

Runs bench_decode_host (the C++ call: gpu::decode, and gpu::can_implement for the validation
alone) and then, in the same process tree and on the same GPU, the same call through
torch.ops.kdaguard.decode.default and kdaguard.ops.decode, and prints every figure with its
difference to the C++ gpu::decode figure: that difference is the binding's own host cost.

The call is the one bench_decode_host.cu describes: H = 2, HV = 8, K = V = 128, bf16 q/k/v
sliced from one packed projection, raw gate a, A_log, dt_bias, beta logits b, an f32 envelope pool
of 32 slots, one row, index values on the device (so the device guard runs, in the decode
kernel's prologue). kdaguard.ops.decode gets SGLang's layouts (a [B, HV*K], A_log
[1, 1, HV, 1]); the raw op gets the contract's views.

Each figure: host time of --bursts bursts of --burst calls (the stream drained between bursts,
outside the timed region), as us per call. Every repetition runs the C++ binary once and then every
variant, so that a drift of the host's speed shifts all rows alike; a row's difference is the
median over repetitions of its difference to the same repetition's C++ gpu::decode.

    PYTHONPATH=build-release/python python3 bench/torch_overhead.py \\
        --cxx build-release/bench/bench_decode_host --probe build-release/bench/torch_dispatch_floor.so

--probe adds torch's own share of the call: ops whose kernels only take and release their
arguments as kdaguard's do (bench/probes/torch_dispatch_floor.cpp), one with decode's schema and
one without arguments.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

import kdaguard
from kdaguard import ops

B, H, HV, K, V, SLOTS = 1, 2, 8, 128, 128, 32


def cxx_once(binary: str) -> dict[str, float]:
    """Host us per call of each benchmark in bench_decode_host, one repetition."""
    run = subprocess.run([binary, "--benchmark_format=json"], check=True, capture_output=True,
                         text=True)
    report = json.loads(run.stdout)
    times = {}
    for bench in report["benchmarks"]:
        if bench.get("error_occurred"):
            raise SystemExit(f"{bench['name']}: {bench.get('error_message')}")
        times[bench["run_name"].split("/")[0]] = bench["real_time"]  # us (the Unit)
    if not {"BM_DecodeHost", "BM_CanImplementHost"} <= times.keys():
        raise SystemExit(f"{binary} reported no times:\n{run.stdout[:4000]}{run.stderr[:4000]}")
    return times


def problem(device):
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    mixed = rnd(B, 2 * H * K + HV * V, dtype=torch.bfloat16)
    slot = HV * V * K + 64
    pool = rnd(SLOTS * slot, scale=0.1).as_strided((SLOTS, HV, V, K), (slot, V * K, K, 1))
    return dict(q=mixed[:, :H * K].view(B, H, K), k=mixed[:, H * K:2 * H * K].view(B, H, K),
                v=mixed[:, 2 * H * K:].view(B, HV, V), a=rnd(B, HV * K, dtype=torch.bfloat16),
                A_log=rnd(1, 1, HV, 1, scale=0.5), dt_bias=rnd(HV * K, scale=0.1),
                b=rnd(B, HV, dtype=torch.bfloat16), state=pool,
                cache_indices=torch.tensor([5], dtype=torch.int32, device=device))


def define_probe(path: str) -> torch.library.Library:
    """The ops of bench/probes/torch_dispatch_floor.cpp: kdaguard_probe::decode with decode's
    schema and kdaguard_probe::nothing. Keep the returned library alive while they are used."""
    torch.ops.load_library(path)
    lib = torch.library.Library("kdaguard_probe", "FRAGMENT")
    lib.define(str(torch.ops.kdaguard.decode.default._schema).split("::", 1)[1])
    lib.define("nothing() -> ()")
    return lib


def host_us(fn, *, burst: int, bursts: int) -> float:
    """Host time per call of `bursts` bursts of `burst` calls (the stream drained between
    bursts, outside the timed region)."""
    total = 0
    for _ in range(bursts):
        start = time.perf_counter_ns()
        for _ in range(burst):
            fn()
        total += time.perf_counter_ns() - start
        torch.cuda.synchronize()
    return total / (bursts * burst) / 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cxx", required=True, help="the bench_decode_host binary")
    parser.add_argument("--probe", help="bench/probes/torch_dispatch_floor.cpp's library")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--bursts", type=int, default=20)
    parser.add_argument("--burst", type=int, default=100)
    args = parser.parse_args()
    if not torch.cuda.is_available() or not kdaguard.built_with_cuda():
        print("torch_overhead: needs a CUDA device and a kdaguard module with the CUDA kernels")
        return 1

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    p = problem(device)
    ops.warm_up(device, K=K, V=V, io_dtype=torch.bfloat16, state_dtype=torch.float32,
                entries=("decode",))
    word = torch.zeros(1, dtype=torch.int64, device=device)
    out = torch.empty(B, HV, V, dtype=torch.bfloat16, device=device)
    a3, A_log1 = p["a"].view(B, HV, K), p["A_log"].view(HV)
    q, k, v, a, A_log, dt_bias, b = (p[n] for n in ("q", "k", "v", "a", "A_log", "dt_bias", "b"))
    state, idx = p["state"], p["cache_indices"]
    raw_op = torch.ops.kdaguard.decode.default
    can_op = torch.ops.kdaguard.can_decode.default
    assert can_op(q, k, v, a3, None, A_log1, dt_bias, b, None, state, idx, None, out, None, None,
                  True) == ""

    def ops_decode():
        ops.decode(q, k, v, a=a, A_log=A_log, dt_bias=dt_bias, b=b, state=state,
                   cache_indices=idx, out=out, use_qk_l2norm=True, error_word=word)

    variants = [
        ("torch.empty(1, device='cuda')", lambda: torch.empty(1, device=device)),
        ("torch.ops.kdaguard.can_decode.default (validation only)",
         lambda: can_op(q, k, v, a3, None, A_log1, dt_bias, b, None, state, idx, None, out,
                        None, None, True)),
        ("torch.ops.kdaguard.decode.default (positional, contract views)",
         lambda: raw_op(q, k, v, a3, None, A_log1, dt_bias, b, None, state, idx, None, out, word,
                        None, None, True)),
        ("kdaguard.ops.decode (SGLang layouts, out= and error_word= given)", ops_decode),
        # where the op's floor lies: a call with no arguments, and the op without the
        # __torch_function__ scan of its 19 arguments (a private entry, for the measurement only)
        ("torch.ops.kdaguard.built_with_cuda.default() (no arguments)",
         lambda: torch.ops.kdaguard.built_with_cuda.default()),
        ("torch._C._dispatch_call_boxed(decode, ...) (no __torch_function__ scan)",
         lambda: torch._C._dispatch_call_boxed(raw_op._handle, q, k, v, a3, None, A_log1,
                                               dt_bias, b, None, state, idx, None, out, word,
                                               None, None, True)),
        ("kdaguard.ops.decode (out allocated, default error word)",
         lambda: ops.decode(q, k, v, a=a, A_log=A_log, dt_bias=dt_bias, b=b, state=state,
                            cache_indices=idx, use_qk_l2norm=True)),
    ]
    if args.probe:
        probe_lib = define_probe(args.probe)  # noqa: F841 (the ops live as long as it does)
        call_boxed = torch._C._dispatch_call_boxed
        empty, nothing = (torch.ops.kdaguard_probe.decode.default._handle,
                          torch.ops.kdaguard_probe.nothing.default._handle)
        variants += [
            ("probe: an op without arguments (boxed call)", lambda: call_boxed(nothing)),
            ("probe: decode's schema, a kernel that only releases them (boxed call)",
             lambda: call_boxed(empty, q, k, v, a3, None, A_log1, dt_bias, b, None, state, idx,
                                None, out, word, None, None, True)),
        ]
    variants.append(("kdaguard.ops.decode as above, under no_grad instead of inference_mode",
                     ops_decode))
    modes = [torch.inference_mode] * (len(variants) - 1) + [torch.no_grad]
    # the host's speed drifts over a run: each repetition times the C++ call and every row
    for (_, fn), mode in zip(variants, modes):
        with mode():
            for _ in range(3 * args.burst):
                fn()
    torch.cuda.synchronize()
    cxx_runs, runs = [], [[] for _ in variants]
    for _ in range(args.reps):
        cxx_runs.append(cxx_once(args.cxx))
        for i, ((_, fn), mode) in enumerate(zip(variants, modes)):
            with mode():
                runs[i].append(host_us(fn, burst=args.burst, bursts=args.bursts))
    base = [c["BM_DecodeHost"] for c in cxx_runs]
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}, kdaguard {kdaguard.__version__}")
    print(f"B = {B}, H = {H}, HV = {HV}, K = V = {K}; host us per call of {args.bursts} bursts "
          f"of {args.burst} calls; medians of {args.reps} repetitions, each timing every row")
    print(f"{'call':72s} {'us/call':>8s} {'- C++ decode':>13s}")

    def row(name, times):
        diffs = [t - c for t, c in zip(times, base)]
        print(f"{name:72s} {statistics.median(times):8.2f} {statistics.median(diffs):+13.2f}",
              flush=True)

    row("C++ gpu::decode (kda.h)", base)
    row("C++ gpu::can_implement (validation only)",
        [c["BM_CanImplementHost"] for c in cxx_runs])
    for (name, _), times in zip(variants, runs):
        row(name, times)
    torch.cuda.synchronize()
    ops.check_error_word(word)
    ops.check_error_word(ops.error_word(device))
    print("error words clear")
    return 0


if __name__ == "__main__":
    sys.exit(main())
