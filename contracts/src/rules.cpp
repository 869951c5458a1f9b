#include "kdaguard/contracts/rules.h"

#include <array>

namespace kdaguard {
namespace {

using namespace entry_masks;
constexpr Tier meta = Tier::meta;
constexpr Tier value = Tier::value;

constexpr std::array kCatalogue = {
#define KDAGUARD_RULE(ident, id, tier, entries, meaning) \
  RuleInfo{RuleId::ident, id, tier, entries, meaning},
#include "kdaguard/contracts/rule_list.inc"
#undef KDAGUARD_RULE
};

// Rows must sit at the index of their enum value so rule_info() is a plain lookup.
constexpr bool catalogue_in_enum_order() {
  for (std::size_t i = 0; i < kCatalogue.size(); ++i)
    if (static_cast<std::size_t>(kCatalogue[i].rule) != i) return false;
  return true;
}
static_assert(catalogue_in_enum_order());
static_assert(kCatalogue.size() <= 64, "the device guard's error word has one bit per rule");

}  // namespace

std::string_view entry_name(Entry e) {
  switch (e) {
    case Entry::decode: return "decode";
    case Entry::prefill: return "prefill";
    case Entry::verify: return "verify";
    case Entry::commit: return "commit";
  }
  return "?";
}

std::optional<Entry> entry_from_name(std::string_view name) {
  for (Entry e : {Entry::decode, Entry::prefill, Entry::verify, Entry::commit})
    if (entry_name(e) == name) return e;
  return std::nullopt;
}

std::string_view tier_name(Tier t) { return t == Tier::meta ? "meta" : "value"; }

std::span<const RuleInfo> rule_catalogue() { return kCatalogue; }

const RuleInfo& rule_info(RuleId rule) { return kCatalogue[static_cast<std::size_t>(rule)]; }

std::string_view rule_id(RuleId rule) { return rule_info(rule).id; }

std::optional<RuleId> rule_from_id(std::string_view id) {
  for (const RuleInfo& info : kCatalogue)
    if (info.id == id) return info.rule;
  return std::nullopt;
}

}  // namespace kdaguard
