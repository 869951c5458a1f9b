// How fuzz_contracts turns its choices into a call (shared with the seed writer, so seeds mean
// what they were written to mean): an entry point, maybe one catalogue mutation, a valid call
// drawn for it, then up to three random edits of any field.
#pragma once

#include <cstdint>

#include "gen_calls.h"
#include "mutations.h"

namespace kdaguard::support {

struct ContractsCase {
  GeneratedCall call;
  const Mutation* mutation = nullptr;  // applied to the valid call, before the edits
  std::int64_t edits = 0;
};

inline ContractsCase draw_contracts_case(Chooser& choose) {
  static constexpr Entry kEntries[] = {Entry::decode, Entry::prefill, Entry::verify, Entry::commit};
  const Entry entry = choose.element(kEntries);
  const auto table = mutation_table();
  const std::int64_t which = choose.pick(-1, static_cast<std::int64_t>(table.size()) - 1);
  const Mutation* mutation =
      which >= 0 && table[static_cast<std::size_t>(which)].applies_to(entry) ? &table[static_cast<std::size_t>(which)] : nullptr;
  ContractsCase c{generate_call(entry, mutation ? mutation->needs : PlanNeeds{}, choose), mutation, 0};
  if (mutation) mutation->apply(c.call, choose);
  c.edits = choose.pick(0, 3);
  for (std::int64_t i = 0; i < c.edits; ++i) random_edit(c.call, choose);
  return c;
}

}  // namespace kdaguard::support
