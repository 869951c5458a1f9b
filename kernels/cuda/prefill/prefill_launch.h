// Host-side launcher of the prefill kernels, called by the prefill entry point once a call is
// validated and lowered. Internal to kdaguard::kernels: not installed.
//
// bf16 and f16 inputs run the chunked prefill on the tensor cores in two kernels: the
// chunk-parallel prepare kernel (prefill_prepare.cuh) writes every chunk's state-independent
// operands to a workspace, the chain kernel (prefill_chain.cuh) walks each sequence's chunks with
// the state in registers. f32 inputs run the per-token f32 kernel (prefill_recurrent.cuh). All
// read the initial state from slot state_indices[n], write the final state back in place, never
// write q, k, v, gates or beta, and skip (and report through guard.error_word) any sequence whose
// offsets or slot break a value rule, or that guard.row_flags marks.
//
// When sequences x value heads cannot keep the SMs busy, each sequence's chain is split into
// spans of chunks (prefill_chain.cuh, ChainRole): the span length is chosen per call from the
// shape and the device (choose_chunks_per_span), never from an earlier call.
//
// The workspace (about 21 KB per chunk of 16 tokens and value head at K = V = 128, i.e. about
// 1.3 KB per token-head, the size of q, k, v, g and out together, plus the split's span operands)
// is the caller's when
// PrefillParams::workspace is set (the engine's allocator then owns and accounts for it, and a
// captured graph keeps it in the graph's pool). Otherwise it is taken per call, stream ordered,
// from a memory pool of the library's own per device, and given back on the same stream after
// the chain kernel: nothing of one call's shape outlives it. That pool keeps the memory it has
// handed out for reuse (release threshold: unlimited), so repeated calls map nothing new.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kdaguard/params.h"
#include "launch.h"  // GuardState (common/)

namespace kdaguard::gpu::detail {

// Empty when the kernels can run p, else why not (a valid call always can: K and V in {64, 128},
// 16-bit or f32 inputs, f32 or bf16 state).
std::string prefill_unsupported_reason(const PrefillParams& p);

// chunks_per_span for launch_prefill: let the call's shape choose (the entry point's choice).
inline constexpr std::int32_t kChooseSpan = -1;

// Returns the launch's cudaError_t (cudaSuccess when there was nothing to do, or
// cudaErrorInvalidValue for params prefill_unsupported_reason refuses, or the workspace
// allocation's error); never synchronises. The split is the call's shape's choice.
cudaError_t launch_prefill(const PrefillParams& p, GuardState guard, cudaStream_t stream);

// The same with the split forced: chunks_per_span 0 (no split) or the span length in chunks
// (the tests run both paths with it), or kChooseSpan.
cudaError_t launch_prefill_with_span(const PrefillParams& p, GuardState guard, cudaStream_t stream,
                                     std::int32_t chunks_per_span);

// What the split choice looks at: the call's shape and how many chain blocks the GPU holds.
struct ChainSplitCosts {
  std::int64_t total_tokens = 0;
  std::int32_t num_seqs = 0, HV = 0;
  int value_slices = 0;       // chain blocks per (sequence, value head)
  int transition_slices = 0;  // transition blocks per (span, value head)
  std::int64_t resident_blocks = 0;  // chain blocks that each have an SM to themselves
};

// The shortest span the split chain takes (chunks): a workspace sized for it holds the layout of
// every span the call may choose (prefill_workspace_bytes), about 14% more than the unsplit
// chain's at K = V = 128. No span below 32 chunks was the fastest of any shape in the span sweep
// (bench/NOTES_prefill.md).
inline constexpr std::int32_t kMinChunksPerSpan = 32;

// The span length (chunks) that minimises the modelled chain time, or 0 when not splitting is
// as fast; never a span below kMinChunksPerSpan. Pure function of its argument.
std::int32_t choose_chunks_per_span(const ChainSplitCosts& c);

// Chain blocks the current device runs each on an SM of its own: the SM count (0 if `kernel`
// cannot be resident at all).
cudaError_t resident_chain_blocks(const void* kernel, int threads, int smem, std::int64_t* blocks);

// The prefill guard (prefill_guard.cu): seqlens.start/monotone/total, index.range/padding/unique
// per sequence on the device, the rules in `enabled` only; row_flags[n] != 0 makes the kernels
// skip sequence n.
cudaError_t launch_prefill_guard(const PrefillParams& p, std::uint64_t enabled,
                                 unsigned long long* error_word, std::int32_t* row_flags,
                                 cudaStream_t stream);

// Bytes of workspace the tensor-core kernels need for p (0 for f32 inputs or an empty call; -1
// when the size overflows int64): the layout of the shortest span the split may choose
// (kMinChunksPerSpan), which holds the layout of every choice, unsplit included. What
// the size query of kda.h reports.
std::int64_t prefill_workspace_bytes(const PrefillParams& p);

// The workspace of one call: p.workspace when the caller gave one, else a stream-ordered
// allocation of `bytes` from the library's pool, which give_back frees on the
// stream (a no-op for the caller's).
cudaError_t prefill_workspace_take(const PrefillParams& p, std::size_t bytes, cudaStream_t stream,
                                   void** workspace);
cudaError_t prefill_workspace_give_back(const PrefillParams& p, void* workspace,
                                        cudaStream_t stream);

// The library's workspace pool on the current device, created on first use.
cudaError_t prefill_workspace_pool(cudaMemPool_t* pool);

// The kernels of one (K, V) shape; one translation unit instantiates each.
template <int K, int V>
cudaError_t launch_prefill_shape(const PrefillParams& p, GuardState guard, cudaStream_t stream,
                                 std::int32_t chunks_per_span);

}  // namespace kdaguard::gpu::detail
