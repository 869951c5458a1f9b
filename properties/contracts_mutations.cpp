// Property 2: for every rule of the catalogue, a valid call broken by one of that rule's
// mutations is rejected with that rule among its violations; a mutation designed to break that
// rule alone leaves it the only one, and the rule's message says what the mutation did (the
// argument, the expected and the actual value). One property per rule (generated from
// rule_list.inc), so a rule whose check goes missing fails a test named after it.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "gen_calls.h"
#include "kdaguard/contracts/validate.h"
#include "mutations.h"

namespace kdaguard::support {
namespace {

// Rules of the record-based entry points alone: the generators here build AnyCall's four entry
// points only; their single-rule breakages are contracts/tests/validate_record_rules_test.cpp's
// cases until a record-call generator and mutation table exist.
bool record_only(RuleId rule) { return (rule_info(rule).entry_mask & entry_masks::kDPVC) == 0; }

void mutation_breaks(RuleId rule) {
  if (record_only(rule)) RC_SUCCEED("record-only rule: see validate_record_rules_test.cpp");
  const auto mutations = mutations_for(rule);
  RC_ASSERT(!mutations.empty());
  const Mutation& m = *mutations[*rc::gen::inRange<std::size_t>(0, mutations.size())];
  const Entry e = *gen_entry(m.entry_mask);
  const auto broken = *rc::gen::exec([&] {
    RapidCheckChooser choose;
    return mutated_call(m, e, choose);
  });
  RC_TAG(m.name, entry_name(e));
  const Verdict verdict = validate(broken.call);
  if (!verdict.breaks(rule))
    RC_FAIL(fmt::format("mutation \"{}\" on {} is not reported as {}; verdict: {}", m.name,
                        entry_name(e), rule_id(rule), describe(verdict)));
  // Its message names the argument and the expected and actual values, as the mutation says.
  RC_ASSERT(!broken.message_texts.empty());
  const bool said = std::any_of(verdict.violations.begin(), verdict.violations.end(), [&](const Violation& v) {
    return v.rule == rule && std::all_of(broken.message_texts.begin(), broken.message_texts.end(),
                                         [&](const std::string& text) {
                                           return v.message.find(text) != std::string::npos;
                                         });
  });
  if (!said)
    RC_FAIL(fmt::format("mutation \"{}\" on {}: no {} message says all of \"{}\"; verdict: {}", m.name,
                        entry_name(e), rule_id(rule), fmt::join(broken.message_texts, "\", \""),
                        describe(verdict)));
  if (!m.exclusive) return;
  for (const Violation& v : verdict.violations)
    if (v.rule != rule)
      RC_FAIL(fmt::format("mutation \"{}\" on {} should break {} alone; verdict: {}", m.name,
                          entry_name(e), rule_id(rule), describe(verdict)));
}

#define KDAGUARD_RULE(ident, id, tier, entries, inputs, meaning) \
  RC_GTEST_PROP(ContractsMutations, ident, ()) { mutation_breaks(RuleId::ident); }
#include "kdaguard/contracts/rule_list.inc"
#undef KDAGUARD_RULE

// The table covers the catalogue: every rule, on every entry point the rule applies to, has a
// mutation, and no mutation claims an entry point its rule does not apply to.
TEST(ContractsMutations, TableCoversEveryRuleOnEveryEntryPoint) {
  for (const RuleInfo& info : rule_catalogue()) {
    for (Entry e : {Entry::decode, Entry::prefill, Entry::verify, Entry::commit}) {
      if (!info.applies_to(e)) continue;
      bool covered = false;
      for (const Mutation* m : mutations_for(info.rule)) covered = covered || m->applies_to(e);
      EXPECT_TRUE(covered) << info.id << " has no mutation on " << entry_name(e);
    }
  }
  for (const Mutation& m : mutation_table())
    EXPECT_EQ(m.entry_mask & ~rule_info(m.rule).entry_mask, 0)
        << "mutation \"" << m.name << "\" claims entry points " << rule_id(m.rule)
        << " does not apply to";
}

// Every rule has at least one exclusive mutation: the property above then also proves that the
// rule is reported when it is the only thing wrong.
TEST(ContractsMutations, EveryRuleCanBeBrokenAlone) {
  std::set<RuleId> alone;
  for (const Mutation& m : mutation_table())
    if (m.exclusive) alone.insert(m.rule);
  for (const RuleInfo& info : rule_catalogue()) {
    if (!record_only(info.rule)) {
      EXPECT_TRUE(alone.count(info.rule)) << info.id << " has no exclusive mutation";
    }
  }
}

}  // namespace
}  // namespace kdaguard::support
