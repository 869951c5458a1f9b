// The serial half of the chunked prefill: the state chain over a sequence's chunks, reading the
// operands the prepare kernel (prefill_prepare.cuh) left in the workspace.
//
// The step  Vnew = U - W S^T,  S <- S diag(e^(G_C)) + Vnew^T Kd  (S is V x K, the pool's layout)
// acts on each state row (value channel v) on its own, so a block owns kWarps * 16 rows of one
// (sequence, value head) and several blocks share a head: B * HV * V / (16 kWarps) blocks keep
// the SMs busy even for one sequence. Each warp holds its 16 rows x K in registers as mma
// accumulators, whose layout is exactly the B-operand layout of the products with S^T, so only a
// 16-bit conversion (bf16 or f16, the inputs' dtype) sits between them. Per chunk, per warp:
//   Vnew = U + (-W) S^T       8 (K = 128) dependent k-steps, two partial sums
//   O    = (e^G Q) S^T + A Vnew   off the dependent path, written out (with f16 operands S^T
//                                 enters as f16(S) + f16(S - f16(S)), two products)
//   S    = S diag(e^(G_C)) + Vnew^T Kd
// Vnew goes from accumulator to A/B operand in registers (movmatrix transposes). The operands of
// the next kStages - 1 chunks are in flight (cp.async ring) while a chunk computes.
//
// Substituting Vnew, one chunk maps S to S M + R with M = diag(e^(G_C)) + (-W)^T Kd (K x K) and
// R = U^T Kd, so a span of chunks maps S to S P + Q, P the product of its M and Q the state it
// leaves from S = 0. When sequences x value heads cannot keep the SMs busy the chain is split
// (ChainRole): the transition kernel runs every span but the last at once, its value rows from a
// zero state (Q) and K further rows from the identity (P: the same step with U = 0, since
// P M = P diag(e^(G_C)) + ((-W) P^T)^T Kd); the combine kernel (prefill_combine.cuh) walks the
// spans, S_(j+1) = S_j P_j + Q_j; the span kernel reruns each span from its true entering state
// with the outputs. The split path is the unsplit step regrouped: the same operands, the same
// roundings, plus one product per span in the combine.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "prefill_device.cuh"
#include "prefill_workspace.cuh"

