// The record-based speculative path's step-form kernel and the launcher of both record kernels
// (contracts/NOTES.md): one kernel template for the three entry points, on verify's work split and
// row tiles (common/recurrent.cuh). A block owns one (row n, value head hv) and a slice of its
// state rows, loads them once, and
//   - replays recorded steps onto them (replay_commit, and accept_verify's prior steps):
//     S <- S diag(exp(g)) + u k^T per step, rounded to the pool's dtype after each like verify;
//   - writes them back once (replay_commit; accept_verify when it replayed any step);
//   - runs the new draft's steps as verify does (record_verify, accept_verify), writing the outputs
//     and, per step, the record g | k | u instead of the state: the first slice's block writes g and
//     k (every block of a head prepares the same token), each block u of its own rows.
// Drafts of at most kRecordStepBatch tokens on f32 state pools go to records_mma.cuh instead
// (tensor cores, the draft in closed form); this kernel takes bf16 state, whose draft must round
// the state after every step, f32 calls with longer drafts, and every replay_commit.
#pragma once

#include <climits>
#include <type_traits>

#include "records/records_common.cuh"
#include "records/records_launch.h"

namespace kdaguard::gpu::detail {

// One recorded step replayed on one state row held by a lane group (replay_element per element),
// so the replayed row equals the one the verify carried. rs holds the step's k and exp(g); u is
// the row's.
template <class ST, int K>
__device__ __forceinline__ void replay_row(float (&s)[16], const ReplaySteps<K>& rs, int step,
                                           int group_lane, float u) {
  using Tile = RowTile<ST, K>;
#pragma unroll
  for (int c = 0; c < Tile::kVecs; ++c) {
#pragma unroll
    for (int w = 0; w < Tile::kPerVec; w += 4) {
      const int at = (c * Tile::kLanes + group_lane) * Tile::kPerVec + w;
      const float4 kv = *reinterpret_cast<const float4*>(&rs.k[step][at]);
      const float4 dv = *reinterpret_cast<const float4*>(&rs.decay[step][at]);
      const int e = c * Tile::kPerVec + w;
      const float kk[4] = {kv.x, kv.y, kv.z, kv.w};
      const float dd[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) s[e + j] = replay_element(s[e + j], dd[j], u, kk[j]);
    }
  }
}

// kFitsBatch: the call's bounds (T, and the replayed records' steps) are at most
// kRecordStepBatch, so every row's replay and draft fit one batch of prepared steps and the kernel
// holds only that path: without the batched path beside it, ptxas keeps the chunk loop's values in
// registers (f32 state: 12 to 16 bytes of spill instead of 92 to 116).
template <class Params, class IO, class ST, int K, bool kFitsBatch>
__global__ void __launch_bounds__(kRowThreads, 4)
    records_kernel(const Params p, const GuardState guard, const std::int32_t slices,
                   const std::int32_t chunks) {
  constexpr bool kReplay = kReplays<Params>;
  constexpr bool kDraft = kDrafts<Params>;
  using Tile = RowTile<ST, K>;
  __shared__ std::conditional_t<kReplay, ReplaySteps<K>, NoShared> replay_sm;
  __shared__ std::conditional_t<kDraft, StepInputs<K, kRecordStepBatch>, NoShared> draft_sm;
  // Chunks of 16-bit state in flight (start_chunks, walk_chunks): two beside accept_verify's
  // 28.5 KB of replayed and drafted steps (under the 48 KB of static shared memory), three
  // otherwise.
  constexpr int kRingDepth = kReplay && kDraft ? 2 : 3;
  __shared__ StateRing<ST, kRingDepth> ring;
  // Launched as the programmatic dependant of the stream's previous kernel (launch_records_tile).
  wait_for_prior_grids();
  allow_next_grid();

  const RecordPool pool = pool_of(p);
  const BlockCoords bc = block_coords(pool.HV, slices);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int V = pool.V;
  const int block_rows = chunks * Tile::kChunkRows;
  const ChunkRows<ST, K> rows{bc.slice * block_rows, static_cast<int>(threadIdx.x) / Tile::kLanes,
                              static_cast<int>(threadIdx.x) % Tile::kLanes};
  const RecordRow row = begin_record_row<Params, IO>(p, guard, pool, bc.n, bc.hv,
                                                     bc.hv == 0 && bc.slice == 0,
                                                     rows.block_row0, block_rows);
  if (!row.run) return;
  const int replay_steps = row.replay_steps, length = row.length;
  const std::int64_t first_token = row.first_token;

  const std::int64_t head_offset = static_cast<std::int64_t>(bc.hv) * V * K;
  ST* head = static_cast<ST*>(pool.state.data) + row.slot * pool.state.slot_stride + head_offset;
  ReplaySource source{};
  const float* replay_head = nullptr;
  if constexpr (kReplay) {
    source = replay_of(p);
    replay_head = source.records.data + bc.n * source.records.row_stride +
                  bc.hv * source.records.head_stride;
  }
  float* draft_head = nullptr;
  if constexpr (kDraft)
    draft_head = draft_of(p).records.data + bc.n * draft_of(p).records.row_stride +
                 bc.hv * draft_of(p).records.head_stride;

  // One barrier-separated batch of replayed steps into replay_sm: a warp per step.
  int replay_prepared = -1, draft_prepared = -1;  // first step in shared memory; block-uniform
  auto prepare_replay = [&](int t0) {
    if constexpr (kReplay) {
      if (replay_prepared == t0) return;
      if (replay_prepared >= 0) __syncthreads();
      load_replay_steps<K>(replay_head, source.records.step_stride, t0,
                           min(kRecordStepBatch, replay_steps - t0), rows.block_row0, block_rows,
                           V, replay_sm);
      __syncthreads();
      replay_prepared = t0;
    }
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
            replay_row<ST, K>(s[r], replay_sm, step, rows.group_lane,
                              replay_sm.u[step][rows.local(chunk, r)]);
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
  // once, before the chunk loop, as verify does; the first chunk's state loads are issued before
  // that preparation, so its memory round trips (records, token inputs) overlap theirs.
  const bool one_batch = replay_steps <= kRecordStepBatch && length <= kRecordStepBatch;
  // A row past the call's bounds reaches here only when the device check of that bound
  // (commit.accepted, accept.prior_accepted, verify.row_length) is disabled: skipped whole.
  if (kFitsBatch && !one_batch) return;
  if (one_batch) {
    uint4 first[4];  // the first chunk, where the state is f32 (start_chunks)
    start_chunks<ST, K>(rows, head, V, chunks, ring, first);
    if (replay_steps > 0) prepare_replay(0);
    if (length > 0) prepare_draft(0);
    walk_chunks<ST, K>(rows, head, V, chunks, ring, first, [&](const uint4 (&raw)[4], int chunk) {
      process.template operator()<true>(raw, chunk);
    });
  } else if constexpr (!kFitsBatch) {
    stream_chunks<ST, K>(rows, head, V, chunks, ring, [&](const uint4 (&raw)[4], int chunk) {
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
  // f32 state drafts only past one batch here (launch_records_for_state); its replay_commit takes
  // the batched form, which ptxas gives no spill.
  if constexpr (!std::is_same_v<ST, float>) {
    if (replay_bound(p) <= kRecordStepBatch && draft_bound(p) <= kRecordStepBatch)
      return launch_after_prior_grid(records_kernel<Params, IO, ST, K, true>,
                                     static_cast<unsigned>(blocks), kRowThreads, 0, stream, p,
                                     guard, slices, chunks);
  }
  return launch_after_prior_grid(records_kernel<Params, IO, ST, K, false>,
                                 static_cast<unsigned>(blocks), kRowThreads, 0, stream, p, guard,
                                 slices, chunks);
}

// The call to its kernels for state element type ST: f32 state with drafts of at most
// kRecordStepBatch tokens to the tensor-core kernels (records_mma.cu; their blocks take 64 state
// rows each, so chunks_per_block does not apply), everything else to the step form here. f32
// replay_commit stays here: measured on the H200, this form ran it at 90% of the copy ceiling and
// the tensor-core kernel (a whole head per block then) at 65% of DRAM peak (bench/NOTES.md).
template <class ST, class Params>
cudaError_t launch_records_for_state(const Params& p, GuardState guard, int chunks_per_block,
                                     cudaStream_t stream) {
  if constexpr (std::is_same_v<ST, float> && kDrafts<Params>) {
    if (pool_of(p).rows > 0 && draft_bound(p) <= kRecordStepBatch)
      return launch_records_mma(p, guard, stream);
  }
  return with_record_config<ST>(p, [&]<class IO, int K>() {
    return launch_records_tile<Params, IO, ST, K>(p, guard, chunks_per_block, stream);
  });
}

}  // namespace kdaguard::gpu::detail
