// Property 3: validation is a pure function of the call description. The same call gets the
// same verdict however often and after whatever else was validated; a call at the same
// addresses with other contents gets its own verdict (upstream cached verdicts by object id, so
// a freed and reused id passed unchecked).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "gen_calls.h"
#include "kdaguard/contracts/validate.h"
#include "mutations.h"

namespace kdaguard::support {
namespace {

// A mixed bag of calls, valid and broken by random mutations or edits.
GeneratedCall some_call() {
  return *rc::gen::exec([] {
    RapidCheckChooser c;
    const auto table = mutation_table();
    const Entry e = *gen_entry();
    switch (c.pick(0, 2)) {
      case 0: return generate_call(e, {}, c);
      case 1: {
        std::vector<const Mutation*> usable;
        for (const Mutation& m : table)
          if (m.applies_to(e)) usable.push_back(&m);
        return mutated_call(*usable[static_cast<std::size_t>(c.pick(0, static_cast<std::int64_t>(usable.size()) - 1))], e, c);
      }
      default: {
        GeneratedCall g = generate_call(e, {}, c);
        for (std::int64_t i = c.pick(1, 3); i > 0; --i) random_edit(g, c);
        return g;
      }
    }
  });
}

// Validating a sequence of calls and validating each alone give the same verdicts.
RC_GTEST_PROP(ContractsDeterminism, VerdictsDoNotDependOnEarlierCalls, ()) {
  const auto count = *rc::gen::inRange<std::size_t>(2, 8);
  std::vector<GeneratedCall> calls;
  for (std::size_t i = 0; i < count; ++i) calls.push_back(some_call());
  std::vector<Verdict> first;
  for (const auto& g : calls) first.push_back(validate(g.call));
  // Again, backwards, twice each: nothing validated before may change a verdict.
  for (std::size_t i = count; i-- > 0;) {
    RC_ASSERT(same_verdict(validate(calls[i].call), first[i]));
    RC_ASSERT(same_verdict(validate(calls[i].call), first[i]));
  }
}

// The same addresses with other contents: a valid call is accepted, the same call whose host
// index values (or one stride) changed is rejected, and the original is accepted again after it.
RC_GTEST_PROP(ContractsDeterminism, SameAddressesOtherContentsOtherVerdict, ()) {
  const auto valid = *gen_any_call(PlanNeeds{.min_active_rows = 2, .index_values = true});
  GeneratedCall changed = valid;
  const bool change_values = *rc::gen::arbitrary<bool>();
  const Arg map = valid.plan.entry == Entry::prefill ? Arg::initial_state_indices : Arg::cache_indices;
  TensorView& t = **find_argument(changed.call, map);
  if (change_values) {
    (*t.values)[1] = (*t.values)[0];  // two rows now share one slot: index.unique
  } else {
    TensorView& pool = **find_argument(changed.call, valid.plan.entry == Entry::prefill
                                                        ? Arg::initial_state
                                                        : Arg::state);
    pool.stride[0] += 8;  // same address, slot stride no longer a multiple of 16
    pool.storage_size.reset();
  }
  RC_ASSERT(validate(valid.call).accepted());
  const Verdict after = validate(changed.call);
  RC_ASSERT(after.breaks(change_values ? RuleId::index_unique : RuleId::state_slot_stride_align));
  RC_ASSERT(validate(valid.call).accepted());
  RC_ASSERT(same_verdict(validate(changed.call), after));
}

}  // namespace
}  // namespace kdaguard::support
