// The device guard of decode, verify and commit: guard_kernel.cuh's kernel over each entry
// point's rows.
#include "guard_kernel.cuh"
#include "launch.h"

namespace kdaguard::gpu::detail {

cudaError_t launch_decode_guard(const DecodeParams& p, const GuardExtras& extras,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream) {
  GuardInputs<rr::DecodeRows<DeviceIndex>> in;
  in.rows = decode_rows(p, extras);
  in.slots = in.rows.cache_indices;
  in.num_slots = p.state.num_slots;
  in.enabled = enabled_rules();
  return launch_guard(in, error_word, row_flags, stream);
}

// Verify and commit: the slot map and the explicit scratch indices for index.unique.
template <class Rows>
GuardInputs<Rows> scratch_guard_inputs(const Rows& rows, std::int64_t draft_tokens) {
  GuardInputs<Rows> in;
  in.rows = rows;
  in.slots = rows.cache_indices;
  in.num_slots = rows.num_slots;
  in.scratch_indices = rows.scratch_indices;
  in.draft_tokens = draft_tokens;
  in.scratch_slots = rows.scratch_slots;
  in.enabled = enabled_rules();
  return in;
}

cudaError_t launch_verify_guard(const VerifyParams& p, const GuardExtras& extras,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream) {
  return launch_guard(scratch_guard_inputs(verify_rows(p, extras), p.draft_tokens), error_word,
                      row_flags, stream);
}

cudaError_t launch_commit_guard(const CommitParams& p, const GuardExtras& extras,
                                unsigned long long* error_word, std::int32_t* row_flags,
                                cudaStream_t stream) {
  return launch_guard(scratch_guard_inputs(commit_rows(p, extras), p.draft_tokens), error_word,
                      row_flags, stream);
}

}  // namespace kdaguard::gpu::detail
