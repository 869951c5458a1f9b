#!/usr/bin/env bash
# GPU conformance and benchmarks of the decode/verify/commit and prefill kernels, on a machine with
# an sm_90 GPU; writes a short summary to REPORT_DIR/gpu.md, the logs, JSON and plots (decode.png:
# % of copy against B; prefill_heads.png: token-heads per second against heads) beside it.
#   scripts/gpu_report.sh REPORT_DIR
#   BUILD_DIR   build tree holding the test and bench binaries (default: build)
#   GPU_CASES   random calls per conformance property (default 1000)
#   SANITIZER_CASES  calls per property under compute-sanitizer memcheck and racecheck (default 8)
#   PEER=1      also time the peer (bench/peer_fla.py and scripts/peer_chunk_kda.py; needs fla
#               importable by python3); without it the prefill plot shows the stored peer figures
#   FUZZ_GPU_BUILD    build tree of the fuzz-gpu preset (default build-fuzz-gpu); its fuzz_gpu runs
#                     FUZZ_GPU_SECONDS (default 120) per mode, else build's replayer runs the corpus
#   PREFILL_CASES     random calls per prefill conformance property (default 400)
#   T_CONF, T_SAN, T_BENCH, T_SPEC_BENCH, T_PEER, T_DRIFT, T_PREFILL_CONF, T_PREFILL_BENCH,
#   T_PREFILL_PEER    per-step time limits in seconds (300, 120 each, 300, 240, 420, 600, 300, 240,
#                     300)
set -uo pipefail
cd "$(dirname "$0")/.."
report_dir=${1:?usage: scripts/gpu_report.sh REPORT_DIR}
build=${BUILD_DIR:-build}
cases=${GPU_CASES:-1000}
sanitizer_cases=${SANITIZER_CASES:-8}
mkdir -p "$report_dir"
summary="$report_dir/gpu.md"
tests="$build/kernels/cuda/tests"
bench="$build/bench/bench_decode"
spec_bench="$build/bench/bench_spec"
status=0

# The benchmark binary NAME's JSON of this run against its one current baseline, into the summary
# (a regression is reported there, not as the run's status: the figures are the device's).
compare_with_baseline() {
  local name=$1
  [ -f "bench/baselines/$name.json" ] && [ -s "$report_dir/$name.json" ] || return 0
  { echo; echo "### Against bench/baselines/$name.json"; echo;
    python3 bench/compare_baselines.py "$report_dir/$name.json"; } >>"$summary" || true
}

{
  echo "## GPU: decode, verify, commit, prefill"
  echo
  echo "Device: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1)"
} >"$summary"

echo "== conformance ($cases random calls per property) and device-guard tests"
KDAGUARD_GPU_CASES=$cases timeout "${T_CONF:-300}" "$tests/gpu_conformance" >"$report_dir/conformance.log" 2>&1 || status=1
timeout 120 "$tests/gpu_guard" >>"$report_dir/conformance.log" 2>&1 || status=1
{
  echo
  echo "### Conformance (f64 reference, kda-math.md tolerances)"
  echo '```'
  grep -E "^conformance |^refusals:|\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$report_dir/conformance.log"
  echo '```'
} >>"$summary"

if command -v compute-sanitizer >/dev/null 2>&1; then
  echo "== compute-sanitizer memcheck and racecheck ($sanitizer_cases calls per property)"
  : >"$report_dir/sanitizer.log"
  for tool in memcheck racecheck; do
    for bin in gpu_conformance gpu_guard; do
      echo "--- $tool $bin" >>"$report_dir/sanitizer.log"
      KDAGUARD_GPU_CASES=$sanitizer_cases timeout "${T_SAN:-120}" compute-sanitizer --tool "$tool" \
        --error-exitcode 3 "$tests/$bin" --gtest_brief=1 >>"$report_dir/sanitizer.log" 2>&1 || status=1
    done
  done
  {
    echo
    echo "### compute-sanitizer"
    echo '```'
    grep -E "^--- |ERROR SUMMARY|RACECHECK SUMMARY|\[  (PASSED|FAILED) " "$report_dir/sanitizer.log"
    echo '```'
  } >>"$summary"
