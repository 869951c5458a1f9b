// Host problems of the record-based speculative path: a verify or commit HostProblem (problem.h)
// with a record buffer [S_rec, T_alloc, HV, 2K+V] of f32 added to its allocations, laid out by a
// RecordBufferPlan (record_calls.h, the layout the data-less record calls use too), and the
// record_verify / replay_commit calls over the very buffers its verify and commit calls use. So
// the record path and the state-writing path run on the same inputs, pool and counts, and the
// problem's snapshots cover the records too.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "problem.h"
#include "record_calls.h"

namespace kdaguard::support {

struct RecordProblem {
  HostProblem host;   // a verify or commit problem
  TensorView records; // in host.allocations, named "records"

  RecordVerifyCall record_verify() const;
  ReplayCommitCall replay_commit() const;  // a commit problem's accepted counts

  // record_verify's writes: all of out (padding rows as zeros) and records[n, t] of every
  // active row n for t below its length.
  std::vector<TensorView> record_verify_writes() const;
  // replay_commit's writes: the committed slot of every active row with accepted > 0.
  std::vector<TensorView> replay_commit_writes() const;
  // Fills every byte of the records with a NaN pattern.
  void poison_records();
};

// The record of (row n, step t) in a record buffer [S_rec, T_alloc, HV, 2K+V]: [HV, 2K+V].
TensorView record_at(const TensorView& records, std::int64_t n, std::int64_t t);

RecordProblem materialize_records(const CallPlan& spec, std::uint64_t seed,
                                  const RecordBufferPlan& records);
// Compact records: the plan's rows and draft steps, no padding (compact_records).
RecordProblem materialize_records(const CallPlan& spec, std::uint64_t seed);
RecordBufferPlan compact_records(const CallPlan& spec);

// The fused step over a record_verify call: its inputs, pool, slot map, out, records and scalars,
// replaying prior_accepted[n] steps of prior_records first.
AcceptVerifyCall accept_verify_call(const RecordVerifyCall& draft, const TensorView& prior_records,
                                    const TensorView& prior_accepted);

// A record buffer shaped like `like` (rows, steps, pitches, storage offset) in a new allocation of
// `host`.
TensorView add_record_buffer(HostProblem& host, std::string name, const TensorView& like);
// An i32 index tensor [values.size()] with host values in a new allocation of `host`.
TensorView add_index(HostProblem& host, std::string name, const std::vector<std::int64_t>& values);

// The first byte of `host`'s allocations that changed since `before` outside the elements of
// `writable` (views of host's allocations), or nullopt.
std::optional<std::string> changed_outside(const HostProblem& host, const Snapshot& before,
                                           std::span<const TensorView> writable);
// Whether some element of the views holds a NaN (an output left poisoned).
std::optional<std::string> still_poisoned(std::span<const TensorView> views);
// Writes NaN into every element of the floating views.
void poison(std::span<const TensorView> views);

}  // namespace kdaguard::support
