// The launcher of one (K, V) shape; included by the prefill_k*_v*.cu translation units only.
#pragma once

#include <cstdint>

#include "prefill_chain.cuh"
#include "prefill_launch.h"
#include "prefill_prepare.cuh"
#include "prefill_recurrent.cuh"

namespace kdaguard::gpu::detail {

// Warps per chain block (16 state rows each): 4 reads each chunk's W, Qg and Kd twice per
// (sequence, head) for V = 128 and still gives B * HV * 2 blocks.
inline constexpr int kChainWarps = 4;

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

  const std::int64_t prepare_blocks = prefill::workspace_slots(p.total_tokens, p.num_seqs) * p.in.HV;
  constexpr int kSlices = V / (16 * kChainWarps);
  const std::int64_t chain_blocks = heads * kSlices;
  if (prepare_blocks > INT32_MAX || chain_blocks > INT32_MAX) return cudaErrorInvalidConfiguration;

  void* workspace = nullptr;  // prefill_workspace_bytes(p): prepare_blocks chunk operands
  if (cudaError_t e = prefill_workspace_take(p, stream, &workspace); e != cudaSuccess) return e;

  auto* prepare = p.in.io_dtype == DType::bf16 ? prefill::prefill_prepare_kernel<__nv_bfloat16, K, V>
                                               : prefill::prefill_prepare_kernel<__half, K, V>;
  prepare<<<static_cast<unsigned>(prepare_blocks), prefill::kPrepareThreads, 0, stream>>>(
      p, guard, static_cast<unsigned char*>(workspace));
  cudaError_t launched = cudaGetLastError();
  if (launched == cudaSuccess) {
    constexpr int kSmem = static_cast<int>(sizeof(prefill::ChainShared<K, V, kChainWarps>));
    auto* chain = prefill::prefill_chain_kernel<K, V, kChainWarps>;
    // Set on every launch: the attribute is per device, and the current device may change.
    launched = cudaFuncSetAttribute(chain, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (launched == cudaSuccess) {
      chain<<<static_cast<unsigned>(chain_blocks), 32 * kChainWarps, kSmem, stream>>>(
          p, guard, static_cast<const unsigned char*>(workspace));
      launched = cudaGetLastError();
    }
  }
  // Stream-ordered: pool memory returns to the pool once the chain kernel has finished.
  const cudaError_t freed = prefill_workspace_give_back(p, workspace, stream);
  return launched != cudaSuccess ? launched : freed;
}

}  // namespace kdaguard::gpu::detail
