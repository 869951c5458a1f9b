// Turns the run-time choices of a lowered call (q/k/v dtype, state dtype, K) into the
// compile-time parameters of a kernel template. Every combination the contracts accept has
// an instantiation; V, strides, gate and beta forms stay run-time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "kdaguard/contracts/tensor_view.h"

namespace kdaguard::gpu::detail {

// Calls f.template operator()<IO, ST, K>() for the matching instantiation.
template <class F> cudaError_t dispatch_tile(DType io, DType state, int K, F&& f) {
  auto with_k = [&]<class IO, class ST>() -> cudaError_t {
    return K == 64 ? f.template operator()<IO, ST, 64>() : f.template operator()<IO, ST, 128>();
  };
  auto with_state = [&]<class IO>() -> cudaError_t {
    return state == DType::bf16 ? with_k.template operator()<IO, __nv_bfloat16>()
                                : with_k.template operator()<IO, float>();
  };
  switch (io) {
    case DType::f16: return with_state.template operator()<__half>();
    case DType::bf16: return with_state.template operator()<__nv_bfloat16>();
    default: return with_state.template operator()<float>();
  }
}

}  // namespace kdaguard::gpu::detail
