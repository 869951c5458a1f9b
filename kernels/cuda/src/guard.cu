// The device guard: every value rule of an entry point evaluated on the device, for calls whose
// index tensors carried no host copy. One block per row: it judges its row alone (row_checks.cuh)
// and scans the other rows for a slot its row also names (index.unique), writes row_flags[n]
// (non-zero = the main kernel skips the row) and ORs the rules that fired into the error word.
// It runs on the caller's stream right before the main kernel; nothing waits on the host.
#include <climits>

#include "device_common.cuh"
#include "launch.h"
#include "row_checks.cuh"

namespace kdaguard::gpu::detail {
namespace {

constexpr int kGuardThreads = 128;

// Whether some entry of `slots[0, count)` other than `self` holds `slot` (an active, in-range slot).
__device__ bool shared_by_another(const std::int32_t* slots, std::int64_t count, std::int64_t self,
                                  std::int64_t slot) {
  bool found = false;
  for (std::int64_t m = threadIdx.x; m < count; m += kGuardThreads)
    found |= m != self && slots[m] == slot;
  return __syncthreads_or(found) != 0;
}

// Scratch indices of row n (explicit [N, T] map) that another entry of the map also names.
__device__ bool scratch_shared(const ScratchTarget& t, std::int32_t rows, std::int32_t draft_tokens,
                               std::int32_t n) {
  bool found = false;
  const std::int64_t entries = static_cast<std::int64_t>(rows) * draft_tokens;
  for (std::int64_t m = threadIdx.x; m < entries; m += kGuardThreads) {
    const std::int32_t other_row = static_cast<std::int32_t>(m / draft_tokens);
    const std::int32_t other_step = static_cast<std::int32_t>(m % draft_tokens);
    const std::int64_t other = t.scratch_indices[other_row * t.indices_row_stride + other_step];
    // Out-of-range entries are index.range's to report, not duplicates.
    if (!vc::slot_in_range(other, t.scratch.num_slots, false)) continue;
    for (std::int32_t step = 0; step < draft_tokens; ++step)
      found |= !(other_row == n && other_step == step) && scratch_slot(t, n, step) == other;
  }
  return __syncthreads_or(found) != 0;
}

__device__ void finish_row(std::uint64_t faults, std::int32_t n, unsigned long long* error_word,
                           std::int32_t* row_flags) {
  if (threadIdx.x == 0) {
    row_flags[n] = faults != 0 ? 1 : 0;
    raise(error_word, faults);
  }
}

__device__ std::uint64_t unique_slot_faults(const std::int32_t* cache_indices, std::int32_t rows,
                                            std::int32_t n, std::int64_t num_slots) {
  const std::int64_t slot = cache_indices[n];
  const bool check = vc::is_active(slot) && vc::slot_in_range(slot, num_slots, false);
  // Uniform branch: every thread of the block sees the same row.
  return check && shared_by_another(cache_indices, rows, n, slot) ? bit(RuleId::index_unique) : 0;
}

__global__ void __launch_bounds__(kGuardThreads)
    decode_guard_kernel(const DecodeParams p, const GuardExtras extras,
                        unsigned long long* error_word, std::int32_t* row_flags) {
  const std::int32_t n = blockIdx.x;
  std::uint64_t faults = slot_faults(p.cache_indices[n], p.state.num_slots);
  if (extras.cu_seqlens != nullptr &&
      (extras.cu_seqlens[n] != n || extras.cu_seqlens[n + 1] != n + 1))
    faults |= bit(RuleId::decode_one_token);
  faults |= unique_slot_faults(p.cache_indices, p.batch, n, p.state.num_slots);
  finish_row(faults, n, error_word, row_flags);
}

__device__ std::uint64_t scratch_unique_faults(const ScratchTarget& t, std::int32_t rows,
                                               std::int32_t draft_tokens, std::int32_t n) {
  if (t.scratch_indices == nullptr) return 0;
  return scratch_shared(t, rows, draft_tokens, n) ? bit(RuleId::index_unique) : 0;
}

__global__ void __launch_bounds__(kGuardThreads)
    verify_guard_kernel(const VerifyParams p, const GuardExtras extras,
                        unsigned long long* error_word, std::int32_t* row_flags) {
  const std::int32_t n = blockIdx.x;
  std::uint64_t faults =
      row_span(p.cu_seqlens, p.rows, n, p.total_tokens, p.draft_tokens).faults |
      slot_faults(p.cache_indices[n], p.state.num_slots) |
      scratch_faults(p.target, extras, n, p.draft_tokens);
  faults |= unique_slot_faults(p.cache_indices, p.rows, n, p.state.num_slots);
  faults |= scratch_unique_faults(p.target, p.rows, p.draft_tokens, n);
  finish_row(faults, n, error_word, row_flags);
}

__global__ void __launch_bounds__(kGuardThreads)
    commit_guard_kernel(const CommitParams p, const GuardExtras extras,
                        unsigned long long* error_word, std::int32_t* row_flags) {
  const std::int32_t n = blockIdx.x;
  std::uint64_t faults = commit_row_faults(p, extras, n) |
                         scratch_faults(p.source, extras, n, p.draft_tokens);
  faults |= unique_slot_faults(p.cache_indices, p.rows, n, p.state.num_slots);
  faults |= scratch_unique_faults(p.source, p.rows, p.draft_tokens, n);
  finish_row(faults, n, error_word, row_flags);
}

template <class Kernel, class Params>
cudaError_t launch_rows(Kernel kernel, std::int64_t rows, const Params& p, const GuardExtras& extras,
                        unsigned long long* error_word, std::int32_t* row_flags,
                        cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > INT_MAX) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(rows), kGuardThreads, 0, stream>>>(p, extras, error_word,
                                                                     row_flags);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_decode_guard(const DecodeParams& p, const GuardExtras& extras,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream) {
  return launch_rows(decode_guard_kernel, p.batch, p, extras, error_word, row_flags, stream);
}
cudaError_t launch_verify_guard(const VerifyParams& p, const GuardExtras& extras,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream) {
  return launch_rows(verify_guard_kernel, p.rows, p, extras, error_word, row_flags, stream);
}
cudaError_t launch_commit_guard(const CommitParams& p, const GuardExtras& extras,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream) {
  return launch_rows(commit_guard_kernel, p.rows, p, extras, error_word, row_flags, stream);
}

}  // namespace kdaguard::gpu::detail
