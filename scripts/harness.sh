#!/usr/bin/env bash
# The harness part of the main job: every property with more cases than CI, a time-boxed fuzz
# campaign per target with progress lines, then a short report (rules covered by properties,
# cases run, fuzz executions and coverage, findings) on stdout and in REPORT_DIR/harness.md.
#
#   scripts/harness.sh [BUILD_DIR [FUZZ_BUILD_DIR [REPORT_DIR]]]
#     BUILD_DIR       a g++ build with the properties (default: build)
#     FUZZ_BUILD_DIR  a fuzz-preset build with the libFuzzer targets (default: build-fuzz)
#     REPORT_DIR      where the report goes (default: BUILD_DIR/report)
#   Environment:
#     RC_CASES       RapidCheck cases per property (default 1000)
#     FUZZ_SECONDS   seconds of fuzzing per target (default 120)
#     FUZZ_JOBS      targets fuzzed at once (default: as many as there are cores, at most 3)
#     MUTANTS        mutants of the validators to judge (scripts/mutation_test.py; default 0: none;
#                    about 10 s each on 2 cores), MUTATION_SEED (default: the clock, a fresh
#                    sample each run) and MUTATION_FILES (default: where the validators' logic
#                    lives, validate.cpp, row_rules.h and value_checks.h)
#
# Fuzzing writes new inputs to REPORT_DIR/fuzz/<target>/corpus (corpus/<target> is read, never
# written; scripts/fuzz_continuous.sh merges into it). Exit status 1 when a property fails or a
# fuzzer finds something.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
fuzz_build=${2:-build-fuzz}
report_dir=${3:-$build/report}
rc_cases=${RC_CASES:-1000}
fuzz_seconds=${FUZZ_SECONDS:-120}
cores=$(nproc)
fuzz_jobs=${FUZZ_JOBS:-$(( cores < 3 ? cores : 3 ))}
mkdir -p "$report_dir/properties" "$report_dir/fuzz"
started=$(date +%s)
status=0

