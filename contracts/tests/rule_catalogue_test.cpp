#include <gtest/gtest.h>

#include <set>
#include <string>

#include "kdaguard/contracts/rules.h"
#include "spec_rule_ids.h"

namespace kdaguard {
namespace {

TEST(RuleCatalogue, ContainsEverySpecIdOnce) {
  std::set<std::string> ids;
  for (const RuleInfo& r : rule_catalogue()) {
    EXPECT_TRUE(ids.insert(std::string(r.id)).second) << "duplicate id " << r.id;
    EXPECT_FALSE(r.meaning.empty()) << r.id;
    EXPECT_NE(r.entry_mask, 0) << r.id;
  }
  for (std::string_view id : kSpecRuleIds)
    EXPECT_TRUE(ids.count(std::string(id))) << "missing " << id;
}

TEST(RuleCatalogue, IdsRoundTrip) {
  for (const RuleInfo& r : rule_catalogue()) {
    auto back = rule_from_id(r.id);
    ASSERT_TRUE(back.has_value()) << r.id;
    EXPECT_EQ(*back, r.rule);
    EXPECT_EQ(rule_id(r.rule), r.id);
  }
  EXPECT_FALSE(rule_from_id("no.such_rule").has_value());
}

TEST(RuleCatalogue, TiersMatchTheSpec) {
  const std::set<std::string> value_rules = {
      "index.range", "index.unique", "index.padding", "seqlens.start", "seqlens.monotone",
      "seqlens.total", "decode.one_token", "verify.row_length", "verify.row_map_identity",
      "commit.accepted", "accept.prior_accepted"};
  for (const RuleInfo& r : rule_catalogue())
    EXPECT_EQ(r.tier == Tier::value, value_rules.count(std::string(r.id)) == 1) << r.id;
}

}  // namespace
}  // namespace kdaguard
