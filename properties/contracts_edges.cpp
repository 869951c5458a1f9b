// Layouts and values one step past the edge of what a rule allows, drawn over generated valid
// calls: the rule fires alone, on the right argument, with a message that shows the expected and
// the actual value. The random edits of the soundness property rarely land exactly here (a
// scratch row stride one vector short, a base 16 but not 32 bytes aligned, a repeated scratch
// index), and mutation testing of the validators showed checks weakened at these edges going
// unnoticed.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "gen_calls.h"
#include "kdaguard/contracts/validate.h"

namespace kdaguard::support {
namespace {

TensorView& view(GeneratedCall& g, Arg a) { return **find_argument(g.call, a); }
bool has(const GeneratedCall& g, Arg a) {
  const OptionalView* v = find_argument(g.call, a);
  return v != nullptr && v->has_value();
}
Arg pool_arg(const GeneratedCall& g) {
  return entry_of(g.call) == Entry::prefill ? Arg::initial_state : Arg::state;
}

// The verdict holds exactly one violation, of `rule` on `argument`, whose message contains every
// text in `texts`.
void assert_only(const GeneratedCall& g, RuleId rule, std::string_view argument,
                 const std::vector<std::string>& texts) {
  const Verdict v = validate(g.call);
  const auto context = [&] { return fmt::format("{}\n{}", describe(v), describe_call(g.call)); };
  if (v.violations.size() != 1 || v.violations[0].rule != rule ||
      v.violations[0].argument != argument)
    RC_FAIL(fmt::format("expected {} on {} alone; got:\n{}", rule_id(rule), argument, context()));
  for (const std::string& text : texts)
    if (v.violations[0].message.find(text) == std::string::npos)
      RC_FAIL(fmt::format("the message lacks \"{}\":\n{}", text, context()));
}

// A storage offset before the allocation's start, on any argument. A pool's base byte offset is
// then negative too: state.base_align sees it unless it is a multiple of 32 bytes, also for
// offsets near INT64_MIN, whose byte offset is past 64 bits (its residue modulo 32 is still exact).
RC_GTEST_PROP(ContractsEdges, NegativeStorageOffsetIsOutsideTheAllocation, ()) {
  auto g = *gen_any_call();
  std::vector<Arg> candidates;
  for (int i = 0; i < kArgCount; ++i)
    if (has(g, static_cast<Arg>(i))) candidates.push_back(static_cast<Arg>(i));
  RC_PRE(!candidates.empty());
  const Arg a = *rc::gen::elementOf(candidates);
  TensorView& t = view(g, a);
  const std::int64_t esize = element_size(t.dtype);
  const bool pool = a == Arg::state || a == Arg::initial_state || a == Arg::scratch;
  const bool near_min = *rc::gen::arbitrary<bool>();
  std::string base_text;  // the base byte offset as state.base_align's message gives it
  std::int64_t misaligned_bytes = 0;  // the base byte offset's distance past a multiple of 32
  if (near_min) {
    const std::int64_t k = *rc::gen::inRange<std::int64_t>(0, 161);
    t.storage_offset.count = std::numeric_limits<std::int64_t>::min() + k;
    misaligned_bytes = k * esize % 32;
    base_text = fmt::format("base byte offset {} x {} (past 64 bits", t.storage_offset.count, esize);
  } else {
    // Whole 16-byte vectors, so the data address keeps its alignment.
    t.storage_offset.count = -*rc::gen::inRange<std::int64_t>(1, 5) * (16 / esize);
    misaligned_bytes = t.storage_offset.count * esize % 32;
    base_text = fmt::format("base byte offset {}", t.storage_offset.count * esize);
  }
  if (!pool || misaligned_bytes == 0) {
    assert_only(g, RuleId::arg_extent, arg_name(a),
                {std::string(arg_name(a)), fmt::format("storage_offset {}", t.storage_offset.count)});
    return;
  }
  const Verdict v = validate(g.call);
  RC_ASSERT(v.violations.size() == 2u);
  RC_ASSERT(v.violations[0].rule == RuleId::arg_extent);
  RC_ASSERT(v.violations[1].rule == RuleId::state_base_align);
  RC_ASSERT(v.violations[1].message.find(base_text) != std::string::npos);
}

// Scratch rows that do not flatten into steps: stride[0] below T_alloc * stride[1] (rows overlap,
// down to 0) or above it.
RC_GTEST_PROP(ContractsEdges, ScratchRowStrideOffTheFlatLayout, ()) {
  const Entry e = *gen_entry(0b1100);
  auto g = *gen_call(e, PlanNeeds{.min_scratch_rows = 2});
  TensorView& s = view(g, Arg::scratch);
  RC_PRE(s.shape[0] >= 2);
  const std::int64_t flat = s.shape[1] * s.stride[1];
  const std::int64_t step = *rc::gen::inRange<std::int64_t>(1, flat / 16 + 1);
  s.stride[0] = *rc::gen::arbitrary<bool>() ? std::max<std::int64_t>(flat - 16 * step, 0)
                                           : flat + 16 * step;
  // A longer row stride spans more than the allocation drawn for the valid call: give the scratch
  // an allocation of its own, of unknown size, at a fresh address.
  s.address = kFakeAddressBase + kFakeAddressPitch * 4096;
  s.storage_size.reset();
  assert_only(g, RuleId::verify_scratch_layout, "scratch",
              {fmt::format("= {}", flat), fmt::format("got {}", s.stride[0])});
}

// Output heads laid over each other with positive strides: a head stride smaller than V.
RC_GTEST_PROP(ContractsEdges, OutputHeadsOverlapWithPositiveStrides, ()) {
  const Entry e = *gen_entry(0b0111);
  auto g = *gen_call(e, PlanNeeds{.min_tokens = 1, .min_heads_ratio = 2});
  TensorView& out = view(g, Arg::out);
  RC_PRE(out.shape[0] >= 1 && out.shape[1] >= 2);
  const std::int64_t unit = 16 / element_size(out.dtype);  // keeps the 16-byte stride alignment
  out.stride[1] = unit * *rc::gen::inRange<std::int64_t>(0, out.shape[2] / unit);
  assert_only(g, RuleId::arg_stride, "out",
              {"maps two elements to one address", fmt::format("{}, 1)", out.stride[1])});
}

// Output token rows laid over each other in their last head: the row stride a multiple of 16
// bytes between (HV - 1) heads and HV heads, so row n + 1's first head begins inside row n's last
// one. Only the sum of every smaller dim's reach ((shape - 1) * stride each) sees it.
RC_GTEST_PROP(ContractsEdges, OutputRowsOverlapInTheirLastHead, ()) {
  const Entry e = *gen_entry(0b0111);
  auto g = *gen_call(e, PlanNeeds{.min_tokens = 2, .min_heads_ratio = 2});
  TensorView& out = view(g, Arg::out);
  RC_PRE(out.shape[0] >= 2 && out.shape[1] >= 2);
  const std::int64_t unit = 16 / element_size(out.dtype);  // keeps the 16-byte stride alignment
  out.stride[0] = (out.shape[1] - 1) * out.stride[1] +
                  unit * *rc::gen::inRange<std::int64_t>(0, out.shape[2] / unit);
  assert_only(g, RuleId::arg_stride, "out",
              {"maps two elements to one address", fmt::format("strides ({}, ", out.stride[0])});
}

// One inner stride of the pool wrong, the others compact: each on its own is the rule.
RC_GTEST_PROP(ContractsEdges, OneWrongInnerStrideOfThePool, ()) {
  auto g = *gen_any_call();
  const Arg a = pool_arg(g);
  TensorView& p = view(g, a);
  const std::int64_t V = p.shape[2], K = p.shape[3];
  const int dim = *rc::gen::inRange(1, 4);
  // Smaller than compact, so the pool spans no more memory than the valid one.
  const std::int64_t wrong = dim == 1 ? V * K - 16 : dim == 2 ? K - 16 : 0;
  p.stride[dim] = wrong;
  std::vector<std::string> texts = {
      fmt::format("(V*K, K, 1)=({}, {}, 1)", V * K, K),
      fmt::format("got ({}, {}, {})", p.stride[1], p.stride[2], p.stride[3]),
      std::string(arg_name(a))};
  const std::string last_dim = fmt::format("`{}` must be contiguous in the last dim.", arg_name(a));
  if (dim == 3) texts.push_back(last_dim);
  assert_only(g, RuleId::state_inner_strides, arg_name(a), texts);
  // The upstream last-dim text only where the last stride is the wrong one.
  if (dim != 3) RC_ASSERT(validate(g.call).violations[0].message.find(last_dim) == std::string::npos);
}

// A pool base 16 but not 32 bytes aligned: through the storage offset, or through the address.
RC_GTEST_PROP(ContractsEdges, PoolBaseSixteenButNotThirtyTwoAligned, ()) {
  auto g = *gen_any_call();
  const Arg a = pool_arg(g);
  TensorView& p = view(g, a);
  const std::int64_t esize = element_size(p.dtype);
  const bool through_offset = *rc::gen::arbitrary<bool>();
  // An allocation of its own at a fresh 32-byte aligned address, so nothing else can overlap it.
  p.address = kFakeAddressBase + kFakeAddressPitch * 4096;
  p.storage_size.reset();
  if (through_offset) p.storage_offset.count += 16 / esize;
  else p.address += 16;
  const std::uint64_t data = p.address + static_cast<std::uint64_t>(p.storage_offset.count * esize);
  assert_only(g, RuleId::state_base_align, arg_name(a),
              {fmt::format("base byte offset {}", p.storage_offset.count * esize),
               fmt::format("{:#x}", data), "multiple of 32"});
}

// The scratch laid over the state pool: an output overlapping another argument.
RC_GTEST_PROP(ContractsEdges, ScratchOverTheState, ()) {
  const Entry e = *gen_entry(0b1100);
  auto g = *gen_call(e);
  TensorView& state = view(g, Arg::state);
  TensorView& scratch = view(g, Arg::scratch);
  RC_PRE(state.numel() > 0 && scratch.numel() > 0);
  state.address = scratch.address = kFakeAddressBase + kFakeAddressPitch * 4096;
  state.storage_offset.count = scratch.storage_offset.count = 0;  // both from the same byte
  state.storage_size.reset();
  scratch.storage_size.reset();
  // Commit writes both: a pair of outputs is reported once, on the first in argument order.
  assert_only(g, RuleId::alias_overlap, e == Entry::commit ? "state" : "scratch",
              {"output", "state", "scratch"});
}

// A view of rank 0 is reported for its rank and still for what else is wrong with it: a storage
// offset before its allocation.
RC_GTEST_PROP(ContractsEdges, RankZeroViewIsCheckedForItsExtentToo, ()) {
  auto g = *gen_any_call();
  std::vector<Arg> candidates;
  for (int i = 0; i < kArgCount; ++i)
    if (has(g, static_cast<Arg>(i))) candidates.push_back(static_cast<Arg>(i));
  const Arg a = *rc::gen::elementOf(candidates);
  TensorView& t = view(g, a);
  t.rank = 0;
  t.values.reset();
  t.storage_offset.count = -*rc::gen::inRange<std::int64_t>(1, 64);
  const Verdict v = validate(g.call);
  const auto context = [&] { return fmt::format("{}\n{}", describe(v), describe_call(g.call)); };
  if (v.violations.size() != 2u)
    RC_FAIL(fmt::format("expected a rank rule and arg.extent on {}:\n{}", arg_name(a), context()));
  for (const Violation& x : v.violations)
    if (x.argument != arg_name(a)) RC_FAIL(fmt::format("a violation on another argument:\n{}", context()));
  const auto extent = std::find_if(v.violations.begin(), v.violations.end(),
                                   [](const Violation& x) { return x.rule == RuleId::arg_extent; });
  if (extent == v.violations.end() ||
      extent->message.find(fmt::format("storage_offset {}", t.storage_offset.count)) == std::string::npos)
    RC_FAIL(fmt::format("arg.extent missing or without the offset:\n{}", context()));
}

// Host copies of an index tensor's values with more (or fewer) values than it has elements.
RC_GTEST_PROP(ContractsEdges, HostValuesOfTheWrongCount, ()) {
  auto g = *gen_any_call(PlanNeeds{.index_values = true});
  std::vector<Arg> with_values;
  for (int i = 0; i < kArgCount; ++i) {
    const Arg a = static_cast<Arg>(i);
    // The row map's values are read only without scratch_indices.
    const bool read = a != Arg::scratch_row_map || !has(g, Arg::scratch_indices);
    if (has(g, a) && view(g, a).values && read) with_values.push_back(a);
  }
  RC_PRE(!with_values.empty());
  const Arg a = *rc::gen::elementOf(with_values);
  TensorView& t = view(g, a);
  std::vector<std::int64_t>& values = *t.values;
  if (values.empty() || *rc::gen::arbitrary<bool>()) {
    const auto extra = *rc::gen::inRange<std::size_t>(1, 4);
    values.insert(values.end(), extra, values.empty() ? 0 : values.back());
  } else {
    values.pop_back();
  }
  assert_only(g, RuleId::arg_shape, arg_name(a),
              {fmt::format("carries {} host values", values.size()),
               fmt::format("has {} elements", t.numel())});
}

// Explicit scratch indices that are not a permutation: one step written twice.
RC_GTEST_PROP(ContractsEdges, ScratchIndicesNamingOneStepTwice, ()) {
  const Entry e = *gen_entry(0b1100);
  auto g = *gen_call(e, PlanNeeds{.index_values = true, .explicit_scratch_indices = true});
  TensorView& t = view(g, Arg::scratch_indices);
  std::vector<std::int64_t>& values = *t.values;
  std::vector<std::size_t> written;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] >= 0) written.push_back(i);
  RC_PRE(written.size() >= 2);
  const auto first = *rc::gen::inRange<std::size_t>(0, written.size() - 1);
  const auto second = *rc::gen::inRange<std::size_t>(first + 1, written.size());
  values[written[second]] = values[written[first]];
  assert_only(g, RuleId::index_unique, "scratch_indices",
              {fmt::format("scratch_indices[{}] = {}", written[second], values[written[first]])});
}

