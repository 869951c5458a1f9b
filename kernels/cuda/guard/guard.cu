// The guard kernels of verify (every row), and of decode and commit calls without rows (their
// rows judge themselves in the main kernels' prologues).
#include "guard_kernel.cuh"
#include "launch.h"

namespace kdaguard::gpu::detail {

cudaError_t launch_empty_call_guard(const DecodeParams& p, GuardState guard, cudaStream_t stream) {
  return launch_guard(decode_rows(p, true), guard.enabled, guard.error_word, nullptr, stream);
}

cudaError_t launch_verify_guard(const VerifyParams& p, std::uint64_t enabled,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream) {
  return launch_guard(verify_rows(p, true), enabled, error_word, row_flags, stream);
}

cudaError_t launch_empty_call_guard(const CommitParams& p, GuardState guard, cudaStream_t stream) {
  return launch_guard(commit_rows(p, true), guard.enabled, guard.error_word, nullptr, stream);
}

}  // namespace kdaguard::gpu::detail
