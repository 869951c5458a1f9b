// The chunk-parallel half of the chunked prefill (kda-math.md, "Chunked form"), for bf16 and f16
// inputs: everything of a chunk step that does not depend on the state, for every (chunk, value
// head) of the call at once. One block of 128 threads per (workspace slot, value head); a slot
// that holds no chunk (see prefill_workspace.cuh) exits at once. Per chunk:
//   stage    cp.async brings the raw q, k, v and gate rows to shared memory (zero past the
//            sequence's end), so no load below needs a per-row bound;
//   gates    gate activation and the in-chunk cumulative gate G (log2 units) per key channel
//            (one thread each), beta v per value channel, the row L2 norms of q and k;
//   tiles    e^G q and e^(G_C - G) k (to the workspace), beta e^G k (registers) and the
//            pivot-factorised tiles of L and A (shared memory);
//   L, A     L = beta_i k_i.k_j e^(G_i - G_j) (i > j), A = q_i.k_j e^(G_i - G_j) (i >= j) on the
//            tensor cores as (k_i 2^(G_i - G_p)) . (k_j 2^(G_p - G_j)) around the pivot row
//            p = 7 when every |G_i - G_p| of the chunk is within kSpanLimit (decided per chunk
//            from the data), else per pair in f32 with the unfactorised exponent G_i - G_j <= 0,
//            which is exact for any gate however negative (g = -1000 per token included);
//   W, U     W = (I + L)^-1 diag(beta) e^G K and U = (I + L)^-1 diag(beta) V by forward
//            substitution in f32, one key column and one value column per thread.
// The kernel is throughput bound (tens of thousands of blocks): what counts is instructions per
// chunk, so every per-row bound check is gone from the loops and the substitution is written
// column by column (15 dependent FMAs rather than 120).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "prefill_device.cuh"
#include "prefill_workspace.cuh"

