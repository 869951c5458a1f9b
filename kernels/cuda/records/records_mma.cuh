// The record kernel for f32 state pools and drafts of at most kRecordStepBatch tokens (the usual
// speculative step), on tensor cores: the same three entry points as records_kernel.cuh, with the
// draft in closed form. A block owns one (row n, value head hv), every state row of it: each of its
// 8 warps a tile of 16 rows, which it loads once, replays the recorded steps onto (replay_commit,
// accept_verify), writes back when it replayed any, and drafts from (record_verify, accept_verify).
//
// The closed form. With d_t = exp(g_t) per key channel, P_t = d_0 ... d_t and
// R_jt = d_(j+1) ... d_t (j < t), the step form
//     S_t = S_(t-1) diag(d_t) + u_t k_t^T,  u_t = beta_t (v_t - (S_(t-1) diag(d_t)) k_t),
//     o_t = S_t q_t
// unrolls to
//     u_t = beta_t (v_t - S (P_t k_t) - sum_(j<t) A[t][j] u_j),   A[t][j] = k_j . (R_jt k_t)
//     o_t = S (P_t q_t) + sum_(j<t) B[t][j] u_j + (k_t . q_t) u_t,   B[t][j] = k_j . (R_jt q_t)
// (products taken channel by channel). P_t k_t, P_t q_t, A and B are the same for every state row
// of the head, so the block computes them once; then every row needs the 2L dot products
// S [P_0 k_0 .. P_(L-1) k_(L-1), P_0 q_0 .. P_(L-1) q_(L-1)] and an L x L triangular sweep over
// scalars. The dot products of a tile are one matrix product (16 x K by K x 8 or 16), taken with
// mma.sync in TF32 split in three (x = hi + lo, hi the TF32 rounding of x: hi hi + lo hi + hi lo,
// each into its own f32 accumulator), which keeps about 21 bits of each product: the error is of
// the order of f32's own rounding of the K-term sums, well inside kda-math.md's f32 tolerance. The
// step form's states are never formed: a record path writes none. The products are formed forwards,
// never divided, so strong decays underflow to zero as the step form's state does.
//
// The replayed steps use replay_element, the same rounding as records_kernel.cuh's replay and
// verify's steps, so accept_verify equals replay_commit followed by record_verify bit for bit.
#pragma once

#include <climits>
#include <cstdint>

#include "dispatch.cuh"
#include "records/records_common.cuh"

