// The record kernels with bf16 state (records_kernel.cuh): every (entry point, IO dtype, K).
#include "records/records_kernel.cuh"

namespace kdaguard::gpu::detail {

template cudaError_t launch_records_for_state<__nv_bfloat16, RecordVerifyParams>(const RecordVerifyParams&,
                                                                     GuardState, int, cudaStream_t);
template cudaError_t launch_records_for_state<__nv_bfloat16, ReplayCommitParams>(const ReplayCommitParams&,
                                                                     GuardState, int, cudaStream_t);
template cudaError_t launch_records_for_state<__nv_bfloat16, AcceptVerifyParams>(const AcceptVerifyParams&,
                                                                     GuardState, int, cudaStream_t);

}  // namespace kdaguard::gpu::detail
