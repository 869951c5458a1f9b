// The value rules on the device: row_rules.h's row functions (the host validators' own code) over
// device memory. The guard kernels (guard.cu) run every value rule of an entry point for every
// row, plus the cross-row index.unique; the main kernels run the memory-safety subset
// (row_rules::k*MemoryRules) on their own row, so that even without a guard an index the host
// never saw cannot send a kernel outside its buffers.
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

// The rows of each entry point as row_rules.h reads them. Index tensors the params leave out
// (GuardExtras) are absent for the main kernels' memory-safety checks, which do not need them.
__host__ __device__ __forceinline__ rr::DecodeRows<DeviceIndex> decode_rows(const DecodeParams& p,
                                                                   const GuardExtras& extras) {
  return {p.batch, p.state.num_slots, index_of(p.cache_indices), index_of(extras.cu_seqlens)};
}

__host__ __device__ __forceinline__ rr::VerifyRows<DeviceIndex> verify_rows(const VerifyParams& p,
                                                                   const GuardExtras& extras) {
  const ScratchTarget& t = p.target;
  return {p.rows,
          p.total_tokens,
          p.draft_tokens,
          p.state.num_slots,
          t.scratch.num_slots,
          index_of(p.cu_seqlens),
          index_of(p.cache_indices),
          index_of(t.scratch_indices == nullptr ? extras.scratch_row_map : nullptr),
          index_of(t.scratch_indices, t.indices_row_stride)};
}

__host__ __device__ __forceinline__ rr::CommitRows<DeviceIndex> commit_rows(const CommitParams& p,
                                                                   const GuardExtras& extras) {
  const ScratchTarget& t = p.source;
  return {p.rows,
          p.draft_tokens,
          p.state.num_slots,
          t.scratch.num_slots,
          index_of(extras.cu_seqlens),
          index_of(p.cache_indices),
          index_of(t.scratch_indices == nullptr ? extras.scratch_row_map : nullptr),
          index_of(t.scratch_indices, t.indices_row_stride),
          index_of(p.accepted)};
}

__host__ __device__ __forceinline__ rr::PrefillRows<DeviceIndex> prefill_rows(const PrefillParams& p) {
  return {p.num_seqs, p.total_tokens, p.state.num_slots,
          DeviceIndex{p.cu_seqlens, p.cu_seqlens_dtype == DType::i64, 0},
          index_of(p.state_indices)};
}

// The token span [begin, end) of verify row n and the memory-safety rules the row breaks.
struct RowSpan {
  std::int64_t begin = 0, end = 0;
  std::uint64_t faults = 0;
};

__device__ __forceinline__ RowSpan verify_row_span(const VerifyParams& p, std::int32_t n) {
  return {p.cu_seqlens[n], p.cu_seqlens[n + 1],
          rr::row_faults<rr::kVerifyMemoryRules>(verify_rows(p, GuardExtras{}), n)};
}

// Flat scratch slot of step t of row n, or -1 when the step is skipped.
__device__ __forceinline__ std::int64_t scratch_slot(const ScratchTarget& t, std::int32_t n,
                                                     std::int32_t step) {
  if (t.scratch_indices != nullptr) return t.scratch_indices[n * t.indices_row_stride + step];
  return static_cast<std::int64_t>(n) * t.scratch_steps + step;
}

}  // namespace kdaguard::gpu::detail
