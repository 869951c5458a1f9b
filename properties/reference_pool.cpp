// Issue 3: the reference and its pools. A prefill split at any token into two prefills (the state
// handed over through the pool) equals one; every entry point writes exactly what it may (outputs
// fully, padding rows zero, no byte of any other slot or buffer); results do not depend on what
// ran before; a refused call touches nothing, even when the host copies of the indices are fine
// and only the memory is wrong.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gen_problem.h"
#include "kdaguard/numeric.h"
#include "kdaguard/reference.h"
#include "problem.h"

namespace kdaguard {
namespace {

using support::HostProblem;
using support::CallPlan;

rc::Gen<CallPlan> gen_any_spec() {
  return rc::gen::mapcat(rc::gen::resize(100, rc::gen::inRange(0, 4)),
                         [](int e) { return support::gen_problem(static_cast<Entry>(e)); });
}

// The rms-ratio tolerance for a value that went through `dtype` once more than its counterpart.
double rounding_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return 1e-6;
    case DType::f16: return 2e-3;
    default: return 1e-2;  // bf16
  }
}

// An i32/i64 index tensor [values.size()] in its own buffer, with or without the host copy.
TensorView index_view(const support::Allocation& buffer, DType dtype,
                      const std::vector<std::int64_t>& values, bool host_values) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::i64) {
      std::memcpy(buffer.data() + i * 8, &values[i], 8);
    } else {
      const auto v = static_cast<std::int32_t>(values[i]);
      std::memcpy(buffer.data() + i * 4, &v, 4);
    }
  }
  TensorView t = TensorView::contiguous(dtype, {static_cast<std::int64_t>(values.size())});
  t.address = buffer.address();
  t.storage_size = Elements{static_cast<std::int64_t>(values.size())};
  if (host_values) t.values = values;
  return t;
}

// The part of a prefill over packed tokens [first, last): the sequences overlapping it, cut to it.
struct PrefillPart {
  PrefillCall call;
  support::Allocation cu_buffer, slot_buffer;
};

std::unique_ptr<PrefillPart> prefill_part(const PrefillCall& whole, const CallPlan& s,
                                          std::int64_t first, std::int64_t last) {
  std::vector<std::int64_t> cu{0}, slots;
  std::int64_t begin = 0;
  for (std::size_t n = 0; n < s.row_lengths.size(); ++n) {
    const std::int64_t end = begin + s.row_lengths[n];
    // A sequence of length 0 goes with the part it sits in; at the very end of the tokens it is
    // in neither (it runs nothing either way).
    const bool overlaps = s.row_lengths[n] == 0 ? begin >= first && begin < last
                                             : begin < last && end > first;
    if (overlaps) {
      cu.push_back(cu.back() + std::min(end, last) - std::max(begin, first));
      slots.push_back(s.slot_of_row[n]);
    }
    begin = end;
  }
  auto part = std::unique_ptr<PrefillPart>(new PrefillPart{
      whole, support::Allocation("part_cu_seqlens", cu.size() * element_size(s.cu_dtype)),
      support::Allocation("part_indices", std::max<std::size_t>(slots.size(), 1) * 4)});
  PrefillCall& c = part->call;
  auto rows = [&](OptionalView& v, std::int64_t count) {
    if (v) v = support::slice_rows(*v, first, count);
  };
  const std::int64_t tokens = last - first;
  rows(c.q, tokens);
  rows(c.k, tokens);
  rows(c.v, tokens);
  rows(c.out, tokens);
  // Gate and beta keep every row from `first` on: rows past the part's tokens are ignored.
  for (OptionalView* gate_or_beta : {&c.a, &c.g, &c.b, &c.beta})
    if (*gate_or_beta) rows(*gate_or_beta, (*gate_or_beta)->shape[0] - first);
  c.cu_seqlens = index_view(part->cu_buffer, s.cu_dtype, cu, s.has_values(Arg::cu_seqlens));
  c.initial_state_indices =
      index_view(part->slot_buffer, DType::i32, slots, s.has_values(Arg::initial_state_indices));
  return part;
}

