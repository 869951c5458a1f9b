// The value rules' predicates, shared by the host validators and the device guard so the two
// can't drift: one definition, compiled for host and device. No CUDA header is included; under
// nvcc the functions are marked __host__ __device__.
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

// seqlens.monotone: consecutive offsets never decrease.
KDAGUARD_HOST_DEVICE constexpr bool seqlens_step_ok(std::int64_t begin, std::int64_t end) {
  return end >= begin;
}

// verify.row_length: a verify row holds at most T tokens.
KDAGUARD_HOST_DEVICE constexpr bool row_length_ok(std::int64_t begin, std::int64_t end,
                                                  std::int64_t draft_tokens) {
  return end - begin <= draft_tokens;
}

// commit.accepted: 0..T accepted tokens, and no more than the row holds when its length is known
// (row_length < 0 stands for unknown).
KDAGUARD_HOST_DEVICE constexpr bool accepted_ok(std::int64_t accepted, std::int64_t draft_tokens,
                                                std::int64_t row_length) {
  return accepted >= 0 && accepted <= draft_tokens && (row_length < 0 || accepted <= row_length);
}

// verify.row_map_identity: without explicit scratch indices, row n must own scratch row n.
KDAGUARD_HOST_DEVICE constexpr bool row_map_entry_ok(std::int64_t row, std::int64_t entry) {
  return entry == row;
}

// The device guard's error word: bit r is set when rule r fired on the device.
KDAGUARD_HOST_DEVICE constexpr std::uint64_t rule_bit(RuleId rule) {
  return std::uint64_t{1} << static_cast<unsigned>(rule);
}

}  // namespace kdaguard::value_checks
