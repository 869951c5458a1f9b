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
#include "kdaguard/reference.h"
#include "problem.h"

namespace kdaguard {
namespace {

using reference::ChunkInverse;
using reference::ChunkOptions;
using reference::compare;
using support::ProblemSpec;

// Whether two stored values are at most one unit in the last place of `dtype` apart.
bool within_one_ulp(const std::vector<double>& a, const std::vector<double>& b, DType dtype) {
  const double ulp = dtype == DType::f32 ? 0x1p-23 : dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
  const double smallest = dtype == DType::f16 ? 0x1p-24 : 0x1p-126;
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (!(d <= ulp * std::max(std::fabs(a[i]), std::fabs(b[i])) || d <= smallest)) return false;
  }
  return true;
}

struct ChunkedVsPerToken {
  reference::ErrorStats out, state;
};

// One problem, the per-token f64 values, then the chunked form in each Real asked for.
class Comparison {
 public:
  explicit Comparison(const ProblemSpec& spec)
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
  const ProblemSpec spec = *support::gen_prefill_spec();
  const ChunkOptions options = draw_options();
  const ChunkedVsPerToken e = Comparison(spec).chunked<double>(options);
  RC_LOG() << "out " << e.out.to_string() << "; state " << e.state.to_string() << "\n";
  RC_ASSERT(e.out.comparable);
  RC_ASSERT(e.state.comparable);
  RC_ASSERT(e.out.rms_ratio <= 1e-12);
  RC_ASSERT(e.state.rms_ratio <= 1e-12);
}

RC_GTEST_PROP(ReferenceChunked, F32ChunkedWithin1e5OfF64PerToken, ()) {
  const ProblemSpec spec = *support::gen_prefill_spec();
  const ChunkOptions options = draw_options();
  const ChunkedVsPerToken e = Comparison(spec).chunked<float>(options);
  RC_LOG() << "out " << e.out.to_string() << "; state " << e.state.to_string() << "\n";
  RC_ASSERT(e.out.pass(1e-5));
  RC_ASSERT(e.state.pass(1e-5));
}

// Per-token decays of -1000 (and far below) under the unbounded softplus gate, and the bounded
// gate at lower_bound -5 over whole 64-token chunks: every value stays finite and right.
RC_GTEST_PROP(ReferenceChunked, ExtremeDecaysStayFiniteAndRight, ()) {
  ProblemSpec spec = *support::gen_prefill_spec();
  spec.gate_kind = *rc::gen::resize(100, rc::gen::inRange(0, 3)) == 0 ? GateKind::bounded
                   : *rc::gen::arbitrary<bool>()                       ? GateKind::softplus
                                                                       : GateKind::activated;
  if (spec.gate_kind != GateKind::activated) spec.gate_dtype = spec.io_dtype;
  spec.lower_bound = -5.0;
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

// The writing form lands exactly where prefill() writes, and rounds into the same dtypes: out
// and pool within one ulp of the storage dtype (the values differ by ~1e-15 relative before
// rounding, so they round alike except at a rounding boundary), nothing else touched.
RC_GTEST_PROP(ReferenceChunked, WritesLikePrefill, ()) {
  const ProblemSpec spec = *support::gen_prefill_spec();
  const ChunkOptions options = draw_options();
  support::HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  const auto& call = std::get<PrefillCall>(problem.call);
  problem.poison_outputs();
  const support::Snapshot before = problem.snapshot();

  RC_ASSERT(reference::prefill(call).ok());
  const std::vector<double> out_per_token = support::read_floats(*call.out);
  const std::vector<double> pool_per_token = support::read_floats(*call.initial_state);
  problem.restore(before);

  RC_ASSERT(reference::prefill_chunked<double>(call, options).ok());
  const auto unexpected = problem.unexpected_writes(before);
  RC_ASSERT(!unexpected.has_value());
  const auto unwritten = problem.unwritten_outputs();
  RC_ASSERT(!unwritten.has_value());
  RC_ASSERT(within_one_ulp(support::read_floats(*call.out), out_per_token, spec.io_dtype));
  RC_ASSERT(within_one_ulp(support::read_floats(*call.initial_state), pool_per_token,
                           spec.state_dtype));
}

TEST(ReferenceChunked, RefusesOptionsItCannotRun) {
  ProblemSpec spec;
  spec.entry = Entry::prefill;
  spec.seq_lens = {20};
  spec.slots = {0};
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
