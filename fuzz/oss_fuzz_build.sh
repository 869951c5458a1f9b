#!/usr/bin/env bash
# OSS-Fuzz build script: builds every CPU fuzz target with the engine and sanitizers OSS-Fuzz asks
# for and puts each binary, its seed corpus (<target>_seed_corpus.zip) and its dictionary
# (<target>.dict, when there is one) into $OUT.
#
# Honours what OSS-Fuzz's builder sets: CC, CXX, CFLAGS, CXXFLAGS (compile flags, sanitizers and
# -fsanitize=fuzzer-no-link included; they are the only optimisation and debug flags used),
# LIB_FUZZING_ENGINE (what links a fuzz target: -fsanitize=fuzzer for libFuzzer, or an engine's
# library), OUT and WORK (scratch space; default build-oss-fuzz in the repository). The repository
# is the one this script is in, wherever $SRC (OSS-Fuzz's source root, /src) points.
# CMAKE_PREFIX_PATH finds dependencies built from source (.clusterfuzzlite/build.sh); without it
# the system's packages of scripts/setup.sh are used (GoogleTest, RapidCheck, fmt, nlohmann-json,
# CLI11), which suits flags that keep libstdc++.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$repo/build-oss-fuzz}
: "${CC:=clang}" "${CXX:=clang++}" "${CFLAGS:=}" "${CXXFLAGS:=}"
: "${LIB_FUZZING_ENGINE:=-fsanitize=fuzzer}"
: "${OUT:?set OUT to the directory the fuzz targets go to}"
build="$WORK/kdaguard"

# Release with empty per-configuration flags: no -O3 or -DNDEBUG on top of OSS-Fuzz's flags.
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_C_FLAGS="$CFLAGS" -DCMAKE_CXX_FLAGS="$CXXFLAGS" \
  -DCMAKE_C_FLAGS_RELEASE= -DCMAKE_CXX_FLAGS_RELEASE= \
  -DBUILD_TESTING=ON -DKDAGUARD_BUILD_FUZZERS=ON -DKDAGUARD_FUZZ_ENGINE="$LIB_FUZZING_ENGINE" \
  -DKDAGUARD_ENABLE_CUDA=OFF -DKDAGUARD_BUILD_BENCHMARKS=OFF
targets=()
for src in "$repo"/fuzz/fuzz_*.cpp; do  # the CPU targets: OSS-Fuzz has no GPU for fuzz_gpu
  target=$(basename "$src" .cpp)
  [ "$target" = fuzz_gpu ] || targets+=("$target")
done
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

# zip_corpus ARCHIVE DIR...: every file of the DIRs at the archive's top level (python3, which
# OSS-Fuzz's image and scripts/setup.sh both have; zip need not be installed).
zip_corpus() {
  python3 - "$@" <<'PY'
import os, sys, zipfile
archive, *dirs = sys.argv[1:]
with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
    for d in dirs:
        for name in sorted(os.listdir(d)):
            if os.path.isfile(os.path.join(d, name)) and name != "EXPECTED.tsv":
                z.write(os.path.join(d, name), name)
PY
}

mkdir -p "$OUT"
for target in "${targets[@]}"; do
  cp "$build/fuzz/$target" "$OUT/$target"
  seeds=("$repo/corpus/$target")
  # kdaguard check's example calls seed the JSON target too (not their expected verdicts).
  if [ "$target" = fuzz_check_json ]; then seeds+=("$repo/corpus/calls"); fi
  zip_corpus "$OUT/${target}_seed_corpus.zip" "${seeds[@]}"
  if [ -f "$repo/fuzz/$target.dict" ]; then cp "$repo/fuzz/$target.dict" "$OUT/$target.dict"; fi
done
echo "oss_fuzz_build: ${targets[*]} -> $OUT"