// A slot map entry one or more past the pool: index.range names the entry, its value and the
// allowed range.
RC_GTEST_PROP(ContractsEdges, SlotPastThePool, ()) {
  auto g = *gen_any_call(PlanNeeds{.min_active_rows = 1, .index_values = true});
  const Entry e = entry_of(g.call);
  const Arg a = e == Entry::prefill ? Arg::initial_state_indices : Arg::cache_indices;
  const std::int64_t S = view(g, pool_arg(g)).shape[0];
  std::vector<std::int64_t>& values = *view(g, a).values;
  std::vector<std::size_t> active;
  for (std::size_t i = 0; i < values.size() && i < static_cast<std::size_t>(g.plan.rows()); ++i)
    if (values[i] >= 0) active.push_back(i);
  RC_PRE(!active.empty());
  const std::size_t i = *rc::gen::elementOf(active);
  values[i] = S + *rc::gen::inRange<std::int64_t>(0, 4);
  assert_only(g, RuleId::index_range, arg_name(a),
              {fmt::format("{}[{}] = {} is outside [{}, {})", arg_name(a), i, values[i],
                           e == Entry::prefill ? 0 : -1, S)});
}

// Offsets below 0 up to some row of verify or commit: every row that begins below 0 is
// attributed to seqlens.start, so none of them is judged for its length (verify.row_length), even
// the one that reaches past T from below 0. That row begins at -1 (the edge) or further down.
RC_GTEST_PROP(ContractsEdges, RowsBeginningBelowZeroAreTheStartAlone, ()) {
  const Entry e = *gen_entry(0b1100);
  // At least 4 tokens or every row full: T_tot >= T (T is at most 4), so some offset is >= T.
  auto g = *gen_call(e, PlanNeeds{.min_rows = 2, .min_tokens = 4, .cu_seqlens = true,
                                  .index_values = true});
  std::vector<std::int64_t>& cu = *view(g, Arg::cu_seqlens).values;
  const std::int64_t T = g.plan.T;
  std::vector<std::size_t> past_T;  // offsets a row beginning at -1 reaches past T with
  for (std::size_t i = 1; i < cu.size(); ++i)
    if (cu[i] >= T) past_T.push_back(i);
  RC_ASSERT(!past_T.empty());
  const std::size_t below = *rc::gen::elementOf(past_T);  // cu[0..below) < 0
  // Row below - 1 holds more than T tokens, from -1 or from further down.
  cu[below - 1] = *rc::gen::arbitrary<bool>() ? -1 : -T - 1 - *rc::gen::inRange<std::int64_t>(0, 3);
  for (std::size_t i = below - 1; i-- > 0;) cu[i] = cu[i + 1] - *rc::gen::inRange<std::int64_t>(0, 3);
  if (e == Entry::commit)
    for (std::int64_t& accepted : *view(g, Arg::accepted).values) accepted = 0;
  assert_only(g, RuleId::seqlens_start, "cu_seqlens", {fmt::format("got {}", cu[0])});
}

