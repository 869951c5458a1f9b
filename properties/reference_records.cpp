// The record-based speculative path against the f64 reference (contracts/NOTES.md):
// record_verify gives exactly the outputs of T single-token decodes and writes nothing but out
// and the records of active steps; replay_commit leaves the state of the state-writing commit
// (verify into scratch, commit) within kda-math.md's tolerances; replay_commit of 0 accepted steps
// changes nothing; accept_verify is replay_commit followed by record_verify, bit for bit; and a
// refused call of any of the three touches no byte.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gen_problem.h"
#include "kdaguard/reference.h"
#include "problem.h"
#include "record_problem.h"
#include "speculative.h"

namespace kdaguard::support {
namespace {

using i64 = std::int64_t;

// Record buffers for the plan's rows and steps, laid out as the generated record calls' are.
RecordBufferPlan gen_layout(const CallPlan& spec) {
  RapidCheckChooser choose;
  return draw_record_buffer(spec.rows(), spec.T, choose);
}

// kda-math.md: f32 state within 1e-5 of the reference; a bf16 state adds its own rounding (a
// replayed element may round to the neighbour of the verify's): 1e-2.
double state_tolerance(DType state) { return state == DType::f32 ? 1e-5 : 1e-2; }

// The first output of an active row that differs from decoding its token, or of a padding row
// that is not zero.
std::optional<std::string> outputs_mismatch(const HostProblem& p, const DecodeTrace& trace) {
  const CallPlan& s = p.plan;
  i64 first = 0;
  for (std::size_t n = 0; n < s.row_lengths.size(); ++n) {
    for (i64 t = 0; t < s.row_lengths[n]; ++t) {
      const std::vector<double> got = read_floats(slice_rows(*p.verify->out, first + t, 1));
      if (s.slot_of_row[n] < 0 ? got != std::vector<double>(got.size(), 0.0) : got != trace.out[n][t])
        return fmt::format("row {} step {}: the output is not {}", n, t,
                           s.slot_of_row[n] < 0 ? "zero (padding row)" : "the decode's");
    }
    first += s.row_lengths[n];
  }
  return std::nullopt;
}

RC_GTEST_PROP(ReferenceRecords, RecordVerifyEqualsSingleTokenDecodes, ()) {
  const CallPlan spec = *gen_verify_problem();
  RecordProblem p = materialize_records(spec, *rc::gen::arbitrary<std::uint64_t>(), gen_layout(spec));
  const Snapshot fresh = p.host.snapshot();
  DecodeTrace trace;
  RC_ASSERT(decode_each_token(p.host, trace).ok());
  p.host.restore(fresh);

  p.host.poison_outputs();
  const Snapshot before = p.host.snapshot();
  const Status status = reference::record_verify(p.record_verify());
  if (!status.ok()) RC_FAIL(to_string(status));
  const auto writes = p.record_verify_writes();
  if (const auto changed = changed_outside(p.host, before, writes)) RC_FAIL(*changed);
  if (const auto poisoned = still_poisoned(writes)) RC_FAIL(*poisoned);
  if (const auto mismatch = outputs_mismatch(p.host, trace)) RC_FAIL(*mismatch);
}

// Every written slot of `p` (a commit problem) as it is now, row by row.
std::vector<std::vector<double>> committed_slots(const RecordProblem& p) {
  std::vector<std::vector<double>> slots;
  for (const TensorView& slot : p.replay_commit_writes()) slots.push_back(read_floats(slot));
  return slots;
}

RC_GTEST_PROP(ReferenceRecords, ReplayCommitEqualsTheStateWritingCommit, ()) {
  const CallPlan spec = *gen_commit_problem();
  RecordProblem p = materialize_records(spec, *rc::gen::arbitrary<std::uint64_t>(), gen_layout(spec));
  const Snapshot fresh = p.host.snapshot();
  RC_ASSERT(reference::verify(*p.host.verify).ok());
  RC_ASSERT(reference::commit(*p.host.commit).ok());
  const auto expected = committed_slots(p);
  p.host.restore(fresh);

  RC_ASSERT(reference::record_verify(p.record_verify()).ok());
  // No poison here: the replay reads the committed slot it then overwrites.
  const auto writes = p.replay_commit_writes();
  const Snapshot before = p.host.snapshot();
  const Status status = reference::replay_commit(p.replay_commit());
  if (!status.ok()) RC_FAIL(to_string(status));
  if (const auto changed = changed_outside(p.host, before, writes)) RC_FAIL(*changed);
  const auto got = committed_slots(p);
  RC_ASSERT(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const reference::ErrorStats e = reference::compare(got[i], expected[i]);
    RC_TAG(dtype_name(spec.state_dtype));
    if (!e.pass(state_tolerance(spec.state_dtype)))
      RC_FAIL(fmt::format("written slot {} of {}: {} (tolerance {})", i, got.size(), e.to_string(),
                          state_tolerance(spec.state_dtype)));
  }
}

RC_GTEST_PROP(ReferenceRecords, ReplayCommitOfNothingChangesNothing, ()) {
  CallPlan spec = *gen_commit_problem();
  spec.accepted.assign(spec.row_lengths.size(), 0);
  RecordProblem p = materialize_records(spec, *rc::gen::arbitrary<std::uint64_t>(), gen_layout(spec));
  RC_ASSERT(reference::record_verify(p.record_verify()).ok());
  const Snapshot before = p.host.snapshot();
  RC_ASSERT(reference::replay_commit(p.replay_commit()).ok());
  RC_ASSERT(p.host.snapshot() == before);
}

// Two speculative steps of one batch: the first verified by records (its accepted counts are the
// commit spec's), the second a fresh draft of the same shape. The fused accept_verify on the
// first step's records gives the pool, outputs and records of replay_commit followed by
// record_verify, bit for bit.
RC_GTEST_PROP(ReferenceRecords, AcceptVerifyIsReplayCommitThenRecordVerify, ()) {
  const CallPlan spec = *gen_commit_problem();
  const RecordBufferPlan layout = gen_layout(spec);
  RecordProblem first = materialize_records(spec, *rc::gen::arbitrary<std::uint64_t>(), layout);
  RecordProblem second = materialize_records(spec, *rc::gen::arbitrary<std::uint64_t>(), layout);
  RC_ASSERT(reference::record_verify(first.record_verify()).ok());
  const TensorView prior_accepted = add_index(first.host, "prior_accepted", spec.accepted);

  // The second draft verified from the first problem's pool.
  RecordVerifyCall draft = second.record_verify();
  draft.state = first.host.verify->state;
  const AcceptVerifyCall fused = accept_verify_call(draft, first.records, prior_accepted);

  second.host.poison_outputs();
  const Snapshot first_before = first.host.snapshot(), second_before = second.host.snapshot();
  const Status status = reference::accept_verify(fused);
  if (!status.ok()) RC_FAIL(to_string(status));
  const Snapshot first_fused = first.host.snapshot(), second_fused = second.host.snapshot();

  first.host.restore(first_before);
  second.host.restore(second_before);
  RC_ASSERT(reference::replay_commit(first.replay_commit()).ok());
  RC_ASSERT(reference::record_verify(draft).ok());
  RC_ASSERT(first.host.snapshot() == first_fused);
  RC_ASSERT(second.host.snapshot() == second_fused);
  if (const auto poisoned = still_poisoned(second.record_verify_writes())) RC_FAIL(*poisoned);
}

// ---- refusals ----------------------------------------------------------------------------------

enum class Breakage { steps, rows, prior_accepted, accepted, slot_range, records_over_state, dtype };

void store_i32(const TensorView& t, i64 index, i64 value) {
  const auto v = static_cast<std::int32_t>(value);
  std::memcpy(reinterpret_cast<std::byte*>(*t.data_address()) + index * 4, &v, 4);
}

// A broken index entry goes into memory and into the host copy where there is one, or the host
// copy is dropped (the reference then reads the memory).
void break_index(TensorView& t, i64 index, i64 value, bool drop_copy) {
  store_i32(t, index, value);
  if (drop_copy) t.values.reset();
  else if (t.values) (*t.values)[static_cast<std::size_t>(index)] = value;
}

RC_GTEST_PROP(ReferenceRecords, RefusedCallsTouchNothing, ()) {
  const CallPlan spec = *gen_commit_problem();
  RecordProblem p = materialize_records(spec, *rc::gen::arbitrary<std::uint64_t>(), gen_layout(spec));
  RC_ASSERT(reference::record_verify(p.record_verify()).ok());
  const TensorView prior_accepted = add_index(p.host, "prior_accepted", spec.accepted);
  const i64 n = spec.rows();
  std::vector<i64> active;
  for (i64 r = 0; r < n; ++r)
    if (spec.slot_of_row[r] >= 0) active.push_back(r);

  std::vector<Breakage> usable{Breakage::steps, Breakage::dtype, Breakage::records_over_state};
  if (n >= 1) {
    usable.insert(usable.end(), {Breakage::rows, Breakage::prior_accepted, Breakage::accepted});
  }
  if (!active.empty()) usable.push_back(Breakage::slot_range);
  const Breakage breakage = *rc::gen::elementOf(usable);
  const bool drop_copy = *rc::gen::arbitrary<bool>();

  RecordVerifyCall rv = p.record_verify();
  ReplayCommitCall replay = p.replay_commit();
  AcceptVerifyCall av =
      accept_verify_call(rv, add_record_buffer(p.host, "prior_records", p.records), prior_accepted);

  RuleId rule = RuleId::records_steps;
  Entry entry = *rc::gen::elementOf(std::vector<Entry>{Entry::record_verify, Entry::replay_commit,
                                                       Entry::accept_verify});
  auto each = [&](auto&& f) { f(rv); f(replay); f(av); };
  switch (breakage) {
    case Breakage::steps:
      each([&](auto& c) { c.scalars.draft_token_num = p.records.shape[1] + 1; });
      rule = RuleId::records_steps;
      break;
    case Breakage::rows:
      each([&](auto& c) { c.records->shape[0] = n - 1; });
      rule = RuleId::records_rows;
      break;
    case Breakage::prior_accepted:
      entry = Entry::accept_verify;
      break_index(*av.prior_accepted, *rc::gen::inRange<i64>(0, n),
                  av.prior_records->shape[1] + 1, drop_copy);
      rule = RuleId::accept_prior_accepted;
      break;
    case Breakage::accepted:
      entry = Entry::replay_commit;
      break_index(*replay.accepted, *rc::gen::inRange<i64>(0, n), spec.T + 1, drop_copy);
      rule = RuleId::commit_accepted;
      break;
    case Breakage::slot_range: {
      const i64 r = *rc::gen::elementOf(active);
      TensorView slots = *rv.cache_indices;  // one buffer: each call's view gets the same change
      break_index(slots, r, spec.slots, drop_copy);
      each([&](auto& c) { c.cache_indices = slots; });
      rule = RuleId::index_range;
      break;
    }
    case Breakage::records_over_state:
      each([&](auto& c) {
        c.records->address = c.state->address;
        c.records->storage_offset = Elements{
            c.state->storage_offset.count * element_size(c.state->dtype) / 4};
        c.records->storage_size.reset();
      });
      rule = RuleId::alias_overlap;
      break;
    case Breakage::dtype:
      each([&](auto& c) { c.records->dtype = DType::bf16; });
      rule = RuleId::arg_dtype;
      break;
  }
  RC_TAG(rule_id(rule), entry_name(entry));

  const Snapshot before = p.host.snapshot();
  const Status status = entry == Entry::record_verify   ? reference::record_verify(rv)
                        : entry == Entry::replay_commit ? reference::replay_commit(replay)
                                                        : reference::accept_verify(av);
  if (status.code != StatusCode::rejected)
    RC_FAIL(fmt::format("{} broken by {} was not refused: {}", entry_name(entry), rule_id(rule),
                        to_string(status)));
  if (!status.verdict.breaks(rule))
    RC_FAIL(fmt::format("refused without {}: {}", rule_id(rule), describe(status.verdict)));
  RC_ASSERT(p.host.snapshot() == before);
}

}  // namespace
}  // namespace kdaguard::support
