// Launcher of the verify kernel (recurrent.cuh).
#include <climits>

#include "dispatch.cuh"
#include "launch.h"
#include "recurrent.cuh"

namespace kdaguard::gpu::detail {

cudaError_t launch_verify(const VerifyParams& p, GuardState guard, int rows_per_thread,
                          cudaStream_t stream) {
  return dispatch_tile(p.in.io_dtype, p.state.dtype, p.in.K, rows_per_thread,
                       [&]<class IO, class ST, int K, int R>() -> cudaError_t {
                         using Tile = RowTile<ST, K, R>;
                         const std::int32_t slices =
                             (p.in.V + Tile::kRowsPerBlock - 1) / Tile::kRowsPerBlock;
                         const std::int64_t blocks =
                             static_cast<std::int64_t>(p.rows) * p.in.HV * slices;
                         if (blocks == 0) return cudaSuccess;
                         if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
                         verify_kernel<IO, ST, K, R>
                             <<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(p, guard,
                                                                                         slices);
                         return cudaGetLastError();
                       });
}

}  // namespace kdaguard::gpu::detail
