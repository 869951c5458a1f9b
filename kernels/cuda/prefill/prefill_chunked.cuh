// The chunked prefill on the tensor cores (kda-math.md, "Chunked form"), for bf16 and f16 inputs.
//
// One block of 256 threads owns one (sequence, value head) and walks its chunks of 16 tokens in
// order, the state resident in registers as mma accumulators. Per chunk:
//   stage    cp.async brings the next chunk's raw q, k, v and gate rows into a second buffer
//            while this chunk computes (beta rides along in registers);
//   pass 1   row L2 norms of q and k, beta;
//   pass 2   gate activation and the in-chunk cumulative gate G (log2 units) per key channel,
//            then the operand tiles: exp(G) q, exp(G_C - G) k, beta exp(G) k, and the two
//            pivot-factorised tiles for L and A;
//   pass 3   L = beta_i k_i.k_j exp(G_i - G_j) (i > j) and A = q_i.k_j exp(G_i - G_j) (i >= j):
//            on the tensor cores as (k_i 2^(G_i - G_p)) . (k_j 2^(G_p - G_j)) around the pivot
//            row p = 7 when every |G_i - G_p| of the chunk is within kSpanLimit (any gate form,
//            decided per chunk from the data), else per pair in f32 with the unfactorised
//            exponent G_i - G_j <= 0, which is exact for any gate however negative;
//   pass 4   W = (I + L)^-1 diag(beta) exp(G) K and U = (I + L)^-1 diag(beta) V by forward
//            substitution in f32, one column per thread;
//   pass 5   per warp and its 16 state rows (v): Vnew = U - W S^T, O = (exp(G) Q) S^T + A Vnew,
//            S <- diag(exp(G_C)) S + Vnew^T (exp(G_C - G) K), all m16n8k16 bf16 with f32
//            accumulation. The state never leaves the warp's registers between chunks; its
//            accumulator layout is exactly the B-operand layout of the products with S, so only
//            a conversion to bf16 sits between them.
// Rows past a sequence's end are zeros with g = 0, so they change neither the state nor the decay.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "prefill_device.cuh"

