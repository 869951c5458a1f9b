// Helpers of the GPU benchmarks (bench_decode.cu, bench_spec.cu, bench_prefill.cu): the CUDA
// check, device buffers, reproducible noise to fill them with, and the device-to-device copy they
// relate their bandwidth to.
//
// Each benchmark binary is this header plus one .cu file (bench/CMakeLists.txt), so the kernels
// here are plain definitions: nvcc ignores `inline` on a __global__ function (with a warning), and
// `static` would draw "declared but never referenced" in a binary that launches none of them.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "kdaguard/contracts/tensor_view.h"

// A failed CUDA call ends the run: a benchmark has nothing to fall back on, and a figure measured
// after an error would be meaningless.
#define CHECK_CUDA(expr)                                                                       \
  do {                                                                                         \
    const cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_));                  \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace kdaguard::bench {

// A view of `shape` at `offset` elements into the device allocation at `p`, on the call's device:
// row-major unless `stride` is given; `elements`, when given, is the allocation's size, so the
// contracts check the view against it as they do the binding's views.
inline TensorView device_view(DType dtype, const std::vector<std::int64_t>& shape, const void* p,
                              std::int64_t offset = 0, const std::vector<std::int64_t>& stride = {},
                              std::optional<std::int64_t> elements = std::nullopt) {
  TensorView v = TensorView::contiguous(dtype, shape);
  for (std::size_t d = 0; d < stride.size(); ++d) v.stride[d] = stride[d];
  v.address = reinterpret_cast<std::uint64_t>(p);
  v.storage_offset = Elements{offset};
  if (elements) v.storage_size = Elements{*elements};
  return v;
}

// One cudaMalloc, freed with the buffer; not copyable, so it is freed once.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { CHECK_CUDA(cudaMalloc(&ptr, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Element i is a hash of (i, seed) mapped to [lo, hi): the same data for a seed whatever the
// launch geometry, with no generator state. Never zero (performance.md: random inputs, never
// zeros; a draw of exactly 0 becomes hi). bf16 elements are the f32 draw rounded to nearest even.
__global__ void fill_uniform_kernel(void* data, std::int64_t n, bool bf16, float lo, float hi,
                                    std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    x *= 3266489917u;
    x ^= x >> 16;
    float u = lo + (hi - lo) * (static_cast<float>(x >> 8) + 0.5f) * (1.0f / 16777216.0f);
    if (u == 0.f) u = hi;
    if (bf16) {
      const std::uint32_t bits = __float_as_uint(u);
      static_cast<std::uint16_t*>(data)[i] =
          static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    } else {
      static_cast<float*>(data)[i] = u;
    }
  }
}

// Fills the first n elements of b (bf16 or f32) with fill_uniform_kernel's noise.
inline void fill_uniform(const DeviceBuffer& b, std::int64_t n, DType dtype, float lo, float hi,
                         std::uint32_t seed) {
  fill_uniform_kernel<<<1024, 256>>>(b.ptr, n, dtype == DType::bf16, lo, hi, seed);
  CHECK_CUDA(cudaGetLastError());
}

// Keeps the GPU busy for `ns` nanoseconds. Enqueued before a timed region's start event, it lets
// the host validate and launch the call(s) while the GPU is still busy, so the events time the
// device work of the calls, not the host's latency before the first one reaches the GPU.
__global__ void hold_gpu(long long ns) {
  long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// The bandwidth ceiling: a device-to-device copy of 2 GiB (far beyond the L2, so it streams from
// and to HBM), counted as 2 x kBytes moved (read + written). The source holds f32 noise.
struct CopyCeiling {
  static constexpr std::size_t kBytes = std::size_t{2} << 30;
  DeviceBuffer src{kBytes}, dst{kBytes};

  explicit CopyCeiling(std::uint32_t seed) {
    fill_uniform(src, static_cast<std::int64_t>(kBytes / 4), DType::f32, -1.f, 1.f, seed);
  }

  // The median time of `reps` copies, in seconds, each timed by events on the default stream.
  // hold_ns > 0 runs hold_gpu that long before each start event, so the events time the copy
  // alone (bench_decode times its calls that way); 0 enqueues nothing, so the time also holds the
  // copy's launch (bench_prefill times its calls that way).
  double median_seconds(int reps, long long hold_ns) const {
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; ++i) {
      if (hold_ns > 0) {
        hold_gpu<<<1, 1>>>(hold_ns);
        CHECK_CUDA(cudaGetLastError());
      }
      CHECK_CUDA(cudaEventRecord(start));
      CHECK_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, kBytes, cudaMemcpyDeviceToDevice));
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      CHECK_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2] * 1e-3;
  }
};

}  // namespace kdaguard::bench