namespace kdaguard::gpu::prefill {

inline constexpr int kPrepareThreads = 128;
inline constexpr int kPrepareWarps = kPrepareThreads / 32;
// Largest |G_i - G_p| (log2 units) for which the pivot-factorised tiles are used: their factors
// then lie in [2^-90, 2^90], far from f32/bf16 overflow and underflow. With lower_bound >= -5 a
// chunk never exceeds 8 * 5 / ln 2 = 57.7.
inline constexpr float kSpanLimit = 90.f;
static_assert(kSpanLimit < 126.f, "2^(+-kSpanLimit) must be a normal float (exp2_ftz)");
inline constexpr int kPivotRow = 7;

// Position within tile[channel] of the 8 rows starting at row8 (0 or 8): see PrepareShared.
__device__ __forceinline__ int tile_half(int channel, int row8) { return row8 ^ (channel & 4) * 2; }

// kSplitTiles (f16 inputs): each pivot-factorised tile is held as bf16 hi + lo parts, x = hi + lo
// with hi = bf16(x), lo = bf16(x - hi), and L and A take three products (hi hi + hi lo + lo hi):
// about 16 significant bits, more than f16's 11, over bf16's range, which the factors 2^(+-90)
// need (f16 tiles would overflow beyond a span of ~15). bf16 inputs: one bf16 part.
//
// The tiles are stored by channel, tile[channel][row], so that the thread of a channel writes its
// 16 rows as two 16-byte stores (8 packed conversions) instead of 16 two-byte stores, and the
// products read them with ldmatrix's transposing form. A channel's two 16-byte halves (rows 0-7
// and 8-15) swap places in channels 4-7 of every 8 (tile_half): both the stores of 8 neighbouring
// threads and the 8 row addresses of one ldmatrix matrix then fall in distinct banks.
template <int K, int V, bool kSplitTiles> struct PrepareShared {
  static_assert((K == 64 || K == 128) && (V == 64 || V == 128));
  static constexpr int kLoChannels = kSplitTiles ? K : 1;
  alignas(16) std::uint16_t q[kChunk][K];  // raw 16-bit rows
  alignas(16) std::uint16_t k[kChunk][K];
  alignas(16) std::uint16_t v[kChunk][V];
  alignas(16) __nv_bfloat16 Qp[K][kChunk];  // q 2^(G - G_p), by channel
  alignas(16) __nv_bfloat16 Kp[K][kChunk];  // k 2^(G - G_p)
  alignas(16) __nv_bfloat16 Kn[K][kChunk];  // k 2^(G_p - G)
  alignas(16) __nv_bfloat16 Qp_lo[kLoChannels][kChunk];  // the lo parts (kSplitTiles)
  alignas(16) __nv_bfloat16 Kp_lo[kLoChannels][kChunk];
  alignas(16) __nv_bfloat16 Kn_lo[kLoChannels][kChunk];
  // The raw gate rows (16- or 32-bit) until the gates are formed; then, for the per-pair path,
  // the gates in log2 units: with f16 inputs each token's own g, whose sums give G_i - G_j (see
  // kCompensatedGate in the kernel), with bf16 inputs the cumulative G.
  union {
    std::uint32_t gate_raw[kChunk][K];
    float gates[kChunk][K];
  };  // 16-byte aligned: everything before it is whole 16-byte rows (asserted in the kernel)
  alignas(16) float Lt[kChunk][kChunk];       // L transposed: Lt[j][i] = L[i][j]
  float q_scale[kChunk];  // L2 norm (optional) and scale
  float k_scale[kChunk];
  float beta[kChunk];
  int span_bits;  // max |G_i - G_p| of the chunk, as float bits (non-negative: int order)
};

// IO: __nv_bfloat16 or __half, the dtype of q, k, v (gates and beta may be f32), and of the
// matrix operands written for the chain (-W, e^G q, e^(G_C - G) k, A): f16 operands for f16 inputs
// keep f16's precision through the chain. Their range: with the L2 norm |q_x| <= scale and
// |k_x| <= 1, so |e^G q| <= scale, |e^(G_C - G) k| <= 1, |A_ij| <= scale and |W| <= 16 (T's
// entries lie in [-1, 1], beta <= 1); without it they are the f16 inputs times factors <= 1 (the
// decays) or their inner products, which stay small whenever the delta rule is stable
// (beta |k|^2 < 2); values that underflow stand for contributions below f16's resolution.
// Blocks an SM: the kernel is throughput bound, and holding a tile's packed words before their
// 16-byte stores would take bf16 from 80 to 96 registers, one block fewer; capped at 80 it spills
// 8 bytes. f16 (the lo parts too) stays at its 128 registers.
template <class IO, int K, int V>
__global__ void __launch_bounds__(kPrepareThreads, std::is_same_v<IO, __half> ? 4 : 6)
    prefill_prepare_kernel(const PrefillParams p, const GuardState guard, unsigned char* workspace) {
  static_assert(K <= kPrepareThreads && V <= kPrepareThreads);
  using Ops = ChunkOperands<K, V>;
  using Io = IoBits<IO>;
  constexpr bool kSplitTiles = std::is_same_v<IO, __half>;
  // f16 inputs: the cumulative gate G is carried with its rounding error G_lo (G + G_lo is the
  // sum to about twice f32's precision), and a difference of two G is taken as
  // (G_i - G_j) + (G_lo_i - G_lo_j). A strong gate (softplus of a = 1000 at rate 16 is g = -2.3e4
  // in log2 units) leaves every later row of its chunk with a G of that size, where an f32 ulp is
  // 2e-3, so the decays between those rows, e^(G_i - G_j) with G_i - G_j small, carried errors of
  // ~1e-3 into e^(G_C - G) k, the tiles, L and A: twice f16's own rounding, which held the f16
  // state at 2-3x its rounding floor (bench/prefill_f16_model.py, "G f32"). bf16's rounding (4e-3)
  // hides it, and bf16 keeps the plain sum.
  constexpr bool kCompensatedGate = std::is_same_v<IO, __half>;
  using Shared = PrepareShared<K, V, kSplitTiles>;
  __shared__ Shared sm;
  static_assert(offsetof(Shared, gate_raw) % 16 == 0);

  const std::int64_t s = blockIdx.x / p.in.HV;
  const int hv = static_cast<int>(blockIdx.x % p.in.HV);
  const std::int32_t n = sequence_of_slot(p, s, kChunk);
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

  // ---- stage: q, k, v and raw gate rows to shared memory (q, k, v zero past the end) ----
  {
    // Copies row_bytes of each row into rows dst_stride bytes apart, zeros past the end: each
    // thread one 16-byte segment of every (kPrepareThreads / segs)-th row, the addresses stepped
    // rather than recomputed per row. segs (8 to 32 here) divides kPrepareThreads.
    const auto stage_rows = [&](void* dst_rows, int dst_stride, int row_bytes, const char* base,
                                std::int64_t token_stride, std::int64_t head_offset, int element_bytes) {
      const int segs = row_bytes / 16;
      const int rows_per_pass = kPrepareThreads / segs;
      const int r0 = tid / segs, seg = tid % segs;
      const std::int64_t src_step = rows_per_pass * token_stride * element_bytes;
      const char* src = base + ((first + r0) * token_stride + head_offset) * element_bytes + seg * 16;
      char* dst = static_cast<char*>(dst_rows) + r0 * dst_stride + seg * 16;
      for (int pass = 0; pass < kChunk / rows_per_pass; ++pass) {
        if (r0 + pass * rows_per_pass < rows) {
          cp_async_16(dst, src);
        } else {
          *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
        }
        src += src_step;
        dst += rows_per_pass * dst_stride;
      }
    };
    stage_rows(sm.q, K * 2, K * 2, static_cast<const char*>(p.in.q.data), p.in.q.token_stride,
               h * p.in.q.head_stride, 2);
    stage_rows(sm.k, K * 2, K * 2, static_cast<const char*>(p.in.k.data), p.in.k.token_stride,
               h * p.in.k.head_stride, 2);
    stage_rows(sm.v, V * 2, V * 2, static_cast<const char*>(p.in.v.data), p.in.v.token_stride,
               hv * p.in.v.head_stride, 2);
    // A 16-bit gate row fills the first half of its 32-bit row. Past the end the gates are
    // forced to 0 below whatever the bytes; they are zeroed anyway, so nothing reads stale data.
    const int gate_bytes = p.in.gate_dtype == DType::f32 ? 4 : 2;
    stage_rows(sm.gate_raw, K * 4, K * gate_bytes, static_cast<const char*>(p.in.gate.data), p.in.gate.token_stride,
               hv * p.in.gate.head_stride, gate_bytes);
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

  cp_async_wait_all();
  __syncthreads();  // q, k, v, gates and beta landed

  // ---- gates: key channel tid, its cumulative gate over the chunk in registers ----
  // The gate's dtype and form are dispatched outside the row loop, so its body has no branch.
  const int ch = tid;
  float G[kChunk];
  float G_lo[kCompensatedGate ? kChunk : 1] = {};  // see kCompensatedGate
  // G_i - G_j, exact to f32's rounding of the difference where the gate is compensated.
  const auto gap = [&](float gi, float gi_lo, float gj, float gj_lo) {
    if constexpr (kCompensatedGate) return (gi - gj) + (gi_lo - gj_lo);
    return gi - gj;
  };
  const auto lo_of = [&](int r) {
    if constexpr (kCompensatedGate) return G_lo[r];
    return 0.f;
  };
  if (ch < K) {
    const GateConstants gate = gate_constants(p.in, hv);
    const float bias = (p.in.gate_kind != GateKind::activated && p.in.dt_bias != nullptr)
                           ? p.in.dt_bias[hv * K + ch]
                           : 0.f;
    // activate(x) is the token's g in log2 units, the constants folded into one factor each.
    auto gate_rows = [&](auto raw_gate, auto activate) {
      float running = 0.f;
      [[maybe_unused]] float running_lo = 0.f;
#pragma unroll
      for (int r = 0; r < kChunk; ++r) {
        const float g = activate(raw_gate(r) + bias);
        if constexpr (kCompensatedGate) {
          // running + x = sum + its rounding error, exactly (Knuth's two-sum)
          const float x = r < rows ? g : 0.f;
          const float sum = running + x, x_part = sum - running;
          running_lo += (running - (sum - x_part)) + (x - x_part);
          running = sum;
          G_lo[r] = running_lo;
        } else {
          running += r < rows ? g : 0.f;
        }
        G[r] = running;
      }
    };
    const float neg_rate_log2 = -gate.rate * kLog2e;
    // e^x as 2^(x log2 e) flushed below 2^-126: where it is added to 1 the flush changes nothing.
    const auto exp_ftz = [](float x) { return exp2_ftz(x * kLog2e); };
    auto gate_form = [&](auto raw_gate) {
      switch (gate.kind) {
        case GateKind::softplus:
          gate_rows(raw_gate, [&](float x) { return neg_rate_log2 * (x > 20.f ? x : __logf(1.f + exp_ftz(x))); });
          break;
        case GateKind::bounded: {
          const float bound_log2 = gate.lower_bound * kLog2e;
          gate_rows(raw_gate, [&](float x) { return bound_log2 * fast_rcp(1.f + exp2_ftz(x * neg_rate_log2)); });
          break;
        }
        default: gate_rows(raw_gate, [](float x) { return x * kLog2e; });
      }
    };
    if (p.in.gate_dtype == DType::f32) {
      gate_form([&](int r) { return __uint_as_float(sm.gate_raw[r][ch]); });
    } else {
      gate_form([&](int r) { return Io::to_f32(reinterpret_cast<const std::uint16_t*>(sm.gate_raw[r])[ch]); });
    }
  }
  // Value column tid, beta applied.
  float Y[kChunk] = {};
  if (tid < V) {
#pragma unroll
    for (int r = 0; r < kChunk; ++r) Y[r] = sm.beta[r] * Io::to_f32(sm.v[r][tid]);
  }

  // ---- norms: the squared norms of the warp's rows of q and k, each lane summing K / 32
  // adjacent channels (one 4- or 8-byte load per row), then reduced all together ----
  {
    constexpr int kNormRows = kChunk / kPrepareWarps;
    constexpr int kPerLane = K / 32;
    static_assert(kPerLane == 2 || kPerLane == 4);
    const auto squares = [&](const std::uint16_t* row) {
      std::uint32_t w[kPerLane / 2];
      if constexpr (kPerLane == 4) {
        const uint2 pair = *reinterpret_cast<const uint2*>(row + 4 * lane);
        w[0] = pair.x;
        w[1] = pair.y;
      } else {
        w[0] = *reinterpret_cast<const std::uint32_t*>(row + 2 * lane);
      }
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane / 2; ++i) {
        const float lo = Io::to_f32(static_cast<std::uint16_t>(w[i] & 0xffffu));
        const float hi = Io::to_f32(static_cast<std::uint16_t>(w[i] >> 16));
        sum += lo * lo + hi * hi;
      }
      return sum;
    };
    float sums[2 * kNormRows];  // q's rows, then k's
#pragma unroll
    for (int rr = 0; rr < kNormRows; ++rr) {
      sums[rr] = squares(sm.q[warp * kNormRows + rr]);
      sums[kNormRows + rr] = squares(sm.k[warp * kNormRows + rr]);
    }
    const float sum = detail::warp_sums(sums);
    const int which = detail::warp_sums_index<2 * kNormRows>(lane);
    if (lane % (32 / (2 * kNormRows)) == 0) {  // each sum is held by 32 / N neighbouring lanes
      const int r = warp * kNormRows + which % kNormRows;
      if (which < kNormRows)
        sm.q_scale[r] = (p.in.use_qk_l2norm ? rsqrtf(sum + 1e-6f) : 1.f) * p.in.scale;
      else
        sm.k_scale[r] = p.in.use_qk_l2norm ? rsqrtf(sum + 1e-6f) : 1.f;
    }
  }
  __syncthreads();  // norms known; the raw gates are consumed (G reuses their memory)

  // ---- tiles ----
  float X[kChunk] = {};  // beta e^G k, key column ch
  if (ch < K) {
    const float pivot = G[kPivotRow], total = G[kChunk - 1];
    const float pivot_lo = lo_of(kPivotRow), total_lo = lo_of(kChunk - 1);
    float span = 0.f;
#pragma unroll
    for (int r = 0; r < kChunk; ++r) span = fmaxf(span, fabsf(gap(G[r], lo_of(r), pivot, pivot_lo)));
    // Per element: up = 2^(G - G_p) and down = 2^(G_p - G). When every row of this channel is
    // within the span limit the decays follow from them and two per-channel factors,
    // e^G = up 2^G_p and e^(G_C - G) = 2^(G_C - G_p) down (a factor that underflows stands for a
    // true value below 2^-36 there); otherwise (a chunk that takes the per-pair path) they are
    // formed directly. The branch is per thread, outside the row loop.
    std::uint16_t* Qg = reinterpret_cast<std::uint16_t*>(ops + Ops::kQg);
    std::uint16_t* Kd = reinterpret_cast<std::uint16_t*>(ops + Ops::kKd);
    // A tile's 8 rows of this channel, packed two to a word, go out as one 16-byte store.
    struct TileHalf {
      std::uint32_t hi[4], lo[kSplitTiles ? 4 : 1];
    };
    TileHalf qp{}, kp{}, kn{};
    float pending_qp = 0.f, pending_kp = 0.f, pending_kn = 0.f;  // the even row of a pair
    const auto tile = [&](TileHalf& half, float& pending, int r, float x) {
      if (r % 2 == 0) {
        pending = x;
        return;
      }
      const __nv_bfloat162 h = __floats2bfloat162_rn(pending, x);
      half.hi[(r % 8) / 2] = *reinterpret_cast<const std::uint32_t*>(&h);
      if constexpr (kSplitTiles)
        half.lo[(r % 8) / 2] = pack_bf16(pending - __low2float(h), x - __high2float(h));
    };
    const auto store_half = [&](__nv_bfloat16(&hi)[K][kChunk], __nv_bfloat16(&lo)[Shared::kLoChannels][kChunk],
                                const TileHalf& half, int row8) {
      const int at = tile_half(ch, row8);
      *reinterpret_cast<uint4*>(&hi[ch][at]) = make_uint4(half.hi[0], half.hi[1], half.hi[2], half.hi[3]);
      if constexpr (kSplitTiles)
        *reinterpret_cast<uint4*>(&lo[ch][at]) = make_uint4(half.lo[0], half.lo[1], half.lo[2], half.lo[3]);
    };
    auto tile_rows = [&](auto decays) {
#pragma unroll
      for (int r = 0; r < kChunk; ++r) {
        const float q = Io::to_f32(sm.q[r][ch]) * sm.q_scale[r];
        const float k = Io::to_f32(sm.k[r][ch]) * sm.k_scale[r];
        const float dc = fminf(fmaxf(gap(G[r], lo_of(r), pivot, pivot_lo), -kSpanLimit), kSpanLimit);
        const float up = exp2_ftz(dc), down = exp2_ftz(-dc);  // normal: |dc| <= kSpanLimit < 126
        float decay, to_end;
        decays(r, up, down, decay, to_end);
        if constexpr (kCompensatedGate)
          sm.gates[r][ch] = r == 0 ? G[0] : gap(G[r], lo_of(r), G[r - 1], lo_of(r - 1));
        else
          sm.gates[r][ch] = G[r];
        X[r] = sm.beta[r] * decay * k;
        tile(qp, pending_qp, r, q * up);
        tile(kp, pending_kp, r, k * up);
        tile(kn, pending_kn, r, k * down);
        Qg[r * K + ch] = Io::round(q * decay);
        Kd[r * K + ch] = Io::round(k * to_end);
        if (r % 8 == 7) {
          store_half(sm.Qp, sm.Qp_lo, qp, r - 7);
          store_half(sm.Kp, sm.Kp_lo, kp, r - 7);
          store_half(sm.Kn, sm.Kn_lo, kn, r - 7);
        }
      }
    };
    if (span <= kSpanLimit) {
      const float pivot_decay = exp2f(pivot);
      const float pivot_to_end = exp2f(gap(total, total_lo, pivot, pivot_lo));
      tile_rows([&](int, float up, float down, float& decay, float& to_end) {
        decay = up * pivot_decay;
        to_end = pivot_to_end * down;
      });
    } else {
      tile_rows([&](int r, float, float, float& decay, float& to_end) {
        decay = exp2f(G[r]);
        to_end = exp2f(gap(total, total_lo, G[r], lo_of(r)));
      });
    }
    reinterpret_cast<float*>(ops + Ops::kDecay)[ch] = exp2f(total);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) span = fmaxf(span, __shfl_xor_sync(0xffffffffu, span, off));
    if (lane == 0) atomicMax(&sm.span_bits, __float_as_int(span));
  }
  __syncthreads();