RC_GTEST_PROP(ReferencePool, PrefillSplitAtAnyTokenEqualsOnePrefill, ()) {
  const CallPlan spec = *support::gen_prefill_problem();
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  const auto& whole = std::get<PrefillCall>(problem.call);
  const std::int64_t total = spec.total_tokens();
  const std::int64_t cut = *rc::gen::resize(100, rc::gen::inRange<std::int64_t>(0, total + 1));
  RC_TAG(cut == 0 || cut == total ? "cut at an end" : "cut inside");

  const support::Snapshot fresh = problem.snapshot();
  RC_ASSERT(reference::prefill(whole).ok());
  const std::vector<double> out_whole = support::read_floats(*whole.out);
  const std::vector<double> pool_whole = support::read_floats(*whole.initial_state);
  problem.restore(fresh);

  const auto head = prefill_part(whole, spec, 0, cut);
  const auto tail = prefill_part(whole, spec, cut, total);
  const Status first = reference::prefill(head->call);
  RC_ASSERT(first.ok());
  const Status second = reference::prefill(tail->call);
  RC_ASSERT(second.ok());

  // The handover rounds the state into the pool's dtype once more; outputs after it may then
  // round to a neighbouring value of the output dtype.
  const double tolerance =
      std::max(rounding_tolerance(spec.state_dtype), rounding_tolerance(spec.io_dtype));
  const reference::ErrorStats out = reference::compare(support::read_floats(*whole.out), out_whole);
  const reference::ErrorStats pool =
      reference::compare(support::read_floats(*whole.initial_state), pool_whole);
  RC_LOG() << "cut " << cut << ": out " << out.to_string() << "; pool " << pool.to_string() << "\n";
  RC_ASSERT(out.pass(tolerance));
  RC_ASSERT(pool.pass(tolerance));
}

RC_GTEST_PROP(ReferencePool, WritesExactlyWhatItMay, ()) {
  const CallPlan spec = *gen_any_spec();
  RC_TAG(entry_name(spec.entry));
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  if (spec.entry == Entry::commit) RC_ASSERT(reference::verify(*problem.verify).ok());
  problem.poison_outputs();
  const support::Snapshot before = problem.snapshot();
  const Status status = reference::run(problem.call);
  RC_ASSERT(status.ok());
  const auto unexpected = problem.unexpected_writes(before);
  RC_ASSERT(!unexpected.has_value());
  const auto unwritten = problem.unwritten_outputs();
  RC_ASSERT(!unwritten.has_value());

  if (spec.entry == Entry::decode || spec.entry == Entry::verify) {  // padding rows: zeros
    const TensorView& out = spec.entry == Entry::decode ? *std::get<DecodeCall>(problem.call).out
                                                        : *problem.verify->out;
    std::int64_t token = 0;
    for (std::size_t n = 0; n < spec.row_lengths.size(); ++n) {
      const std::vector<double> rows =
          support::read_floats(support::slice_rows(out, token, spec.row_lengths[n]));
      if (spec.slot_of_row[n] < 0) RC_ASSERT(rows == std::vector<double>(rows.size(), 0.0));
      token += spec.row_lengths[n];
    }
  }
}

// A one-token call on other buffers, then the long call: the same bytes as the long call alone.
RC_GTEST_PROP(ReferencePool, ResultsDoNotDependOnEarlierCalls, ()) {
  const CallPlan spec = *support::gen_prefill_problem();
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  const support::Snapshot fresh = problem.snapshot();
  RC_ASSERT(reference::prefill(std::get<PrefillCall>(problem.call)).ok());
  const support::Snapshot alone = problem.snapshot();
  problem.restore(fresh);

  CallPlan short_spec = spec;
  short_spec.row_lengths = {1};
  short_spec.slot_of_row = {0};
  short_spec.slots = 1;
  short_spec.entry = *rc::gen::arbitrary<bool>() ? Entry::prefill : Entry::decode;
  if (short_spec.entry == Entry::decode) short_spec.cu_dtype = DType::i32;  // decode's is i32
  const HostProblem earlier = support::materialize(short_spec, *rc::gen::arbitrary<std::uint64_t>());
  RC_ASSERT(reference::run(earlier.call).ok());
  RC_ASSERT(reference::prefill(std::get<PrefillCall>(problem.call)).ok());
  RC_ASSERT(problem.snapshot() == alone);
}

// The comparison GPU conformance tests use: identical results compare as exact, and a change to
// any one element of any written region shows up in the matching error.
RC_GTEST_PROP(ReferencePool, CompareOutputsSeesEveryWrittenRegion, ()) {
  const CallPlan spec = *gen_any_spec();
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  if (spec.entry == Entry::commit) RC_ASSERT(reference::verify(*problem.verify).ok());
  RC_ASSERT(reference::run(problem.call).ok());
  const support::Snapshot expected = problem.snapshot();
  const support::OutputErrors same = problem.compare_outputs(expected, expected);
  RC_ASSERT(same.out.max_abs == 0.0 && same.state.max_abs == 0.0);

  const std::vector<support::WrittenRegion> regions = problem.written_regions();
  RC_PRE(!regions.empty());  // (RC_PRE does not short-circuit &&: keep conditions separate)
  const auto r = *rc::gen::inRange<std::size_t>(0, regions.size());
  const TensorView& view = regions[r].view;
  RC_PRE(view.numel() > 0);
  // Element 0 of the region, set to a value no output holds.
  const support::Allocation* a = problem.allocation_of(view);
  numeric::store(a->data(), view.dtype, view.storage_offset.count, 1000.0);
  const support::OutputErrors changed = problem.compare_outputs(expected, problem.snapshot());
  const reference::ErrorStats& hit =
      regions[r].kind == support::WrittenRegion::Kind::out ? changed.out : changed.state;
  RC_ASSERT(hit.max_abs > 1.0);
}

