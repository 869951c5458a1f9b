// The record kernels with f32 state (records_kernel.cuh): every (entry point, IO dtype, K).
#include "records/records_kernel.cuh"

namespace kdaguard::gpu::detail {

template cudaError_t launch_records_for_state<float, RecordVerifyParams>(const RecordVerifyParams&,
                                                                     GuardState, int, cudaStream_t);
template cudaError_t launch_records_for_state<float, ReplayCommitParams>(const ReplayCommitParams&,
                                                                     GuardState, int, cudaStream_t);
template cudaError_t launch_records_for_state<float, AcceptVerifyParams>(const AcceptVerifyParams&,
                                                                     GuardState, int, cudaStream_t);

}  // namespace kdaguard::gpu::detail
