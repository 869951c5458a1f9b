// The per-token recurrence on the GPU, shared by decode (one token per row, state updated in
// place) and verify (up to T tokens per row, every step's state to a scratch slot).
//
// Work split: rows of a state are independent given the token's q, k, g and beta (row v needs
// v[v] and nothing of the other rows), so a block owns one (row n, value head hv) and a slice of
// kRowsPerBlock state rows. A group of K/16 lanes holds one state row, 16 elements per lane, in
// registers; the K reductions stay inside the group (shuffles). The token's L2 norms, gate and
// sigmoid are recomputed by every block (one warp per token, K/32 elements per lane): a few
// hundred flops against kRowsPerBlock * K * 2 state elements moved. The state row is loaded before
// that prologue, so its latency overlaps it; it is read once and written once per call, and verify
// keeps it in registers across its T steps.
#pragma once

#include <cstdint>

#include "device_common.cuh"
#include "kdaguard/params.h"
#include "row_checks.cuh"

namespace kdaguard::gpu::detail {

inline constexpr int kRowThreads = 128;

template <class ST, int K, int R> struct RowTile {
  static constexpr int kLanes = K / 16;                    // lanes per state row
  static constexpr int kRowsPerPass = kRowThreads / kLanes;
  static constexpr int kRowsPerBlock = kRowsPerPass * R;
  static constexpr int kPerVec = StateVec<ST>::kPerVec;    // elements per 16-byte vector
  static constexpr int kVecs = 16 / kPerVec;               // vectors per lane per row
  static_assert(K % 32 == 0 && kLanes <= 32 && 32 % kLanes == 0);
};

// The prepared inputs of up to kSteps tokens, as the row groups read them.
template <int K, int kSteps, int kRowsPerBlock> struct alignas(16) StepInputs {
  float k[kSteps][K];
  float q[kSteps][K];      // normalised and scaled
  float decay[kSteps][K];  // exp(g)
  float v[kSteps][kRowsPerBlock];
  float beta[kSteps];
  float kq[kSteps];        // k . q, so o = S' q + u (k . q) needs one reduction pass
  std::int64_t dst[kSteps];  // verify: flat scratch slot of the step, -1 = not written
};

// One warp prepares one token for value head hv: q/k (optional L2 norm, scale), the gate's decay
// exp(g) per key channel, beta, k.q, and v for the block's rows.
template <class IO, int K, int kSteps, int kRowsPerBlock>
__device__ __forceinline__ void prepare_token(const TokenInputs& in, int hv, std::int64_t token,
                                              int row0, int lane, int step,
                                              StepInputs<K, kSteps, kRowsPerBlock>& sm) {
  constexpr int kPerLane = K / 32;
  const int h = hv / (in.HV / in.H);
  const IO* qp = static_cast<const IO*>(in.q.data) + token * in.q.token_stride + h * in.q.head_stride;
  const IO* kp = static_cast<const IO*>(in.k.data) + token * in.k.token_stride + h * in.k.head_stride;
  const std::int64_t gate_base = token * in.gate.token_stride + hv * in.gate.head_stride;

  float kx[kPerLane], qx[kPerLane], gx[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    kx[i] = to_f32(kp[c]);
    qx[i] = to_f32(qp[c]);
    gx[i] = load_f32(in.gate.data, in.gate_dtype, gate_base + c);
  }
  const float b = load_f32(in.beta.data, in.beta_dtype,
                           token * in.beta.token_stride + hv * in.beta.head_stride);

  float q_factor = in.scale;
  if (in.use_qk_l2norm) {
    float kk = 0.f, qq = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      kk += kx[i] * kx[i];
      qq += qx[i] * qx[i];
    }
    kk = warp_sum(kk);
    qq = warp_sum(qq);
    const float k_factor = 1.0f / sqrtf(kk + 1e-6f);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) kx[i] *= k_factor;
    q_factor = (1.0f / sqrtf(qq + 1e-6f)) * in.scale;
  }
  float kq = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    qx[i] *= q_factor;
    kq += kx[i] * qx[i];
  }
  kq = warp_sum(kq);

  const float a_exp = in.gate_kind == GateKind::activated ? 0.f : expf(in.A_log[hv]);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    float g = gx[i];
    if (in.gate_kind != GateKind::activated) {
      const float x = in.dt_bias != nullptr ? g + in.dt_bias[hv * K + c] : g;
      if (in.gate_kind == GateKind::softplus) {
        const float softplus = x > 20.f ? x : log1pf(expf(x));
        g = -a_exp * softplus;
      } else {
        g = in.lower_bound / (1.f + expf(-a_exp * x));
      }
    }
    sm.k[step][c] = kx[i];
    sm.q[step][c] = qx[i];
    sm.decay[step][c] = expf(g);
  }
  if (lane == 0) {
    sm.beta[step] = in.beta_kind == BetaKind::logits ? 1.f / (1.f + expf(-b)) : b;
    sm.kq[step] = kq;
  }
  const IO* vp = static_cast<const IO*>(in.v.data) + token * in.v.token_stride + hv * in.v.head_stride;
  for (int i = lane; i < kRowsPerBlock; i += 32) {
    const int row = row0 + i;
    sm.v[step][i] = row < in.V ? to_f32(vp[row]) : 0.f;
  }
}

