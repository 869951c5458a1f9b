// Prefill benchmarks (performance.md): K = V = 128, bf16 inputs, f32 state, raw gate with
// lower_bound -5, beta logits and the L2 norm in the kernel. Each timed call is what the entry
// point does (gpu::prefill): validate the call (host copies of the index values, so no guard
// kernel), lower it, take the workspace from the library's pool, launch the prepare and chain
// kernels, give the workspace back (stream ordered). The v4 figures in NOTES_prefill.md are of
// this binary; v1-v3's were taken with validate + lower + the launcher called directly.
// Shapes (issue 13): T = 8192, B = 1 at H in {12, 24, 32, 64, 96}; T in {32768, 65536, 131072}
// at H in {4, 12}; B = 2 at H in {12, 64}; T = 512; 10 ragged sequences summing to 8192 tokens. Manual time from CUDA events, median of repetitions; the device-to-device copy
// ceiling is measured by the same binary (BM_CopyCeiling). BM_PrefillF16: the same call with f16
// q, k, v, a, b and out, at T = 8192, B = 1, H in {12, 64}. BM_PrefillSoftplus: the unbounded
// softplus gate with bf16 or f16 inputs at the same shapes. BM_PrefillGVA: H = 16 q/k heads over
// HV = 32 value heads at T = 8192, B = 1; token-heads count value heads. BM_PrefillSpan: the
// chain's span length forced over a sweep of (T, H, B) shapes (-1: the model's choice).
#include <benchmark/benchmark.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <numeric>
#include <vector>

#include "bench_support.cuh"
#include "kdaguard/contracts/validate.h"
#include "kdaguard/kda.h"
#include "kdaguard/lower.h"
#include "prefill_launch.h"  // the launcher with a forced span length (BM_PrefillSpan)

namespace {

using kdaguard::Device;
using kdaguard::DType;
using kdaguard::TensorView;
using kdaguard::bench::CopyCeiling;
using kdaguard::bench::DeviceBuffer;
using kdaguard::bench::device_view;

// kdaguard::bench::fill_uniform for bf16, f16 or f32 buffers: f16 elements are the f32 draw rounded to nearest.
__global__ void f32_to_f16_kernel(const float* in, __half* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(in[i]);
}
void fill_input(const DeviceBuffer& b, std::int64_t n, DType dtype, float lo, float hi, std::uint32_t seed) {
  if (dtype != DType::f16) return kdaguard::bench::fill_uniform(b, n, dtype, lo, hi, seed);
  const DeviceBuffer draws(n * 4);
  kdaguard::bench::fill_uniform(draws, n, DType::f32, lo, hi, seed);
  f32_to_f16_kernel<<<1024, 256>>>(static_cast<const float*>(draws.ptr), static_cast<__half*>(b.ptr), n);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
}

// One prefill problem on the device and the call that describes it.
struct PrefillProblem {
  static constexpr int K = 128, V = 128;
  std::int64_t T = 0;
  int H = 0, HV = 0;  // q/k heads, value heads (HV = H, or a multiple: grouped value heads)
  std::vector<std::int64_t> cu;
  DeviceBuffer q, k, v, a, b, A_log, dt_bias, state, out, cu_dev, idx_dev;
  kdaguard::PrefillCall call;

