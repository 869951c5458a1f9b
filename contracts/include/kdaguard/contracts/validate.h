// validate(call): every violation of the catalogue, in a deterministic order, plus the value
// rules it had to defer because the values live on the device. Pure: the verdict depends on the
// call description alone (no caches keyed by address or identity). Never throws on any input.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kdaguard/contracts/call.h"
#include "kdaguard/contracts/rules.h"

namespace kdaguard {

struct Violation {
  RuleId rule;
  std::string_view argument;  // the argument or scalar the rule fired on ("q", "scale", ...);
                              // always a name with static storage

  std::string message;   // names the argument and shows the expected and the actual value
};

// A value rule left to the device because `argument` carries no host copy of its values.
struct DeferredCheck {
  RuleId rule;
  std::string_view argument;  // static storage, like Violation::argument
};

struct Verdict {
  std::vector<Violation> violations;   // sorted by (catalogue order, argument order)
  std::vector<DeferredCheck> deferred;  // in the fixed order the checks run, no duplicates

  bool accepted() const { return violations.empty(); }
  bool breaks(RuleId rule) const;
};

Verdict validate(const DecodeCall& call);
Verdict validate(const PrefillCall& call);
Verdict validate(const VerifyCall& call);
Verdict validate(const CommitCall& call);
Verdict validate(const RecordVerifyCall& call);
Verdict validate(const ReplayCommitCall& call);
Verdict validate(const AcceptVerifyCall& call);
Verdict validate(const AnyCall& call);
Verdict validate(const CatalogueCall& call);

// Whether validating the call defers value rules to the device: an index tensor that a value rule
// of its entry point reads came without a host copy of its values. For an accepted call it equals
// !validate(call).deferred.empty() (check_value_input defers by this test), without validating;
// callers use it to provide the device guard's buffers only for calls that need them.
template <class Call> bool defers_value_rules(const Call& call) {
  bool scratch_indices_given = false;
  Call::visit(call, [&](Arg arg, const OptionalView& view) {
    if (arg == Arg::scratch_indices && view) scratch_indices_given = true;
  });
  bool defers = false;
  Call::visit(call, [&](Arg arg, const OptionalView& view) {
    if (view && !view->values && value_rules_read(Call::kEntry, arg, scratch_indices_given))
      defers = true;
  });
  return defers;
}

// A readable multi-line summary: "rule (argument): message" per violation.
std::string describe(const Verdict& verdict);

}  // namespace kdaguard
