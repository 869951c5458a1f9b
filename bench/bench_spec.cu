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

#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench_support.cuh"
#include "kdaguard/kda.h"
#include "recurrent_bench.cuh"

namespace {

using kdaguard::DType;
using kdaguard::TensorView;
using kdaguard::bench::Buffers;
using kdaguard::bench::DeviceBuffer;
using kdaguard::bench::device_view;
using kdaguard::bench::index_view;
using kdaguard::bench::random_buffer;
using kdaguard::bench::kH;
using kdaguard::bench::kHV;
using kdaguard::bench::kK;
using kdaguard::bench::kSlotElements;
using kdaguard::bench::kV;
using kdaguard::bench::RecurrentBuffers;

constexpr std::int64_t kRecordWidth = 2 * kK + kV;  // g | k | u

void BM_CopyCeiling(benchmark::State& state) { kdaguard::bench::copy_ceiling_benchmark(state); }

enum class Path { state, records, fused };

// The calls of one configuration, one step per slot set; rebuilt only when it changes.
struct Problem {
  Path path;
  int rows, T;
  DType state_dtype;
  int sets = 1;
  std::int64_t slot_bytes = 0;
  Buffers buffers;
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
  p->slot_bytes = kSlotElements * kdaguard::element_size(state_dtype);
  p->sets = kdaguard::bench::rotation_sets(rows, p->slot_bytes);
  const std::int64_t slots = std::int64_t{p->sets} * rows;
  const std::int64_t tokens = std::int64_t{rows} * T;
  const RecurrentBuffers t(p->buffers, tokens, slots, state_dtype);

  const std::vector<std::int64_t> all_slots = kdaguard::bench::shuffled_slot_sets(p->sets, rows);
  void* cache = p->buffers.indices(all_slots);
  std::vector<std::int64_t> cu(rows + 1);
  for (int n = 0; n <= rows; ++n) cu[n] = std::int64_t{n} * T;
  void* cu_d = p->buffers.indices(cu);
  p->accepted.resize(rows);
  for (int n = 0; n < rows; ++n) p->accepted[n] = 1 + n % T;
  void* accepted_d = p->buffers.indices(p->accepted);

  void* scratch = nullptr;
  std::vector<std::int64_t> identity(rows);
  std::iota(identity.begin(), identity.end(), 0);
  void* row_map = nullptr;
  if (path == Path::state) {
    scratch = p->buffers.keep(random_buffer(std::int64_t{rows} * T * kSlotElements, state_dtype, -1.f, 1.f, 10));
    row_map = p->buffers.indices(identity);
  }
  const std::vector<std::int64_t> record_shape{rows, T, kHV, kRecordWidth};
  const std::int64_t record_elems = std::int64_t{rows} * T * kHV * kRecordWidth;

  auto token_inputs = [&](auto& c) {
    c.device = {kdaguard::Device::Kind::cuda, 0};
    t.view_tokens(c, tokens);
    c.cu_seqlens = index_view({rows + 1}, cu_d, 0, cu);
    c.scalars.use_qk_l2norm = true;
    c.scalars.draft_token_num = T;
  };

  for (int s = 0; s < p->sets; ++s) {
    const std::int64_t offset = std::int64_t{s} * rows;
    const std::vector<std::int64_t> set_slots(all_slots.begin() + offset,
                                              all_slots.begin() + offset + rows);
    const TensorView cache_view = index_view({rows}, cache, offset, set_slots);
    const TensorView pool_view = device_view(state_dtype, {slots, kHV, kV, kK}, t.pool);
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
        void* records = p->buffers.keep(std::make_unique<DeviceBuffer>(record_elems * 4));
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
        void* prior = p->buffers.keep(std::make_unique<DeviceBuffer>(record_elems * 4));
        void* records = p->buffers.keep(std::make_unique<DeviceBuffer>(record_elems * 4));
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
        av.prior_records = *rv.records;
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
  const kdaguard::bench::Timed timed = kdaguard::bench::time_calls(
      state, p.options.stream, p.sets, 1, [&](int set) { return step(p, set); });
  if (!timed.ok) return;

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
  kdaguard::bench::set_bandwidth_counters(state, bytes, timed);
  state.counters["state_passes"] = passes;
  state.counters["us_per_step"] = 1e6 * timed.device / state.iterations();
  state.counters["host_us_per_step"] = 1e6 * timed.host / state.iterations();
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
  const int status = kdaguard::bench::run_benchmarks("bench_spec", argc, argv);
  g_problem.reset();
  return status;
}
