#!/usr/bin/env bash
# OSS-Fuzz build script: builds every fuzz target with the engine and sanitizers OSS-Fuzz asks
# for and puts each binary, its seed corpus (<target>_seed_corpus.zip) and its dictionary
# (<target>.dict, when there is one) into $OUT.
#
# Honours CC, CXX, CFLAGS, CXXFLAGS (compile flags, sanitizers and -fsanitize=fuzzer-no-link
# included), LIB_FUZZING_ENGINE (what links a fuzz target: -fsanitize=fuzzer for libFuzzer, or an
# engine's library) and OUT. SRC defaults to the repository this script is in; WORK (scratch
# build dir) to $SRC/build-oss-fuzz. The image needs the Debian packages of scripts/setup.sh
# (GoogleTest, RapidCheck, fmt, nlohmann-json, CLI11, cmake).
set -euo pipefail
SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}
WORK=${WORK:-$SRC/build-oss-fuzz}
: "${CC:=clang}" "${CXX:=clang++}" "${CFLAGS:=}" "${CXXFLAGS:=}"
: "${LIB_FUZZING_ENGINE:=-fsanitize=fuzzer}"
: "${OUT:?set OUT to the directory the fuzz targets go to}"

cmake -S "$SRC" -B "$WORK" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_C_FLAGS="$CFLAGS" -DCMAKE_CXX_FLAGS="$CXXFLAGS" \
  -DKDAGUARD_BUILD_FUZZERS=ON -DKDAGUARD_FUZZ_ENGINE="$LIB_FUZZING_ENGINE" \
  -DKDAGUARD_ENABLE_CUDA=OFF -DKDAGUARD_BUILD_BENCHMARKS=OFF
targets=()
for src in "$SRC"/fuzz/fuzz_*.cpp; do targets+=("$(basename "$src" .cpp)"); done
cmake --build "$WORK" -j"$(nproc)" --target "${targets[@]}"

mkdir -p "$OUT"
for target in "${targets[@]}"; do
  cp "$WORK/fuzz/$target" "$OUT/$target"
  (cd "$SRC/corpus/$target" && zip -q -r "$OUT/${target}_seed_corpus.zip" .)
  # kdaguard check's example calls seed the JSON target too.
  if [ "$target" = fuzz_check_json ]; then
    (cd "$SRC/corpus/calls" && zip -q -r "$OUT/${target}_seed_corpus.zip" . -x EXPECTED.tsv)
  fi
  [ -f "$SRC/fuzz/$target.dict" ] && cp "$SRC/fuzz/$target.dict" "$OUT/$target.dict"
done
echo "oss_fuzz_build: ${targets[*]} -> $OUT"
