// Issue 3: the chunked form of prefill (kda-math.md) agrees with the per-token recurrence: in f64
// to 1e-12, in f32 within 1e-5, for chunks of 16 and 64 tokens, both inverses, every gate form
// (including per-token decays of -1000 under the unbounded softplus gate), ragged sequences with
// lengths at the chunk edges.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <array>
#include <algorithm>
#include <cmath>
#include <vector>

#include "gen_problem.h"
#include "kdaguard/numeric.h"
#include "kdaguard/reference.h"
#include "problem.h"

namespace kdaguard {
namespace {

using reference::ChunkInverse;
using reference::ChunkOptions;
using reference::compare;
using support::CallPlan;

// What a prefill that computed `values` leaves in out and in the pool (`pool`: the pool's
// elements before the call, row-major [S, HV, V, K]): every out element, and the slot of every
// sequence that ran, rounded once into its storage dtype.
struct Written {
  std::vector<double> out, pool;
};
Written written_from(const CallPlan& spec, const reference::PrefillValues& values,
                     std::vector<double> pool) {
  Written w;
  w.out.reserve(values.out.size());
  for (const double x : values.out) w.out.push_back(numeric::round_to(spec.io_dtype, x));
  const std::size_t per_slot = static_cast<std::size_t>(spec.HV) * spec.V * spec.K;
  for (std::size_t n = 0; n < spec.row_lengths.size(); ++n) {
    if (spec.row_lengths[n] == 0) continue;
    const std::size_t slot = static_cast<std::size_t>(spec.slot_of_row[n]);
    for (std::size_t e = 0; e < per_slot; ++e)
      pool[slot * per_slot + e] =
          numeric::round_to(spec.state_dtype, values.final_state[n * per_slot + e]);
  }
  w.pool = std::move(pool);
  return w;
}

// max |a - b| / max |b|: how far two f64 evaluations of the same values are apart, norm-wise.
double max_norm_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  double largest = 0, difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    largest = std::max(largest, std::fabs(b[i]));
    difference = std::max(difference, std::fabs(a[i] - b[i]));
  }
  return difference == 0 ? 0 : difference / largest;
}

struct ChunkedVsPerToken {
  reference::ErrorStats out, state;
};

// One problem, the per-token f64 values, then the chunked form in each Real asked for.
class Comparison {
 public:
  explicit Comparison(const CallPlan& spec)
      : problem_(support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>())),
        per_token_(reference::prefill_values(call())) {
    RC_ASSERT(per_token_.status.ok());
  }

  template <class Real>
  ChunkedVsPerToken chunked(ChunkOptions options) const {
    const reference::PrefillResult r = reference::prefill_chunked_values<Real>(call(), options);
    RC_ASSERT(r.status.ok());
    return {compare(r.values.out, per_token_.values.out),
            compare(r.values.final_state, per_token_.values.final_state)};
  }

 private:
  const PrefillCall& call() const { return std::get<PrefillCall>(problem_.call); }
  support::HostProblem problem_;
  reference::PrefillResult per_token_;
};

ChunkOptions draw_options() {
  ChunkOptions options;
  options.chunk = *rc::gen::resize(100, rc::gen::inRange(0, 2)) == 0 ? 16 : 64;
  if (options.chunk == 16 && *rc::gen::arbitrary<bool>())
    options.inverse = ChunkInverse::neumann_product;
  RC_TAG(options.chunk, options.inverse == ChunkInverse::neumann_product ? "neumann" : "substitution");
  return options;
}

RC_GTEST_PROP(ReferenceChunked, F64ChunkedEqualsPerTokenTo1e12, ()) {
  const CallPlan spec = *support::gen_prefill_problem();
  const ChunkOptions options = draw_options();
  const ChunkedVsPerToken e = Comparison(spec).chunked<double>(options);
  RC_LOG() << "out " << e.out.to_string() << "; state " << e.state.to_string() << "\n";
  RC_ASSERT(e.out.comparable);
  RC_ASSERT(e.state.comparable);
  RC_ASSERT(e.out.rms_ratio <= 1e-12);
  RC_ASSERT(e.state.rms_ratio <= 1e-12);
}

RC_GTEST_PROP(ReferenceChunked, F32ChunkedWithin1e5OfF64PerToken, ()) {
  const CallPlan spec = *support::gen_prefill_problem();
  const ChunkOptions options = draw_options();
  const ChunkedVsPerToken e = Comparison(spec).chunked<float>(options);
  RC_LOG() << "out " << e.out.to_string() << "; state " << e.state.to_string() << "\n";
  RC_ASSERT(e.out.pass(1e-5));
  RC_ASSERT(e.state.pass(1e-5));
}

