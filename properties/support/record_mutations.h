// Single-rule mutations of record calls (record_calls.h), for every rule of the catalogue that
// applies to record_verify, replay_commit or accept_verify: the new rules (records.steps,
// records.rows, accept.prior_accepted), and the verify/commit rules the record-based path shares.
//
// A mutation of a shared rule that only edits arguments a record call shares with its base call
// is the gen_calls mutation itself (named by `base`): it edits the base verify or commit call and
// the record call is derived from it again. The others (the record buffers, the pool, every
// argument) are functions of their own here.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "mutations.h"
#include "record_calls.h"

namespace kdaguard::support {

struct RecordMutation {
  RuleId rule;
  std::string_view name;
  std::uint8_t entry_mask;  // bits (1 << Entry) of record-based entry points
  bool exclusive;           // the mutated call breaks `rule` and nothing else
  PlanNeeds needs;          // what the base plan must have
  void (*apply)(GeneratedRecordCall& call, Chooser& choose);  // null: apply `base`
  const Mutation* base = nullptr;  // a gen_calls mutation applied to the base call

  bool applies_to(Entry e) const { return (entry_mask >> static_cast<int>(e)) & 1u; }
};

// Fuzz inputs name a mutation by its index: add rows at the end.
std::span<const RecordMutation> record_mutation_table();
std::vector<const RecordMutation*> record_mutations_for(RuleId rule);

// Draws a valid record call for `m` on entry point `e` (which m must apply to) and breaks it.
GeneratedRecordCall mutated_record_call(const RecordMutation& m, Entry e, Chooser& choose);

// One arbitrary edit of one field of a record call: of its record buffers or prior counts, or
// (mutations.h's random_edit) of the arguments it shares with its base call.
void random_record_edit(GeneratedRecordCall& call, Chooser& choose);

}  // namespace kdaguard::support
