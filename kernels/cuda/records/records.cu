// The record-based path's dispatchers: the call's state dtype to its translation unit
// (records_f32.cu, records_bf16.cu), and the guards of calls without rows.
#include <cuda_bf16.h>

#include "launch.h"
#include "records/records_launch.h"

namespace kdaguard::gpu::detail {
namespace {

template <class Params>
cudaError_t launch_records(const Params& p, DType state, GuardState guard, int chunks_per_block,
                           cudaStream_t stream) {
  switch (state) {
    case DType::f32: return launch_records_for_state<float>(p, guard, chunks_per_block, stream);
    case DType::bf16:
      return launch_records_for_state<__nv_bfloat16>(p, guard, chunks_per_block, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_record_verify(const RecordVerifyParams& p, GuardState guard,
                                 int chunks_per_block, cudaStream_t stream) {
  return launch_records(p, p.state.dtype, guard, chunks_per_block, stream);
}
cudaError_t launch_replay_commit(const ReplayCommitParams& p, GuardState guard,
                                 int chunks_per_block, cudaStream_t stream) {
  return launch_records(p, p.state.dtype, guard, chunks_per_block, stream);
}
cudaError_t launch_accept_verify(const AcceptVerifyParams& p, GuardState guard,
                                 int chunks_per_block, cudaStream_t stream) {
  return launch_records(p, p.verify.state.dtype, guard, chunks_per_block, stream);
}

}  // namespace kdaguard::gpu::detail
