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

// Rows of state each thread carries (1 or 2): more rows keep more loads in flight per thread,
// fewer give small batches more blocks. 0 picks from the grid size.
int pick_rows_per_thread(std::int64_t rows, std::int32_t heads, std::int32_t K, std::int32_t V,
                         int requested);

// Every launcher returns the launch's cudaError_t (cudaSuccess when there was nothing to do)
// and never synchronises.
cudaError_t launch_decode(const DecodeParams& p, GuardState guard, int rows_per_thread,
                          cudaStream_t stream);
cudaError_t launch_verify(const VerifyParams& p, GuardState guard, int rows_per_thread,
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
