// Prefill kernels for K = 64, V = 128 (one shape per translation unit keeps builds parallel).
#include "prefill_shape.cuh"

namespace kdaguard::gpu::detail {
template cudaError_t launch_prefill_shape<64, 128>(const PrefillParams&, GuardState, cudaStream_t,
                                                            std::int32_t);
}
