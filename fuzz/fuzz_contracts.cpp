// fuzz_contracts: bytes -> a call (an entry point, maybe a catalogue mutation, a valid call drawn
// for it, random edits of any field) -> the validators. Invariants:
//   - no crash, no ASan or UBSan report;
//   - the verdict is deterministic and does not depend on what was validated before (checked on
//     one input in four);
//   - every violation names a rule of the entry point, an argument and a message; every deferred
//     check is a value rule;
//   - a catalogue mutation with no edits after it is reported as its rule (alone, when the
//     mutation is exclusive);
//   - an accepted call passes the bounds oracle: everything it touches lies inside its
//     arguments and allocations, no output byte inside another argument or written twice.
#include <fmt/format.h>

#include <cstdint>

#include "bounds_oracle.h"
#include "contracts_case.h"
#include "fuzz_chooser.h"
#include "fuzz_failure.h"
#include "kdaguard/contracts/validate.h"

namespace kdaguard::support {
namespace {

// A fixed valid call validated between the two validations of each input: nothing it leaves
// behind may change the second verdict.
const AnyCall& bystander() {
  static const AnyCall call = [] {
    SeededChooser choose(20240229);
    return generate_call(Entry::verify, PlanNeeds{.min_rows = 2, .index_values = true}, choose).call;
  }();
  return call;
}

// Whether this input also gets the determinism check: one input in four, picked by a hash of its
// bytes (so a reproduced input repeats its checks). Validation dominates the cost of an input;
// checking every one would halve the executions per second for little gain.
bool check_determinism(const std::uint8_t* data, std::size_t size) {
  std::uint32_t h = 2166136261u;
  for (std::size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 16777619u;
  return (h & 3u) == 0;
}

void check_case(const ContractsCase& c, bool determinism) {
  const AnyCall& call = c.call.call;
  const Entry entry = entry_of(call);
  const Verdict verdict = validate(call);
  if (determinism) {
    (void)validate(bystander());
    if (!same_verdict(verdict, validate(call)))
      fuzz_failure("validate() gave two verdicts for one call:\n" + describe_call(call));
  }

  for (const Violation& v : verdict.violations) {
    if (!rule_info(v.rule).applies_to(entry) || v.argument.empty() || v.message.empty())
      fuzz_failure(fmt::format("violation {} ({}) on {}: rule not of this entry point, or no "
                               "argument or message: \"{}\"\n{}",
                               rule_id(v.rule), v.argument, entry_name(entry), v.message,
                               describe_call(call)));
  }
  for (const DeferredCheck& d : verdict.deferred)
    if (rule_info(d.rule).tier != Tier::value)
      fuzz_failure(fmt::format("deferred {} is not a value rule\n{}", rule_id(d.rule), describe_call(call)));

  if (c.mutation && c.edits == 0) {
    if (!verdict.breaks(c.mutation->rule))
      fuzz_failure(fmt::format("mutation \"{}\" not reported as {}:\n{}\n{}", c.mutation->name,
                               rule_id(c.mutation->rule), describe(verdict), describe_call(call)));
    if (c.mutation->exclusive)
      for (const Violation& v : verdict.violations)
        if (v.rule != c.mutation->rule)
          fuzz_failure(fmt::format("exclusive mutation \"{}\" also broke {}:\n{}\n{}",
                                   c.mutation->name, rule_id(v.rule), describe(verdict),
                                   describe_call(call)));
  }

  if (verdict.accepted()) {
    const BoundsReport report = check_bounds(call);
    if (!report.ok())
      fuzz_failure("accepted call touches memory it may not: " + report.summary() + "\n" +
                   describe_call(call));
  }
}

}  // namespace
}  // namespace kdaguard::support

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kdaguard::support;
  FuzzedDataProvider bytes(data, size);
  FuzzChooser choose(bytes);
  check_case(draw_contracts_case(choose), check_determinism(data, size));
  return 0;
}
