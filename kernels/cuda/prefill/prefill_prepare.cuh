// The chunk-parallel half of the chunked prefill (kda-math.md, "Chunked form"), for bf16 and f16
// inputs: everything of a chunk step that does not depend on the state, for every (chunk, value
// head) of the call at once. One block of 128 threads per (workspace slot, value head); a slot
// that holds no chunk (see prefill_workspace.cuh) exits at once. Per chunk:
//   stage    cp.async brings the raw q and k rows to shared memory (rows past the sequence's
//            end are zero); each key-channel thread loads its gate column and each value-channel
//            thread its v column straight into registers;
//   norms    row L2 norms of q and k, beta;
//   gates    gate activation and the in-chunk cumulative gate G (log2 units) per key channel,
//            then the tiles: e^G q and e^(G_C - G) k (to the workspace), beta e^G k (registers)
//            and the pivot-factorised tiles of L and A (shared memory);
//   L, A     L = beta_i k_i.k_j e^(G_i - G_j) (i > j), A = q_i.k_j e^(G_i - G_j) (i >= j) on the
//            tensor cores as (k_i 2^(G_i - G_p)) . (k_j 2^(G_p - G_j)) around the pivot row
//            p = 7 when every |G_i - G_p| of the chunk is within kSpanLimit (decided per chunk
//            from the data), else per pair in f32 with the unfactorised exponent G_i - G_j <= 0,
//            which is exact for any gate however negative (g = -1000 per token included);
//   W, U     W = (I + L)^-1 diag(beta) e^G K and U = (I + L)^-1 diag(beta) V by forward
//            substitution in f32, one key column and one value column per thread.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "prefill_device.cuh"
#include "prefill_workspace.cuh"

