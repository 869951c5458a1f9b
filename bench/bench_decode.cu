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

#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
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

void BM_CopyCeiling(benchmark::State& state) { kdaguard::bench::copy_ceiling_benchmark(state); }

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
  Buffers buffers;
  std::vector<kdaguard::DecodeCall> decodes;
  std::vector<kdaguard::VerifyCall> verifies;
  std::vector<kdaguard::CommitCall> commits;
  kdaguard::gpu::LaunchOptions options;

  bool same(Kind k, int r, int t, DType s, bool hv) const {
    return kind == k && rows == r && T == t && state_dtype == s && host_values == hv;
  }
};

std::unique_ptr<Problem> g_problem;

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
  p->slot_bytes = kSlotElements * kdaguard::element_size(state_dtype);
  p->sets = kdaguard::bench::rotation_sets(rows, p->slot_bytes);
  const std::int64_t slots = std::int64_t{p->sets} * rows;
  const int tokens_per_row = kind == Kind::decode ? 1 : T;
  const std::int64_t tokens = std::int64_t{rows} * tokens_per_row;
  const RecurrentBuffers t(p->buffers, tokens, slots, state_dtype);

  const std::vector<std::int64_t> all_slots = kdaguard::bench::shuffled_slot_sets(p->sets, rows);
  void* cache = p->buffers.indices(all_slots);
  std::vector<std::int64_t> cu(rows + 1);
  for (int n = 0; n <= rows; ++n) cu[n] = std::int64_t{n} * tokens_per_row;
  void* cu_d = p->buffers.indices(cu);
  std::vector<std::int64_t> identity(rows);
  std::iota(identity.begin(), identity.end(), 0);
  void* row_map = p->buffers.indices(identity);
  void* scratch = nullptr;
  if (kind != Kind::decode)
    scratch = p->buffers.keep(random_buffer(std::int64_t{rows} * T * kSlotElements, state_dtype, -1.f, 1.f, 10));
  std::vector<std::int64_t> accepted(rows);
  for (int n = 0; n < rows; ++n) accepted[n] = 1 + n % T;
  void* accepted_d = kind == Kind::commit ? p->buffers.indices(accepted) : nullptr;

  for (int s = 0; s < p->sets; ++s) {
    const std::int64_t offset = std::int64_t{s} * rows;
    std::vector<std::int64_t> set_slots(all_slots.begin() + offset,
                                        all_slots.begin() + offset + rows);
    const TensorView cache_view = index_view({rows}, cache, offset, set_slots, host_values);
    const TensorView pool_view = device_view(state_dtype, {slots, kHV, kV, kK}, t.pool);
    if (kind == Kind::decode) {
      kdaguard::DecodeCall c;
      t.view_tokens(c, rows);
      c.state = pool_view;
      c.cache_indices = cache_view;
      c.scalars.use_qk_l2norm = true;
      p->decodes.push_back(c);
    } else {
      const TensorView scratch_view = device_view(state_dtype, {rows, T, kHV, kV, kK}, scratch);
      const TensorView map_view = index_view({rows}, row_map, 0, identity, host_values);
      if (kind == Kind::verify) {
        kdaguard::VerifyCall c;
        t.view_tokens(c, tokens);
        c.cu_seqlens = index_view({rows + 1}, cu_d, 0, cu, host_values);
        c.state = pool_view;
        c.cache_indices = cache_view;
        c.scratch = scratch_view;
        c.scratch_row_map = map_view;
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
    auto* word = static_cast<unsigned long long*>(p->buffers.keep(std::make_unique<DeviceBuffer>(8)));
    CHECK_CUDA(cudaMemset(word, 0, 8));
    p->options.guard.error_word = word;
    p->options.guard.row_flags =
        static_cast<std::int32_t*>(p->buffers.keep(std::make_unique<DeviceBuffer>(4 * rows)));
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
  const kdaguard::bench::Timed timed = kdaguard::bench::time_calls(
      state, p.options.stream, p.sets, calls, [&](int set) { return call_set(p, set); });
  if (!timed.ok) return;
  if (p.options.guard.error_word != nullptr) {
    unsigned long long word = 0;
    CHECK_CUDA(cudaMemcpy(&word, p.options.guard.error_word, 8, cudaMemcpyDeviceToHost));
    if (word != 0) state.SkipWithError("the device guard fired on a valid call");
  }
  kdaguard::bench::set_bandwidth_counters(state, state_bytes_per_call, timed);
  state.counters["us_per_call"] = 1e6 * timed.device / state.iterations();
  // Host time of the entry point alone (validation, lowering, launch): when it is close to
  // us_per_call, back-to-back calls are bound by the host, not the device.
  state.counters["host_us_per_call"] = 1e6 * timed.host / state.iterations();
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
  const int status = kdaguard::bench::run_benchmarks("bench_decode", argc, argv);
  g_problem.reset();
  return status;
}
