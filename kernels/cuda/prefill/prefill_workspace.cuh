// The chunk operands the prepare kernel (prefill_prepare.cuh) hands to the chain kernel
// (prefill_chain.cuh) through device memory, and where each chunk's operands live.
//
// Chunk c (of kChunk = 16 tokens) of sequence n takes workspace slot
//   floor(cu_seqlens[n] / 16) + n + c,
// which is unique per (n, c) for monotone offsets and below floor(T_tot / 16) + N for any
// sequence whose offsets pass the device checks, so neither kernel needs a prefix sum over the
// sequences or the chunk counts on the host. Slot s of value head hv starts at byte
// (s * HV + hv) * ChunkOperands<K, V>::kBytes of the workspace.
#pragma once

#include <cstdint>

#include "prefill_device.cuh"

namespace kdaguard::gpu::prefill {

inline constexpr int kChunk = 16;

// One (chunk, value head): every operand of the chain step that does not depend on the state.
// Matrix operands are bf16 (they feed mma.sync as bf16 anyway); U stays f32 because
// Vnew = U - W S cancels, and decay_end is a per-channel f32 factor. Rows past a sequence's end
// are zero (k, q, v zero and g = 0), so they change neither the state nor the outputs.
template <int K, int V> struct ChunkOperands {
  // Byte offsets of the parts, each 16-byte aligned.
  static constexpr int kWneg = 0;                        // bf16 [16][K]: -W = -T diag(beta) (e^G k)
  static constexpr int kQg = kWneg + kChunk * K * 2;     // bf16 [16][K]: e^G q (normed, scaled)
  static constexpr int kKd = kQg + kChunk * K * 2;       // bf16 [16][K]: e^(G_C - G) k (normed)
  static constexpr int kA = kKd + kChunk * K * 2;        // bf16 [16][16]: causal q_i k_j e^(G_i - G_j)
  static constexpr int kDecay = kA + kChunk * kChunk * 2;  // f32 [K]: e^(G_C)
  static constexpr int kU = kDecay + K * 4;              // f32 [16][V]: T diag(beta) v
  static constexpr int kBytes = kU + kChunk * V * 4;
  static_assert(kBytes % 16 == 0);
};

__device__ __forceinline__ std::int64_t workspace_slot(std::int64_t seq_begin, std::int32_t n,
                                                       std::int64_t chunk) {
  return seq_begin / kChunk + n + chunk;
}

// Slots a call needs: every running sequence's chunks lie below this bound.
inline std::int64_t workspace_slots(std::int64_t total_tokens, std::int32_t num_seqs) {
  return total_tokens / kChunk + num_seqs;
}

}  // namespace kdaguard::gpu::prefill
