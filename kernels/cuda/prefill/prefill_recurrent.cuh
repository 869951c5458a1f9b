// The f32-input prefill: the per-token recurrence of kda-math.md in f32, token after token.
// Slower than the chunked kernel (it walks the tokens serially) but exact to f32 rounding, which
// is what f32 inputs ask for (tolerance 1e-5 against the f64 reference).
//
// Work split: rows of the state are independent given a token's q, k, g and beta, so a block owns
// one (sequence, value head) and kRecurrentRows state rows; each warp holds kRowsPerWarp rows,
// K/32 contiguous channels per lane. Every warp prepares the token itself (norms, gate, beta) from
// its own loads, so the loop has no barrier; the next token's loads are issued before the current
// token is computed.
#pragma once

#include <cstdint>

#include "prefill_device.cuh"

namespace kdaguard::gpu::prefill {

inline constexpr int kRecurrentThreads = 128;
inline constexpr int kRowsPerWarp = 4;
inline constexpr int kRecurrentRows = kRowsPerWarp * kRecurrentThreads / 32;  // 16

template <int K> struct TokenRegs {
  static constexpr int kPerLane = K / 32;
  float q[kPerLane], k[kPerLane], gate[kPerLane];
  float v[kRowsPerWarp];
  float beta;
};

template <int K>
__device__ __forceinline__ void load_token(const PrefillParams& p, std::int64_t t, int h, int hv,
                                           int row0, int lane, TokenRegs<K>& x) {
  constexpr int kPerLane = K / 32;
  const float* q = static_cast<const float*>(p.in.q.data) + t * p.in.q.token_stride + h * p.in.q.head_stride;
  const float* k = static_cast<const float*>(p.in.k.data) + t * p.in.k.token_stride + h * p.in.k.head_stride;
  const float* v = static_cast<const float*>(p.in.v.data) + t * p.in.v.token_stride + hv * p.in.v.head_stride;
  const std::int64_t gate_at = t * p.in.gate.token_stride + hv * p.in.gate.head_stride;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane * kPerLane + i;
    x.q[i] = q[c];
    x.k[i] = k[c];
    x.gate[i] = detail::load_f32(p.in.gate.data, p.in.gate_dtype, gate_at + c);
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) x.v[r] = v[row0 + r];
  x.beta = detail::load_f32(p.in.beta.data, p.in.beta_dtype,
                            t * p.in.beta.token_stride + hv * p.in.beta.head_stride);
}

template <int K, int V>
__global__ void __launch_bounds__(kRecurrentThreads)
    prefill_recurrent_kernel(const PrefillParams p, const GuardState guard) {
  constexpr int kPerLane = K / 32;
  constexpr int kSlices = V / kRecurrentRows;
  const std::int64_t b = blockIdx.x;
  const int slice = static_cast<int>(b % kSlices);
  const int hv = static_cast<int>((b / kSlices) % p.in.HV);
  const std::int32_t n = static_cast<std::int32_t>(b / kSlices / p.in.HV);
  const int h = hv / (p.in.HV / p.in.H);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = slice * kRecurrentRows + warp * kRowsPerWarp;

  const Sequence seq =
      resolve_sequence(p, n, guard, /*report=*/hv == 0 && slice == 0 && threadIdx.x == 0);
  if (!seq.runs || seq.length == 0) return;

  const std::int64_t head_offset =
      seq.slot * p.state.slot_stride + static_cast<std::int64_t>(hv) * V * K;
  float S[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const std::int64_t at = head_offset + static_cast<std::int64_t>(row0 + r) * K + lane * kPerLane + i;
      S[r][i] = p.state.dtype == DType::f32
                    ? static_cast<const float*>(p.state.data)[at]
                    : __bfloat162float(static_cast<const __nv_bfloat16*>(p.state.data)[at]);
    }

  const GateConstants gate = gate_constants(p.in, hv);
  float bias[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    bias[i] = (p.in.gate_kind != GateKind::activated && p.in.dt_bias != nullptr)
                  ? p.in.dt_bias[hv * K + lane * kPerLane + i]
                  : 0.f;

  TokenRegs<K> next;
  load_token<K>(p, seq.begin, h, hv, row0, lane, next);
  for (std::int64_t t = 0; t < seq.length; ++t) {
    const TokenRegs<K> x = next;
    if (t + 1 < seq.length) load_token<K>(p, seq.begin + t + 1, h, hv, row0, lane, next);

    float qq = 0.f, kk = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      qq += x.q[i] * x.q[i];
      kk += x.k[i] * x.k[i];
    }
    float q_factor = p.in.scale, k_factor = 1.f;
    if (p.in.use_qk_l2norm) {
      qq = detail::warp_sum(qq);
      kk = detail::warp_sum(kk);
      q_factor *= 1.f / sqrtf(qq + 1e-6f);
      k_factor = 1.f / sqrtf(kk + 1e-6f);
    }
    float q[kPerLane], k[kPerLane], decay[kPerLane];
    float kq = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      q[i] = x.q[i] * q_factor;
      k[i] = x.k[i] * k_factor;
      kq += k[i] * q[i];
      decay[i] = expf(activate_gate_exact(gate, x.gate[i] + bias[i]));
    }
    kq = detail::warp_sum(kq);
    const float beta = activate_beta(p.in.beta_kind, x.beta);

    // Per row on the decayed state: S k and S q in one reduction pass; then
    // o = (S + u k^T) q = S q + u (k . q).
    float sk[kRowsPerWarp], sq[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      sk[r] = 0.f;
      sq[r] = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        S[r][i] *= decay[i];
        sk[r] += S[r][i] * k[i];
        sq[r] += S[r][i] * q[i];
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      sk[r] = detail::warp_sum(sk[r]);
      sq[r] = detail::warp_sum(sq[r]);
    }
    float o_mine = 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float u = beta * (x.v[r] - sk[r]);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) S[r][i] += u * k[i];
      const float o = sq[r] + u * kq;
      if (lane == r) o_mine = o;
    }
    if (lane < kRowsPerWarp) {
      const std::int64_t at = (seq.begin + t) * p.out.token_stride +
                              static_cast<std::int64_t>(hv) * p.out.head_stride + row0 + lane;
      static_cast<float*>(p.out.data)[at] = o_mine;
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const std::int64_t at = head_offset + static_cast<std::int64_t>(row0 + r) * K + lane * kPerLane + i;
      if (p.state.dtype == DType::f32) {
        static_cast<float*>(p.state.data)[at] = S[r][i];
      } else {
        static_cast<__nv_bfloat16*>(p.state.data)[at] = __float2bfloat16_rn(S[r][i]);
      }
    }
}

}  // namespace kdaguard::gpu::prefill
