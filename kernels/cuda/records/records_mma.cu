// The f32-state tensor-core record kernels (records_mma.cuh): every (drafting entry point, IO dtype, K).
#include "records/records_launch.h"
#include "records/records_mma.cuh"

namespace kdaguard::gpu::detail {
namespace {

template <class Params>
cudaError_t launch_mma(const Params& p, GuardState guard, cudaStream_t stream) {
  return with_record_config<float>(p, [&]<class IO, int K>() {
    return launch_records_mma_tile<Params, IO, K>(p, guard, stream);
  });
}

}  // namespace

cudaError_t launch_records_mma(const RecordVerifyParams& p, GuardState guard, cudaStream_t stream) {
  return launch_mma(p, guard, stream);
}
cudaError_t launch_records_mma(const AcceptVerifyParams& p, GuardState guard, cudaStream_t stream) {
  return launch_mma(p, guard, stream);
}

}  // namespace kdaguard::gpu::detail