// A decrease of cu_seqlens in verify or commit: the rows on both sides of the broken offsets are
// seqlens.monotone's alone, even the one after it that now holds more than T tokens.
RC_GTEST_PROP(ContractsEdges, RowsBesideADecreaseAreMonotoneOnly, ()) {
  const Entry e = *gen_entry(0b1100);
  auto g = *gen_call(e, PlanNeeds{.min_rows = 3, .cu_seqlens = true, .index_values = true});
  std::vector<std::int64_t>& cu = *view(g, Arg::cu_seqlens).values;
  const auto i = *rc::gen::inRange<std::size_t>(1, cu.size() - 2);  // cu[i] > cu[i + 1]; cu[N] kept
  cu[i + 1] = cu[i + 2] - g.plan.T - 1;  // row i + 1 holds T + 1 tokens
  cu[i] = cu[i + 1] + *rc::gen::inRange<std::int64_t>(1, 4);
  assert_only(g, RuleId::seqlens_monotone, "cu_seqlens", {"cu_seqlens decreases"});
}

// The end of a view (one past its last byte) must be a 64-bit address: a view ending 16 bytes
// below 2^64 is accepted, one ending at 2^64 reaches past 64-bit arithmetic.
RC_GTEST_PROP(ContractsEdges, ViewAtTheTopOfTheAddressSpace, ()) {
  auto g = *gen_call(*gen_entry(0b0111), PlanNeeds{.min_tokens = 1});
  TensorView& q = view(g, Arg::q);
  q.storage_offset.count = 0;
  q.storage_size.reset();
  std::int64_t step = 1;  // compact: the bytes of q are numel * element size, a multiple of 16
  for (int d = q.rank - 1; d >= 0; --d) {
    q.stride[d] = step;
    step *= q.shape[d];
  }
  const auto bytes = static_cast<std::uint64_t>(q.numel() * element_size(q.dtype));
  const bool past = *rc::gen::arbitrary<bool>();
  q.address = (past ? 0 : ~std::uint64_t{15}) - bytes;  // modulo 2^64: the end is 2^64 or 2^64 - 16
  if (!past) {
    const Verdict v = validate(g.call);
    if (!v.accepted()) RC_FAIL(fmt::format("refused:\n{}\n{}", describe(v), describe_call(g.call)));
    return;
  }
  assert_only(g, RuleId::arg_extent, "q", {"q reaches past 64-bit arithmetic"});
}