fi

echo "== long-horizon drift (gpu_drift: 32768 steps per history, state dtype and gate)"
KDAGUARD_DRIFT_CSV="$report_dir/drift.csv" timeout "${T_DRIFT:-600}" "$tests/gpu_drift" \
  >"$report_dir/drift.log" 2>&1 || status=1
{
  echo
  echo "### Long-horizon drift against the f64 recurrence (bound: fuzz/NOTES.md)"
  echo '```'
  grep -E "^drift |\[  (PASSED|FAILED|SKIPPED) " "$report_dir/drift.log"
  echo '```'
} >>"$summary"
if [ -s "$report_dir/drift.csv" ] && python3 scripts/plot_drift.py "$report_dir/drift.csv" \
     "$report_dir/drift.png" >>"$report_dir/drift.log" 2>&1; then
  echo "Plot: drift.png" >>"$summary"
fi

echo "== GPU fuzzing (fuzz_gpu)"
fuzz_gpu_build=${FUZZ_GPU_BUILD:-build-fuzz-gpu}
fuzz_seconds=${FUZZ_GPU_SECONDS:-120}
{ echo; echo "### GPU fuzzing (fuzz_gpu, both modes)"; echo '```'; } >>"$summary"
if [ -x "$fuzz_gpu_build/fuzz/fuzz_gpu" ]; then
  for mode in conformance planted; do
    mkdir -p "$report_dir/fuzz_gpu/$mode"
    KDAGUARD_FUZZ_GPU_MODE=$mode timeout $((fuzz_seconds + 60)) "$fuzz_gpu_build/fuzz/fuzz_gpu" \
      -max_total_time="$fuzz_seconds" -timeout=60 -print_final_stats=1 \
      -artifact_prefix="$report_dir/fuzz_gpu/$mode/" "$report_dir/fuzz_gpu/$mode" corpus/fuzz_gpu \
      >"$report_dir/fuzz_gpu_$mode.log" 2>&1 || status=1
    echo "$mode: $(grep -aE '^#[0-9]+' "$report_dir/fuzz_gpu_$mode.log" | tail -1)" >>"$summary"
    grep -aE "stat::(number_of_executed_units|average_exec_per_sec)|fuzz invariant broken" \
      "$report_dir/fuzz_gpu_$mode.log" >>"$summary" || true
  done
else
  "$build/fuzz/fuzz_gpu" corpus/fuzz_gpu >"$report_dir/fuzz_gpu.log" 2>&1 || status=1
  echo "corpus replay: $(tail -1 "$report_dir/fuzz_gpu.log")" >>"$summary"
fi
echo '```' >>"$summary"

echo "== benchmarks"
timeout "${T_BENCH:-300}" "$bench" --benchmark_repetitions=5 --benchmark_min_time=0.05 \
  --benchmark_display_aggregates_only=true --benchmark_out="$report_dir/bench_decode.json" \
  --benchmark_out_format=json >"$report_dir/bench.log" 2>&1 || status=1
{
  echo
  echo "### Benchmarks (median of 5; $(grep -m1 'copy ceiling' "$report_dir/bench.log"))"
  echo '```'
  grep -E "_median" "$report_dir/bench.log" | sed -E 's/ +[0-9.]+ us +[0-9]+ bytes=/ bytes=/'
  echo '```'
} >>"$summary"
compare_with_baseline bench_decode

echo "== speculative-step benchmarks (bench_spec: verify + commit, records, fused)"
timeout "${T_SPEC_BENCH:-240}" "$spec_bench" --benchmark_repetitions=5 --benchmark_min_time=0.05 \
  --benchmark_display_aggregates_only=true --benchmark_out="$report_dir/bench_spec.json" \
  --benchmark_out_format=json >"$report_dir/bench_spec.log" 2>&1 || status=1
{
  echo
  echo "### Speculative steps (median of 5; $(grep -m1 'copy ceiling' "$report_dir/bench_spec.log"))"
  echo
  python3 bench/compare_baselines.py "$report_dir/bench_spec.json" --no-baseline --steps
} >>"$summary" || true
compare_with_baseline bench_spec