namespace kdaguard::gpu::prefill {

inline constexpr int kChainStages = 4;

enum class ChainRole {
  whole,       // a sequence's chunks, from its pool slot's state back to it, with the outputs
  transition,  // a span (not a sequence's last) from 0 and from the identity: its Q and P
  span,        // a span from its entering state, with the outputs; the last span writes the pool
};

// The split of a call's chains (ChainRole transition and span, and the combine kernel).
struct ChainSplit {
  std::int32_t chunks_per_span = 0;
  unsigned char* spans = nullptr;  // SpanOperands per (span slot, value head)
};

template <int K, int V, int kWarps> struct ChainStage {
  static constexpr int kRows = 16 * kWarps;  // state rows of the block
  static constexpr int kLdK = K + 8;         // bf16 row stride: ldmatrix rows 16 bytes apart in the banks
  static constexpr int kLdA = kChunk + 8;
  static_assert(V % kRows == 0);
  // 16-bit operands in the dtype the prepare kernel wrote (bf16 or f16, the kernel's Op).
  alignas(16) std::uint16_t Wneg[kChunk][kLdK];
  alignas(16) std::uint16_t Qg[kChunk][kLdK];
  alignas(16) std::uint16_t Kd[kChunk][kLdK];
  alignas(16) std::uint16_t A[kChunk][kLdA];
  alignas(16) float decay[K];
  alignas(16) float U[kChunk][kRows];
};

template <int K, int V, int kWarps> struct ChainShared {
  ChainStage<K, V, kWarps> stage[kChainStages];
};

// The copies of one chunk's operands (the block's U columns only) into a stage. Each thread's
// share is fixed: the same rows and segments of every chunk, so the addresses are computed once
// and a chunk's copies differ only by the chunk's and the stage's base.
// kOutputs: the chunk's e^G Q and A too (the transition kernel writes no outputs).
template <int K, int V, int kWarps, bool kOutputs> struct OperandFetch {
  using Ops = ChunkOperands<K, V>;
  using Stage = ChainStage<K, V, kWarps>;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSegK = K * 2 / 16;                // 16-byte segments per bf16 row of K
  static constexpr int kRowsPerPassK = kThreads / kSegK;  // tile rows one pass of the block covers
  static constexpr int kSegU = Stage::kRows * 4 / 16;     // 16-byte segments per row of the block's U
  static constexpr int kRowsPerPassU = kThreads / kSegU;
  static_assert(kThreads % kSegK == 0 && kChunk % kRowsPerPassK == 0);
  static_assert(kThreads % kSegU == 0 && kChunk % kRowsPerPassU == 0);

  int tile_src, tile_dst, u_src, u_dst;  // byte offsets within a chunk's operands / a stage
  bool with_u;                           // false for the transition's identity rows (U = 0)

  __device__ __forceinline__ OperandFetch(int row0, bool fetch_u) : with_u(fetch_u) {
    const int tid = threadIdx.x;
    const int rk = tid / kSegK, sk = tid % kSegK;
    tile_src = rk * K * 2 + sk * 16;
    tile_dst = rk * Stage::kLdK * 2 + sk * 16;
    const int ru = tid / kSegU, su = tid % kSegU;
    u_src = Ops::kU + (ru * V + row0) * 4 + su * 16;
    u_dst = static_cast<int>(offsetof(Stage, U)) + ru * Stage::kRows * 4 + su * 16;
  }

  __device__ __forceinline__ void issue(const unsigned char* ops, Stage& st) const {
    unsigned char* stage = reinterpret_cast<unsigned char*>(&st);
    constexpr int kTiles = kOutputs ? 3 : 2;
    constexpr int kTileSrc[3] = {Ops::kWneg, Ops::kKd, Ops::kQg};
    constexpr int kTileDst[3] = {static_cast<int>(offsetof(Stage, Wneg)), static_cast<int>(offsetof(Stage, Kd)),
                                 static_cast<int>(offsetof(Stage, Qg))};
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int pass = 0; pass < kChunk / kRowsPerPassK; ++pass)
        cp_async_16(stage + kTileDst[t] + pass * kRowsPerPassK * Stage::kLdK * 2 + tile_dst,
                    ops + kTileSrc[t] + pass * kRowsPerPassK * K * 2 + tile_src);
    if (with_u) {
#pragma unroll
      for (int pass = 0; pass < kChunk / kRowsPerPassU; ++pass)
        cp_async_16(stage + u_dst + pass * kRowsPerPassU * Stage::kRows * 4,
                    ops + u_src + pass * kRowsPerPassU * V * 4);
    }
    const int tid = threadIdx.x;
    if (tid < 2 * kChunk) {  // A: 16 rows of two segments
      if (kOutputs) cp_async_16(&st.A[tid / 2][(tid % 2) * 8], ops + Ops::kA + tid * 16);
    } else if (tid < 2 * kChunk + K / 4) {  // e^(G_C)
      const int i = tid - 2 * kChunk;
      cp_async_16(&st.decay[4 * i], ops + Ops::kDecay + i * 16);
    }
  }
};

