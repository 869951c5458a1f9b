// Does the prepare kernel's fast softplus move a slowly decaying channel's decay by as much as
// f16's rounding? A measurement behind bench/NOTES_prefill.md (the f16 state's worst calls), built
// as probe_softplus_drift in CUDA builds (bench/CMakeLists.txt) and run by hand; no kdaguard code.
//
// Channels are drawn as the conformance generator draws softplus gates (properties/support/
// problem.cpp): rate = exp(A_log) uniform in [1, 16], dt log-uniform in [1e-3, 1e-1] with
// dt_bias = log(expm1(dt)), and per token a uniform in [-4, 4]. Each channel's decay over n tokens,
// exp(-rate * sum softplus(a_t + dt_bias)), is formed on the device as the prepare kernel forms it
// (per-token g in log2 units summed in f32, then exp2f) with three softplus forms, and on the host
// in f64. Printed per n: the rms and the largest relative error of the decay, which is the
// relative error the decay puts on the part of the state that the initial state still holds, next
// to f16's rounding floor (about 2.1e-4 rms relative, bench/NOTES_prefill.md).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_check.h"

constexpr int kChannels = 1 << 14;
constexpr int kForms = 3;
const char* const kFormNames[kForms] = {"__logf(1 + __expf(x)) (prepare kernel)", "log1pf(__expf(x))",
                                        "log1pf(expf(x)) (f32 kernel, decode)"};

// The same uniform numbers on host and device: a counter hash mapped to [0, 1).
__host__ __device__ inline double unit(std::uint64_t key) {
  key += 0x9e3779b97f4a7c15ull;
  key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
  key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
  key ^= key >> 31;
  return static_cast<double>(key >> 11) * 0x1.0p-53;
}
__host__ __device__ inline double token_gate(int channel, int t) {
  return -4.0 + 8.0 * unit((static_cast<std::uint64_t>(channel) << 32) | static_cast<std::uint32_t>(t));
}

struct Channel {
  float rate, dt_bias;
};

__global__ void decay_kernel(const Channel* channels, int tokens, float* decay) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= kChannels) return;
  constexpr float kLog2e = 1.4426950408889634f;
  const Channel ch = channels[c];
  float G[kForms] = {};
  for (int t = 0; t < tokens; ++t) {
    const float x = static_cast<float>(token_gate(c, t)) + ch.dt_bias;
    const float sp[kForms] = {x > 20.f ? x : __logf(1.f + __expf(x)), x > 20.f ? x : log1pf(__expf(x)),
                              x > 20.f ? x : log1pf(expf(x))};
#pragma unroll
    for (int f = 0; f < kForms; ++f) G[f] += -ch.rate * sp[f] * kLog2e;
  }
#pragma unroll
  for (int f = 0; f < kForms; ++f) decay[f * kChannels + c] = exp2f(G[f]);
}

int main() {
  std::vector<Channel> channels(kChannels);
  for (int c = 0; c < kChannels; ++c) {
    const double rate = 1.0 + 15.0 * unit(0xa10900000000ull + c);
    const double dt = std::exp(std::log(1e-3) + (std::log(1e-1) - std::log(1e-3)) * unit(0xd7b1a5000000ull + c));
    channels[c] = {static_cast<float>(rate), static_cast<float>(std::log(std::expm1(dt)))};
  }
  Channel* d_channels = nullptr;
  float* d_decay = nullptr;
  CK(cudaMalloc(&d_channels, sizeof(Channel) * kChannels));
  CK(cudaMalloc(&d_decay, sizeof(float) * kForms * kChannels));
  CK(cudaMemcpy(d_channels, channels.data(), sizeof(Channel) * kChannels, cudaMemcpyHostToDevice));
  std::vector<float> decay(static_cast<std::size_t>(kForms) * kChannels);
  std::printf("tokens | softplus form | rms relative error of the decay | largest | channels keeping > 10%%\n");
  for (int tokens : {16, 63, 160, 512, 2100}) {
    decay_kernel<<<kChannels / 256, 256>>>(d_channels, tokens, d_decay);
    CK(cudaGetLastError());
    CK(cudaMemcpy(decay.data(), d_decay, sizeof(float) * decay.size(), cudaMemcpyDeviceToHost));
    std::vector<double> exact(kChannels);
    int kept = 0;
    for (int c = 0; c < kChannels; ++c) {
      double G = 0;  // natural log, f64, from the same f32 inputs the device sees
      for (int t = 0; t < tokens; ++t) {
        const double x = static_cast<double>(static_cast<float>(token_gate(c, t)) + channels[c].dt_bias);
        G -= static_cast<double>(channels[c].rate) * (x > 20.0 ? x : std::log1p(std::exp(x)));
      }
      exact[c] = std::exp(G);
      kept += exact[c] > 0.1;
    }
    for (int f = 0; f < kForms; ++f) {
      // Weighted by the exact decay: the error lands on what the initial state still holds.
      double sum_sq = 0, sum_w = 0, largest = 0;
      for (int c = 0; c < kChannels; ++c) {
        const double e = static_cast<double>(decay[static_cast<std::size_t>(f) * kChannels + c]) - exact[c];
        sum_sq += e * e;
        sum_w += exact[c] * exact[c];
        if (exact[c] > 0.1) largest = std::fmax(largest, std::fabs(e) / exact[c]);
      }
      std::printf("%6d | %-40s | %.3e | %.3e | %d\n", tokens, kFormNames[f], sum_w > 0 ? std::sqrt(sum_sq / sum_w) : 0.0,
                  largest, kept);
    }
  }
  CK(cudaFree(d_channels));
  CK(cudaFree(d_decay));
  return 0;
}
