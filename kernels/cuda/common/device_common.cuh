// Device building blocks shared by the decode, verify, commit and guard kernels: element types,
// conversions, loads of a run-time dtype, warp reductions, and the 16-byte state-row accessors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kdaguard/contracts/tensor_view.h"

namespace kdaguard::gpu::detail {

// ---- element conversions (round to nearest even on the way out) -------------------------------

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// One element of a tensor whose dtype is only known at run time (gates and beta may be f32 while
// q, k, v are 16-bit). `index` is in elements.
__device__ __forceinline__ float load_f32(const void* base, DType dtype, std::int64_t index) {
  switch (dtype) {
    case DType::f16: return __half2float(static_cast<const __half*>(base)[index]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

// load_f32 in two halves, so that a caller can issue several loads of a runtime dtype before it
// converts the first: the element's bits (a 16-bit element in the low half), then its value.
__device__ __forceinline__ std::uint32_t load_bits(const void* base, DType dtype,
                                                   std::int64_t index) {
  if (dtype == DType::f16 || dtype == DType::bf16)
    return static_cast<const std::uint16_t*>(base)[index];
  return static_cast<const std::uint32_t*>(base)[index];
}
__device__ __forceinline__ float bits_to_f32(std::uint32_t bits, DType dtype) {
  switch (dtype) {
    case DType::f16: return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    case DType::bf16: return __uint_as_float(bits << 16);
    default: return __uint_as_float(bits);
  }
}

// ---- reductions ---------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// N sums over the warp at once (N a power of two, at most 32): each butterfly step halves the
// values a lane carries, so N - 1 + log2(32 / N) shuffles instead of 5 N. Returns sum number
// warp_sums_index<N>(lane) of the N, which the 32 / N neighbouring lanes of an aligned group share.
template <int N> __device__ __forceinline__ float warp_sums(float (&v)[N]) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0);
  const int lane = threadIdx.x % 32;
  int offset = 16;
#pragma unroll
  for (int n = N; n > 1; n /= 2, offset /= 2) {
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < n / 2; ++i) {
      const float keep = upper ? v[i + n / 2] : v[i];
      const float send = upper ? v[i] : v[i + n / 2];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
  }
  float x = v[0];
#pragma unroll
  for (; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
// Which of the N sums warp_sums leaves in `lane`: lane bit 4 selects the upper half of the
// values, bit 3 the upper half of that half, and so on for log2 N bits.
template <int N> __device__ __forceinline__ int warp_sums_index(int lane) {
  int index = 0;
#pragma unroll
  for (int n = N, bit = 16; n > 1; n /= 2, bit /= 2)
    if (lane & bit) index += n / 2;
  return index;
}

// Sum over aligned groups of `kLanes` consecutive lanes (a power of two <= 32); every lane of the
// group gets the group's sum.
template <int kLanes> __device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// ---- state rows ---------------------------------------------------------------------------------
// A state row is K contiguous elements (the pool is [S, HV, V, K]). A row is held by a group of
// kLanes = K / 16 lanes, 16 elements each, read and written as 16-byte vectors. Vector c of lane j
// covers elements [(c * kLanes + j) * kPerVec, +kPerVec): for each c the group's lanes touch one
// contiguous span, so every load instruction is fully coalesced.

template <class ST> struct StateVec;  // 16 bytes of state elements
template <> struct StateVec<float> {
  static constexpr int kPerVec = 4;
  __device__ __forceinline__ static void unpack(const uint4& raw, float* out) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  }
  __device__ __forceinline__ static uint4 pack(const float* in) {
    return make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]),
                      __float_as_uint(in[3]));
  }
  __device__ __forceinline__ static float round(float x) { return x; }
};
template <> struct StateVec<__nv_bfloat16> {
  static constexpr int kPerVec = 8;
  __device__ __forceinline__ static float lo(unsigned w) { return __uint_as_float(w << 16); }
  __device__ __forceinline__ static float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
  __device__ __forceinline__ static void unpack(const uint4& raw, float* out) {
    out[0] = lo(raw.x); out[1] = hi(raw.x);
    out[2] = lo(raw.y); out[3] = hi(raw.y);
    out[4] = lo(raw.z); out[5] = hi(raw.z);
    out[6] = lo(raw.w); out[7] = hi(raw.w);
  }
  __device__ __forceinline__ static unsigned pair(float a, float b) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(a, b);  // a in the low half
    return *reinterpret_cast<const unsigned*>(&p);
  }
  __device__ __forceinline__ static uint4 pack(const float* in) {
    return make_uint4(pair(in[0], in[1]), pair(in[2], in[3]), pair(in[4], in[5]),
                      pair(in[6], in[7]));
  }
  __device__ __forceinline__ static float round(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
  }
};

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Asynchronous global -> shared copies (cp.async, 16 bytes, L2 only), in groups a thread commits
// and waits for: a thread waits only for its own copies.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(smem)), "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending> __device__ __forceinline__ void cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Streaming accesses: every state byte is touched once per call, so keep it from evicting the
// small, reused inputs.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  return __ldcs(static_cast<const uint4*>(p));
}
__device__ __forceinline__ void store_stream(void* p, const uint4& v) {
  __stcs(static_cast<uint4*>(p), v);
}

// Programmatic dependent launch: the decode kernel is launched so that it may start while
// the previous kernel on the stream is finishing; before its first global access it waits
// for the grids it depends on to complete and their writes to be visible. Launched without the
// attribute, both are no-ops.
__device__ __forceinline__ void wait_for_prior_grids() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
// Lets the next kernel's blocks be scheduled (they still wait for this grid to complete).
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;"); }

// Launches `kernel` as a programmatic dependant of the stream's previous kernel: its blocks may be
// scheduled once every block of that kernel has called allow_next_grid (or exited), and must call
// wait_for_prior_grids before touching anything that kernel writes.
template <class... Params, class... Args>
cudaError_t launch_after_prior_grid(void (*kernel)(Params...), unsigned blocks, unsigned threads,
                                    std::size_t shared_bytes, cudaStream_t stream,
                                    Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

__device__ __forceinline__ void raise(unsigned long long* error_word, std::uint64_t bits) {
  if (error_word != nullptr && bits != 0) atomicOr(error_word, static_cast<unsigned long long>(bits));
}

}  // namespace kdaguard::gpu::detail
