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
#     FUZZ_PREBUILT=1  use the targets already in FUZZ_BUILD/fuzz/ as they are: no cmake (for a
#                   machine that has the binaries but not the toolchain)
#
# Work happens in FUZZ_BUILD/continuous/<target>/ (a growing work corpus, artifacts, logs); after
# each target's turn, `-merge=1` copies into corpus/<target> only the inputs that add coverage.
# Crashes do not stop the run (-ignore_crashes); they are listed at the end of each turn.
#
# Executions add up across runs in corpus/fuzz_executions.tsv (one line per target and preset:
# executions, seconds, runs, findings; commit it with the corpus), so "no findings in N
# executions" is a number anyone can read; each turn prints the totals.
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
  # fuzz_gpu needs its own preset (fuzz-gpu) and a GPU; name it to fuzz it here.
  for src in fuzz/fuzz_*.cpp; do
    target=$(basename "$src" .cpp)
    [ "$target" = fuzz_gpu ] || targets+=("$target")
  done
fi

if [ "${FUZZ_PREBUILT:-0}" = 1 ]; then
  for target in "${targets[@]}"; do
    [ -x "$build/fuzz/$target" ] || { echo "fuzz_continuous: FUZZ_PREBUILT=1 but no $build/fuzz/$target" >&2; exit 2; }
  done
else
  [ -d "$build" ] || cmake --preset "$preset"
  cmake --build "$build" -j"$jobs" --target "${targets[@]}"
fi

ledger=corpus/fuzz_executions.tsv

# Adds one turn of TARGET (its seconds, and how many artifacts earlier turns left) to the ledger:
# the executions of the last status line of its log (fork mode's "#N:" counts every job's runs;
# what ran after the last line is not counted) and its new findings; prints the totals.
record_executions() {
  local target=$1 work="$build/continuous/$1" elapsed=$2 known=$3
  python3 - "$ledger" "$target" "$preset" "$work/fuzz.log" "$elapsed" "$work/artifacts" "$known" <<'PY'
import os, re, sys
ledger, target, preset, log, elapsed, artifacts, known = sys.argv[1:]
text = open(log, errors="replace").read() if os.path.exists(log) else ""
counts = re.findall(r"^#(\d+)", text, re.M)
executions = int(counts[-1]) if counts else 0
findings = (len(os.listdir(artifacts)) if os.path.isdir(artifacts) else 0) - int(known)
header = "target\tpreset\texecutions\tseconds\truns\tfindings"
rows = {}
if os.path.exists(ledger):
    for line in open(ledger).read().splitlines()[1:]:
        f = line.split("\t")
        if len(f) == 6:
            rows[(f[0], f[1])] = [int(x) for x in f[2:]]
total = rows.get((target, preset), [0, 0, 0, 0])
total = [total[0] + executions, total[1] + int(elapsed), total[2] + 1, total[3] + findings]
rows[(target, preset)] = total
with open(ledger, "w") as out:
    out.write(header + "\n")
    for (t, p), v in sorted(rows.items()):
        out.write("\t".join([t, p] + [str(x) for x in v]) + "\n")
print(f"fuzz_continuous: {target} ({preset}): this turn {executions:,} executions, {findings} finding(s); "
      f"in all {total[0]:,} executions in {total[1]:,} s over {total[2]} turn(s), {total[3]} finding(s) "
      f"({ledger})")
PY
}

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
    # Merge and count even when interrupted mid-run.
    started=$(date +%s)
    known=$(ls "$work/artifacts" | wc -l)  # findings of earlier turns
    trap 'merge_back "$target"; record_executions "$target" $(( $(date +%s) - started )) "$known"; exit 130' INT TERM
    dict=() extra_seeds=()
    [ -f "fuzz/$target.dict" ] && dict=(-dict="fuzz/$target.dict")
    [ "$target" = fuzz_check_json ] && extra_seeds=(corpus/calls)  # kdaguard check's examples
    "$build/fuzz/$target" "${dict[@]}" -fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
      -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/" "$work/corpus" "corpus/$target" "${extra_seeds[@]}" 2>&1 |
      tee "$work/fuzz.log" | grep -aE '^#[0-9]+.*(pulse|DONE)|INFO: fuzzed for' || true
    trap - INT TERM
    merge_back "$target"
    record_executions "$target" $(( $(date +%s) - started )) "$known"
    found=$(ls "$work/artifacts" 2>/dev/null | wc -l)
    [ "$found" -eq 0 ] || echo "fuzz_continuous: $target: $found finding(s) in $work/artifacts"
  done
done