  // ---- L and A ----
  std::uint16_t* A_out = reinterpret_cast<std::uint16_t*>(ops + Ops::kA);
  if (__int_as_float(sm.span_bits) <= kSpanLimit) {
    // Warps 0, 1: L columns [8 nt, 8 nt + 8); warps 2, 3: A.
    const bool is_A = warp >= 2;
    const int nt = warp % 2;
    const __nv_bfloat16(*rows_tile)[kChunk] = is_A ? sm.Qp : sm.Kp;
    const __nv_bfloat16(*rows_lo)[kChunk] = is_A ? sm.Qp_lo : sm.Kp_lo;
    float acc[2][4] = {};
    // By channel the A operand's matrices (rows 0-7 / 8-15 by channels 0-7 / 8-15 of the step)
    // are 8 channels' halves, transposed on the way: lane l addresses channel
    // 16 ks + 8 (l / 16) + l % 8, half (l / 8) % 2; B's two matrices are channels 16 ks + 8 m +
    // l % 8, half nt.
    const int a_channel = (lane / 16) * 8 + lane % 8, a_half = ((lane / 8) % 2) * 8;
    const int b_channel = ((lane / 8) % 2) * 8 + lane % 8, b_half = nt * 8;
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
      const int ac = ks * 16 + a_channel, bc = ks * 16 + b_channel;
      std::uint32_t a[4], b[2];
      ldmatrix_x4_trans(a, &rows_tile[ac][tile_half(ac, a_half)]);
      ldmatrix_x2_trans(b, &sm.Kn[bc][tile_half(bc, b_half)]);
      mma_bf16(acc[ks % 2], a, b[0], b[1]);
      if constexpr (kSplitTiles) {  // + hi lo + lo hi
        std::uint32_t a_lo[4], b_lo[2];
        ldmatrix_x4_trans(a_lo, &rows_lo[ac][tile_half(ac, a_half)]);
        ldmatrix_x2_trans(b_lo, &sm.Kn_lo[bc][tile_half(bc, b_half)]);
        mma_bf16(acc[ks % 2], a, b_lo[0], b_lo[1]);
        mma_bf16(acc[ks % 2], a_lo, b[0], b[1]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = group + 8 * (e / 2);
      const int j = nt * 8 + 2 * quad + (e % 2);
      const float val = acc[0][e] + acc[1][e];
      if (is_A) {
        A_out[i * kChunk + j] = Io::round(i >= j ? val : 0.f);
      } else {
        sm.Lt[j][i] = i > j ? sm.beta[i] * val : 0.f;
      }
    }
  } else if constexpr (kCompensatedGate) {
    // Per pair i >= j in f32, a warp per column j (warp w: j = w, 7 - w, 8 + w, 15 - w, 34 pairs
    // each), walking i down the column: the exponent G_i - G_j is summed from the gates
    // g_(j+1..i), so it is as exact as its own f32 sum whatever the size of G itself.
    for (int e = tid; e < kChunk * kChunk; e += kPrepareThreads) {
      const int i = e / kChunk, j = e % kChunk;
      if (i < j) {
        sm.Lt[j][i] = 0.f;
        A_out[i * kChunk + j] = Io::round(0.f);
      }
    }
    constexpr int kPerLane = K / 32;
#pragma unroll 1
    for (int column = 0; column < 4; ++column) {
      const int j = 8 * (column / 2) + (column % 2 == 0 ? warp : 7 - warp);
      const float ks_j = sm.k_scale[j];
      float k_j[kPerLane], exponent[kPerLane];
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        k_j[u] = Io::to_f32(sm.k[j][lane + 32 * u]) * ks_j;
        exponent[u] = 0.f;
      }
#pragma unroll 1
      for (int i = j; i < kChunk; ++i) {
        const float qs = sm.q_scale[i], ks_i = sm.k_scale[i];
        float kk = 0.f, qk = 0.f;
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) {
          const int x = lane + 32 * u;
          if (i > j) exponent[u] += sm.gates[i][x];
          const float decayed_kj = k_j[u] * exp2f(exponent[u]);
          kk += Io::to_f32(sm.k[i][x]) * ks_i * decayed_kj;
          qk += Io::to_f32(sm.q[i][x]) * qs * decayed_kj;
        }
        kk = detail::warp_sum(kk);
        qk = detail::warp_sum(qk);
        if (lane == 0) {
          sm.Lt[j][i] = i > j ? sm.beta[i] * kk : 0.f;
          A_out[i * kChunk + j] = Io::round(qk);
        }
      }
    }
  } else {
    // Per pair i >= j in f32, with the unfactorised exponent G_i - G_j of the cumulative gates:
    // bf16's loop as it was before the f16 form above, kept apart so that its kernel's code is
    // unchanged (a shared body compiled to different SASS).
    for (int e = warp; e < kChunk * kChunk; e += kPrepareWarps) {
      const int i = e / kChunk, j = e % kChunk;
      float kk = 0.f, qk = 0.f;
      if (i >= j) {
        const float qs = sm.q_scale[i], ks_i = sm.k_scale[i], ks_j = sm.k_scale[j];
#pragma unroll
        for (int x = lane; x < K; x += 32) {
          const float decayed_kj =
              Io::to_f32(sm.k[j][x]) * ks_j * exp2f(sm.gates[i][x] - sm.gates[j][x]);
          kk += Io::to_f32(sm.k[i][x]) * ks_i * decayed_kj;
          qk += Io::to_f32(sm.q[i][x]) * qs * decayed_kj;
        }
        kk = detail::warp_sum(kk);
        qk = detail::warp_sum(qk);
      }
      if (lane == 0) {
        sm.Lt[j][i] = i > j ? sm.beta[i] * kk : 0.f;
        A_out[i * kChunk + j] = Io::round(i >= j ? qk : 0.f);
      }
    }
  }
  __syncthreads();

  // ---- W and U by forward substitution through (I + L): two independent columns ----
  // Column by column (right-looking): once x_j is final it is taken out of every later row, so
  // the dependent chain is 15 FMAs deep instead of the 120 of a row-by-row sum.
