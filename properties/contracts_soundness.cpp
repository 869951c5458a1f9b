// Property 4: soundness. Whatever the validators accept, the bounds oracle (written from the
// spec, not from the validators) finds every element the entry point touches inside its argument
// and its allocation, and no output byte inside another argument or written twice. The calls
// are generated valid calls and valid calls after random edits (shapes, strides, offsets,
// addresses, dtypes, values, scalars): whichever of those the validators still accept must be
// safe. The last properties show the oracle has teeth: broken calls it must flag, it flags.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "bounds_oracle.h"
#include "gen_calls.h"
#include "kdaguard/contracts/validate.h"
#include "mutations.h"

namespace kdaguard::support {
namespace {

void assert_sound(const AnyCall& call) {
  const BoundsReport report = check_bounds(call);
  RC_CLASSIFY(!report.complete, "oracle capped");
  if (!report.ok())
    RC_FAIL(fmt::format("accepted call touches memory it may not:\n{}\n{}", report.summary(),
                        describe_call(call)));
}

RC_GTEST_PROP(ContractsSoundness, ValidCallsStayInBounds, ()) {
  const auto g = *gen_any_call();
  RC_ASSERT(validate(g.call).accepted());
  const BoundsReport report = check_bounds(g.call);
  RC_ASSERT(report.complete);  // generated shapes are small: the walk is exact
  assert_sound(g.call);
}

RC_GTEST_PROP(ContractsSoundness, AcceptedEditedCallsStayInBounds, ()) {
  const auto g = *rc::gen::exec([] {
    RapidCheckChooser c;
    GeneratedCall call = generate_call(*gen_entry(), {}, c);
    for (std::int64_t i = c.pick(1, 3); i > 0; --i) random_edit(call, c);
    return call;
  });
  const bool accepted = validate(g.call).accepted();
  RC_CLASSIFY(accepted, "still accepted");
  if (accepted) assert_sound(g.call);
}

// ---- the oracle's teeth: calls that touch memory they may not, which it must flag ----

void oracle_flags(const GeneratedCall& g, std::string_view what) {
  const BoundsReport report = check_bounds(g.call);
  if (report.ok())
    RC_FAIL(fmt::format("the oracle misses {}:\n{}", what, describe_call(g.call)));
}

GeneratedCall broken(RuleId rule, std::string_view name, Entry e, PlanNeeds extra) {
  for (const Mutation* m : mutations_for(rule)) {
    if (m->name != name) continue;
    PlanNeeds needs = m->needs;
    needs.min_rows = std::max(needs.min_rows, extra.min_rows);
    needs.min_active_rows = std::max(needs.min_active_rows, extra.min_active_rows);
    needs.min_tokens = std::max(needs.min_tokens, extra.min_tokens);
    needs.index_values = needs.index_values || extra.index_values;
    return *rc::gen::exec([&] {
      RapidCheckChooser c;
      GeneratedCall g = generate_call(e, needs, c);
      m->apply(g, c);
      return g;
    });
  }
  throw std::logic_error("no such mutation");
}

RC_GTEST_PROP(ContractsSoundness, OracleFlagsAnOutputAliasingAnInput, ()) {
  const Entry e = *gen_entry(0b0111);
  oracle_flags(broken(RuleId::alias_overlap, "v aliases out", e, {.min_tokens = 1}), "v aliasing out");
}

RC_GTEST_PROP(ContractsSoundness, OracleFlagsTwoRowsWritingOneSlot, ()) {
  const Entry e = *gen_entry(0b0011);  // decode and prefill write every row's slot
  oracle_flags(broken(RuleId::index_unique, "two rows share a slot", e, {}), "a slot written twice");
}

RC_GTEST_PROP(ContractsSoundness, OracleFlagsASlotPastThePool, ()) {
  const Entry e = *gen_entry(0b0111);
  oracle_flags(broken(RuleId::index_range, "a slot past the pool", e, {}), "a slot past the pool");
}

RC_GTEST_PROP(ContractsSoundness, OracleFlagsOutputHeadsSharingMemory, ()) {
  const Entry e = *gen_entry(0b0001);
  oracle_flags(broken(RuleId::arg_stride, "out heads share memory", e, {.min_tokens = 1}),
               "out heads written over each other");
}

RC_GTEST_PROP(ContractsSoundness, OracleFlagsShortGateRows, ()) {
  const Entry e = *gen_entry(0b0011);
  oracle_flags(broken(RuleId::gate_cover_tokens, "gate or beta shorter than q", e, {}),
               "token rows past the gate or beta");
}

RC_GTEST_PROP(ContractsSoundness, OracleFlagsAShortSlotMap, ()) {
  const Entry e = *gen_entry(0b0111);
  oracle_flags(broken(RuleId::index_length, "slot map one entry short", e, {}),
               "a read past the slot map");
}

RC_GTEST_PROP(ContractsSoundness, OracleFlagsTokensPastTheTotal, ()) {
  // cu_seqlens[0] = -k: the first sequence starts before token 0.
  oracle_flags(broken(RuleId::seqlens_start, "cu_seqlens[0] != 0", Entry::prefill, {}),
               "tokens before the first row of q");
}

RC_GTEST_PROP(ContractsSoundness, OracleFlagsAnOutputPastItsAllocation, ()) {
  auto g = *gen_call(*gen_entry(0b0111), PlanNeeds{.min_tokens = 1});
  TensorView& out = **find_argument(g.call, Arg::out);
  std::int64_t last = out.storage_offset.count;
  for (int d = 0; d < out.rank; ++d) last += (out.shape[d] - 1) * out.stride[d];
  out.storage_size = Elements{last};  // the last element written lies just past the end
  oracle_flags(g, "the last output element past its allocation");
}

RC_GTEST_PROP(ContractsSoundness, OracleFlagsScratchRowsPastTheScratch, ()) {
  auto g = *gen_call(Entry::verify, PlanNeeds{.min_rows = 2, .index_values = true,
                                              .explicit_scratch_indices = false,
                                              .padding_rows = false, .min_rows_with_tokens = 2});
  (**find_argument(g.call, Arg::scratch)).shape[0] = 1;  // row 1 has no scratch row
  oracle_flags(g, "a verify row writing past the scratch");
}

}  // namespace
}  // namespace kdaguard::support
