// What a refusal says, over every mutation of the catalogue: each violation names an argument of
// the call (or one of its scalars), its message is not empty and names that argument, no
// violation or deferred check is reported twice; and the seed rules keep the upstream text
// people search for, with the call's own numbers in it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <regex>
#include <set>
#include <string>
#include <tuple>

#include "gen_calls.h"
#include "kdaguard/contracts/validate.h"
#include "mutations.h"

namespace kdaguard::support {
namespace {

bool is_scalar_name(std::string_view name) {
  return name == "scale" || name == "lower_bound" || name == "draft_token_num";
}

// `name` as a word of `message` (so "v" is not found inside "verify").
bool names(const std::string& message, std::string_view name) {
  const std::regex word("(^|[^A-Za-z0-9_])" + std::string(name) + "($|[^A-Za-z0-9_])");
  return std::regex_search(message, word);
}

RC_GTEST_PROP(ContractsMessages, EveryViolationNamesItsArgumentOnce, ()) {
  std::vector<const Mutation*> all;
  for (const Mutation& x : mutation_table()) all.push_back(&x);
  const Mutation& m = **rc::gen::elementOf(all);
  const Entry e = *gen_entry(m.entry_mask);
  const auto broken = *rc::gen::exec([&] {
    RapidCheckChooser choose;
    return mutated_call(m, e, choose);
  });
  RC_TAG(m.name);
  const Verdict v = validate(broken.call);
  RC_CLASSIFY(v.accepted(), "deferred to the device");
  std::set<std::tuple<RuleId, std::string_view, std::string>> seen;
  for (const Violation& x : v.violations) {
    const auto context = [&] { return fmt::format("{}\n{}", describe(v), describe_call(broken.call)); };
    const std::optional<Arg> arg = arg_from_name(x.argument);
    if (!arg && !is_scalar_name(x.argument))
      RC_FAIL(fmt::format("{} names no argument: \"{}\"\n{}", rule_id(x.rule), x.argument, context()));
    if (!names(x.message, x.argument))
      RC_FAIL(fmt::format("{}'s message does not name {}:\n{}", rule_id(x.rule), x.argument, context()));
    if (!seen.emplace(x.rule, x.argument, x.message).second)
      RC_FAIL(fmt::format("{} on {} reported twice:\n{}", rule_id(x.rule), x.argument, context()));
  }
  std::set<std::pair<RuleId, std::string_view>> deferred;
  for (const DeferredCheck& d : v.deferred)
    if (!deferred.emplace(d.rule, d.argument).second)
      RC_FAIL(fmt::format("{} on {} deferred twice", rule_id(d.rule), d.argument));
}

// Seed 003 (SGLang's recurrent_kda): a state pool seen through transposed inner dims reports the
// upstream sentence with the pool's own sizes and strides.
RC_GTEST_PROP(ContractsMessages, TransposedPoolKeepsTheSeedText, ()) {
  auto g = *gen_any_call();
  const Arg a = entry_of(g.call) == Entry::prefill ? Arg::initial_state : Arg::state;
  TensorView& p = **find_argument(g.call, a);
  const std::int64_t V = p.shape[2], K = p.shape[3];
  p.stride[2] = 1;  // [.., V, K] over memory laid out [.., K, V]
  p.stride[3] = V;
  const Verdict v = validate(g.call);
  RC_ASSERT(v.violations.size() == 1u);
  RC_ASSERT(v.violations[0].rule == RuleId::state_inner_strides);
  const std::string want = fmt::format(
      "recurrent_kda state inner strides must be compact (V*K, K, 1)=({}, {}, 1); got ({}, 1, {}) "
      "(only the slot stride may be non-compact)",
      V * K, K, p.stride[1], V);
  if (v.violations[0].message.find(want) == std::string::npos)
    RC_FAIL(fmt::format("message lacks the seed's text \"{}\":\n{}", want, v.violations[0].message));
}

// Seed 003: a pool of the wrong rank; seed 004: prefill without its indexed pool; seed 000:
// verify with a row map that is not the identity. Each keeps the upstream wording.
RC_GTEST_PROP(ContractsMessages, SeedRulesKeepTheUpstreamWording, ()) {
  const int seed = *rc::gen::elementOf(std::vector<int>{0, 3, 4});
  std::string want;
  RuleId rule{};
  GeneratedCall g;
  if (seed == 3) {
    g = *gen_any_call();
    const Arg a = entry_of(g.call) == Entry::prefill ? Arg::initial_state : Arg::state;
    TensorView& p = **find_argument(g.call, a);
    p.rank = 3;
    p.shape[2] *= p.shape[3];
    rule = RuleId::state_rank;
    want = fmt::format("recurrent_kda needs a [N, HV, V, K] state pool; got shape ({}, {}, {})",
                       p.shape[0], p.shape[1], p.shape[2]);
  } else if (seed == 4) {
    g = *gen_call(Entry::prefill);
    auto& call = std::get<PrefillCall>(g.call);
    if (*rc::gen::arbitrary<bool>()) call.initial_state.reset();
    else call.initial_state_indices.reset();
    rule = RuleId::prefill_indexed_pool;
    want = "KDA prefill requires an indexed initial-state pool";
  } else {
    g = *gen_call(Entry::verify, PlanNeeds{.min_rows = 2, .index_values = true,
                                           .explicit_scratch_indices = false});
    TensorView& map = **find_argument(g.call, Arg::scratch_row_map);
    std::swap((*map.values)[0], (*map.values)[1]);
    // A padding row's entry is free, so the first of rows 0 and 1 that is not padding is named.
    const std::vector<std::int64_t>& slots = *(*find_argument(g.call, Arg::cache_indices))->values;
    RC_PRE(slots[0] != -1 || slots[1] != -1);
    const int named = slots[0] != -1 ? 0 : 1;
    rule = RuleId::verify_row_map_identity;
    want = fmt::format("requires an identity intermediate row-map when scratch_indices is absent: "
                       "scratch_row_map[{}] = {}, expected {}",
                       named, (*map.values)[named], named);
  }
  const Verdict v = validate(g.call);
  const auto fired = std::find_if(v.violations.begin(), v.violations.end(),
                                  [&](const Violation& x) { return x.rule == rule; });
  if (fired == v.violations.end() || fired->message.find(want) == std::string::npos)
    RC_FAIL(fmt::format("seed {}: expected {} with \"{}\":\n{}", seed, rule_id(rule), want, describe(v)));
}

// Deferred value rules of one argument come in catalogue order, so a device guard or a log can
// rely on it.
RC_GTEST_PROP(ContractsMessages, DeferredChecksOfAnArgumentComeInCatalogueOrder, ()) {
  const auto g = *gen_any_call();
  const Verdict v = validate(g.call);
  RC_ASSERT(v.accepted());
  for (std::size_t i = 0; i < v.deferred.size(); ++i)
    for (std::size_t j = i + 1; j < v.deferred.size(); ++j)
      if (v.deferred[i].argument == v.deferred[j].argument && !(v.deferred[i].rule < v.deferred[j].rule))
        RC_FAIL(fmt::format("{} deferred after {} on {}", rule_id(v.deferred[j].rule),
                            rule_id(v.deferred[i].rule), v.deferred[i].argument));
}

}  // namespace
}  // namespace kdaguard::support