// Two rows naming the same slot past the pool: index.range for each, and no index.unique (an
// entry outside the pool takes no part in uniqueness).
RC_GTEST_PROP(ContractsEdges, TwoRowsPastThePoolAtTheSameSlot, ()) {
  auto g = *gen_any_call(PlanNeeds{.min_active_rows = 2, .index_values = true});
  const Arg a = entry_of(g.call) == Entry::prefill ? Arg::initial_state_indices : Arg::cache_indices;
  const std::int64_t S = view(g, pool_arg(g)).shape[0];
  std::vector<std::int64_t>& values = *view(g, a).values;
  std::vector<std::size_t> active;
  for (std::size_t i = 0; i < values.size() && i < static_cast<std::size_t>(g.plan.rows()); ++i)
    if (values[i] >= 0) active.push_back(i);
  RC_PRE(active.size() >= 2u);
  const std::int64_t slot = S + *rc::gen::inRange<std::int64_t>(0, 2);
  values[active[0]] = values[active[1]] = slot;
  const Verdict v = validate(g.call);
  RC_ASSERT(v.violations.size() == 2u);
  for (std::size_t k = 0; k < 2; ++k) {
    RC_ASSERT(v.violations[k].rule == RuleId::index_range);
    RC_ASSERT(v.violations[k].message.find(fmt::format("[{}] = {}", active[k], slot)) != std::string::npos);
  }
}

