// The chunked form in f32 against the f64 per-token recurrence at the Kimi-Linear shape
// (H = HV = 32, K = V = 128, one 1024-token sequence), and why its exponents are summed from the
// gates they span rather than subtracted from cumulative sums.
#include <gtest/gtest.h>

#include <cstdio>

#include "kdaguard/reference.h"
#include "problem.h"

namespace kdaguard::reference {
namespace {

support::CallPlan kimi_linear_prefill(GateKind gate) {
  support::CallPlan spec;
  spec.entry = Entry::prefill;
  spec.H = spec.HV = 32;
  spec.K = spec.V = 128;
  spec.io_dtype = spec.gate_dtype = DType::bf16;
  spec.beta_dtype = DType::bf16;
  spec.state_dtype = DType::f32;
  spec.set_gate_kind(gate, -5.0);
  spec.beta_logits = true;
  spec.use_qk_l2norm = true;
  spec.row_lengths = {1024};
  spec.slot_of_row = {0};
  spec.slots = 1;
  return spec;
}

void expect_f32_chunked_close(const support::CallPlan& spec, const char* label) {
  const support::HostProblem problem = support::materialize(spec, 2024);
  const auto& call = std::get<PrefillCall>(problem.call);
  const PrefillResult exact = prefill_values(call);
  ASSERT_TRUE(exact.status.ok()) << to_string(exact.status);
  for (int chunk : {64, 16}) {
    const PrefillResult f32 =
        prefill_chunked_values<float>(call, {chunk, ChunkInverse::forward_substitution});
    ASSERT_TRUE(f32.status.ok()) << to_string(f32.status);
    const ErrorStats out = compare(f32.values.out, exact.values.out);
    const ErrorStats state = compare(f32.values.final_state, exact.values.final_state);
    std::printf("Kimi-Linear %s, chunk %d, f32 chunked vs f64 per-token: out %s; final state %s\n",
                label, chunk, out.to_string().c_str(), state.to_string().c_str());
    EXPECT_TRUE(out.pass(1e-5)) << out.to_string();
    EXPECT_TRUE(state.pass(1e-5)) << state.to_string();
  }
}

TEST(ChunkedNumerics, KimiLinearShapeF32WithinTolerance) {
  expect_f32_chunked_close(kimi_linear_prefill(GateKind::softplus), "softplus gate");
}

TEST(ChunkedNumerics, KimiLinearShapeLowerBoundF32WithinTolerance) {
  expect_f32_chunked_close(kimi_linear_prefill(GateKind::bounded), "lower_bound -5");
}

// After a per-token decay of -1000 the in-chunk cumulative gate is ~ -1000 and later differences
// G_i - G_j cancel in f32, losing ~1000 * 2^-24 of absolute accuracy per exponent; summing the
// gates between i and j keeps every exponent accurate. f64 is fine either way.
TEST(ChunkedNumerics, ExponentsFromGateSumsSurviveStrongDecaysInF32) {
  support::CallPlan spec;
  spec.entry = Entry::prefill;
  spec.H = spec.HV = 2;
  spec.K = spec.V = 64;
  spec.set_gate_kind(GateKind::activated, 0);
  spec.strong_decay_fraction = 0.2;
  spec.use_qk_l2norm = true;
  spec.row_lengths = {64, 17};
  spec.slot_of_row = {1, 0};
  spec.slots = 2;
  const support::HostProblem problem = support::materialize(spec, 99);
  const auto& call = std::get<PrefillCall>(problem.call);
  const PrefillResult exact = prefill_values(call);
  ASSERT_TRUE(exact.status.ok());

  auto error = [&](auto real, ChunkExponents exponents) {
    using Real = decltype(real);
    const PrefillResult r = prefill_chunked_values<Real>(
        call, {64, ChunkInverse::forward_substitution, exponents});
    EXPECT_TRUE(r.status.ok());
    const ErrorStats out = compare(r.values.out, exact.values.out);
    const ErrorStats state = compare(r.values.final_state, exact.values.final_state);
    return std::max(out.rms_ratio, state.rms_ratio);
  };
  const double sums_f32 = error(0.0f, ChunkExponents::gate_sums);
  const double differences_f32 = error(0.0f, ChunkExponents::cumsum_differences);
  std::printf("strong decays, f32 chunk 64: exponents from gate sums %.3e, from cumsum "
              "differences %.3e\n",
              sums_f32, differences_f32);
  EXPECT_LE(sums_f32, 1e-5);
  EXPECT_GT(differences_f32, 1e-5);
  EXPECT_LE(error(0.0, ChunkExponents::cumsum_differences), 1e-12);
  EXPECT_LE(error(0.0, ChunkExponents::gate_sums), 1e-12);
}

}  // namespace
}  // namespace kdaguard::reference
