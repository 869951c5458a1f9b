#!/usr/bin/env bash
# One GPU-machine run for the prefill work: conformance, benchmark, the peer (fla chunk_kda)
# and compute-sanitizer on a small sample, each step under its own time limit, logs under $OUT.
# Binaries come prebuilt in .carry/prefill (prefill_conformance, bench_prefill), shared
# libraries in .carry/lib, the fla-core wheel in .whl. Usage: scripts/gpu_prefill.sh [steps...]
# with steps from: conformance bench split peer sanitizer plot (default: all but split, in that
# order). Environment: RC_CASES (random calls, default 1500), BENCH_FILTER (a Google Benchmark
# filter, default all), PEER_SHAPES (substrings of the peer's shape names, default all).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=.carry/prefill
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
steps=${*:-conformance bench peer plot sanitizer}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"

for step in $steps; do
  echo "=== $step ($(date +%T))"
  case $step in
    conformance)
      RC_PARAMS="max_success=${RC_CASES:-1500}" timeout 300 "$BIN/prefill_conformance" \
        > "$OUT/conformance.log" 2>&1
      echo "exit $?"
      grep -E "^\[  (FAILED|PASSED|SKIPPED) |prefill conformance|Failure|spec:|OK \]|Falsifiable" \
        "$OUT/conformance.log" | head -60 ;;
    bench)
      timeout 180 "$BIN/bench_prefill" --benchmark_filter="${BENCH_FILTER:-.}" --benchmark_out="$OUT/bench.json" \
        --benchmark_out_format=json > "$OUT/bench.log" 2>&1
      echo "exit $?"
      grep -E "Copy|median|ERROR" "$OUT/bench.log" ;;
    split)
      # Per-kernel device time of one T=8192 H=64 B=1 call (prepare, chain) from ncu.
      timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:prefill_ \
        --launch-skip 4 --launch-count 4 "$BIN/bench_prefill" \
        --benchmark_filter='BM_Prefill/T:8192/H:64/B:1/' --benchmark_repetitions=1 > "$OUT/split.log" 2>&1
      echo "exit $?"
      grep -E "prefill_(prepare|chain)_kernel|gpu__time_duration" "$OUT/split.log" | cut -c1-160 ;;
    peer)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/fla_core-*.whl > "$OUT/pip.log" 2>&1
      PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 240 python3 scripts/peer_chunk_kda.py \
        ${PEER_SHAPES:-} > "$OUT/peer.log" 2>&1
      echo "exit $?"
      grep "peer chunk_kda" "$OUT/peer.log"; tail -3 "$OUT/peer.log" | cut -c1-300 ;;
    plot)
      # Token-heads per second against heads, ours and the peer, next to the logs.
      python3 bench/plot_prefill.py "$OUT/bench.json" "$OUT/peer.log" "$OUT/prefill_heads.png"
      echo "exit $?" ;;
    sanitizer)
      # A sample of every kernel: prepare + chain (bf16, f16, both paths of the L/A pass, guard
      # faults, a 4100-token sequence, the split, a caller's workspace, a captured graph), the f32
      # kernel and the guard.
      RC_PARAMS="max_success=8" timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$BIN/prefill_conformance" \
        --gtest_filter='PrefillGpu.DeviceChecks*:PrefillGpu.RandomCalls*:PrefillGpu.StrongDecays:PrefillGpu.TinyThenLong*:PrefillGpu.CallerWorkspace:PrefillGpu.GraphCapture*' \
        > "$OUT/memcheck.log" 2>&1
      echo "memcheck exit $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | head -5
      timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$BIN/prefill_conformance" --gtest_filter='PrefillGpu.DeviceChecks*:PrefillGpu.StrongDecays' \
        > "$OUT/racecheck.log" 2>&1
      echo "racecheck exit $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/racecheck.log" | head -5 ;;
  esac
done
