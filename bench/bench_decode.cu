// Decode, verify and commit benchmarks (performance.md): Kimi-Linear shape H = HV = 32,
// K = V = 128, bf16 inputs, raw gate with A_log and dt_bias, beta logits and the L2 norm in the
// kernel; f32 and bf16 state. Every call goes through the public entry point (validation
// included; host copies of the index values, so the device judges no value rule except in
// BM_DecodeGuarded).
//
// Floors: decode reads and writes each active state once (2 states per request), verify reads one
// and writes T (1 + T states per row), commit copies one (2 states per row). Counters: TBps is
// those bytes over the measured time; pct_copy relates it to BM_CopyCeiling, a device-to-device
// copy (bytes read + written) measured by this same binary before anything else.
//
// Timing: manual time from CUDA events. Each iteration uses another set of pool slots, and the
// sets together span more than 8x the L2, so no call finds its states in cache. A 100 us busy
// kernel precedes every start event, so the host's validation and launch of the first call
// overlap it and the events time the device work (the way calls queued behind earlier work run
// in a serving loop). Small decodes time a burst of calls back to back and report the time per
// call (the "us per call from C++" figure: when the host is slower than the device, the host
// bounds it); host_us_per_call is the host's own time per call.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "bench_support.cuh"
#include "kdaguard/kda.h"

namespace {

using kdaguard::DType;
using kdaguard::TensorView;
using kdaguard::bench::CopyCeiling;
using kdaguard::bench::DeviceBuffer;
using kdaguard::bench::device_view;
using kdaguard::bench::fill_uniform;
using kdaguard::bench::hold_gpu;

constexpr int kH = 32, kHV = 32, kK = 128, kV = 128;
constexpr std::int64_t kRotateBytes = std::int64_t{512} << 20;  // > 8x the 60 MB L2

// hold_gpu's time before every start event (bench_support.cuh): longer than the host work of any
// single call here.
constexpr long long kHoldNs = 100000;

std::unique_ptr<DeviceBuffer> random_buffer(std::int64_t elements, DType t, float lo, float hi,
                                            std::uint32_t seed) {
  auto b = std::make_unique<DeviceBuffer>(elements * kdaguard::element_size(t));
  fill_uniform(*b, elements, t, lo, hi, seed);
  return b;
}

// ---- the copy ceiling -----------------------------------------------------------------------------

double g_copy_tbps = 0.0;

constexpr std::uint32_t kCopySeed = 7;  // the copy source's noise, in BM_CopyCeiling and main alike

void BM_CopyCeiling(benchmark::State& state) {
  const std::size_t bytes = CopyCeiling::kBytes;
  const CopyCeiling copy(kCopySeed);
  copy.median_seconds(2, kHoldNs);
  double total = 0;
  for (auto _ : state) {
    const double s = copy.median_seconds(1, kHoldNs);
    state.SetIterationTime(s);
    total += s;
  }
  const double tbps = 2.0 * bytes * state.iterations() / total / 1e12;
  state.counters["TBps"] = tbps;
  state.counters["bytes"] = 2.0 * bytes;
}

// ---- recurrent problems ---------------------------------------------------------------------------

enum class Kind { decode, verify, commit };

// Buffers and calls for one benchmark configuration, rebuilt only when the configuration changes.
struct Problem {
  Kind kind;
  int rows, T;
  DType state_dtype;
  bool host_values;
  int sets = 1;
  std::int64_t slot_bytes = 0;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::vector<kdaguard::DecodeCall> decodes;
  std::vector<kdaguard::VerifyCall> verifies;
  std::vector<kdaguard::CommitCall> commits;
  kdaguard::gpu::LaunchOptions options;

