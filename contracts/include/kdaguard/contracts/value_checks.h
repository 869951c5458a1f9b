// The smallest pieces of the value rules, shared by the host validators and the device code:
// the host/device marker, a rule's bit in a fault mask, and the slot predicates. No CUDA header
// is included; under nvcc the functions are marked __host__ __device__. The rules themselves,
// row by row, are in row_rules.h.
#pragma once

#include <cstdint>

#include "kdaguard/contracts/rules.h"

#if defined(__CUDACC__)
#define KDAGUARD_HOST_DEVICE __host__ __device__
#else
#define KDAGUARD_HOST_DEVICE
#endif

namespace kdaguard::value_checks {

// index.range: an entry names a slot of the pool, or is the -1 padding marker where allowed.
KDAGUARD_HOST_DEVICE constexpr bool slot_in_range(std::int64_t slot, std::int64_t num_slots,
                                                  bool padding_allowed) {
  return (slot >= 0 && slot < num_slots) || (padding_allowed && slot == -1);
}

// Rows whose index is -1 are padding: no state is read or written for them.
KDAGUARD_HOST_DEVICE constexpr bool is_active(std::int64_t slot) { return slot >= 0; }

// index.unique: the entries that take part in the uniqueness rule, an active slot inside the
// pool. Out-of-range entries are index.range's and -1 entries are padding (or index.padding's),
// never duplicates. The host sorts these, the device scans for them; both use this predicate.
KDAGUARD_HOST_DEVICE constexpr bool unique_candidate(std::int64_t slot, std::int64_t num_slots) {
  return slot >= 0 && slot < num_slots;
}

// commit.accepted: 0..T accepted tokens, and no more than the row holds when its length is known
// (row_length < 0 stands for unknown).
KDAGUARD_HOST_DEVICE constexpr bool accepted_ok(std::int64_t accepted, std::int64_t draft_tokens,
                                                std::int64_t row_length) {
  return accepted >= 0 && accepted <= draft_tokens && (row_length < 0 || accepted <= row_length);
}

// A fault mask (and the device guard's error word): bit r is set when rule r fired.
KDAGUARD_HOST_DEVICE constexpr std::uint64_t rule_bit(RuleId rule) {
  return std::uint64_t{1} << static_cast<unsigned>(rule);
}

}  // namespace kdaguard::value_checks
