// Host-side launchers of the CUDA kernels, called by the entry points in api.cpp once a call is
// validated and lowered. Internal to kdaguard::kernels: not installed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kdaguard/params.h"

namespace kdaguard::gpu::detail {

// What the kernels need of the device guard. Both pointers may be null: error_word null means
// faults found on the device are not reported (the faulty rows are still skipped); row_flags
// null means the guard kernel did not run (the host checked every value rule).
struct GuardState {
  unsigned long long* error_word = nullptr;
  const std::int32_t* row_flags = nullptr;  // [rows]; non-zero = skip the row
};

// Index tensors the params structs leave out because lowering proved them on the host; the
// guard kernel re-checks them on the device when their values were not on the host.
struct GuardExtras {
  const std::int32_t* cu_seqlens = nullptr;       // decode (optional), commit (optional)
  const std::int32_t* scratch_row_map = nullptr;  // verify, commit (used without scratch_indices)
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

// Guard kernels: evaluate every value rule of the entry point on the device, write row_flags
// (one int32 per row) and OR the fired rules' bits into error_word.
cudaError_t launch_decode_guard(const DecodeParams& p, const GuardExtras& extras,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream);
cudaError_t launch_verify_guard(const VerifyParams& p, const GuardExtras& extras,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream);
cudaError_t launch_commit_guard(const CommitParams& p, const GuardExtras& extras,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream);

}  // namespace kdaguard::gpu::detail
