// Launcher of the decode kernel (recurrent.cuh).
#include <climits>

#include "dispatch.cuh"
#include "launch.h"
#include "recurrent.cuh"

namespace kdaguard::gpu::detail {

int pick_rows_per_thread(std::int64_t rows, std::int32_t heads, std::int32_t K, std::int32_t V,
                         int requested) {
  if (requested == 1 || requested == 2) return requested;
  // Two rows per thread double the loads each thread keeps in flight, which pays once the grid
  // holds several waves of blocks; below that, one row per thread gives the SMs more blocks.
  const std::int64_t rows_per_block = kRowThreads / (K / 16);
  const std::int64_t blocks = rows * heads * ((V + rows_per_block - 1) / rows_per_block);
  return blocks >= 8192 ? 2 : 1;
}

cudaError_t launch_decode(const DecodeParams& p, GuardState guard, int rows_per_thread,
                          cudaStream_t stream) {
  return dispatch_tile(p.in.io_dtype, p.state.dtype, p.in.K, rows_per_thread,
                       [&]<class IO, class ST, int K, int R>() -> cudaError_t {
                         using Tile = RowTile<ST, K, R>;
                         const std::int32_t slices =
                             (p.in.V + Tile::kRowsPerBlock - 1) / Tile::kRowsPerBlock;
                         const std::int64_t blocks =
                             static_cast<std::int64_t>(p.batch) * p.in.HV * slices;
                         if (blocks == 0) return cudaSuccess;
                         if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
                         decode_kernel<IO, ST, K, R>
                             <<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(p, guard,
                                                                                         slices);
                         return cudaGetLastError();
                       });
}

}  // namespace kdaguard::gpu::detail