if [ "${PEER:-0}" = 1 ]; then
  echo "== peer (flash-linear-attention fused_recurrent_kda)"
  if timeout "${T_PEER:-420}" python3 bench/peer_fla.py --out "$report_dir/peer.json" >"$report_dir/peer.log" 2>&1; then
    { echo; echo "### Peer, same run"; echo;
      python3 bench/compare_baselines.py "$report_dir/bench_decode.json" --no-baseline \
        --peer "$report_dir/peer.json"; } >>"$summary"
  else
    { echo; echo "Peer run failed: $(tail -3 "$report_dir/peer.log")"; } >>"$summary"
  fi
fi

peer_json=()
[ -s "$report_dir/peer.json" ] && peer_json=(--peer "$report_dir/peer.json")
spec_json=()
[ -s "$report_dir/bench_spec.json" ] && spec_json=("$report_dir/bench_spec.json")
if [ -s "$report_dir/bench_decode.json" ] && python3 bench/plot_decode.py "$report_dir/bench_decode.json" \
     "${spec_json[@]}" "${peer_json[@]}" --out "$report_dir/decode.png" >>"$report_dir/bench.log" 2>&1; then
  echo "Plot: decode.png" >>"$summary"
fi

echo "== prefill conformance and benchmarks"
RC_PARAMS="max_success=${PREFILL_CASES:-400}" timeout "${T_PREFILL_CONF:-300}" \
  "$build/kernels/cuda/prefill_conformance" >"$report_dir/prefill_conformance.log" 2>&1 || status=1
{
  echo
  echo "### Prefill conformance (f64 reference; rms ratios and the f16 rounding floor)"
  echo '```'
  grep -E "^\[(prefill conformance|f16 floor|f16 large state)\] |\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$report_dir/prefill_conformance.log"
  echo '```'
} >>"$summary"
timeout "${T_PREFILL_BENCH:-240}" "$build/bench/bench_prefill" --benchmark_repetitions=5 \
  --benchmark_display_aggregates_only=true --benchmark_out="$report_dir/bench_prefill.json" \
  --benchmark_out_format=json >"$report_dir/bench_prefill.log" 2>&1 || status=1
{
  echo
  echo "### Prefill benchmarks (median of 5)"
  echo '```'
  grep -E "Copy|_median" "$report_dir/bench_prefill.log"
  echo '```'
} >>"$summary"
compare_with_baseline bench_prefill
# The prefill peer: this run's when PEER=1 (fla's autotuning takes about a minute per shape, so
# it has its own limit and prints its summary after every shape), else the stored figures.
prefill_peer=bench/baselines/peer_prefill.json
if [ "${PEER:-0}" = 1 ]; then
  echo "== prefill peer (flash-linear-attention chunk_kda)"
  timeout "${T_PREFILL_PEER:-300}" python3 scripts/peer_chunk_kda.py >"$report_dir/peer_prefill.log" 2>&1
  if grep -q "^{" "$report_dir/peer_prefill.log"; then
    prefill_peer="$report_dir/peer_prefill.log"
    { echo; echo "### Prefill peer, same run"; echo '```';
      grep "peer chunk_kda" "$report_dir/peer_prefill.log"; echo '```'; } >>"$summary"
  fi
fi
if [ -s "$report_dir/bench_prefill.json" ] && python3 bench/plot_prefill.py \
     "$report_dir/bench_prefill.json" "$prefill_peer" "$report_dir/prefill_heads.png" \
     >>"$report_dir/bench_prefill.log" 2>&1; then
  echo "Plot: prefill_heads.png (the peer: $prefill_peer)" >>"$summary"
fi

cat "$summary"
exit $status
