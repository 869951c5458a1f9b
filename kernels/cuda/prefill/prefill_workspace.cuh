// The operands the prefill kernels hand to each other through device memory, where each chunk's
// and each span's operands live, and the one place that lays a call's workspace out.
//
// Chunk c (of kChunk = 16 tokens) of sequence n takes workspace slot
//   floor(cu_seqlens[n] / 16) + n + c,
// which is unique per (n, c) for monotone offsets and below floor(T_tot / 16) + N for any
// sequence whose offsets pass the device checks, so neither kernel needs a prefix sum over the
// sequences or the chunk counts on the host. Slot s of value head hv starts at byte
// (s * HV + hv) * ChunkOperands<K, V>::kBytes of the workspace.
//
// A split chain (prefill_chain.cuh, prefill_combine.cuh) cuts each sequence into spans of L
// chunks; span j of sequence n takes span slot floor(cu_seqlens[n] / (16 L)) + n + j by the same
// argument (unique, below floor(T_tot / (16 L)) + N), each (span slot, value head) holding one
// SpanOperands after the chunk operands.
#pragma once

#include <cstddef>
#include <cstdint>

#include "prefill_device.cuh"

namespace kdaguard::gpu::prefill {

inline constexpr int kChunk = 16;

// One (chunk, value head): every operand of the chain step that does not depend on the state.
// Matrix operands are 16-bit in the inputs' dtype (bf16 or f16: they feed mma.sync as that type,
// see prefill_prepare.cuh for the f16 ranges); U stays f32 because
// Vnew = U - W S cancels, and decay_end is a per-channel f32 factor. Rows past a sequence's end
// are zero (k, q, v zero and g = 0), so they change neither the state nor the outputs.
template <int K, int V> struct ChunkOperands {
  // Byte offsets of the parts, each 16-byte aligned.
  static constexpr int kWneg = 0;                        // 16-bit [16][K]: -W = -T diag(beta) (e^G k)
  static constexpr int kQg = kWneg + kChunk * K * 2;     // 16-bit [16][K]: e^G q (normed, scaled)
  static constexpr int kKd = kQg + kChunk * K * 2;       // 16-bit [16][K]: e^(G_C - G) k (normed)
  static constexpr int kA = kKd + kChunk * K * 2;        // 16-bit [16][16]: causal q_i k_j e^(G_i - G_j)
  static constexpr int kDecay = kA + kChunk * kChunk * 2;  // f32 [K]: e^(G_C)
  static constexpr int kU = kDecay + K * 4;              // f32 [16][V]: T diag(beta) v
  static constexpr int kBytes = kU + kChunk * V * 4;
  static_assert(kBytes % 16 == 0);
};

// One (span, value head) of a split chain. The span maps a state S (V x K) entering it to
// S P + Q leaving it, P = M_1 ... M_L the product of its chunks' transitions
// M = diag(e^(G_C)) + (-W)^T Kd and Q the state the span leaves from a zero state.
template <int K, int V> struct SpanOperands {
  // f32 [V][K]: Q (transition kernel); then, overwritten in place by the combine kernel, the
  // true state entering the span, which the span kernel starts from.
  static constexpr int kState = 0;
  // 16-bit (the inputs' dtype) [K][K]: E = P - diag(D), rows the entering state's key channel.
  // The diagonal is kept apart in f32 so the decay, the largest part of P, is never rounded.
  // |E| <= 2: P is a product of the chunks' maps, each of norm <= 1 while the delta rule is
  // stable (beta |k|^2 <= 2), so f16 holds it.
  static constexpr int kCarry = kState + V * K * 4;
  static constexpr int kDecay = kCarry + K * K * 2;  // f32 [K]: D, the product of e^(G_C) over the span
  static constexpr int kBytes = kDecay + K * 4;
  static_assert(kBytes % 16 == 0);
};

// The slot of unit `index` (a chunk, or a span) of the sequence starting at seq_begin, units of
// tokens_per_unit tokens.
__host__ __device__ __forceinline__ std::int64_t unit_slot(std::int64_t seq_begin, std::int32_t n,
                                                           std::int64_t index,
                                                           std::int64_t tokens_per_unit) {
  return seq_begin / tokens_per_unit + n + index;
}

__device__ __forceinline__ std::int64_t workspace_slot(std::int64_t seq_begin, std::int32_t n,
                                                       std::int64_t chunk) {
  return unit_slot(seq_begin, n, chunk, kChunk);
}

// Slots a call needs: every running sequence's units lie below this bound.
inline std::int64_t unit_slots(std::int64_t total_tokens, std::int32_t num_seqs,
                               std::int64_t tokens_per_unit) {
  return total_tokens / tokens_per_unit + num_seqs;
}
inline std::int64_t workspace_slots(std::int64_t total_tokens, std::int32_t num_seqs) {
  return unit_slots(total_tokens, num_seqs, kChunk);
}

// The sequence whose units may own slot s: the largest n with
// floor(cu_seqlens[n] / tokens_per_unit) + n <= s (that function of n increases with n for
// monotone offsets; for any other offsets the caller's checks of the sequence found keep every
// access in bounds).
__device__ __forceinline__ std::int32_t sequence_of_slot(const PrefillParams& p, std::int64_t s,
                                                         std::int64_t tokens_per_unit) {
  std::int32_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const std::int32_t mid = lo + (hi - lo + 1) / 2;
    if (unit_slot(seq_offset(p, mid), mid, 0, tokens_per_unit) <= s) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// A call's workspace: the chunk operands, then (split chains only) the span operands. Computed
// here and nowhere else, from the call's shape and the chosen span length.
struct WorkspaceLayout {
  std::int32_t chunks_per_span = 0;  // 0: every sequence's chain runs whole
  std::int64_t chunk_slots = 0, span_slots = 0;
  std::uint64_t span_offset = 0;  // bytes from the start to the span operands
  std::uint64_t bytes = 0;
  bool overflows = false;  // a size past 2^63 bytes: no such workspace
};

template <int K, int V>
WorkspaceLayout workspace_layout(std::int64_t total_tokens, std::int32_t num_seqs, std::int32_t HV,
                                 std::int32_t chunks_per_span) {
  WorkspaceLayout w;
  w.chunks_per_span = chunks_per_span;
  w.chunk_slots = workspace_slots(total_tokens, num_seqs);
  if (chunks_per_span > 0)
    w.span_slots = unit_slots(total_tokens, num_seqs, static_cast<std::int64_t>(kChunk) * chunks_per_span);
  const auto times = [&](std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    w.overflows |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  const auto plus = [&](std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    w.overflows |= __builtin_add_overflow(a, b, &r);
    return r;
  };
  const auto aligned = [&](std::uint64_t bytes) { return plus(bytes, 255) / 256 * 256; };
  const std::uint64_t chunk_units = times(static_cast<std::uint64_t>(w.chunk_slots), static_cast<std::uint64_t>(HV));
  w.span_offset = aligned(times(chunk_units, ChunkOperands<K, V>::kBytes));
  w.bytes = plus(w.span_offset, times(times(static_cast<std::uint64_t>(w.span_slots), static_cast<std::uint64_t>(HV)),
                                      SpanOperands<K, V>::kBytes));
  w.overflows |= w.bytes > static_cast<std::uint64_t>(INT64_MAX);
  return w;
}

}  // namespace kdaguard::gpu::prefill
