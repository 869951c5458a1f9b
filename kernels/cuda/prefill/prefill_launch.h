// Host-side launcher of the prefill kernels, called by the prefill entry point once a call is
// validated and lowered. Internal to kdaguard::kernels: not installed.
//
// bf16 and f16 inputs run the chunked tensor-core kernel (prefill_chunked.cuh); f32 inputs run
// the per-token f32 kernel (prefill_recurrent.cuh). Both read the initial state from slot
// state_indices[n], write the final state back in place, never write q, k, v, gates or beta, and
// skip (and report through guard.error_word) any sequence whose offsets or slot break a value
// rule, or that guard.row_flags marks.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "kdaguard/params.h"
#include "../src/launch.h"  // relative: the benchmark includes this header from outside the library

namespace kdaguard::gpu::detail {

// Empty when the kernels can run p, else why not (a valid call always can: K and V in {64, 128},
// 16-bit or f32 inputs, f32 or bf16 state).
std::string prefill_unsupported_reason(const PrefillParams& p);

// Returns the launch's cudaError_t (cudaSuccess when there was nothing to do, or
// cudaErrorInvalidValue for params prefill_unsupported_reason refuses); never synchronises.
cudaError_t launch_prefill(const PrefillParams& p, GuardState guard, cudaStream_t stream);

// The prefill guard (prefill_guard.cu): seqlens.start/monotone/total, index.range/padding/unique
// per sequence on the device; row_flags[n] != 0 makes the kernels skip sequence n. The signature
// matches the other guards' so the entry point can treat them alike (extras are unused).
cudaError_t launch_prefill_guard(const PrefillParams& p, const GuardExtras& extras,
                                 unsigned long long* error_word, std::int32_t* row_flags,
                                 cudaStream_t stream);

// The kernels of one (K, V) shape; one translation unit instantiates each.
template <int K, int V>
cudaError_t launch_prefill_shape(const PrefillParams& p, GuardState guard, cudaStream_t stream);

}  // namespace kdaguard::gpu::detail
