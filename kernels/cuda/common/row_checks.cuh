// The value rules on the device: row_rules.h's row functions (the host validators' own code) over
// device memory. Every main kernel judges the memory-safety subset (row_rules::k*MemoryRules) of
// each row before its first access, so that even an index the host never saw cannot send it
// outside its buffers. When the host deferred value rules to the device, decode and commit judge
// every value rule of their rows in the same prologue, the cross-row index.unique included
// (GuardState::judge_values); verify, prefill and calls without rows take the verdicts of the
// guard kernel (guard_kernel.cuh) instead.
#pragma once

#include <cstdint>

#include "device_common.cuh"
#include "kdaguard/contracts/row_rules.h"
#include "kdaguard/params.h"
#include "launch.h"

namespace kdaguard::gpu::detail {

namespace vc = kdaguard::value_checks;
namespace rr = kdaguard::row_rules;
using rr::DeviceIndex;

__device__ __forceinline__ std::uint64_t bit(RuleId r) { return vc::rule_bit(r); }

__host__ __device__ __forceinline__ DeviceIndex index_of(const std::int32_t* data,
                                                         std::int64_t row_stride = 0) {
  return DeviceIndex{data, false, row_stride};
}

// The rows of each entry point as row_rules.h reads them. `values`: with the index tensors only
// the value rules read (decode's and commit's cu_seqlens, the scratch row map); without them the
// row functions judge the memory-safety subset alone and load nothing more than it needs.
__host__ __device__ __forceinline__ rr::DecodeRows<DeviceIndex> decode_rows(const DecodeParams& p,
                                                                            bool values) {
  return {p.batch, p.state.num_slots, index_of(p.cache_indices),
          index_of(values ? p.cu_seqlens : nullptr)};
}

__host__ __device__ __forceinline__ rr::VerifyRows<DeviceIndex> verify_rows(const VerifyParams& p,
                                                                            bool values) {
  const ScratchTarget& t = p.target;
  return {p.rows,
          p.total_tokens,
          p.draft_tokens,
          p.state.num_slots,
          t.scratch.num_slots,
          index_of(p.cu_seqlens),
          index_of(p.cache_indices),
          index_of(values ? t.scratch_row_map : nullptr),
          index_of(t.scratch_indices, t.indices_row_stride)};
}

__host__ __device__ __forceinline__ rr::CommitRows<DeviceIndex> commit_rows(const CommitParams& p,
                                                                            bool values) {
  const ScratchTarget& t = p.source;
  return {p.rows,
          p.draft_tokens,
          p.state.num_slots,
          t.scratch.num_slots,
          index_of(values ? p.cu_seqlens : nullptr),
          index_of(p.cache_indices),
          index_of(values ? t.scratch_row_map : nullptr),
          index_of(t.scratch_indices, t.indices_row_stride),
          index_of(p.accepted)};
}

__host__ __device__ __forceinline__ rr::PrefillRows<DeviceIndex> prefill_rows(const PrefillParams& p) {
  return {p.num_seqs, p.total_tokens, p.state.num_slots,
          DeviceIndex{p.cu_seqlens, p.cu_seqlens_dtype == DType::i64, 0},
          index_of(p.state_indices)};
}

// ---- index.unique ----------------------------------------------------------------------------------
// The threads that judge one row together: a warp (decode, whose warps are independent workers)
// or a block (verify, commit, the guard kernel). Every thread of the group must call any().
struct WarpGroup {
  __device__ static int rank() { return static_cast<int>(threadIdx.x % 32); }
  __device__ static int size() { return 32; }
  __device__ static bool any(bool x) { return __any_sync(0xffffffffu, x) != 0; }
};
struct BlockGroup {
  __device__ static int rank() { return static_cast<int>(threadIdx.x); }
  __device__ static int size() { return static_cast<int>(blockDim.x); }
  __device__ static bool any(bool x) { return __syncthreads_or(x) != 0; }
};

// The maps index.unique scans for row n: its slot map, and the explicit scratch indices if any.
struct UniqueMaps {
  DeviceIndex slots;  // [rows]
  std::int64_t rows = 0, num_slots = 0;
  DeviceIndex scratch_indices;  // [rows, T] or absent
  std::int64_t draft_tokens = 0, scratch_slots = 0;
};

// index.unique for row n: another row's slot-map entry, or another explicit scratch entry, names
// one of row n's slots (value_checks::unique_candidate: active and in range). Group-wide, uniform.
template <class Group>
__device__ std::uint64_t unique_faults(const UniqueMaps& in, std::int64_t n) {
  const std::int64_t slot = in.slots[n];
  bool found = false;
  if (vc::unique_candidate(slot, in.num_slots))
    for (std::int64_t m = Group::rank(); m < in.rows; m += Group::size())
      found |= m != n && in.slots[m] == slot;
  if (in.scratch_indices.known()) {
    const std::int64_t T = in.draft_tokens, entries = in.rows * T;
    for (std::int64_t m = Group::rank(); m < entries; m += Group::size()) {
      const std::int64_t other = in.scratch_indices.at(m / T, m % T);
      if (!vc::unique_candidate(other, in.scratch_slots)) continue;
      for (std::int64_t t = 0; t < T; ++t)
        found |= m != n * T + t && in.scratch_indices.at(n, t) == other;
    }
  }
  return Group::any(found) ? bit(RuleId::index_unique) : 0;
}

__host__ __device__ __forceinline__ UniqueMaps unique_maps(const rr::DecodeRows<DeviceIndex>& r) {
  return {r.cache_indices, r.rows, r.num_slots, {}, 0, 0};
}
__host__ __device__ __forceinline__ UniqueMaps unique_maps(const rr::PrefillRows<DeviceIndex>& r) {
  return {r.state_indices, r.rows, r.num_slots, {}, 0, 0};
}
__host__ __device__ __forceinline__ UniqueMaps unique_maps(const rr::VerifyRows<DeviceIndex>& r) {
  return {r.cache_indices, r.rows, r.num_slots, r.scratch_indices, r.draft_tokens, r.scratch_slots};
}
__host__ __device__ __forceinline__ UniqueMaps unique_maps(const rr::CommitRows<DeviceIndex>& r) {
  return {r.cache_indices, r.rows, r.num_slots, r.scratch_indices, r.draft_tokens, r.scratch_slots};
}

// Every value rule row n breaks, index.unique included: the guard kernel's verdict and the
// prologue's when values were deferred. Group-wide, uniform.
template <class Group, class Rows>
__device__ std::uint64_t value_faults(const Rows& rows, std::int64_t n) {
  return rr::row_faults(rows, n) | unique_faults<Group>(unique_maps(rows), n);
}

// The prologue's verdict on row n, restricted to the rules in force: every value rule when the
// host deferred some (guard.judge_values), else the entry point's memory-safety subset.
template <class Group>
__device__ __forceinline__ std::uint64_t row_verdict(const DecodeParams& p, const GuardState& guard,
                                                     std::int32_t n) {
  if (guard.judge_values) return value_faults<Group>(decode_rows(p, true), n) & guard.enabled;
  return rr::row_faults<rr::kDecodeMemoryRules>(decode_rows(p, false), n) & guard.enabled;
}
// Verify judges only the memory-safety subset itself: the value checks in its prologue, even out
// of line, made its main loop spill (bf16 state: 276 -> 424 bytes of spill stores), so its value
// rules stay with the guard kernel (row_flags).
__device__ __forceinline__ std::uint64_t row_verdict(const VerifyParams& p, const GuardState& guard,
                                                     std::int32_t n) {
  return rr::row_faults<rr::kVerifyMemoryRules>(verify_rows(p, false), n) & guard.enabled;
}
template <class Group>
__device__ __forceinline__ std::uint64_t row_verdict(const CommitParams& p, const GuardState& guard,
                                                     std::int32_t n) {
  if (guard.judge_values) return value_faults<Group>(commit_rows(p, true), n) & guard.enabled;
  return rr::row_faults<rr::kCommitMemoryRules>(commit_rows(p, false), n) & guard.enabled;
}

// ---- the record-based path (records/) ----
// Its rows as row_rules.h reads them: verify's and commit's without the scratch addressing
// (records are addressed by row), and the prior accepted counts of the fused form.
__host__ __device__ __forceinline__ rr::VerifyRows<DeviceIndex> record_verify_rows(
    const RecordVerifyParams& p) {
  return {p.rows, p.total_tokens, p.draft_tokens, p.state.num_slots, 0,
          index_of(p.cu_seqlens), index_of(p.cache_indices), {}, {}};
}
__host__ __device__ __forceinline__ rr::CommitRows<DeviceIndex> replay_commit_rows(
    const ReplayCommitParams& p) {
  return {p.rows, p.draft_tokens, p.state.num_slots, 0, index_of(p.cu_seqlens),
          index_of(p.cache_indices), {}, {}, index_of(p.accepted)};
}
__host__ __device__ __forceinline__ rr::AcceptVerifyRows<DeviceIndex> accept_verify_rows(
    const AcceptVerifyParams& p) {
  return {record_verify_rows(p.verify), p.prior_records.steps, index_of(p.prior_accepted)};
}

// The prologue's verdict on row n of a record kernel: every value rule of the entry point when the
// host deferred some, else its memory-safety subset (the slot, the row's tokens, and the counts of
// records it replays: a count past the buffer's steps would read outside it). Block-wide, uniform.
inline constexpr std::uint64_t kAcceptVerifyMemoryRules =
    rr::kVerifyMemoryRules | vc::rule_bit(RuleId::accept_prior_accepted);
__device__ __forceinline__ std::uint64_t row_verdict(const RecordVerifyParams& p,
                                                     const GuardState& guard, std::int32_t n) {
  const auto rows = record_verify_rows(p);
  if (guard.judge_values)
    return (rr::row_faults<rr::kRecordVerifyRules>(rows, n) |
            unique_faults<BlockGroup>(unique_maps(rows), n)) &
           guard.enabled;
  return rr::row_faults<rr::kVerifyMemoryRules>(rows, n) & guard.enabled;
}
__device__ __forceinline__ std::uint64_t row_verdict(const ReplayCommitParams& p,
                                                     const GuardState& guard, std::int32_t n) {
  const auto rows = replay_commit_rows(p);
  if (guard.judge_values)
    return (rr::row_faults<rr::kReplayCommitRules>(rows, n) |
            unique_faults<BlockGroup>(unique_maps(rows), n)) &
           guard.enabled;
  return rr::row_faults<rr::kCommitMemoryRules>(rows, n) & guard.enabled;
}
__device__ __forceinline__ std::uint64_t row_verdict(const AcceptVerifyParams& p,
                                                     const GuardState& guard, std::int32_t n) {
  const auto rows = accept_verify_rows(p);
  if (guard.judge_values)
    return (rr::row_faults<rr::kAcceptVerifyRules>(rows, n) |
            unique_faults<BlockGroup>(unique_maps(rows.verify), n)) &
           guard.enabled;
  return rr::row_faults<kAcceptVerifyMemoryRules>(rows, n) & guard.enabled;
}

// Flat scratch slot of step t of row n, or -1 when the step is skipped.
__device__ __forceinline__ std::int64_t scratch_slot(const ScratchTarget& t, std::int32_t n,
                                                     std::int32_t step) {
  if (t.scratch_indices != nullptr) return t.scratch_indices[n * t.indices_row_stride + step];
  return static_cast<std::int64_t>(n) * t.scratch_steps + step;
}

}  // namespace kdaguard::gpu::detail
