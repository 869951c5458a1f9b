// Rule ids, their tier and the entry points they apply to. The catalogue itself is the table in
// rule_list.inc; this header turns it into an enum and a queryable table.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace kdaguard {

enum class Entry : std::uint8_t { decode, prefill, verify, commit };
inline constexpr int kEntryCount = 4;
std::string_view entry_name(Entry e);
std::optional<Entry> entry_from_name(std::string_view name);

// meta: checked on the host from shapes, strides, dtypes and addresses.
// value: needs index values; checked on the host when a host copy is given, else on the device.
enum class Tier : std::uint8_t { meta, value };
std::string_view tier_name(Tier t);

enum class RuleId : std::uint8_t {
#define KDAGUARD_RULE(ident, id, tier, entries, meaning) ident,
#include "kdaguard/contracts/rule_list.inc"
#undef KDAGUARD_RULE
};

struct RuleInfo {
  RuleId rule;
  std::string_view id;       // the public dotted id, e.g. "state.inner_strides"
  Tier tier;
  std::uint8_t entry_mask;   // bit (1 << Entry) for each entry point the rule applies to
  std::string_view meaning;  // one line

  bool applies_to(Entry e) const { return (entry_mask >> static_cast<int>(e)) & 1u; }
};

// Every rule in catalogue order.
std::span<const RuleInfo> rule_catalogue();
const RuleInfo& rule_info(RuleId rule);
std::string_view rule_id(RuleId rule);
std::optional<RuleId> rule_from_id(std::string_view id);

}  // namespace kdaguard
