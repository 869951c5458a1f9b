// The value rules, one implementation for the host validators and the device code. For each entry
// point, row_faults(rows, n) returns every rule row n breaks on its own, as a mask of rule bits
// (value_checks::rule_bit). The host validator loops over it and formats a message per set bit;
// the kernels call it on the rows they run (the memory-safety subset always, every value rule when
// the host could not check the values). Only index.unique spans rows: the host sorts the
// value_checks::unique_candidate entries, the device scans them.
//
// The functions are templated on how an index tensor is read: HostIndex over the host copy of its
// values, DeviceIndex over device memory. An index whose values are not at hand is not `known()`:
// the checks that read it are skipped (the host defers them to the device, where every index is
// known). No CUDA header is included.
//
// Which rule fires for which cu_seqlens (the semantics, decided here once). Row n owns the tokens
// [begin, end) = [cu[n], cu[n+1]); N rows, T_tot tokens (unknown for commit).
//   - seqlens.start: row 0 begins anywhere but 0.
//   - seqlens.total: row N-1 ends anywhere but T_tot.
//   - seqlens.monotone: the row's own offsets decrease (end < begin), or an offset it shares with
//     a neighbour does (cu[n-1] > begin, or end > cu[n+2]): the two rows beside a broken offset
//     are judged by that offset alone, since their spans, and so their lengths, mean nothing.
//   - A row whose offsets are ordered but whose span leaves [0, T_tot] is attributed to the
//     offset rule that must then fail: begin < 0 is seqlens.start when cu[0] != 0, otherwise a
//     decrease before the row (seqlens.monotone); end > T_tot is seqlens.total when cu[N] != T_tot,
//     otherwise a decrease after it (seqlens.monotone). So cu_seqlens = [0, 5, 6] with 3 tokens
//     is seqlens.total alone, for both rows, on the host and on the device.
//   - verify.row_length and the row-length part of commit.accepted judge only rows without any of
//     the above: a span inside the tokens whose offsets are ordered.
// A call without rows has no row faults; its single offset is judged by call_faults().
#pragma once

#include <cstdint>

#include "kdaguard/contracts/value_checks.h"

namespace kdaguard::row_rules {

using Mask = std::uint64_t;

KDAGUARD_HOST_DEVICE constexpr Mask bit(RuleId rule) { return value_checks::rule_bit(rule); }

// ---- rule sets ---------------------------------------------------------------------------------

// Every value rule of each entry point (rules.cpp checks these against the catalogue).
inline constexpr Mask kDecodeRules =
    bit(RuleId::index_range) | bit(RuleId::index_unique) | bit(RuleId::decode_one_token);
inline constexpr Mask kPrefillRules =
    bit(RuleId::index_range) | bit(RuleId::index_unique) | bit(RuleId::index_padding) |
    bit(RuleId::seqlens_start) | bit(RuleId::seqlens_monotone) | bit(RuleId::seqlens_total);
inline constexpr Mask kVerifyRules =
    bit(RuleId::index_range) | bit(RuleId::index_unique) | bit(RuleId::seqlens_start) |
    bit(RuleId::seqlens_monotone) | bit(RuleId::seqlens_total) | bit(RuleId::verify_row_length) |
    bit(RuleId::verify_row_map_identity);
inline constexpr Mask kCommitRules =
    bit(RuleId::index_range) | bit(RuleId::index_unique) | bit(RuleId::seqlens_start) |
    bit(RuleId::seqlens_monotone) | bit(RuleId::verify_row_length) |
    bit(RuleId::verify_row_map_identity) | bit(RuleId::commit_accepted);
// The record-based path: verify's and commit's rules less the scratch addressing (records are
// addressed by row), and the prior accepted counts of the fused form.
inline constexpr Mask kRecordVerifyRules =
    bit(RuleId::index_range) | bit(RuleId::index_unique) | bit(RuleId::seqlens_start) |
    bit(RuleId::seqlens_monotone) | bit(RuleId::seqlens_total) | bit(RuleId::verify_row_length);
inline constexpr Mask kReplayCommitRules =
    bit(RuleId::index_range) | bit(RuleId::index_unique) | bit(RuleId::seqlens_start) |
    bit(RuleId::seqlens_monotone) | bit(RuleId::verify_row_length) | bit(RuleId::commit_accepted);
inline constexpr Mask kAcceptVerifyRules =
    kRecordVerifyRules | bit(RuleId::accept_prior_accepted);

// The rules a kernel re-checks on its own row whether or not a guard runs: those whose failure
// would send it outside its buffers (a slot past the pool, a token past q, a scratch step past
// the row's T_alloc, an accepted count naming no written step). The others (index.unique,
// decode.one_token, verify.row_map_identity) only change which memory a valid-looking row uses.
inline constexpr Mask kDecodeMemoryRules = bit(RuleId::index_range);
inline constexpr Mask kPrefillMemoryRules =
    bit(RuleId::index_range) | bit(RuleId::index_padding) | bit(RuleId::seqlens_start) |
    bit(RuleId::seqlens_monotone) | bit(RuleId::seqlens_total);
inline constexpr Mask kVerifyMemoryRules =
    bit(RuleId::index_range) | bit(RuleId::seqlens_start) | bit(RuleId::seqlens_monotone) |
    bit(RuleId::seqlens_total) | bit(RuleId::verify_row_length);
inline constexpr Mask kCommitMemoryRules = bit(RuleId::index_range) | bit(RuleId::commit_accepted);

// ---- reading index tensors -----------------------------------------------------------------------

// The host copy of an index tensor's values (TensorView::values), row-major.
struct HostIndex {
  const std::int64_t* data = nullptr;
  std::int64_t row_stride = 0;  // entries per row of a [rows, cols] map
  bool present = false;

