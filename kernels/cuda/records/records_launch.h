// The record kernels' launcher for one state element type (records_kernel.cuh), instantiated once
// per translation unit (records_f32.cu, records_bf16.cu); launch_record_verify, launch_replay_commit
// and launch_accept_verify (records.cu) pick the state dtype's.
#pragma once

#include <cuda_runtime_api.h>

#include "kdaguard/params.h"
#include "launch.h"

namespace kdaguard::gpu::detail {

// Params: RecordVerifyParams, ReplayCommitParams or AcceptVerifyParams. Returns the launch's
// cudaError_t and never synchronises.
template <class ST, class Params>
cudaError_t launch_records_for_state(const Params& p, GuardState guard, int chunks_per_block,
                                     cudaStream_t stream);

// The f32-state tensor-core kernels (records_mma.cuh, records_mma.cu) for drafting calls with rows
// whose drafts are at most kRecordStepBatch tokens; launch_records_for_state<float> sends them there.
cudaError_t launch_records_mma(const RecordVerifyParams& p, GuardState guard, cudaStream_t stream);
cudaError_t launch_records_mma(const AcceptVerifyParams& p, GuardState guard, cudaStream_t stream);

}  // namespace kdaguard::gpu::detail
