// Rule ids, their tier and the entry points they apply to. The catalogue itself is the table in
// rule_list.inc; this header turns it into an enum and a queryable table.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace kdaguard {

// record_verify, replay_commit and accept_verify are the record-based speculative path: a verify
// that writes per-step records (g, k, u) instead of states, a commit that replays the accepted
// records onto the committed state, and a verify that first accepts the previous step that way.
enum class Entry : std::uint8_t {
  decode, prefill, verify, commit, record_verify, replay_commit, accept_verify
};
inline constexpr int kEntryCount = 7;
std::string_view entry_name(Entry e);
std::optional<Entry> entry_from_name(std::string_view name);

// Sets of entry points as bit masks (RuleInfo::entry_mask): bit (1 << Entry).
constexpr std::uint8_t entry_bit(Entry e) {
  return static_cast<std::uint8_t>(1u << static_cast<unsigned>(e));
}
namespace entry_masks {
inline constexpr std::uint8_t kD = entry_bit(Entry::decode);
inline constexpr std::uint8_t kP = entry_bit(Entry::prefill);
inline constexpr std::uint8_t kV = entry_bit(Entry::verify);
inline constexpr std::uint8_t kC = entry_bit(Entry::commit);
inline constexpr std::uint8_t kR = entry_bit(Entry::record_verify);
inline constexpr std::uint8_t kY = entry_bit(Entry::replay_commit);
inline constexpr std::uint8_t kF = entry_bit(Entry::accept_verify);
inline constexpr std::uint8_t kDPV = kD | kP | kV;
inline constexpr std::uint8_t kDPVC = kD | kP | kV | kC;
inline constexpr std::uint8_t kPVC = kP | kV | kC;
inline constexpr std::uint8_t kPV = kP | kV;
inline constexpr std::uint8_t kVC = kV | kC;
// The record-based speculative entry points: R record_verify, Y replay_commit, F accept_verify.
inline constexpr std::uint8_t kRF = kR | kF;          // the two that verify (token inputs, out)
inline constexpr std::uint8_t kRYF = kR | kY | kF;
inline constexpr std::uint8_t kAll = kDPVC | kRYF;
inline constexpr std::uint8_t kDPVRF = kDPV | kRF;   // every entry point with token inputs
}  // namespace entry_masks

// meta: checked on the host from shapes, strides, dtypes and addresses.
// value: needs index values; checked on the host when a host copy is given, else on the device.
enum class Tier : std::uint8_t { meta, value };
std::string_view tier_name(Tier t);

// Every tensor argument name of contracts.md (call.h names them).
enum class Arg : std::uint8_t {
  q, k, v, a, g, A_log, dt_bias, b, beta, state, cache_indices, cu_seqlens, initial_state,
  initial_state_indices, out, scratch, scratch_row_map, scratch_indices, accepted, records,
  prior_records, prior_accepted
};
inline constexpr int kArgCount = 22;
// Sets of arguments as bit masks (RuleInfo::value_inputs): bit (1 << Arg).
constexpr std::uint32_t arg_bit(Arg a) { return std::uint32_t{1} << static_cast<unsigned>(a); }

enum class RuleId : std::uint8_t {
#define KDAGUARD_RULE(ident, id, tier, entries, inputs, meaning) ident,
#include "kdaguard/contracts/rule_list.inc"
#undef KDAGUARD_RULE
};

struct RuleInfo {
  RuleId rule;
  std::string_view id;       // the public dotted id, e.g. "state.inner_strides"
  Tier tier;
  std::uint8_t entry_mask;   // bit (1 << Entry) for each entry point the rule applies to
  std::uint32_t value_inputs;  // value rules: arg_bit of every index argument whose values it reads
  std::string_view meaning;  // one line

  bool applies_to(Entry e) const { return (entry_mask & entry_bit(e)) != 0; }
  bool reads(Arg a) const { return (value_inputs & arg_bit(a)) != 0; }
};

// Every rule in catalogue order.
std::span<const RuleInfo> rule_catalogue();
const RuleInfo& rule_info(RuleId rule);
std::string_view rule_id(RuleId rule);
std::optional<RuleId> rule_from_id(std::string_view id);

// Whether some value rule of entry point `entry` reads the values of index argument `arg` (the
// catalogue's value-inputs column) in a call that does or does not pass scratch_indices: verify
// and commit read scratch_row_map only without them. An index tensor that is read and passed
// without a host copy of its values defers the rules that read it to the device.
bool value_rules_read(Entry entry, Arg arg, bool scratch_indices_given);

// The rules whose checks are in force: every rule, except in a build made for scripts/knockout.sh
// (KDAGUARD_ENABLE_KNOCKOUT), where KDAGUARD_KNOCKOUT_RULE=<rule id> removes that rule's checks
// from the host validators and from the device's row checks alike. One bit per rule
// (value_checks::rule_bit).
std::uint64_t enabled_rules();
// The rules whose checks are in force on the device (the guard kernel, the kernels' prologues and
// their memory-safety checks): enabled_rules(), less KDAGUARD_KNOCKOUT_DEVICE_RULE=<rule id> in a
// knockout build, which removes that rule's device checks only (scripts/knockout_device.sh).
std::uint64_t enabled_device_rules();

}  // namespace kdaguard