# ---- properties ----------------------------------------------------------------------------------
cmake --build "$build" -j"$cores" >/dev/null || { echo "harness: build of $build failed" >&2; exit 1; }
echo "== properties: ${rc_cases} cases each"
for src in properties/*.cpp; do
  name=$(basename "$src" .cpp)
  bin="$build/properties/$name"
  [ -x "$bin" ] || { echo "  $name: not built"; status=1; continue; }
  t0=$(date +%s)
  RC_PARAMS="max_success=${rc_cases}" "$bin" --gtest_output="json:$report_dir/properties/$name.json" \
    >"$report_dir/properties/$name.log" 2>&1
  rc=$?
  summary=$(python3 - "$report_dir/properties/$name.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(f"{d['tests']} tests, {d['failures']} failed")
except Exception:
    print("no result (crashed?)")
EOF
)
  echo "  $name: $summary ($(( $(date +%s) - t0 )) s)"
  [ $rc -eq 0 ] || status=1
done

# ---- fuzzing -------------------------------------------------------------------------------------
targets=()
for src in fuzz/fuzz_*.cpp; do  # the CPU targets (fuzz_gpu runs in scripts/gpu_report.sh)
  target=$(basename "$src" .cpp)
  [ "$target" = fuzz_gpu ] || targets+=("$target")
done

# Runs one target for fuzz_seconds, printing a progress line every 15 s.
fuzz_one() {
  local target=$1 dir="$report_dir/fuzz/$1" bin="$fuzz_build/fuzz/$1"
  rm -rf "$dir"
  mkdir -p "$dir/corpus"
  if [ ! -x "$bin" ]; then
    echo "not built" >"$dir/missing"
    echo "  [$target] not built in $fuzz_build" >&2
    return
  fi
  local dict=() extra_seeds=()
  [ -f "fuzz/$target.dict" ] && dict=(-dict="fuzz/$target.dict")
  [ "$target" = fuzz_check_json ] && extra_seeds=(corpus/calls)  # kdaguard check's examples
  "$bin" -max_total_time="$fuzz_seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    "${dict[@]}" -artifact_prefix="$dir/" "$dir/corpus" "corpus/$target" "${extra_seeds[@]}" \
    >"$dir/log" 2>&1 &
  local pid=$! elapsed=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 15
    elapsed=$((elapsed + 15))
    local line
    line=$(grep -aE '^#[0-9]+' "$dir/log" | tail -n 1 | grep -oE '^#[0-9]+|cov: [0-9]+|ft: [0-9]+|corp: [0-9]+|exec/s: [0-9]+' | paste -sd ' ' -)
    echo "  [$target ${elapsed}/${fuzz_seconds} s] ${line:-starting}"
  done
  wait "$pid"
  echo $? >"$dir/exit"
}

echo "== fuzzing: ${fuzz_seconds} s per target, ${fuzz_jobs} at a time"
cmake --build "$fuzz_build" -j"$cores" --target "${targets[@]}" >/dev/null 2>&1 ||
  echo "harness: building the fuzz targets in $fuzz_build failed" >&2
running=0
for target in "${targets[@]}"; do
  fuzz_one "$target" &
  running=$((running + 1))
  if [ "$running" -ge "$fuzz_jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

# ---- mutation testing of the validators ----------------------------------------------------------
mutants=${MUTANTS:-0}
rm -f "$report_dir/mutation.json" "$report_dir/mutation.md"
if [ "$mutants" -gt 0 ]; then
  seed=${MUTATION_SEED:-$(date +%s)}
  read -r -a mutation_files <<<"${MUTATION_FILES:-contracts/src/validate.cpp contracts/include/kdaguard/contracts/row_rules.h contracts/include/kdaguard/contracts/value_checks.h}"
  echo "== mutation testing: $mutants mutants of ${mutation_files[*]} (seed $seed)"
  if command -v mutate >/dev/null 2>&1; then
    python3 scripts/mutation_test.py --sample "$mutants" --seed "$seed" --build build-mutation \
      --report "$report_dir/mutation.md" --json "$report_dir/mutation.json" "${mutation_files[@]}" |
      grep -E '^mutation_test|survived' || status=1
  else
    echo "  universalmutator is not installed (pip install universalmutator==1.14.1): skipped"
  fi
fi

# ---- report --------------------------------------------------------------------------------------
report="$report_dir/harness.md"
python3 - "$report_dir" "$build" "$rc_cases" "$fuzz_seconds" "$(( $(date +%s) - started ))" "${targets[@]}" >"$report" <<'EOF'
import glob, json, os, re, subprocess, sys

report_dir, build, rc_cases, fuzz_seconds, elapsed = sys.argv[1:6]
targets = sys.argv[6:]
out = [f"## Harness ({elapsed} s)", ""]

# Properties.
tests = failures = 0
failed = []
passed_names = set()
for path in sorted(glob.glob(os.path.join(report_dir, "properties", "*.json"))):
    d = json.load(open(path))
    tests += d["tests"]
    failures += d["failures"]
    for suite in d.get("testsuites", []):
        for case in suite.get("testsuite", []):
            name = f"{suite['name']}.{case['name']}"
            if case.get("failures"):
                failed.append(name)
            elif case.get("result", "COMPLETED") == "COMPLETED":
                passed_names.add(name)
logs_without_json = [os.path.basename(p)[:-4] for p in glob.glob(os.path.join(report_dir, "properties", "*.log"))
                     if not os.path.exists(p[:-4] + ".json")]
out.append(f"**Properties**: {tests} properties and tests, {failures} failed, "
           f"up to {rc_cases} RapidCheck cases each (about {tests * int(rc_cases):,} cases).")
for name in failed:
    out.append(f"- FAILED `{name}`")
for name in logs_without_json:
    out.append(f"- CRASHED `{name}` (see {report_dir}/properties/{name}.log)")

# Rules covered: the per-rule mutation properties that passed.
try:
    rules = json.loads(subprocess.run([os.path.join(build, "tools", "kdaguard"), "rules", "--json"],
                                      capture_output=True, text=True, check=True).stdout)["rules"]
    ids = [r["id"] for r in rules]
except Exception:
    ids = []
covered = [i for i in ids if f"ContractsMutations.{i.replace('.', '_')}" in passed_names]
missing = [i for i in ids if i not in covered]
out.append(f"**Rules covered by a passing mutation property**: {len(covered)} of {len(ids)}"
           + (f" (not covered: {', '.join(missing)})" if missing else "") + ".")
out.append("")

# Fuzzing.
out.append(f"**Fuzzing** ({fuzz_seconds} s per target, ASan + UBSan):")
out.append("")
out.append("| target | executions | exec/s | cov | ft | new corpus inputs | findings |")
out.append("|---|---|---|---|---|---|---|")
findings = []
for t in targets:
    d = os.path.join(report_dir, "fuzz", t)
    if os.path.exists(os.path.join(d, "missing")) or not os.path.exists(os.path.join(d, "log")):
        out.append(f"| {t} | not built | | | | | |")
        continue
    log = open(os.path.join(d, "log"), errors="replace").read()
    def stat(key):
        m = re.search(rf"stat::{key}:\s+(\d+)", log)
        return m.group(1) if m else "?"
    status_lines = [l for l in log.splitlines() if re.match(r"^#\d+", l)]
    cov = ft = "?"
    if status_lines:
        last = status_lines[-1]
        cov = (re.search(r"cov: (\d+)", last) or [None, "?"])[1]
        ft = (re.search(r"ft: (\d+)", last) or [None, "?"])[1]
    artifacts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "*-*"))
                       if re.match(r"(crash|leak|timeout|oom|slow-unit)-", os.path.basename(p)))
    new_inputs = len(os.listdir(os.path.join(d, "corpus"))) if os.path.isdir(os.path.join(d, "corpus")) else 0
    code = open(os.path.join(d, "exit")).read().strip() if os.path.exists(os.path.join(d, "exit")) else "?"
    found = "none" if not artifacts and code == "0" else (", ".join(artifacts) or f"exit {code}")
    if found != "none":
        findings.append((t, found, d))
    out.append(f"| {t} | {stat('number_of_executed_units')} | {stat('average_exec_per_sec')} | {cov} | {ft} "
               f"| {new_inputs} | {found} |")
out.append("")
mutation = os.path.join(report_dir, "mutation.json")
if os.path.exists(mutation):
    m = json.load(open(mutation))
    out.append(f"**Mutation testing** of {', '.join(m['files'])} (seed {m['seed']}, {m['sampled']} of "
               f"{m['generated']} mutants): {m['killed']} killed, {m['survived']} survived, "
               f"{m['equivalent']} equivalent, {m['invalid']} not compiling; score "
               f"{100 * m['score']:.1f}% of the non-equivalent ones (table: {report_dir}/mutation.md).")
    out.append("")
if findings:
    out.append("**Findings**:")
    for t, found, d in findings:
        out.append(f"- {t}: {found} (input and log in {d})")
else:
    out.append("**Findings**: none.")
print("\n".join(out))
EOF
cat "$report"
grep -q "^\*\*Findings\*\*: none" "$report" || status=1
grep -qE "FAILED|CRASHED" "$report" && status=1
exit $status
