// The probes' one error check: print the failed call and its CUDA error, and leave main with 1.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#define CK(x)                                                    \
  do {                                                           \
    cudaError_t e = (x);                                         \
    if (e != cudaSuccess) {                                      \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));        \
      return 1;                                                  \
    }                                                            \
  } while (0)