// The lane's 16 elements of a step's k, q and decay, in the lane's state-row order.
template <class ST, int K, int R> struct LaneInputs {
  using Tile = RowTile<ST, K, R>;
  float k[16], q[16], decay[16];

  template <int kSteps, int kRowsPerBlock>
  __device__ __forceinline__ void load(const StepInputs<K, kSteps, kRowsPerBlock>& sm, int step,
                                       int group_lane) {
#pragma unroll
    for (int c = 0; c < Tile::kVecs; ++c) {
#pragma unroll
      for (int w = 0; w < Tile::kPerVec; w += 4) {
        const int at = (c * Tile::kLanes + group_lane) * Tile::kPerVec + w;
        const float4 kv = *reinterpret_cast<const float4*>(&sm.k[step][at]);
        const float4 qv = *reinterpret_cast<const float4*>(&sm.q[step][at]);
        const float4 dv = *reinterpret_cast<const float4*>(&sm.decay[step][at]);
        const int e = c * Tile::kPerVec + w;
        k[e] = kv.x; k[e + 1] = kv.y; k[e + 2] = kv.z; k[e + 3] = kv.w;
        q[e] = qv.x; q[e + 1] = qv.y; q[e + 2] = qv.z; q[e + 3] = qv.w;
        decay[e] = dv.x; decay[e + 1] = dv.y; decay[e + 2] = dv.z; decay[e + 3] = dv.w;
      }
    }
  }
};

// One token on one state row held by a lane group: decay, prediction error on the decayed row,
// rank-1 correction; returns the row's output o = S_new . q. Every lane of the warp must call it
// (the reductions shuffle across the whole warp).
template <int kLanes>
__device__ __forceinline__ float step_row(float (&s)[16], const float (&k)[16],
                                          const float (&q)[16], const float (&decay)[16],
                                          float beta, float kq, float v) {
  float sk = 0.f, sq = 0.f;
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    s[e] *= decay[e];
    sk += s[e] * k[e];
    sq += s[e] * q[e];
  }
  sk = group_sum<kLanes>(sk);
  sq = group_sum<kLanes>(sq);
  const float u = beta * (v - sk);
#pragma unroll
  for (int e = 0; e < 16; ++e) s[e] += u * k[e];
  return sq + u * kq;
}

// Block coordinates: blockIdx.x enumerates (row n, head hv, row slice vb), slices fastest.
struct BlockCoords {
  std::int32_t n, hv, vb;
};
__device__ __forceinline__ BlockCoords block_coords(std::int32_t heads, std::int32_t slices) {
  const std::int64_t b = blockIdx.x;
  BlockCoords c;
  c.vb = static_cast<std::int32_t>(b % slices);
  const std::int64_t rest = b / slices;
  c.hv = static_cast<std::int32_t>(rest % heads);
  c.n = static_cast<std::int32_t>(rest / heads);
  return c;
}

template <class IO>
__device__ __forceinline__ void store_out(const OutputRows& out, std::int64_t token, int hv, int row,
                                          float value) {
  static_cast<IO*>(out.data)[token * out.token_stride + hv * out.head_stride + row] =
      from_f32<IO>(value);
}