// A first offset below 0 (prefill: rows have no length limit, so nothing else breaks).
RC_GTEST_PROP(ContractsEdges, CuSeqlensStartingBelowZero, ()) {
  auto g = *gen_call(Entry::prefill, PlanNeeds{.min_rows = 1, .index_values = true});
  std::vector<std::int64_t>& cu = *view(g, Arg::cu_seqlens).values;
  cu[0] = -*rc::gen::inRange<std::int64_t>(1, 100);
  assert_only(g, RuleId::seqlens_start, "cu_seqlens", {fmt::format("got {}", cu[0])});
}

// Two faults in one argument: rows short of q and a wrong width. Both are reported.
RC_GTEST_PROP(ContractsEdges, GateRowsShortAndWidthWrong, ()) {
  const Entry e = *gen_entry(0b0111);
  auto g = *gen_call(e, PlanNeeds{.min_tokens = 1});
  const Arg a = has(g, Arg::a) ? Arg::a : Arg::g;
  TensorView& t = view(g, a);
  const std::int64_t rows = view(g, Arg::q).shape[0];
  const std::int64_t K = t.shape[2];
  t.shape[0] = rows - 1;
  t.shape[2] = K == 64 ? 128 : 64;
  t.storage_size.reset();
  t.address = kFakeAddressBase + kFakeAddressPitch * 4096;
  const Verdict v = validate(g.call);
  RC_ASSERT(v.violations.size() == 2u);
  RC_ASSERT(v.violations[0].rule == RuleId::arg_shape);
  RC_ASSERT(v.violations[0].message.find(fmt::format("dim 2 must be K = {}; got {}", K, t.shape[2])) !=
            std::string::npos);
  RC_ASSERT(v.violations[1].rule == RuleId::gate_cover_tokens);
}

