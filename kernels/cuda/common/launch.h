// Host-side launchers of the CUDA kernels, called by the entry points in api.cpp once a call is
// validated and lowered. Internal to kdaguard::kernels: not installed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kdaguard/params.h"

namespace kdaguard::gpu::detail {

// What the kernels need of the device guard. error_word null means faults found on the device
// are not reported (the faulty rows are still skipped).
//
// Every kernel judges the memory-safety subset of the rules (row_rules::k*MemoryRules) on its
// rows before their first access. When value rules were deferred to the device, decode and commit
// judge every value rule of the entry point in the same prologue, index.unique included, with
// row_rules.h's row function (judge_values); verify and prefill read the verdicts of a guard
// kernel that ran first instead (row_flags).
struct GuardState {
  unsigned long long* error_word = nullptr;
  const std::int32_t* row_flags = nullptr;  // verify, prefill: [rows], non-zero = skip; null: none
  bool judge_values = false;                // decode, commit: every value rule, in the prologue
  std::uint64_t enabled = ~std::uint64_t{0};  // rules in force (enabled_device_rules())
};

// Verify: chunks of state rows each block walks (RowTile::kChunkRows rows each; the loads of the
// next chunk overlap the current one). More chunks per block amortise the block's token prologue
// and keep loads in flight longer; fewer give small batches more blocks. `requested` > 0 forces it.
int pick_chunks_per_block(std::int64_t rows, std::int32_t heads, std::int32_t chunks_per_head,
                          int requested);

// Decode: chunks_per_block 0 sizes the grid so each warp walks about 8 chunks, or launches the
// resident grid with equal shares when the batch has fewer; > 0 sizes the grid so each warp walks
// about that many.
//
// Every launcher returns the launch's cudaError_t (cudaSuccess when there was nothing to do)
// and never synchronises.
cudaError_t launch_decode(const DecodeParams& p, GuardState guard, int chunks_per_block,
                          cudaStream_t stream);
cudaError_t launch_verify(const VerifyParams& p, GuardState guard, int chunks_per_block,
                          cudaStream_t stream);
cudaError_t launch_commit(const CommitParams& p, GuardState guard, cudaStream_t stream);

// The record-based path (records/): every kernel judges its rows in its prologue, every value
// rule when values were deferred (judge_values); a call without rows launches only the guard
// kernel for its single offset, and only when values were deferred.
cudaError_t launch_record_verify(const RecordVerifyParams& p, GuardState guard,
                                 int chunks_per_block, cudaStream_t stream);
cudaError_t launch_replay_commit(const ReplayCommitParams& p, GuardState guard,
                                 int chunks_per_block, cudaStream_t stream);
cudaError_t launch_accept_verify(const AcceptVerifyParams& p, GuardState guard,
                                 int chunks_per_block, cudaStream_t stream);

// The guard kernel of a decode or commit call without rows: judges its single cu_seqlens offset
// (row_rules::call_faults), which no row's prologue sees.
cudaError_t launch_empty_call_guard(const DecodeParams& p, GuardState guard, cudaStream_t stream);
cudaError_t launch_empty_call_guard(const CommitParams& p, GuardState guard, cudaStream_t stream);

// The guard kernel of verify: every value rule of every row (one block each) into row_flags (one
// int32 per row, non-zero = the verify kernel skips the row) and the error word; the rules in
// `enabled` only.
cudaError_t launch_verify_guard(const VerifyParams& p, std::uint64_t enabled,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream);

}  // namespace kdaguard::gpu::detail
