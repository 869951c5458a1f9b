// The device guard: one kernel template for every entry point, for calls whose index tensors
// carried no host copy. One block per row: it judges its row with the entry point's row function
// (row_rules.h, the host validators' code), scans the slot map and the explicit scratch indices
// for another entry naming one of its slots (index.unique, over value_checks::unique_candidate),
// writes row_flags[n] (non-zero = the main kernel skips the row) and ORs the rules that fired into
// the error word. A call without rows gets one block that judges its single offset
// (row_rules::call_faults). It runs on the caller's stream right before the main kernel.
#pragma once

#include <algorithm>
#include <climits>

#include "device_common.cuh"
#include "kdaguard/contracts/row_rules.h"
#include "row_checks.cuh"

namespace kdaguard::gpu::detail {

inline constexpr int kGuardThreads = 128;

// What the guard reads besides the entry point's rows: the maps index.unique scans.
template <class Rows> struct GuardInputs {
  Rows rows;
  DeviceIndex slots;              // the slot map of the rows
  std::int64_t num_slots = 0;
  DeviceIndex scratch_indices;    // [N, T] or absent
  std::int64_t draft_tokens = 0;
  std::int64_t scratch_slots = 0;
  std::uint64_t enabled = ~std::uint64_t{0};  // rules in force (kdaguard::enabled_rules())
};

// Whether an entry of slots[0, count) other than `self` holds `slot`; block-wide, uniform.
__device__ __forceinline__ bool slot_shared(const DeviceIndex& slots, std::int64_t count,
                                            std::int64_t self, std::int64_t slot) {
  bool found = false;
  for (std::int64_t m = threadIdx.x; m < count; m += kGuardThreads)
    found |= m != self && slots[m] == slot;
  return __syncthreads_or(found) != 0;
}

template <class Rows>
__device__ std::uint64_t unique_faults(const GuardInputs<Rows>& in, std::int64_t n) {
  std::uint64_t faults = 0;
  const std::int64_t rows = in.rows.rows;
  const std::int64_t slot = in.slots[n];
  // Uniform branches: every thread of the block sees the same row.
  if (vc::unique_candidate(slot, in.num_slots) && slot_shared(in.slots, rows, n, slot))
    faults |= bit(RuleId::index_unique);
  if (in.scratch_indices.known()) {
    const std::int64_t T = in.draft_tokens, entries = rows * T;
    bool found = false;
    for (std::int64_t m = threadIdx.x; m < entries; m += kGuardThreads) {
      const std::int64_t other = in.scratch_indices.at(m / T, m % T);
      if (!vc::unique_candidate(other, in.scratch_slots)) continue;
      for (std::int64_t t = 0; t < T; ++t)
        found |= m != n * T + t && in.scratch_indices.at(n, t) == other;
    }
    if (__syncthreads_or(found)) faults |= bit(RuleId::index_unique);
  }
  return faults;
}

template <class Rows>
__global__ void __launch_bounds__(kGuardThreads)
    guard_kernel(const GuardInputs<Rows> in, unsigned long long* error_word,
                 std::int32_t* row_flags) {
  if (in.rows.rows == 0) {
    if (threadIdx.x == 0) raise(error_word, rr::call_faults(in.rows) & in.enabled);
    return;
  }
  const std::int64_t n = blockIdx.x;
  const std::uint64_t faults = (rr::row_faults(in.rows, n) | unique_faults(in, n)) & in.enabled;
  if (threadIdx.x == 0) {
    row_flags[n] = faults != 0 ? 1 : 0;
    raise(error_word, faults);
  }
}

template <class Rows>
cudaError_t launch_guard(const GuardInputs<Rows>& in, unsigned long long* error_word,
                         std::int32_t* row_flags, cudaStream_t stream) {
  if (in.rows.rows > INT_MAX) return cudaErrorInvalidConfiguration;
  const unsigned blocks = static_cast<unsigned>(std::max<std::int64_t>(in.rows.rows, 1));
  guard_kernel<Rows><<<blocks, kGuardThreads, 0, stream>>>(in, error_word, row_flags);
  return cudaGetLastError();
}

}  // namespace kdaguard::gpu::detail
