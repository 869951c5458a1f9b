// The prefill workspace size query of kda.h (gpu::prefill_workspace_bytes), which launches nothing
// and needs no device, so it runs on any machine (label unit). An engine sizes its allocator's
// buffer from it once, for its largest call, and passes that buffer to every prefill; a size that
// left out the split chain's span operands, or one that shrank for a larger call, would turn those
// prefills into refusals. The expected sizes are derived here from the layout
// prefill_workspace.cuh documents (per (chunk slot, value head) the chunk operands, then per (span
// slot, value head) at the shortest span of 32 chunks the span operands), not from the library.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "kdaguard/kda.h"

namespace kdaguard {
namespace {

constexpr std::int64_t kChunk = 16, kMinChunksPerSpan = 32;

// -W, e^G q, e^(G_C - G) k (16-bit [16][K] each), A (16-bit [16][16]), e^(G_C) (f32 [K]), U (f32 [16][V]).
std::int64_t chunk_operand_bytes(std::int64_t K, std::int64_t V) {
  return 3 * kChunk * K * 2 + kChunk * kChunk * 2 + K * 4 + kChunk * V * 4;
}
// The entering state (f32 [V][K]), E (16-bit [K][K]), D (f32 [K]).
std::int64_t span_operand_bytes(std::int64_t K, std::int64_t V) { return V * K * 4 + K * K * 2 + K * 4; }

std::int64_t expected_bytes(std::int64_t tokens, std::int64_t seqs, std::int64_t HV, std::int64_t K, std::int64_t V) {
  const std::int64_t chunk_slots = tokens / kChunk + seqs;
  const std::int64_t span_slots = tokens / (kChunk * kMinChunksPerSpan) + seqs;
  const std::int64_t chunks = chunk_slots * HV * chunk_operand_bytes(K, V);
  return (chunks + 255) / 256 * 256 + span_slots * HV * span_operand_bytes(K, V);
}

TEST(PrefillWorkspaceBytes, HoldsTheChunkAndSpanOperandsOfTheLayout) {
  // T = 8192, one sequence, HV = 64, K = V = 128: 513 chunk slots of 21504 bytes and 17 span slots
  // of 98816 bytes per value head.
  EXPECT_EQ(gpu::prefill_workspace_bytes(8192, 1, 64, 128, 128, DType::bf16),
            513LL * 64 * 21504 + 17LL * 64 * 98816);
  std::mt19937_64 random(20261207);
  for (int i = 0; i < 2000; ++i) {
    const std::int64_t tokens = std::uniform_int_distribution<std::int64_t>(1, 1 << 18)(random);
    const std::int64_t seqs = std::uniform_int_distribution<std::int64_t>(1, 300)(random);
    const std::int32_t HV = std::uniform_int_distribution<std::int32_t>(1, 128)(random);
    const std::int32_t K = random() % 2 ? 64 : 128, V = random() % 2 ? 64 : 128;
    const DType io = random() % 2 ? DType::bf16 : DType::f16;
    EXPECT_EQ(gpu::prefill_workspace_bytes(tokens, seqs, HV, K, V, io), expected_bytes(tokens, seqs, HV, K, V))
        << "T " << tokens << " N " << seqs << " HV " << HV << " K " << K << " V " << V;
  }
}

// A buffer sized for the largest call serves every smaller one (kda.h).
TEST(PrefillWorkspaceBytes, NeverShrinksForMoreTokensOrSequences) {
  std::mt19937_64 random(7);
  for (int i = 0; i < 2000; ++i) {
    const std::int64_t tokens = std::uniform_int_distribution<std::int64_t>(0, 1 << 17)(random);
    const std::int64_t seqs = std::uniform_int_distribution<std::int64_t>(0, 200)(random);
    const std::int64_t more_tokens = tokens + std::uniform_int_distribution<std::int64_t>(0, 5000)(random);
    const std::int64_t more_seqs = seqs + std::uniform_int_distribution<std::int64_t>(0, 50)(random);
    const std::int32_t HV = std::uniform_int_distribution<std::int32_t>(1, 96)(random);
    const std::int64_t small = gpu::prefill_workspace_bytes(tokens, seqs, HV, 128, 64, DType::bf16);
    EXPECT_LE(small, gpu::prefill_workspace_bytes(more_tokens, seqs, HV, 128, 64, DType::bf16));
    EXPECT_LE(small, gpu::prefill_workspace_bytes(tokens, more_seqs, HV, 128, 64, DType::bf16));
  }
}

TEST(PrefillWorkspaceBytes, NothingForF32InputsOrEmptyCallsAndNoSizeForOthers) {
  EXPECT_EQ(gpu::prefill_workspace_bytes(8192, 1, 64, 128, 128, DType::f32), 0);  // the f32 kernel needs none
  EXPECT_EQ(gpu::prefill_workspace_bytes(0, 4, 64, 128, 128, DType::bf16), 0);
  EXPECT_EQ(gpu::prefill_workspace_bytes(100, 0, 64, 128, 128, DType::bf16), 0);
  EXPECT_EQ(gpu::prefill_workspace_bytes(8192, 1, 64, 96, 128, DType::bf16), -1);  // no kernel for K = 96
  EXPECT_EQ(gpu::prefill_workspace_bytes(-1, 1, 64, 128, 128, DType::bf16), -1);
  EXPECT_EQ(gpu::prefill_workspace_bytes(8192, -1, 64, 128, 128, DType::bf16), -1);
  EXPECT_EQ(gpu::prefill_workspace_bytes(8192, 1, 0, 128, 128, DType::bf16), -1);
  // Past int64: refused, not wrapped.
  EXPECT_EQ(gpu::prefill_workspace_bytes(INT64_MAX / 2, 1, 1 << 20, 128, 128, DType::bf16), -1);
}

}  // namespace
}  // namespace kdaguard
