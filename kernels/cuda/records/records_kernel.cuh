// The record-based speculative path's kernel and its launcher (contracts/NOTES.md): one kernel
// template for the three entry points, on verify's work split and row tiles (common/recurrent.cuh).
// A block owns one (row n, value head hv) and a slice of its state rows, loads them once, and
//   - replays recorded steps onto them (replay_commit, and accept_verify's prior steps):
//     S <- S diag(exp(g)) + u k^T per step, rounded to the pool's dtype after each like verify;
//   - writes them back once (replay_commit; accept_verify when it replayed any step);
//   - runs the new draft's steps as verify does (record_verify, accept_verify), writing the outputs
//     and, per step, the record g | k | u instead of the state: the first slice's block writes g and
//     k (every block of a head prepares the same token), each block u of its own rows.
// With an f32 state and a draft of at most kRecordStepBatch tokens (the usual case) the draft runs
// in closed form (ClosedDraft below): the state after each step is never formed, since a record
// path writes none, and each row's steps cost two dot products instead of a decay, two dot
// products and a rank-1 update, with no dependency between the steps' dot products.
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

// The draft of one row's tokens t = 0..L-1 (L <= kRecordStepBatch) from the state S it starts
// from, without forming the states between. With d_t = exp(g_t) per key channel,
// P_t = d_0 ... d_t and R_jt = d_(j+1) ... d_t (j < t), the step form
//     S_t = S_(t-1) diag(d_t) + u_t k_t^T,  u_t = beta_t (v_t - (S_(t-1) diag(d_t)) k_t),
//     o_t = S_t q_t
// unrolls to
//     u_t = beta_t (v_t - S (P_t k_t) - sum_(j<t) A[t][j] u_j),   A[t][j] = k_j . (R_jt k_t)
//     o_t = S (P_t q_t) + sum_(j<t) B[t][j] u_j + (k_t . q_t) u_t,   B[t][j] = k_j . (R_jt q_t)
// (products taken channel by channel). P_t k_t, P_t q_t, A and B are the same for every state row
// of the head, so each block computes them once, after the token preparation; a row then needs
// the 2L dot products with S and an L x L triangular sweep over scalars. Equal to the step form in
// exact arithmetic; in f32 it differs by the order of the additions only (an f32 state rounds to
// f32, so no rounding of the step form is skipped), which kda-math.md's f32 tolerance covers. The
// products are formed forwards, never divided, so strong decays underflow to zero as the step
// form's state does.
template <int K> struct alignas(16) ClosedDraft {
  float kt[kRecordStepBatch][K];  // P_t k_t
  float qt[kRecordStepBatch][K];  // P_t q_t
  float A[kRecordStepBatch][kRecordStepBatch];
  float B[kRecordStepBatch][kRecordStepBatch];
};
struct NoClosedDraft {};

// Fills cd from the prepared steps of sm (steps <= kRecordStepBatch); every thread of the block
// calls it; the caller synchronises the block before and after.
template <int K>
__device__ __forceinline__ void prepare_closed_draft(const StepInputs<K, kRecordStepBatch>& sm,
                                                     int steps, ClosedDraft<K>& cd) {
  for (int c = threadIdx.x; c < K; c += kRowThreads) {
    float P = 1.f;
    for (int t = 0; t < steps; ++t) {
      P *= sm.decay[t][c];
      cd.kt[t][c] = P * sm.k[t][c];
      cd.qt[t][c] = P * sm.q[t][c];
    }
  }
  // Pairs (j, t), j < t: warp w takes the j = w mod 4, walking t upwards so R_jt grows by one
  // factor per t; each entry is a sum over the K channels, lane + 32 i per lane.
  constexpr int kPerLane = K / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = warp; j + 1 < steps; j += kRowThreads / 32) {
    float r[kPerLane], kj[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      r[i] = 1.f;
      kj[i] = sm.k[j][lane + 32 * i];
    }
    for (int t = j + 1; t < steps; ++t) {
      float a = 0.f, b = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int c = lane + 32 * i;
        r[i] *= sm.decay[t][c];
        const float x = kj[i] * r[i];
        a += x * sm.k[t][c];
        b += x * sm.q[t][c];
      }
      a = group_sum<32>(a);
      b = group_sum<32>(b);
      if (lane == 0) {
        cd.A[t][j] = a;
        cd.B[t][j] = b;
      }
    }
  }
}

