// How fuzz_records turns its choices into a case (shared with the seed writer). Every choice is
// made here, before any work:
//   - a contracts case: a record entry point, maybe one of record_mutations.h's mutations, a
//     valid record call drawn for it, and up to three random edits of any field;
//   - a reference case: a small valid commit problem (reference_case.h's drawing), the seed of
//     its data and the layout of its record buffers.
#pragma once

#include <cstdint>
#include <optional>

#include "record_mutations.h"
#include "record_problem.h"
#include "reference_case.h"

namespace kdaguard::support {

enum class RecordsMode : std::uint8_t { contracts, reference };

struct RecordsCase {
  RecordsMode mode = RecordsMode::contracts;
  // contracts
  GeneratedRecordCall call;
  const RecordMutation* mutation = nullptr;
  int edits = 0;
  // reference
  CallPlan plan;
  std::uint64_t data_seed = 0;
  RecordBufferPlan records;  // the record buffers' layout
};

inline constexpr Entry kRecordEntries[] = {Entry::record_verify, Entry::replay_commit,
                                           Entry::accept_verify};

inline RecordsCase draw_records_case(Chooser& c) {
  RecordsCase rc;
  rc.mode = c.coin() ? RecordsMode::reference : RecordsMode::contracts;
  if (rc.mode == RecordsMode::reference) {
    rc.plan = reference_case_detail::draw_spec_for(Entry::commit, c, {});
    rc.data_seed = static_cast<std::uint64_t>(c.pick(0, std::int64_t{1} << 30));
    rc.records = draw_record_buffer(rc.plan.rows(), rc.plan.T, c);
    return rc;
  }
  const Entry e = c.element(kRecordEntries);
  const auto table = record_mutation_table();
  // -1: no mutation; else an index into the table (mutations not of this entry point: none).
  const std::int64_t m = c.pick(-1, static_cast<std::int64_t>(table.size()) - 1);
  if (m >= 0 && table[static_cast<std::size_t>(m)].applies_to(e))
    rc.mutation = &table[static_cast<std::size_t>(m)];
  rc.call = rc.mutation ? mutated_record_call(*rc.mutation, e, c) : generate_record_call(e, {}, c);
  rc.edits = static_cast<int>(c.pick(0, 3));
  for (int i = 0; i < rc.edits; ++i) random_record_edit(rc.call, c);
  return rc;
}

}  // namespace kdaguard::support
