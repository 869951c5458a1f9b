// Property 5: a refused call touches nothing. A valid call over real host buffers (random
// non-zero data) is broken by a catalogue mutation; the reference backend's entry point must
// refuse it, with the mutated rule in its verdict, and every byte of every buffer must be
// bit-identical afterwards. Broken index values are written into the buffers themselves and the
// host copy is sometimes dropped, so the refusal must also come from values read back from memory.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>

#include "gen_calls.h"
#include "kdaguard/reference.h"
#include "mutations.h"
#include "problem.h"

namespace kdaguard::support {
namespace {

using i64 = std::int64_t;

// Writes a view's host values into its buffer, when the view lies inside that buffer.
bool store_values(const HostProblem& problem, const TensorView& t) {
  const Allocation* a = problem.allocation_of(t);
  if (a == nullptr || !t.values || t.rank < 1 || t.rank > kMaxRank ||
      static_cast<i64>(t.values->size()) != t.numel() || (t.dtype != DType::i32 && t.dtype != DType::i64))
    return false;
  const i64 es = element_size(t.dtype);
  const i64 base = static_cast<i64>(t.address - a->address()) / es;
  std::vector<i64> offsets;
  std::array<i64, kMaxRank> at{};
  for (i64 i = 0; i < t.numel(); ++i) {
    i64 offset = base + t.storage_offset.count;
    for (int d = 0; d < t.rank; ++d) offset += at[d] * t.stride[d];
    if (offset < 0 || (offset + 1) * es > static_cast<i64>(a->bytes())) return false;
    offsets.push_back(offset);
    for (int d = t.rank - 1; d >= 0; --d) {
      if (++at[d] < t.shape[d]) break;
      at[d] = 0;
    }
  }
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    const i64 v = (*t.values)[i];
    if (t.dtype == DType::i64) {
      std::memcpy(a->data() + offsets[i] * 8, &v, 8);
    } else {
      const auto v32 = static_cast<std::int32_t>(v);
      std::memcpy(a->data() + offsets[i] * 4, &v32, 4);
    }
  }
  return true;
}

void refused_call_touches_nothing(Entry e) {
  std::vector<const Mutation*> usable;
  for (const Mutation& m : mutation_table())
    if (m.applies_to(e)) usable.push_back(&m);
  const Mutation& m = *usable[*rc::gen::inRange<std::size_t>(0, usable.size())];
  RC_TAG(rule_id(m.rule));

  GeneratedCall g{*gen_plan(e, m.needs), make_call(e), {}};
  HostProblem problem = materialize(g.plan, *rc::gen::arbitrary<std::uint64_t>());
  g.call = problem.call;
  const AnyCall valid = g.call;
  const auto broken = *rc::gen::exec([&] {
    RapidCheckChooser choose;
    GeneratedCall copy = g;
    m.apply(copy, choose);
    return copy;
  });
  g = broken;

  // Broken index values go into memory too; then the host copy may go.
  const bool drop_copies = *rc::gen::arbitrary<bool>();
  for_each_argument(g.call, [&](Arg a, OptionalView& v) {
    const OptionalView* before = find_argument(valid, a);
    if (!v || !v->values || !before || !*before || (*before)->values == v->values) return;
    if (store_values(problem, *v) && drop_copies) v->values.reset();
  });

  const Snapshot snapshot = problem.snapshot();
  const Status status = reference::run(g.call);
  if (status.code != StatusCode::rejected)
    RC_FAIL(fmt::format("mutation \"{}\" ({}) was not refused: {}\n{}", m.name, rule_id(m.rule),
                        to_string(status), describe_call(g.call)));
  if (!status.verdict.breaks(m.rule))
    RC_FAIL(fmt::format("mutation \"{}\" refused without {}: {}", m.name, rule_id(m.rule),
                        describe(status.verdict)));
  RC_ASSERT(problem.snapshot() == snapshot);
}

RC_GTEST_PROP(RefusalUntouched, Decode, ()) { refused_call_touches_nothing(Entry::decode); }
RC_GTEST_PROP(RefusalUntouched, Prefill, ()) { refused_call_touches_nothing(Entry::prefill); }
RC_GTEST_PROP(RefusalUntouched, Verify, ()) { refused_call_touches_nothing(Entry::verify); }
RC_GTEST_PROP(RefusalUntouched, Commit, ()) { refused_call_touches_nothing(Entry::commit); }

// The same valid call, unmutated, is run: the refusals above are not refusals of everything.
RC_GTEST_PROP(RefusalUntouched, TheValidCallRuns, ()) {
  const Entry e = *gen_entry();
  const CallPlan plan = *gen_plan(e);
  HostProblem problem = materialize(plan, *rc::gen::arbitrary<std::uint64_t>());
  const Status status = reference::run(problem.call);
  if (!status.ok()) RC_FAIL(to_string(status) + "\n" + describe_call(problem.call));
}

}  // namespace
}  // namespace kdaguard::support
