// The record kernels for f32 state pools and drafts of at most kRecordStepBatch tokens (the usual
// speculative step), on tensor cores: record_verify and accept_verify with the draft in closed
// form (replay_commit has no draft and runs the step form, records_kernel.cuh). A block per (row n,
// value head hv, 64 state rows) holds its rows, each of its 4 warps a tile of 16, which it loads
// once, replays the recorded steps onto (accept_verify), writes back when it replayed any, and
// drafts from. Drafts of up to 4 tokens are one kernel: its warps prepare the tokens (a warp per
// token) while the state's loads are in flight. Longer drafts come prepared by a token kernel
// launched first (record_tokens_kernel).
//
// The closed form. With d_t = exp(g_t) per key channel, P_t = d_0 ... d_t and
// R_jt = d_(j+1) ... d_t (j < t), the step form
//     S_t = S_(t-1) diag(d_t) + u_t k_t^T,  u_t = beta_t (v_t - (S_(t-1) diag(d_t)) k_t),
//     o_t = S_t q_t
// unrolls to
//     u_t = beta_t (v_t - S (P_t k_t) - sum_(j<t) A[t][j] u_j),   A[t][j] = k_j . (R_jt k_t)
//     o_t = S (P_t q_t) + sum_(j<t) B[t][j] u_j + (k_t . q_t) u_t,   B[t][j] = k_j . (R_jt q_t)
// (products taken channel by channel). P_t k_t, P_t q_t, A and B are the same for every state row
// of the head, so A, B and X = [P_t k_t, P_t q_t] are formed once per block (A and B once per head
// by the token kernel, for longer drafts); then every row needs the 2L dot products
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
#include <type_traits>

#include "dispatch.cuh"
#include "records/records_common.cuh"

namespace kdaguard::gpu::detail {

// A block holds 64 state rows of a head (a head of V = 128 takes two blocks): four blocks of 128
// registers a thread fit an SM, so that one block's loads overlap another's arithmetic.
inline constexpr int kMmaRows = 64;
inline constexpr int kMmaWarps = kMmaRows / 16;  // a 16-row tile per warp
inline constexpr int kMmaThreads = 32 * kMmaWarps;

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

// The head's side of the closed form for drafts of at most kSteps = 4 kN tokens, as the tensor-core
// kernel holds it: the product's right-hand matrix X (column t: P_t k_t, column kSteps + t:
// P_t q_t; zero past the draft), split in TF32 halves and stored by column, the pair sums A and B,
// and per token beta, k . q, q's factor and v of the block's rows.
template <int K, int kN> struct alignas(16) MmaDraft {
  static constexpr int kSteps = 4 * kN;
  static constexpr int kCols = 8 * kN;
  // A column's pitch in floats: the 8 lanes of a shared-memory phase read columns g, g + 1 at
  // the same channels, 16 banks apart, so no two of them meet in a bank.
  static constexpr int kPitch = K + 16;
  std::uint32_t x_hi[kCols][kPitch];
  std::uint32_t x_lo[kCols][kPitch];
  float A[kSteps][kSteps];
  float B[kSteps][kSteps];
  float beta[kSteps], kq[kSteps], q_factor[kSteps];  // q_factor: drafts the token kernel prepared
  float v[kSteps][kMmaRows];  // the block's rows
};

// What the token kernel hands the tensor-core kernel for draft token t, in the u part of token t's
// own record, at the first rows of each block's kMmaRows (V is a multiple of 64), which only that
// block overwrites, after reading them, with u: row t of A and of B, beta_t, k_t . q_t and q_t's
// factor.
template <int kSteps> struct HeadSideHandoff {
  static constexpr int kA = 0, kB = kSteps, kBeta = 2 * kSteps, kKq = kBeta + 1;
  static constexpr int kQFactor = kKq + 1;
  static constexpr int kFloats = kQFactor + 1;
  static_assert(kFloats <= 64);
};

// Token t's pair sums A[t][j] = k_j . (R_jt k_t) and B[t][j] = k_j . (R_jt q_t) for j < t, walking
// j downwards so that R_jt gains one factor per j, from every token's k and decay by channel (lane
// + 32 i): lane j gets A[t][j] and B[t][j] in a_of_lane and b_of_lane, which lanes j >= t keep as
// they are. The whole warp calls it.
template <int K, int kPerLane>
__device__ __forceinline__ void pair_sums(int t, int lane, const float (*k)[K],
                                          const float (*decay)[K], const LaneToken<kPerLane>& token,
                                          float& a_of_lane, float& b_of_lane) {
  float r[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) r[i] = 1.f;
  for (int j = t - 1; j >= 0; --j) {
    float a = 0.f, b = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      r[i] *= decay[j + 1][c];
      const float v = k[j][c] * r[i];
      a += v * token.k[i];
      b += v * token.q[i];
    }
    a = group_sum<32>(a);
    b = group_sum<32>(b);
    if (lane == j) {
      a_of_lane = a;
      b_of_lane = b;
    }
  }
}