#pragma unroll
  for (int j = 0; j < kChunk - 1; ++j) {
    float col[kChunk];  // L[:][j], four broadcast 16-byte loads
#pragma unroll
    for (int i4 = 0; i4 < kChunk / 4; ++i4) {
      const float4 l4 = *reinterpret_cast<const float4*>(&sm.Lt[j][4 * i4]);
      col[4 * i4] = l4.x;
      col[4 * i4 + 1] = l4.y;
      col[4 * i4 + 2] = l4.z;
      col[4 * i4 + 3] = l4.w;
    }
#pragma unroll
    for (int i = j + 1; i < kChunk; ++i) {
      X[i] -= col[i] * X[j];
      Y[i] -= col[i] * Y[j];
    }
  }
  if (ch < K) {
    std::uint16_t* Wneg = reinterpret_cast<std::uint16_t*>(ops + Ops::kWneg);
#pragma unroll
    for (int r = 0; r < kChunk; ++r) Wneg[r * K + ch] = Io::round(-X[r]);
  }
  if (tid < V) {
    float* U = reinterpret_cast<float*>(ops + Ops::kU);
#pragma unroll
    for (int r = 0; r < kChunk; ++r) U[r * V + tid] = Y[r];
  }
}

}  // namespace kdaguard::gpu::prefill
