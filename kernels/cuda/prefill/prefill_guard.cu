// The device guard of prefill: guard_kernel.cuh's kernel over the sequences (one block each;
// row_flags[n] non-zero = the prefill kernels skip sequence n).
#include "guard/guard_kernel.cuh"
#include "prefill_launch.h"

namespace kdaguard::gpu::detail {

cudaError_t launch_prefill_guard(const PrefillParams& p, std::uint64_t enabled,
                                 unsigned long long* error_word, std::int32_t* row_flags,
                                 cudaStream_t stream) {
  return launch_guard(prefill_rows(p), enabled, error_word, row_flags, stream);
}

}  // namespace kdaguard::gpu::detail
