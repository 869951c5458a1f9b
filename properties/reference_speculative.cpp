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
#include "speculative.h"

namespace kdaguard {
namespace {

using support::DecodeTrace;
using support::HostProblem;
using support::ProblemSpec;
using support::scratch_slot;

DecodeTrace decode_each_token(HostProblem& problem) {
  DecodeTrace trace;
  const Status status = support::decode_each_token(problem, trace);
  RC_ASSERT(status.ok());
  return trace;
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