// A decode of INT64_MAX rows: cu_seqlens must have B + 1 entries, which saturates instead of
// wrapping (and q itself reaches past 64-bit arithmetic).
RC_GTEST_PROP(ContractsEdges, DecodeRowCountAtTheLimit, ()) {
  auto g = *gen_call(Entry::decode, PlanNeeds{.cu_seqlens = true});
  view(g, Arg::q).shape[0] = std::numeric_limits<std::int64_t>::max();
  const Verdict v = validate(g.call);
  const auto cu = std::find_if(v.violations.begin(), v.violations.end(), [](const Violation& x) {
    return x.rule == RuleId::arg_shape && x.argument == "cu_seqlens";
  });
  RC_ASSERT(cu != v.violations.end());
  RC_ASSERT(cu->message.find("B+1 = 9223372036854775807") != std::string::npos);
}

// Committing tokens of a row that holds none: a row of length 0 is a known length, not an
// unknown one.
RC_GTEST_PROP(ContractsEdges, AcceptedTokensOfAnEmptyRow, ()) {
  auto g = *gen_call(Entry::commit, PlanNeeds{.min_rows = 1, .cu_seqlens = true, .index_values = true,
                                              .explicit_scratch_indices = false});
  std::vector<std::int64_t>& cu = *view(g, Arg::cu_seqlens).values;
  std::vector<std::int64_t>& accepted = *view(g, Arg::accepted).values;
  std::vector<std::size_t> empty;
  for (std::size_t n = 0; n + 1 < cu.size() && n < accepted.size(); ++n)
    if (cu[n + 1] == cu[n]) empty.push_back(n);
  RC_PRE(!empty.empty());
  const std::size_t n = *rc::gen::elementOf(empty);
  const std::int64_t T = *std::get<CommitCall>(g.call).scalars.draft_token_num;
  accepted[n] = *rc::gen::inRange<std::int64_t>(1, T + 1);
  assert_only(g, RuleId::commit_accepted, "accepted",
              {fmt::format("accepted[{}] = {} is past row {}'s length 0", n, accepted[n], n)});
}

