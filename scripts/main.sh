#!/usr/bin/env bash
# The main job: set up and build, run the tests, then the harness (every property with more
# cases than CI, a time-boxed fuzz campaign per target), and where a GPU is present the kernel
# conformance and benchmarks; ends with a short report (also written to build/report/).
#   FUZZ_SECONDS  seconds of fuzzing per target (default 120)
#   RC_CASES      RapidCheck cases per property (default 1000)
#   MUTANTS       mutants of the validators the harness judges (default 400, a fresh seed each
#                 run; about 10 s each; 0 skips the mutation testing)
set -euo pipefail
cd "$(dirname "$0")/.."
export FUZZ_SECONDS=${FUZZ_SECONDS:-120}
export RC_CASES=${RC_CASES:-1000}
export MUTANTS=${MUTANTS:-400}
report_dir=build/report
started=$(date +%s)

scripts/test.sh
mkdir -p "$report_dir"

echo "== harness: properties at ${RC_CASES} cases, ${FUZZ_SECONDS} s of fuzzing per target, ${MUTANTS} mutants"
scripts/harness.sh build build-fuzz "$report_dir"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "== GPU: kernel conformance, drift, GPU fuzzing and benchmarks"
  cmake --preset fuzz-gpu && cmake --build --preset fuzz-gpu -j"$(nproc)"
  scripts/gpu_report.sh "$report_dir"
  echo "== GPU: Python tests (kdaguard._C, gpu-marked)"
  PYTHONPATH="$PWD/build/python" python3 -m pytest -q -p no:cacheprovider -m gpu python/tests
else
  echo "No GPU on this machine: kernel conformance and benchmarks skipped (the gpu tests report as skipped)." \
    > "$report_dir/gpu.md"
fi

echo "== rule catalogue"
build/tools/kdaguard rules

echo
echo "================ kdaguard report ($(( $(date +%s) - started )) s) ================"
cat "$report_dir"/harness.md "$report_dir"/gpu.md
