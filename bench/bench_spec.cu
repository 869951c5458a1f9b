// One speculative step per iteration, three ways (issue 14; contracts/NOTES.md, the record-based
// path), on bench_decode's shape: H = HV = 32, K = V = 128, bf16 inputs, raw gate with A_log and
// dt_bias, beta logits and the L2 norm in the kernel; f32 and bf16 state.
//   BM_SpecStepState:   verify (state after every step to scratch) + commit (accepted step's
//                       scratch state copied to the slot): today's path.
//   BM_SpecStepRecords: record_verify (records g | k | u instead of states) + replay_commit
//                       (the accepted records replayed onto the slot, written once).
//   BM_SpecStepFused:   accept_verify (the previous step's accepted records replayed onto the
//                       slot and written back in place, then the new draft verified into records).
// Every row of every path accepts 1 + n % T steps (the previous step's count for the fused path),
// as BM_Commit.
//
// Counters: state_passes is the states per row a step must move (verify + commit: 1 + T read and
// written by verify, 2 by commit; records: 1 read by record_verify, 2 by replay_commit; fused: 2);
// bytes is those states plus the record bytes the step writes and reads; TBps and pct_copy relate
// bytes to the time and to BM_CopyCeiling, measured by this binary before anything else, as in
// bench_decode. record_bytes_per_row and scratch_bytes_per_row are the memory per row each path
// needs besides the pool (the fused path keeps two record buffers: the previous step's and the
// new one). The figure issue 14 judges is the ratio of the paths' times in one run, which
// compare_baselines.py prints (--steps).
//
// Timing as bench_decode: manual time from CUDA events, a 100 us busy kernel before every start
// event, pool slots rotating between iterations over sets spanning more than 8x the L2, host
// copies of the index values (no guard kernel). Each set also has its own record buffers, so a
// step finds in L2 only what the same step wrote (replay_commit's records, some of which
// record_verify has just written; verify + commit's scratch is 8x larger than the L2).
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
constexpr std::int64_t kRecordWidth = 2 * kK + kV;                // g | k | u
constexpr std::int64_t kRotateBytes = std::int64_t{512} << 20;  // > 8x the 60 MB L2
constexpr long long kHoldNs = 100000;  // longer than the host work of any step here
constexpr std::uint32_t kCopySeed = 7;  // as bench_decode

double g_copy_tbps = 0.0;

void BM_CopyCeiling(benchmark::State& state) {
  const CopyCeiling copy(kCopySeed);
  copy.median_seconds(2, kHoldNs);
  double total = 0;
  for (auto _ : state) {
    const double s = copy.median_seconds(1, kHoldNs);
    state.SetIterationTime(s);
    total += s;
  }
  state.counters["TBps"] = 2.0 * CopyCeiling::kBytes * state.iterations() / total / 1e12;
  state.counters["bytes"] = 2.0 * CopyCeiling::kBytes;
}

enum class Path { state, records, fused };

std::unique_ptr<DeviceBuffer> random_buffer(std::int64_t elements, DType t, float lo, float hi,
                                            std::uint32_t seed) {
  auto b = std::make_unique<DeviceBuffer>(elements * kdaguard::element_size(t));
  fill_uniform(*b, elements, t, lo, hi, seed);
  return b;
}

// The calls of one configuration, one step per slot set; rebuilt only when it changes.
struct Problem {
  Path path;
  int rows, T;
  DType state_dtype;
  int sets = 1;
  std::int64_t slot_bytes = 0;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::vector<kdaguard::VerifyCall> verifies;
  std::vector<kdaguard::CommitCall> commits;
  std::vector<kdaguard::RecordVerifyCall> record_verifies;
  std::vector<kdaguard::ReplayCommitCall> replays;
  std::vector<kdaguard::AcceptVerifyCall> accepts;
  std::vector<std::int64_t> accepted;  // per row, for the counters
  kdaguard::gpu::LaunchOptions options;

  bool same(Path p, int r, int t, DType s) const {
    return path == p && rows == r && T == t && state_dtype == s;
  }
  std::int64_t record_bytes_per_step() const { return std::int64_t{kHV} * kRecordWidth * 4; }
  std::int64_t accepted_total() const {
    return std::accumulate(accepted.begin(), accepted.end(), std::int64_t{0});
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
                      std::vector<std::int64_t> values) {
  TensorView v = device_view(DType::i32, shape, d, offset);
  v.values = std::move(values);
  return v;
}

void check(const kdaguard::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_spec: %s refused: %s\n", what, kdaguard::to_string(s).c_str());
    std::exit(1);
  }
}

