// The prefill guard: every value rule of a prefill evaluated on the device, for calls whose
// cu_seqlens or initial_state_indices carried no host copy. One block per sequence: its offsets
// and slot (the same checks resolve_sequence makes in the main kernels), then a scan of the other
// sequences for its slot (index.unique). Writes row_flags[n] (non-zero = the prefill kernels skip
// sequence n) and ORs the rules that fired into the error word, on the caller's stream.
#include <climits>

#include "prefill_device.cuh"
#include "prefill_launch.h"

namespace kdaguard::gpu::detail {
namespace {

namespace vc = kdaguard::value_checks;
constexpr int kGuardThreads = 128;

__global__ void __launch_bounds__(kGuardThreads)
    prefill_guard_kernel(const PrefillParams p, unsigned long long* error_word,
                         std::int32_t* row_flags) {
  const std::int32_t n = blockIdx.x;
  std::uint64_t faults = prefill::sequence_faults(p, n);
  const std::int64_t slot = p.state_indices[n];
  const bool in_range = vc::slot_in_range(slot, p.state.num_slots, /*padding_allowed=*/false);

  // index.unique: another sequence names the same (valid) slot. Uniform branch per block.
  bool shared = false;
  if (in_range) {
    for (std::int64_t m = threadIdx.x; m < p.num_seqs; m += kGuardThreads)
      shared |= m != n && p.state_indices[m] == slot;
  }
  if (__syncthreads_or(shared)) faults |= vc::rule_bit(RuleId::index_unique);

  if (threadIdx.x == 0) {
    row_flags[n] = faults != 0 ? 1 : 0;
    raise(error_word, faults);
  }
}

}  // namespace

cudaError_t launch_prefill_guard(const PrefillParams& p, const GuardExtras& /*extras*/,
                                 unsigned long long* error_word, std::int32_t* row_flags,
                                 cudaStream_t stream) {
  if (p.num_seqs == 0) return cudaSuccess;
  prefill_guard_kernel<<<static_cast<unsigned>(p.num_seqs), kGuardThreads, 0, stream>>>(
      p, error_word, row_flags);
  return cudaGetLastError();
}

}  // namespace kdaguard::gpu::detail