// The token work of drafts of 5 to 8 tokens, run before the tensor-core kernel: a block per (row n,
// value head hv), a warp per draft token t. Each warp prepares its token (norms, gate, beta, k . q)
// and writes the token's record g | k; then, once every token is prepared, its pair sums and its
// handoff. The tensor-core kernel's four warps prepare drafts of up to 4 tokens themselves;
// two tokens a warp lengthened every block's chain by more than this kernel takes (bench/NOTES.md,
// 2026-12-07).
template <class Params, class IO, int K, int kN>
__global__ void __launch_bounds__(128 * kN)
    record_tokens_kernel(const Params p, const GuardState guard) {
  constexpr int kSteps = 4 * kN;
  constexpr int kPerLane = K / 32;
  using Handoff = HeadSideHandoff<kSteps>;
  static_assert(kSteps <= 32);
  // What the other tokens' warps read: k and the decay of every token, by channel.
  __shared__ float token_k[kSteps][K], token_decay[kSteps][K];
  wait_for_prior_grids();
  allow_next_grid();  // the tensor-core kernel's blocks wait for this grid before reading

  const RecordPool pool = pool_of(p);
  const BlockCoords bc = block_coords(pool.HV, 1);
  // The tensor-core kernel raises the row's faults and zeroes a padding row's outputs; a row it
  // skips gets no record here either.
  const RecordRow row = begin_record_row<Params, IO>(p, guard, pool, bc.n, bc.hv, false, 0, 0);
  if (!row.run || row.length == 0 || row.length > kSteps) return;

  const RecordVerifyParams& d = draft_of(p);
  const int t = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* record = d.records.data + bc.n * d.records.row_stride + bc.hv * d.records.head_stride +
                  t * d.records.step_stride;
  LaneToken<kPerLane> token{};
  if (t < row.length) {
    token = finish_lane_token<K, kPerLane, 32, !std::is_same_v<IO, float>>(
        d.in, load_lane_token<IO, K, kPerLane>(d.in, bc.hv, row.first_token + t,
                                               [&](int i) { return lane + 32 * i; }));
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      token_k[t][c] = token.k[i];
      token_decay[t][c] = token.decay[i];
      record[c] = token.g[i];
      record[K + c] = token.k[i];
    }
  }
  __syncthreads();
  if (t >= row.length) return;
  float a_of_lane = 0.f, b_of_lane = 0.f;  // lane j: A[t][j], B[t][j]; zero for j >= t
  pair_sums<K, kPerLane>(t, lane, token_k, token_decay, token, a_of_lane, b_of_lane);
  for (int row0 = 0; row0 < pool.V; row0 += kMmaRows) {
    float* handoff = record + 2 * K + row0;
    if (lane < kSteps) {
      handoff[Handoff::kA + lane] = a_of_lane;
      handoff[Handoff::kB + lane] = b_of_lane;
    } else if (lane == Handoff::kBeta) {
      handoff[lane] = token.beta;
    } else if (lane == Handoff::kKq) {
      handoff[lane] = token.kq;
    } else if (lane == Handoff::kQFactor) {
      handoff[lane] = token.q_factor;
    }
  }
}

// One draft token's inputs on a lane's kCh channels as loaded, in their own dtypes: converted only
// after the state's loads are issued (a conversion waits for its load, and nothing after it is
// issued meanwhile).
template <class IO, int kCh> struct RawLaneToken {
  IO k[kCh], q[kCh];
  std::uint32_t gate[kCh];
  float bias[kCh];
  float a_log = 0.f;
  std::uint32_t b = 0;
};

