// Cost of validating a whole call on one CPU core (meta tier, no host values: what a serving
// engine pays per call when its index maps live on the GPU; target: under 1 us per call), and of
// the value tier when the caller passes host copies of the index maps.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "kdaguard/contracts/validate.h"

namespace kdaguard {
namespace {

// The Kimi-Linear decode shape: B = 128 (or `B`), H = HV = 32, K = V = 128, q/k/v sliced from one packed
// projection, a 512-slot f32 pool with an envelope slot stride.
DecodeCall kimi_decode(std::int64_t B = 128) {
  constexpr std::int64_t H = 32, D = 128;
  DecodeCall c;
  TensorView q = TensorView::contiguous(DType::bf16, {B, H, D});
  q.stride[0] = 3 * H * D;  // [B, 3, H, D] packed projection
  q.address = 0x7f0000000000;
  TensorView k = q;
  k.storage_offset = Elements{H * D};
  TensorView v = q;
  v.storage_offset = Elements{2 * H * D};
  c.q = q;
  c.k = k;
  c.v = v;
  c.a = TensorView::contiguous(DType::bf16, {B, H, D});
  c.A_log = TensorView::contiguous(DType::f32, {H});
  c.dt_bias = TensorView::contiguous(DType::f32, {H * D});
  c.b = TensorView::contiguous(DType::bf16, {B, H});
  TensorView state = TensorView::contiguous(DType::f32, {512, H, D, D});
  state.stride[0] = H * D * D + 64;
  c.state = state;
  c.cache_indices = TensorView::contiguous(DType::i32, {B});
  c.out = TensorView::contiguous(DType::bf16, {B, H, D});
  c.scalars.lower_bound = -5.0;
  c.scalars.use_qk_l2norm = true;
  return c;
}

PrefillCall kimi_prefill() {
  constexpr std::int64_t T = 8192, H = 32, D = 128, N = 10;
  PrefillCall c;
  c.q = TensorView::contiguous(DType::bf16, {T, H, D});
  c.k = TensorView::contiguous(DType::bf16, {T, H, D});
  c.v = TensorView::contiguous(DType::bf16, {T, H, D});
  c.a = TensorView::contiguous(DType::bf16, {T, H, D});
  c.A_log = TensorView::contiguous(DType::f32, {H});
  c.dt_bias = TensorView::contiguous(DType::f32, {H * D});
  c.b = TensorView::contiguous(DType::bf16, {T, H});
  c.cu_seqlens = TensorView::contiguous(DType::i32, {N + 1});
  c.initial_state = TensorView::contiguous(DType::f32, {64, H, D, D});
  c.initial_state_indices = TensorView::contiguous(DType::i32, {N});
  c.out = TensorView::contiguous(DType::bf16, {T, H, D});
  return c;
}

VerifyCall kimi_verify() {
  constexpr std::int64_t N = 64, T = 4, H = 32, D = 128;
  VerifyCall c;
  for (OptionalView* t : {&c.q, &c.k})
    *t = TensorView::contiguous(DType::bf16, {N * T, H, D});
  c.v = TensorView::contiguous(DType::bf16, {N * T, H, D});
  c.a = TensorView::contiguous(DType::bf16, {N * T, H, D});
  c.A_log = TensorView::contiguous(DType::f32, {H});
  c.b = TensorView::contiguous(DType::bf16, {N * T, H});
  c.cu_seqlens = TensorView::contiguous(DType::i32, {N + 1});
  c.state = TensorView::contiguous(DType::f32, {512, H, D, D});
  c.cache_indices = TensorView::contiguous(DType::i32, {N});
  c.scratch = TensorView::contiguous(DType::f32, {N, T, H, D, D});
  c.scratch_indices = TensorView::contiguous(DType::i32, {N, T});
  c.out = TensorView::contiguous(DType::bf16, {N * T, H, D});
  c.scalars.draft_token_num = T;
  return c;
}

template <class Call> void run(benchmark::State& state, const Call& call) {
  if (!validate(call).accepted()) {
    state.SkipWithError(describe(validate(call)).c_str());
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(validate(call));
}

void BM_ValidateDecode(benchmark::State& s) { run(s, kimi_decode()); }
void BM_ValidatePrefill(benchmark::State& s) { run(s, kimi_prefill()); }
void BM_ValidateVerify(benchmark::State& s) { run(s, kimi_verify()); }

// Decode of B rows with a host copy of cache_indices: distinct slots of the 512-slot pool in
// random order, one row in eight a -1 padding row.
void BM_ValidateDecodeHostValues(benchmark::State& s) {
  const std::int64_t B = s.range(0);
  DecodeCall call = kimi_decode(B);
  std::vector<std::int64_t> slots(512);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937_64(B));
  slots.resize(static_cast<std::size_t>(B));
  for (std::size_t i = 0; i < slots.size(); i += 8) slots[i] = -1;
  call.cache_indices->values = slots;
  run(s, call);
  s.counters["ns_per_row"] = benchmark::Counter(static_cast<double>(B), benchmark::Counter::kIsIterationInvariantRate |
                                                                            benchmark::Counter::kInvert);
}

BENCHMARK(BM_ValidateDecode)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_ValidatePrefill)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_ValidateVerify)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_ValidateDecodeHostValues)->Arg(128)->Arg(512)->ArgName("B")->Unit(benchmark::kNanosecond);

}  // namespace
}  // namespace kdaguard

BENCHMARK_MAIN();