// One row's draft in closed form: writes o_t to out and u_t to the records, as the step form does.
// s is the row's state (not changed). Every lane of the warp must call it (the sums shuffle).
template <class IO, int K>
__device__ __forceinline__ void closed_draft_row(const float (&s)[16], const ClosedDraft<K>& cd,
                                                 const StepInputs<K, kRecordStepBatch>& sm,
                                                 int steps, int group_lane, int local, int at,
                                                 int V, const OutputRows& out,
                                                 std::int64_t first_token, int hv,
                                                 float* records_u, std::int64_t step_stride) {
  using Tile = RowTile<float, K>;
  float u[kRecordStepBatch];
#pragma unroll
  for (int t = 0; t < kRecordStepBatch; ++t) {
    u[t] = 0.f;
    if (t < steps) {
      // S (P_t k_t) and S (P_t q_t): independent of the earlier steps, so the compiler may run
      // them ahead of the earlier steps' sweeps.
      float sk = 0.f, o = 0.f;
#pragma unroll
      for (int c = 0; c < Tile::kVecs; ++c) {
        const int e = c * Tile::kPerVec;
        const int idx = (c * Tile::kLanes + group_lane) * Tile::kPerVec;
        const float4 kv = *reinterpret_cast<const float4*>(&cd.kt[t][idx]);
        const float4 qv = *reinterpret_cast<const float4*>(&cd.qt[t][idx]);
        sk += s[e] * kv.x + s[e + 1] * kv.y + s[e + 2] * kv.z + s[e + 3] * kv.w;
        o += s[e] * qv.x + s[e + 1] * qv.y + s[e + 2] * qv.z + s[e + 3] * qv.w;
      }
      sk = group_sum<Tile::kLanes>(sk);
      o = group_sum<Tile::kLanes>(o);
#pragma unroll
      for (int j = 0; j < t; ++j) {
        sk += cd.A[t][j] * u[j];
        o += cd.B[t][j] * u[j];
      }
      u[t] = sm.beta[t] * (sm.v[t][local] - sk);
      o += u[t] * sm.kq[t];
      if (at < V && group_lane == 0) {
        store_out<IO>(out, first_token + t, hv, at, o);
        records_u[t * step_stride + at] = u[t];
      }
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
  constexpr bool kReplay = !std::is_same_v<Params, RecordVerifyParams>;
  constexpr bool kDraft = !std::is_same_v<Params, ReplayCommitParams>;
  constexpr bool kClosed = kDraft && std::is_same_v<ST, float>;  // closed-form drafts possible
  using Tile = RowTile<ST, K>;
  // [0]: the replayed steps (k, exp(g) and the block's u in v's place) or the draft's tokens;
  // [1]: the draft's tokens when the call also replays.
  __shared__ StepInputs<K, kRecordStepBatch> sm[kReplay && kDraft ? 2 : 1];
  StepInputs<K, kRecordStepBatch>& replay_sm = sm[0];
  StepInputs<K, kRecordStepBatch>& draft_sm = sm[kReplay && kDraft ? 1 : 0];
  __shared__ std::conditional_t<kClosed, ClosedDraft<K>, NoClosedDraft> closed;

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
      if constexpr (kClosed) {
        if (length <= kRecordStepBatch) {
          prepare_closed_draft<K>(draft_sm, length, closed);
          __syncthreads();
        }
      }
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
    if constexpr (kClosed) {
      // The closed form whenever the draft fits one batch, whatever the replay before it, so
      // accept_verify's draft computes what record_verify's does on the same state.
      if (kOneBatch || length <= kRecordStepBatch) {  // kOneBatch: length <= the batch
        if constexpr (!kOneBatch) prepare_draft(0);
        const RecordVerifyParams& d = draft_of(p);
#pragma unroll
        for (int r = 0; r < Tile::kRows; ++r)
          closed_draft_row<IO, K>(s[r], closed, draft_sm, length, rows.group_lane,
                                  rows.local(chunk, r), rows.row(chunk, r), V, d.out, first_token,
                                  bc.hv, draft_head + 2 * K, d.records.step_stride);
        return;
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
    uint4 first[4];
    rows.load(head, V, 0, first);
    if (replay_steps > 0) prepare_replay(0);
    if (length > 0) prepare_draft(0);
    pipeline_preloaded_chunks<ST, K>(rows, head, V, chunks, first,
                                     [&](const uint4 (&raw)[4], int chunk) {
                                       process.template operator()<true>(raw, chunk);
                                     });
  } else if constexpr (!kFitsBatch) {
    pipeline_chunks<ST, K>(rows, head, V, chunks, [&](const uint4 (&raw)[4], int chunk) {
      process.template operator()<false>(raw, chunk);
    });
  }
}

// The largest number of records a row of the call replays (replay_commit: accepted <= T;
// accept_verify: prior_accepted <= prior_records' steps), and of draft tokens it verifies.
inline std::int64_t replay_bound(const RecordVerifyParams&) { return 0; }
inline std::int64_t replay_bound(const ReplayCommitParams& p) { return p.draft_tokens; }
inline std::int64_t replay_bound(const AcceptVerifyParams& p) { return p.prior_records.steps; }
inline std::int64_t draft_bound(const RecordVerifyParams& p) { return p.draft_tokens; }
inline std::int64_t draft_bound(const ReplayCommitParams&) { return 0; }
inline std::int64_t draft_bound(const AcceptVerifyParams& p) { return p.verify.draft_tokens; }

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
  const bool fits = replay_bound(p) <= kRecordStepBatch && draft_bound(p) <= kRecordStepBatch;
  if (fits)
    records_kernel<Params, IO, ST, K, true>
        <<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(p, guard, slices, chunks);
  else
    records_kernel<Params, IO, ST, K, false>
        <<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(p, guard, slices, chunks);
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
