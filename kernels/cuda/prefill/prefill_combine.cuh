// The middle kernel of a split chain (prefill_chain.cuh, ChainRole): walks each sequence's spans
// in order, S_(j+1) = S_j diag(D_j) + S_j E_j + Q_j (P_j = diag(D_j) + E_j), from the pool
// slot's state, and writes each span's entering state S_j over its Q_j (each thread reads the
// elements of Q_j it then overwrites), where the span kernel starts from. One block of kWarps
// warps per (sequence, value head, 16 kWarps state rows); the state rows stay in registers as
// mma accumulators, which are also the A operand of S_j E_j once rounded to Op (the inputs'
// dtype), as the chain step rounds S for (-W) S^T; the decay part S_j diag(D_j) and Q_j stay in
// f32. With f16 each state row enters the product scaled by a power of two that puts its largest
// element in [2^13, 2^14) (f16's range holds it whatever the state's size, and small rows keep
// f16's precision), the product unscaled in f32. The next span's E, D and Q rows are copied
// (cp.async) while a span computes.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "prefill_chain.cuh"
#include "prefill_device.cuh"
#include "prefill_workspace.cuh"

namespace kdaguard::gpu::prefill {

template <int K, int V, int kWarps> struct CombineShared {
  static constexpr int kRows = 16 * kWarps;  // state rows of the block
  static constexpr int kLdE = K + 8;         // bf16: ldmatrix rows 16 bytes apart in the banks
  static constexpr int kLdQ = K + 8;         // f32: the float2 reads of a half warp hit 32 banks
  struct Span {
    alignas(16) std::uint16_t E[K][kLdE];  // Op
    alignas(16) float D[K];
    alignas(16) float Q[kRows][kLdQ];
  };
  Span span[2];
};

template <class Op, int K, int V, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    prefill_combine_kernel(const PrefillParams p, const GuardState guard, const ChainSplit split) {
  using Spans = SpanOperands<K, V>;
  using Shared = CombineShared<K, V, kWarps>;
  constexpr int kRows = Shared::kRows;
  constexpr int kSlices = V / kRows;
  constexpr int kThreads = 32 * kWarps;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<Shared*>(smem_raw);

  const std::int64_t b = blockIdx.x;
  const int slice = static_cast<int>(b % kSlices);
  const int hv = static_cast<int>((b / kSlices) % p.in.HV);
  const auto n = static_cast<std::int32_t>(b / kSlices / p.in.HV);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group = lane / 4, quad = lane % 4;

  const Sequence seq = resolve_sequence(p, n, guard, /*report=*/hv == 0 && slice == 0 && tid == 0);
  if (!seq.runs || seq.length == 0) return;
  const int num_chunks = static_cast<int>((seq.length + kChunk - 1) / kChunk);
  const int num_spans = (num_chunks + split.chunks_per_span - 1) / split.chunks_per_span;
  const std::int64_t span_tokens = static_cast<std::int64_t>(kChunk) * split.chunks_per_span;
  const std::int64_t slot0 = unit_slot(seq.begin, n, 0, span_tokens);
  const int row0 = slice * kRows, v0 = row0 + 16 * warp;
  const auto span_ops = [&](int j) {
    return split.spans + ((slot0 + j) * p.in.HV + hv) * Spans::kBytes;
  };
  // Span j's E, D and the block's rows of Q into buffer j % 2.
  const auto issue = [&](int j) {
    const unsigned char* ops = span_ops(j);
    typename Shared::Span& dst = sm.span[j % 2];
    constexpr int kSegE = K * 2 / 16, kSegQ = K * 4 / 16;
    for (int i = tid; i < K * kSegE; i += kThreads)
      cp_async_16(&dst.E[i / kSegE][(i % kSegE) * 8], ops + Spans::kCarry + i * 16);
    for (int i = tid; i < kRows * kSegQ; i += kThreads)
      cp_async_16(&dst.Q[i / kSegQ][(i % kSegQ) * 4],
                  ops + Spans::kState + (static_cast<std::int64_t>(row0) * K + i * 4) * 4);
    if (tid < K / 4) cp_async_16(&dst.D[4 * tid], ops + Spans::kDecay + tid * 16);
  };

  float S[K / 8][4];
  StatePairs<K> pairs{S, v0, group, quad};
  const void* pool_head = static_cast<const unsigned char*>(p.state.data) +
                          (seq.slot * p.state.slot_stride + static_cast<std::int64_t>(hv) * V * K) *
                              (p.state.dtype == DType::f32 ? 4 : 2);
  pairs.load(pool_head, p.state.dtype);
  if (num_spans > 1) issue(0);
  cp_async_commit();

  for (int j = 0; j < num_spans; ++j) {
    float* entering = reinterpret_cast<float*>(span_ops(j) + Spans::kState);
    if (j == num_spans - 1) {  // the last span has no transition: only its entering state
      pairs.store(entering, DType::f32);
      break;
    }
    if (j + 1 < num_spans - 1) issue(j + 1);
    cp_async_commit();
    cp_async_wait_pending<1>();
    __syncthreads();  // span j's buffer landed for every thread (Q_j read before S_j overwrites it)
    const typename Shared::Span& sp = sm.span[j % 2];

    // A operand of S_j E_j: S_j in Op, straight from the accumulators, rows scaled for f16:
    // row_scale[h] for the lane's rows group + 8 h (1 for bf16).
    float row_scale[2] = {1.f, 1.f};
    if constexpr (std::is_same_v<Op, __half>) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m = 0.f;
#pragma unroll
        for (int nt = 0; nt < K / 8; ++nt) m = fmaxf(m, fmaxf(fabsf(S[nt][2 * h]), fabsf(S[nt][2 * h + 1])));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));  // the row's four lanes
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        // 2^(13 - floor(log2 m)), the exponent kept within f32's range for any m (0: scale 1).
        const float e = m > 0.f ? fminf(fmaxf(13.f - floorf(log2f(m)), -100.f), 100.f) : 0.f;
        row_scale[h] = exp2f(e);
      }
    }
    std::uint32_t a[K / 16][4];
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
      a[ks][0] = IoBits<Op>::pack(S[2 * ks][0] * row_scale[0], S[2 * ks][1] * row_scale[0]);
      a[ks][1] = IoBits<Op>::pack(S[2 * ks][2] * row_scale[1], S[2 * ks][3] * row_scale[1]);
      a[ks][2] = IoBits<Op>::pack(S[2 * ks + 1][0] * row_scale[0], S[2 * ks + 1][1] * row_scale[0]);
      a[ks][3] = IoBits<Op>::pack(S[2 * ks + 1][2] * row_scale[1], S[2 * ks + 1][3] * row_scale[1]);
    }
    pairs.store(entering, DType::f32);
    // S_j diag(D_j) + Q_j in f32.
