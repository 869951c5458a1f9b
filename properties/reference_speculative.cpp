// Issue 3: verify with T draft tokens gives exactly the outputs and per-step states of T
// single-token decodes; commit with `a` accepted tokens leaves exactly the state of decoding those
// a tokens in the committed slot; commit of 0 tokens changes nothing.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gen_problem.h"
#include "kdaguard/reference.h"
#include "problem.h"

namespace kdaguard {
namespace {

using support::HostProblem;
using support::ProblemSpec;

// What single-token decodes produce for every active row of a verify problem: per row, per step,
// the output [HV, V] and the state after the step [HV, V, K].
struct DecodeTrace {
  std::vector<std::vector<std::vector<double>>> out, state;
};

// Decodes every token of every active row, one decode call per token, on the problem's committed
// pool in place (callers restore it afterwards).
DecodeTrace decode_each_token(HostProblem& problem) {
  const ProblemSpec& s = problem.spec;
  const VerifyCall& vc = *problem.verify;
  const support::Allocation slot_buffer("decode_cache_indices", 4);
  const support::Allocation out_buffer(
      "decode_out", static_cast<std::size_t>(s.HV * s.V * element_size(s.io_dtype)));

  TensorView cache_indices = TensorView::contiguous(DType::i32, {1});
  cache_indices.address = slot_buffer.address();
  cache_indices.storage_size = Elements{1};
  TensorView out = TensorView::contiguous(s.io_dtype, {1, s.HV, s.V});
  out.address = out_buffer.address();
  out.storage_size = Elements{s.HV * s.V};

  DecodeTrace trace;
  trace.out.resize(s.seq_lens.size());
  trace.state.resize(s.seq_lens.size());
  std::int64_t first_token = 0;
  for (std::size_t n = 0; n < s.seq_lens.size(); ++n) {
    const std::int64_t slot = s.slots[n];
    for (std::int64_t t = 0; slot >= 0 && t < s.seq_lens[n]; ++t) {
      const std::int64_t token = first_token + t;
      auto row = [&](const OptionalView& v) -> OptionalView {
        return v ? OptionalView(support::slice_rows(*v, token, 1)) : std::nullopt;
      };
      DecodeCall dc;
      dc.device = vc.device;
      dc.q = row(vc.q);
      dc.k = row(vc.k);
      dc.v = row(vc.v);
      dc.a = row(vc.a);
      dc.g = row(vc.g);
      dc.b = row(vc.b);
      dc.beta = row(vc.beta);
      dc.A_log = vc.A_log;
      dc.dt_bias = vc.dt_bias;
      dc.state = vc.state;
      const auto slot32 = static_cast<std::int32_t>(slot);
      std::memcpy(slot_buffer.data(), &slot32, 4);
      dc.cache_indices = cache_indices;
      dc.cache_indices->values = std::vector<std::int64_t>{slot};
      dc.out = out;
      dc.scalars = vc.scalars;
      dc.scalars.draft_token_num.reset();
      const Status status = reference::decode(dc);
      RC_ASSERT(status.ok());
      trace.out[n].push_back(support::read_floats(out));
      trace.state[n].push_back(support::read_slot(*vc.state, slot));
    }
    first_token += s.seq_lens[n];
  }
  return trace;
}

std::int64_t scratch_slot(const ProblemSpec& s, std::size_t n, std::int64_t t) {
  return s.scratch_indices ? (*s.scratch_indices)[n * s.draft_tokens + t]
                           : static_cast<std::int64_t>(n) * s.scratch_steps + t;
}

RC_GTEST_PROP(ReferenceSpeculative, VerifyEqualsSingleTokenDecodes, ()) {
  const ProblemSpec spec = *support::gen_verify_spec();
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  const support::Snapshot fresh = problem.snapshot();
  const DecodeTrace trace = decode_each_token(problem);
  problem.restore(fresh);

  problem.poison_outputs();
  const support::Snapshot before = problem.snapshot();
  const Status status = reference::verify(*problem.verify);
  RC_ASSERT(status.ok());
  const auto unexpected = problem.unexpected_writes(before);
  RC_ASSERT(!unexpected.has_value());
  const auto unwritten = problem.unwritten_outputs();
  RC_ASSERT(!unwritten.has_value());

  const TensorView& out = *problem.verify->out;
  std::int64_t first_token = 0;
  for (std::size_t n = 0; n < spec.seq_lens.size(); ++n) {
    for (std::int64_t t = 0; t < spec.seq_lens[n]; ++t) {
      const std::vector<double> got = support::read_floats(support::slice_rows(out, first_token + t, 1));
      if (spec.slots[n] < 0) {
        RC_ASSERT(got == std::vector<double>(got.size(), 0.0));  // padding rows output zeros
        continue;
      }
      RC_ASSERT(got == trace.out[n][t]);
      const std::int64_t flat = scratch_slot(spec, n, t);
      if (flat >= 0) RC_ASSERT(support::read_slot(*problem.verify->scratch, flat) == trace.state[n][t]);
    }
    first_token += spec.seq_lens[n];
  }
}

RC_GTEST_PROP(ReferenceSpeculative, CommitEqualsDecodingTheAcceptedTokens, ()) {
  const ProblemSpec spec = *support::gen_commit_spec();
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  const support::Snapshot fresh = problem.snapshot();
  const DecodeTrace trace = decode_each_token(problem);
  problem.restore(fresh);

  RC_ASSERT(reference::verify(*problem.verify).ok());
  problem.poison_outputs();  // the committed slots that will be overwritten
  const support::Snapshot before = problem.snapshot();
  const Status status = reference::commit(*problem.commit);
  RC_ASSERT(status.ok());
  const auto unexpected = problem.unexpected_writes(before);
  RC_ASSERT(!unexpected.has_value());
  const auto unwritten = problem.unwritten_outputs();
  RC_ASSERT(!unwritten.has_value());
  for (std::size_t n = 0; n < spec.seq_lens.size(); ++n) {
    const std::int64_t a = spec.accepted[n];
    if (spec.slots[n] < 0 || a == 0) continue;  // unchanged: checked by unexpected_writes
    RC_ASSERT(support::read_slot(*problem.commit->state, spec.slots[n]) == trace.state[n][a - 1]);
  }
}

RC_GTEST_PROP(ReferenceSpeculative, CommitOfNothingChangesNothing, ()) {
  ProblemSpec spec = *support::gen_commit_spec();
  spec.accepted.assign(spec.seq_lens.size(), 0);
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  RC_ASSERT(reference::verify(*problem.verify).ok());
  const support::Snapshot before = problem.snapshot();
  RC_ASSERT(reference::commit(*problem.commit).ok());
  RC_ASSERT(problem.snapshot() == before);
}

}  // namespace
}  // namespace kdaguard