// The state element pair (S[nt][2 half], S[nt][2 half + 1]) of a warp's accumulators: row
// v0 + group + 8 half, columns 8 nt + 2 quad and + 1, read from or written to a pool slot
// (f32 or bf16) or a span's f32 state.
template <int K> struct StatePairs {
  float (&S)[K / 8][4];
  int v0, group, quad;

  __device__ __forceinline__ std::int64_t at(int nt, int half) const {
    return static_cast<std::int64_t>(v0 + group + 8 * half) * K + 8 * nt + 2 * quad;
  }
  __device__ __forceinline__ void load(const void* base, DType dtype) {
#pragma unroll
    for (int nt = 0; nt < K / 8; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (dtype == DType::f32) {
          const float2 x = *reinterpret_cast<const float2*>(static_cast<const float*>(base) + at(nt, half));
          S[nt][2 * half] = x.x;
          S[nt][2 * half + 1] = x.y;
        } else {
          const std::uint32_t x =
              *reinterpret_cast<const std::uint32_t*>(static_cast<const std::uint16_t*>(base) + at(nt, half));
          S[nt][2 * half] = __uint_as_float(x << 16);
          S[nt][2 * half + 1] = __uint_as_float(x & 0xffff0000u);
        }
      }
  }
  __device__ __forceinline__ void store(void* base, DType dtype) const {
#pragma unroll
    for (int nt = 0; nt < K / 8; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float lo = S[nt][2 * half], hi = S[nt][2 * half + 1];
        if (dtype == DType::f32) {
          *reinterpret_cast<float2*>(static_cast<float*>(base) + at(nt, half)) = make_float2(lo, hi);
        } else {
          *reinterpret_cast<std::uint32_t*>(static_cast<std::uint16_t*>(base) + at(nt, half)) = pack_bf16(lo, hi);
        }
      }
  }
};

