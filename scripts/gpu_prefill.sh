#!/usr/bin/env bash
# One GPU-machine run for the prefill work: conformance, benchmark, the peer (fla chunk_kda)
# and compute-sanitizer on a small sample, each step under its own time limit, logs under $OUT.
# Usage: scripts/gpu_prefill.sh [steps...] with steps from: conformance bench split peer sanitizer
# plot (default: all but split, in that order). Environment:
#   BUILD_DIR     build tree holding kernels/cuda/prefill_conformance and bench/bench_prefill
#                 (default: build); binaries built on another machine need the shared libraries
#                 they link (Google Benchmark, fmt) on LD_LIBRARY_PATH
#   FLA_WHEEL     the fla-core wheel for the peer step, installed under /tmp/site without network
#                 or dependencies (required unless fla is importable already)
#   RC_CASES      random calls, default 1500
#   BENCH_FILTER  a Google Benchmark filter, default all
#   PEER_SHAPES   substrings of the peer's shape names, default all
#   TRITON_CACHE_DIR  fla keeps its autotuning results in Triton's cache (FLA_CACHE_RESULTS, on by
#                 default), so a cache directory kept between runs spares each shape its minute of
#                 autotuning after the first run that reached it
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
build=${BUILD_DIR:-build}
conformance_bin=$build/kernels/cuda/prefill_conformance
bench_bin=$build/bench/bench_prefill
steps=${*:-conformance bench peer plot sanitizer}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"

for step in $steps; do
  echo "=== $step ($(date +%T))"
  case $step in
    conformance)
      RC_PARAMS="max_success=${RC_CASES:-1500}" timeout 300 "$conformance_bin" \
        > "$OUT/conformance.log" 2>&1
      echo "exit $?"
      grep -E "^\[  (FAILED|PASSED|SKIPPED) |prefill conformance|Failure|spec:|OK \]|Falsifiable" \
        "$OUT/conformance.log" | head -60 ;;
    bench)
      timeout 180 "$bench_bin" --benchmark_filter="${BENCH_FILTER:-.}" --benchmark_out="$OUT/bench.json" \
        --benchmark_out_format=json > "$OUT/bench.log" 2>&1
      echo "exit $?"
      grep -E "Copy|median|ERROR" "$OUT/bench.log" ;;
    split)
      # Per-kernel device time of one T=8192 H=64 B=1 call (prepare, chain) from ncu.
      timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:prefill_ \
        --launch-skip 4 --launch-count 4 "$bench_bin" \
        --benchmark_filter='BM_Prefill/T:8192/H:64/B:1/' --benchmark_repetitions=1 > "$OUT/split.log" 2>&1
      echo "exit $?"
      grep -E "prefill_(prepare|chain)_kernel|gpu__time_duration" "$OUT/split.log" | cut -c1-160 ;;
    peer)
      if [ -n "${FLA_WHEEL:-}" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target /tmp/site "$FLA_WHEEL" > "$OUT/pip.log" 2>&1 || { echo "pip failed: $OUT/pip.log"; continue; }
      fi
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
        "$conformance_bin" \
        --gtest_filter='PrefillGpu.DeviceChecks*:PrefillGpu.RandomCalls*:PrefillGpu.StrongDecays:PrefillGpu.TinyThenLong*:PrefillGpu.CallerWorkspace:PrefillGpu.GraphCapture*' \
        > "$OUT/memcheck.log" 2>&1
      echo "memcheck exit $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | head -5
      timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$conformance_bin" --gtest_filter='PrefillGpu.DeviceChecks*:PrefillGpu.StrongDecays' \
        > "$OUT/racecheck.log" 2>&1
      echo "racecheck exit $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/racecheck.log" | head -5 ;;
  esac
done