// Loads the lane's part of its R rows of one (slot, head): raw 16-byte vectors, zeros for rows
// past V.
template <class ST, int K, int R>
__device__ __forceinline__ void load_rows(const ST* head_base, int V, int row0, int row_in_pass,
                                          int group_lane, uint4 (&raw)[R][RowTile<ST, K, R>::kVecs]) {
  using Tile = RowTile<ST, K, R>;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = row0 + r * Tile::kRowsPerPass + row_in_pass;
#pragma unroll
    for (int c = 0; c < Tile::kVecs; ++c) {
      raw[r][c] = row < V ? load_stream(head_base + static_cast<std::int64_t>(row) * K +
                                        (c * Tile::kLanes + group_lane) * Tile::kPerVec)
                          : make_uint4(0, 0, 0, 0);
    }
  }
}

template <class ST, int K, int R>
__device__ __forceinline__ void store_row(ST* head_base, int row, int group_lane,
                                          const float (&s)[16]) {
  using Tile = RowTile<ST, K, R>;
#pragma unroll
  for (int c = 0; c < Tile::kVecs; ++c)
    store_stream(head_base + static_cast<std::int64_t>(row) * K +
                     (c * Tile::kLanes + group_lane) * Tile::kPerVec,
                 StateVec<ST>::pack(&s[c * Tile::kPerVec]));
}