  PrefillProblem(std::vector<std::int64_t> lens, int heads, DType io = DType::bf16, int value_heads = 0)
      : T(std::accumulate(lens.begin(), lens.end(), std::int64_t{0})),
        H(heads),
        HV(value_heads > 0 ? value_heads : heads),
        cu(offsets(lens)),
        q(T * H * K * 2), k(T * H * K * 2), v(T * HV * V * 2), a(T * HV * K * 2), b(T * HV * 2),
        A_log(HV * 4), dt_bias(HV * K * 4), state(lens.size() * HV * V * K * 4), out(T * HV * V * 2),
        cu_dev(cu.size() * 4), idx_dev(lens.size() * 4) {
    const auto N = static_cast<std::int64_t>(lens.size());
    fill_input(q, T * H * K, io, -1.f, 1.f, 1);
    fill_input(k, T * H * K, io, -1.f, 1.f, 2);
    fill_input(v, T * HV * V, io, -1.f, 1.f, 3);
    fill_input(a, T * HV * K, io, -4.f, 4.f, 4);
    fill_input(b, T * HV, io, -3.f, 3.f, 5);
    fill_input(A_log, HV, DType::f32, -0.5f, 0.5f, 6);
    fill_input(dt_bias, HV * K, DType::f32, -6.f, -2.f, 7);
    fill_input(state, N * HV * V * K, DType::f32, -0.1f, 0.1f, 8);
    std::vector<std::int32_t> cu32(cu.begin(), cu.end()), idx(static_cast<std::size_t>(N));
    std::iota(idx.begin(), idx.end(), 0);
    CHECK_CUDA(cudaMemcpy(cu_dev.ptr, cu32.data(), cu32.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(idx_dev.ptr, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));

    call.device = Device{Device::Kind::cuda, 0};
    call.q = device_view(io, {T, H, K}, q.ptr);
    call.k = device_view(io, {T, H, K}, k.ptr);
    call.v = device_view(io, {T, HV, V}, v.ptr);
    call.a = device_view(io, {T, HV, K}, a.ptr);
    call.b = device_view(io, {T, HV}, b.ptr);
    call.A_log = device_view(DType::f32, {HV}, A_log.ptr);
    call.dt_bias = device_view(DType::f32, {HV * K}, dt_bias.ptr);
    call.initial_state = device_view(DType::f32, {N, HV, V, K}, state.ptr);
    call.out = device_view(io, {T, HV, V}, out.ptr);
    call.cu_seqlens = device_view(DType::i32, {N + 1}, cu_dev.ptr);
    call.cu_seqlens->values = cu;
    call.initial_state_indices = device_view(DType::i32, {N}, idx_dev.ptr);
    call.initial_state_indices->values = std::vector<std::int64_t>(idx.begin(), idx.end());
    call.scalars.lower_bound = -5.0;
    call.scalars.use_qk_l2norm = true;
    CHECK_CUDA(cudaDeviceSynchronize());
  }

  static std::vector<std::int64_t> offsets(const std::vector<std::int64_t>& lens) {
    std::vector<std::int64_t> cu{0};
    for (std::int64_t l : lens) cu.push_back(cu.back() + l);
    return cu;
  }
};

// The public entry point; any refusal reads as an invalid value to the timing loop.
cudaError_t prefill(const kdaguard::PrefillCall& call) {
  const kdaguard::Status status = kdaguard::gpu::prefill(call);
  if (!status.ok()) std::fprintf(stderr, "prefill refused: %s\n", kdaguard::to_string(status).c_str());
  return status.ok() ? cudaSuccess : cudaErrorInvalidValue;
}

enum class Gate { bounded, softplus };

void run_prefill(benchmark::State& state, std::vector<std::int64_t> lens, int H, DType io = DType::bf16,
                 int HV = 0, Gate gate = Gate::bounded) {
  PrefillProblem p(std::move(lens), H, io, HV);
  if (gate == Gate::softplus) p.call.scalars.lower_bound.reset();
  if (!kdaguard::validate(p.call).accepted()) {
    state.SkipWithError(kdaguard::describe(kdaguard::validate(p.call)).c_str());
    return;
  }
  CHECK_CUDA(prefill(p.call));
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (auto _ : state) {
    CHECK_CUDA(cudaEventRecord(start));
    const cudaError_t launched = prefill(p.call);
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(launched);
    float ms = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms * 1e-3);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  // Token-heads count value heads: each (token, value head) is one step of one state.
  const double token_heads = static_cast<double>(p.T) * p.HV;
  state.counters["token_heads_per_s"] =
      benchmark::Counter(token_heads, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["T_tot"] = static_cast<double>(p.T);
  state.counters["H"] = H;
  state.counters["HV"] = p.HV;
}

void BM_Prefill(benchmark::State& state) {
  const std::int64_t T = state.range(0);
  const int H = static_cast<int>(state.range(1));
  const auto B = static_cast<std::size_t>(state.range(2));
  run_prefill(state, std::vector<std::int64_t>(B, T), H);
}

void BM_PrefillF16(benchmark::State& state) {
  run_prefill(state, std::vector<std::int64_t>(static_cast<std::size_t>(state.range(2)), state.range(0)),
              static_cast<int>(state.range(1)), DType::f16);
}

// The unbounded softplus gate (no lower_bound), bf16 or f16 inputs: its form in the prepare
// kernel (a log and an exp per token and channel) costs more than the bounded gate's.
void BM_PrefillSoftplus(benchmark::State& state) {
  run_prefill(state, std::vector<std::int64_t>(1, state.range(0)), static_cast<int>(state.range(1)),
              state.range(2) != 0 ? DType::f16 : DType::bf16, 0, Gate::softplus);
}

// The chain split at a forced span length, against the entry point's own choice (span -1) and no
// split (span 0): the measurements the span model (choose_chunks_per_span) is judged by. The
// call is validated once, outside the loop; each timed call lowers it and launches.
void BM_PrefillSpan(benchmark::State& state) {
  const std::int64_t T = state.range(0);
  const int H = static_cast<int>(state.range(1));
  const auto span = static_cast<std::int32_t>(state.range(2));
  const std::int64_t B = state.range(3);
  PrefillProblem p(std::vector<std::int64_t>(B, T / B), H);
  if (!kdaguard::validate(p.call).accepted()) {
    state.SkipWithError(kdaguard::describe(kdaguard::validate(p.call)).c_str());
    return;
  }
  const DeviceBuffer error_word(8);
  CHECK_CUDA(cudaMemset(error_word.ptr, 0, 8));
  const kdaguard::gpu::detail::GuardState guard{static_cast<unsigned long long*>(error_word.ptr)};
  const auto launch = [&] {
    return kdaguard::gpu::detail::launch_prefill_with_span(kdaguard::lower(p.call), guard, nullptr,
                                                           span < 0 ? kdaguard::gpu::detail::kChooseSpan : span);
  };
  CHECK_CUDA(launch());
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (auto _ : state) {
    CHECK_CUDA(cudaEventRecord(start));
    const cudaError_t launched = launch();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(launched);
    float ms = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms * 1e-3);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  unsigned long long faults = 0;
  CHECK_CUDA(cudaMemcpy(&faults, error_word.ptr, 8, cudaMemcpyDeviceToHost));
  if (faults != 0) state.SkipWithError("the kernels reported a fault on a valid call");
  state.counters["token_heads_per_s"] =
      benchmark::Counter(static_cast<double>(T) * H, benchmark::Counter::kIsIterationInvariantRate);
}

// Grouped value heads (GVA): H q/k heads shared by HV = 2H value heads, as in K3's H = 16,
// HV = 32 (per GPU at tensor parallelism 2).
void BM_PrefillGVA(benchmark::State& state) {
  run_prefill(state, std::vector<std::int64_t>(1, state.range(0)), static_cast<int>(state.range(1)),
              DType::bf16, static_cast<int>(state.range(2)));
}

// 10 ragged sequences summing to 8192.
void BM_PrefillRagged(benchmark::State& state) {
  run_prefill(state, {1500, 37, 900, 1, 2048, 640, 113, 1200, 753, 1000},
              static_cast<int>(state.range(0)));
}

// The bandwidth ceiling of this GPU in this run: a 2 GiB device-to-device copy, timed as the
// prefill calls are (nothing held before the start event).
void BM_CopyCeiling(benchmark::State& state) {
  const CopyCeiling copy(9);
  for (auto _ : state) state.SetIterationTime(copy.median_seconds(1, 0));
  state.counters["TB_per_s"] = benchmark::Counter(2.0 * CopyCeiling::kBytes * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

// Every prefill benchmark's timing: CUDA-event time, ms, the median of 5 repetitions reported.
void timed_calls(benchmark::internal::Benchmark* b) {
  b->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->MinWarmUpTime(0.05)
      ->MinTime(0.1)
      ->Repetitions(5)
      ->ReportAggregatesOnly(true);
}

BENCHMARK(BM_CopyCeiling)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(20);
BENCHMARK(BM_Prefill)
    ->Args({8192, 12, 1})->Args({8192, 24, 1})->Args({8192, 32, 1})->Args({8192, 64, 1})->Args({8192, 96, 1})
    ->Args({32768, 4, 1})->Args({32768, 12, 1})->Args({65536, 4, 1})->Args({65536, 12, 1})
    ->Args({131072, 4, 1})->Args({131072, 12, 1})
    ->Args({8192, 12, 2})->Args({8192, 64, 2})->Args({512, 32, 1})
    ->ArgNames({"T", "H", "B"})
    ->Apply(timed_calls);
BENCHMARK(BM_PrefillF16)
    ->Args({8192, 12, 1})->Args({8192, 64, 1})
    ->ArgNames({"T", "H", "B"})
    ->Apply(timed_calls);
BENCHMARK(BM_PrefillSoftplus)
    ->Args({8192, 12, 0})->Args({8192, 64, 0})->Args({8192, 12, 1})->Args({8192, 64, 1})
    ->ArgNames({"T", "H", "f16"})
    ->Apply(timed_calls);
BENCHMARK(BM_PrefillGVA)
    ->Args({8192, 16, 32})
    ->ArgNames({"T", "H", "HV"})
    ->Apply(timed_calls);
// The span sweep: (T, H, B) shapes from short batched prefills to one long sequence, each at the
// model's span (-1), unsplit (0) and forced span lengths; the points choose_chunks_per_span is
// fitted to (bench/NOTES_prefill.md).
void span_sweep(benchmark::internal::Benchmark* b) {
  const std::int64_t shapes[][3] = {{2048, 12, 1}, {2048, 64, 1}, {8192, 4, 1},  {8192, 12, 1},
                                    {8192, 24, 1}, {8192, 32, 1}, {8192, 64, 1}, {32768, 4, 1},
                                    {32768, 12, 1}, {32768, 32, 1}, {65536, 4, 1}, {65536, 12, 1},
                                    {8192, 12, 4}, {8192, 32, 8}};
  for (const auto& s : shapes)
    for (std::int64_t span : {-1, 0, 4, 8, 16, 32, 64, 128, 256}) b->Args({s[0], s[1], span, s[2]});
}
BENCHMARK(BM_PrefillSpan)
    ->Apply(span_sweep)
    ->ArgNames({"T", "H", "span", "B"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinWarmUpTime(0.02)
    ->MinTime(0.05)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_PrefillRagged)
    ->ArgsProduct({{12, 64}})
    ->ArgNames({"H"})
    ->Apply(timed_calls);
BENCHMARK_MAIN();
