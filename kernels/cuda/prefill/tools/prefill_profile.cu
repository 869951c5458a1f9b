// Phase timing of the chunked prefill kernel, for tuning: builds with KDAGUARD_PREFILL_PROFILE,
// runs one (B = 1, T, H = HV, K = V = 128) bf16 prefill and prints, for block 0, the cycles per
// chunk spent between barriers, the chunks that took pass 3's per-pair path and the kernel time.
// Not part of the build; compile by hand:
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ikernels/include
//     -Icontracts/include -Ikernels/cuda/src -Ikernels/cuda/prefill
//     kernels/cuda/prefill/tools/prefill_profile.cu -o prefill_profile
// Usage: prefill_profile [T] [H] [gate: bounded|softplus|activated]
#define KDAGUARD_PREFILL_PROFILE
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "prefill_shape.cuh"

namespace {

#define CHECK(expr)                                                              \
  do {                                                                           \
    const cudaError_t e_ = (expr);                                               \
    if (e_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));           \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

__global__ void fill(void* data, long long n, bool bf16, float lo, float hi, unsigned seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed;
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13; x *= 3266489917u; x ^= x >> 16;
    const float u = lo + (hi - lo) * (static_cast<float>(x >> 8) + 0.5f) / 16777216.f;
    if (bf16) static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(u);
    else static_cast<float*>(data)[i] = u;
  }
}

void* device_fill(long long n, bool bf16, float lo, float hi, unsigned seed) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, n * (bf16 ? 2 : 4)));
  fill<<<1024, 256>>>(p, n, bf16, lo, hi, seed);
  CHECK(cudaGetLastError());
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kdaguard;
  const long long T = argc > 1 ? std::atoll(argv[1]) : 8192;
  const int H = argc > 2 ? std::atoi(argv[2]) : 64;
  const char* gate = argc > 3 ? argv[3] : "bounded";
  constexpr int K = 128, V = 128;

  PrefillParams p;
  p.in.H = p.in.HV = H;
  p.in.K = K;
  p.in.V = V;
  p.in.io_dtype = DType::bf16;
  p.in.q = {device_fill(T * H * K, true, -1, 1, 1), H * K, K};
  p.in.k = {device_fill(T * H * K, true, -1, 1, 2), H * K, K};
  p.in.v = {device_fill(T * H * V, true, -1, 1, 3), H * V, V};
  p.in.gate_dtype = DType::bf16;
  if (std::strcmp(gate, "activated") == 0) {
    p.in.gate_kind = GateKind::activated;
    p.in.gate = {device_fill(T * H * K, true, -2, -0.001f, 4), H * K, K};
  } else {
    p.in.gate_kind = std::strcmp(gate, "softplus") == 0 ? GateKind::softplus : GateKind::bounded;
    p.in.gate = {device_fill(T * H * K, true, -4, 4, 4), H * K, K};
    p.in.A_log = static_cast<const float*>(device_fill(H, false, -0.5f, 0.5f, 6));
    p.in.dt_bias = static_cast<const float*>(device_fill(H * K, false, -6, -2, 7));
    p.in.lower_bound = -5.f;
  }
  p.in.beta_kind = BetaKind::logits;
  p.in.beta_dtype = DType::bf16;
  p.in.beta = {device_fill(T * H, true, -3, 3, 5), H, 1};
  p.in.scale = 1.f / std::sqrt(static_cast<float>(K));
  p.in.use_qk_l2norm = true;
  p.total_tokens = T;
  p.num_seqs = 1;
  const int cu[2] = {0, static_cast<int>(T)};
  const int slot = 0;
  void* cu_dev = nullptr;
  void* idx_dev = nullptr;
  CHECK(cudaMalloc(&cu_dev, sizeof cu));
  CHECK(cudaMalloc(&idx_dev, sizeof slot));
  CHECK(cudaMemcpy(cu_dev, cu, sizeof cu, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(idx_dev, &slot, sizeof slot, cudaMemcpyHostToDevice));
  p.cu_seqlens = cu_dev;
  p.cu_seqlens_dtype = DType::i32;
  p.state = {device_fill(static_cast<long long>(H) * V * K, false, -0.1f, 0.1f, 8), DType::f32, 1,
             static_cast<std::int64_t>(H) * V * K};
  p.state_indices = static_cast<const std::int32_t*>(idx_dev);
  void* out = nullptr;
  CHECK(cudaMalloc(&out, T * H * V * 2));
  p.out = {out, H * V, V};

  CHECK((gpu::detail::launch_prefill_shape<K, V>(p, {}, nullptr)));  // warm-up
  CHECK(cudaDeviceSynchronize());
  const unsigned long long zero[gpu::prefill::kProfileSlots] = {};
  CHECK(cudaMemcpyToSymbol(gpu::prefill::prefill_profile, zero, sizeof zero));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start));
  CHECK((gpu::detail::launch_prefill_shape<K, V>(p, {}, nullptr)));
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  unsigned long long cycles[gpu::prefill::kProfileSlots];
  CHECK(cudaMemcpyFromSymbol(cycles, gpu::prefill::prefill_profile, sizeof cycles));
  const double chunks = static_cast<double>((T + 15) / 16);
  static const char* kName[] = {"top wait", "pass 1+2a", "pass 2b", "pass 3", "pass 4", "pass 5"};
  std::printf("prefill_profile T=%lld H=%d gate=%s: %.3f ms, %.2f us per chunk step\n", T, H, gate,
              ms, ms * 1e3 / chunks);
  double total = 0;
  for (int i = 0; i < gpu::prefill::kProfileSlots - 1; ++i) total += cycles[i] / chunks;
  for (int i = 0; i < gpu::prefill::kProfileSlots - 1; ++i)
    std::printf("  %-10s %8.0f cycles/chunk (%4.1f%%)\n", kName[i], cycles[i] / chunks,
                100.0 * cycles[i] / chunks / total);
  std::printf("  per-pair chunks: %llu of %.0f\n", cycles[gpu::prefill::kProfileSlots - 1], chunks);
  return 0;
}