// ------------------------------------------------------------------------------------------------
// decode: row n is request n, token n; state slot cache_indices[n] updated in place.
// ------------------------------------------------------------------------------------------------
template <class IO, class ST, int K, int R>
__global__ void __launch_bounds__(kRowThreads)
    decode_kernel(const DecodeParams p, const GuardState guard, const std::int32_t slices) {
  using Tile = RowTile<ST, K, R>;
  __shared__ StepInputs<K, 1, Tile::kRowsPerBlock> sm;

  const BlockCoords bc = block_coords(p.in.HV, slices);
  const int lane = threadIdx.x % 32;
  const int group_lane = threadIdx.x % Tile::kLanes;
  const int row_in_pass = threadIdx.x / Tile::kLanes;
  const int row0 = bc.vb * Tile::kRowsPerBlock;
  const int V = p.in.V;

  const std::int64_t slot = p.cache_indices[bc.n];
  const std::uint64_t faults = slot_faults(slot, p.state.num_slots);
  if (faults != 0) {
    if (threadIdx.x == 0 && bc.hv == 0 && bc.vb == 0) raise(guard.error_word, faults);
    return;
  }
  if (guard.row_flags != nullptr && guard.row_flags[bc.n] != 0) return;
  if (!vc::is_active(slot)) {  // padding row: zeros out, state untouched
    for (int i = threadIdx.x; i < Tile::kRowsPerBlock; i += kRowThreads)
      if (row0 + i < V) store_out<IO>(p.out, bc.n, bc.hv, row0 + i, 0.f);
    return;
  }

  ST* head = static_cast<ST*>(p.state.data) + slot * p.state.slot_stride +
             static_cast<std::int64_t>(bc.hv) * V * K;
  uint4 raw[R][Tile::kVecs];
  load_rows<ST, K, R>(head, V, row0, row_in_pass, group_lane, raw);

  if (threadIdx.x < 32) prepare_token<IO, K, 1, Tile::kRowsPerBlock>(p.in, bc.hv, bc.n, row0, lane, 0, sm);
  __syncthreads();

  LaneInputs<ST, K, R> x;
  x.load(sm, 0, group_lane);
  const float beta = sm.beta[0], kq = sm.kq[0];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = r * Tile::kRowsPerPass + row_in_pass;
    const int row = row0 + i;
    float s[16];
#pragma unroll
    for (int c = 0; c < Tile::kVecs; ++c) StateVec<ST>::unpack(raw[r][c], &s[c * Tile::kPerVec]);
    const float o = step_row<Tile::kLanes>(s, x.k, x.q, x.decay, beta, kq, sm.v[0][i]);
    if (row < V) {
      store_row<ST, K, R>(head, row, group_lane, s);
      if (group_lane == 0) store_out<IO>(p.out, bc.n, bc.hv, row, o);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// verify: row n owns tokens [cu[n], cu[n+1]); reads committed slot cache_indices[n] (never
// written), writes the state after step t to its scratch slot. The rows stay in registers across
// the steps; between steps the state is rounded to the pool's dtype, so verify reproduces T
// single-token decodes exactly.
// ------------------------------------------------------------------------------------------------
inline constexpr int kVerifyStepBatch = 8;  // tokens prepared per barrier

template <class IO, class ST, int K, int R>
__global__ void __launch_bounds__(kRowThreads)
    verify_kernel(const VerifyParams p, const GuardState guard, const std::int32_t slices) {
  using Tile = RowTile<ST, K, R>;
  __shared__ StepInputs<K, kVerifyStepBatch, Tile::kRowsPerBlock> sm;

  const BlockCoords bc = block_coords(p.in.HV, slices);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group_lane = threadIdx.x % Tile::kLanes;
  const int row_in_pass = threadIdx.x / Tile::kLanes;
  const int row0 = bc.vb * Tile::kRowsPerBlock;
  const int V = p.in.V;

  const RowSpan span = row_span(p.cu_seqlens, p.rows, bc.n, p.total_tokens, p.draft_tokens);
  const std::int64_t slot = p.cache_indices[bc.n];
  const std::uint64_t faults = span.faults | slot_faults(slot, p.state.num_slots);
  const bool first_block_of_row = bc.hv == 0 && bc.vb == 0;
  if (faults != 0) {
    if (threadIdx.x == 0 && first_block_of_row) raise(guard.error_word, faults);
    return;
  }
  if (guard.row_flags != nullptr && guard.row_flags[bc.n] != 0) return;
  const int length = static_cast<int>(span.end - span.begin);
  if (!vc::is_active(slot)) {  // padding row: zero outputs, no scratch
    for (int t = 0; t < length; ++t)
      for (int i = threadIdx.x; i < Tile::kRowsPerBlock; i += kRowThreads)
        if (row0 + i < V) store_out<IO>(p.out, span.begin + t, bc.hv, row0 + i, 0.f);
    return;
  }

  const std::int64_t head_offset = static_cast<std::int64_t>(bc.hv) * V * K;
  const ST* head = static_cast<const ST*>(p.state.data) + slot * p.state.slot_stride + head_offset;
  uint4 raw[R][Tile::kVecs];
  load_rows<ST, K, R>(head, V, row0, row_in_pass, group_lane, raw);

  float s[R][16];
  for (int t0 = 0; t0 < length; t0 += kVerifyStepBatch) {
    const int steps = min(kVerifyStepBatch, length - t0);
    if (t0 > 0) __syncthreads();  // the previous batch is consumed
    for (int step = warp; step < steps; step += kRowThreads / 32) {
      const int t = t0 + step;
      prepare_token<IO, K, kVerifyStepBatch, Tile::kRowsPerBlock>(p.in, bc.hv, span.begin + t, row0,
                                                                  lane, step, sm);
      if (lane == 0) {
        std::int64_t dst = scratch_slot(p.target, bc.n, t);
        if (!vc::slot_in_range(dst, p.target.scratch.num_slots, true)) {
          if (first_block_of_row) raise(guard.error_word, bit(RuleId::index_range));
          dst = -1;
        }
        sm.dst[step] = dst;
      }
    }
    __syncthreads();
    if (t0 == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < Tile::kVecs; ++c)
          StateVec<ST>::unpack(raw[r][c], &s[r][c * Tile::kPerVec]);
    }
    for (int step = 0; step < steps; ++step) {
      LaneInputs<ST, K, R> x;
      x.load(sm, step, group_lane);
      const float beta = sm.beta[step], kq = sm.kq[step];
      const std::int64_t dst = sm.dst[step];
      ST* dst_head = dst >= 0 ? static_cast<ST*>(p.target.scratch.data) +
                                    dst * p.target.scratch.slot_stride + head_offset
                              : nullptr;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int i = r * Tile::kRowsPerPass + row_in_pass;
        const int row = row0 + i;
        const float o = step_row<Tile::kLanes>(s[r], x.k, x.q, x.decay, beta, kq, sm.v[step][i]);
#pragma unroll
        for (int e = 0; e < 16; ++e) s[r][e] = StateVec<ST>::round(s[r][e]);
        if (row < V) {
          if (dst_head != nullptr) store_row<ST, K, R>(dst_head, row, group_lane, s[r]);
          if (group_lane == 0) store_out<IO>(p.out, span.begin + t0 + step, bc.hv, row, o);
        }
      }
    }
  }
}

}  // namespace kdaguard::gpu::detail
