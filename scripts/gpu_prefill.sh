#!/usr/bin/env bash
# One GPU-machine session for the prefill work: conformance, benchmark, the peer (fla chunk_kda)
# and compute-sanitizer on a small sample, each step under its own time limit, logs under $OUT.
# Binaries come prebuilt in .carry/prefill (prefill_conformance, bench_prefill), shared
# libraries in .carry/lib, the fla-core wheel in .whl. Usage: scripts/gpu_prefill.sh [steps...]
# with steps from: conformance bench peer sanitizer (default: all, in that order).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=.carry/prefill
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
steps=${*:-conformance bench peer sanitizer}
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
      timeout 180 "$BIN/bench_prefill" --benchmark_out="$OUT/bench.json" \
        --benchmark_out_format=json > "$OUT/bench.log" 2>&1
      echo "exit $?"
      grep -E "Copy|median|ERROR" "$OUT/bench.log" ;;
    peer)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/fla_core-*.whl > "$OUT/pip.log" 2>&1
      PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 240 python3 scripts/peer_chunk_kda.py \
        > "$OUT/peer.log" 2>&1
      echo "exit $?"
      grep "peer chunk_kda" "$OUT/peer.log"; tail -3 "$OUT/peer.log" | cut -c1-300 ;;
    sanitizer)
      RC_PARAMS="max_success=8" timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$BIN/prefill_conformance" \
        --gtest_filter='PrefillGpu.DeviceChecks*:PrefillGpu.RandomCalls*' > "$OUT/memcheck.log" 2>&1
      echo "memcheck exit $?"; tail -4 "$OUT/memcheck.log"
      RC_PARAMS="max_success=3" timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$BIN/prefill_conformance" --gtest_filter='PrefillGpu.DeviceChecks*' > "$OUT/racecheck.log" 2>&1
      echo "racecheck exit $?"; tail -4 "$OUT/racecheck.log" ;;
  esac
done
