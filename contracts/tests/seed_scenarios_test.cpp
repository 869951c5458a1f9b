// The trigger scenarios of the three seed error records (../shared/seeds), and the upstream texts
// their messages must contain so that people who grep for the upstream error find ours.
#include <gtest/gtest.h>

#include <string>

#include "example_calls.h"
#include "kdaguard/contracts/validate.h"

namespace kdaguard {
namespace {

using namespace examples;

// The message of the only violation, which must be of rule `rule`.
std::string only_message(const Verdict& v, RuleId rule) {
  EXPECT_EQ(v.violations.size(), 1u) << describe(v);
  if (v.violations.empty()) return {};
  EXPECT_EQ(v.violations[0].rule, rule) << describe(v);
  return v.violations[0].message;
}

// Seed 003: SGLang's [B, H, K, V] layout passed as a transposed view of an [N, HV, V, K] pool.
TEST(Seed003, TransposedStateView) {
  auto c = decode();
  c.state = TensorView::contiguous(DType::f32, {8, 4, 64, 64});
  std::swap(c.state->stride[2], c.state->stride[3]);
  const std::string m = only_message(validate(c), RuleId::state_inner_strides);
  EXPECT_NE(m.find("state inner strides must be compact (V*K, K, 1)=(4096, 64, 1); got (4096, 1, 64)"),
            std::string::npos)
      << m;
}

// Seed 003: a view of the K half of a KV-interleaved buffer [S, HV, 2, V, K].
TEST(Seed003, ViewOverKvInterleavedBuffer) {
  auto c = decode();
  TensorView interleaved = TensorView::contiguous(DType::f32, {8, 4, 2, 64, 64});
  TensorView state = TensorView::contiguous(DType::f32, {8, 4, 64, 64});
  state.stride = {interleaved.stride[0], interleaved.stride[1], 64, 1};
  c.state = state;
  const std::string m = only_message(validate(c), RuleId::state_inner_strides);
  EXPECT_NE(m.find("got (8192, 64, 1)"), std::string::npos) << m;
}

TEST(Seed003, PoolRankMessage) {
  auto c = decode();
  c.state = TensorView::contiguous(DType::f32, {8, 4, 4096});
  const std::string m = only_message(validate(c), RuleId::state_rank);
  EXPECT_NE(m.find("recurrent_kda needs a [N, HV, V, K] state pool"), std::string::npos) << m;
}

TEST(Seed003, SlotStrideNotMultipleOf16) {
  auto c = decode();
  c.state->stride[0] = 4 * 64 * 64 + 24;
  const std::string m = only_message(validate(c), RuleId::state_slot_stride_align);
  EXPECT_NE(m.find("slot stride 16408 elements must be a multiple of 16"), std::string::npos) << m;
}

TEST(Seed003, SixteenByteBaseOffset) {
  auto c = decode();
  c.state->storage_offset = Elements{4};  // 16 bytes of f32
  const std::string m = only_message(validate(c), RuleId::state_base_align);
  EXPECT_NE(m.find("base byte offset 16"), std::string::npos) << m;
}

TEST(Seed003, EnvelopeStridedPoolIsAccepted) {
  auto c = decode();
  c.state->stride[0] = 4 * 64 * 64 * 2;  // a page-major envelope twice the slot
  c.state->storage_offset = Elements{8};  // 32 bytes of f32
  const Verdict v = validate(c);
  EXPECT_TRUE(v.accepted()) << describe(v);
}

// Seed 000: after an eviction the scheduler compacts the scratch rows, so the row map is permuted.
TEST(Seed000, PermutedRowMapAfterEviction) {
  auto c = verify();
  c.scratch_row_map->values = {{0, 2, 1, 3}};
  const std::string m = only_message(validate(c), RuleId::verify_row_map_identity);
  EXPECT_NE(m.find("requires an identity intermediate row-map"), std::string::npos) << m;
}

TEST(Seed000, ExplicitScratchIndicesMakeAPermutedRowMapLegal) {
  auto c = verify();
  c.scratch_row_map->values = {{2, 0, 1, 3}};
  // Row n writes its steps into scratch row map[n]: flat slot map[n] * T_alloc + t.
  TensorView si = TensorView::contiguous(DType::i32, {3, 4});
  si.values = {{8, 9, 10, 11, -1, -1, -1, -1, 4, 5, 6, -1}};
  c.scratch_indices = si;
  const Verdict v = validate(c);
  EXPECT_TRUE(v.accepted()) << describe(v);
}

TEST(Seed000, TooFewScratchSteps) {
  auto c = verify();
  c.scalars.draft_token_num = 6;
  const std::string m = only_message(validate(c), RuleId::verify_scratch_steps);
  EXPECT_NE(m.find("KDA verify needs 6 scratch steps, but intermediate_ssm only has 4."),
            std::string::npos)
      << m;
}

// Seed 004: a prefill call without its indexed state pool, and a gate shorter than q.
TEST(Seed004, PrefillWithoutPool) {
  auto c = prefill();
  c.initial_state.reset();
  const std::string m = only_message(validate(c), RuleId::prefill_indexed_pool);
  EXPECT_NE(m.find("KDA prefill requires an indexed initial-state pool"), std::string::npos) << m;
}

TEST(Seed004, PrefillWithoutIndices) {
  auto c = prefill();
  c.initial_state_indices.reset();
  const std::string m = only_message(validate(c), RuleId::prefill_indexed_pool);
  EXPECT_NE(m.find("KDA prefill requires an indexed initial-state pool"), std::string::npos) << m;
}

TEST(Seed004, GateShorterThanQ) {
  auto c = prefill();
  c.a = TensorView::contiguous(DType::bf16, {7, 4, 64});
  const std::string m = only_message(validate(c), RuleId::gate_cover_tokens);
  EXPECT_NE(m.find("g and beta must cover every q token"), std::string::npos) << m;
}

TEST(Seed004, GateLongerThanQIsAccepted) {
  auto c = prefill();
  c.a = TensorView::contiguous(DType::bf16, {16, 4, 64});  // rows past T_tot are ignored
  const Verdict v = validate(c);
  EXPECT_TRUE(v.accepted()) << describe(v);
}

}  // namespace
}  // namespace kdaguard
