// What does the copy itself reach at the size of one decode or verify call, and what does a plain
// kernel reach with verify's access pattern (read one state, write T)? A measurement behind
// bench/NOTES.md (v7 decode), built as probe_call_size_ceiling in CUDA builds
// (bench/CMakeLists.txt) and run by hand.
// Every figure is relative to the 2 GiB cudaMemcpyAsync device-to-device figure (bytes read +
// written), which is what bench_decode calls the copy ceiling. Buffers rotate over 4 GiB so that
// no repetition finds its bytes in the 60 MB L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>
#include "probe_check.h"

// Grid-stride; each thread reads 4 vectors of the source and writes each to `copies` destinations
// `dst_stride` vectors apart (copies = 1, dst == src: decode's in-place pass; copies = T: verify).
__global__ void read_once_write_n(const uint4* src, uint4* dst, long long n, int copies,
                                  long long dst_stride) {
  const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += 4 * threads) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = i + u * threads < n ? __ldcs(src + i + u * threads) : uint4{};
    for (int c = 0; c < copies; ++c)
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (i + u * threads < n) __stcs(dst + c * dst_stride + i + u * threads, v[u]);
  }
}

// Median of 15 event-timed runs after 3 warm-ups; run(i) is the i-th repetition.
template <class F> float median_ms(F run) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) run(i);
  std::vector<float> times;
  for (int i = 0; i < 15; ++i) {
    cudaEventRecord(start);
    run(3 + i);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int main() {
  const size_t arena_bytes = size_t{4} << 30;
  unsigned char* arena = nullptr;
  CK(cudaMalloc(&arena, arena_bytes));
  CK(cudaMemset(arena, 1, arena_bytes));
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);

  const size_t ceiling_bytes = size_t{2} << 30;
  const float ceiling_ms = median_ms([&](int) {
    cudaMemcpyAsync(arena + ceiling_bytes, arena, ceiling_bytes, cudaMemcpyDeviceToDevice);
  });
  const double ceiling = 2.0 * ceiling_bytes / ceiling_ms / 1e9;
  std::printf("copy ceiling: cudaMemcpy D2D 2 GiB %.3f ms, %.3f TB/s (read + written)\n", ceiling_ms,
              ceiling);
  auto report = [&](const char* what, double moved, float ms) {
    const double tbps = moved / ms / 1e9;
    std::printf("%-58s %9.1f us %.3f TB/s %5.1f%% of ceiling\n", what, ms * 1e3, tbps,
                100.0 * tbps / ceiling);
  };

  // Copy and in-place pass at the sizes of decode calls (f32 state: 2 MiB per request, read and
  // written).
  for (int requests : {64, 128, 256, 512}) {
    const size_t bytes = size_t(requests) << 21;
    const size_t span = arena_bytes / 2;  // sources rotate over the first half, copies land in the second
    const int places = static_cast<int>(span / bytes);
    char what[96];
    std::snprintf(what, sizeof what, "cudaMemcpy D2D %zu MiB (decode B = %d, f32)", bytes >> 20, requests);
    report(what, 2.0 * bytes, median_ms([&](int i) {
             const size_t at = (i % places) * bytes;
             cudaMemcpyAsync(arena + span + at, arena + at, bytes, cudaMemcpyDeviceToDevice);
           }));
    std::snprintf(what, sizeof what, "in-place pass %zu MiB, 4 blocks x 128 / SM", bytes >> 20);
    report(what, 2.0 * bytes, median_ms([&](int i) {
             uint4* p = reinterpret_cast<uint4*>(arena + (i % (2 * places)) * bytes);
             read_once_write_n<<<sms * 4, 128>>>(p, p, bytes / 16, 1, 0);
           }));
  }
  // Verify's pattern: B = 64 rows, read one 2 MiB state, write T of them (1 + T states moved).
  for (int T : {2, 4, 8}) {
    const size_t state_bytes = size_t{64} << 21;
    const size_t call_bytes = (1 + T) * state_bytes;
    const int places = static_cast<int>(arena_bytes / call_bytes);
    char what[96];
    std::snprintf(what, sizeof what, "read 1 write %d, %zu MiB read (verify B = 64, f32)", T,
                  state_bytes >> 20);
    report(what, static_cast<double>(call_bytes), median_ms([&](int i) {
             unsigned char* base = arena + (i % places) * call_bytes;
             read_once_write_n<<<sms * 4, 128>>>(reinterpret_cast<const uint4*>(base),
                                                 reinterpret_cast<uint4*>(base + state_bytes),
                                                 state_bytes / 16, T, state_bytes / 16);
           }));
  }
  // Writes alone.
  report("cudaMemsetAsync 1 GiB (written only)", double(size_t{1} << 30),
         median_ms([&](int i) { cudaMemsetAsync(arena + (i % 4) * (size_t{1} << 30), i, size_t{1} << 30); }));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  return 0;
}
