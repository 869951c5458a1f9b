// Launcher of the verify kernel (recurrent.cuh).
#include <algorithm>
#include <climits>

#include "dispatch.cuh"
#include "launch.h"
#include "recurrent.cuh"

namespace kdaguard::gpu::detail {

int pick_chunks_per_block(std::int64_t rows, std::int32_t heads, std::int32_t chunks_per_head,
                          int requested) {
  if (requested > 0) return std::min<int>(requested, chunks_per_head);
  // About two waves of resident blocks (132 SMs x 8) before a block takes several chunks: small
  // batches need the blocks, large ones the longer pipelines.
  constexpr std::int64_t kTargetBlocks = 2048;
  int chunks = chunks_per_head;
  while (chunks > 1 && rows * heads * ((chunks_per_head + chunks - 1) / chunks) < kTargetBlocks)
    chunks = (chunks + 1) / 2;
  return chunks;
}

cudaError_t launch_verify(const VerifyParams& p, GuardState guard, int chunks_per_block,
                          cudaStream_t stream) {
  return dispatch_tile(p.in.io_dtype, p.state.dtype, p.in.K,
                       [&]<class IO, class ST, int K>() -> cudaError_t {
                         using Tile = RowTile<ST, K>;
                         const int per_head = (p.in.V + Tile::kChunkRows - 1) / Tile::kChunkRows;
                         const int chunks =
                             pick_chunks_per_block(p.rows, p.in.HV, per_head, chunks_per_block);
                         const std::int32_t slices = (per_head + chunks - 1) / chunks;
                         const std::int64_t blocks =
                             static_cast<std::int64_t>(p.rows) * p.in.HV * slices;
                         if (blocks == 0) return cudaSuccess;
                         if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
                         verify_kernel<IO, ST, K><<<static_cast<unsigned>(blocks), kRowThreads, 0,
                                               stream>>>(p, guard, slices, chunks);
                         return cudaGetLastError();
                       });
}

}  // namespace kdaguard::gpu::detail
