// Turns the run-time choices of a lowered call (q/k/v dtype, state dtype, K) into the
// compile-time parameters of a kernel template: one instantiation per configuration of
// contracts/supported.h, and cudaErrorInvalidValue for anything else (never a fall-through to
// another instantiation). V, strides, gate and beta forms stay run-time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "kdaguard/contracts/supported.h"
#include "kdaguard/contracts/tensor_view.h"

namespace kdaguard::gpu::detail {

// The element type of each supported dtype; a dtype outside the sets has none.
template <DType> struct ElementOf;
template <> struct ElementOf<DType::f32> { using type = float; };
template <> struct ElementOf<DType::f16> { using type = __half; };
template <> struct ElementOf<DType::bf16> { using type = __nv_bfloat16; };

// Calls f.template operator()<T>() with T the element type of set[I] == dtype (the first match
// at or after I); cudaErrorInvalidValue when dtype is not in the set.
template <const auto& kSet, std::size_t I = 0, class F>
cudaError_t with_element(DType dtype, F&& f) {
  if constexpr (I == kSet.size()) {
    return cudaErrorInvalidValue;
  } else {
    if (dtype == kSet[I]) return f.template operator()<typename ElementOf<kSet[I]>::type>();
    return with_element<kSet, I + 1>(dtype, f);
  }
}

// Calls f.template operator()<IO, ST, K>() for K = supported::kHeadDims[I] == K (the first match
// at or after I); cudaErrorInvalidValue for any other K.
template <class IO, class ST, std::size_t I = 0, class F>
cudaError_t with_head_dim(int K, F&& f) {
  if constexpr (I == supported::kHeadDims.size()) {
    return cudaErrorInvalidValue;
  } else {
    if (K == supported::kHeadDims[I])
      return f.template operator()<IO, ST, supported::kHeadDims[I]>();
    return with_head_dim<IO, ST, I + 1>(K, f);
  }
}

// Calls f.template operator()<IO, ST, K>() for the matching instantiation.
template <class F> cudaError_t dispatch_tile(DType io, DType state, int K, F&& f) {
  return with_element<supported::kIoDTypes>(io, [&]<class IO>() -> cudaError_t {
    return with_element<supported::kStateDTypes>(state, [&]<class ST>() -> cudaError_t {
      return with_head_dim<IO, ST>(K, f);
    });
  });
}

}  // namespace kdaguard::gpu::detail