namespace kdaguard::gpu::detail {

inline constexpr int kMmaWarps = kMaxRowsPerBlock / 16;  // a 16-row tile per warp
inline constexpr int kMmaThreads = 32 * kMmaWarps;
// A warp per draft token and per replayed step of a batch.
static_assert(kMmaWarps >= kRecordStepBatch);

__device__ __forceinline__ std::uint32_t tf32_round(float x) {
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// c += a b for one m16n8k8 TF32 tile (fragments as the PTX ISA lays them out).
__device__ __forceinline__ void mma_tf32(float (&c)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The head's side of the closed form for drafts of at most 4 kN tokens: the product's right-hand
// matrix X (column t: P_t k_t, column 4 kN + t: P_t q_t; zero past the draft), split in TF32
// halves and stored by column, and the pair sums A and B.
template <int K, int kN> struct alignas(16) MmaDraft {
  static constexpr int kSteps = 4 * kN;
  static constexpr int kCols = 8 * kN;
  // A column's pitch in floats: the 8 lanes of a shared-memory phase read columns g, g + 1 at
  // the same channels, 16 banks apart, so no two of them meet in a bank.
  static constexpr int kPitch = K + 16;
  std::uint32_t x_hi[kCols][kPitch];
  std::uint32_t x_lo[kCols][kPitch];
  float A[kRecordStepBatch][kRecordStepBatch];
  float B[kRecordStepBatch][kRecordStepBatch];
};

// Fills the draft's head side from its prepared tokens (steps <= 4 kN); every thread of the block
// calls it; the caller synchronises the block before and after.
template <int K, int kN>
__device__ __forceinline__ void prepare_mma_draft(const StepInputs<K, kRecordStepBatch>& sm,
                                                  int steps, MmaDraft<K, kN>& x) {
  using Draft = MmaDraft<K, kN>;
  auto put = [&](int col, int c, float value) {
    const std::uint32_t hi = tf32_round(value);
    x.x_hi[col][c] = hi;
    x.x_lo[col][c] = tf32_round(value - __uint_as_float(hi));
  };
  for (int c = threadIdx.x; c < K; c += blockDim.x) {
    float P = 1.f;
#pragma unroll
    for (int t = 0; t < Draft::kSteps; ++t) {
      float kt = 0.f, qt = 0.f;
      if (t < steps) {
        P *= sm.decay[t][c];
        kt = P * sm.k[t][c];
        qt = P * sm.q[t][c];
      }
      put(t, c, kt);
      put(Draft::kSteps + t, c, qt);
    }
  }
  // Pairs (j, t), j < t: a warp per j, walking t upwards so R_jt grows by one factor per t; each
  // entry is a sum over the K channels, lane + 32 i per lane.
  constexpr int kPerLane = K / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = warp; j + 1 < steps; j += blockDim.x / 32) {
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
        const float v = kj[i] * r[i];
        a += v * sm.k[t][c];
        b += v * sm.q[t][c];
      }
      a = group_sum<32>(a);
      b = group_sum<32>(b);
      if (lane == 0) {
        x.A[t][j] = a;
        x.B[t][j] = b;
      }
    }
  }
}

