#!/usr/bin/env bash
# Knockout, device half: for every value rule and entry point, remove that rule's checks from the
# device only (KDAGUARD_KNOCKOUT_DEVICE_RULE: the guard kernel, the kernels' prologues and their
# memory-safety checks; the host validators keep the rule) and run that rule's case of
# gpu_value_rules, which compares the device's error word with the host verdict. Every case must
# fail: a device check whose removal nothing notices is not load-bearing. scripts/knockout.sh is
# the host half.
#
#   scripts/knockout_device.sh [BUILD_DIR | GPU_VALUE_RULES_BINARY] [TABLE.md]
#     default build-knockout-gpu: configured with -DKDAGUARD_ENABLE_KNOCKOUT=ON and the CUDA
#     kernels, only gpu_value_rules built. A path to a gpu_value_rules binary built that way (on
#     a GPU machine, say) skips the build.
#     KNOCKOUT_CASE_TIMEOUT  seconds per case (default 120)
#
# Prints a Markdown table (rule x entry point: killed, or **survives**) and writes it to TABLE.md
# when given. Exit status 1 when the suite fails without a knockout or some case survives.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-build-knockout-gpu}
table_file=${2:-}
timeout_s=${KNOCKOUT_CASE_TIMEOUT:-120}

if [ -f "$target" ] && [ -x "$target" ]; then
  bin=$target
else
  cmake -S . -B "$target" -DCMAKE_BUILD_TYPE=Release -DKDAGUARD_ENABLE_KNOCKOUT=ON \
    -DKDAGUARD_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$target" --target gpu_value_rules -j"$(nproc)" >/dev/null
  bin=$target/kernels/cuda/tests/gpu_value_rules
fi

suite=Mutations/GpuValueRule.DeviceWordEqualsTheHostVerdict
echo "knockout_device: baseline (nothing knocked out) ..." >&2
if ! (unset KDAGUARD_KNOCKOUT_DEVICE_RULE KDAGUARD_KNOCKOUT_RULE
      timeout "$timeout_s" "$bin" --gtest_filter="$suite/*" >/dev/null 2>&1); then
  echo "knockout_device: the cases fail without any knockout (or no GPU); fix that first" >&2
  exit 1
fi

# Case names are <rule id with '.' as '_'>_<entry point>; a rule id's family (before its dot)
# has no underscore, and entry point names may hold one (record_verify), so the entry point is the
# longest name the case ends with.
cases=$("$bin" --gtest_list_tests --gtest_filter="$suite/*" | sed -n 's|^  DeviceWordEqualsTheHostVerdict/\([a-z_]*\).*|\1|p')
entries="decode prefill verify commit record_verify replay_commit accept_verify"
declare -A verdict
rules=()
survived=0
for case in $cases; do
  entry=
  for name in record_verify replay_commit accept_verify decode prefill verify commit; do
    if [[ $case == *_"$name" ]]; then entry=$name; break; fi
  done
  rule_name=${case%_"$entry"}
  rule=${rule_name/_/.}
  [[ " ${rules[*]} " == *" $rule "* ]] || rules+=("$rule")
  echo "knockout_device: $rule on $entry ..." >&2
  if KDAGUARD_KNOCKOUT_DEVICE_RULE="$rule" timeout "$timeout_s" "$bin" \
      --gtest_filter="$suite/$case" >/dev/null 2>&1; then
    verdict[$rule/$entry]="**survives**"
    survived=$((survived + 1))
  else
    verdict[$rule/$entry]="killed"
  fi
done

table="| rule | decode | prefill | verify | commit | record_verify | replay_commit | accept_verify |
|---|---|---|---|---|---|---|---|"
for rule in "${rules[@]}"; do
  row="| \`$rule\`"
  for entry in $entries; do row="$row | ${verdict[$rule/$entry]:-n/a}"; done
  table="$table
$row |"
done
printf '%s\n' "$table"
[ -n "$table_file" ] && printf '%s\n' "$table" >"$table_file"
if [ "$survived" -gt 0 ]; then
  echo "knockout_device: $survived device check(s) removed without a failing case" >&2
  exit 1
fi
