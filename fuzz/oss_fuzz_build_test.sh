#!/usr/bin/env bash
# The oss_fuzz_build test (ctest, label fuzz): runs .clusterfuzzlite/build.sh, hence
# fuzz/oss_fuzz_build.sh, the way OSS-Fuzz's builder does (CC, CXX, CFLAGS, CXXFLAGS,
# LIB_FUZZING_ENGINE, SRC, WORK, OUT set; the working directory is $SRC/kdaguard), without Docker,
# then checks that every CPU fuzz/fuzz_*.cpp (all but fuzz_gpu) gave a target with a seed corpus
# and replays each target over its corpus, dictionary loaded, as OSS-Fuzz's check_build does.
#   fuzz/oss_fuzz_build_test.sh SCRATCH_DIR [CC CXX]
# The flags are OSS-Fuzz's for SANITIZER=address with libFuzzer, less -stdlib=libc++: the
# system's packages are built against libstdc++ (the image builds its own, .clusterfuzzlite/).
# SCRATCH_DIR/work stays between runs, so a second run rebuilds only what changed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:?usage: oss_fuzz_build_test.sh SCRATCH_DIR [CC CXX]}
cc=${2:-clang-14}
cxx=${3:-clang++-14}
rm -rf "$scratch/src" "$scratch/out" "$scratch/replay"
mkdir -p "$scratch/src" "$scratch/out" "$scratch/work"
ln -s "$repo" "$scratch/src/kdaguard"

flags="-O1 -fno-omit-frame-pointer -gline-tables-only -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION \
-fsanitize=address -fsanitize-address-use-after-scope -fsanitize=fuzzer-no-link"
# Physically: through the link, CMake would map the repository onto the link's path inside the
# build tree and back, without end, when the scratch dir lies inside the repository.
cd -P "$scratch/src/kdaguard"
env CC="$cc" CXX="$cxx" CFLAGS="$flags" CXXFLAGS="$flags" LIB_FUZZING_ENGINE=-fsanitize=fuzzer \
  SANITIZER=address FUZZING_ENGINE=libfuzzer ARCHITECTURE=x86_64 \
  SRC="$scratch/src" WORK="$scratch/work" OUT="$scratch/out" \
  "$repo/.clusterfuzzlite/build.sh" >"$scratch/build.log" 2>&1 ||
  { tail -n 40 "$scratch/build.log"; echo "oss_fuzz_build_test: the build failed ($scratch/build.log)"; exit 1; }

status=0
for src in "$repo"/fuzz/fuzz_*.cpp; do
  target=$(basename "$src" .cpp)
  [ "$target" = fuzz_gpu ] && continue  # a GPU target, not built for OSS-Fuzz
  bin="$scratch/out/$target" corpus="$scratch/replay/$target"
  if [ ! -x "$bin" ] || [ ! -s "$scratch/out/${target}_seed_corpus.zip" ]; then
    echo "oss_fuzz_build_test: $target: no binary or no seed corpus in OUT"
    status=1
    continue
  fi
  mkdir -p "$corpus"
  python3 -m zipfile -e "$scratch/out/${target}_seed_corpus.zip" "$corpus"
  inputs=$(find "$corpus" -type f | wc -l)
  dict=()
  if [ -f "$scratch/out/$target.dict" ]; then dict=(-dict="$scratch/out/$target.dict"); fi
  if "$bin" "${dict[@]}" -runs=0 "$corpus" >"$scratch/$target.replay.log" 2>&1 &&
     grep -q "INFO: seed corpus: files: $inputs " "$scratch/$target.replay.log"; then
    echo "oss_fuzz_build_test: $target replays its $inputs seed inputs"
  else
    tail -n 20 "$scratch/$target.replay.log"
    echo "oss_fuzz_build_test: $target failed to replay its $inputs seed inputs"
    status=1
  fi
done
exit $status