  bool same(Kind k, int r, int t, DType s, bool hv) const {
    return kind == k && rows == r && T == t && state_dtype == s && host_values == hv;
  }
};

std::unique_ptr<Problem> g_problem;

void* keep(Problem& p, std::unique_ptr<DeviceBuffer> b) {
  p.buffers.push_back(std::move(b));
  return p.buffers.back()->ptr;
}

void* index_buffer(Problem& p, const std::vector<std::int64_t>& values) {
  std::vector<std::int32_t> narrow(values.begin(), values.end());
  void* d = keep(p, std::make_unique<DeviceBuffer>(std::max<std::size_t>(4, narrow.size() * 4)));
  CHECK_CUDA(cudaMemcpy(d, narrow.data(), narrow.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

TensorView index_view(const std::vector<std::int64_t>& shape, const void* d, std::int64_t offset,
                      std::vector<std::int64_t> values, bool host_values) {
  TensorView v = device_view(DType::i32, shape, d, offset);
  if (host_values) v.values = std::move(values);
  return v;
}

Problem& problem(Kind kind, int rows, int T, DType state_dtype, bool host_values) {
  if (g_problem && g_problem->same(kind, rows, T, state_dtype, host_values)) return *g_problem;
  g_problem.reset();
  CHECK_CUDA(cudaDeviceSynchronize());
  auto p = std::make_unique<Problem>();
  p->kind = kind;
  p->rows = rows;
  p->T = T;
  p->state_dtype = state_dtype;
  p->host_values = host_values;
  const std::int64_t slot_elems = std::int64_t{kHV} * kV * kK;
  p->slot_bytes = slot_elems * kdaguard::element_size(state_dtype);
  p->sets = static_cast<int>(
      std::max<std::int64_t>(2, (kRotateBytes + rows * p->slot_bytes - 1) / (rows * p->slot_bytes)));
  const std::int64_t slots = std::int64_t{p->sets} * rows;
  const int tokens_per_row = kind == Kind::decode ? 1 : T;
  const std::int64_t tokens = std::int64_t{rows} * tokens_per_row;
  const DType io = DType::bf16;

  void* q = keep(*p, random_buffer(tokens * kH * kK, io, -1.f, 1.f, 1));
  void* k = keep(*p, random_buffer(tokens * kH * kK, io, -1.f, 1.f, 2));
  void* v = keep(*p, random_buffer(tokens * kHV * kV, io, -1.f, 1.f, 3));
  void* a = keep(*p, random_buffer(tokens * kHV * kK, io, -3.f, 3.f, 4));
  void* b = keep(*p, random_buffer(tokens * kHV, io, -3.f, 3.f, 5));
  void* A_log = keep(*p, random_buffer(kHV, DType::f32, 0.f, 2.7f, 6));
  void* dt_bias = keep(*p, random_buffer(kHV * kK, DType::f32, -1.f, 1.f, 8));
  void* pool = keep(*p, random_buffer(slots * slot_elems, state_dtype, -1.f, 1.f, 9));
  void* out = keep(*p, std::make_unique<DeviceBuffer>(tokens * kHV * kV * 2));

  // Set s owns slots [s * rows, (s + 1) * rows), in a shuffled order.
  std::mt19937_64 rng(42);
  std::vector<std::int64_t> all_slots(slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  for (int s = 0; s < p->sets; ++s)
    std::shuffle(all_slots.begin() + std::int64_t{s} * rows,
                 all_slots.begin() + std::int64_t{s + 1} * rows, rng);
  void* cache = index_buffer(*p, all_slots);
  std::vector<std::int64_t> cu(rows + 1);
  for (int n = 0; n <= rows; ++n) cu[n] = std::int64_t{n} * tokens_per_row;
  void* cu_d = index_buffer(*p, cu);
  std::vector<std::int64_t> identity(rows);
  std::iota(identity.begin(), identity.end(), 0);
  void* row_map = index_buffer(*p, identity);
  void* scratch = nullptr;
  if (kind != Kind::decode)
    scratch = keep(*p, random_buffer(std::int64_t{rows} * T * slot_elems, state_dtype, -1.f, 1.f, 10));
  std::vector<std::int64_t> accepted(rows);
  for (int n = 0; n < rows; ++n) accepted[n] = 1 + n % T;
  void* accepted_d = kind == Kind::commit ? index_buffer(*p, accepted) : nullptr;

  for (int s = 0; s < p->sets; ++s) {
    const std::int64_t offset = std::int64_t{s} * rows;
    std::vector<std::int64_t> set_slots(all_slots.begin() + offset,
                                        all_slots.begin() + offset + rows);
    const TensorView cache_view = index_view({rows}, cache, offset, set_slots, host_values);
    const TensorView pool_view = device_view(state_dtype, {slots, kHV, kV, kK}, pool);
    if (kind == Kind::decode) {
      kdaguard::DecodeCall c;
      c.q = device_view(io, {rows, kH, kK}, q);
      c.k = device_view(io, {rows, kH, kK}, k);
      c.v = device_view(io, {rows, kHV, kV}, v);
      c.a = device_view(io, {rows, kHV, kK}, a);
      c.b = device_view(io, {rows, kHV}, b);
      c.A_log = device_view(DType::f32, {kHV}, A_log);
      c.dt_bias = device_view(DType::f32, {kHV * kK}, dt_bias);
      c.state = pool_view;
      c.cache_indices = cache_view;
      c.out = device_view(io, {rows, kHV, kV}, out);
      c.scalars.use_qk_l2norm = true;
      p->decodes.push_back(c);
    } else {
      const TensorView scratch_view = device_view(state_dtype, {rows, T, kHV, kV, kK}, scratch);
      const TensorView map_view = index_view({rows}, row_map, 0, identity, host_values);
      if (kind == Kind::verify) {
        kdaguard::VerifyCall c;
        c.q = device_view(io, {tokens, kH, kK}, q);
        c.k = device_view(io, {tokens, kH, kK}, k);
        c.v = device_view(io, {tokens, kHV, kV}, v);
        c.a = device_view(io, {tokens, kHV, kK}, a);
        c.b = device_view(io, {tokens, kHV}, b);
        c.A_log = device_view(DType::f32, {kHV}, A_log);
        c.dt_bias = device_view(DType::f32, {kHV * kK}, dt_bias);
        c.cu_seqlens = index_view({rows + 1}, cu_d, 0, cu, host_values);
        c.state = pool_view;
        c.cache_indices = cache_view;
        c.scratch = scratch_view;
        c.scratch_row_map = map_view;
        c.out = device_view(io, {tokens, kHV, kV}, out);
        c.scalars.use_qk_l2norm = true;
        c.scalars.draft_token_num = T;
        p->verifies.push_back(c);
      } else {
        kdaguard::CommitCall c;
        c.scratch = scratch_view;
        c.scratch_row_map = map_view;
        c.state = pool_view;
        c.cache_indices = cache_view;
        c.accepted = index_view({rows}, accepted_d, 0, accepted, host_values);
        c.scalars.draft_token_num = T;
        p->commits.push_back(c);
      }
    }
  }
  if (!host_values) {
    auto* word = static_cast<unsigned long long*>(keep(*p, std::make_unique<DeviceBuffer>(8)));
    CHECK_CUDA(cudaMemset(word, 0, 8));
    p->options.guard.error_word = word;
    p->options.guard.row_flags =
        static_cast<std::int32_t*>(keep(*p, std::make_unique<DeviceBuffer>(4 * rows)));
    p->options.guard.row_flags_capacity = rows;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  g_problem = std::move(p);
  return *g_problem;
}

kdaguard::Status call_set(Problem& p, int set) {
  switch (p.kind) {
    case Kind::decode: return kdaguard::gpu::decode(p.decodes[set], p.options);
    case Kind::verify: return kdaguard::gpu::verify(p.verifies[set], p.options);
    case Kind::commit: return kdaguard::gpu::commit(p.commits[set], p.options);
  }
  return kdaguard::Status::failed("unknown kind");
}

// Times `calls` back-to-back calls per iteration, each on the next slot set.
void run_timed(benchmark::State& state, Problem& p, int calls, double state_bytes_per_call) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  int set = 0;
  for (int i = 0; i < 3; ++i) {  // warm-up
    const kdaguard::Status s = call_set(p, set);
    if (!s.ok()) {
      state.SkipWithError(kdaguard::to_string(s).c_str());
      return;
    }
    set = (set + 1) % p.sets;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  double total = 0, host_total = 0;
  for (auto _ : state) {
    hold_gpu<<<1, 1, 0, p.options.stream>>>(kHoldNs);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventRecord(start, p.options.stream));
    const auto host_start = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) {
      call_set(p, set);
      set = (set + 1) % p.sets;
    }
    host_total += std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start)
                      .count() / calls;
    CHECK_CUDA(cudaEventRecord(stop, p.options.stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    const double per_call = ms * 1e-3 / calls;
    state.SetIterationTime(per_call);
    total += per_call;
  }
  CHECK_CUDA(cudaGetLastError());
  if (p.options.guard.error_word != nullptr) {
    unsigned long long word = 0;
    CHECK_CUDA(cudaMemcpy(&word, p.options.guard.error_word, 8, cudaMemcpyDeviceToHost));
    if (word != 0) state.SkipWithError("the device guard fired on a valid call");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const double tbps = state_bytes_per_call * state.iterations() / total / 1e12;
  state.counters["bytes"] = state_bytes_per_call;
  state.counters["TBps"] = tbps;
  state.counters["pct_copy"] = g_copy_tbps > 0 ? 100.0 * tbps / g_copy_tbps : 0.0;
  state.counters["us_per_call"] = 1e6 * total / state.iterations();
  // Host time of the entry point alone (validation, lowering, launch): when it is close to
  // us_per_call, back-to-back calls are bound by the host, not the device.
  state.counters["host_us_per_call"] = 1e6 * host_total / state.iterations();
}

DType state_dtype_arg(std::int64_t a) { return a == 0 ? DType::f32 : DType::bf16; }

// Args: B, state (0 f32, 1 bf16), chunks per warp (0: the persistent grid).
void BM_Decode(benchmark::State& state) {
  const int B = static_cast<int>(state.range(0));
  Problem& p = problem(Kind::decode, B, 1, state_dtype_arg(state.range(1)), true);
  p.options.chunks_per_block = static_cast<int>(state.range(2));
  run_timed(state, p, B <= 8 ? 20 : 1, 2.0 * B * p.slot_bytes);
}

// Args: B, state. Bursts of kBurstCalls back-to-back calls on different slot sets, timed as one:
// the time per call of a steady stream of decodes (one per layer in a serving step), where each
// call's launch overlaps the previous call's tail (programmatic dependent launch). BM_Decode's
// single call also times one launch and ramp, about 3.5 us at B = 64 (ncu's kernel duration
// there is 72.6 us against 76.2 us by events), which the stream pays once per burst.
constexpr int kBurstCalls = 8;
void BM_DecodeBurst(benchmark::State& state) {
  const int B = static_cast<int>(state.range(0));
  Problem& p = problem(Kind::decode, B, 1, state_dtype_arg(state.range(1)), true);
  run_timed(state, p, kBurstCalls, 2.0 * B * p.slot_bytes);
}

// The same with no host copies: the decode kernel judges every value rule of its rows on the
// device, in its prologue.
void BM_DecodeGuarded(benchmark::State& state) {
  const int B = static_cast<int>(state.range(0));
  Problem& p = problem(Kind::decode, B, 1, state_dtype_arg(state.range(1)), false);
  run_timed(state, p, B <= 8 ? 20 : 1, 2.0 * B * p.slot_bytes);
}

// Args: B, T, state, chunks per block (0 auto).
void BM_Verify(benchmark::State& state) {
  const int B = static_cast<int>(state.range(0)), T = static_cast<int>(state.range(1));
  Problem& p = problem(Kind::verify, B, T, state_dtype_arg(state.range(2)), true);
  p.options.chunks_per_block = static_cast<int>(state.range(3));
  run_timed(state, p, 1, (1.0 + T) * B * p.slot_bytes);
}

// Args: B, T, state. Every row accepts at least one token: one state copied per row.
void BM_Commit(benchmark::State& state) {
  const int B = static_cast<int>(state.range(0)), T = static_cast<int>(state.range(1));
  Problem& p = problem(Kind::commit, B, T, state_dtype_arg(state.range(2)), true);
  run_timed(state, p, 1, 2.0 * B * p.slot_bytes);
}

BENCHMARK(BM_CopyCeiling)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode)
    ->ArgNames({"B", "bf16_state", "chunks_per_block"})
    ->ArgsProduct({{1, 8, 64, 128, 256, 512}, {0, 1}, {0}})
    ->ArgsProduct({{64, 128, 256, 512}, {0, 1}, {4, 16, 32}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeBurst)
    ->ArgNames({"B", "bf16_state"})
    ->ArgsProduct({{64, 128, 256, 512}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeGuarded)
    ->ArgNames({"B", "bf16_state"})
    ->Args({1, 0})
    ->Args({64, 0})
    ->Args({256, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Verify)
    ->ArgNames({"B", "T", "bf16_state", "chunks_per_block"})
    ->ArgsProduct({{64, 256}, {2, 4, 8}, {0, 1}, {0}})
    ->ArgsProduct({{64}, {4}, {0, 1}, {1, 2, 4}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Commit)
    ->ArgNames({"B", "T", "bf16_state"})
    ->Args({64, 4, 0})
    ->Args({256, 4, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_decode: no CUDA device, nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  {
    // The ceiling first, so every counter can relate to it.
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
  std::printf("copy ceiling: %.3f TB/s (2 GiB device-to-device, read + written, median of 15)\n",
              g_copy_tbps);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_problem.reset();
  return 0;
}
