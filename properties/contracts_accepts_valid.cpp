// Property 1: every generated valid call is accepted, and the value rules the validator could
// not check (no host copy of the values) are exactly the ones it says it deferred.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "gen_calls.h"
#include "kdaguard/contracts/validate.h"
#include "record_calls.h"

namespace kdaguard::support {
namespace {

void accepts_every_valid_call(Entry e) {
  const auto g = *gen_call(e);
  const Verdict verdict = validate(g.call);
  RC_TAG(g.plan.packed_qkv ? "packed qkv" : "separate qkv", g.plan.arena ? "arena" : "own buffers");
  RC_CLASSIFY(g.plan.values_mask == 0, "no host values");
  if (!verdict.accepted()) RC_FAIL(describe(verdict));
}

RC_GTEST_PROP(ContractsAcceptValid, Decode, ()) { accepts_every_valid_call(Entry::decode); }
RC_GTEST_PROP(ContractsAcceptValid, Prefill, ()) { accepts_every_valid_call(Entry::prefill); }
RC_GTEST_PROP(ContractsAcceptValid, Verify, ()) { accepts_every_valid_call(Entry::verify); }
RC_GTEST_PROP(ContractsAcceptValid, Commit, ()) { accepts_every_valid_call(Entry::commit); }

// The record-based entry points (record_calls.h): accepted, and a value rule is deferred only
// where an index tensor came without host values.
void accepts_every_valid_record_call(Entry e) {
  const auto g = *gen_record_call(e);
  const Verdict verdict = validate(g.call);
  RC_TAG(g.plan.base.arena ? "arena" : "own buffers");
  if (!verdict.accepted()) RC_FAIL(describe(verdict));
  bool some_values_missing = false;
  for_each_argument(g.call, [&](Arg, const OptionalView& v) {
    if (v && !v->values && (v->dtype == DType::i32 || v->dtype == DType::i64))
      some_values_missing = true;
  });
  RC_ASSERT(some_values_missing || verdict.deferred.empty());
  const bool predicted = std::visit([](const auto& c) { return defers_value_rules(c); }, g.call);
  RC_ASSERT(predicted == !verdict.deferred.empty());
}

RC_GTEST_PROP(ContractsAcceptValid, RecordVerify, ()) {
  accepts_every_valid_record_call(Entry::record_verify);
}
RC_GTEST_PROP(ContractsAcceptValid, ReplayCommit, ()) {
  accepts_every_valid_record_call(Entry::replay_commit);
}
RC_GTEST_PROP(ContractsAcceptValid, AcceptVerify, ()) {
  accepts_every_valid_record_call(Entry::accept_verify);
}

// Deferred checks are value rules, and only calls that lack some host values defer any; every
// index tensor without host values has its value rules deferred (but the row map, which explicit
// scratch_indices make unnecessary). A deferred check may name an argument that has values when
// its verdict also needs another's (commit.accepted on a row whose slot is unknown).
RC_GTEST_PROP(ContractsAcceptValid, DefersExactlyTheValueRulesWithoutHostValues, ()) {
  const auto g = *gen_any_call();
  const Verdict verdict = validate(g.call);
  RC_ASSERT(verdict.accepted());
  bool some_values_missing = false;
  for_each_argument(g.call, [&](Arg a, const OptionalView& v) {
    if (!v || v->values || v->dtype == DType::f32 || v->dtype == DType::bf16 ||
        v->dtype == DType::f16)
      return;
    if (a == Arg::scratch_row_map && find_argument(g.call, Arg::scratch_indices)->has_value())
      return;
    some_values_missing = true;
    const bool deferred = std::any_of(verdict.deferred.begin(), verdict.deferred.end(),
                                      [&](const DeferredCheck& d) { return d.argument == arg_name(a); });
    RC_ASSERT(deferred);
  });
  for (const DeferredCheck& d : verdict.deferred) {
    RC_ASSERT(rule_info(d.rule).tier == Tier::value);
    const auto arg = arg_from_name(d.argument);
    RC_ASSERT(arg.has_value());
    const OptionalView* view = find_argument(g.call, *arg);
    RC_ASSERT(view != nullptr && view->has_value());
  }
  RC_ASSERT(some_values_missing || verdict.deferred.empty());
}


// defers_value_rules (how callers such as the torch binding size the device guard without
// validating) agrees with the verdict on every accepted call, whichever host copies of index
// values were dropped.
RC_GTEST_PROP(ContractsAcceptValid, DefersValueRulesAgreesWithTheVerdict, ()) {
  auto g = *gen_any_call(PlanNeeds{.index_values = true});
  for_each_argument(g.call, [&](Arg, OptionalView& v) {
    if (v && v->values && *rc::gen::arbitrary<bool>()) v->values.reset();
  });
  const Verdict verdict = validate(g.call);
  RC_ASSERT(verdict.accepted());
  const bool predicted = std::visit([](const auto& c) { return defers_value_rules(c); }, g.call);
  RC_ASSERT(predicted == !verdict.deferred.empty());
}

}  // namespace
}  // namespace kdaguard::support
