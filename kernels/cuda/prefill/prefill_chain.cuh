// The serial half of the chunked prefill: the state chain over a sequence's chunks, reading the
// operands the prepare kernel (prefill_prepare.cuh) left in the workspace.
//
// The step  Vnew = U - W S^T,  S <- S diag(e^(G_C)) + Vnew^T Kd  (S is V x K, the pool's layout)
// acts on each state row (value channel v) on its own, so a block owns kWarps * 16 rows of one
// (sequence, value head) and several blocks share a head: B * HV * V / (16 kWarps) blocks keep
// the SMs busy even for one sequence. Each warp holds its 16 rows x K in registers as mma
// accumulators, whose layout is exactly the B-operand layout of the products with S^T, so only a
// bf16 conversion sits between them. Per chunk, per warp:
//   Vnew = U + (-W) S^T       8 (K = 128) dependent k-steps, two partial sums
//   O    = (e^G Q) S^T + A Vnew   off the dependent path, written out
//   S    = S diag(e^(G_C)) + Vnew^T Kd
// Vnew goes from accumulator to A/B operand in registers (movmatrix transposes). The operands of
// the next kStages - 1 chunks are in flight (cp.async ring) while a chunk computes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "prefill_device.cuh"
#include "prefill_workspace.cuh"

namespace kdaguard::gpu::prefill {

inline constexpr int kChainStages = 4;

template <int K, int V, int kWarps> struct ChainStage {
  static constexpr int kRows = 16 * kWarps;  // state rows of the block
  static constexpr int kLdK = K + 8;         // bf16 row stride: ldmatrix rows 16 bytes apart in the banks
  static constexpr int kLdA = kChunk + 8;
  static_assert(V % kRows == 0);
  alignas(16) __nv_bfloat16 Wneg[kChunk][kLdK];
  alignas(16) __nv_bfloat16 Qg[kChunk][kLdK];
  alignas(16) __nv_bfloat16 Kd[kChunk][kLdK];
  alignas(16) __nv_bfloat16 A[kChunk][kLdA];
  alignas(16) float decay[K];
  alignas(16) float U[kChunk][kRows];
};

template <int K, int V, int kWarps> struct ChainShared {
  ChainStage<K, V, kWarps> stage[kChainStages];
};

// The copies of one chunk's operands (the block's U columns only) into a stage. Each thread's
// share is fixed: the same rows and segments of every chunk, so the addresses are computed once
// and a chunk's copies differ only by the chunk's and the stage's base.
template <int K, int V, int kWarps> struct OperandFetch {
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

  __device__ __forceinline__ OperandFetch(int row0) {
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
    constexpr int kTileSrc[3] = {Ops::kWneg, Ops::kQg, Ops::kKd};
    constexpr int kTileDst[3] = {static_cast<int>(offsetof(Stage, Wneg)), static_cast<int>(offsetof(Stage, Qg)),
                                 static_cast<int>(offsetof(Stage, Kd))};
#pragma unroll
    for (int t = 0; t < 3; ++t)
#pragma unroll
      for (int pass = 0; pass < kChunk / kRowsPerPassK; ++pass)
        cp_async_16(stage + kTileDst[t] + pass * kRowsPerPassK * Stage::kLdK * 2 + tile_dst,
                    ops + kTileSrc[t] + pass * kRowsPerPassK * K * 2 + tile_src);
#pragma unroll
    for (int pass = 0; pass < kChunk / kRowsPerPassU; ++pass)
      cp_async_16(stage + u_dst + pass * kRowsPerPassU * Stage::kRows * 4,
                  ops + u_src + pass * kRowsPerPassU * V * 4);
    const int tid = threadIdx.x;
    if (tid < 2 * kChunk) {  // A: 16 rows of two segments
      cp_async_16(&st.A[tid / 2][(tid % 2) * 8], ops + Ops::kA + tid * 16);
    } else if (tid < 2 * kChunk + K / 4) {  // e^(G_C)
      const int i = tid - 2 * kChunk;
      cp_async_16(&st.decay[4 * i], ops + Ops::kDecay + i * 16);
    }
  }
};

template <int K, int V, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    prefill_chain_kernel(const PrefillParams p, const GuardState guard,
                         const unsigned char* workspace) {
  using Ops = ChunkOperands<K, V>;
  using Stage = ChainStage<K, V, kWarps>;
  constexpr int kSlices = V / Stage::kRows;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<ChainShared<K, V, kWarps>*>(smem_raw);

  const std::int64_t b = blockIdx.x;
  const int slice = static_cast<int>(b % kSlices);
  const int hv = static_cast<int>((b / kSlices) % p.in.HV);
  const std::int32_t n = static_cast<std::int32_t>(b / kSlices / p.in.HV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;

  const Sequence seq =
      resolve_sequence(p, n, guard, /*report=*/hv == 0 && slice == 0 && threadIdx.x == 0);
  if (!seq.runs || seq.length == 0) return;  // an empty sequence keeps its slot untouched
  const int num_chunks = static_cast<int>((seq.length + kChunk - 1) / kChunk);
  const int row0 = slice * Stage::kRows;      // the block's first state row
  const int v0 = row0 + 16 * warp;            // the warp's first state row
  const std::int64_t chunk_stride = static_cast<std::int64_t>(p.in.HV) * Ops::kBytes;
  const unsigned char* ops0 =
      workspace + (workspace_slot(seq.begin, n, 0) * p.in.HV + hv) * Ops::kBytes;

  const OperandFetch<K, V, kWarps> fetch(row0);
#pragma unroll
  for (int st = 0; st < kChainStages - 1; ++st) {
    if (st < num_chunks) fetch.issue(ops0 + st * chunk_stride, sm.stage[st]);
    cp_async_commit();  // one group per chunk, empty past the end, so the counts stay uniform
  }

  // The warp's state rows S[v][k], v in [v0, v0 + 16): accumulator tile nt covers k in
  // [8 nt, 8 nt + 8).
  const std::int64_t head_offset =
      seq.slot * p.state.slot_stride + static_cast<std::int64_t>(hv) * V * K;
  // The pool element of the accumulator pair (S[nt][2 half], S[nt][2 half + 1]): read here, written
  // back after the last chunk.
  const auto state_at = [&](int nt, int half) {
    return head_offset + static_cast<std::int64_t>(v0 + group + 8 * half) * K + 8 * nt + 2 * quad;
  };
  float S[K / 8][4];
#pragma unroll
  for (int nt = 0; nt < K / 8; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t at = state_at(nt, half);
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
  const bool out_bf16 = p.in.io_dtype == DType::bf16;
  std::uint16_t* out_base = static_cast<std::uint16_t*>(p.out.data) +
                            static_cast<std::int64_t>(hv) * p.out.head_stride;

  for (int c = 0; c < num_chunks; ++c) {
    cp_async_wait_pending<kChainStages - 2>();
    __syncthreads();  // chunk c's stage landed for every thread; chunk c - 1's stage is consumed
    if (c + kChainStages - 1 < num_chunks)
      fetch.issue(ops0 + (c + kChainStages - 1) * chunk_stride,
                  sm.stage[(c + kChainStages - 1) % kChainStages]);
    cp_async_commit();
    const Stage& st = sm.stage[c % kChainStages];
    const int rows = static_cast<int>(seq.length - static_cast<std::int64_t>(c) * kChunk < kChunk
                                          ? seq.length - static_cast<std::int64_t>(c) * kChunk
                                          : kChunk);

    // Vnew = U + (-W) S^T and O = (e^G Q) S^T; S^T is the B operand, straight from registers.
    // Even and odd k-steps accumulate apart to halve the dependent chain.
    float vnew[2][2][4], out[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int col = 16 * warp + nt * 8 + 2 * quad;
      const float2 u_lo = *reinterpret_cast<const float2*>(&st.U[group][col]);
      const float2 u_hi = *reinterpret_cast<const float2*>(&st.U[group + 8][col]);
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
      std::uint32_t aw[4], aq[4];
      ldmatrix_x4(aw, &st.Wneg[(lane % 8) + ((lane / 8) % 2) * 8][ks * 16 + (lane / 16) * 8]);
      ldmatrix_x4(aq, &st.Qg[(lane % 8) + ((lane / 8) % 2) * 8][ks * 16 + (lane / 16) * 8]);
      const std::uint32_t b_lo0 = pack_bf16(S[2 * ks][0], S[2 * ks][1]);
      const std::uint32_t b_lo1 = pack_bf16(S[2 * ks + 1][0], S[2 * ks + 1][1]);
      const std::uint32_t b_hi0 = pack_bf16(S[2 * ks][2], S[2 * ks][3]);
      const std::uint32_t b_hi1 = pack_bf16(S[2 * ks + 1][2], S[2 * ks + 1][3]);
      mma_bf16(vnew[ks % 2][0], aw, b_lo0, b_lo1);
      mma_bf16(vnew[ks % 2][1], aw, b_hi0, b_hi1);
      mma_bf16(out[0], aq, b_lo0, b_lo1);
      mma_bf16(out[1], aq, b_hi0, b_hi1);
    }
    // Vnew in bf16, transposed per 8x8 block: vt[nt][h] holds Vnew^T rows v = 16 warp + 8 nt + g,
    // columns c = 8 h + 2q, which is both the A operand of Vnew^T Kd and the B operand of A Vnew.
    std::uint32_t vt[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        vt[nt][h] = movmatrix_trans(pack_bf16(vnew[0][nt][2 * h] + vnew[1][nt][2 * h],
                                              vnew[0][nt][2 * h + 1] + vnew[1][nt][2 * h + 1]));

    // S <- S diag(e^(G_C)) + Vnew^T Kd: Kd [c][k] is the B operand (transposed load).
    const std::uint32_t av[4] = {vt[0][0], vt[1][0], vt[0][1], vt[1][1]};
#pragma unroll
    for (int np = 0; np < K / 16; ++np) {
      std::uint32_t bk[4];
      ldmatrix_x4_trans(bk, &st.Kd[(lane % 8) + ((lane / 8) % 2) * 8][np * 16 + (lane / 16) * 8]);
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int nt = 2 * np + t;
        const float2 dec = *reinterpret_cast<const float2*>(&st.decay[8 * nt + 2 * quad]);
        S[nt][0] *= dec.x;
        S[nt][1] *= dec.y;
        S[nt][2] *= dec.x;
        S[nt][3] *= dec.y;
      }
      mma_bf16(S[2 * np], av, bk[0], bk[1]);
      mma_bf16(S[2 * np + 1], av, bk[2], bk[3]);
    }

    // O += A Vnew, then out.
    {
      std::uint32_t a[4];
      ldmatrix_x4(a, &st.A[(lane % 8) + ((lane / 8) % 2) * 8][(lane / 16) * 8]);
      mma_bf16(out[0], a, vt[0][0], vt[0][1]);
      mma_bf16(out[1], a, vt[1][0], vt[1][1]);
    }
    std::uint16_t* out_rows = out_base + (seq.begin + static_cast<std::int64_t>(c) * kChunk + group) *
                                             p.out.token_stride + v0 + 2 * quad;
    std::uint32_t packed[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float lo = out[nt][2 * half], hi = out[nt][2 * half + 1];
        packed[nt][half] = out_bf16 ? IoBits<__nv_bfloat16>::pack(lo, hi) : IoBits<__half>::pack(lo, hi);
      }
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
  }
  cp_async_wait_all();  // no copy may outlive the block (the empty groups past the end included)

#pragma unroll
  for (int nt = 0; nt < K / 8; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t at = state_at(nt, half);
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

}  // namespace kdaguard::gpu::prefill