template <class IO, int K, int kCh>
__device__ __forceinline__ RawLaneToken<IO, kCh> load_raw_lane_token(const TokenInputs& in, int hv,
                                                                     std::int64_t token, int lane) {
  const int h = hv / (in.HV / in.H);
  const bool raw_gate = in.gate_kind != GateKind::activated;
  const IO* qp = static_cast<const IO*>(in.q.data) + token * in.q.token_stride + h * in.q.head_stride;
  const IO* kp = static_cast<const IO*>(in.k.data) + token * in.k.token_stride + h * in.k.head_stride;
  const std::int64_t gate_base = token * in.gate.token_stride + hv * in.gate.head_stride;
  RawLaneToken<IO, kCh> x;
#pragma unroll
  for (int i = 0; i < kCh; ++i) {
    const int c = lane + 32 * i;
    x.k[i] = kp[c];
    x.q[i] = qp[c];
    x.gate[i] = load_bits(in.gate.data, in.gate_dtype, gate_base + c);
    x.bias[i] = raw_gate && in.dt_bias != nullptr ? in.dt_bias[hv * K + c] : 0.f;
  }
  if (raw_gate) x.a_log = in.A_log[hv];
  x.b = load_bits(in.beta.data, in.beta_dtype, token * in.beta.token_stride + hv * in.beta.head_stride);
  return x;
}

template <class IO, int kCh>
__device__ __forceinline__ LaneTokenInputs<kCh> converted(const TokenInputs& in,
                                                          const RawLaneToken<IO, kCh>& raw) {
  LaneTokenInputs<kCh> x;
#pragma unroll
  for (int i = 0; i < kCh; ++i) {
    x.k[i] = to_f32(raw.k[i]);
    x.q[i] = to_f32(raw.q[i]);
    x.gate[i] = bits_to_f32(raw.gate[i], in.gate_dtype);
    x.bias[i] = raw.bias[i];
  }
  x.a_log = raw.a_log;
  x.b = bits_to_f32(raw.b, in.beta_dtype);
  return x;
}

// The draft's tokens as the block's warps prepared them, per channel: what the pair sums and X
// read.
template <int K, int kSteps> struct alignas(16) PreparedTokens {
  float k[kSteps][K], q[kSteps][K], decay[kSteps][K];
};

