// The value rules one row can be judged on by itself, evaluated on the device. The guard kernels
// add the cross-row rule (index.unique) and run these for every row; the main kernels run the
// memory-safety subset on their own row, so that even without a guard an index the host never
// saw cannot send a kernel outside its buffers. The predicates are kdaguard::value_checks, the
// same definitions the host validators use.
#pragma once

#include <cstdint>

#include "device_common.cuh"
#include "kdaguard/contracts/value_checks.h"
#include "kdaguard/params.h"
#include "launch.h"

namespace kdaguard::gpu::detail {

namespace vc = kdaguard::value_checks;

__device__ __forceinline__ std::uint64_t bit(RuleId r) { return vc::rule_bit(r); }

// The token span [begin, end) of a verify or commit row from cu_seqlens, and the rules it breaks.
// `total_tokens` < 0: unknown (commit), so the span is only checked against itself.
struct RowSpan {
  std::int64_t begin = 0, end = 0;
  std::uint64_t faults = 0;
};

__device__ __forceinline__ RowSpan row_span(const std::int32_t* cu, std::int32_t rows,
                                            std::int32_t n, std::int64_t total_tokens,
                                            std::int64_t draft_tokens) {
  RowSpan s;
  s.begin = cu[n];
  s.end = cu[n + 1];
  if (n == 0 && s.begin != 0) s.faults |= bit(RuleId::seqlens_start);
  if (!vc::seqlens_step_ok(s.begin, s.end)) {
    s.faults |= bit(RuleId::seqlens_monotone);
    return s;
  }
  // A begin below 0 means cu_seqlens decreased somewhere before row n (or starts below 0); an end
  // past the tokens means the total is wrong, or a later entry decreases.
  if (s.begin < 0) s.faults |= bit(n == 0 ? RuleId::seqlens_start : RuleId::seqlens_monotone);
  if (total_tokens >= 0) {
    if (n == rows - 1 && s.end != total_tokens) s.faults |= bit(RuleId::seqlens_total);
    if (s.end > total_tokens)
      s.faults |= bit(n == rows - 1 ? RuleId::seqlens_total : RuleId::seqlens_monotone);
  }
  if (!vc::row_length_ok(s.begin, s.end, draft_tokens)) s.faults |= bit(RuleId::verify_row_length);
  return s;
}

__device__ __forceinline__ std::uint64_t slot_faults(std::int64_t slot, std::int64_t num_slots) {
  return vc::slot_in_range(slot, num_slots, /*padding_allowed=*/true) ? 0
                                                                      : bit(RuleId::index_range);
}

// Flat scratch slot of step t of row n, or -1 when the step is skipped.
__device__ __forceinline__ std::int64_t scratch_slot(const ScratchTarget& t, std::int32_t n,
                                                     std::int32_t step) {
  if (t.scratch_indices != nullptr) return t.scratch_indices[n * t.indices_row_stride + step];
  return static_cast<std::int64_t>(n) * t.scratch_steps + step;
}

// Scratch addressing of row n over its T entries: range of explicit indices, or the identity
// row map when there are none.
__device__ __forceinline__ std::uint64_t scratch_faults(const ScratchTarget& t,
                                                        const GuardExtras& extras,
                                                        std::int32_t n, std::int32_t draft_tokens) {
  std::uint64_t faults = 0;
  if (t.scratch_indices != nullptr) {
    for (std::int32_t step = 0; step < draft_tokens; ++step)
      faults |= slot_faults(scratch_slot(t, n, step), t.scratch.num_slots);
  } else if (extras.scratch_row_map != nullptr && !vc::row_map_entry_ok(n, extras.scratch_row_map[n])) {
    faults |= bit(RuleId::verify_row_map_identity);
  }
  return faults;
}

// Row n of a commit: slot, accepted count (against T and the row's length when cu_seqlens is
// given), the scratch step it copies from.
__device__ __forceinline__ std::uint64_t commit_row_faults(const CommitParams& p,
                                                           const GuardExtras& extras,
                                                           std::int32_t n) {
  const std::int64_t slot = p.cache_indices[n];
  std::uint64_t faults = slot_faults(slot, p.state.num_slots);
  std::int64_t length = -1;
  if (extras.cu_seqlens != nullptr) {
    const RowSpan span = row_span(extras.cu_seqlens, p.rows, n, -1, p.draft_tokens);
    faults |= span.faults;
    if (vc::seqlens_step_ok(span.begin, span.end)) length = span.end - span.begin;
  }
  const std::int64_t accepted = p.accepted[n];
  if (!vc::accepted_ok(accepted, p.draft_tokens, length)) {
    faults |= bit(RuleId::commit_accepted);
  } else if (accepted > 0 && vc::is_active(slot) &&
             scratch_slot(p.source, n, static_cast<std::int32_t>(accepted - 1)) < 0) {
    faults |= bit(RuleId::commit_accepted);  // the step it needs was never written
  }
  return faults;
}

}  // namespace kdaguard::gpu::detail
