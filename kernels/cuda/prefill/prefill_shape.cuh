// The launcher of one (K, V) shape; included by the prefill_k*_v*.cu translation units only.
#pragma once

#include <algorithm>
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

// Launches a chain or combine kernel with its shared memory; after_prepare: right behind the
// prepare kernel, allowed to start while it runs (programmatic stream serialization; the chain
// kernels then wait for each chunk's ready flag).
template <class Kernel, class... Args>
cudaError_t launch_with_smem(Kernel* kernel, std::int64_t blocks, int smem, cudaStream_t stream,
                             bool after_prepare, Args... args) {
  // Set on every launch: the attribute is per device, and the current device may change.
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess)
    return e;
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(32 * kChainWarps);
  config.dynamicSmemBytes = static_cast<std::size_t>(smem);
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = after_prepare ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// The two-kernel path for 16-bit inputs of dtype IO (__nv_bfloat16 or __half), which is also the
// dtype of every matrix operand the kernels hand each other. The prepare kernel runs as a
// persistent grid that leaves each SM room for a chain block, and the chain kernel (whole, or the
// split's transition) starts while it runs, reading each chunk once the prepare kernel has flagged
// it ready: the chain walks behind the prepare kernel's front instead of after its end.
template <class IO, int K, int V>
cudaError_t launch_chunked(const PrefillParams& p, GuardState guard, cudaStream_t stream,
                           std::int32_t chunks_per_span) {
  const std::int64_t heads = static_cast<std::int64_t>(p.num_seqs) * p.in.HV;

  using prefill::ChainRole;
  constexpr int kRows = 16 * kChainWarps;
  constexpr int kValueSlices = V / kRows, kTransitionSlices = (V + K) / kRows;
  constexpr int kChainSmem = static_cast<int>(sizeof(prefill::ChainShared<K, V, kChainWarps>));
  constexpr int kCombineSmem = static_cast<int>(sizeof(prefill::CombineShared<K, V, kChainWarps>));
  auto* prepare = prefill::prefill_prepare_kernel<IO, K, V>;
  auto* whole = prefill::prefill_chain_kernel<IO, K, V, kChainWarps, ChainRole::whole>;
  auto* transition = prefill::prefill_chain_kernel<IO, K, V, kChainWarps, ChainRole::transition>;
  auto* span = prefill::prefill_chain_kernel<IO, K, V, kChainWarps, ChainRole::span>;
  auto* combine = prefill::prefill_combine_kernel<IO, K, V, kChainWarps>;

  // The transition and span kernels share the whole kernel's shared memory and block shape.
  ChainGrids grids;
  if (cudaError_t e = chain_grids(reinterpret_cast<const void*>(prepare), prefill::kPrepareThreads,
                                  reinterpret_cast<const void*>(whole), 32 * kChainWarps, kChainSmem, &grids);
      e != cudaSuccess)
    return e;
  if (chunks_per_span == kChooseSpan) {
    ChainSplitCosts costs;
    costs.total_tokens = p.total_tokens;
    costs.num_seqs = p.num_seqs;
    costs.HV = p.in.HV;
    costs.value_slices = kValueSlices;
    costs.transition_slices = kTransitionSlices;
    costs.resident_blocks = grids.resident_chain_blocks;
    chunks_per_span = choose_chunks_per_span(costs);
  }
  const prefill::WorkspaceLayout layout =
      prefill::workspace_layout<K, V>(p.total_tokens, p.num_seqs, p.in.HV, chunks_per_span);
  // A caller's workspace holds every layout the choice can make (prefill_workspace_bytes); only a
  // forced span shorter than kMinChunksPerSpan can need more.
  if (layout.overflows || (p.workspace != nullptr && layout.bytes > static_cast<std::uint64_t>(p.workspace_bytes)))
    return cudaErrorInvalidValue;
  const prefill::PrepareOrder order{
      (chunks_per_span == 0 ? layout.chunk_slots : layout.span_slots * chunks_per_span) * p.in.HV,
      chunks_per_span, layout.span_slots};
  const std::int64_t span_units = layout.span_slots * p.in.HV;
  if (span_units * kTransitionSlices > INT32_MAX || heads * kValueSlices > INT32_MAX)
    return cudaErrorInvalidConfiguration;
  const std::int64_t prepare_blocks = std::min(grids.prepare_blocks, order.items);

  void* workspace = nullptr;
  if (cudaError_t e = prefill_workspace_take(p, layout.bytes, stream, &workspace); e != cudaSuccess)
    return e;
  auto* chunk_ops = static_cast<unsigned char*>(workspace);
  auto* ready = reinterpret_cast<std::uint32_t*>(chunk_ops + layout.ready_offset);
  const prefill::ChainSplit split{chunks_per_span, chunk_ops + layout.span_offset};

  cudaError_t launched = cudaMemsetAsync(ready, 0, layout.chunk_slots * p.in.HV * sizeof(std::uint32_t), stream);
  if (launched == cudaSuccess) {
    prepare<<<static_cast<unsigned>(prepare_blocks), prefill::kPrepareThreads, 0, stream>>>(p, guard, chunk_ops,
                                                                                            ready, order);
    launched = cudaGetLastError();
  }
  const unsigned char* ops = chunk_ops;
  const std::uint32_t* flags = ready;
  const std::uint32_t* complete = nullptr;  // the span kernel runs after the prepare grid has finished
  if (launched == cudaSuccess && chunks_per_span == 0) {
    launched = launch_with_smem(whole, heads * kValueSlices, kChainSmem, stream, true, p, guard, ops, flags, split);
  } else if (launched == cudaSuccess) {
    launched = launch_with_smem(transition, span_units * kTransitionSlices, kChainSmem, stream, true, p, guard,
                                ops, flags, split);
    if (launched == cudaSuccess)
      launched = launch_with_smem(combine, heads * kValueSlices, kCombineSmem, stream, false, p, guard, split);
    if (launched == cudaSuccess)
      launched = launch_with_smem(span, span_units * kValueSlices, kChainSmem, stream, false, p, guard, ops,
                                  complete, split);
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
