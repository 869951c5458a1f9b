// The record-based speculative path's kernel and its launcher (contracts/NOTES.md): one kernel
// template for the three entry points, on verify's work split and row tiles (common/recurrent.cuh).
// A block owns one (row n, value head hv) and a slice of its state rows, loads them once, and
//   - replays recorded steps onto them (replay_commit, and accept_verify's prior steps):
//     S <- S diag(exp(g)) + u k^T per step, rounded to the pool's dtype after each like verify;
//   - writes them back once (replay_commit; accept_verify when it replayed any step);
//   - runs the new draft's steps as verify does (record_verify, accept_verify), writing the outputs
//     and, per step, the record g | k | u instead of the state: the first slice's block writes g and
//     k (every block of a head prepares the same token), each block u of its own rows.
#pragma once

#include <climits>
#include <type_traits>

#include "dispatch.cuh"
#include "guard/guard_kernel.cuh"
#include "launch.h"
#include "recurrent.cuh"
#include "records/records_launch.h"

namespace kdaguard::gpu::detail {

inline constexpr int kRecordStepBatch = 8;  // steps prepared per barrier, as verify

// What every record entry point has: the pool, the slot map and the head geometry.
struct RecordPool {
  std::int32_t rows, HV, V;
  StatePool state;
  const std::int32_t* cache_indices;
};
__host__ __device__ inline RecordPool pool_of(const RecordVerifyParams& p) {
  return {p.rows, p.in.HV, p.in.V, p.state, p.cache_indices};
}
__host__ __device__ inline RecordPool pool_of(const ReplayCommitParams& p) {
  return {p.rows, p.HV, p.V, p.state, p.cache_indices};
}
__host__ __device__ inline RecordPool pool_of(const AcceptVerifyParams& p) {
  return pool_of(p.verify);
}

// The records a call replays and their counts (replay_commit, accept_verify).
struct ReplaySource {
  RecordBuffer records;
  const std::int32_t* counts;
};
__device__ __forceinline__ ReplaySource replay_of(const ReplayCommitParams& p) {
  return {p.records, p.accepted};
}
__device__ __forceinline__ ReplaySource replay_of(const AcceptVerifyParams& p) {
  return {p.prior_records, p.prior_accepted};
}
__host__ __device__ inline const RecordVerifyParams& draft_of(const RecordVerifyParams& p) { return p; }
__host__ __device__ inline const RecordVerifyParams& draft_of(const AcceptVerifyParams& p) {
  return p.verify;
}

// The rows the guard kernel judges for a call without rows (its single cu_seqlens offset,
// row_rules::call_faults): accept_verify's are its draft's.
inline rr::VerifyRows<DeviceIndex> empty_call_rows(const RecordVerifyParams& p) {
  return record_verify_rows(p);
}
inline rr::CommitRows<DeviceIndex> empty_call_rows(const ReplayCommitParams& p) {
  return replay_commit_rows(p);
}
inline rr::VerifyRows<DeviceIndex> empty_call_rows(const AcceptVerifyParams& p) {
  return record_verify_rows(p.verify);
}

template <class Params, class IO, class ST, int K>
__global__ void __launch_bounds__(kRowThreads, 4)
    records_kernel(const Params p, const GuardState guard, const std::int32_t slices,
                   const std::int32_t chunks) {
  constexpr bool kReplay = !std::is_same_v<Params, RecordVerifyParams>;
  constexpr bool kDraft = !std::is_same_v<Params, ReplayCommitParams>;
  using Tile = RowTile<ST, K>;
  // [0]: the replayed steps (k, exp(g) and the block's u in v's place) or the draft's tokens;
  // [1]: the draft's tokens when the call also replays.
  __shared__ StepInputs<K, kRecordStepBatch> sm[kReplay && kDraft ? 2 : 1];
  StepInputs<K, kRecordStepBatch>& replay_sm = sm[0];
  StepInputs<K, kRecordStepBatch>& draft_sm = sm[kReplay && kDraft ? 1 : 0];

  const RecordPool pool = pool_of(p);
  const BlockCoords bc = block_coords(pool.HV, slices);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int V = pool.V;
  const int block_rows = chunks * Tile::kChunkRows;
  const ChunkRows<ST, K> rows{bc.slice * block_rows, static_cast<int>(threadIdx.x) / Tile::kLanes,
                              static_cast<int>(threadIdx.x) % Tile::kLanes};

  // The prologue (row_checks.cuh): the block's verdict on its row before any access it guards.
  const std::uint64_t faults = row_verdict(p, guard, bc.n);
  const bool first_block_of_row = bc.hv == 0 && bc.slice == 0;
  if (faults != 0) {
    if (threadIdx.x == 0 && first_block_of_row) raise(guard.error_word, faults);
    return;
  }
  const std::int64_t slot = pool.cache_indices[bc.n];
  const bool active = vc::is_active(slot);
  int replay_steps = 0;
  ReplaySource source{};
  if constexpr (kReplay) {
    source = replay_of(p);
    if (active) replay_steps = source.counts[bc.n];
  }
  std::int64_t first_token = 0;
  int length = 0;
  if constexpr (kDraft) {
    const RecordVerifyParams& d = draft_of(p);
    first_token = d.cu_seqlens[bc.n];  // the row's tokens: judged in range
    length = static_cast<int>(d.cu_seqlens[bc.n + 1] - first_token);
    if (!active) {  // padding row: zero outputs, no records
      for (int t = 0; t < length; ++t)
        for (int i = threadIdx.x; i < block_rows; i += kRowThreads)
          if (rows.block_row0 + i < V)
            store_out<IO>(d.out, first_token + t, bc.hv, rows.block_row0 + i, 0.f);
      return;
    }
  }
  if (!active || (replay_steps == 0 && length == 0)) return;

  const std::int64_t head_offset = static_cast<std::int64_t>(bc.hv) * V * K;
  ST* head = static_cast<ST*>(pool.state.data) + slot * pool.state.slot_stride + head_offset;
  const float* replay_head = nullptr;
  if constexpr (kReplay)
    replay_head = source.records.data + bc.n * source.records.row_stride +
                  bc.hv * source.records.head_stride;
  float* draft_head = nullptr;
  if constexpr (kDraft)
    draft_head = draft_of(p).records.data + bc.n * draft_of(p).records.row_stride +
                 bc.hv * draft_of(p).records.head_stride;

  // One barrier-separated batch of replayed steps into replay_sm: a warp per step.
  int replay_prepared = -1, draft_prepared = -1;  // first step in shared memory; block-uniform
  auto prepare_replay = [&](int t0) {
    if (replay_prepared == t0) return;
    if (replay_prepared >= 0) __syncthreads();
    const int steps = min(kRecordStepBatch, replay_steps - t0);
    for (int step = warp; step < steps; step += kRowThreads / 32) {
      const float* record = replay_head + (t0 + step) * source.records.step_stride;
#pragma unroll
      for (int i = 0; i < K / 32; ++i) {
        const int c = lane + 32 * i;
        replay_sm.decay[step][c] = expf(record[c]);
        replay_sm.k[step][c] = record[K + c];
      }
#pragma unroll
      for (int i = 0; i < kMaxRowsPerBlock / 32; ++i) {
        const int r = lane + 32 * i;
        replay_sm.v[step][r] = r < block_rows && rows.block_row0 + r < V
                                   ? record[2 * K + rows.block_row0 + r]
                                   : 0.f;
      }
    }
    __syncthreads();
    replay_prepared = t0;
  };
  auto prepare_draft = [&](int t0) {
    if constexpr (kDraft) {
      if (draft_prepared == t0) return;
      if (draft_prepared >= 0) __syncthreads();
      const RecordVerifyParams& d = draft_of(p);
      const int steps = min(kRecordStepBatch, length - t0);
      for (int step = warp; step < steps; step += kRowThreads / 32) {
        const int t = t0 + step;
        prepare_token<IO, K, kRecordStepBatch>(
            d.in, bc.hv, first_token + t, rows.block_row0, block_rows, lane, step, draft_sm,
            bc.slice == 0 ? draft_head + t * d.records.step_stride : nullptr);
      }
      __syncthreads();
      draft_prepared = t0;
    }
  };

  auto process = [&]<bool kOneBatch>(const uint4 (&raw)[4], int chunk) {
    float s[Tile::kRows][16];
#pragma unroll
    for (int r = 0; r < Tile::kRows; ++r) rows.unpack(raw, r, s[r]);
    if constexpr (kReplay) {
      for (int t0 = 0; t0 < replay_steps; t0 += kRecordStepBatch) {
        if constexpr (!kOneBatch) prepare_replay(t0);
        const int steps = min(kRecordStepBatch, replay_steps - t0);
        for (int step = 0; step < steps; ++step) {
#pragma unroll
          for (int r = 0; r < Tile::kRows; ++r) {
            replay_row<ST, K, kRecordStepBatch>(s[r], replay_sm, step, rows.group_lane,
                                                replay_sm.v[step][rows.local(chunk, r)]);
#pragma unroll
            for (int e = 0; e < 16; ++e) s[r][e] = StateVec<ST>::round(s[r][e]);
          }
        }
      }
      if (replay_steps > 0) {
#pragma unroll
        for (int r = 0; r < Tile::kRows; ++r)
          if (const int at = rows.row(chunk, r); at < V) rows.store(head, at, s[r]);
      }
    }
    if constexpr (kDraft) {
      const RecordVerifyParams& d = draft_of(p);
      for (int t0 = 0; t0 < length; t0 += kRecordStepBatch) {
        if constexpr (!kOneBatch) prepare_draft(t0);
        const int steps = min(kRecordStepBatch, length - t0);
        for (int step = 0; step < steps; ++step) {
          float* record = draft_head + (t0 + step) * d.records.step_stride + 2 * K;
#pragma unroll
          for (int r = 0; r < Tile::kRows; ++r) {
            float u;
            const float o =
                step_row<ST, K, kRecordStepBatch>(s[r], draft_sm, step, rows.group_lane,
                                                  draft_sm.v[step][rows.local(chunk, r)], u);
#pragma unroll
            for (int e = 0; e < 16; ++e) s[r][e] = StateVec<ST>::round(s[r][e]);
            const int at = rows.row(chunk, r);
            if (at < V && rows.group_lane == 0) {
              store_out<IO>(d.out, first_token + t0 + step, bc.hv, at, o);
              record[at] = u;
            }
          }
        }
      }
    }
  };
  // Rows whose replayed steps and draft each fit one batch (the usual draft lengths) prepare them
  // once, before the chunk loop, as verify does.
  if (replay_steps <= kRecordStepBatch && length <= kRecordStepBatch) {
    if (replay_steps > 0) prepare_replay(0);
    if (length > 0) prepare_draft(0);
    pipeline_chunks<ST, K>(rows, head, V, chunks, [&](const uint4 (&raw)[4], int chunk) {
      process.template operator()<true>(raw, chunk);
    });
  } else {
    pipeline_chunks<ST, K>(rows, head, V, chunks, [&](const uint4 (&raw)[4], int chunk) {
      process.template operator()<false>(raw, chunk);
    });
  }
}

template <class Params, class IO, class ST, int K>
cudaError_t launch_records_tile(const Params& p, GuardState guard, int chunks_per_block,
                                cudaStream_t stream) {
  using Tile = RowTile<ST, K>;
  const RecordPool pool = pool_of(p);
  if (pool.rows == 0) {  // only a guard's single offset to judge
    if (!guard.judge_values) return cudaSuccess;
    return launch_guard(empty_call_rows(p), guard.enabled, guard.error_word, nullptr, stream);
  }
  const int per_head = (pool.V + Tile::kChunkRows - 1) / Tile::kChunkRows;
  const int chunks = pick_chunks_per_block(pool.rows, pool.HV, per_head, chunks_per_block);
  const std::int32_t slices = (per_head + chunks - 1) / chunks;
  const std::int64_t blocks = static_cast<std::int64_t>(pool.rows) * pool.HV * slices;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  records_kernel<Params, IO, ST, K><<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(
      p, guard, slices, chunks);
  return cudaGetLastError();
}

// The call's (IO dtype, K) to its instantiation for state element type ST; replay_commit reads
// no q/k/v, so its IO is f32 whatever the call.
template <class ST, class Params>
cudaError_t launch_records_for_state(const Params& p, GuardState guard, int chunks_per_block,
                                     cudaStream_t stream) {
  if constexpr (std::is_same_v<Params, ReplayCommitParams>) {
    return with_head_dim<float, ST>(p.K, [&]<class IO, class S, int K>() {
      return launch_records_tile<Params, IO, S, K>(p, guard, chunks_per_block, stream);
    });
  } else {
    const TokenInputs& in = draft_of(p).in;
    return with_element<supported::kIoDTypes>(in.io_dtype, [&]<class IO>() -> cudaError_t {
      return with_head_dim<IO, ST>(in.K, [&]<class I, class S, int K>() {
        return launch_records_tile<Params, I, S, K>(p, guard, chunks_per_block, stream);
      });
    });
  }
}

}  // namespace kdaguard::gpu::detail