// Several negative strides: the first is reported, by its dim.
RC_GTEST_PROP(ContractsEdges, FirstOfSeveralNegativeStrides, ()) {
  auto g = *gen_call(*gen_entry(0b0111), PlanNeeds{.min_tokens = 1});
  const Arg a = *rc::gen::elementOf(std::vector<Arg>{Arg::q, Arg::k, Arg::v, Arg::out});
  TensorView& t = view(g, a);
  const int first = *rc::gen::inRange(0, t.rank - 1);
  const int second = *rc::gen::inRange(first + 1, t.rank);
  t.stride[first] = -*rc::gen::inRange<std::int64_t>(1, 1000);
  t.stride[second] = -*rc::gen::inRange<std::int64_t>(1, 1000);
  assert_only(g, RuleId::arg_stride, arg_name(a),
              {fmt::format("negative stride {} in dim {}", t.stride[first], first)});
}

// An allocation that ends before the view's last element: the message has both numbers.
RC_GTEST_PROP(ContractsEdges, AllocationEndingBeforeTheLastElement, ()) {
  auto g = *gen_any_call();
  std::vector<Arg> candidates;
  for (int i = 0; i < kArgCount; ++i)
    if (has(g, static_cast<Arg>(i)) && view(g, static_cast<Arg>(i)).numel() > 0)
      candidates.push_back(static_cast<Arg>(i));
  RC_PRE(!candidates.empty());
  const Arg a = *rc::gen::elementOf(candidates);
  TensorView& t = view(g, a);
  std::int64_t last = t.storage_offset.count;
  for (int d = 0; d < t.rank; ++d) last += (t.shape[d] - 1) * t.stride[d];
  const std::int64_t size = last + 1 - *rc::gen::inRange<std::int64_t>(1, last + 2);
  t.storage_size = Elements{size};
  assert_only(g, RuleId::arg_extent, arg_name(a),
              {fmt::format("reaches element {} of its allocation, which holds {} elements", last, size)});
}

// An index map of a floating dtype: the message names the dtypes the argument allows.
RC_GTEST_PROP(ContractsEdges, IndexMapOfAFloatingDtype, ()) {
  auto g = *gen_any_call();
  const Entry e = entry_of(g.call);
  std::vector<Arg> maps;
  for (Arg a : {Arg::cache_indices, Arg::initial_state_indices, Arg::cu_seqlens, Arg::scratch_row_map,
                Arg::accepted})
    if (has(g, a)) maps.push_back(a);
  RC_PRE(!maps.empty());
  const Arg a = *rc::gen::elementOf(maps);
  view(g, a).dtype = DType::f32;  // the size of i32: layout and extent stay as they were
  const bool wide = a == Arg::cu_seqlens && e == Entry::prefill;
  assert_only(g, RuleId::arg_dtype, arg_name(a),
              {fmt::format("{} has dtype f32; expected {}", arg_name(a), wide ? "i32 or i64" : "i32")});
}

}  // namespace
}  // namespace kdaguard::support