// ---- refusals ----

enum class Breakage { slot_out_of_range, slot_repeated, prefill_padding, seqlens_total, misaligned_pool, dtype_mismatch };

const TensorView* slot_map(const HostProblem& p) {
  switch (p.plan.entry) {
    case Entry::decode: return &*std::get<DecodeCall>(p.call).cache_indices;
    case Entry::prefill: return &*std::get<PrefillCall>(p.call).initial_state_indices;
    case Entry::verify:
    case Entry::commit: return &*p.verify->cache_indices;
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: break;  // no record-based problems here
  }
  return nullptr;
}

void write_index(const HostProblem& p, const TensorView& t, std::int64_t i, std::int64_t value) {
  std::byte* at = p.allocation_of(t)->data() + (t.storage_offset.count + i) * element_size(t.dtype);
  if (t.dtype == DType::i64) {
    std::memcpy(at, &value, 8);
  } else {
    const auto v = static_cast<std::int32_t>(value);
    std::memcpy(at, &v, 4);
  }
}

RC_GTEST_PROP(ReferencePool, RefusedCallsTouchNothing, ()) {
  const CallPlan spec = *gen_any_spec();
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  const Breakage breakage = static_cast<Breakage>(*rc::gen::resize(100, rc::gen::inRange(0, 6)));

  std::vector<std::int64_t> active;
  for (std::size_t n = 0; n < spec.slot_of_row.size(); ++n)
    if (spec.slot_of_row[n] >= 0) active.push_back(static_cast<std::int64_t>(n));
  RuleId expected = RuleId::arg_dtype;
  // Index breakages go to memory only: the host copies (when attached) still hold valid values,
  // so only reading the indices back from memory can catch them.
  switch (breakage) {
    case Breakage::slot_out_of_range:
      RC_PRE(!active.empty());
      write_index(problem, *slot_map(problem), active[0], spec.slots);
      expected = RuleId::index_range;
      break;
    case Breakage::slot_repeated:
      RC_PRE(active.size() >= 2);
      write_index(problem, *slot_map(problem), active[1], spec.slot_of_row[active[0]]);
      expected = RuleId::index_unique;
      break;
    case Breakage::prefill_padding:
      RC_PRE(spec.entry == Entry::prefill);
      write_index(problem, *slot_map(problem), 0, -1);
      expected = RuleId::index_padding;
      break;
    case Breakage::seqlens_total: {
      RC_PRE(spec.entry == Entry::prefill || spec.entry == Entry::verify);
      const TensorView& cu = spec.entry == Entry::prefill
                                 ? *std::get<PrefillCall>(problem.call).cu_seqlens
                                 : *problem.verify->cu_seqlens;
      write_index(problem, cu, cu.shape[0] - 1, spec.total_tokens() + 1);
      expected = RuleId::seqlens_total;
      break;
    }
    case Breakage::misaligned_pool:
      for_each_argument(problem.call, [](Arg a, OptionalView& v) {
        if (v && (a == Arg::state || a == Arg::initial_state)) v->storage_offset.count += 1;
      });
      expected = RuleId::state_base_align;
      break;
    case Breakage::dtype_mismatch: {
      RC_PRE(spec.entry != Entry::commit);
      for_each_argument(problem.call, [&](Arg a, OptionalView& v) {
        if (v && a == Arg::out) v->dtype = spec.io_dtype == DType::f32 ? DType::bf16 : DType::f32;
      });
      expected = RuleId::arg_dtype;
      break;
    }
  }
  RC_TAG(entry_name(spec.entry), rule_id(expected));
  const support::Snapshot before = problem.snapshot();
  const Status status = reference::run(problem.call);
  RC_LOG() << to_string(status) << "\n";
  RC_ASSERT(status.code == StatusCode::rejected);
  RC_ASSERT(status.verdict.breaks(expected));
  RC_ASSERT(problem.snapshot() == before);
}

}  // namespace
}  // namespace kdaguard
