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
using support::CallPlan;

DecodeTrace decode_each_token(HostProblem& problem) {
  DecodeTrace trace;
  const Status status = support::decode_each_token(problem, trace);
  RC_ASSERT(status.ok());
  return trace;
}

RC_GTEST_PROP(ReferenceSpeculative, VerifyEqualsSingleTokenDecodes, ()) {
  const CallPlan spec = *support::gen_verify_problem();
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

  const auto mismatch = support::verify_mismatch(problem, trace);
  if (mismatch) RC_FAIL(*mismatch);
}

RC_GTEST_PROP(ReferenceSpeculative, CommitEqualsDecodingTheAcceptedTokens, ()) {
  const CallPlan spec = *support::gen_commit_problem();
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
  const auto mismatch = support::commit_mismatch(problem, trace);
  if (mismatch) RC_FAIL(*mismatch);
}

RC_GTEST_PROP(ReferenceSpeculative, CommitOfNothingChangesNothing, ()) {
  CallPlan spec = *support::gen_commit_problem();
  spec.accepted.assign(spec.row_lengths.size(), 0);
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  RC_ASSERT(reference::verify(*problem.verify).ok());
  const support::Snapshot before = problem.snapshot();
  RC_ASSERT(reference::commit(*problem.commit).ok());
  RC_ASSERT(problem.snapshot() == before);
}

}  // namespace
}  // namespace kdaguard
