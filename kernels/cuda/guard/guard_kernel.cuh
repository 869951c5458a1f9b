// The device guard kernel: for verify and prefill, whose kernels read one verdict per row, and for
// decode and commit calls without rows, whose single cu_seqlens offset no row's prologue sees. One block
// per row judges it with the entry point's row function and index.unique (row_checks.cuh's
// value_faults, the prologue's own code), writes row_flags[n] (non-zero = the main kernels skip
// the row) and ORs the rules that fired into the error word. A call without rows gets one block
// that judges its single offset (row_rules::call_faults). It runs on the caller's stream right
// before the main kernels.
#pragma once

#include <algorithm>
#include <climits>

#include "device_common.cuh"
#include "row_checks.cuh"

namespace kdaguard::gpu::detail {

inline constexpr int kGuardThreads = 128;

template <class Rows>
__global__ void __launch_bounds__(kGuardThreads)
    guard_kernel(const Rows rows, const std::uint64_t enabled, unsigned long long* error_word,
                 std::int32_t* row_flags) {
  if (rows.rows == 0) {
    if (threadIdx.x == 0) raise(error_word, rr::call_faults(rows) & enabled);
    return;
  }
  const std::int64_t n = blockIdx.x;
  const std::uint64_t faults = value_faults<BlockGroup>(rows, n) & enabled;
  if (threadIdx.x == 0) {
    if (row_flags != nullptr) row_flags[n] = faults != 0 ? 1 : 0;
    raise(error_word, faults);
  }
}

// row_flags may be null for a call without rows.
template <class Rows>
cudaError_t launch_guard(const Rows& rows, std::uint64_t enabled, unsigned long long* error_word,
                         std::int32_t* row_flags, cudaStream_t stream) {
  if (rows.rows > INT_MAX) return cudaErrorInvalidConfiguration;
  const unsigned blocks = static_cast<unsigned>(std::max<std::int64_t>(rows.rows, 1));
  guard_kernel<Rows><<<blocks, kGuardThreads, 0, stream>>>(rows, enabled, error_word, row_flags);
  return cudaGetLastError();
}

}  // namespace kdaguard::gpu::detail