namespace kdaguard::gpu::prefill {

inline constexpr int kChunk = 16;
inline constexpr int kChunkThreads = 256;
inline constexpr int kChunkWarps = kChunkThreads / 32;
// Largest |G_i - G_p| (log2 units) for which the pivot-factorised tiles are used: their factors
// then lie in [2^-90, 2^90], far from f32/bf16 overflow and underflow. With lower_bound >= -5 a
// chunk never exceeds 8 * 5 / ln 2 = 57.7.
inline constexpr float kSpanLimit = 90.f;
inline constexpr int kPivotRow = 7;

// Phase timing for tuning (off unless KDAGUARD_PREFILL_PROFILE is defined, as in
// tools/prefill_profile.cu): block 0, thread 0 adds the clock64() cycles between consecutive
// barrier exits to kProfileSlots counters (top-of-chunk wait, passes 1+2a, 2b, 3, 4, 5) and counts
// the chunks that took the per-pair path of pass 3.
inline constexpr int kProfileSlots = 7;
#ifdef KDAGUARD_PREFILL_PROFILE
__device__ unsigned long long prefill_profile[kProfileSlots];
#define KDAGUARD_PREFILL_MARK(slot)                                       \
  do {                                                                    \
    if (blockIdx.x == 0 && threadIdx.x == 0) {                            \
      const long long now_ = clock64();                                   \
      prefill_profile[slot] += static_cast<unsigned long long>(now_ - profile_last); \
      profile_last = now_;                                                \
    }                                                                     \
  } while (0)
#else
#define KDAGUARD_PREFILL_MARK(slot) \
  do {                              \
  } while (0)
#endif

template <int K, int V> struct ChunkLayout {
  static_assert((K == 64 || K == 128) && (V == 64 || V == 128));
  static constexpr int kLdK = K + 8;  // bf16 tile row stride: rows 16 bytes apart in the banks
  static constexpr int kLdV = V + 8;
  static constexpr int kLdA = kChunk + 8;
  static constexpr int kChainWarps = V / 16;             // warps that own 16 state rows each
  static constexpr int kGroups = kChunkThreads / K;      // row groups of the channel passes
  static constexpr int kGroupRows = kChunk / kGroups;
  static_assert(K + V <= kChunkThreads && kChainWarps <= kChunkWarps);
};

template <int K, int V> struct alignas(16) ChunkShared {
  using Layout = ChunkLayout<K, V>;
  // Staging, double buffered: raw 16-bit q, k, v rows and raw gate rows (16- or 32-bit).
  alignas(16) std::uint16_t q[2][kChunk][K];
  alignas(16) std::uint16_t k[2][kChunk][K];
  alignas(16) std::uint16_t v[2][kChunk][V];
  alignas(16) std::uint32_t gate[2][kChunk][K];
  float beta_raw[2][kChunk];
  // This chunk.
  float q_scale[kChunk];  // L2 norm (optional) and scale
  float k_scale[kChunk];
  float beta[kChunk];
  float gate_total[Layout::kGroups][K];
  float G[kChunk][K];     // cumulative gate, log2 units
  float X[kChunk][K];     // beta * exp(G) * k
  alignas(16) float decay_end[K];  // exp(G_C)
  alignas(16) __nv_bfloat16 Qp[kChunk][Layout::kLdK];    // q 2^(G - G_p)
  alignas(16) __nv_bfloat16 Kp[kChunk][Layout::kLdK];    // k 2^(G - G_p)
  alignas(16) __nv_bfloat16 Kn[kChunk][Layout::kLdK];    // k 2^(G_p - G)
  alignas(16) __nv_bfloat16 Qg[kChunk][Layout::kLdK];    // q exp(G)
  alignas(16) __nv_bfloat16 Kd[kChunk][Layout::kLdK];    // k exp(G_C - G)
  alignas(16) __nv_bfloat16 Wneg[kChunk][Layout::kLdK];  // -W
  alignas(16) __nv_bfloat16 A[kChunk][Layout::kLdA];
  alignas(16) __nv_bfloat16 Vnew[kChunk][Layout::kLdV];
  alignas(16) float L[kChunk][kChunk];
  alignas(16) float U[kChunk][V];
  int span_bits;  // max |G_i - G_p| of the chunk, as float bits (non-negative: int order)
};

// Issues the copies of one chunk's rows into staging buffer `buf`; rows past `rows` are zeroed.
template <int K, int V>
__device__ __forceinline__ void stage_chunk(const PrefillParams& p, int hv, int h,
                                            std::int64_t first, int rows, int buf,
                                            ChunkShared<K, V>& sm) {
  const int tid = threadIdx.x;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  constexpr int kSegK = K * 2 / 16;  // 16-byte segments per 16-bit row
  constexpr int kSegV = V * 2 / 16;
  const char* q_base = static_cast<const char*>(p.in.q.data);
  const char* k_base = static_cast<const char*>(p.in.k.data);
  for (int i = tid; i < kChunk * kSegK; i += kChunkThreads) {
    const int r = i / kSegK, s = i % kSegK;
    void* dq = &sm.q[buf][r][s * 8];
    void* dk = &sm.k[buf][r][s * 8];
    if (r < rows) {
      const std::int64_t t = first + r;
      cp_async_16(dq, q_base + (t * p.in.q.token_stride + h * p.in.q.head_stride) * 2 + s * 16);
      cp_async_16(dk, k_base + (t * p.in.k.token_stride + h * p.in.k.head_stride) * 2 + s * 16);
    } else {
      *static_cast<uint4*>(dq) = zero;
      *static_cast<uint4*>(dk) = zero;
    }
  }
  const char* v_base = static_cast<const char*>(p.in.v.data);
  for (int i = tid; i < kChunk * kSegV; i += kChunkThreads) {
    const int r = i / kSegV, s = i % kSegV;
    void* dv = &sm.v[buf][r][s * 8];
    if (r < rows) {
      const std::int64_t t = first + r;
      cp_async_16(dv, v_base + (t * p.in.v.token_stride + hv * p.in.v.head_stride) * 2 + s * 16);
    } else {
      *static_cast<uint4*>(dv) = zero;
    }
  }
  const int gate_bytes = p.in.gate_dtype == DType::f32 ? 4 : 2;
  const int seg_gate = K * gate_bytes / 16;
  const char* g_base = static_cast<const char*>(p.in.gate.data);
  for (int i = tid; i < kChunk * seg_gate; i += kChunkThreads) {
    const int r = i / seg_gate, s = i % seg_gate;
    char* dg = reinterpret_cast<char*>(&sm.gate[buf][r][0]) + s * 16;
    if (r < rows) {
      const std::int64_t t = first + r;
      cp_async_16(dg, g_base + (t * p.in.gate.token_stride + hv * p.in.gate.head_stride) * gate_bytes +
                          s * 16);
    }  // rows past the end: g is forced to 0, the raw bytes are never read
  }
  cp_async_commit();
}

// Raw beta of row r of a chunk, f32, or 0 past the sequence.
__device__ __forceinline__ float load_beta_raw(const PrefillParams& p, int hv, std::int64_t first,
                                               int rows, int r) {
  if (r >= rows) return 0.f;
  return detail::load_f32(p.in.beta.data, p.in.beta_dtype,
                          (first + r) * p.in.beta.token_stride + hv * p.in.beta.head_stride);
}

// IO: __nv_bfloat16 or __half, the dtype of q, k, v and out (gates and beta may be f32).
template <class IO, int K, int V>
__global__ void __launch_bounds__(kChunkThreads, 1)
    prefill_chunked_kernel(const PrefillParams p, const GuardState guard) {
  using Layout = ChunkLayout<K, V>;
  using Io = IoBits<IO>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<ChunkShared<K, V>*>(smem_raw);

  const std::int32_t n = static_cast<std::int32_t>(blockIdx.x / p.in.HV);
  const int hv = static_cast<int>(blockIdx.x % p.in.HV);
  const int h = hv / (p.in.HV / p.in.H);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group = lane / 4, quad = lane % 4;

  const Sequence seq = resolve_sequence(p, n, guard, /*report=*/hv == 0 && tid == 0);
  if (!seq.runs || seq.length == 0) return;  // an empty sequence keeps its slot untouched
  const int num_chunks = static_cast<int>((seq.length + kChunk - 1) / kChunk);
  auto chunk_rows = [&](int c) {
    const std::int64_t left = seq.length - static_cast<std::int64_t>(c) * kChunk;
    return static_cast<int>(left < kChunk ? left : kChunk);
  };

  const GateConstants gate = gate_constants(p.in, hv);
  // Pass-2 coordinates: one key channel, one group of rows.
  const int ch = tid % K;
  const int ch_group = tid / K;
  const float ch_bias = (p.in.gate_kind != GateKind::activated && p.in.dt_bias != nullptr)
                            ? p.in.dt_bias[hv * K + ch]
                            : 0.f;

  // The state rows this warp owns, S[v][k] with v in [16 warp, 16 warp + 16): accumulator tile
  // nt covers k in [8 nt, 8 nt + 8).
  const bool chain_warp = warp < Layout::kChainWarps;
  const int v0 = 16 * warp;
  const std::int64_t head_offset =
      seq.slot * p.state.slot_stride + static_cast<std::int64_t>(hv) * V * K;
  float S[K / 8][4];
  if (chain_warp) {
#pragma unroll
    for (int nt = 0; nt < K / 8; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::int64_t at = head_offset + static_cast<std::int64_t>(v0 + group + 8 * half) * K +
                                8 * nt + 2 * quad;
        float lo, hi;
        if (p.state.dtype == DType::f32) {
          const float2 x = *reinterpret_cast<const float2*>(static_cast<const float*>(p.state.data) + at);
          lo = x.x;
          hi = x.y;
        } else {
          const std::uint32_t x =
              *reinterpret_cast<const std::uint32_t*>(static_cast<const std::uint16_t*>(p.state.data) + at);
          lo = __uint_as_float(x << 16);
          hi = __uint_as_float(x & 0xffff0000u);
        }
        S[nt][2 * half] = lo;
        S[nt][2 * half + 1] = hi;
      }
    }
  }

