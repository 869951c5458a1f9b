// The device guard of prefill: guard_kernel.cuh's kernel over the sequences (one block each;
// row_flags[n] non-zero = the prefill kernels skip sequence n).
#include "guard_kernel.cuh"
#include "prefill_launch.h"

namespace kdaguard::gpu::detail {

cudaError_t launch_prefill_guard(const PrefillParams& p, const GuardExtras& /*extras*/,
                                 unsigned long long* error_word, std::int32_t* row_flags,
                                 cudaStream_t stream) {
  GuardInputs<rr::PrefillRows<DeviceIndex>> in;
  in.rows = prefill_rows(p);
  in.slots = in.rows.state_indices;
  in.num_slots = p.state.num_slots;
  in.enabled = enabled_rules();
  return launch_guard(in, error_word, row_flags, stream);
}

}  // namespace kdaguard::gpu::detail
