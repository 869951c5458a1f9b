// The record-based speculative entry points (record_verify, replay_commit, accept_verify): their
// valid calls pass, and for every rule of theirs (the new ones and the verify/commit rules they
// share), the smallest change that breaks it alone is reported as exactly that rule, with a
// message that names the argument, the expected and the actual value.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kdaguard/contracts/validate.h"
#include "record_calls.h"

namespace kdaguard {
namespace {

using namespace examples;

std::set<RuleId> rules_of(const Verdict& v) {
  std::set<RuleId> rules;
  for (const Violation& x : v.violations) rules.insert(x.rule);
  return rules;
}

TEST(ValidRecordCalls, AreAccepted) {
  for (const CatalogueCall& call : {CatalogueCall(record_verify()), CatalogueCall(replay_commit()),
                                    CatalogueCall(accept_verify())}) {
    const Verdict v = validate(call);
    EXPECT_TRUE(v.accepted()) << entry_name(entry_of(call)) << ":\n" << describe(v);
    EXPECT_TRUE(v.deferred.empty()) << "host values were given, nothing should be deferred";
  }
}

TEST(ValidRecordCalls, ValueRulesAreDeferredWithoutHostValues) {
  AcceptVerifyCall c = accept_verify();
  c.cache_indices->values.reset();
  c.cu_seqlens->values.reset();
  c.prior_accepted->values.reset();
  const Verdict v = validate(c);
  EXPECT_TRUE(v.accepted()) << describe(v);
  std::set<std::pair<RuleId, std::string>> deferred;
  for (const DeferredCheck& d : v.deferred) deferred.insert({d.rule, std::string(d.argument)});
  EXPECT_TRUE(deferred.count({RuleId::accept_prior_accepted, "prior_accepted"}));
  EXPECT_TRUE(deferred.count({RuleId::verify_row_length, "cu_seqlens"}));
  EXPECT_TRUE(deferred.count({RuleId::index_unique, "cache_indices"}));
  EXPECT_FALSE(deferred.count({RuleId::verify_row_map_identity, "cache_indices"}))
      << "no scratch, no row map: nothing reads the map";

  ReplayCommitCall r = replay_commit();
  r.accepted->values.reset();
  const Verdict rv = validate(r);
  EXPECT_TRUE(rv.accepted()) << describe(rv);
  ASSERT_EQ(rv.deferred.size(), 1u);
  EXPECT_EQ(rv.deferred[0].rule, RuleId::commit_accepted);
}

struct Case {
  const char* name;
  std::function<CatalogueCall()> make;
  RuleId rule;
  std::string argument;
  std::vector<std::string> says;  // the message contains each
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"record_verify_without_records",
       [] { auto c = record_verify(); c.records.reset(); return CatalogueCall(c); },
       RuleId::arg_missing, "records", {"record_verify records is required"}},
      {"replay_commit_without_accepted",
       [] { auto c = replay_commit(); c.accepted.reset(); return CatalogueCall(c); },
       RuleId::arg_missing, "accepted", {"required"}},
      {"accept_verify_without_prior_records",
       [] { auto c = accept_verify(); c.prior_records.reset(); return CatalogueCall(c); },
       RuleId::arg_missing, "prior_records", {"required"}},
      {"record_verify_records_bf16",
       [] { auto c = record_verify(); c.records->dtype = DType::bf16; return CatalogueCall(c); },
       RuleId::arg_dtype, "records", {"bf16", "expected f32"}},
      {"replay_commit_records_rank_5",
       [] {
         auto c = replay_commit();
         c.records = TensorView::contiguous(DType::f32, {4, 4, 1, 4, 192});
         return CatalogueCall(c);
       },
       RuleId::arg_rank, "records", {"4 dimensions", "got 5"}},
      {"record_verify_records_width_2K",
       [] {
         auto c = record_verify();
         c.records = TensorView::contiguous(DType::f32, {4, 4, 4, 128});
         return CatalogueCall(c);
       },
       RuleId::arg_shape, "records", {"2K+V = 192", "got 128"}},
      {"accept_verify_prior_records_wrong_heads",
       [] {
         auto c = accept_verify();
         c.prior_records = TensorView::contiguous(DType::f32, {3, 4, 2, 192});
         return CatalogueCall(c);
       },
       RuleId::arg_shape, "prior_records", {"HV = 4", "got 2"}},
      {"record_verify_records_last_stride_2",
       [] {
         auto c = record_verify();
         c.records->stride = {4 * 4 * 384, 4 * 384, 384, 2};
         return CatalogueCall(c);
       },
       RuleId::arg_last_dim_contiguous, "records", {"last stride is 2"}},
      {"record_verify_records_steps_share_memory",
       [] { auto c = record_verify(); c.records->stride[1] = 0; return CatalogueCall(c); },
       RuleId::arg_stride, "records", {"maps two elements to one address"}},
      {"replay_commit_records_offset_4_bytes",
       [] { auto c = replay_commit(); c.records->storage_offset = Elements{1}; return CatalogueCall(c); },
       RuleId::arg_alignment, "records", {"not 16-byte aligned"}},
      {"record_verify_records_over_state",
       [] {
         auto c = record_verify();
         c.state->address = 0x100000;
         c.records->address = 0x100000;
         return CatalogueCall(c);
       },
       RuleId::alias_overlap, "records", {"output records", "overlap state"}},
      {"accept_verify_records_are_prior_records",
       [] {
         auto c = accept_verify();
         c.prior_records = c.records;
         c.prior_records->shape[0] = 3;
         c.prior_records->address = 0x100000;
         c.records->address = 0x100000;
         return CatalogueCall(c);
       },
       RuleId::alias_overlap, "records", {"output records", "overlap prior_records"}},
      {"replay_commit_state_transposed",
       [] {
         auto c = replay_commit();
         std::swap(c.state->stride[2], c.state->stride[3]);
         return CatalogueCall(c);
       },
       RuleId::state_inner_strides, "state", {"(V*K, K, 1)"}},
      {"record_verify_records_three_steps",
       [] { auto c = record_verify(); c.records->shape[1] = 3; return CatalogueCall(c); },
       RuleId::records_steps, "records", {"records holds 3 steps", "T = 4"}},
      {"replay_commit_records_three_steps",
       [] {
         auto c = replay_commit();
         c.records->shape[1] = 3;
         c.accepted = index_view({2, 0, 3});
         c.cu_seqlens = index_view({0, 3, 5, 8});
         return CatalogueCall(c);
       },
       RuleId::records_steps, "records", {"records holds 3 steps"}},
      {"record_verify_records_two_rows",
       [] { auto c = record_verify(); c.records->shape[0] = 2; return CatalogueCall(c); },
       RuleId::records_rows, "records", {"records has 2 rows", "N = 3"}},
      {"accept_verify_prior_records_two_rows",
       [] { auto c = accept_verify(); c.prior_records->shape[0] = 2; return CatalogueCall(c); },
       RuleId::records_rows, "prior_records", {"prior_records has 2 rows", "N = 3"}},
      {"accept_verify_prior_accepted_past_prior_steps",
       [] { auto c = accept_verify(); c.prior_accepted = index_view({1, 0, 5}); return CatalogueCall(c); },
       RuleId::accept_prior_accepted, "prior_accepted",
       {"prior_accepted[2] = 5", "[0, T_alloc of prior_records = 4]"}},
      {"accept_verify_prior_accepted_negative",
       [] { auto c = accept_verify(); c.prior_accepted = index_view({-1, 0, 1}); return CatalogueCall(c); },
       RuleId::accept_prior_accepted, "prior_accepted", {"prior_accepted[0] = -1"}},
      {"replay_commit_accepts_five_of_four",
       [] { auto c = replay_commit(); c.accepted = index_view({5, 0, 3}); return CatalogueCall(c); },
       RuleId::commit_accepted, "accepted", {"accepted[0] = 5", "[0, T = 4]"}},
      {"replay_commit_accepts_past_row_length",
       [] { auto c = replay_commit(); c.accepted = index_view({2, 0, 4}); return CatalogueCall(c); },
       RuleId::commit_accepted, "accepted", {"accepted[2] = 4 is past row 2's length 3"}},
      {"record_verify_row_of_five",
       [] {
         auto c = record_verify();
         c.cu_seqlens = index_view({0, 5, 6, 9});
         return CatalogueCall(c);
       },
       RuleId::verify_row_length, "cu_seqlens", {"holds 5 tokens", "at most T = 4"}},
      {"accept_verify_cu_seqlens_total_short",
       [] { auto c = accept_verify(); c.cu_seqlens = index_view({0, 4, 6, 8}); return CatalogueCall(c); },
       RuleId::seqlens_total, "cu_seqlens", {"T_tot = 9", "got 8"}},
      {"replay_commit_cu_seqlens_start_1",
       [] { auto c = replay_commit(); c.cu_seqlens = index_view({1, 4, 6, 9}); return CatalogueCall(c); },
       RuleId::seqlens_start, "cu_seqlens", {"got 1"}},
      {"replay_commit_two_rows_one_slot",
       [] { auto c = replay_commit(); c.cache_indices = index_view({5, -1, 5}); return CatalogueCall(c); },
       RuleId::index_unique, "cache_indices", {"cache_indices[2] = 5"}},
      {"accept_verify_slot_past_pool",
       [] { auto c = accept_verify(); c.cache_indices = index_view({1, -1, 6}); return CatalogueCall(c); },
       RuleId::index_range, "cache_indices", {"cache_indices[2] = 6", "[-1, 6)"}},
      {"replay_commit_without_draft_tokens",
       [] {
         auto c = replay_commit();
         c.scalars.draft_token_num.reset();
         return CatalogueCall(c);
       },
       RuleId::verify_draft_tokens, "draft_token_num", {"required"}},
      {"record_verify_with_a_and_g",
       [] { auto c = record_verify(); c.g = view(DType::f32, {9, 4, 64}); return CatalogueCall(c); },
       RuleId::arg_exclusive, "g", {"not both"}},
  };
  return all;
}

