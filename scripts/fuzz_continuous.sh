#!/usr/bin/env bash
# Continuous fuzzing on one machine: every core, libFuzzer's fork mode, and the inputs that add
# coverage merged back into the checked-in seed corpora (corpus/<target>; commit them).
#
#   scripts/fuzz_continuous.sh [TARGET ...]        (default: every fuzz/fuzz_*.cpp target)
#     FUZZ_PRESET   fuzz (ASan + UBSan, the default) or fuzz-fast (no sanitizers, about 3x the
#                   executions; the targets' own invariants are still checked): run both for long
#                   campaigns, since only the sanitizer build sees undefined behaviour
#     FUZZ_BUILD    the preset's build dir (default build-fuzz or build-fuzz-fast; built here if needed)
#     FUZZ_SECONDS  seconds per target and round (default 3600)
#     FUZZ_ROUNDS   rounds over the targets; 0 = until interrupted (default 1)
#     FUZZ_JOBS     worker processes (default: all cores)
#
# Work happens in FUZZ_BUILD/continuous/<target>/ (a growing work corpus, artifacts, logs); after
# each target's turn, `-merge=1` copies into corpus/<target> only the inputs that add coverage.
# Crashes do not stop the run (-ignore_crashes); they are listed at the end of each turn.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${FUZZ_PRESET:-fuzz}
case "$preset" in
  fuzz) build=${FUZZ_BUILD:-build-fuzz} ;;
  fuzz-fast) build=${FUZZ_BUILD:-build-fuzz-fast} ;;
  *) echo "fuzz_continuous: FUZZ_PRESET must be fuzz or fuzz-fast, not '$preset'" >&2; exit 2 ;;
esac
seconds=${FUZZ_SECONDS:-3600}
rounds=${FUZZ_ROUNDS:-1}
jobs=${FUZZ_JOBS:-$(nproc)}

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for src in fuzz/fuzz_*.cpp; do targets+=("$(basename "$src" .cpp)"); done
fi

[ -d "$build" ] || cmake --preset "$preset"
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

merge_back() {
  local target=$1 work="$build/continuous/$1"
  local before after
  before=$(ls "corpus/$target" | wc -l)
  "$build/fuzz/$target" -merge=1 "corpus/$target" "$work/corpus" >"$work/merge.log" 2>&1 || true
  after=$(ls "corpus/$target" | wc -l)
  echo "fuzz_continuous: $target: corpus/$target $before -> $after inputs"
}

round=0
while [ "$rounds" -eq 0 ] || [ "$round" -lt "$rounds" ]; do
  round=$((round + 1))
  for target in "${targets[@]}"; do
    work="$build/continuous/$target"
    mkdir -p "$work/corpus" "$work/artifacts"
    echo "fuzz_continuous: round $round, $target, $jobs workers, $seconds s"
    # Merge even when interrupted mid-run.
    trap 'merge_back "$target"; exit 130' INT TERM
    dict=() extra_seeds=()
    [ -f "fuzz/$target.dict" ] && dict=(-dict="fuzz/$target.dict")
    [ "$target" = fuzz_check_json ] && extra_seeds=(corpus/calls)  # kdaguard check's examples
    "$build/fuzz/$target" "${dict[@]}" -fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
      -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/" "$work/corpus" "corpus/$target" "${extra_seeds[@]}" 2>&1 |
      tee "$work/fuzz.log" | grep -aE '^#[0-9]+.*(pulse|DONE)|INFO: fuzzed for' || true
    trap - INT TERM
    merge_back "$target"
    found=$(ls "$work/artifacts" 2>/dev/null | wc -l)
    [ "$found" -eq 0 ] || echo "fuzz_continuous: $target: $found finding(s) in $work/artifacts"
  done
done
