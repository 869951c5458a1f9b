#!/usr/bin/env bash
# Regenerates the README's rule table (between <!-- rules:begin --> and <!-- rules:end -->) from
# `kdaguard rules --markdown`, in place. The test ReadmeRules.readme_rules_in_sync fails until
# this has been run after a change to the catalogue.
#   usage: scripts/update_readme_rules.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
kdaguard="$build_dir/tools/kdaguard"
readme=README.md
if [[ ! -x "$kdaguard" ]]; then
  echo "no $kdaguard: build the kdaguard target first (cmake --build $build_dir --target kdaguard)" >&2
  exit 1
fi

table=$(mktemp)
trap 'rm -f "$table" "$table.readme"' EXIT
"$kdaguard" rules --markdown >"$table"

if [[ ! -f "$readme" ]]; then
  printf '# kdaguard\n\n## Rules\n\n<!-- rules:begin -->\n<!-- rules:end -->\n' >"$readme"
fi
if [[ $(grep -c '^<!-- rules:begin -->$' "$readme") -ne 1 || $(grep -c '^<!-- rules:end -->$' "$readme") -ne 1 ]]; then
  echo "$readme needs exactly one line <!-- rules:begin --> and one line <!-- rules:end -->" >&2
  exit 1
fi

if [[ $(grep -n '^<!-- rules:begin -->$' "$readme" | cut -d: -f1) -gt $(grep -n '^<!-- rules:end -->$' "$readme" | cut -d: -f1) ]]; then
  echo "$readme: <!-- rules:end --> comes before <!-- rules:begin -->" >&2
  exit 1
fi

# Keep everything outside the markers; put the table between them.
awk -v table="$table" '
  /^<!-- rules:begin -->$/ { print; while ((getline line < table) > 0) print line; skipping = 1; next }
  /^<!-- rules:end -->$/   { skipping = 0 }
  !skipping                { print }
' "$readme" >"$table.readme"
cat "$table.readme" >"$readme"
echo "updated the rule table in $readme ($(($(wc -l <"$table") - 2)) rules)"
