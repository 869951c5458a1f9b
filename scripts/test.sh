#!/usr/bin/env bash
# The test command (README, CI): installs what is missing, builds, and runs every test that needs
# no GPU (unit, property, fuzz corpus replay), then a short sanitizer fuzz run per target in the
# fuzz preset. GPU tests are reported skipped where there is no device.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh

echo "== build (default preset)"
werror=-DKDAGUARD_WARNINGS_AS_ERRORS=${KDAGUARD_WARNINGS_AS_ERRORS:-OFF}  # ON in CI (.ci/run)
cmake --preset default "$werror"
cmake --build --preset default -j"$jobs"

echo "== tests (default preset)"
ctest --preset default -j"$jobs"

echo "== Python tests (kdaguard._C from build/python; gpu-marked tests skip without a GPU)"
# pytest exits 5 when it ran no test: that fails the run like any other failure.
PYTHONPATH="$PWD/build/python" python3 -m pytest -q -p no:cacheprovider python/tests

echo "== fuzz smoke runs (clang 14, ASan + UBSan)"
cmake --preset fuzz "$werror"
cmake --build --preset fuzz -j"$jobs"
ctest --preset fuzz -L fuzz -j"$jobs"
