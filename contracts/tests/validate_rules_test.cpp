// For every rule of the catalogue: a valid call, the smallest change that breaks that rule alone,
// and the expectation that exactly that rule is reported. The valid calls themselves must pass.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>

#include "example_calls.h"
#include "kdaguard/contracts/validate.h"

namespace kdaguard {
namespace {

using namespace examples;

std::set<RuleId> rules_of(const Verdict& v) {
  std::set<RuleId> rules;
  for (const Violation& x : v.violations) rules.insert(x.rule);
  return rules;
}

TEST(ValidCalls, AreAccepted) {
  for (const AnyCall& call : {AnyCall(decode()), AnyCall(prefill()), AnyCall(verify()),
                              AnyCall(commit())}) {
    const Verdict v = validate(call);
    EXPECT_TRUE(v.accepted()) << entry_name(entry_of(call)) << ":\n" << describe(v);
    EXPECT_TRUE(v.deferred.empty()) << "host values were given, nothing should be deferred";
  }
}

TEST(ValidCalls, ValueRulesAreDeferredWithoutHostValues) {
  VerifyCall c = verify();
  c.cache_indices->values.reset();
  c.cu_seqlens->values.reset();
  c.scratch_row_map->values.reset();
  const Verdict v = validate(c);
  EXPECT_TRUE(v.accepted()) << describe(v);
  std::set<RuleId> deferred;
  for (const DeferredCheck& d : v.deferred) deferred.insert(d.rule);
  EXPECT_EQ(deferred, (std::set<RuleId>{RuleId::index_range, RuleId::index_unique,
                                        RuleId::seqlens_start, RuleId::seqlens_monotone,
                                        RuleId::seqlens_total, RuleId::verify_row_length,
                                        RuleId::verify_row_map_identity}));
}

struct Case {
  const char* name;
  std::function<AnyCall()> make;
  RuleId rule;
};

// Names the case in test output (gtest would otherwise dump the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// One or more cases per rule; a test below checks every catalogue rule has one.
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"decode_without_k", [] { auto c = decode(); c.k.reset(); return AnyCall(c); },
       RuleId::arg_missing},
      {"decode_without_gate", [] { auto c = decode(); c.a.reset(); c.A_log.reset(); return AnyCall(c); },
       RuleId::arg_missing},
      {"verify_without_row_map_or_indices",
       [] { auto c = verify(); c.scratch_row_map.reset(); return AnyCall(c); }, RuleId::arg_missing},
      {"decode_with_a_and_g",
       [] { auto c = decode(); c.g = view(DType::f32, {4, 4, 64}); return AnyCall(c); },
       RuleId::arg_exclusive},
      {"decode_k_rank_2",
       [] { auto c = decode(); c.k = view(DType::bf16, {4, 128}); return AnyCall(c); },
       RuleId::arg_rank},
      {"decode_out_wrong_head_dim",
       [] { auto c = decode(); c.out = view(DType::bf16, {4, 4, 128}); return AnyCall(c); },
       RuleId::arg_shape},
      {"decode_negative_size",
       [] { auto c = decode(); c.k->shape[0] = -4; return AnyCall(c); }, RuleId::arg_shape},
      {"decode_k_f16_q_bf16",
       [] { auto c = decode(); c.k->dtype = DType::f16; return AnyCall(c); }, RuleId::arg_dtype},
      {"decode_state_f16",
       [] { auto c = decode(); c.state->dtype = DType::f16; return AnyCall(c); }, RuleId::arg_dtype},
      {"decode_k_on_cpu",
       [] { auto c = decode(); c.k->device = Device{Device::Kind::cpu, 0}; return AnyCall(c); },
       RuleId::arg_device},
      {"decode_q_last_stride_2",
       [] { auto c = decode(); c.q->stride = {256, 128, 2}; return AnyCall(c); },
       RuleId::arg_last_dim_contiguous},
      {"decode_q_negative_stride",
       [] { auto c = decode(); c.q->stride[0] = -128; return AnyCall(c); }, RuleId::arg_stride},
      {"decode_out_rows_share_addresses",
       [] { auto c = decode(); c.out->stride[0] = 0; return AnyCall(c); }, RuleId::arg_stride},
      {"decode_q_past_its_allocation",
       [] { auto c = decode(); c.q->storage_size = Elements{4 * 2 * 64 - 1}; return AnyCall(c); },
       RuleId::arg_extent},
      {"decode_q_stride_overflows",
       [] { auto c = decode(); c.q->stride[0] = std::int64_t{1} << 62; return AnyCall(c); },
       RuleId::arg_extent},
      {"decode_q_offset_3_elements",
       [] { auto c = decode(); c.q->storage_offset = Elements{3}; return AnyCall(c); },
       RuleId::arg_alignment},
      {"decode_out_overlaps_q",
       [] {
         auto c = decode();
         c.q->address = 4096;
         c.out->address = 4096;
         return AnyCall(c);
       },
       RuleId::alias_overlap},
      {"decode_three_qk_heads_for_four_value_heads",
       [] {
         auto c = decode();
         c.q = view(DType::bf16, {4, 3, 64});
         c.k = view(DType::bf16, {4, 3, 64});
         return AnyCall(c);
       },
       RuleId::dims_heads},
      {"decode_head_dim_32",
       [] {
         Shape s;
         s.K = 32;
         return AnyCall(decode(s));
       },
       RuleId::dims_head_dim},
      {"decode_negative_scale",
       [] { auto c = decode(); c.scalars.scale = -1.0; return AnyCall(c); }, RuleId::scalar_scale},
      {"decode_nan_scale",
       [] { auto c = decode(); c.scalars.scale = std::nan(""); return AnyCall(c); },
       RuleId::scalar_scale},
      {"decode_positive_lower_bound",
       [] { auto c = decode(); c.scalars.lower_bound = 0.5; return AnyCall(c); },
       RuleId::scalar_lower_bound},
      {"decode_raw_gate_without_A_log",
       [] { auto c = decode(); c.A_log.reset(); return AnyCall(c); }, RuleId::gate_params},
      {"decode_activated_gate_with_lower_bound",
       [] {
         auto c = decode();
         c.a.reset();
         c.g = view(DType::f32, {4, 4, 64});
         c.scalars.lower_bound = -5.0;
         return AnyCall(c);
       },
       RuleId::gate_params},
      {"prefill_gate_shorter_than_q",
       [] { auto c = prefill(); c.a = view(DType::bf16, {9, 4, 64}); return AnyCall(c); },
       RuleId::gate_cover_tokens},
      {"prefill_beta_shorter_than_q",
       [] {
         auto c = prefill();
         c.b.reset();
         c.beta = view(DType::f32, {9, 4});
         return AnyCall(c);
       },
       RuleId::gate_cover_tokens},
      {"decode_state_rank_2",
       [] { auto c = decode(); c.state = view(DType::f32, {8, 4 * 64 * 64}); return AnyCall(c); },
       RuleId::state_rank},
      {"decode_state_transposed",
       [] {
         auto c = decode();
         std::swap(c.state->stride[2], c.state->stride[3]);
         return AnyCall(c);
       },
       RuleId::state_inner_strides},
      {"decode_state_slot_stride_not_multiple_of_16",
       [] { auto c = decode(); c.state->stride[0] = 4 * 64 * 64 + 8; return AnyCall(c); },
       RuleId::state_slot_stride_align},
      {"decode_state_16_byte_base_offset",
       [] { auto c = decode(); c.state->storage_offset = Elements{4}; return AnyCall(c); },
       RuleId::state_base_align},
      {"decode_state_slots_overlap",
       [] { auto c = decode(); c.state->stride[0] = 4 * 64 * 64 - 16; return AnyCall(c); },
       RuleId::state_slot_stride_min},
      {"decode_empty_pool",
       [] {
         Shape s;
         s.slots = 0;
         auto c = decode(s);
         c.cache_indices->values.reset();
         return AnyCall(c);
       },
       RuleId::state_empty},
      {"decode_cache_indices_short",
       [] { auto c = decode(); c.cache_indices = index_view({3, 7, -1}); return AnyCall(c); },
       RuleId::index_length},
      {"decode_slot_out_of_range",
       [] { auto c = decode(); c.cache_indices->values = {{3, 8, -1, 0}}; return AnyCall(c); },
       RuleId::index_range},
      {"decode_padding_below_minus_one",
       [] { auto c = decode(); c.cache_indices->values = {{3, 7, -2, 0}}; return AnyCall(c); },
       RuleId::index_range},
      {"decode_slot_twice",
       [] { auto c = decode(); c.cache_indices->values = {{3, 3, -1, 0}}; return AnyCall(c); },
       RuleId::index_unique},
      {"prefill_padding_index",
       [] { auto c = prefill(); c.initial_state_indices->values = {{2, -1, 4}}; return AnyCall(c); },
       RuleId::index_padding},
      {"verify_scratch_indices_out_of_range",
       [] {
         auto c = verify();
         auto si = index_view({0, 1, 2, 3, 4, 5, -1, -1, 8, 9, 10, 16});
         si.rank = 2;
         si.shape[0] = 3;
         si.shape[1] = 4;
         si.stride[0] = 4;
         si.stride[1] = 1;
         c.scratch_indices = si;
         return AnyCall(c);
       },
       RuleId::index_range},
      {"prefill_cu_seqlens_start_1",
       [] { auto c = prefill(); c.cu_seqlens->values = {{1, 4, 4, 10}}; return AnyCall(c); },
       RuleId::seqlens_start},
      {"prefill_cu_seqlens_decrease",
       [] { auto c = prefill(); c.cu_seqlens->values = {{0, 5, 4, 10}}; return AnyCall(c); },
       RuleId::seqlens_monotone},
      {"prefill_cu_seqlens_total_9",
       [] { auto c = prefill(); c.cu_seqlens->values = {{0, 4, 4, 9}}; return AnyCall(c); },
       RuleId::seqlens_total},
      {"decode_cu_seqlens_two_tokens",
       [] { auto c = decode(); c.cu_seqlens = index_view({0, 1, 2, 3, 5}); return AnyCall(c); },
       RuleId::decode_one_token},
      {"prefill_without_pool",
       [] { auto c = prefill(); c.initial_state.reset(); return AnyCall(c); },
       RuleId::prefill_indexed_pool},
      {"prefill_without_indices",
       [] { auto c = prefill(); c.initial_state_indices.reset(); return AnyCall(c); },
       RuleId::prefill_indexed_pool},
      {"verify_zero_draft_tokens",
       [] { auto c = verify(); c.scalars.draft_token_num = 0; return AnyCall(c); },
       RuleId::verify_draft_tokens},
      {"verify_more_draft_tokens_than_scratch_steps",
       [] { auto c = verify(); c.scalars.draft_token_num = 5; return AnyCall(c); },
       RuleId::verify_scratch_steps},
      {"verify_scratch_bf16_state_f32",
       [] { auto c = verify(); c.scratch->dtype = DType::bf16; return AnyCall(c); },
       RuleId::verify_scratch_layout},
      {"verify_scratch_rows_do_not_flatten",
       [] { auto c = verify(); c.scratch->stride[0] += 64; return AnyCall(c); },
       RuleId::verify_scratch_layout},
      {"verify_two_scratch_rows_for_three",
       [] {
         auto c = verify();
         c.scratch = scratch(verify_shape(), 2, 4);
         return AnyCall(c);
       },
       RuleId::verify_scratch_rows},
      {"verify_row_of_five",
       [] { auto c = verify(); c.cu_seqlens->values = {{0, 5, 6, 9}}; return AnyCall(c); },
       RuleId::verify_row_length},
      {"verify_permuted_row_map",
       [] { auto c = verify(); c.scratch_row_map->values = {{1, 0, 2, 3}}; return AnyCall(c); },
       RuleId::verify_row_map_identity},
      {"verify_scratch_indices_wrong_shape",
       [] {
         auto c = verify();
         c.scratch_indices = TensorView::contiguous(DType::i32, {3, 3});
         return AnyCall(c);
       },
       RuleId::verify_scratch_indices},
      {"verify_scratch_indices_i64",
       [] {
         auto c = verify();
         c.scratch_indices = TensorView::contiguous(DType::i64, {3, 4});
         return AnyCall(c);
       },
       RuleId::verify_scratch_indices},
      {"commit_accepts_five_of_four",
       [] { auto c = commit(); c.accepted->values = {{5, 0, 3}}; return AnyCall(c); },
       RuleId::commit_accepted},
      {"commit_accepts_past_row_length",
       [] {
         auto c = commit();
         c.cu_seqlens = index_view({0, 1, 3, 6});
         return AnyCall(c);
       },
       RuleId::commit_accepted},
  };
  return all;
}

