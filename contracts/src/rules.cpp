#include "kdaguard/contracts/rules.h"

#include <array>
#include <cstdlib>

#include "kdaguard/contracts/row_rules.h"

namespace kdaguard {
namespace {

using namespace entry_masks;
constexpr Tier meta = Tier::meta;
constexpr Tier value = Tier::value;

// The value-inputs column of rule_list.inc.
namespace reads {
constexpr std::uint32_t cache_indices = arg_bit(Arg::cache_indices);
constexpr std::uint32_t initial_state_indices = arg_bit(Arg::initial_state_indices);
constexpr std::uint32_t cu_seqlens = arg_bit(Arg::cu_seqlens);
constexpr std::uint32_t scratch_row_map = arg_bit(Arg::scratch_row_map);
constexpr std::uint32_t scratch_indices = arg_bit(Arg::scratch_indices);
constexpr std::uint32_t accepted = arg_bit(Arg::accepted);
constexpr std::uint32_t prior_accepted = arg_bit(Arg::prior_accepted);
}  // namespace reads

constexpr std::array kCatalogue = {
#define KDAGUARD_RULE(ident, id, tier, entries, inputs, meaning) \
  RuleInfo{RuleId::ident, id, tier, entries, inputs, meaning},
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

// Value rules read index values, meta rules none.
constexpr bool inputs_match_tiers() {
  for (const RuleInfo& r : kCatalogue)
    if ((r.tier == Tier::value) != (r.value_inputs != 0)) return false;
  return true;
}
static_assert(inputs_match_tiers());

// row_rules.h's rule sets are the catalogue's value rules of each entry point.
constexpr std::uint64_t value_rules_of(Entry e) {
  std::uint64_t mask = 0;
  for (const RuleInfo& r : kCatalogue)
    if (r.tier == Tier::value && (r.entry_mask & entry_bit(e)) != 0)
      mask |= std::uint64_t{1} << static_cast<unsigned>(r.rule);
  return mask;
}
static_assert(value_rules_of(Entry::decode) == row_rules::kDecodeRules);
static_assert(value_rules_of(Entry::prefill) == row_rules::kPrefillRules);
static_assert(value_rules_of(Entry::verify) == row_rules::kVerifyRules);
static_assert(value_rules_of(Entry::commit) == row_rules::kCommitRules);
static_assert(value_rules_of(Entry::record_verify) == row_rules::kRecordVerifyRules);
static_assert(value_rules_of(Entry::replay_commit) == row_rules::kReplayCommitRules);
static_assert(value_rules_of(Entry::accept_verify) == row_rules::kAcceptVerifyRules);

}  // namespace

std::string_view entry_name(Entry e) {
  switch (e) {
    case Entry::decode: return "decode";
    case Entry::prefill: return "prefill";
    case Entry::verify: return "verify";
    case Entry::commit: return "commit";
    case Entry::record_verify: return "record_verify";
    case Entry::replay_commit: return "replay_commit";
    case Entry::accept_verify: return "accept_verify";
  }
  return "?";
}

std::optional<Entry> entry_from_name(std::string_view name) {
  for (int e = 0; e < kEntryCount; ++e)
    if (entry_name(static_cast<Entry>(e)) == name) return static_cast<Entry>(e);
  return std::nullopt;
}

std::string_view tier_name(Tier t) { return t == Tier::meta ? "meta" : "value"; }

std::span<const RuleInfo> rule_catalogue() { return kCatalogue; }

const RuleInfo& rule_info(RuleId rule) { return kCatalogue[static_cast<std::size_t>(rule)]; }

bool value_rules_read(Entry entry, Arg arg, bool scratch_indices_given) {
  if (arg == Arg::scratch_row_map && scratch_indices_given) return false;
  for (const RuleInfo& rule : kCatalogue)
    if (rule.tier == Tier::value && rule.applies_to(entry) && rule.reads(arg)) return true;
  return false;
}

std::string_view rule_id(RuleId rule) { return rule_info(rule).id; }

std::optional<RuleId> rule_from_id(std::string_view id) {
  for (const RuleInfo& info : kCatalogue)
    if (info.id == id) return info.rule;
  return std::nullopt;
}

std::uint64_t enabled_rules() {
#ifdef KDAGUARD_ENABLE_KNOCKOUT
  // Test-only build: pretend one rule's checks were removed (scripts/knockout.sh). Read on every
  // call, so a test process may switch the rule.
  if (const char* id = std::getenv("KDAGUARD_KNOCKOUT_RULE"))
    if (const auto rule = rule_from_id(id)) return ~value_checks::rule_bit(*rule);
#endif
  return ~std::uint64_t{0};
}

std::uint64_t enabled_device_rules() {
  std::uint64_t enabled = enabled_rules();
#ifdef KDAGUARD_ENABLE_KNOCKOUT
  // The device half alone: the host validators keep the rule, so a device test comparing the
  // device's verdict with the host's sees the device check missing.
  if (const char* id = std::getenv("KDAGUARD_KNOCKOUT_DEVICE_RULE"))
    if (const auto rule = rule_from_id(id)) enabled &= ~value_checks::rule_bit(*rule);
#endif
  return enabled;
}

}  // namespace kdaguard