template <class Params, class IO, int K, int kN>
__global__ void __launch_bounds__(kMmaThreads, 4)
    records_mma_kernel(const Params p, const GuardState guard) {
  static_assert(kDrafts<Params>, "replay_commit runs the step form (records_kernel.cuh)");
  static_assert(K <= kMmaThreads && kN * kMmaWarps == MmaDraft<K, kN>::kSteps);
  constexpr bool kReplay = kReplays<Params>;
  using Draft = MmaDraft<K, kN>;
  constexpr int kVecs = K / 16;  // 4-channel vectors per thread and state row
  constexpr int kPerLane = K / 32;
  // Drafts of up to 4 tokens: the block's warps prepare them, a warp per token, while the state's
  // loads are in flight. Longer drafts come prepared by the token kernel (record_tokens_kernel),
  // whose head-side scalars the block reads from the records' u parts.
  constexpr bool kOwnTokens = kN == 1;
  using Handoff = HeadSideHandoff<Draft::kSteps>;
  // The replayed steps, and after them (past a barrier) each warp's tile of dot products.
  union ReplayOrTiles {
    ReplaySteps<K> replay;
    float tiles[kMmaWarps][16][Draft::kCols];
  };
  __shared__ ReplayOrTiles shared;
  __shared__ Draft draft;
  __shared__ std::conditional_t<kOwnTokens, PreparedTokens<K, Draft::kSteps>, NoShared> tokens;

  // The draft's inputs, the row arrays and the state; after a token kernel, which waited for them,
  // the wait is for its records and handoff, and comes where the block first reads those.
  if constexpr (kOwnTokens) wait_for_prior_grids();
  allow_next_grid();  // the next kernel's blocks wait for this grid before their first access
  const RecordPool pool = pool_of(p);
  const BlockCoords bc = block_coords(pool.HV, pool.V / kMmaRows);
  const int row0 = bc.slice * kMmaRows;  // the block's first state row
  const RecordRow row = begin_record_row<Params, IO>(p, guard, pool, bc.n, bc.hv,
                                                     bc.hv == 0 && bc.slice == 0, row0, kMmaRows);
  // A draft past the call's bound reaches here only when the device check of that bound
  // (verify.row_length) is disabled: skipped whole.
  if (!row.run || row.length > Draft::kSteps) return;

  const int V = pool.V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, quad_lane = lane % 4;
  const int tile_row0 = 16 * warp;  // within the block's rows
  float* head = static_cast<float*>(pool.state.data) + row.slot * pool.state.slot_stride +
                static_cast<std::int64_t>(bc.hv) * V * K;

  // The thread's elements: rows tile_row0 + g + 8 r (r = 0, 1), channels 16 i + 4 quad_lane +
  // (0..3). A quad's four lanes cover 64 contiguous bytes of a row per i, so every load is
  // coalesced; the MMA's k index runs over channels in this order (the B side is read the same).
  auto vector_at = [&](int r, int i) {
    return head + static_cast<std::int64_t>(row0 + tile_row0 + g + 8 * r) * K + 16 * i +
           4 * quad_lane;
  };

  // The small loads first: issued after the state's 32 KB they waited behind it, and the whole
  // block with them. Per draft token t a warp (t % kMmaWarps) loads its inputs (its own tokens) or
  // its handoff (the token kernel's), and the block's rows of its v; thread c, with the token
  // kernel, the channel's g, k and q's input of every token; per replayed step of the first four a
  // warp loads its record. The inputs stay in their own dtype until the state's loads are issued: a
  // conversion here would wait for its load before the state's loads could start.
  const RecordVerifyParams& d = draft_of(p);
  float* draft_records = d.records.data + bc.n * d.records.row_stride + bc.hv * d.records.head_stride;
  const int channel = threadIdx.x;
  [[maybe_unused]] RawLaneToken<IO, kPerLane> raw[kN];
  IO v_in[kN][kMmaRows / 32];
  [[maybe_unused]] float handoff_in[kN];
  [[maybe_unused]] float g_in[Draft::kSteps], k_in[Draft::kSteps];
  [[maybe_unused]] IO q_in[Draft::kSteps];
  if constexpr (kOwnTokens) {
#pragma unroll
    for (int m = 0; m < kN; ++m) {
      const int t = warp + kMmaWarps * m;
      if (t < row.length) {
        const std::int64_t token = row.first_token + t;
        raw[m] = load_raw_lane_token<IO, K, kPerLane>(d.in, bc.hv, token, lane);
        const IO* vp = static_cast<const IO*>(d.in.v.data) + token * d.in.v.token_stride +
                       bc.hv * d.in.v.head_stride + row0;
#pragma unroll
        for (int i = 0; i < kMmaRows / 32; ++i) v_in[m][i] = vp[lane + 32 * i];
      }
    }
  } else if (row.length > 0) {
    wait_for_prior_grids();  // the token kernel's records and handoff
#pragma unroll
    for (int m = 0; m < kN; ++m) {
      const int t = warp + kMmaWarps * m;
      handoff_in[m] = 0.f;
      if (t < row.length) {
        const std::int64_t token = row.first_token + t;
        const IO* vp = static_cast<const IO*>(d.in.v.data) + token * d.in.v.token_stride +
                       bc.hv * d.in.v.head_stride + row0;
#pragma unroll
        for (int i = 0; i < kMmaRows / 32; ++i) v_in[m][i] = vp[lane + 32 * i];
        if (lane < Handoff::kFloats)
          handoff_in[m] = draft_records[t * d.records.step_stride + 2 * K + row0 + lane];
      }
    }
    if (channel < K) {
      const int h = bc.hv / (d.in.HV / d.in.H);
      const IO* qp = static_cast<const IO*>(d.in.q.data) + row.first_token * d.in.q.token_stride +
                     h * d.in.q.head_stride + channel;
#pragma unroll
      for (int t = 0; t < Draft::kSteps; ++t) {
        g_in[t] = k_in[t] = 0.f;
        q_in[t] = IO{};
        if (t < row.length) {
          const float* record = draft_records + t * d.records.step_stride;
          g_in[t] = record[channel];
          k_in[t] = record[K + channel];
          q_in[t] = qp[t * d.in.q.token_stride];
        }
      }
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
      if (warp < row.replay_steps)
        first_step = load_replay_step<K>(replay_records, replay_step_stride, warp, row0, kMmaRows,
                                         V, lane);
    }
  }

  float s[2][4 * kVecs];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      StateVec<float>::unpack(load_stream(vector_at(r, i)), &s[r][4 * i]);
    }

  // X's columns at the thread's channel, split in TF32 halves, from each draft token's decay, k
  // and q there: column t P_t k_t, column kSteps + t P_t q_t, zero past the draft.
  const auto put_columns = [&](auto&& decay, auto&& k, auto&& q) {
    const auto put = [&](int col, float x) {
      const std::uint32_t hi = tf32_round(x);
      draft.x_hi[col][channel] = hi;
      draft.x_lo[col][channel] = tf32_round(x - __uint_as_float(hi));
    };
    float P = 1.f;
#pragma unroll
    for (int t = 0; t < Draft::kSteps; ++t) {
      float xk = 0.f, xq = 0.f;
      if (t < row.length) {
        P *= decay(t);
        xk = P * k(t);
        xq = P * q(t);
      }
      put(t, xk);
      put(Draft::kSteps + t, xq);
    }
  };
  // The draft's tokens, while the state loads are in flight: each warp prepares its tokens (the
  // block of the head's first rows writes their records' g and k), then their pair sums; then X
  // from the prepared tokens, channel by channel.
  if constexpr (kOwnTokens) {
    if (row.length > 0) {
      LaneToken<kPerLane> token[kN];
#pragma unroll
      for (int m = 0; m < kN; ++m) {
        const int t = warp + kMmaWarps * m;
        if (t < row.length) {
          token[m] = finish_lane_token<K, kPerLane, 32, !std::is_same_v<IO, float>>(
              d.in, converted(d.in, raw[m]));
          float* record = draft_records + t * d.records.step_stride;
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) {
            const int c = lane + 32 * i;
            tokens.k[t][c] = token[m].k[i];
            tokens.q[t][c] = token[m].q[i];
            tokens.decay[t][c] = token[m].decay[i];
            if (row0 == 0) {
              record[c] = token[m].g[i];
              record[K + c] = token[m].k[i];
            }
          }
#pragma unroll
          for (int i = 0; i < kMmaRows / 32; ++i) draft.v[t][lane + 32 * i] = to_f32(v_in[m][i]);
          if (lane == 0) {
            draft.beta[t] = token[m].beta;
            draft.kq[t] = token[m].kq;
          }
        }
      }
      __syncthreads();
#pragma unroll
      for (int m = 0; m < kN; ++m) {
        const int t = warp + kMmaWarps * m;
        if (t < row.length) {
          float a_of_lane = 0.f, b_of_lane = 0.f;  // lane j: A[t][j], B[t][j]; zero for j >= t
          pair_sums<K, kPerLane>(t, lane, tokens.k, tokens.decay, token[m], a_of_lane, b_of_lane);
          if (lane < Draft::kSteps) {
            draft.A[t][lane] = a_of_lane;
            draft.B[t][lane] = b_of_lane;
          }
        }
      }
      if (channel < K)
        put_columns([&](int t) { return tokens.decay[t][channel]; },
                    [&](int t) { return tokens.k[t][channel]; },
                    [&](int t) { return tokens.q[t][channel]; });
      __syncthreads();
    }
  } else if (row.length > 0) {
    // The head side, while the state loads are in flight: the handed-over scalars and v, then X
    // from the records' g and k and q's input times its factor, the same operations as the token
    // preparation's, so X is bit for bit what a block preparing its own tokens would hold.
#pragma unroll
    for (int m = 0; m < kN; ++m) {
      const int t = warp + kMmaWarps * m;
      if (t < row.length) {
#pragma unroll
        for (int i = 0; i < kMmaRows / 32; ++i) draft.v[t][lane + 32 * i] = to_f32(v_in[m][i]);
        const float x = handoff_in[m];
        if (lane < Handoff::kB) draft.A[t][lane - Handoff::kA] = x;
        else if (lane < Handoff::kBeta) draft.B[t][lane - Handoff::kB] = x;
        else if (lane == Handoff::kBeta) draft.beta[t] = x;
        else if (lane == Handoff::kKq) draft.kq[t] = x;
        else if (lane == Handoff::kQFactor) draft.q_factor[t] = x;
      }
    }
    __syncthreads();
    if (channel < K)
      put_columns([&](int t) { return expf(g_in[t]); }, [&](int t) { return k_in[t]; },
                  [&](int t) { return to_f32(q_in[t]) * draft.q_factor[t]; });
    __syncthreads();
  }

  if constexpr (kReplay) {
    if (row.replay_steps > 0) {
      for (int t0 = 0; t0 < row.replay_steps; t0 += kRecordStepBatch) {
        const int steps = min(kRecordStepBatch, row.replay_steps - t0);
        if (t0 == 0) {
          if (warp < steps) store_replay_step<K>(first_step, warp, lane, shared.replay);
          for (int step = warp + kMmaWarps; step < steps; step += kMmaWarps)
            store_replay_step<K>(load_replay_step<K>(replay_records, replay_step_stride, step,
                                                     row0, kMmaRows, V, lane),
                                 step, lane, shared.replay);
        } else {
          __syncthreads();
          load_replay_steps<K>(replay_records, replay_step_stride, t0, steps, row0, kMmaRows, V,
                               shared.replay);
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
#pragma unroll
        for (int i = 0; i < kVecs; ++i)
          store_stream(vector_at(r, i), StateVec<float>::pack(&s[r][4 * i]));
      __syncthreads();  // the tiles below overwrite the replayed steps
    }
  }

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

  // The sweep: two lanes per row, each storing every other step's output and record u (over the
  // token kernel's handoff, read above).
  const int local = lane / 2, parity = lane % 2;
  const int in_block = tile_row0 + local, at = row0 + in_block;
  float* records_u = draft_records + 2 * K;
  float u[Draft::kSteps];
#pragma unroll
  for (int t = 0; t < Draft::kSteps; ++t) {
    u[t] = 0.f;
    if (t < row.length) {
      float sk = tile[local][t];
#pragma unroll
      for (int j = 0; j < t; ++j) sk += draft.A[t][j] * u[j];
      u[t] = draft.beta[t] * (draft.v[t][in_block] - sk);
      float o = tile[local][Draft::kSteps + t];
#pragma unroll
      for (int j = 0; j < t; ++j) o += draft.B[t][j] * u[j];
      o += u[t] * draft.kq[t];
      if (t % 2 == parity) {
        store_out<IO>(d.out, row.first_token + t, bc.hv, at, o);
        records_u[t * d.records.step_stride + at] = u[t];
      }
    }
  }
}

// Launches the token kernel (a block per row and value head), then the tensor-core kernel (a block
// per kMmaRows state rows of each), each as the programmatic dependant of the kernel before it,
// for drafts of 5 to 8 tokens; shorter drafts need the tensor-core kernel alone.
template <class Params, class IO, int K, int kN>
cudaError_t launch_draft_kernels(const Params& p, GuardState guard, unsigned heads,
                                 unsigned slices, cudaStream_t stream) {
  if constexpr (kN > 1) {
    if (const cudaError_t e = launch_after_prior_grid(record_tokens_kernel<Params, IO, K, kN>,
                                                      heads, 128 * kN, 0, stream, p, guard);
        e != cudaSuccess)
      return e;
  }
  return launch_after_prior_grid(records_mma_kernel<Params, IO, K, kN>, heads * slices,
                                 kMmaThreads, 0, stream, p, guard);
}

// Launches the kernels for a call whose rows draft at most kRecordStepBatch tokens; rows > 0.
template <class Params, class IO, int K>
cudaError_t launch_records_mma_tile(const Params& p, GuardState guard, cudaStream_t stream) {
  const RecordPool pool = pool_of(p);
  const std::int64_t heads = static_cast<std::int64_t>(pool.rows) * pool.HV;
  const int slices = pool.V / kMmaRows;
  if (heads == 0) return cudaSuccess;
  if (heads * slices > INT_MAX) return cudaErrorInvalidConfiguration;
  const auto h = static_cast<unsigned>(heads);
  const auto sl = static_cast<unsigned>(slices);
  if (draft_bound(p) <= 4) return launch_draft_kernels<Params, IO, K, 1>(p, guard, h, sl, stream);
  return launch_draft_kernels<Params, IO, K, 2>(p, guard, h, sl, stream);
}

}  // namespace kdaguard::gpu::detail