class RecordRule : public ::testing::TestWithParam<Case> {};

TEST_P(RecordRule, BreaksExactlyThatRuleAndSaysSo) {
  const Case& c = GetParam();
  const Verdict v = validate(c.make());
  EXPECT_EQ(rules_of(v), std::set<RuleId>{c.rule}) << describe(v);
  bool said = false;
  for (const Violation& x : v.violations) {
    if (x.rule != c.rule || x.argument != c.argument) continue;
    bool all = true;
    for (const std::string& text : c.says) all = all && x.message.find(text) != std::string::npos;
    said = said || all;
  }
  EXPECT_TRUE(said) << "no " << rule_id(c.rule) << " on " << c.argument << " says all of the "
                    << "expected texts; verdict:\n" << describe(v);
}

INSTANTIATE_TEST_SUITE_P(Records, RecordRule, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// The rules of the record-based entry points alone (validate_rules_test.cpp covers the others):
// each has a case here.
TEST(RecordRule, EveryRecordOnlyRuleHasACase) {
  using namespace entry_masks;
  std::set<RuleId> covered;
  for (const Case& c : cases()) covered.insert(c.rule);
  for (const RuleInfo& r : rule_catalogue()) {
    if ((r.entry_mask & kDPVC) == 0) {
      EXPECT_TRUE(covered.count(r.rule)) << r.id;
    }
  }
}

// Without a row count (q of the wrong rank) the value rules have no T_tot to judge cu_seqlens
// against: the verdict is q's rank alone, not also the offsets' total against some row count.
TEST(RecordRules, NoRowCountDefersTheRowRules) {
  auto rv = record_verify();
  rv.q = view(DType::bf16, {9, 128});
  const Verdict v = validate(rv);
  EXPECT_EQ(rules_of(v), std::set<RuleId>{RuleId::arg_rank}) << describe(v);
  auto av = accept_verify();
  av.q = view(DType::bf16, {9, 128});
  const Verdict w = validate(av);
  EXPECT_EQ(rules_of(w), std::set<RuleId>{RuleId::arg_rank}) << describe(w);
}

// The inputs an output's alias.overlap violations name ("output X bytes [..) overlap Y bytes
// [..)"), in the verdict's order; each must be reported on `output`.
std::vector<std::string> overlapped_inputs(const Verdict& v, std::string_view output) {
  std::vector<std::string> names;
  for (const Violation& x : v.violations) {
    if (x.rule != RuleId::alias_overlap) continue;
    EXPECT_EQ(x.argument, output) << describe(v);
    const std::size_t from = x.message.find(" overlap ");
    const std::size_t to = x.message.find(" bytes ", from + 1);
    if (from == std::string::npos || to == std::string::npos) {
      ADD_FAILURE() << "alias.overlap message names no input: " << x.message;
      continue;
    }
    names.push_back(x.message.substr(from + 9, to - from - 9));
  }
  return names;
}

// An output laid over several inputs gets one alias.overlap for each, on the output, naming the
// inputs in argument order: out over q, k, v, both gate forms, A_log, dt_bias and both beta forms
// on every entry point with token inputs, the scratch over both index maps on verify and commit.
// A verdict lists one rule on one argument in the same order whatever the entry point.
TEST(Aliasing, AnOutputOverSeveralInputsNamesThemInArgumentOrder) {
  constexpr std::uint64_t kAt = std::uint64_t{1} << 20;
  auto over_token_inputs = [&](auto c) {
    c.g = c.a;  // both forms of the gate and of beta (arg.exclusive too): two more inputs
    c.beta = c.b;
    for (auto* t : {&c.q, &c.k, &c.v, &c.a, &c.g, &c.A_log, &c.dt_bias, &c.b, &c.beta, &c.out})
      (*t)->address = kAt;
    return CatalogueCall(c);
  };
  const std::vector<std::string> token_inputs = {"q", "k",  "v",       "a",   "g",
                                                 "A_log", "dt_bias", "b", "beta"};
  for (const CatalogueCall& call :
       {over_token_inputs(decode()), over_token_inputs(prefill()), over_token_inputs(verify()),
        over_token_inputs(record_verify()), over_token_inputs(accept_verify())}) {
    const Verdict v = validate(call);
    EXPECT_EQ(overlapped_inputs(v, "out"), token_inputs)
        << entry_name(entry_of(call)) << ":\n" << describe(v);
  }
  auto over_index_maps = [&](auto c) {
    c.scratch_indices = view(DType::i32, {3, 4});  // no host values: its value rules are deferred
    for (auto* t : {&c.scratch, &c.scratch_row_map, &c.scratch_indices}) (*t)->address = kAt;
    return CatalogueCall(c);
  };
  for (const CatalogueCall& call : {over_index_maps(verify()), over_index_maps(commit())}) {
    const Verdict v = validate(call);
    EXPECT_EQ(overlapped_inputs(v, "scratch"),
              (std::vector<std::string>{"scratch_row_map", "scratch_indices"}))
        << entry_name(entry_of(call)) << ":\n" << describe(v);
  }
}

}  // namespace
}  // namespace kdaguard
