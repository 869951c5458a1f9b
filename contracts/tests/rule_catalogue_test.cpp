#include <gtest/gtest.h>

#include <set>
#include <string>

#include "kdaguard/contracts/rules.h"

namespace kdaguard {
namespace {

// The ids contracts.md defines; the catalogue may add rules, never drop or rename one.
const std::set<std::string> kSpecIds = {
    "arg.missing", "arg.rank", "arg.shape", "arg.dtype", "arg.device", "arg.last_dim_contiguous",
    "arg.stride", "arg.extent", "arg.alignment", "alias.overlap", "dims.heads", "dims.head_dim",
    "scalar.scale", "scalar.lower_bound", "gate.params", "gate.cover_tokens", "state.rank",
    "state.inner_strides", "state.slot_stride_align", "state.base_align", "state.slot_stride_min",
    "state.empty", "index.length", "index.range", "index.unique", "index.padding",
    "seqlens.start", "seqlens.monotone", "seqlens.total", "decode.one_token",
    "prefill.indexed_pool", "verify.draft_tokens", "verify.scratch_steps",
    "verify.scratch_layout", "verify.scratch_rows", "verify.row_length",
    "verify.row_map_identity", "verify.scratch_indices", "commit.accepted"};

TEST(RuleCatalogue, ContainsEverySpecIdOnce) {
  std::set<std::string> ids;
  for (const RuleInfo& r : rule_catalogue()) {
    EXPECT_TRUE(ids.insert(std::string(r.id)).second) << "duplicate id " << r.id;
    EXPECT_FALSE(r.meaning.empty()) << r.id;
    EXPECT_NE(r.entry_mask, 0) << r.id;
  }
  for (const std::string& id : kSpecIds) EXPECT_TRUE(ids.count(id)) << "missing " << id;
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
      "commit.accepted"};
  for (const RuleInfo& r : rule_catalogue())
    EXPECT_EQ(r.tier == Tier::value, value_rules.count(std::string(r.id)) == 1) << r.id;
}

}  // namespace
}  // namespace kdaguard
