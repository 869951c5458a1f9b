// The launcher of one (K, V) shape; included by the prefill_k*_v*.cu translation units only.
#pragma once

#include <cstdint>

#include "prefill_chunked.cuh"
#include "prefill_launch.h"
#include "prefill_recurrent.cuh"

namespace kdaguard::gpu::detail {

template <int K, int V>
cudaError_t launch_prefill_shape(const PrefillParams& p, GuardState guard, cudaStream_t stream) {
  const std::int64_t heads = static_cast<std::int64_t>(p.num_seqs) * p.in.HV;
  if (heads == 0) return cudaSuccess;
  if (p.in.io_dtype == DType::f32) {
    const std::int64_t blocks = heads * (V / prefill::kRecurrentRows);
    if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
    prefill::prefill_recurrent_kernel<K, V>
        <<<static_cast<unsigned>(blocks), prefill::kRecurrentThreads, 0, stream>>>(p, guard);
    return cudaGetLastError();
  }
  if (heads > INT32_MAX) return cudaErrorInvalidConfiguration;
  constexpr int kSmem = static_cast<int>(sizeof(prefill::ChunkShared<K, V>));
  auto* kernel = p.in.io_dtype == DType::bf16 ? prefill::prefill_chunked_kernel<__nv_bfloat16, K, V>
                                              : prefill::prefill_chunked_kernel<__half, K, V>;
  // Set on every launch: the attribute is per device, and the current device may change.
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  kernel<<<static_cast<unsigned>(heads), prefill::kChunkThreads, kSmem, stream>>>(p, guard);
  return cudaGetLastError();
}

}  // namespace kdaguard::gpu::detail