namespace kdaguard::gpu::prefill {

inline constexpr int kPrepareThreads = 128;
inline constexpr int kPrepareWarps = kPrepareThreads / 32;
// Largest |G_i - G_p| (log2 units) for which the pivot-factorised tiles are used: their factors
// then lie in [2^-90, 2^90], far from f32/bf16 overflow and underflow. With lower_bound >= -5 a
// chunk never exceeds 8 * 5 / ln 2 = 57.7.
inline constexpr float kSpanLimit = 90.f;
inline constexpr int kPivotRow = 7;

template <int K> struct PrepareShared {
  static_assert(K == 64 || K == 128);
  static constexpr int kLdK = K + 8;  // bf16 tile row stride: rows 16 bytes apart in the banks
  alignas(16) std::uint16_t q[kChunk][K];  // raw 16-bit rows
  alignas(16) std::uint16_t k[kChunk][K];
  alignas(16) __nv_bfloat16 Qp[kChunk][kLdK];  // q 2^(G - G_p)
  alignas(16) __nv_bfloat16 Kp[kChunk][kLdK];  // k 2^(G - G_p)
  alignas(16) __nv_bfloat16 Kn[kChunk][kLdK];  // k 2^(G_p - G)
  alignas(16) float G[kChunk][K];              // cumulative gate, log2 units (per-pair path)
  alignas(16) float L[kChunk][kChunk];
  float q_scale[kChunk];  // L2 norm (optional) and scale
  float k_scale[kChunk];
  float beta[kChunk];
  int span_bits;  // max |G_i - G_p| of the chunk, as float bits (non-negative: int order)
};

// The sequence whose chunks may own workspace slot s: the largest n with
// floor(cu_seqlens[n] / 16) + n <= s (that function of n increases with n for monotone offsets;
// for any other offsets the caller's checks of the sequence found keep every access in bounds).
__device__ __forceinline__ std::int32_t sequence_of_slot(const PrefillParams& p, std::int64_t s) {
  std::int32_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const std::int32_t mid = lo + (hi - lo + 1) / 2;
    if (workspace_slot(seq_offset(p, mid), mid, 0) <= s) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// IO: __nv_bfloat16 or __half, the dtype of q, k, v (gates and beta may be f32).
template <class IO, int K, int V>
__global__ void __launch_bounds__(kPrepareThreads)
    prefill_prepare_kernel(const PrefillParams p, const GuardState guard, unsigned char* workspace) {
  static_assert(K <= kPrepareThreads && V <= kPrepareThreads);
  using Ops = ChunkOperands<K, V>;
  using Io = IoBits<IO>;
  __shared__ PrepareShared<K> sm;

  const std::int64_t s = blockIdx.x / p.in.HV;
  const int hv = static_cast<int>(blockIdx.x % p.in.HV);
  const std::int32_t n = sequence_of_slot(p, s);
  const Sequence seq = resolve_sequence(p, n, guard, /*report=*/false);  // the chain reports
  if (!seq.runs) return;
  const std::int64_t c = s - workspace_slot(seq.begin, n, 0);
  if (c < 0 || c * kChunk >= seq.length) return;  // a slot between two sequences' chunks
  const std::int64_t first = seq.begin + c * kChunk;
  const int rows = static_cast<int>(seq.length - c * kChunk < kChunk ? seq.length - c * kChunk : kChunk);
  unsigned char* ops = workspace + (s * p.in.HV + hv) * Ops::kBytes;

  const int h = hv / (p.in.HV / p.in.H);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group = lane / 4, quad = lane % 4;

  // ---- stage: q and k rows to shared memory ----
  {
    constexpr int kSeg = K * 2 / 16;  // 16-byte segments per row
    const char* q_base = static_cast<const char*>(p.in.q.data);
    const char* k_base = static_cast<const char*>(p.in.k.data);
    for (int i = tid; i < kChunk * kSeg; i += kPrepareThreads) {
      const int r = i / kSeg, seg = i % kSeg;
      void* dq = &sm.q[r][seg * 8];
      void* dk = &sm.k[r][seg * 8];
      if (r < rows) {
        const std::int64_t t = first + r;
        cp_async_16(dq, q_base + (t * p.in.q.token_stride + h * p.in.q.head_stride) * 2 + seg * 16);
        cp_async_16(dk, k_base + (t * p.in.k.token_stride + h * p.in.k.head_stride) * 2 + seg * 16);
      } else {
        *static_cast<uint4*>(dq) = make_uint4(0, 0, 0, 0);
        *static_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_commit();
  }
  if (tid < kChunk) {
    float b = 0.f;
    if (tid < rows)
      b = activate_beta_fast(p.in.beta_kind,
                             detail::load_f32(p.in.beta.data, p.in.beta_dtype,
                                              (first + tid) * p.in.beta.token_stride +
                                                  hv * p.in.beta.head_stride));
    sm.beta[tid] = b;
  }
  if (tid == 0) sm.span_bits = 0;

  // Value column tid (beta applied after the barrier), loaded while the copies fly.
  float Y[kChunk] = {};
  if (tid < V) {
    const std::uint16_t* v = static_cast<const std::uint16_t*>(p.in.v.data) +
                             hv * p.in.v.head_stride + tid;
#pragma unroll
    for (int r = 0; r < kChunk; ++r)
      Y[r] = r < rows ? Io::to_f32(v[(first + r) * p.in.v.token_stride]) : 0.f;
  }

  // ---- gates: key channel tid, its cumulative gate over the chunk in registers ----
  // The gate's dtype and form are dispatched outside the row loop, so its body has no branch.
  const int ch = tid;
  float G[kChunk];
  if (ch < K) {
    const GateConstants gate = gate_constants(p.in, hv);
    const float bias = (p.in.gate_kind != GateKind::activated && p.in.dt_bias != nullptr)
                           ? p.in.dt_bias[hv * K + ch]
                           : 0.f;
    const std::int64_t at = first * p.in.gate.token_stride + hv * p.in.gate.head_stride + ch;
    auto gate_rows = [&](auto raw_gate, auto activate) {
      float raw[kChunk];
#pragma unroll
      for (int r = 0; r < kChunk; ++r) raw[r] = r < rows ? raw_gate(at + r * p.in.gate.token_stride) : 0.f;
      float running = 0.f;
#pragma unroll
      for (int r = 0; r < kChunk; ++r) {
        running += r < rows ? activate(raw[r] + bias) * kLog2e : 0.f;
        G[r] = running;
      }
    };
    auto gate_form = [&](auto raw_gate) {
      switch (gate.kind) {
        case GateKind::softplus:
          gate_rows(raw_gate, [&](float x) { return -gate.rate * (x > 20.f ? x : __logf(1.f + __expf(x))); });
          break;
        case GateKind::bounded:
          gate_rows(raw_gate, [&](float x) { return gate.lower_bound * fast_rcp(1.f + __expf(-gate.rate * x)); });
          break;
        default: gate_rows(raw_gate, [](float x) { return x; });
      }
    };
    if (p.in.gate_dtype == DType::f32) {
      const float* g = static_cast<const float*>(p.in.gate.data);
      gate_form([g](std::int64_t i) { return g[i]; });
    } else {
      const std::uint16_t* g = static_cast<const std::uint16_t*>(p.in.gate.data);
      gate_form([g](std::int64_t i) { return Io::to_f32(g[i]); });
    }
  }
  cp_async_wait_all();
  __syncthreads();  // q, k, beta landed

  // ---- norms: kChunk / kPrepareWarps rows per warp ----
#pragma unroll
  for (int rr = 0; rr < kChunk / kPrepareWarps; ++rr) {
    const int r = warp * (kChunk / kPrepareWarps) + rr;
    float qq = 0.f, kk = 0.f;
#pragma unroll
    for (int i = lane; i < K; i += 32) {
      const float qx = Io::to_f32(sm.q[r][i]);
      const float kx = Io::to_f32(sm.k[r][i]);
      qq += qx * qx;
      kk += kx * kx;
    }
    qq = detail::warp_sum(qq);
    kk = detail::warp_sum(kk);
    if (lane == 0) {
      sm.q_scale[r] = (p.in.use_qk_l2norm ? rsqrtf(qq + 1e-6f) : 1.f) * p.in.scale;
      sm.k_scale[r] = p.in.use_qk_l2norm ? rsqrtf(kk + 1e-6f) : 1.f;
    }
  }
  __syncthreads();

  // ---- tiles ----
  float X[kChunk] = {};  // beta e^G k, key column ch
  if (ch < K) {
    const float pivot = G[kPivotRow], total = G[kChunk - 1];
    float span = 0.f;
#pragma unroll
    for (int r = 0; r < kChunk; ++r) span = fmaxf(span, fabsf(G[r] - pivot));
    // Per element: up = 2^(G - G_p) and down = 2^(G_p - G). When every row of this channel is
    // within the span limit the decays follow from them and two per-channel factors,
    // e^G = up 2^G_p and e^(G_C - G) = 2^(G_C - G_p) down (a factor that underflows stands for a
    // true value below 2^-36 there); otherwise (a chunk that takes the per-pair path) they are
    // formed directly. The branch is per thread, outside the row loop.
    __nv_bfloat16* Qg = reinterpret_cast<__nv_bfloat16*>(ops + Ops::kQg);
    __nv_bfloat16* Kd = reinterpret_cast<__nv_bfloat16*>(ops + Ops::kKd);
    auto tile_rows = [&](auto decays) {
#pragma unroll
      for (int r = 0; r < kChunk; ++r) {
        const float q = Io::to_f32(sm.q[r][ch]) * sm.q_scale[r];
        const float k = Io::to_f32(sm.k[r][ch]) * sm.k_scale[r];
        const float dc = fminf(fmaxf(G[r] - pivot, -kSpanLimit), kSpanLimit);
        const float up = exp2f(dc), down = exp2f(-dc);
        float decay, to_end;
        decays(G[r], up, down, decay, to_end);
        sm.G[r][ch] = G[r];
        X[r] = sm.beta[r] * decay * k;
        sm.Qp[r][ch] = __float2bfloat16_rn(q * up);
        sm.Kp[r][ch] = __float2bfloat16_rn(k * up);
        sm.Kn[r][ch] = __float2bfloat16_rn(k * down);
        Qg[r * K + ch] = __float2bfloat16_rn(q * decay);
        Kd[r * K + ch] = __float2bfloat16_rn(k * to_end);
      }
    };
    if (span <= kSpanLimit) {
      const float pivot_decay = exp2f(pivot), pivot_to_end = exp2f(total - pivot);
      tile_rows([&](float, float up, float down, float& decay, float& to_end) {
        decay = up * pivot_decay;
        to_end = pivot_to_end * down;
      });
    } else {
      tile_rows([&](float g, float, float, float& decay, float& to_end) {
        decay = exp2f(g);
        to_end = exp2f(total - g);
      });
    }
    reinterpret_cast<float*>(ops + Ops::kDecay)[ch] = exp2f(total);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) span = fmaxf(span, __shfl_xor_sync(0xffffffffu, span, off));
    if (lane == 0) atomicMax(&sm.span_bits, __float_as_int(span));
  }
  __syncthreads();

  // ---- L and A ----
  __nv_bfloat16* A_out = reinterpret_cast<__nv_bfloat16*>(ops + Ops::kA);
  if (__int_as_float(sm.span_bits) <= kSpanLimit) {
    // Warps 0, 1: L columns [8 nt, 8 nt + 8); warps 2, 3: A.
    const bool is_A = warp >= 2;
    const int nt = warp % 2;
    const __nv_bfloat16(*rows_tile)[PrepareShared<K>::kLdK] = is_A ? sm.Qp : sm.Kp;
    float acc[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
      std::uint32_t a[4], b[2];
      ldmatrix_x4(a, &rows_tile[(lane % 8) + ((lane / 8) % 2) * 8][ks * 16 + (lane / 16) * 8]);
      ldmatrix_x2(b, &sm.Kn[nt * 8 + (lane % 8)][ks * 16 + ((lane / 8) % 2) * 8]);
      mma_bf16(acc[ks % 2], a, b[0], b[1]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = group + 8 * (e / 2);
      const int j = nt * 8 + 2 * quad + (e % 2);
      const float val = acc[0][e] + acc[1][e];
      if (is_A) {
        A_out[i * kChunk + j] = __float2bfloat16_rn(i >= j ? val : 0.f);
      } else {
        sm.L[i][j] = i > j ? sm.beta[i] * val : 0.f;
      }
    }
  } else {
    for (int e = warp; e < kChunk * kChunk; e += kPrepareWarps) {
      const int i = e / kChunk, j = e % kChunk;
      float kk = 0.f, qk = 0.f;
      if (i >= j) {
        const float qs = sm.q_scale[i], ks_i = sm.k_scale[i], ks_j = sm.k_scale[j];
#pragma unroll
        for (int x = lane; x < K; x += 32) {
          const float decayed_kj = Io::to_f32(sm.k[j][x]) * ks_j * exp2f(sm.G[i][x] - sm.G[j][x]);
          kk += Io::to_f32(sm.k[i][x]) * ks_i * decayed_kj;
          qk += Io::to_f32(sm.q[i][x]) * qs * decayed_kj;
        }
        kk = detail::warp_sum(kk);
        qk = detail::warp_sum(qk);
      }
      if (lane == 0) {
        sm.L[i][j] = i > j ? sm.beta[i] * kk : 0.f;
        A_out[i * kChunk + j] = __float2bfloat16_rn(i >= j ? qk : 0.f);
      }
    }
  }
  __syncthreads();

  // ---- W and U by forward substitution through (I + L): two independent columns ----
  if (tid < V) {
#pragma unroll
    for (int r = 0; r < kChunk; ++r) Y[r] *= sm.beta[r];
  }
#pragma unroll
  for (int i = 1; i < kChunk; ++i) {
    float row[kChunk];  // L[i][:], four broadcast 16-byte loads
#pragma unroll
    for (int j4 = 0; j4 < kChunk / 4; ++j4) {
      const float4 l4 = *reinterpret_cast<const float4*>(&sm.L[i][4 * j4]);
      row[4 * j4] = l4.x;
      row[4 * j4 + 1] = l4.y;
      row[4 * j4 + 2] = l4.z;
      row[4 * j4 + 3] = l4.w;
    }
    float x = X[i], y = Y[i];
#pragma unroll
    for (int j = 0; j < i; ++j) {
      x -= row[j] * X[j];
      y -= row[j] * Y[j];
    }
    X[i] = x;
    Y[i] = y;
  }
  if (ch < K) {
    __nv_bfloat16* Wneg = reinterpret_cast<__nv_bfloat16*>(ops + Ops::kWneg);
#pragma unroll
    for (int r = 0; r < kChunk; ++r) Wneg[r * K + ch] = __float2bfloat16_rn(-X[r]);
  }
  if (tid < V) {
    float* U = reinterpret_cast<float*>(ops + Ops::kU);
#pragma unroll
    for (int r = 0; r < kChunk; ++r) U[r * V + tid] = Y[r];
  }
}

}  // namespace kdaguard::gpu::prefill
