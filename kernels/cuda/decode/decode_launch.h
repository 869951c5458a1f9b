// The decode kernel's launcher for one (IO element type, state element type, K): defined in
// decode_kernel.cuh and instantiated once per translation unit (kernels/cuda/instantiations.cmake
// generates them from contracts/supported.h); launch_decode (decode_dispatch.cu) dispatches to it.
#pragma once

#include <cuda_runtime_api.h>

#include "kdaguard/params.h"
#include "launch.h"

namespace kdaguard::gpu::detail {

// See launch_decode (launch.h) for chunks_per_block; returns the launch's cudaError_t and never
// synchronises.
template <class IO, class ST, int K>
cudaError_t launch_decode_tile(const DecodeParams& p, GuardState guard, int chunks_per_block,
                               cudaStream_t stream);

}  // namespace kdaguard::gpu::detail
