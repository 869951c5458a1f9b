// What the benchmarks of the recurrent entry points (bench_decode.cu: decode, verify, commit;
// bench_spec.cu: the speculative step three ways) share: their buffers, the slot sets they rotate
// over, the copy ceiling their counters relate to, the timing loop and the binary's main.
//
// Timing: manual time from CUDA events, a kHoldNs busy kernel before every start event (so the
// host's validation and launch are hidden behind it and the events time the device alone), pool
// slots rotating between iterations over sets spanning more than 8x the L2.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.cuh"
#include "kdaguard/kda.h"

namespace kdaguard::bench {

inline constexpr std::int64_t kRotateBytes = std::int64_t{512} << 20;  // > 8x the 60 MB L2
// hold_gpu's time before every start event: longer than the host work of any call or step here.
inline constexpr long long kHoldNs = 100000;
inline constexpr std::uint32_t kCopySeed = 7;  // the copy source's noise, in BM_CopyCeiling and main alike

// The copy ceiling of this run in TB/s, measured by run_benchmarks before any benchmark.
inline double g_copy_tbps = 0.0;

inline std::unique_ptr<DeviceBuffer> random_buffer(std::int64_t elements, DType t, float lo, float hi,
                                                   std::uint32_t seed) {
  auto b = std::make_unique<DeviceBuffer>(elements * element_size(t));
  fill_uniform(*b, elements, t, lo, hi, seed);
  return b;
}

// The device buffers of one benchmark configuration, freed with it.
struct Buffers {
  std::vector<std::unique_ptr<DeviceBuffer>> owned;

  void* keep(std::unique_ptr<DeviceBuffer> b) {
    owned.push_back(std::move(b));
    return owned.back()->ptr;
  }
  // The values as i32 on the device (at least 4 bytes, so an empty list still has an address).
  void* indices(const std::vector<std::int64_t>& values) {
    std::vector<std::int32_t> narrow(values.begin(), values.end());
    void* d = keep(std::make_unique<DeviceBuffer>(std::max<std::size_t>(4, narrow.size() * 4)));
    CHECK_CUDA(cudaMemcpy(d, narrow.data(), narrow.size() * 4, cudaMemcpyHostToDevice));
    return d;
  }
};

// An i32 index view at `offset` elements into `d`, with the host copy of its values when asked.
inline TensorView index_view(const std::vector<std::int64_t>& shape, const void* d, std::int64_t offset,
                             std::vector<std::int64_t> values, bool host_values = true) {
  TensorView v = device_view(DType::i32, shape, d, offset);
  if (host_values) v.values = std::move(values);
  return v;
}

// Slot sets of `rows` slots each that together span kRotateBytes (at least 2).
inline int rotation_sets(std::int64_t rows, std::int64_t slot_bytes) {
  return static_cast<int>(std::max<std::int64_t>(2, (kRotateBytes + rows * slot_bytes - 1) / (rows * slot_bytes)));
}

// The shape of every call here: Kimi-Linear's H = HV = 32, K = V = 128.
inline constexpr int kH = 32, kHV = 32, kK = 128, kV = 128;
inline constexpr std::int64_t kSlotElements = std::int64_t{kHV} * kV * kK;

// A call's tensors for `tokens` tokens (bf16 q, k, v, raw gate a, beta logits b; f32 A_log and
// dt_bias; the bf16 output) and a pool of `slots` slots, the inputs and the pool filled with the
// noise of fixed seeds.
struct RecurrentBuffers {
  static constexpr DType kIo = DType::bf16;
  void *q, *k, *v, *a, *b, *A_log, *dt_bias, *pool, *out;

  RecurrentBuffers(Buffers& owner, std::int64_t tokens, std::int64_t slots, DType state_dtype)
      : q(owner.keep(random_buffer(tokens * kH * kK, kIo, -1.f, 1.f, 1))),
        k(owner.keep(random_buffer(tokens * kH * kK, kIo, -1.f, 1.f, 2))),
        v(owner.keep(random_buffer(tokens * kHV * kV, kIo, -1.f, 1.f, 3))),
        a(owner.keep(random_buffer(tokens * kHV * kK, kIo, -3.f, 3.f, 4))),
        b(owner.keep(random_buffer(tokens * kHV, kIo, -3.f, 3.f, 5))),
        A_log(owner.keep(random_buffer(kHV, DType::f32, 0.f, 2.7f, 6))),
        dt_bias(owner.keep(random_buffer(kHV * kK, DType::f32, -1.f, 1.f, 8))),
        pool(owner.keep(random_buffer(slots * kSlotElements, state_dtype, -1.f, 1.f, 9))),
        out(owner.keep(std::make_unique<DeviceBuffer>(tokens * kHV * kV * 2))) {}