// Grid: one block per (unit, value head, row slice), the slice fastest; a unit is a sequence
// (whole) or a span slot (transition, span). The transition's slices are the V value rows, then
// the K identity rows.
// Op: the operands' and the outputs' dtype, that of the inputs (__nv_bfloat16 or __half). With f16
// the state enters the products rounded to f16, whose range (65504) a state may exceed (an f32
// pool holds what the caller put there, and a state grows with its inputs): a warp whose Vnew is
// not finite or beyond 2^15 (which an overflowed f16 state rounding makes it, and beyond which
// Vnew's own f16 rounding could overflow) redoes that chunk step in bf16, its f16 operands
// converted, before the state changes; the state stays in f32 registers throughout.
template <class Op, int K, int V, int kWarps, ChainRole kRole>
__global__ void __launch_bounds__(32 * kWarps)
    prefill_chain_kernel(const PrefillParams p, const GuardState guard,
                         const unsigned char* workspace, const ChainSplit split) {
  using Ops = ChunkOperands<K, V>;
  using Spans = SpanOperands<K, V>;
  using Stage = ChainStage<K, V, kWarps>;
  constexpr bool kOutputs = kRole != ChainRole::transition;
  constexpr int kValueSlices = V / Stage::kRows;
  constexpr int kSlices = kRole == ChainRole::transition ? (V + K) / Stage::kRows : kValueSlices;
  static_assert(K % Stage::kRows == 0);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<ChainShared<K, V, kWarps>*>(smem_raw);

  const std::int64_t b = blockIdx.x;
  const int slice = static_cast<int>(b % kSlices);
  const int hv = static_cast<int>((b / kSlices) % p.in.HV);
  const std::int64_t unit = b / kSlices / p.in.HV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;

  const std::int64_t span_tokens = static_cast<std::int64_t>(kChunk) * split.chunks_per_span;
  const std::int32_t n = kRole == ChainRole::whole ? static_cast<std::int32_t>(unit)
                                                   : sequence_of_slot(p, unit, span_tokens);
  // Faults are reported once per sequence: by the whole kernel, or by the combine kernel.
  const Sequence seq = resolve_sequence(
      p, n, guard, /*report=*/kRole == ChainRole::whole && hv == 0 && slice == 0 && threadIdx.x == 0);
  if (!seq.runs || seq.length == 0) return;  // an empty sequence keeps its slot untouched
  const int num_chunks = static_cast<int>((seq.length + kChunk - 1) / kChunk);
  int c_begin = 0, c_end = num_chunks;
  bool writes_pool = kRole == ChainRole::whole;
  unsigned char* span_ops = nullptr;
  if constexpr (kRole != ChainRole::whole) {
    const std::int64_t j = unit - unit_slot(seq.begin, n, 0, span_tokens);
    const int num_spans = (num_chunks + split.chunks_per_span - 1) / split.chunks_per_span;
    if (j < 0 || j >= num_spans) return;  // a span slot between two sequences' spans
    const bool last = j == num_spans - 1;
    if (kRole == ChainRole::transition && last) return;  // nothing needs the last span's map
    writes_pool = last;
    c_begin = static_cast<int>(j) * split.chunks_per_span;
    c_end = c_begin + split.chunks_per_span < num_chunks ? c_begin + split.chunks_per_span : num_chunks;
    span_ops = split.spans + (unit * p.in.HV + hv) * Spans::kBytes;
  }
  // The transition's identity rows (block-uniform): state rows are P's, U = 0.
  const bool identity_rows = kRole == ChainRole::transition && slice >= kValueSlices;
  const int row0 = (identity_rows ? slice - kValueSlices : slice) * Stage::kRows;  // the block's first row
  const int v0 = row0 + 16 * warp;  // the warp's first row
  const int steps = c_end - c_begin;
  const std::int64_t chunk_stride = static_cast<std::int64_t>(p.in.HV) * Ops::kBytes;
  const unsigned char* ops0 =
      workspace + (workspace_slot(seq.begin, n, c_begin) * p.in.HV + hv) * Ops::kBytes;

  const OperandFetch<K, V, kWarps, kOutputs> fetch(row0, !identity_rows);
#pragma unroll
  for (int st = 0; st < kChainStages - 1; ++st) {
    if (st < steps) fetch.issue(ops0 + st * chunk_stride, sm.stage[st]);
    cp_async_commit();  // one group per chunk, empty past the end, so the counts stay uniform
  }

  // The warp's state rows S[v][k], v in [v0, v0 + 16): accumulator tile nt covers k in
  // [8 nt, 8 nt + 8).
  float S[K / 8][4];
  StatePairs<K> pairs{S, v0, group, quad};
  void* const pool_head = static_cast<unsigned char*>(p.state.data) +
                          (seq.slot * p.state.slot_stride + static_cast<std::int64_t>(hv) * V * K) *
                              (p.state.dtype == DType::f32 ? 4 : 2);
  float decay_product[2] = {1.f, 1.f};  // identity rows: e^(G_C) of rows v0 + group (+ 8) so far
  if constexpr (kRole == ChainRole::whole) {
    pairs.load(pool_head, p.state.dtype);
  } else if constexpr (kRole == ChainRole::span) {
    pairs.load(span_ops + Spans::kState, DType::f32);
  } else {
#pragma unroll
    for (int nt = 0; nt < K / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        S[nt][e] = identity_rows && v0 + group + 8 * (e / 2) == 8 * nt + 2 * quad + (e % 2) ? 1.f : 0.f;
  }
  std::uint16_t* out_base = static_cast<std::uint16_t*>(p.out.data) +
                            static_cast<std::int64_t>(hv) * p.out.head_stride;

  for (int i = 0; i < steps; ++i) {
    const int c = c_begin + i;
    cp_async_wait_pending<kChainStages - 2>();
    __syncthreads();  // chunk c's stage landed for every thread; chunk c - 1's stage is consumed
    if (i + kChainStages - 1 < steps)
      fetch.issue(ops0 + (i + kChainStages - 1) * chunk_stride,
                  sm.stage[(i + kChainStages - 1) % kChainStages]);
    cp_async_commit();
    const Stage& st = sm.stage[i % kChainStages];
    const int rows = static_cast<int>(seq.length - static_cast<std::int64_t>(c) * kChunk < kChunk
                                          ? seq.length - static_cast<std::int64_t>(c) * kChunk
                                          : kChunk);
    // One chunk step with operands of type T; kConvert: the stage holds f16, T is bf16 (the
    // fallback). Returns false, the state untouched, when f16 operands would not hold Vnew.
    const auto step = [&](auto op_type, auto convert) -> bool {
      using T = typename decltype(op_type)::type;
      constexpr bool kConvert = decltype(convert)::value;
      const auto operand = [](std::uint32_t(&r)[4]) {
        if constexpr (kConvert) {
#pragma unroll
          for (int e = 0; e < 4; ++e) r[e] = half2_to_bf16x2(r[e]);
        }
      };
      // Vnew = U + (-W) S^T and O = (e^G Q) S^T; S^T is the B operand, straight from registers.
      // Even and odd k-steps accumulate apart to halve the dependent chain.
      float vnew[2][2][4], out[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = 16 * warp + nt * 8 + 2 * quad;
        float2 u_lo = make_float2(0.f, 0.f), u_hi = u_lo;
        if (!identity_rows) {
          u_lo = *reinterpret_cast<const float2*>(&st.U[group][col]);
          u_hi = *reinterpret_cast<const float2*>(&st.U[group + 8][col]);
        }
        vnew[0][nt][0] = u_lo.x;
        vnew[0][nt][1] = u_lo.y;
        vnew[0][nt][2] = u_hi.x;
        vnew[0][nt][3] = u_hi.y;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          vnew[1][nt][e] = 0.f;
          out[nt][e] = 0.f;
        }
      }
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks) {
        std::uint32_t aw[4];
        ldmatrix_x4(aw, &st.Wneg[(lane % 8) + ((lane / 8) % 2) * 8][ks * 16 + (lane / 16) * 8]);
        operand(aw);
        const std::uint32_t b_lo0 = IoBits<T>::pack(S[2 * ks][0], S[2 * ks][1]);
        const std::uint32_t b_lo1 = IoBits<T>::pack(S[2 * ks + 1][0], S[2 * ks + 1][1]);
        const std::uint32_t b_hi0 = IoBits<T>::pack(S[2 * ks][2], S[2 * ks][3]);
        const std::uint32_t b_hi1 = IoBits<T>::pack(S[2 * ks + 1][2], S[2 * ks + 1][3]);
        mma16<T>(vnew[ks % 2][0], aw, b_lo0, b_lo1);
        mma16<T>(vnew[ks % 2][1], aw, b_hi0, b_hi1);
        if constexpr (kOutputs) {
          std::uint32_t aq[4];
          ldmatrix_x4(aq, &st.Qg[(lane % 8) + ((lane / 8) % 2) * 8][ks * 16 + (lane / 16) * 8]);
          operand(aq);
          mma16<T>(out[0], aq, b_lo0, b_lo1);
          mma16<T>(out[1], aq, b_hi0, b_hi1);
          if constexpr (std::is_same_v<T, __half>) {
            // f16 keeps 11 bits of S, which alone leaves out near twice its rounding floor; the
            // product with what that rounding dropped, S - f16(S), gives out S to ~22 bits. Off
            // the state's dependent chain; Vnew keeps the one product (its error is U's scale).
            mma16<T>(out[0], aq, f16_residual_pack(S[2 * ks][0], S[2 * ks][1], b_lo0),
                     f16_residual_pack(S[2 * ks + 1][0], S[2 * ks + 1][1], b_lo1));
            mma16<T>(out[1], aq, f16_residual_pack(S[2 * ks][2], S[2 * ks][3], b_hi0),
                     f16_residual_pack(S[2 * ks + 1][2], S[2 * ks + 1][3], b_hi1));
          }
        }
      }
      float vsum[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) vsum[nt][e] = vnew[0][nt][e] + vnew[1][nt][e];
      if constexpr (std::is_same_v<T, __half>) {
        bool held = true;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) held = held && fabsf(vsum[nt][e]) < 32768.f;  // false for NaN
        if (__any_sync(0xffffffffu, !held)) return false;
      }
      // Vnew rounded, transposed per 8x8 block: vt[nt][h] holds Vnew^T rows v = 16 warp + 8 nt + g,
      // columns c = 8 h + 2q, which is both the A operand of Vnew^T Kd and the B operand of A Vnew.
      std::uint32_t vt[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) vt[nt][h] = movmatrix_trans(IoBits<T>::pack(vsum[nt][2 * h], vsum[nt][2 * h + 1]));

      // S <- S diag(e^(G_C)) + Vnew^T Kd: Kd [c][k] is the B operand (transposed load).
      const std::uint32_t av[4] = {vt[0][0], vt[1][0], vt[0][1], vt[1][1]};
#pragma unroll
      for (int np = 0; np < K / 16; ++np) {
        std::uint32_t bk[4];
        ldmatrix_x4_trans(bk, &st.Kd[(lane % 8) + ((lane / 8) % 2) * 8][np * 16 + (lane / 16) * 8]);
        operand(bk);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int nt = 2 * np + t;
          const float2 dec = *reinterpret_cast<const float2*>(&st.decay[8 * nt + 2 * quad]);
          S[nt][0] *= dec.x;
          S[nt][1] *= dec.y;
          S[nt][2] *= dec.x;
          S[nt][3] *= dec.y;
        }
        mma16<T>(S[2 * np], av, bk[0], bk[1]);
        mma16<T>(S[2 * np + 1], av, bk[2], bk[3]);
      }
      if (identity_rows) {
        decay_product[0] *= st.decay[v0 + group];
        decay_product[1] *= st.decay[v0 + group + 8];
      }
      if constexpr (!kOutputs) return true;

      // O += A Vnew, then out.
      {
        std::uint32_t a[4];
        ldmatrix_x4(a, &st.A[(lane % 8) + ((lane / 8) % 2) * 8][(lane / 16) * 8]);
        operand(a);
        mma16<T>(out[0], a, vt[0][0], vt[0][1]);
        mma16<T>(out[1], a, vt[1][0], vt[1][1]);
      }
      std::uint16_t* out_rows = out_base + (seq.begin + static_cast<std::int64_t>(c) * kChunk + group) *
                                               p.out.token_stride + v0 + 2 * quad;
      std::uint32_t packed[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          packed[nt][half] = IoBits<Op>::pack(out[nt][2 * half], out[nt][2 * half + 1]);
      const std::int64_t half_stride = 8 * p.out.token_stride;
      if (rows == kChunk) {  // warp-uniform: every chunk but a sequence's last
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          *reinterpret_cast<std::uint32_t*>(out_rows + nt * 8) = packed[nt][0];
          *reinterpret_cast<std::uint32_t*>(out_rows + half_stride + nt * 8) = packed[nt][1];
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          if (group < rows) *reinterpret_cast<std::uint32_t*>(out_rows + nt * 8) = packed[nt][0];
          if (group + 8 < rows)
            *reinterpret_cast<std::uint32_t*>(out_rows + half_stride + nt * 8) = packed[nt][1];
        }
      }
      return true;
    };
    if constexpr (std::is_same_v<Op, __half>) {
      if (!step(std::type_identity<__half>{}, std::false_type{}))
        step(std::type_identity<__nv_bfloat16>{}, std::true_type{});
    } else {
      step(std::type_identity<__nv_bfloat16>{}, std::false_type{});
    }
  }
  cp_async_wait_all();  // no copy may outlive the block (the empty groups past the end included)

  if constexpr (kRole == ChainRole::transition) {
    if (!identity_rows) {
      pairs.store(span_ops + Spans::kState, DType::f32);
      return;
    }
    // E = P - diag(D) in Op, D in f32.
    auto* carry = reinterpret_cast<std::uint32_t*>(span_ops + Spans::kCarry);
#pragma unroll
    for (int nt = 0; nt < K / 8; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = v0 + group + 8 * half, k = 8 * nt + 2 * quad;
        const float lo = S[nt][2 * half] - (r == k ? decay_product[half] : 0.f);
        const float hi = S[nt][2 * half + 1] - (r == k + 1 ? decay_product[half] : 0.f);
        carry[(r * K + k) / 2] = IoBits<Op>::pack(lo, hi);
      }
    if (quad == 0) {
      auto* decay = reinterpret_cast<float*>(span_ops + Spans::kDecay);
      decay[v0 + group] = decay_product[0];
      decay[v0 + group + 8] = decay_product[1];
    }
  } else {
    if (writes_pool) pairs.store(pool_head, p.state.dtype);
  }
}

}  // namespace kdaguard::gpu::prefill
