// The split chain's span choice (choose_chunks_per_span, prefill_launch.h), a pure function of the
// call's shape and the device's SM count, so it runs on any machine (label unit). A caller's
// workspace is sized for spans of kMinChunksPerSpan chunks (prefill_workspace_bytes), so a choice
// below that would turn an engine's prefill into a refusal; and the choices at the benchmarked
// shapes are the ones bench/NOTES_prefill.md measured against forced spans.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <utility>

#include "prefill_launch.h"

namespace kdaguard::gpu::detail {
namespace {

// K = V = 128 with 4 warps of 16 rows per chain block: 2 value slices, 4 transition slices.
ChainSplitCosts costs(std::int64_t tokens, std::int32_t seqs, std::int32_t HV, std::int64_t sms = 132) {
  ChainSplitCosts c;
  c.total_tokens = tokens;
  c.num_seqs = seqs;
  c.HV = HV;
  c.value_slices = 2;
  c.transition_slices = 4;
  c.resident_blocks = sms;
  return c;
}

TEST(PrefillSpanChoice, NeverShorterThanTheWorkspaceAllows) {
  std::mt19937_64 random(20261207);
  for (int i = 0; i < 20000; ++i) {
    const std::int32_t seqs = std::uniform_int_distribution<std::int32_t>(1, 64)(random);
    ChainSplitCosts c = costs(std::uniform_int_distribution<std::int64_t>(1, 1 << 19)(random), seqs,
                              std::uniform_int_distribution<std::int32_t>(1, 128)(random),
                              std::uniform_int_distribution<std::int64_t>(1, 160)(random));
    if (random() % 2) {  // K or V of 64
      c.value_slices = 1 + static_cast<int>(random() % 2);
      c.transition_slices = c.value_slices + 1 + static_cast<int>(random() % 2);
    }
    const std::int32_t span = choose_chunks_per_span(c);
    const std::int64_t mean_chunks = (c.total_tokens / 16 + seqs - 1) / seqs;
    EXPECT_TRUE(span == 0 || (span >= kMinChunksPerSpan && span < mean_chunks))
        << "span " << span << " for T " << c.total_tokens << " N " << seqs << " HV " << c.HV << " SMs "
        << c.resident_blocks;
  }
}

TEST(PrefillSpanChoice, SplitsOnlyWhereTheHeadsLeaveSmsIdle) {
  // One block per (sequence, value head, slice) already fills the SMs: the chain runs whole.
  EXPECT_EQ(choose_chunks_per_span(costs(8192, 1, 64)), 0);
  EXPECT_EQ(choose_chunks_per_span(costs(8192, 2, 64)), 0);
  // Short sequences: nothing to split into spans of 32 chunks.
  EXPECT_EQ(choose_chunks_per_span(costs(512, 1, 12)), 0);
  // Few heads over long sequences: split (spans of 32 to 256 chunks measured best there).
  for (const auto& [tokens, HV] : {std::pair<std::int64_t, std::int32_t>{8192, 12}, {32768, 4}, {65536, 4}}) {
    const std::int32_t span = choose_chunks_per_span(costs(tokens, 1, HV));
    EXPECT_GE(span, 32) << "T " << tokens << " HV " << HV;
    EXPECT_LE(span, 256) << "T " << tokens << " HV " << HV;
  }
  // Nothing to run, or no SM the chain fits on: no split.
  EXPECT_EQ(choose_chunks_per_span(costs(8192, 0, 12)), 0);
  EXPECT_EQ(choose_chunks_per_span(costs(8192, 1, 0)), 0);
  EXPECT_EQ(choose_chunks_per_span(costs(8192, 1, 12, 0)), 0);
}

}  // namespace
}  // namespace kdaguard::gpu::detail
