// How close can a plain in-place read-modify-write of a 1 GiB buffer get to cudaMemcpy's
// device-to-device figure, by access pattern and occupancy? A measurement behind bench/NOTES.md
// (v6 decode), built as probe_inplace_ceiling in CUDA builds (bench/CMakeLists.txt) and run by
// hand. Output of the H200 run: s9_probe.txt, in git history (bench/NOTES.md says how).
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include "probe_check.h"

__device__ __forceinline__ uint4 scale4(uint4 v, float s) {
  return make_uint4(__float_as_uint(__uint_as_float(v.x) * s), __float_as_uint(__uint_as_float(v.y) * s),
                    __float_as_uint(__uint_as_float(v.z) * s), __float_as_uint(__uint_as_float(v.w) * s));
}
// Grid-stride, 4 vectors per thread per step, out of place or in place (dst == src).
__global__ void stride_kernel(const uint4* src, uint4* dst, long long n, float s) {
  const long long T = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += 4 * T) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = i + u * T < n ? __ldcs(src + i + u * T) : make_uint4(0,0,0,0);
#pragma unroll
    for (int u = 0; u < 4; ++u) if (i + u * T < n) __stcs(dst + i + u * T, scale4(v[u], s));
  }
}
// Decode's pattern: each warp walks a contiguous share of 2 KB chunks, the next chunk's loads in
// flight while the current one is stored.
__global__ void warp_chunks_kernel(uint4* p, long long chunks, float s) {
  const int lane = threadIdx.x % 32;
  const long long workers = (long long)gridDim.x * (blockDim.x / 32);
  const long long w = blockIdx.x * (long long)(blockDim.x / 32) + threadIdx.x / 32;
  const long long base = chunks / workers, extra = chunks % workers;
  const long long begin = w * base + min(w, extra), end = begin + base + (w < extra ? 1 : 0);
  if (begin >= end) return;
  uint4 a[4], b[4];
  auto load = [&](long long c, uint4 (&v)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) v[r] = __ldcs(p + c * 128 + r * 32 + lane);
  };
  auto store = [&](long long c, const uint4 (&v)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) __stcs(p + c * 128 + r * 32 + lane, scale4(v[r], s));
  };
  load(begin, a);
  for (long long c = begin; c < end; c += 2) {
    if (c + 1 < end) load(c + 1, b);
    store(c, a);
    if (c + 1 < end) {
      if (c + 2 < end) load(c + 2, a);
      store(c + 1, b);
    }
  }
}

template <class F> float time_median(F f, int reps = 15) {
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(e0); f(); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  const size_t bytes = size_t{1} << 30;
  const long long n = bytes / 16;
  void *a, *b;
  CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 0, bytes)); CK(cudaMemset(b, 0, bytes));
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const double moved = 2.0 * bytes;
  const float memcpy_ms = time_median([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
  const double ceiling = moved / memcpy_ms / 1e9;
  printf("cudaMemcpy D2D 1 GiB: %.3f ms, %.3f TB/s (read + written)\n", memcpy_ms, ceiling);
  auto report = [&](const char* name, float ms) {
    printf("%-52s %.3f ms %.3f TB/s %.1f%% of memcpy\n", name, ms, moved / ms / 1e9, 100.0 * (moved / ms / 1e9) / ceiling);
  };
  for (int threads : {128, 256, 512}) for (int per_sm : {2, 4, 8, 16}) {
    if (threads * per_sm > 2048) continue;
    char name[96];
    snprintf(name, sizeof name, "copy stride out-of-place %d thr x %d blk/SM", threads, per_sm);
    report(name, time_median([&] { stride_kernel<<<sms * per_sm, threads>>>((const uint4*)a, (uint4*)b, n, 1.0f); }));
    snprintf(name, sizeof name, "rmw stride in-place %d thr x %d blk/SM", threads, per_sm);
    report(name, time_median([&] { stride_kernel<<<sms * per_sm, threads>>>((const uint4*)a, (uint4*)a, n, 1.0f); }));
  }
  for (int per_sm : {4, 8, 16}) {
    char name[96];
    snprintf(name, sizeof name, "rmw warp-chunks in-place 128 thr x %d blk/SM", per_sm);
    report(name, time_median([&] { warp_chunks_kernel<<<sms * per_sm, 128>>>((uint4*)a, n / 128, 1.0f); }));
  }
  CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  return 0;
}
