// Property 2: for every rule of the catalogue, a valid call broken by one of that rule's
// mutations is rejected with that rule among its violations; a mutation designed to break that
// rule alone leaves it the only one, and the rule's message says what the mutation did (the
// argument, the expected and the actual value). The mutations come from gen_calls' table
// (mutations.h) and, for the record-based entry points, record_mutations.h's. One property per
// rule (generated from rule_list.inc), so a rule whose check goes missing fails a test named
// after it.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gen_calls.h"
#include "kdaguard/contracts/validate.h"
#include "mutations.h"
#include "record_mutations.h"

namespace kdaguard::support {
namespace {

// A broken call's verdict against what its mutation promised: `rule` among the violations, a
// message of that rule holding every text the mutation gave, and nothing else when exclusive.
void check_verdict(RuleId rule, std::string_view mutation, Entry e, bool exclusive,
                   const std::vector<std::string>& texts, const Verdict& verdict) {
  if (!verdict.breaks(rule))
    RC_FAIL(fmt::format("mutation \"{}\" on {} is not reported as {}; verdict: {}", mutation,
                        entry_name(e), rule_id(rule), describe(verdict)));
  // Its message names the argument and the expected and actual values, as the mutation says.
  RC_ASSERT(!texts.empty());
  const bool said = std::any_of(verdict.violations.begin(), verdict.violations.end(), [&](const Violation& v) {
    return v.rule == rule && std::all_of(texts.begin(), texts.end(), [&](const std::string& text) {
             return v.message.find(text) != std::string::npos;
           });
  });
  if (!said)
    RC_FAIL(fmt::format("mutation \"{}\" on {}: no {} message says all of \"{}\"; verdict: {}", mutation,
                        entry_name(e), rule_id(rule), fmt::join(texts, "\", \""), describe(verdict)));
  if (!exclusive) return;
  for (const Violation& v : verdict.violations)
    if (v.rule != rule)
      RC_FAIL(fmt::format("mutation \"{}\" on {} should break {} alone; verdict: {}", mutation,
                          entry_name(e), rule_id(rule), describe(verdict)));
}

// One of the rule's mutations, of gen_calls' entry points or of the record-based ones
// (record_mutations.h), on one of the entry points it applies to.
void mutation_breaks(RuleId rule) {
  const auto mutations = mutations_for(rule);
  const auto record_mutations = record_mutations_for(rule);
  RC_ASSERT(!mutations.empty() || !record_mutations.empty());
  const std::size_t i =
      *rc::gen::inRange<std::size_t>(0, mutations.size() + record_mutations.size());
  if (i < mutations.size()) {
    const Mutation& m = *mutations[i];
    const Entry e = *gen_entry(m.entry_mask);
    // By value: RapidCheck runs the lambda again while shrinking, after this frame is gone.
    const auto broken = *rc::gen::exec([&m, e] {
      RapidCheckChooser choose;
      return mutated_call(m, e, choose);
    });
    RC_TAG(m.name, entry_name(e));
    check_verdict(rule, m.name, e, m.exclusive, broken.message_texts, validate(broken.call));
    return;
  }
  const RecordMutation& m = *record_mutations[i - mutations.size()];
  const Entry e = *gen_record_entry(m.entry_mask);
  const auto broken = *rc::gen::exec([&m, e] {
    RapidCheckChooser choose;
    return mutated_record_call(m, e, choose);
  });
  RC_TAG(m.name, entry_name(e));
  check_verdict(rule, m.name, e, m.exclusive, broken.message_texts, validate(broken.call));
}

#define KDAGUARD_RULE(ident, id, tier, entries, inputs, meaning) \
  RC_GTEST_PROP(ContractsMutations, ident, ()) { mutation_breaks(RuleId::ident); }
#include "kdaguard/contracts/rule_list.inc"
#undef KDAGUARD_RULE

// The tables cover the catalogue: every rule, on every entry point the rule applies to, has a
// mutation, and no mutation claims an entry point its rule does not apply to.
TEST(ContractsMutations, TableCoversEveryRuleOnEveryEntryPoint) {
  for (const RuleInfo& info : rule_catalogue()) {
    for (int i = 0; i < kEntryCount; ++i) {
      const Entry e = static_cast<Entry>(i);
      if (!info.applies_to(e)) continue;
      bool covered = false;
      for (const Mutation* m : mutations_for(info.rule)) covered = covered || m->applies_to(e);
      for (const RecordMutation* m : record_mutations_for(info.rule))
        covered = covered || m->applies_to(e);
      EXPECT_TRUE(covered) << info.id << " has no mutation on " << entry_name(e);
    }
  }
  for (const Mutation& m : mutation_table())
    EXPECT_EQ(m.entry_mask & ~rule_info(m.rule).entry_mask, 0)
        << "mutation \"" << m.name << "\" claims entry points " << rule_id(m.rule)
        << " does not apply to";
  for (const RecordMutation& m : record_mutation_table()) {
    EXPECT_EQ(m.entry_mask & ~rule_info(m.rule).entry_mask, 0)
        << "record mutation \"" << m.name << "\" claims entry points " << rule_id(m.rule)
        << " does not apply to";
    EXPECT_EQ(m.entry_mask & entry_masks::kDPVC, 0)
        << "record mutation \"" << m.name << "\" claims one of gen_calls' entry points";
  }
}

// Every rule has at least one exclusive mutation: the property above then also proves that the
// rule is reported when it is the only thing wrong.
TEST(ContractsMutations, EveryRuleCanBeBrokenAlone) {
  std::set<RuleId> alone;
  for (const Mutation& m : mutation_table())
    if (m.exclusive) alone.insert(m.rule);
  for (const RecordMutation& m : record_mutation_table())
    if (m.exclusive) alone.insert(m.rule);
  for (const RuleInfo& info : rule_catalogue())
    EXPECT_TRUE(alone.count(info.rule)) << info.id << " has no exclusive mutation";
}

}  // namespace
}  // namespace kdaguard::support
