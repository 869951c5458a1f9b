// commit: the state after row n's last accepted step, scratch slot -> committed slot
// cache_indices[n]. A plain copy of one slot (HV * V * K elements) per accepting row, in 16-byte
// vectors; rows that accept nothing, and padding rows, are left alone.
#include <climits>

#include "device_common.cuh"
#include "launch.h"
#include "row_checks.cuh"

namespace kdaguard::gpu::detail {
namespace {

constexpr int kCopyThreads = 256;
constexpr int kVecsPerThread = 4;
constexpr std::int64_t kVecsPerBlock = kCopyThreads * kVecsPerThread;

__global__ void __launch_bounds__(kCopyThreads)
    commit_kernel(const CommitParams p, const GuardState guard, const std::int64_t vecs_per_slot,
                  const std::int32_t blocks_per_row) {
  const std::int32_t n = static_cast<std::int32_t>(blockIdx.x / blocks_per_row);
  const std::int64_t chunk = blockIdx.x % blocks_per_row;
  const bool reporter = chunk == 0 && threadIdx.x == 0;

  // The prologue: the block's verdict on its row (row_checks.cuh), before any access it guards.
  const std::uint64_t faults = row_verdict<BlockGroup>(p, guard, n);
  if (faults != 0) {
    if (reporter) raise(guard.error_word, faults);
    return;
  }
  const std::int64_t slot = p.cache_indices[n];
  const std::int64_t accepted = p.accepted[n];
  if (!vc::is_active(slot) || accepted == 0) return;

  const std::int64_t source = scratch_slot(p.source, n, static_cast<std::int32_t>(accepted - 1));
  // Unreachable while the prologue's rules are in force (they bound every scratch entry and
  // accepted count); kept so a row-function bug cannot become an out-of-bounds copy.
  if (!vc::slot_in_range(source, p.source.scratch.num_slots, false)) {
    if (reporter)
      raise(guard.error_word,
            bit(source == -1 ? RuleId::commit_accepted : RuleId::index_range) & guard.enabled);
    return;
  }
  const std::int64_t element = p.state.dtype == DType::bf16 ? 2 : 4;  // the pool dtypes
  const uint4* from = reinterpret_cast<const uint4*>(
      static_cast<const char*>(p.source.scratch.data) + source * p.source.scratch.slot_stride * element);
  uint4* to = reinterpret_cast<uint4*>(static_cast<char*>(p.state.data) +
                                       slot * p.state.slot_stride * element);
  const std::int64_t first = chunk * kVecsPerBlock + threadIdx.x;
  uint4 buffer[kVecsPerThread];
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    const std::int64_t at = first + i * kCopyThreads;
    if (at < vecs_per_slot) buffer[i] = load_stream(from + at);
  }
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    const std::int64_t at = first + i * kCopyThreads;
    if (at < vecs_per_slot) store_stream(to + at, buffer[i]);
  }
}

}  // namespace

cudaError_t launch_commit(const CommitParams& p, GuardState guard, cudaStream_t stream) {
  // HV * V * K is a multiple of 64 elements (K, V in {64, 128}), so a slot is whole vectors.
  const std::int64_t vecs_per_slot =
      static_cast<std::int64_t>(p.HV) * p.V * p.K * element_size(p.state.dtype) / 16;
  const std::int64_t per_row = (vecs_per_slot + kVecsPerBlock - 1) / kVecsPerBlock;
  const std::int64_t blocks = per_row * p.rows;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  commit_kernel<<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(
      p, guard, vecs_per_slot, static_cast<std::int32_t>(per_row));
  return cudaGetLastError();
}

}  // namespace kdaguard::gpu::detail