  // The token views of a call of `tokens` tokens over these buffers: q, k, v, a, b, A_log,
  // dt_bias, out.
  template <class Call>
  void view_tokens(Call& c, std::int64_t tokens) const {
    c.q = device_view(kIo, {tokens, kH, kK}, q);
    c.k = device_view(kIo, {tokens, kH, kK}, k);
    c.v = device_view(kIo, {tokens, kHV, kV}, v);
    c.a = device_view(kIo, {tokens, kHV, kK}, a);
    c.b = device_view(kIo, {tokens, kHV}, b);
    c.A_log = device_view(DType::f32, {kHV}, A_log);
    c.dt_bias = device_view(DType::f32, {kHV * kK}, dt_bias);
    c.out = device_view(kIo, {tokens, kHV, kV}, out);
  }
};

// The slots of `sets` sets of `rows` rows: set s owns slots [s * rows, (s + 1) * rows), in a
// shuffled order (the same for every run).
inline std::vector<std::int64_t> shuffled_slot_sets(int sets, int rows) {
  std::mt19937_64 rng(42);
  std::vector<std::int64_t> slots(std::int64_t{sets} * rows);
  std::iota(slots.begin(), slots.end(), 0);
  for (int s = 0; s < sets; ++s)
    std::shuffle(slots.begin() + std::int64_t{s} * rows, slots.begin() + std::int64_t{s + 1} * rows, rng);
  return slots;
}

// BM_CopyCeiling: the 2 GiB device-to-device copy, timed as the calls are.
inline void copy_ceiling_benchmark(benchmark::State& state) {
  const std::size_t bytes = CopyCeiling::kBytes;
  const CopyCeiling copy(kCopySeed);
  copy.median_seconds(2, kHoldNs);
  double total = 0;
  for (auto _ : state) {
    const double s = copy.median_seconds(1, kHoldNs);
    state.SetIterationTime(s);
    total += s;
  }
  state.counters["TBps"] = 2.0 * bytes * state.iterations() / total / 1e12;
  state.counters["bytes"] = 2.0 * bytes;
}

// Device and host seconds summed over the timed iterations, each the mean of its `calls`.
struct Timed {
  bool ok = false;
  double device = 0, host = 0;
};

// Three warm-up calls, then per iteration `calls` back-to-back calls of run(set), each on the
// next of `sets` slot sets, between a start and a stop event on `stream`. A refused warm-up call
// skips the benchmark with the refusal's text.
template <class Run>
Timed time_calls(benchmark::State& state, cudaStream_t stream, int sets, int calls, Run&& run) {
  Timed timed;
  int set = 0;
  for (int i = 0; i < 3; ++i) {
    const Status s = run(set);
    if (!s.ok()) {
      state.SkipWithError(to_string(s).c_str());
      return timed;
    }
    set = (set + 1) % sets;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (auto _ : state) {
    hold_gpu<<<1, 1, 0, stream>>>(kHoldNs);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventRecord(start, stream));
    const auto host_start = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) {
      run(set);
      set = (set + 1) % sets;
    }
    timed.host += std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start).count() / calls;
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    const double per_call = ms * 1e-3 / calls;
    state.SetIterationTime(per_call);
    timed.device += per_call;
  }
  CHECK_CUDA(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  timed.ok = true;
  return timed;
}

// bytes, TBps and pct_copy (of g_copy_tbps) for `bytes` moved per call in `timed`.
inline void set_bandwidth_counters(benchmark::State& state, double bytes, const Timed& timed) {
  const double tbps = bytes * state.iterations() / timed.device / 1e12;
  state.counters["bytes"] = bytes;
  state.counters["TBps"] = tbps;
  state.counters["pct_copy"] = g_copy_tbps > 0 ? 100.0 * tbps / g_copy_tbps : 0.0;
}

// The binary's main: nothing to measure without a device; else the copy ceiling first (so every
// counter can relate to it), the device in the JSON's context, then the benchmarks.
inline int run_benchmarks(const char* binary, int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("%s: no CUDA device, nothing to measure\n", binary);
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  {
    const CopyCeiling copy(kCopySeed);
    copy.median_seconds(3, kHoldNs);
    g_copy_tbps = 2.0 * CopyCeiling::kBytes / copy.median_seconds(15, kHoldNs) / 1e12;
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  benchmark::AddCustomContext("gpu", prop.name);
  benchmark::AddCustomContext("sm_count", std::to_string(prop.multiProcessorCount));
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
  benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
  benchmark::AddCustomContext("copy_ceiling_TBps", std::to_string(g_copy_tbps));
  std::printf("copy ceiling: %.3f TB/s (2 GiB device-to-device, read + written, median of 15)\n", g_copy_tbps);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace kdaguard::bench
