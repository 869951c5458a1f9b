// For every rule of the catalogue, mutations that turn a valid generated call into one that
// breaks that rule. A mutation starts from a call drawn with its PlanNeeds (so it always has
// something to break) and is `exclusive` when the rule it breaks is the only one the call then
// breaks; a few rules cannot be broken alone (a zero draft-token count also makes every row too
// long), and their mutations say so.
//
// random_edit() is the fuzzers' blunt instrument: one arbitrary edit of one field of a call
// (shape, stride, offset, address, dtype, values, scalars, presence), valid or not.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "gen_calls.h"
#include "kdaguard/contracts/rules.h"

namespace kdaguard::support {

struct Mutation {
  RuleId rule;
  std::string_view name;     // what it does, e.g. "v aliases out"
  std::uint8_t entry_mask;   // bit (1 << Entry) for each entry point it applies to
  bool exclusive;            // the mutated call breaks `rule` and nothing else
  PlanNeeds needs;           // what the valid call it starts from must have
  void (*apply)(GeneratedCall& call, Chooser& choose);

  bool applies_to(Entry e) const { return (entry_mask >> static_cast<int>(e)) & 1u; }
};

// Every mutation, in catalogue order of their rules, then the later additions (fuzz inputs name a
// mutation by its index in this table).
std::span<const Mutation> mutation_table();
std::vector<const Mutation*> mutations_for(RuleId rule);

// Draws a valid call for `m` on entry point `e` (which m must apply to) and breaks it.
GeneratedCall mutated_call(const Mutation& m, Entry e, Chooser& choose);

// One arbitrary edit of one field of the call.
void random_edit(GeneratedCall& call, Chooser& choose);

}  // namespace kdaguard::support