  KDAGUARD_HOST_DEVICE constexpr bool known() const { return present; }
  KDAGUARD_HOST_DEVICE constexpr std::int64_t operator[](std::int64_t i) const { return data[i]; }
  KDAGUARD_HOST_DEVICE constexpr std::int64_t at(std::int64_t row, std::int64_t col) const {
    return data[row * row_stride + col];
  }
};

// An index tensor in device memory: i32, or i64 where the contracts allow it (prefill's
// cu_seqlens). Null data: absent.
struct DeviceIndex {
  const void* data = nullptr;
  bool wide = false;            // i64 entries
  std::int64_t row_stride = 0;  // elements per row of a [rows, cols] map

  KDAGUARD_HOST_DEVICE constexpr bool known() const { return data != nullptr; }
  KDAGUARD_HOST_DEVICE std::int64_t operator[](std::int64_t i) const {
    return wide ? static_cast<const std::int64_t*>(data)[i]
                : static_cast<const std::int32_t*>(data)[i];
  }
  KDAGUARD_HOST_DEVICE std::int64_t at(std::int64_t row, std::int64_t col) const {
    return (*this)[row * row_stride + col];
  }
};

// ---- the rows of each entry point ----------------------------------------------------------------

template <class Index> struct DecodeRows {
  std::int64_t rows = 0;       // B
  std::int64_t num_slots = 0;  // S
  Index cache_indices;         // [B], -1 = padding
  Index cu_seqlens;            // [B+1], optional
};

template <class Index> struct PrefillRows {
  std::int64_t rows = 0;          // N sequences
  std::int64_t total_tokens = 0;  // T_tot
  std::int64_t num_slots = 0;     // S
  Index cu_seqlens;               // [N+1]
  Index state_indices;            // [N], no padding
};

template <class Index> struct VerifyRows {
  std::int64_t rows = 0;           // N
  std::int64_t total_tokens = 0;   // T_tot
  std::int64_t draft_tokens = 0;   // T; 0 when not a valid count (verify.draft_tokens' to report)
  std::int64_t num_slots = 0;      // S
  std::int64_t scratch_slots = 0;  // S_spec * T_alloc
  Index cu_seqlens;                // [N+1]
  Index cache_indices;             // [>= N], -1 = padding
  Index scratch_row_map;           // [>= N]; read only without scratch_indices
  Index scratch_indices;           // [N, T] flat scratch slots, -1 = skip; optional
};

template <class Index> struct CommitRows {
  std::int64_t rows = 0;           // N
  std::int64_t draft_tokens = 0;   // T; 0 when not a valid count
  std::int64_t num_slots = 0;      // S
  std::int64_t scratch_slots = 0;  // S_spec * T_alloc
  Index cu_seqlens;                // [N+1], optional: rows' lengths bound their accepted counts
  Index cache_indices;             // [>= N], -1 = padding
  Index scratch_row_map;           // [>= N]; read only without scratch_indices
  Index scratch_indices;           // [N, T]; optional
  Index accepted;                  // [N]
};

// accept_verify: the new draft's rows as a verify without scratch (record_verify uses VerifyRows
// so, with kRecordVerifyRules), plus the previous step's accepted counts.
template <class Index> struct AcceptVerifyRows {
  VerifyRows<Index> verify;      // scratch_indices and scratch_row_map absent (not known)
  std::int64_t prior_steps = 0;  // T_alloc of prior_records
  Index prior_accepted;          // [N]
};

// ---- the rules ------------------------------------------------------------------------------------

// index.range and index.padding of one slot-map entry.
KDAGUARD_HOST_DEVICE constexpr Mask slot_faults(std::int64_t slot, std::int64_t num_slots,
                                                bool padding_allowed) {
  if (slot == -1) return padding_allowed ? 0 : bit(RuleId::index_padding);
  return value_checks::slot_in_range(slot, num_slots, false) ? 0 : bit(RuleId::index_range);
}

// Row n's span in cu_seqlens and the offset rules it breaks (the semantics above).
// total_tokens < 0: unknown (commit), so no span is judged against it.
struct RowSpan {
  std::int64_t begin = 0, end = 0;
  Mask faults = 0;
  bool judged = false;  // no offset rule fired: the span lies in the tokens, its length is real
};

template <class Index>
KDAGUARD_HOST_DEVICE RowSpan row_span(const Index& cu, std::int64_t rows, std::int64_t n,
                                      std::int64_t total_tokens) {
  RowSpan s;
  s.begin = cu[n];
  s.end = cu[n + 1];
  if (n == 0 && s.begin != 0) s.faults |= bit(RuleId::seqlens_start);
  if (total_tokens >= 0 && n == rows - 1 && s.end != total_tokens)
    s.faults |= bit(RuleId::seqlens_total);
  const bool ordered = s.begin <= s.end && (n == 0 || cu[n - 1] <= s.begin) &&
                       (n + 1 == rows || s.end <= cu[n + 2]);
  if (!ordered) {
    s.faults |= bit(RuleId::seqlens_monotone);
    return s;
  }
  if (s.begin < 0) s.faults |= bit(cu[0] != 0 ? RuleId::seqlens_start : RuleId::seqlens_monotone);
  if (total_tokens >= 0 && s.end > total_tokens)
    s.faults |= bit(cu[rows] != total_tokens ? RuleId::seqlens_total : RuleId::seqlens_monotone);
  s.judged = s.faults == 0;
  return s;
}

// verify.row_length: a judged row holds at most T tokens.
KDAGUARD_HOST_DEVICE constexpr Mask row_length_faults(const RowSpan& s, std::int64_t draft_tokens) {
  return s.judged && draft_tokens >= 1 && s.end - s.begin > draft_tokens
             ? bit(RuleId::verify_row_length)
             : 0;
}

// Scratch addressing of row n: index.range of each of its T explicit entries (-1 = skip), or,
// without explicit indices, verify.row_map_identity: a row that is not padding must own scratch
// row n (a padding row writes no scratch, so its map entry is free).
template <class Index>
KDAGUARD_HOST_DEVICE Mask scratch_faults(const Index& scratch_indices, const Index& row_map,
                                         const Index& cache_indices, std::int64_t n,
                                         std::int64_t draft_tokens, std::int64_t scratch_slots) {
  Mask f = 0;
  if (scratch_indices.known()) {
    for (std::int64_t t = 0; t < draft_tokens; ++t)
      f |= slot_faults(scratch_indices.at(n, t), scratch_slots, true);
  } else if (row_map.known() && cache_indices.known() && cache_indices[n] != -1 &&
             row_map[n] != n) {
    f |= bit(RuleId::verify_row_map_identity);
  }
  return f;
}

template <Mask Rules = kDecodeRules, class Index>
KDAGUARD_HOST_DEVICE Mask row_faults(const DecodeRows<Index>& in, std::int64_t n) {
  Mask f = 0;
  if (in.cache_indices.known()) f |= slot_faults(in.cache_indices[n], in.num_slots, true);
  // decode.one_token: the row's offsets are n and n + 1.
  if ((Rules & bit(RuleId::decode_one_token)) && in.cu_seqlens.known() &&
      (in.cu_seqlens[n] != n || in.cu_seqlens[n + 1] != n + 1))
    f |= bit(RuleId::decode_one_token);
  return f & Rules;
}

template <Mask Rules = kPrefillRules, class Index>
KDAGUARD_HOST_DEVICE Mask row_faults(const PrefillRows<Index>& in, std::int64_t n) {
  Mask f = 0;
  if (in.state_indices.known()) f |= slot_faults(in.state_indices[n], in.num_slots, false);
  if (in.cu_seqlens.known()) f |= row_span(in.cu_seqlens, in.rows, n, in.total_tokens).faults;
  return f & Rules;
}

template <Mask Rules = kVerifyRules, class Index>
KDAGUARD_HOST_DEVICE Mask row_faults(const VerifyRows<Index>& in, std::int64_t n) {
  Mask f = 0;
  if (in.cache_indices.known()) f |= slot_faults(in.cache_indices[n], in.num_slots, true);
  if (in.cu_seqlens.known()) {
    const RowSpan s = row_span(in.cu_seqlens, in.rows, n, in.total_tokens);
    f |= s.faults | row_length_faults(s, in.draft_tokens);
  }
  if (Rules & (bit(RuleId::index_range) | bit(RuleId::verify_row_map_identity)))
    f |= scratch_faults(in.scratch_indices, in.scratch_row_map, in.cache_indices, n,
                        in.draft_tokens, in.scratch_slots);
  return f & Rules;
}

template <Mask Rules = kCommitRules, class Index>
KDAGUARD_HOST_DEVICE Mask row_faults(const CommitRows<Index>& in, std::int64_t n) {
  Mask f = 0;
  if (in.cache_indices.known()) f |= slot_faults(in.cache_indices[n], in.num_slots, true);
  std::int64_t length = -1;  // unknown
  if (in.cu_seqlens.known()) {
    const RowSpan s = row_span(in.cu_seqlens, in.rows, n, -1);
    f |= s.faults | row_length_faults(s, in.draft_tokens);
    if (s.judged) length = s.end - s.begin;
  }
  if (Rules & (bit(RuleId::index_range) | bit(RuleId::verify_row_map_identity)))
    f |= scratch_faults(in.scratch_indices, in.scratch_row_map, in.cache_indices, n,
                        in.draft_tokens, in.scratch_slots);
  // commit.accepted: 0..T tokens, at most the row's length, and never a skipped scratch step
  // (its state was not written) of a row that commits.
  if (in.accepted.known() && in.draft_tokens >= 1) {
    const std::int64_t a = in.accepted[n];
    if (!value_checks::accepted_ok(a, in.draft_tokens, length))
      f |= bit(RuleId::commit_accepted);
    else if (a > 0 && in.scratch_indices.known() && in.cache_indices.known() &&
             value_checks::is_active(in.cache_indices[n]) && in.scratch_indices.at(n, a - 1) == -1)
      f |= bit(RuleId::commit_accepted);
  }
  return f & Rules;
}

// accept.prior_accepted: a prior count names steps 0..a-1 of prior_records, so a <= its T_alloc.
// Whether the previous verify wrote those steps (its rows' lengths) is not known to this call.
template <Mask Rules = kAcceptVerifyRules, class Index>
KDAGUARD_HOST_DEVICE Mask row_faults(const AcceptVerifyRows<Index>& in, std::int64_t n) {
  Mask f = row_faults<Rules>(in.verify, n);
  if (in.prior_accepted.known() &&
      !value_checks::accepted_ok(in.prior_accepted[n], in.prior_steps, -1))
    f |= bit(RuleId::accept_prior_accepted);
  return f & Rules;
}

// ---- a call without rows ----------------------------------------------------------------------

// cu_seqlens = [c] with N = 0: c must be 0 (seqlens.start; decode.one_token for decode) and, where
// the tokens are known, T_tot (seqlens.total).
template <class Index>
KDAGUARD_HOST_DEVICE Mask call_faults(const DecodeRows<Index>& in) {
  return in.rows == 0 && in.cu_seqlens.known() && in.cu_seqlens[0] != 0
             ? bit(RuleId::decode_one_token)
             : 0;
}
template <class Index>
KDAGUARD_HOST_DEVICE Mask offsets_without_rows(const Index& cu, std::int64_t rows,
                                               std::int64_t total_tokens) {
  if (rows != 0 || !cu.known()) return 0;
  Mask f = cu[0] != 0 ? bit(RuleId::seqlens_start) : 0;
  if (total_tokens >= 0 && cu[0] != total_tokens) f |= bit(RuleId::seqlens_total);
  return f;
}
template <class Index>
KDAGUARD_HOST_DEVICE Mask call_faults(const PrefillRows<Index>& in) {
  return offsets_without_rows(in.cu_seqlens, in.rows, in.total_tokens);
}
template <class Index>
KDAGUARD_HOST_DEVICE Mask call_faults(const VerifyRows<Index>& in) {
  return offsets_without_rows(in.cu_seqlens, in.rows, in.total_tokens);
}
template <class Index>
KDAGUARD_HOST_DEVICE Mask call_faults(const CommitRows<Index>& in) {
  return offsets_without_rows(in.cu_seqlens, in.rows, -1);
}

template <class Index>
KDAGUARD_HOST_DEVICE Mask call_faults(const AcceptVerifyRows<Index>& in) {
  return call_faults(in.verify);
}

}  // namespace kdaguard::row_rules