#pragma unroll
    for (int nt = 0; nt < K / 8; ++nt) {
      const float2 d = *reinterpret_cast<const float2*>(&sp.D[8 * nt + 2 * quad]);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 q = *reinterpret_cast<const float2*>(&sp.Q[16 * warp + group + 8 * half][8 * nt + 2 * quad]);
        S[nt][2 * half] = S[nt][2 * half] * d.x + q.x;
        S[nt][2 * half + 1] = S[nt][2 * half + 1] * d.y + q.y;
      }
    }
    // + S_j E_j: E [r][k] is the B operand (transposed load), r the k-step's dimension. bf16
    // accumulates into S; f16 apart, then unscaled.
    const auto product = [&](float(&acc)[K / 8][4]) {
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks)
#pragma unroll
        for (int np = 0; np < K / 16; ++np) {
          std::uint32_t bk[4];
          ldmatrix_x4_trans(bk, &sp.E[16 * ks + (lane % 8) + ((lane / 8) % 2) * 8][np * 16 + (lane / 16) * 8]);
          mma16<Op>(acc[2 * np], a[ks], bk[0], bk[1]);
          mma16<Op>(acc[2 * np + 1], a[ks], bk[2], bk[3]);
        }
    };
    if constexpr (std::is_same_v<Op, __half>) {
      float R[K / 8][4] = {};
      product(R);
      const float unscale[2] = {1.f / row_scale[0], 1.f / row_scale[1]};
#pragma unroll
      for (int nt = 0; nt < K / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[nt][e] += R[nt][e] * unscale[e / 2];
    } else {
      product(S);
    }
    __syncthreads();  // buffer j % 2 consumed before span j + 2's copies overwrite it
  }
  cp_async_wait_all();
}

}  // namespace kdaguard::gpu::prefill
