// Host time of one B = 1 decode through kda.h: the C++ side of bench/torch_overhead.py, which
// times the same call through the PyTorch op and kdaguard.ops.decode in the same run, so the
// difference is the binding's own cost.
//
// The call is the one that script makes, view for view: H = 2, HV = 8, K = V = 128; bf16 q, k, v
// sliced from one packed projection [B, 2*H*K + HV*V]; a raw gate a [B, HV, K] with A_log [HV]
// and dt_bias [HV*K] in f32, beta logits b [B, HV], the L2 norm in the kernel; an f32 envelope
// pool of 32 slots (slot stride HV*V*K + 64); the index values only on the device, so the guard
// kernel runs before the decode kernel, with a persistent error word and row flags (what a C++
// engine keeps; the binding takes row flags per call). Every view carries its allocation's base
// address and size, as the binding's do.
//
// Timing: host time only (steady_clock around a burst of kBurst calls, reported per call); the
// stream is drained between bursts, outside the timed region, so no launch waits for queue space.
// Run with --benchmark_repetitions and read the medians.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench_support.cuh"
#include "kdaguard/kda.h"

namespace {

using kdaguard::DType;
using kdaguard::TensorView;
using kdaguard::bench::DeviceBuffer;
using kdaguard::bench::device_view;
using kdaguard::bench::fill_uniform;

constexpr std::int64_t kB = 1, kH = 2, kHV = 8, kK = 128, kV = 128, kSlots = 32;
constexpr std::int64_t kSlotStride = kHV * kV * kK + 64;
constexpr int kBurst = 100;

struct Problem {
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  kdaguard::DecodeCall call;
  kdaguard::gpu::LaunchOptions options;

  const DeviceBuffer& buffer(std::int64_t elements, DType t, float lo, float hi,
                             std::uint32_t seed) {
    buffers.push_back(std::make_unique<DeviceBuffer>(elements * kdaguard::element_size(t)));
    fill_uniform(*buffers.back(), elements, t, lo, hi, seed);
    return *buffers.back();
  }

  Problem() {
    const std::int64_t row = 2 * kH * kK + kHV * kV;
    const DeviceBuffer& mixed = buffer(kB * row, DType::bf16, -1.f, 1.f, 1);
    call.q = device_view(DType::bf16, {kB, kH, kK}, mixed.ptr, 0, {row, kK, 1}, kB * row);
    call.k = device_view(DType::bf16, {kB, kH, kK}, mixed.ptr, kH * kK, {row, kK, 1}, kB * row);
    call.v = device_view(DType::bf16, {kB, kHV, kV}, mixed.ptr, 2 * kH * kK, {row, kV, 1},
                         kB * row);
    const DeviceBuffer& a = buffer(kB * kHV * kK, DType::bf16, -1.f, 1.f, 2);
    call.a = device_view(DType::bf16, {kB, kHV, kK}, a.ptr, 0, {kHV * kK, kK, 1}, kB * kHV * kK);
    const DeviceBuffer& A_log = buffer(kHV, DType::f32, -0.5f, 0.5f, 3);
    call.A_log = device_view(DType::f32, {kHV}, A_log.ptr, 0, {1}, kHV);
    const DeviceBuffer& dt_bias = buffer(kHV * kK, DType::f32, -0.1f, 0.1f, 4);
    call.dt_bias = device_view(DType::f32, {kHV * kK}, dt_bias.ptr, 0, {1}, kHV * kK);
    const DeviceBuffer& b = buffer(kB * kHV, DType::bf16, -1.f, 1.f, 5);
    call.b = device_view(DType::bf16, {kB, kHV}, b.ptr, 0, {kHV, 1}, kB * kHV);
    const DeviceBuffer& pool = buffer(kSlots * kSlotStride, DType::f32, -0.1f, 0.1f, 6);
    call.state = device_view(DType::f32, {kSlots, kHV, kV, kK}, pool.ptr, 0,
                             {kSlotStride, kV * kK, kK, 1}, kSlots * kSlotStride);
    buffers.push_back(std::make_unique<DeviceBuffer>(kB * sizeof(std::int32_t)));
    const std::int32_t slot = 5;
    CHECK_CUDA(cudaMemcpy(buffers.back()->ptr, &slot, sizeof slot, cudaMemcpyHostToDevice));
    call.cache_indices = device_view(DType::i32, {kB}, buffers.back()->ptr, 0, {1}, kB);
    const DeviceBuffer& out = buffer(kB * kHV * kV, DType::bf16, 0.f, 0.f, 7);
    call.out = device_view(DType::bf16, {kB, kHV, kV}, out.ptr, 0, {kHV * kV, kV, 1},
                           kB * kHV * kV);
    call.scalars.use_qk_l2norm = true;
    call.device = kdaguard::Device{kdaguard::Device::Kind::cuda, 0};

    buffers.push_back(std::make_unique<DeviceBuffer>(sizeof(unsigned long long)));
    CHECK_CUDA(cudaMemset(buffers.back()->ptr, 0, sizeof(unsigned long long)));
    options.guard.error_word = static_cast<unsigned long long*>(buffers.back()->ptr);
    buffers.push_back(std::make_unique<DeviceBuffer>(kB * sizeof(std::int32_t)));
    options.guard.row_flags = static_cast<std::int32_t*>(buffers.back()->ptr);
    options.guard.row_flags_capacity = kB;
    CHECK_CUDA(cudaDeviceSynchronize());
  }

  unsigned long long error_word() const {
    unsigned long long word = 0;
    CHECK_CUDA(cudaMemcpy(&word, options.guard.error_word, sizeof word, cudaMemcpyDeviceToHost));
    return word;
  }
};

// Times `call` (returning a Status) in bursts; per-call host time is the iteration's manual time.
template <class Call> void time_bursts(benchmark::State& state, Call&& call) {
  for (int i = 0; i < 3; ++i) {
    if (const kdaguard::Status s = call(); !s.ok()) {
      state.SkipWithError(kdaguard::to_string(s).c_str());
      return;
    }
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  bool all_ok = true;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < kBurst; ++c) all_ok &= call().ok();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds / kBurst);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  if (!all_ok) state.SkipWithError("a timed call was refused or failed");
}

// gpu::decode: validation, lowering, the guard kernel and the decode kernel.
void BM_DecodeHost(benchmark::State& state) {
  Problem p;
  time_bursts(state, [&] { return kdaguard::gpu::decode(p.call, p.options); });
  if (p.error_word() != 0) state.SkipWithError("the device guard fired on a valid call");
}

// gpu::can_implement: the same validation and device checks, nothing launched (the C++ side of
// torch.ops.kdaguard.can_decode).
void BM_CanImplementHost(benchmark::State& state) {
  Problem p;
  time_bursts(state, [&] { return kdaguard::gpu::can_implement(p.call); });
}

// kBursts bursts per repetition, as bench/torch_overhead.py times its calls (the manual time is
// per call, so a minimum time would ask for a hundred times as many calls as it says).
constexpr int kBursts = 20;
BENCHMARK(BM_DecodeHost)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(kBursts);
BENCHMARK(BM_CanImplementHost)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(kBursts);

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_decode_host: no CUDA device, nothing to measure\n");
    return 0;
  }
  CHECK_CUDA(cudaSetDevice(0));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
