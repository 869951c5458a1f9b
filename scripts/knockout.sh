#!/usr/bin/env bash
# Knockout: for every rule of the catalogue, pretend its check was removed from the validators and
# see which unit and property tests fail. Every rule must fail at least one test; a rule whose
# removal nothing notices is a rule without a test.
#
#   scripts/knockout.sh [BUILD_DIR]          (default build-knockout)
#     KNOCKOUT_RC_PARAMS  RapidCheck parameters for every run (default "seed=20240229 max_success=100")
#     KNOCKOUT_JOBS       ctest -j (default nproc)
#     KNOCKOUT_RULES      space-separated rule ids to run (default: the whole catalogue)
#
# Builds BUILD_DIR once with -DKDAGUARD_ENABLE_KNOCKOUT=ON (the validators then honour
# KDAGUARD_KNOCKOUT_RULE=<rule id>, dropping every violation of that rule), runs the suite once
# without a knockout (it must pass), then once per rule, and prints a Markdown table of the tests
# that failed. Writes the table to BUILD_DIR/knockout.md too. Exit status 1 when some rule fails
# no test or the baseline fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-knockout}
jobs=${KNOCKOUT_JOBS:-$(nproc)}
rc_params=${KNOCKOUT_RC_PARAMS:-"seed=20240229 max_success=100"}

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKDAGUARD_ENABLE_KNOCKOUT=ON \
  -DKDAGUARD_ENABLE_CUDA=OFF -DKDAGUARD_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j"$jobs" >/dev/null

rules=${KNOCKOUT_RULES:-$("$build"/tools/kdaguard rules --json |
  python3 -c 'import json, sys; print(" ".join(r["id"] for r in json.load(sys.stdin)["rules"]))')}

# Runs the suite; prints the names of the tests that failed, one per line (parameterised tests
# without their parameter dump).
failing_tests() {
  local junit
  junit=$(mktemp)
  RC_PARAMS="$rc_params" ctest --test-dir "$build" -L 'unit|property' -j"$jobs" \
    --timeout 600 --output-junit "$junit" >/dev/null 2>&1 || true
  python3 - "$junit" <<'EOF'
import sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    if case.get("status") == "fail" or case.find("failure") is not None:
        print(case.get("name").split("  # GetParam()")[0])
EOF
  rm -f "$junit"
}

echo "knockout: baseline (no rule knocked out) ..." >&2
baseline=$(unset KDAGUARD_KNOCKOUT_RULE; failing_tests)
if [ -n "$baseline" ]; then
  echo "knockout: the suite fails without any knockout; fix that first:" >&2
  echo "$baseline" >&2
  exit 1
fi

mkdir -p "$build/knockout"
table="| rule | failing tests | its mutation property | the others (first few) |
|---|---|---|---|"
silent=0
for rule in $rules; do
  echo "knockout: $rule ..." >&2
  KDAGUARD_KNOCKOUT_RULE="$rule" failing_tests >"$build/knockout/$rule.txt"
  count=$(grep -c . "$build/knockout/$rule.txt" || true)
  [ "$count" -eq 0 ] && silent=$((silent + 1))
  property="ContractsMutations.${rule//./_}"
  own=$(grep -qxF "$property" "$build/knockout/$rule.txt" && echo "fails" || echo "**passes**")
  others=$(grep -vxF "$property" "$build/knockout/$rule.txt" | head -n 5 | sed 's/^/`/; s/$/`/' | paste -sd ',' - | sed 's/,/, /g')
  table="$table
| \`$rule\` | $count | $own | ${others:-} |"
done

printf '%s\n' "$table" | tee "$build/knockout.md"
if [ "$silent" -gt 0 ]; then
  echo "knockout: $silent rule(s) fail no test" >&2
  exit 1
fi