template <class Params, class IO, int K, int kN>
__global__ void __launch_bounds__(kMmaThreads, 2)
    records_mma_kernel(const Params p, const GuardState guard) {
  constexpr bool kReplay = kReplays<Params>;
  constexpr bool kDraft = kDrafts<Params>;
  using Draft = MmaDraft<K, kN>;
  constexpr int kVecs = K / 16;  // 4-channel vectors per thread and state row
  // The replayed steps, and after them (past a barrier) each warp's tile of dot products.
  union ReplayOrTiles {
    ReplaySteps<K> replay;
    float tiles[kMmaWarps][16][Draft::kCols];
  };
  __shared__ ReplayOrTiles shared;
  __shared__ std::conditional_t<kDraft, StepInputs<K, kRecordStepBatch>, NoShared> tokens;
  __shared__ std::conditional_t<kDraft, Draft, NoShared> draft;

  const RecordPool pool = pool_of(p);
  const BlockCoords bc = block_coords(pool.HV, 1);
  const RecordRow row =
      begin_record_row<Params, IO>(p, guard, pool, bc.n, bc.hv, bc.hv == 0, 0, kMaxRowsPerBlock);
  // A draft past the call's bound reaches here only when the device check of that bound
  // (verify.row_length) is disabled: skipped whole.
  if (!row.run || row.length > Draft::kSteps) return;

  const int V = pool.V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, quad_lane = lane % 4;
  const int tile_row0 = 16 * warp;
  float* head = static_cast<float*>(pool.state.data) + row.slot * pool.state.slot_stride +
                static_cast<std::int64_t>(bc.hv) * V * K;

  // The thread's elements: rows tile_row0 + g + 8 r (r = 0, 1), channels 16 i + 4 quad_lane +
  // (0..3). A quad's four lanes cover 64 contiguous bytes of a row per i, so every load is
  // coalesced; the MMA's k index runs over channels in this order (the B side is read the same).
  auto vector_at = [&](int r, int i) {
    return head + static_cast<std::int64_t>(tile_row0 + g + 8 * r) * K + 16 * i + 4 * quad_lane;
  };
  const bool row_in[2] = {tile_row0 + g < V, tile_row0 + g + 8 < V};

  // The small loads first, a warp per draft token and per replayed step of the first batch: issued
  // after the state's 64 KB they waited behind it, and the whole block with them.
  float* draft_records = nullptr;
  [[maybe_unused]] LoadedToken<K> token;
  if constexpr (kDraft) {
    if (row.length > 0) {
      const RecordVerifyParams& d = draft_of(p);
      draft_records = d.records.data + bc.n * d.records.row_stride + bc.hv * d.records.head_stride;
      if (warp < row.length)
        token = load_token<IO, K>(d.in, bc.hv, row.first_token + warp, 0, kMaxRowsPerBlock, lane);
    }
  }
  const float* replay_records = nullptr;
  std::int64_t replay_step_stride = 0;
  [[maybe_unused]] LoadedReplayStep<K> first_step;
  if constexpr (kReplay) {
    if (row.replay_steps > 0) {
      const ReplaySource source = replay_of(p);
      replay_records = source.records.data + bc.n * source.records.row_stride +
                       bc.hv * source.records.head_stride;
      replay_step_stride = source.records.step_stride;
      if (warp < min(kRecordStepBatch, row.replay_steps))
        first_step = load_replay_step<K>(replay_records, replay_step_stride, warp, 0,
                                         kMaxRowsPerBlock, V, lane);
    }
  }

  float s[2][4 * kVecs];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      StateVec<float>::unpack(row_in[r] ? load_stream(vector_at(r, i)) : make_uint4(0, 0, 0, 0),
                              &s[r][4 * i]);
    }

  // The draft's tokens and the head side, while the state loads are in flight.
  if constexpr (kDraft) {
    if (row.length > 0) {
      if (warp < row.length)
        store_token<K, kRecordStepBatch>(draft_of(p).in, token, lane, warp, tokens,
                                         draft_records + warp * draft_of(p).records.step_stride);
      __syncthreads();
      prepare_mma_draft<K, kN>(tokens, row.length, draft);
      __syncthreads();
    }
  }

  if constexpr (kReplay) {
    if (row.replay_steps > 0) {
      for (int t0 = 0; t0 < row.replay_steps; t0 += kRecordStepBatch) {
        const int steps = min(kRecordStepBatch, row.replay_steps - t0);
        if (t0 == 0) {
          if (warp < steps) store_replay_step<K>(first_step, warp, lane, shared.replay);
        } else {
          __syncthreads();
          load_replay_steps<K>(replay_records, replay_step_stride, t0, steps, 0, kMaxRowsPerBlock,
                               V, shared.replay);
        }
        __syncthreads();
        for (int step = 0; step < steps; ++step) {
          const float u[2] = {shared.replay.u[step][tile_row0 + g],
                              shared.replay.u[step][tile_row0 + g + 8]};
#pragma unroll
          for (int i = 0; i < kVecs; ++i) {
            const float4 dv =
                *reinterpret_cast<const float4*>(&shared.replay.decay[step][16 * i + 4 * quad_lane]);
            const float4 kv =
                *reinterpret_cast<const float4*>(&shared.replay.k[step][16 * i + 4 * quad_lane]);
            const float dd[4] = {dv.x, dv.y, dv.z, dv.w};
            const float kk[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int j = 0; j < 4; ++j)
                s[r][4 * i + j] = replay_element(s[r][4 * i + j], dd[j], u[r], kk[j]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (row_in[r])
#pragma unroll
          for (int i = 0; i < kVecs; ++i)
            store_stream(vector_at(r, i), StateVec<float>::pack(&s[r][4 * i]));
      __syncthreads();  // the tiles below overwrite the replayed steps
    }
  }

  if constexpr (kDraft) {
    if (row.length == 0) return;
    // The tile's dot products: 16 rows x 8 kN columns, k over the thread's channel order.
    float hi_hi[kN][4] = {}, lo_hi[kN][4] = {}, hi_lo[kN][4] = {};
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      std::uint32_t a_hi[2][4], a_lo[2][4];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          a_hi[r][j] = tf32_round(s[r][4 * i + j]);
          // The low half goes in untruncated: the MMA reads its top 19 bits.
          a_lo[r][j] = __float_as_uint(s[r][4 * i + j] - __uint_as_float(a_hi[r][j]));
        }
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        const uint4 bh =
            *reinterpret_cast<const uint4*>(&draft.x_hi[8 * nt + g][16 * i + 4 * quad_lane]);
        const uint4 bl =
            *reinterpret_cast<const uint4*>(&draft.x_lo[8 * nt + g][16 * i + 4 * quad_lane]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // k index kk of this MMA is channel 16 i + 4 (kk % 4) + 2 h + kk / 4.
          const std::uint32_t ah[4] = {a_hi[0][2 * h], a_hi[1][2 * h], a_hi[0][2 * h + 1],
                                       a_hi[1][2 * h + 1]};
          const std::uint32_t al[4] = {a_lo[0][2 * h], a_lo[1][2 * h], a_lo[0][2 * h + 1],
                                       a_lo[1][2 * h + 1]};
          const std::uint32_t bh0 = h == 0 ? bh.x : bh.z, bh1 = h == 0 ? bh.y : bh.w;
          const std::uint32_t bl0 = h == 0 ? bl.x : bl.z, bl1 = h == 0 ? bl.y : bl.w;
          mma_tf32(hi_hi[nt], ah, bh0, bh1);
          mma_tf32(lo_hi[nt], al, bh0, bh1);
          mma_tf32(hi_lo[nt], ah, bl0, bl1);
        }
      }
    }
    float(&tile)[16][Draft::kCols] = shared.tiles[warp];
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        tile[g + 8 * (e / 2)][8 * nt + 2 * quad_lane + e % 2] =
            hi_hi[nt][e] + (lo_hi[nt][e] + hi_lo[nt][e]);
    __syncwarp();

    // The sweep: two lanes per row, each storing every other step's output and record.
    const RecordVerifyParams& d = draft_of(p);
    const int local = lane / 2, parity = lane % 2;
    const int at = tile_row0 + local;
    if (at >= V) return;
    float* records_u = draft_records + 2 * K;
    float u[Draft::kSteps];
#pragma unroll
    for (int t = 0; t < Draft::kSteps; ++t) {
      u[t] = 0.f;
      if (t < row.length) {
        float sk = tile[local][t];
#pragma unroll
        for (int j = 0; j < t; ++j) sk += draft.A[t][j] * u[j];
        u[t] = tokens.beta[t] * (tokens.v[t][at] - sk);
        float o = tile[local][Draft::kSteps + t];
#pragma unroll
        for (int j = 0; j < t; ++j) o += draft.B[t][j] * u[j];
        o += u[t] * tokens.kq[t];
        if (t % 2 == parity) {
          store_out<IO>(d.out, row.first_token + t, bc.hv, at, o);
          records_u[t * d.records.step_stride + at] = u[t];
        }
      }
    }
  }
}

// Launches the kernel for a call whose rows draft at most kRecordStepBatch tokens; rows > 0.
template <class Params, class IO, int K>
cudaError_t launch_records_mma_tile(const Params& p, GuardState guard, cudaStream_t stream) {
  const RecordPool pool = pool_of(p);
  const std::int64_t blocks = static_cast<std::int64_t>(pool.rows) * pool.HV;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const auto grid = static_cast<unsigned>(blocks);
  if (!kDrafts<Params> || draft_bound(p) <= 4)
    records_mma_kernel<Params, IO, K, 1><<<grid, kMmaThreads, 0, stream>>>(p, guard);
  else if constexpr (kDrafts<Params>)
    records_mma_kernel<Params, IO, K, 2><<<grid, kMmaThreads, 0, stream>>>(p, guard);
  return cudaGetLastError();
}

}  // namespace kdaguard::gpu::detail