Problem& problem(Path path, int rows, int T, DType state_dtype) {
  if (g_problem && g_problem->same(path, rows, T, state_dtype)) return *g_problem;
  g_problem.reset();
  CHECK_CUDA(cudaDeviceSynchronize());
  auto p = std::make_unique<Problem>();
  p->path = path;
  p->rows = rows;
  p->T = T;
  p->state_dtype = state_dtype;
  const std::int64_t slot_elems = std::int64_t{kHV} * kV * kK;
  p->slot_bytes = slot_elems * kdaguard::element_size(state_dtype);
  p->sets = static_cast<int>(
      std::max<std::int64_t>(2, (kRotateBytes + rows * p->slot_bytes - 1) / (rows * p->slot_bytes)));
  const std::int64_t slots = std::int64_t{p->sets} * rows;
  const std::int64_t tokens = std::int64_t{rows} * T;
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

  std::mt19937_64 rng(42);
  std::vector<std::int64_t> all_slots(slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  for (int s = 0; s < p->sets; ++s)
    std::shuffle(all_slots.begin() + std::int64_t{s} * rows,
                 all_slots.begin() + std::int64_t{s + 1} * rows, rng);
  void* cache = index_buffer(*p, all_slots);
  std::vector<std::int64_t> cu(rows + 1);
  for (int n = 0; n <= rows; ++n) cu[n] = std::int64_t{n} * T;
  void* cu_d = index_buffer(*p, cu);
  p->accepted.resize(rows);
  for (int n = 0; n < rows; ++n) p->accepted[n] = 1 + n % T;
  void* accepted_d = index_buffer(*p, p->accepted);

  void* scratch = nullptr;
  std::vector<std::int64_t> identity(rows);
  std::iota(identity.begin(), identity.end(), 0);
  void* row_map = nullptr;
  if (path == Path::state) {
    scratch = keep(*p, random_buffer(std::int64_t{rows} * T * slot_elems, state_dtype, -1.f, 1.f, 10));
    row_map = index_buffer(*p, identity);
  }
  const std::vector<std::int64_t> record_shape{rows, T, kHV, kRecordWidth};
  const std::int64_t record_elems = std::int64_t{rows} * T * kHV * kRecordWidth;

  auto token_inputs = [&](auto& c) {
    c.device = {kdaguard::Device::Kind::cuda, 0};
    c.q = device_view(io, {tokens, kH, kK}, q);
    c.k = device_view(io, {tokens, kH, kK}, k);
    c.v = device_view(io, {tokens, kHV, kV}, v);
    c.a = device_view(io, {tokens, kHV, kK}, a);
    c.b = device_view(io, {tokens, kHV}, b);
    c.A_log = device_view(DType::f32, {kHV}, A_log);
    c.dt_bias = device_view(DType::f32, {kHV * kK}, dt_bias);
    c.cu_seqlens = index_view({rows + 1}, cu_d, 0, cu);
    c.out = device_view(io, {tokens, kHV, kV}, out);
    c.scalars.use_qk_l2norm = true;
    c.scalars.draft_token_num = T;
  };

  for (int s = 0; s < p->sets; ++s) {
    const std::int64_t offset = std::int64_t{s} * rows;
    const std::vector<std::int64_t> set_slots(all_slots.begin() + offset,
                                              all_slots.begin() + offset + rows);
    const TensorView cache_view = index_view({rows}, cache, offset, set_slots);
    const TensorView pool_view = device_view(state_dtype, {slots, kHV, kV, kK}, pool);
    const TensorView accepted_view = index_view({rows}, accepted_d, 0, p->accepted);
    switch (path) {
      case Path::state: {
        kdaguard::VerifyCall vc;
        token_inputs(vc);
        vc.state = pool_view;
        vc.cache_indices = cache_view;
        vc.scratch = device_view(state_dtype, {rows, T, kHV, kV, kK}, scratch);
        vc.scratch_row_map = index_view({rows}, row_map, 0, identity);
        p->verifies.push_back(vc);
        kdaguard::CommitCall cc;
        cc.device = vc.device;
        cc.scratch = *vc.scratch;
        cc.scratch_row_map = *vc.scratch_row_map;
        cc.state = pool_view;
        cc.cache_indices = cache_view;
        cc.accepted = accepted_view;
        cc.scalars.draft_token_num = T;
        p->commits.push_back(cc);
        break;
      }
      case Path::records: {
        void* records = keep(*p, std::make_unique<DeviceBuffer>(record_elems * 4));
        kdaguard::RecordVerifyCall rv;
        token_inputs(rv);
        rv.state = pool_view;
        rv.cache_indices = cache_view;
        rv.records = device_view(DType::f32, record_shape, records);
        p->record_verifies.push_back(rv);
        kdaguard::ReplayCommitCall rc;
        rc.device = rv.device;
        rc.records = *rv.records;
        rc.state = pool_view;
        rc.cache_indices = cache_view;
        rc.accepted = accepted_view;
        rc.scalars.draft_token_num = T;
        p->replays.push_back(rc);
        // Real records before the first timed replay (the buffer is uninitialised otherwise).
        check(kdaguard::gpu::record_verify(rv, p->options), "record_verify (setup)");
        break;
      }
      case Path::fused: {
        // The previous step's records: written once here by a real record_verify of the set's
        // slots, replayed by every fused step of the set (each step also writes its new draft's
        // records, into the other buffer, as a serving loop alternates them).
        void* prior = keep(*p, std::make_unique<DeviceBuffer>(record_elems * 4));
        void* records = keep(*p, std::make_unique<DeviceBuffer>(record_elems * 4));
        kdaguard::RecordVerifyCall rv;
        token_inputs(rv);
        rv.state = pool_view;
        rv.cache_indices = cache_view;
        rv.records = device_view(DType::f32, record_shape, prior);
        check(kdaguard::gpu::record_verify(rv, p->options), "record_verify (setup)");
        kdaguard::AcceptVerifyCall av;
        token_inputs(av);
        av.state = pool_view;
        av.cache_indices = cache_view;
        av.prior_records = device_view(DType::f32, record_shape, prior);
        av.prior_accepted = accepted_view;
        av.records = device_view(DType::f32, record_shape, records);
        p->accepts.push_back(av);
        break;
      }
    }
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  g_problem = std::move(p);
  return *g_problem;
}

// One speculative step on slot set `set`: the path's call or calls.
kdaguard::Status step(Problem& p, int set) {
  switch (p.path) {
    case Path::state: {
      const kdaguard::Status s = kdaguard::gpu::verify(p.verifies[set], p.options);
      return s.ok() ? kdaguard::gpu::commit(p.commits[set], p.options) : s;
    }
    case Path::records: {
      const kdaguard::Status s = kdaguard::gpu::record_verify(p.record_verifies[set], p.options);
      return s.ok() ? kdaguard::gpu::replay_commit(p.replays[set], p.options) : s;
    }
    case Path::fused: return kdaguard::gpu::accept_verify(p.accepts[set], p.options);
  }
  return kdaguard::Status::failed("unknown path");
}

void run_steps(benchmark::State& state, Path path) {
  const int B = static_cast<int>(state.range(0)), T = static_cast<int>(state.range(1));
  Problem& p = problem(path, B, T, state.range(2) == 0 ? DType::f32 : DType::bf16);
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  int set = 0;
  for (int i = 0; i < 3; ++i) {  // warm-up
    const kdaguard::Status s = step(p, set);
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
    step(p, set);
    host_total += std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start).count();
    set = (set + 1) % p.sets;
    CHECK_CUDA(cudaEventRecord(stop, p.options.stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms * 1e-3);
    total += ms * 1e-3;
  }
  CHECK_CUDA(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);

  const double state_bytes = static_cast<double>(B) * p.slot_bytes;
  const double record_step = static_cast<double>(p.record_bytes_per_step());
  double passes = 0, record_bytes = 0, record_per_row = 0, scratch_per_row = 0;
  switch (path) {
    case Path::state:
      passes = 1.0 + T + 2.0;
      scratch_per_row = static_cast<double>(T) * p.slot_bytes;
      break;
    case Path::records:  // written: T steps per row; read back: the accepted ones
      passes = 3.0;
      record_bytes = record_step * (static_cast<double>(B) * T + p.accepted_total());
      record_per_row = record_step * T;
      break;
    case Path::fused:  // read: the previous step's accepted ones; written: T steps per row
      passes = 2.0;
      record_bytes = record_step * (static_cast<double>(B) * T + p.accepted_total());
      record_per_row = 2.0 * record_step * T;
      break;
  }
  const double bytes = passes * state_bytes + record_bytes;
  const double tbps = bytes * state.iterations() / total / 1e12;
  state.counters["state_passes"] = passes;
  state.counters["bytes"] = bytes;
  state.counters["TBps"] = tbps;
  state.counters["pct_copy"] = g_copy_tbps > 0 ? 100.0 * tbps / g_copy_tbps : 0.0;
  state.counters["us_per_step"] = 1e6 * total / state.iterations();
  state.counters["host_us_per_step"] = 1e6 * host_total / state.iterations();
  state.counters["record_bytes_per_row"] = record_per_row;
  state.counters["scratch_bytes_per_row"] = scratch_per_row;
}

// Args: B, T, state (0 f32, 1 bf16).
void BM_SpecStepState(benchmark::State& state) { run_steps(state, Path::state); }
void BM_SpecStepRecords(benchmark::State& state) { run_steps(state, Path::records); }
void BM_SpecStepFused(benchmark::State& state) { run_steps(state, Path::fused); }

BENCHMARK(BM_CopyCeiling)->UseManualTime()->Unit(benchmark::kMicrosecond);
#define KDAGUARD_STEP_SHAPES(fn)                                                               \
  BENCHMARK(fn)                                                                                \
      ->ArgNames({"B", "T", "bf16_state"})                                                     \
      ->ArgsProduct({{64, 256}, {2, 4, 8}, {0, 1}})                                            \
      ->UseManualTime()                                                                        \
      ->Unit(benchmark::kMicrosecond)
KDAGUARD_STEP_SHAPES(BM_SpecStepState);
KDAGUARD_STEP_SHAPES(BM_SpecStepRecords);
KDAGUARD_STEP_SHAPES(BM_SpecStepFused);

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_spec: no CUDA device, nothing to measure\n");
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
  std::printf("copy ceiling: %.3f TB/s (2 GiB device-to-device, read + written, median of 15)\n",
              g_copy_tbps);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_problem.reset();
  return 0;
}
