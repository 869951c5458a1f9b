// The launcher of one (K, V) shape; included by the prefill_k*_v*.cu translation units only.
#pragma once

#include <cstdint>

#include "prefill_chain.cuh"
#include "prefill_combine.cuh"
#include "prefill_launch.h"
#include "prefill_prepare.cuh"
#include "prefill_recurrent.cuh"

namespace kdaguard::gpu::detail {

// Warps per chain block (16 state rows each): 4 reads each chunk's W, Qg and Kd twice per
// (sequence, head) for V = 128 and still gives B * HV * 2 blocks.
inline constexpr int kChainWarps = 4;

// Launches a chain kernel with its shared memory.
template <class Kernel, class... Args>
cudaError_t launch_with_smem(Kernel* kernel, std::int64_t blocks, int smem, cudaStream_t stream, Args... args) {
  // Set on every launch: the attribute is per device, and the current device may change.
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess)
    return e;
  kernel<<<static_cast<unsigned>(blocks), 32 * kChainWarps, smem, stream>>>(args...);
  return cudaGetLastError();
}

// The two-kernel path for 16-bit inputs of dtype IO (__nv_bfloat16 or __half), which is also the
// dtype of every matrix operand the kernels hand each other.
template <class IO, int K, int V>
cudaError_t launch_chunked(const PrefillParams& p, GuardState guard, cudaStream_t stream,
                           std::int32_t chunks_per_span) {
  const std::int64_t heads = static_cast<std::int64_t>(p.num_seqs) * p.in.HV;

  using prefill::ChainRole;
  constexpr int kRows = 16 * kChainWarps;
  constexpr int kValueSlices = V / kRows, kTransitionSlices = (V + K) / kRows;
  constexpr int kChainSmem = static_cast<int>(sizeof(prefill::ChainShared<K, V, kChainWarps>));
  constexpr int kCombineSmem = static_cast<int>(sizeof(prefill::CombineShared<K, V, kChainWarps>));
  auto* whole = prefill::prefill_chain_kernel<IO, K, V, kChainWarps, ChainRole::whole>;
  auto* transition = prefill::prefill_chain_kernel<IO, K, V, kChainWarps, ChainRole::transition>;
  auto* span = prefill::prefill_chain_kernel<IO, K, V, kChainWarps, ChainRole::span>;
  auto* combine = prefill::prefill_combine_kernel<IO, K, V, kChainWarps>;

  if (chunks_per_span == kChooseSpan) {
    ChainSplitCosts costs;
    costs.total_tokens = p.total_tokens;
    costs.num_seqs = p.num_seqs;
    costs.HV = p.in.HV;
    costs.value_slices = kValueSlices;
    costs.transition_slices = kTransitionSlices;
    if (cudaError_t e = resident_chain_blocks(reinterpret_cast<const void*>(span), 32 * kChainWarps,
                                              kChainSmem, &costs.resident_blocks);
        e != cudaSuccess)
      return e;
    chunks_per_span = choose_chunks_per_span(costs);
  }
  const prefill::WorkspaceLayout layout =
      prefill::workspace_layout<K, V>(p.total_tokens, p.num_seqs, p.in.HV, chunks_per_span);
  // A caller's workspace holds every layout the choice can make (prefill_workspace_bytes); only a
  // forced span shorter than kMinChunksPerSpan can need more.
  if (layout.overflows || (p.workspace != nullptr && layout.bytes > static_cast<std::uint64_t>(p.workspace_bytes)))
    return cudaErrorInvalidValue;
  const std::int64_t prepare_blocks = layout.chunk_slots * p.in.HV;
  const std::int64_t span_units = layout.span_slots * p.in.HV;
  if (prepare_blocks > INT32_MAX || span_units * kTransitionSlices > INT32_MAX ||
      heads * kValueSlices > INT32_MAX)
    return cudaErrorInvalidConfiguration;

  void* workspace = nullptr;
  if (cudaError_t e = prefill_workspace_take(p, layout.bytes, stream, &workspace); e != cudaSuccess)
    return e;
  auto* chunk_ops = static_cast<unsigned char*>(workspace);
  const prefill::ChainSplit split{chunks_per_span, chunk_ops + layout.span_offset};

  auto* prepare = prefill::prefill_prepare_kernel<IO, K, V>;
  prepare<<<static_cast<unsigned>(prepare_blocks), prefill::kPrepareThreads, 0, stream>>>(p, guard, chunk_ops);
  cudaError_t launched = cudaGetLastError();
  const unsigned char* ops = chunk_ops;
  if (launched == cudaSuccess && chunks_per_span == 0) {
    launched = launch_with_smem(whole, heads * kValueSlices, kChainSmem, stream, p, guard, ops, split);
  } else if (launched == cudaSuccess) {
    launched = launch_with_smem(transition, span_units * kTransitionSlices, kChainSmem, stream, p, guard, ops, split);
    if (launched == cudaSuccess)
      launched = launch_with_smem(combine, heads * kValueSlices, kCombineSmem, stream, p, guard, split);
    if (launched == cudaSuccess)
      launched = launch_with_smem(span, span_units * kValueSlices, kChainSmem, stream, p, guard, ops, split);
  }
  // Stream-ordered: pool memory returns to the pool once the last kernel has finished.
  const cudaError_t freed = prefill_workspace_give_back(p, workspace, stream);
  return launched != cudaSuccess ? launched : freed;
}

template <int K, int V>
cudaError_t launch_prefill_shape(const PrefillParams& p, GuardState guard, cudaStream_t stream,
                                 std::int32_t chunks_per_span) {
  const std::int64_t heads = static_cast<std::int64_t>(p.num_seqs) * p.in.HV;
  if (heads == 0) return cudaSuccess;
  if (p.in.io_dtype == DType::f32) {
    const std::int64_t blocks = heads * (V / prefill::kRecurrentRows);
    if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
    prefill::prefill_recurrent_kernel<K, V>
        <<<static_cast<unsigned>(blocks), prefill::kRecurrentThreads, 0, stream>>>(p, guard);
    return cudaGetLastError();
  }
  return p.in.io_dtype == DType::bf16 ? launch_chunked<__nv_bfloat16, K, V>(p, guard, stream, chunks_per_span)
                                      : launch_chunked<__half, K, V>(p, guard, stream, chunks_per_span);
}

}  // namespace kdaguard::gpu::detail