  stage_chunk<K, V>(p, hv, h, seq.begin, chunk_rows(0), 0, sm);
  if (tid < kChunk) sm.beta_raw[0][tid] = load_beta_raw(p, hv, seq.begin, chunk_rows(0), tid);

#ifdef KDAGUARD_PREFILL_PROFILE
  long long profile_last = clock64();
#endif
  for (int c = 0; c < num_chunks; ++c) {
    const int buf = c & 1;
    const int rows = chunk_rows(c);
    const std::int64_t first = seq.begin + static_cast<std::int64_t>(c) * kChunk;
    cp_async_wait_all();
    __syncthreads();  // staging[buf] landed; the previous chunk's tiles are consumed
    KDAGUARD_PREFILL_MARK(0);

    float beta_next = 0.f;
    if (c + 1 < num_chunks) {
      stage_chunk<K, V>(p, hv, h, first + kChunk, chunk_rows(c + 1), buf ^ 1, sm);
      if (tid < kChunk) beta_next = load_beta_raw(p, hv, first + kChunk, chunk_rows(c + 1), tid);
    }

    // ---- pass 1: row norms and beta ----
#pragma unroll
    for (int rr = 0; rr < kChunk / kChunkWarps; ++rr) {
      const int r = warp * (kChunk / kChunkWarps) + rr;
      float qq = 0.f, kk = 0.f;
#pragma unroll
      for (int i = lane; i < K; i += 32) {
        const float qx = Io::to_f32(sm.q[buf][r][i]);
        const float kx = Io::to_f32(sm.k[buf][r][i]);
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
    if (tid < kChunk) sm.beta[tid] = tid < rows ? activate_beta_fast(p.in.beta_kind, sm.beta_raw[buf][tid]) : 0.f;
    if (tid == 0) sm.span_bits = 0;

    // ---- pass 2a: activated gates and their running sum inside this thread's row group ----
    // The gate's dtype and form are dispatched outside the row loop, so its body has no branch.
    float G_local[Layout::kGroupRows];
    auto gate_rows = [&](auto raw_gate, auto activate) {
      float running = 0.f;
#pragma unroll
      for (int i = 0; i < Layout::kGroupRows; ++i) {
        const int r = ch_group * Layout::kGroupRows + i;
        const float g = r < rows ? activate(raw_gate(r) + ch_bias) : 0.f;
        running += g * kLog2e;
        G_local[i] = running;
      }
      sm.gate_total[ch_group][ch] = running;
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
      gate_form([&](int r) { return __uint_as_float(sm.gate[buf][r][ch]); });
    } else {
      gate_form([&](int r) {
        return Io::to_f32(reinterpret_cast<const std::uint16_t*>(&sm.gate[buf][r][0])[ch]);
      });
    }
    __syncthreads();
    KDAGUARD_PREFILL_MARK(1);

    // ---- pass 2b: cumulative gates and operand tiles ----
    {
      float prefix = 0.f, total = 0.f, pivot = 0.f;
#pragma unroll
      for (int gi = 0; gi < Layout::kGroups; ++gi) {
        const float t = sm.gate_total[gi][ch];
        if (gi < ch_group) prefix += t;
        if (gi * Layout::kGroupRows <= kPivotRow) pivot += t;  // groups covering rows 0..7
        total += t;
      }
      // Per element: up = 2^(G - G_p) and down = 2^(G_p - G). When all of this thread's rows are
      // within the span limit the decays follow from them and two per-channel factors,
      // exp(G) = up 2^G_p and exp(G_C - G) = 2^(G_C - G_p) down (a factor that underflows stands
      // for a true value below 2^-36 there); otherwise (a chunk that takes the per-pair path)
      // they are formed directly. The branch is per thread, outside the row loop.
      float G[Layout::kGroupRows];
      float span = 0.f;
#pragma unroll
      for (int i = 0; i < Layout::kGroupRows; ++i) {
        G[i] = prefix + G_local[i];
        span = fmaxf(span, fabsf(G[i] - pivot));
      }
      auto tile_rows = [&](auto decays) {
#pragma unroll
        for (int i = 0; i < Layout::kGroupRows; ++i) {
          const int r = ch_group * Layout::kGroupRows + i;
          const float q = Io::to_f32(sm.q[buf][r][ch]) * sm.q_scale[r];
          const float k = Io::to_f32(sm.k[buf][r][ch]) * sm.k_scale[r];
          const float dc = fminf(fmaxf(G[i] - pivot, -kSpanLimit), kSpanLimit);
          const float up = exp2f(dc), down = exp2f(-dc);
          float decay, to_end;
          decays(G[i], up, down, decay, to_end);
          sm.G[r][ch] = G[i];
          sm.X[r][ch] = sm.beta[r] * decay * k;
          sm.Qp[r][ch] = __float2bfloat16_rn(q * up);
          sm.Kp[r][ch] = __float2bfloat16_rn(k * up);
          sm.Kn[r][ch] = __float2bfloat16_rn(k * down);
          sm.Qg[r][ch] = __float2bfloat16_rn(q * decay);
          sm.Kd[r][ch] = __float2bfloat16_rn(k * to_end);
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
      if (ch_group == 0) sm.decay_end[ch] = exp2f(total);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) span = fmaxf(span, __shfl_xor_sync(0xffffffffu, span, off));
      if (lane == 0) atomicMax(&sm.span_bits, __float_as_int(span));
    }
    __syncthreads();
    KDAGUARD_PREFILL_MARK(2);

    // ---- pass 3: L and A ----
#ifdef KDAGUARD_PREFILL_PROFILE
    if (blockIdx.x == 0 && tid == 0 && __int_as_float(sm.span_bits) > kSpanLimit)
      ++prefill_profile[kProfileSlots - 1];
#endif
    if (__int_as_float(sm.span_bits) <= kSpanLimit) {
      if (warp < 4) {
        const bool is_A = warp >= 2;
        const int nt = warp % 2;
        const __nv_bfloat16(*rows_tile)[Layout::kLdK] = is_A ? sm.Qp : sm.Kp;
        float acc[2][4] = {};
        // Fragments of step ks + 1 are loaded before the products of step ks.
        std::uint32_t a[2][4], b[2][2];
        auto load_step = [&](int ks) {
          ldmatrix_x4(a[ks % 2], &rows_tile[(lane % 8) + ((lane / 8) % 2) * 8][ks * 16 + (lane / 16) * 8]);
          ldmatrix_x2(b[ks % 2], &sm.Kn[nt * 8 + (lane % 8)][ks * 16 + ((lane / 8) % 2) * 8]);
        };
        load_step(0);
#pragma unroll
        for (int ks = 0; ks < K / 16; ++ks) {
          if (ks + 1 < K / 16) load_step(ks + 1);
          mma_bf16(acc[ks % 2], a[ks % 2], b[ks % 2][0], b[ks % 2][1]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = group + 8 * (e / 2);
          const int j = nt * 8 + 2 * quad + (e % 2);
          const float val = acc[0][e] + acc[1][e];
          if (is_A) {
            sm.A[i][j] = __float2bfloat16_rn(i >= j ? val : 0.f);
          } else {
            sm.L[i][j] = i > j ? sm.beta[i] * val : 0.f;
          }
        }
      }
    } else {
      for (int e = warp; e < kChunk * kChunk; e += kChunkWarps) {
        const int i = e / kChunk, j = e % kChunk;
        float kk = 0.f, qk = 0.f;
        if (i >= j) {
          const float qs = sm.q_scale[i], ks_i = sm.k_scale[i], ks_j = sm.k_scale[j];
#pragma unroll
          for (int x = lane; x < K; x += 32) {
            const float decayed_kj =
                Io::to_f32(sm.k[buf][j][x]) * ks_j * exp2f(sm.G[i][x] - sm.G[j][x]);
            kk += Io::to_f32(sm.k[buf][i][x]) * ks_i * decayed_kj;
            qk += Io::to_f32(sm.q[buf][i][x]) * qs * decayed_kj;
          }
          kk = detail::warp_sum(kk);
          qk = detail::warp_sum(qk);
        }
        if (lane == 0) {
          sm.L[i][j] = i > j ? sm.beta[i] * kk : 0.f;
          sm.A[i][j] = __float2bfloat16_rn(i >= j ? qk : 0.f);
        }
      }
    }
    __syncthreads();
    KDAGUARD_PREFILL_MARK(3);

    // ---- pass 4: W and U by forward substitution through (I + L) ----
    if (tid < K + V) {
      float x[kChunk];
      if (tid < K) {
#pragma unroll
        for (int r = 0; r < kChunk; ++r) x[r] = sm.X[r][tid];
      } else {
#pragma unroll
        for (int r = 0; r < kChunk; ++r) x[r] = sm.beta[r] * Io::to_f32(sm.v[buf][r][tid - K]);
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
        float acc = x[i];
#pragma unroll
        for (int j = 0; j < i; ++j) acc -= row[j] * x[j];
        x[i] = acc;
      }
      if (tid < K) {
#pragma unroll
        for (int r = 0; r < kChunk; ++r) sm.Wneg[r][tid] = __float2bfloat16_rn(-x[r]);
      } else {
#pragma unroll
        for (int r = 0; r < kChunk; ++r) sm.U[r][tid - K] = x[r];
      }
    }
    __syncthreads();
    KDAGUARD_PREFILL_MARK(4);

    // ---- pass 5: the state chain, per warp on its own 16 state rows ----
    if (chain_warp) {
      float vnew[2][4], out[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = v0 + nt * 8 + 2 * quad;
        const float2 u_lo = *reinterpret_cast<const float2*>(&sm.U[group][col]);
        const float2 u_hi = *reinterpret_cast<const float2*>(&sm.U[group + 8][col]);
        vnew[nt][0] = u_lo.x;
        vnew[nt][1] = u_lo.y;
        vnew[nt][2] = u_hi.x;
        vnew[nt][3] = u_hi.y;
#pragma unroll
        for (int e = 0; e < 4; ++e) out[nt][e] = 0.f;
      }
      // Vnew = U - W S^T and O = (exp(G) Q) S^T: S^T is the B operand, straight from registers.
      std::uint32_t aw[2][4], aq[2][4];  // fragments of step ks + 1 load during step ks
      auto load_step = [&](int ks) {
        ldmatrix_x4(aw[ks % 2], &sm.Wneg[(lane % 8) + ((lane / 8) % 2) * 8][ks * 16 + (lane / 16) * 8]);
        ldmatrix_x4(aq[ks % 2], &sm.Qg[(lane % 8) + ((lane / 8) % 2) * 8][ks * 16 + (lane / 16) * 8]);
      };
      load_step(0);
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks) {
        if (ks + 1 < K / 16) load_step(ks + 1);
        const std::uint32_t b_lo0 = pack_bf16(S[2 * ks][0], S[2 * ks][1]);
        const std::uint32_t b_lo1 = pack_bf16(S[2 * ks + 1][0], S[2 * ks + 1][1]);
        const std::uint32_t b_hi0 = pack_bf16(S[2 * ks][2], S[2 * ks][3]);
        const std::uint32_t b_hi1 = pack_bf16(S[2 * ks + 1][2], S[2 * ks + 1][3]);
        mma_bf16(vnew[0], aw[ks % 2], b_lo0, b_lo1);
        mma_bf16(vnew[1], aw[ks % 2], b_hi0, b_hi1);
        mma_bf16(out[0], aq[ks % 2], b_lo0, b_lo1);
        mma_bf16(out[1], aq[ks % 2], b_hi0, b_hi1);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = v0 + nt * 8 + 2 * quad;
        *reinterpret_cast<std::uint32_t*>(&sm.Vnew[group][col]) = pack_bf16(vnew[nt][0], vnew[nt][1]);
        *reinterpret_cast<std::uint32_t*>(&sm.Vnew[group + 8][col]) = pack_bf16(vnew[nt][2], vnew[nt][3]);
      }
      __syncwarp();
      // O += A Vnew (Vnew [j][v] is the B operand: transposed load).
      {
        std::uint32_t a[4], b[4];
        ldmatrix_x4(a, &sm.A[(lane % 8) + ((lane / 8) % 2) * 8][(lane / 16) * 8]);
        ldmatrix_x4_trans(b, &sm.Vnew[(lane % 8) + ((lane / 8) % 2) * 8][v0 + (lane / 16) * 8]);
        mma_bf16(out[0], a, b[0], b[1]);
        mma_bf16(out[1], a, b[2], b[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = v0 + nt * 8 + 2 * quad;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = group + 8 * half;
          if (r < rows) {
            const std::int64_t at = (first + r) * p.out.token_stride +
                                    static_cast<std::int64_t>(hv) * p.out.head_stride + col;
            *reinterpret_cast<std::uint32_t*>(static_cast<std::uint16_t*>(p.out.data) + at) =
                Io::pack(out[nt][2 * half], out[nt][2 * half + 1]);
          }
        }
      }
      // S <- diag(exp(G_C)) S + Vnew^T Kd: A operand Vnew^T [v][c] (transposed load), B operand
      // Kd [c][k] (transposed load), accumulating into the state tiles.
      std::uint32_t av[4], bk[2][4];
      ldmatrix_x4_trans(av, &sm.Vnew[(lane % 8) + (lane / 16) * 8][v0 + ((lane / 8) % 2) * 8]);
      auto load_kd = [&](int np) {
        ldmatrix_x4_trans(bk[np % 2], &sm.Kd[(lane % 8) + ((lane / 8) % 2) * 8][np * 16 + (lane / 16) * 8]);
      };
      load_kd(0);
#pragma unroll
      for (int np = 0; np < K / 16; ++np) {
        if (np + 1 < K / 16) load_kd(np + 1);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int nt = 2 * np + t;
          const float2 dec = *reinterpret_cast<const float2*>(&sm.decay_end[8 * nt + 2 * quad]);
          S[nt][0] *= dec.x;
          S[nt][1] *= dec.y;
          S[nt][2] *= dec.x;
          S[nt][3] *= dec.y;
        }
        mma_bf16(S[2 * np], av, bk[np % 2][0], bk[np % 2][1]);
        mma_bf16(S[2 * np + 1], av, bk[np % 2][2], bk[np % 2][3]);
      }
    }
    if (tid < kChunk) sm.beta_raw[buf ^ 1][tid] = beta_next;
    KDAGUARD_PREFILL_MARK(5);
  }

  if (chain_warp) {
#pragma unroll
    for (int nt = 0; nt < K / 8; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::int64_t at = head_offset + static_cast<std::int64_t>(v0 + group + 8 * half) * K +
                                8 * nt + 2 * quad;
        const float lo = S[nt][2 * half], hi = S[nt][2 * half + 1];
        if (p.state.dtype == DType::f32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.state.data) + at) = make_float2(lo, hi);
        } else {
          *reinterpret_cast<std::uint32_t*>(static_cast<std::uint16_t*>(p.state.data) + at) =
              pack_bf16(lo, hi);
        }
      }
    }
  }
}

}  // namespace kdaguard::gpu::prefill