// Per-token decays of -1000 (and far below) under the unbounded softplus gate, and the bounded
// gate at lower_bound -5 over whole 64-token chunks: every value stays finite and right.
RC_GTEST_PROP(ReferenceChunked, ExtremeDecaysStayFiniteAndRight, ()) {
  CallPlan spec = *support::gen_prefill_problem();
  spec.set_gate_kind(*rc::gen::resize(100, rc::gen::inRange(0, 3)) == 0 ? GateKind::bounded
                     : *rc::gen::arbitrary<bool>()                       ? GateKind::softplus
                                                                         : GateKind::activated,
                     -5.0);
  if (spec.raw_gate) spec.gate_dtype = spec.io_dtype;
  spec.strong_decay_fraction = 0.3;
  const ChunkOptions options = draw_options();
  const Comparison comparison(spec);
  const ChunkedVsPerToken f64 = comparison.chunked<double>(options);
  const ChunkedVsPerToken f32 = comparison.chunked<float>(options);
  RC_LOG() << "f64 out " << f64.out.to_string() << "; f32 out " << f32.out.to_string() << "\n";
  RC_ASSERT(f64.out.comparable && f64.state.comparable);
  RC_ASSERT(f64.out.rms_ratio <= 1e-12 && f64.state.rms_ratio <= 1e-12);
  RC_ASSERT(f32.out.pass(1e-5) && f32.state.pass(1e-5));
}

// The writing form lands exactly where prefill() writes and rounds as it does: each form leaves
// out and the pool holding its own f64 values rounded once into the storage dtypes, at the same
// elements, nothing else touched, and the two sets of f64 values agree to 1e-12 of the largest.
// Their stored values need not be within one ulp of each other element by element: the two f64
// evaluations sum the same terms in different orders and differ by a few f64 ulps of those terms
// (about 1e-16 absolute for O(1) states), which is more than one f32 ulp of an element that a sum
// cancels to near zero (a state element of -1.02e-9 has an f32 spacing of 1.1e-16).
RC_GTEST_PROP(ReferenceChunked, WritesLikePrefill, ()) {
  const CallPlan spec = *support::gen_prefill_problem();
  const ChunkOptions options = draw_options();
  support::HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  const auto& call = std::get<PrefillCall>(problem.call);
  problem.poison_outputs();
  const support::Snapshot before = problem.snapshot();
  const std::vector<double> pool_before = problem.read_floats_in(before, *call.initial_state);

  const reference::PrefillResult per_token = reference::prefill_values(call);
  const reference::PrefillResult chunked = reference::prefill_chunked_values<double>(call, options);
  RC_ASSERT(per_token.status.ok() && chunked.status.ok());
  const double out_apart = max_norm_ratio(chunked.values.out, per_token.values.out);
  const double state_apart = max_norm_ratio(chunked.values.final_state, per_token.values.final_state);
  RC_LOG() << "f64 values apart (max norm): out " << out_apart << ", state " << state_apart << "\n";
  RC_ASSERT(out_apart <= 1e-12);
  RC_ASSERT(state_apart <= 1e-12);

  RC_ASSERT(reference::prefill(call).ok());
  const Written by_prefill = written_from(spec, per_token.values, pool_before);
  RC_ASSERT(support::read_floats(*call.out) == by_prefill.out);
  RC_ASSERT(support::read_floats(*call.initial_state) == by_prefill.pool);
  problem.restore(before);

  RC_ASSERT(reference::prefill_chunked<double>(call, options).ok());
  const auto unexpected = problem.unexpected_writes(before);
  RC_ASSERT(!unexpected.has_value());
  const auto unwritten = problem.unwritten_outputs();
  RC_ASSERT(!unwritten.has_value());
  const Written by_chunked = written_from(spec, chunked.values, pool_before);
  RC_ASSERT(support::read_floats(*call.out) == by_chunked.out);
  RC_ASSERT(support::read_floats(*call.initial_state) == by_chunked.pool);
}

TEST(ReferenceChunked, RefusesOptionsItCannotRun) {
  CallPlan spec;
  spec.entry = Entry::prefill;
  spec.row_lengths = {20};
  spec.slot_of_row = {0};
  const support::HostProblem problem = support::materialize(spec, 7);
  const auto& call = std::get<PrefillCall>(problem.call);
  const support::Snapshot before = problem.snapshot();
  EXPECT_EQ(reference::prefill_chunked<float>(call, {64, ChunkInverse::neumann_product}).code,
            StatusCode::unsupported);
  EXPECT_EQ(reference::prefill_chunked<double>(call, {0, ChunkInverse::forward_substitution}).code,
            StatusCode::unsupported);
  EXPECT_EQ(problem.snapshot(), before);
  EXPECT_TRUE(reference::prefill_chunked<double>(call, {16, ChunkInverse::neumann_product}).ok());
}

}  // namespace
}  // namespace kdaguard
