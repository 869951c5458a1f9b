#!/usr/bin/env bash
# Runs fla's own tests/ops/test_kda.py (the fla version of the wheel; fla's code, never kept in
# this repository) with kdaguard registered as fla's KDA backend in strict mode, over the forward
# tests, and writes the coverage table (python/tools/fla_suite/conftest.py says how cases count).
#
#   scripts/fla_tests.sh FLA_TEST_KDA_PY [OUTDIR]
# env: FLA_WHEEL    the fla-core wheel (installed with pip --no-deps into a scratch dir; required
#                   unless fla is importable already)
#      KDAGUARD_PY  the directory holding the kdaguard package (default: build-release/python)
#      FLA_SELECT   pytest -k expression (default: the forward tests)
#      KDAGUARD_FLA_STRICT=0 lets declined calls fall back to fla's Triton instead of failing
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
test_file=${1:?usage: fla_tests.sh FLA_TEST_KDA_PY [OUTDIR]}
out=${2:-$PWD/fla-tests}
select=${FLA_SELECT:-"fused_recurrent or varlen_prefill or invalid_chunk"}
pkg=${KDAGUARD_PY:-$here/build-release/python}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -n "${FLA_WHEEL:-}" ]]; then
  python3 -m pip install -q --no-index --no-deps --target "$work/site" "$FLA_WHEEL"
fi
mkdir -p "$work/suite"
cp "$test_file" "$work/suite/test_kda.py"
cp "$here/python/tools/fla_suite/conftest.py" "$work/suite/conftest.py"
export PYTHONPATH="$work/site:$pkg${PYTHONPATH:+:$PYTHONPATH}"
export KDAGUARD_FLA_TABLE="$out/fla_coverage.md"
cd "$work/suite"
set +e
python3 -m pytest -q -p no:cacheprovider -o addopts="" --rootdir "$work/suite" -k "$select" \
  test_kda.py 2>&1 | tee "$out/fla_pytest.log"
rc=${PIPESTATUS[0]}
set -e
echo "fla_tests: pytest exit $rc; table in $KDAGUARD_FLA_TABLE"
exit "$rc"
