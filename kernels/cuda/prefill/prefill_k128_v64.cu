// Prefill kernels for K = 128, V = 64 (one shape per translation unit keeps builds parallel).
#include "prefill_shape.cuh"

namespace kdaguard::gpu::detail {
template cudaError_t launch_prefill_shape<128, 64>(const PrefillParams&, GuardState, cudaStream_t,
                                                            std::int32_t);
}
