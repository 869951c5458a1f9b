#!/bin/bash -eu
# ClusterFuzzLite / OSS-Fuzz build (run as $SRC/build.sh by the builder). The dependencies in
# $SRC/deps (the Dockerfile clones them) are built first with the builder's $CC, $CXX and flags:
# OSS-Fuzz compiles against libc++ and MemorySanitizer needs every linked library instrumented,
# so the system's libstdc++ packages will not do. Without $SRC/deps (a plain machine with
# scripts/setup.sh's packages, as in the oss_fuzz_build test) the system packages are used.
here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
repo="$here/.."                                                  # .clusterfuzzlite/build.sh
[ -f "$repo/fuzz/oss_fuzz_build.sh" ] || repo="$SRC/kdaguard"   # the image's copy, $SRC/build.sh
deps=${SRC:-/src}/deps
if [ -d "$deps" ]; then
  prefix="$WORK/deps"
  dep() {  # dep NAME [CMAKE OPTIONS...]
    local name=$1
    shift
    cmake -S "$deps/$name" -B "$WORK/deps-build/$name" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
      -DCMAKE_C_FLAGS="$CFLAGS" -DCMAKE_CXX_FLAGS="$CXXFLAGS" \
      -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON "$@"
    cmake --build "$WORK/deps-build/$name" -j"$(nproc)" --target install
  }
  dep fmt -DFMT_TEST=OFF -DFMT_DOC=OFF
  dep json -DJSON_BuildTests=OFF
  dep googletest -DBUILD_GMOCK=ON
  dep CLI11 -DCLI11_BUILD_TESTS=OFF -DCLI11_BUILD_EXAMPLES=OFF -DCLI11_BUILD_DOCS=OFF
  dep rapidcheck -DRC_ENABLE_GTEST=ON -DRC_ENABLE_GMOCK=ON -DRC_INSTALL_ALL_EXTRAS=ON
  export CMAKE_PREFIX_PATH="$prefix"
fi
exec "$repo/fuzz/oss_fuzz_build.sh"