class SingleRule : public ::testing::TestWithParam<Case> {};

TEST_P(SingleRule, BreaksExactlyThatRule) {
  const Case& c = GetParam();
  const Verdict v = validate(c.make());
  EXPECT_EQ(rules_of(v), std::set<RuleId>{c.rule}) << describe(v);
  for (const Violation& x : v.violations) {
    EXPECT_FALSE(x.argument.empty());
    EXPECT_FALSE(x.message.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, SingleRule, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(SingleRule, EveryRuleHasACase) {
  std::set<RuleId> covered;
  for (const Case& c : cases()) covered.insert(c.rule);
  // Rules of the record-based entry points alone have their cases in
  // validate_record_rules_test.cpp.
  for (const RuleInfo& r : rule_catalogue()) {
    if ((r.entry_mask & entry_masks::kDPVC) != 0) {
      EXPECT_TRUE(covered.count(r.rule)) << r.id;
    }
  }
}

TEST(Validate, ReportsEveryViolationInADeterministicOrder) {
  auto c = decode();
  c.k.reset();
  c.state->stride[0] = 4 * 64 * 64 + 8;
  c.scalars.scale = 0.0;
  c.cache_indices->values = {{3, 3, -1, 0}};
  const Verdict first = validate(c);
  const Verdict second = validate(c);
  ASSERT_EQ(first.violations.size(), 4u) << describe(first);
  EXPECT_EQ(first.violations[0].rule, RuleId::arg_missing);
  EXPECT_EQ(first.violations[1].rule, RuleId::scalar_scale);
  EXPECT_EQ(first.violations[2].rule, RuleId::state_slot_stride_align);
  EXPECT_EQ(first.violations[3].rule, RuleId::index_unique);
  EXPECT_EQ(describe(first), describe(second));
}

// Violations of one rule on several arguments come in argument order (Arg), not in the order the
// checks run: verify checks cu_seqlens before cache_indices, commit scratch_row_map before it.
TEST(Validate, OneRuleOnSeveralArgumentsInArgumentOrder) {
  auto v = verify();
  v.cu_seqlens->dtype = DType::i64;
  v.cache_indices->dtype = DType::i64;
  const Verdict verify_verdict = validate(v);
  ASSERT_EQ(verify_verdict.violations.size(), 2u) << describe(verify_verdict);
  EXPECT_EQ(verify_verdict.violations[0].argument, "cache_indices") << describe(verify_verdict);
  EXPECT_EQ(verify_verdict.violations[1].argument, "cu_seqlens") << describe(verify_verdict);

  auto c = commit();
  c.scratch_row_map->dtype = DType::i64;
  c.cache_indices->dtype = DType::i64;
  const Verdict commit_verdict = validate(c);
  ASSERT_EQ(commit_verdict.violations.size(), 2u) << describe(commit_verdict);
  EXPECT_EQ(commit_verdict.violations[0].argument, "cache_indices") << describe(commit_verdict);
  EXPECT_EQ(commit_verdict.violations[1].argument, "scratch_row_map") << describe(commit_verdict);
}

TEST(Validate, VerdictDependsOnContentsNotOnAddress) {
  // Same addresses, other values: other verdict (no caching by identity).
  auto c = decode();
  c.cache_indices->address = 0x10000;
  EXPECT_TRUE(validate(c).accepted());
  c.cache_indices->values = {{3, 3, -1, 0}};
  EXPECT_FALSE(validate(c).accepted());
  c.cache_indices->values = {{3, 7, -1, 0}};
  EXPECT_TRUE(validate(c).accepted());
}

// An output whose row stride is exactly the offset of a row's last element (head HV - 1,
// element V - 1): row n + 1 begins on that element, so two elements share one address (and the
// stride is not 16-byte aligned either). One element further apart, a whole row, is valid.
TEST(Validate, OutputRowsMeetingAtOneElementOverlap) {
  auto c = decode();
  const std::int64_t row = c.out->shape[1] * c.out->shape[2];
  c.out->stride[0] = row - 1;
  const Verdict v = validate(c);
  EXPECT_TRUE(v.breaks(RuleId::arg_stride)) << describe(v);
  EXPECT_TRUE(v.breaks(RuleId::arg_alignment)) << describe(v);
  c.out->stride[0] = row;
  EXPECT_TRUE(validate(c).accepted()) << describe(validate(c));
}

TEST(Validate, AbsurdNumbersAreErrorsNotCrashes) {
  auto c = decode();
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  c.q->shape = {big, big, big};
  c.v->shape[1] = big;
  c.state->stride = {big, big, big, big};
  c.state->storage_offset = Elements{big};
  c.out->address = ~std::uint64_t{0} - 8;
  const Verdict v = validate(c);
  EXPECT_FALSE(v.accepted());
  EXPECT_TRUE(v.breaks(RuleId::arg_extent)) << describe(v);
}

}  // namespace
}  // namespace kdaguard

namespace kdaguard {
namespace {

using namespace examples;

// Whether a commit row reads a skipped step depends on whether the row is active, which needs
// cache_indices' values: without them the check is deferred, not dropped.
TEST(Validate, CommitOfASkippedStepIsDeferredWithoutCacheIndexValues) {
  auto c = commit();
  TensorView si = TensorView::contiguous(DType::i32, {3, 4});
  si.values = {{0, 1, -1, -1, 4, 5, 6, 7, 8, 9, 10, 11}};
  c.scratch_indices = si;
  c.scratch_row_map.reset();
  c.accepted->values = {{3, 0, 3}};  // row 0 accepts 3 tokens; its step 2 was skipped
  EXPECT_TRUE(validate(c).breaks(RuleId::commit_accepted));
  c.cache_indices->values.reset();
  const Verdict v = validate(c);
  EXPECT_TRUE(v.accepted()) << describe(v);
  // Deferred for the argument whose values are missing (the rule table: commit.accepted reads
  // cache_indices).
  int deferred = 0;
  for (const DeferredCheck& d : v.deferred)
    deferred += d.rule == RuleId::commit_accepted && d.argument == "cache_indices";
  EXPECT_EQ(deferred, 1);
}

}  // namespace
}  // namespace kdaguard

namespace kdaguard {
namespace {

using namespace examples;

std::set<RuleId> fired_rules(const Verdict& v) {
  std::set<RuleId> rules;
  for (const Violation& x : v.violations) rules.insert(x.rule);
  return rules;
}

// row_rules.h's semantics: an ordered cu_seqlens whose rows run past the tokens breaks
// seqlens.total alone (not seqlens.monotone), whichever row first leaves the tokens.
TEST(ValueSemantics, OffsetsPastTheTokensAreTheTotal) {
  auto c = prefill();
  c.cu_seqlens->values = {{0, 5, 6, 15}};  // T_tot = 10: rows 1 and 2 end past it
  EXPECT_EQ(fired_rules(validate(c)), (std::set<RuleId>{RuleId::seqlens_total}));
}

// The rows beside a decreasing offset are judged by seqlens.monotone alone: their lengths mean
// nothing, so a verify row made long by the broken offset is not verify.row_length.
TEST(ValueSemantics, RowsBesideADecreaseAreMonotoneOnly) {
  auto c = verify();
  c.cu_seqlens->values = {{0, 4, 9, 7}};  // T = 4: row 1 [4, 9) is 5 long, beside the decrease
  c.q->shape[0] = c.k->shape[0] = c.v->shape[0] = c.out->shape[0] = 7;
  const Verdict v = validate(c);
  EXPECT_EQ(fired_rules(v), (std::set<RuleId>{RuleId::seqlens_monotone})) << describe(v);
}

// verify.row_map_identity exempts padding rows (cache index -1): they write no scratch, and
// engines pad the map past the pool for them.
TEST(ValueSemantics, PaddingRowsMayHaveAnyRowMapEntry) {
  auto c = verify();  // row 1 is padding
  c.scratch_row_map->values = {{0, 77, 2, 3}};
  EXPECT_TRUE(validate(c).accepted()) << describe(validate(c));
  c.scratch_row_map->values = {{0, 1, 0, 3}};  // row 2 is not padding
  EXPECT_EQ(fired_rules(validate(c)), (std::set<RuleId>{RuleId::verify_row_map_identity}));
  auto k = commit();
  k.scratch_row_map->values = {{0, 77, 2, 3}};
  EXPECT_TRUE(validate(k).accepted()) << describe(validate(k));
}

// A call without rows: its single offset must still be 0 and T_tot.
TEST(ValueSemantics, ACallWithoutRowsJudgesItsOffset) {
  auto c = prefill();
  c.cu_seqlens = index_view({3});
  c.initial_state_indices = index_view({});
  const Verdict v = validate(c);
  EXPECT_TRUE(v.breaks(RuleId::seqlens_start)) << describe(v);
  EXPECT_TRUE(v.breaks(RuleId::seqlens_total)) << describe(v);
}

// A host copy of an index tensor's values that is not one value per element is reported whatever
// else is wrong with the call, even where no value rule can then be judged (an unknown row count,
// an invalid draft token count).
TEST(ValueSemantics, AHostCopyOfTheWrongCountIsReportedWhateverElseIsWrong) {
  auto d = decode();
  d.q.reset();  // B unknown
  d.cache_indices->values->push_back(0);
  EXPECT_EQ(fired_rules(validate(d)), (std::set<RuleId>{RuleId::arg_missing, RuleId::arg_shape}));
  auto v = verify();
  v.scalars.draft_token_num.reset();
  v.scratch_row_map.reset();
  v.scratch_indices = index_view({0, 1, 2, 3, -1, -1, -1, -1, 8, 9, 10, -1});
  v.scratch_indices->rank = 2;
  v.scratch_indices->shape[0] = 3;
  v.scratch_indices->shape[1] = 4;
  v.scratch_indices->stride[0] = 4;
  v.scratch_indices->stride[1] = 1;
  v.scratch_indices->values->pop_back();
  const Verdict verdict = validate(v);
  EXPECT_EQ(fired_rules(verdict), (std::set<RuleId>{RuleId::arg_shape, RuleId::verify_draft_tokens}))
      << describe(verdict);
}

// Value rules are judged only where what they need is known: no row is judged without the row
// count, and no scratch index without the scratch whose slots bound it.
TEST(ValueSemantics, ValueRulesWaitForTheDimensionsTheyNeed) {
  auto d = decode();
  d.q.reset();  // B unknown
  d.cu_seqlens = index_view({1, 2, 3, 4, 5});
  EXPECT_EQ(fired_rules(validate(d)), (std::set<RuleId>{RuleId::arg_missing}));
  auto k = commit();
  k.accepted.reset();  // N unknown
  k.cu_seqlens = index_view({3, 5, 6, 7});
  EXPECT_EQ(fired_rules(validate(k)), (std::set<RuleId>{RuleId::arg_missing}));
  auto v = verify();
  v.scratch.reset();  // S_spec * T_alloc unknown
  v.scratch_row_map.reset();
  v.scratch_indices = index_view({0, 1, 2, 3, -1, -1, -1, -1, 8, 9, 10, -1});
  v.scratch_indices->rank = 2;
  v.scratch_indices->shape[0] = 3;
  v.scratch_indices->shape[1] = 4;
  v.scratch_indices->stride[0] = 4;
  v.scratch_indices->stride[1] = 1;
  const Verdict verdict = validate(v);
  EXPECT_EQ(fired_rules(verdict), (std::set<RuleId>{RuleId::arg_missing})) << describe(verdict);
}

// Without tokens as well (T_tot = 0): the offset 0 is both 0 and T_tot; any other is neither.
TEST(ValueSemantics, ACallWithoutTokensJudgesItsOffsetAgainstZero) {
  for (const std::int64_t offset : {0, 3}) {
    auto c = prefill();
    Shape s;
    s.rows = 0;
    s.V = 128;
    fill_token_inputs(c, s);
    c.cu_seqlens = index_view({offset});
    c.initial_state_indices = index_view({});
    const Verdict v = validate(c);
    const auto expected = offset == 0 ? std::set<RuleId>{}
                                      : std::set<RuleId>{RuleId::seqlens_start, RuleId::seqlens_total};
    EXPECT_EQ(fired_rules(v), expected) << describe(v);
  }
}

}  // namespace
}  // namespace kdaguard

#include "kdaguard/contracts/row_rules.h"

namespace kdaguard {
namespace {

using namespace examples;

std::set<std::string> arguments_of(const Verdict& v) {
  std::set<std::string> arguments;
  for (const Violation& x : v.violations) arguments.insert(std::string(x.argument));
  return arguments;
}

// A size of -1 is a negative size like any other: the dimension it would define (B from q) stays
// unknown, so no other argument is compared against it.
TEST(EdgeValues, SizeMinusOneDefinesNoDimension) {
  auto c = decode();
  c.q->shape[0] = -1;
  const Verdict v = validate(c);
  EXPECT_TRUE(v.breaks(RuleId::arg_shape)) << describe(v);
  EXPECT_EQ(arguments_of(v), std::set<std::string>{"q"}) << describe(v);
}

// A rank of -1 is reported as the rank alone: nothing of the view is read past it, not even its
// offset (one before its allocation here; a view of rank 0 is still checked for its extent).
TEST(EdgeValues, RankMinusOneIsTheRankAlone) {
  auto c = decode();
  c.q->rank = -1;
  c.q->storage_offset = Elements{-8};
  const Verdict v = validate(c);
  ASSERT_EQ(v.violations.size(), 1u) << describe(v);
  EXPECT_EQ(v.violations[0].rule, RuleId::arg_rank);
  EXPECT_EQ(v.violations[0].argument, "q");
}

// A scratch of one row has no row stride to flatten: any stride[0] is valid.
TEST(EdgeValues, OneScratchRowHasAFreeRowStride) {
  Shape s = verify_shape();
  s.rows = 4;
  VerifyCall c;
  fill_token_inputs(c, s);
  c.cu_seqlens = index_view({0, 4});
  c.state = pool(DType::f32, s, 6);
  c.cache_indices = index_view({1});
  c.scratch = scratch(s, 1, 4);
  c.scratch_row_map = index_view({0});
  c.scalars.draft_token_num = 4;
  ASSERT_TRUE(validate(c).accepted()) << describe(validate(c));
  c.scratch->stride[0] = 4 * c.scratch->stride[1] + 16;
  EXPECT_TRUE(validate(c).accepted()) << describe(validate(c));
}

// Commit takes K from the state pool: a scratch of another K is its shape's fault.
TEST(EdgeValues, CommitScratchOfAnotherHeadDim) {
  auto c = commit();
  const Shape s = verify_shape();
  c.scratch = view(DType::f32, {4, 4, s.HV, s.V, 2 * s.K});
  const Verdict v = validate(c);
  ASSERT_EQ(v.violations.size(), 1u) << describe(v);
  EXPECT_EQ(v.violations[0].rule, RuleId::arg_shape);
  EXPECT_EQ(v.violations[0].argument, "scratch");
}

// Commit takes V from the state pool too: a scratch of another V is its shape's fault.
TEST(EdgeValues, CommitScratchOfAnotherValueDim) {
  auto c = commit();
  const Shape s = verify_shape();
  c.scratch = view(DType::f32, {4, 4, s.HV, 2 * s.V, s.K});
  const Verdict v = validate(c);
  ASSERT_EQ(v.violations.size(), 1u) << describe(v);
  EXPECT_EQ(v.violations[0].rule, RuleId::arg_shape);
  EXPECT_EQ(v.violations[0].argument, "scratch");
}

// HV = 0 is a multiple of every H but not a positive one: dims.heads, on v.
TEST(EdgeValues, NoValueHeadsIsNotAPositiveMultipleOfH) {
  Shape s;
  s.HV = 0;
  const Verdict v = validate(decode(s));
  bool heads = false;
  for (const Violation& x : v.violations)
    if (x.rule == RuleId::dims_heads) {
      heads = true;
      EXPECT_EQ(x.argument, "v");
      EXPECT_EQ(x.message, "HV must be a positive multiple of H; got HV = 0 (v), H = 2 (q)");
    }
  EXPECT_TRUE(heads) << describe(v);
}

// A dim of size 1 is never stepped along, so its stride cannot make an output overlap, even
// when it is smaller than the other dims' strides.
TEST(EdgeValues, OutputSizeOneDimWithASmallStrideIsOneToOne) {
  Shape s;
  s.rows = 1;
  auto c = decode(s);
  c.cache_indices = index_view({3});
  ASSERT_TRUE(validate(c).accepted()) << describe(validate(c));
  c.out->stride[0] = 8;  // 16 bytes: below the head stride V = 64
  EXPECT_TRUE(validate(c).accepted()) << describe(validate(c));
}

// An out-of-range scratch index names its row and its step, in that order.
TEST(EdgeValues, ScratchIndexOutOfRangeNamesRowThenStep) {
  auto c = verify();
  TensorView si = TensorView::contiguous(DType::i32, {3, 4});
  si.values = {{0, 1, 2, 3, 4, 5, 99, 7, 8, 9, 10, 11}};  // row 1, step 2
  c.scratch_indices = si;
  const Verdict v = validate(c);
  ASSERT_EQ(v.violations.size(), 1u) << describe(v);
  EXPECT_EQ(v.violations[0].rule, RuleId::index_range);
  EXPECT_EQ(v.violations[0].message, "scratch_indices[1, 2] = 99 is outside [-1, 16)");
}

// An ordered row that ends past the tokens, while cu_seqlens[N] is T_tot: the offsets come back
// down, so that is seqlens.monotone's alone, not seqlens.total's.
TEST(EdgeValues, OffsetsPastTheTokensBeforeADecreaseAreMonotoneOnly) {
  auto c = verify();
  c.cu_seqlens->values = {{0, 10, 11, 9}};
  const Verdict v = validate(c);
  EXPECT_EQ(fired_rules(v), std::set<RuleId>{RuleId::seqlens_monotone}) << describe(v);
}

// A decrease at the first offset is reported like any other, quoting offsets 0 and 1.
TEST(EdgeValues, DecreaseAtTheFirstOffset) {
  auto c = verify();
  c.cu_seqlens->values = {{0, -1, 6, 9}};
  const Verdict v = validate(c);
  ASSERT_EQ(v.violations.size(), 1u) << describe(v);
  EXPECT_EQ(v.violations[0].rule, RuleId::seqlens_monotone);
  EXPECT_EQ(v.violations[0].message,
            "cu_seqlens decreases: cu_seqlens[0] = 0 > cu_seqlens[1] = -1");
}

// A view whose extent fails is judged for nothing that needs its span: an output before its
// allocation whose rows also share addresses is arg.extent's alone.
TEST(EdgeValues, AnOutputOutsideItsAllocationIsNotJudgedForOverlap) {
  auto c = decode();
  c.out->storage_offset = Elements{-8};
  c.out->stride[0] = 0;
  const Verdict v = validate(c);
  ASSERT_EQ(v.violations.size(), 1u) << describe(v);
  EXPECT_EQ(v.violations[0].rule, RuleId::arg_extent);
  EXPECT_EQ(v.violations[0].argument, "out");
}

// The row function's mask (the device reports it as is): a row that begins below 0 under an
// ordered cu_seqlens is seqlens.start's, since cu_seqlens[0] is then below 0 too.
TEST(EdgeValues, RowBeginningBelowZeroMasksTheStart) {
  const std::vector<std::int64_t> cu = {-3, -1, 2};
  const row_rules::HostIndex index{cu.data(), 0, true};
  const row_rules::VerifyRows<row_rules::HostIndex> rows{2, 2, 4, 0, 0, index, {}, {}, {}};
  EXPECT_EQ(row_rules::row_faults(rows, 0), row_rules::bit(RuleId::seqlens_start));
  EXPECT_EQ(row_rules::row_faults(rows, 1), row_rules::bit(RuleId::seqlens_start));
}

// An empty output has no bytes, wherever it is placed: one whose address lies inside the state
// pool's bytes overlaps nothing, while the same placement of rows that do have bytes is
// alias.overlap.
TEST(EdgeValues, AnEmptyOutputInsideThePoolOverlapsNothing) {
  for (const std::int64_t rows : {4, 0}) {
    Shape s;
    s.rows = rows;
    auto c = decode(s);
    if (rows == 0) c.cache_indices = index_view({});
    c.state->address = 0x100000;
    c.out->address = 0x100000 + 256;
    const Verdict v = validate(c);
    const auto expected = rows == 0 ? std::set<RuleId>{} : std::set<RuleId>{RuleId::alias_overlap};
    EXPECT_EQ(fired_rules(v), expected) << "rows " << rows << ":\n" << describe(v);
  }
}

// scratch_indices' shape message quotes a dimension the call does not define as -1, never as a
// size it could have: N unknown without cu_seqlens, T unknown without draft_token_num.
TEST(EdgeValues, ScratchIndicesShapeQuotesAnUnknownDimensionAsMinusOne) {
  auto without_n = verify();
  without_n.cu_seqlens.reset();
  without_n.scratch_row_map.reset();
  without_n.scratch_indices = TensorView::contiguous(DType::i32, {3, 5});
  auto without_t = verify();
  without_t.scalars.draft_token_num.reset();
  without_t.scratch_row_map.reset();
  without_t.scratch_indices = TensorView::contiguous(DType::i32, {4, 4});
  for (const auto& [call, expected] :
       {std::pair{without_n, "scratch_indices must be [N, T] = [-1, 4]; got shape (3, 5)"},
        std::pair{without_t, "scratch_indices must be [N, T] = [3, -1]; got shape (4, 4)"}}) {
    const Verdict v = validate(call);
    std::vector<std::string> messages;
    for (const Violation& x : v.violations)
      if (x.rule == RuleId::verify_scratch_indices) messages.push_back(x.message);
    EXPECT_EQ(messages, std::vector<std::string>{expected}) << describe(v);
  }
}

// A gate that covers too few tokens is still judged for its other dims: a short a whose K is
// wrong breaks gate.cover_tokens and arg.shape, each quoting its own dim.
TEST(EdgeValues, AShortGateIsJudgedForItsOtherDims) {
  auto c = decode();
  c.a = view(DType::bf16, {3, 4, 32});
  const Verdict v = validate(c);
  EXPECT_EQ(fired_rules(v), (std::set<RuleId>{RuleId::gate_cover_tokens, RuleId::arg_shape}))
      << describe(v);
  EXPECT_EQ(arguments_of(v), std::set<std::string>{"a"}) << describe(v);
}

// T_tot = 0 is a token count like any other: the last offset of rows that also decrease is judged
// against it (seqlens.total beside seqlens.monotone), and one token later the same offsets end
// at T_tot (seqlens.monotone alone).
TEST(EdgeValues, TheLastOffsetIsJudgedAgainstNoTokens) {
  for (const std::int64_t tokens : {0, 1}) {
    auto c = prefill();
    Shape s;
    s.rows = tokens;
    s.V = 128;
    fill_token_inputs(c, s);
    c.cu_seqlens = index_view({0, 2, 1});
    c.initial_state_indices = index_view({2, 0});
    const Verdict v = validate(c);
    const auto expected =
        tokens == 0 ? std::set<RuleId>{RuleId::seqlens_monotone, RuleId::seqlens_total}
                    : std::set<RuleId>{RuleId::seqlens_monotone};
    EXPECT_EQ(fired_rules(v), expected) << "T_tot " << tokens << ":\n" << describe(v);
  }
}

// A view whose end (one past its last byte) is 2^64 - 1 still ends at a 64-bit address: it is not
// arg.extent's, only misaligned (an odd address); one byte higher its end is 2^64, arg.extent.
TEST(EdgeValues, AViewEndingOneByteBelow2To64IsInsideTheAddressSpace) {
  auto c = decode();
  const auto bytes = static_cast<std::uint64_t>(c.q->numel() * element_size(c.q->dtype));
  c.q->address = ~std::uint64_t{0} - bytes;  // end 2^64 - 1
  const Verdict below = validate(c);
  EXPECT_EQ(fired_rules(below), std::set<RuleId>{RuleId::arg_alignment}) << describe(below);
  c.q->address += 1;  // end 2^64
  const Verdict at = validate(c);
  EXPECT_EQ(fired_rules(at), std::set<RuleId>{RuleId::arg_extent}) << describe(at);
}

// An empty output maps no element to any address, whatever its other strides: heads sharing
// addresses (stride 0) in an output of no rows are no arg.stride.
TEST(EdgeValues, AnEmptyOutputSharesNoAddresses) {
  Shape s;
  s.rows = 0;
  auto c = decode(s);
  c.cache_indices = index_view({});
  c.out->stride[1] = 0;
  EXPECT_TRUE(validate(c).accepted()) << describe(validate(c));
}

// A view of too high a rank defines no dimension: q of rank 4 with 5 rows is arg.rank on q alone,
// no other argument is compared against its 5 rows.
TEST(EdgeValues, AViewOfTooHighARankDefinesNoDimension) {
  auto c = decode();
  c.q = view(DType::bf16, {5, 2, 64, 1});
  const Verdict v = validate(c);
  EXPECT_EQ(fired_rules(v), std::set<RuleId>{RuleId::arg_rank}) << describe(v);
  EXPECT_EQ(arguments_of(v), std::set<std::string>{"q"}) << describe(v);
}

// A pool whose V*K has no 64-bit form (2^32 * 2^32): its inner strides cannot be compact and its
// slot stride is smaller than a slot, which is what the true products say; the messages quote
// the saturated product, 9223372036854775807, for V*K and HV*V*K. A wrapped product (0 here)
// would match the strides (0, 2^32, 1) and a slot stride of 16, and pass both rules.
TEST(EdgeValues, APoolWhoseSlotHasNo64BitSizeFailsItsLayoutRules) {
  auto c = decode();
  const std::int64_t huge = std::int64_t{1} << 32;
  c.state->shape = {8, 1, huge, huge};
  c.state->stride = {16, 0, huge, 1};
  const Verdict v = validate(c);
  EXPECT_TRUE(v.breaks(RuleId::arg_extent)) << describe(v);
  const auto message_of = [&](RuleId rule) {
    for (const Violation& x : v.violations)
      if (x.rule == rule) return x.message;
    return std::string();
  };
  EXPECT_NE(message_of(RuleId::state_inner_strides).find("(V*K, K, 1)=(9223372036854775807, 4294967296, 1)"),
            std::string::npos)
      << describe(v);
  EXPECT_NE(message_of(RuleId::state_slot_stride_min).find("slot stride 16 is smaller than a slot, HV*V*K = 9223372036854775807"),
            std::string::npos)
      << describe(v);
}

}  // namespace
}  // namespace kdaguard
