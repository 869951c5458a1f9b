// fuzz_records: bytes -> the record-based speculative path (record_verify, replay_commit,
// accept_verify; records_case.h). Invariants:
//   contracts cases (a valid record call, maybe a mutation, random edits):
//   - no crash, no ASan or UBSan report; the verdict is deterministic;
//   - every violation names a rule of the entry point, an argument and a message; every deferred
//     check is a value rule;
//   - a mutation with no edits after it is reported as its rule (alone, when exclusive);
//   reference cases (a small commit problem with record buffers, real data):
//   - record_verify's outputs equal single-token decodes bit for bit, and it writes nothing
//     but out and the active rows' records;
//   - replay_commit leaves the state-writing commit's slots within kda-math.md's tolerances and
//     writes nothing else; accept_verify equals replay_commit followed by record_verify.
#include <fmt/format.h>

#include <cstdint>
#include <cstring>

#include "fuzz_chooser.h"
#include "fuzz_failure.h"
#include "kdaguard/contracts/validate.h"
#include "kdaguard/reference.h"
#include "records_case.h"
#include "speculative.h"

namespace kdaguard::support {
namespace {

using i64 = std::int64_t;

void check_contracts(const RecordsCase& c) {
  const CatalogueCall& call = c.call.call;
  const Entry entry = entry_of(call);
  const Verdict verdict = validate(call);
  auto shown = [&] { return describe_catalogue_call(call); };
  if (!same_verdict(verdict, validate(call)))
    fuzz_failure("validate() gave two verdicts for one record call:\n" + shown());
  for (const Violation& v : verdict.violations)
    if (!rule_info(v.rule).applies_to(entry) || v.argument.empty() || v.message.empty())
      fuzz_failure(fmt::format("violation {} ({}) on {}: rule not of this entry point, or no "
                               "argument or message: \"{}\"\n{}",
                               rule_id(v.rule), v.argument, entry_name(entry), v.message, shown()));
  for (const DeferredCheck& d : verdict.deferred)
    if (rule_info(d.rule).tier != Tier::value)
      fuzz_failure(fmt::format("deferred {} is not a value rule\n{}", rule_id(d.rule), shown()));
  if (c.mutation == nullptr || c.edits > 0) return;
  if (!verdict.breaks(c.mutation->rule))
    fuzz_failure(fmt::format("mutation \"{}\" is not reported as {}: {}\n{}", c.mutation->name,
                             rule_id(c.mutation->rule), describe(verdict), shown()));
  if (c.mutation->exclusive)
    for (const Violation& v : verdict.violations)
      if (v.rule != c.mutation->rule)
        fuzz_failure(fmt::format("mutation \"{}\" should break {} alone: {}\n{}", c.mutation->name,
                                 rule_id(c.mutation->rule), describe(verdict), shown()));
}

void expect_ok(const Status& status, const CallPlan& spec, const char* what) {
  if (!status.ok())
    fuzz_failure(fmt::format("{} refused a valid problem: {}\n{}", what, to_string(status), describe(spec)));
}

void check_reference(const RecordsCase& c) {
  const CallPlan& s = c.plan;
  RecordProblem p = materialize_records(s, c.data_seed, c.records);
  const Snapshot fresh = p.host.snapshot();
  DecodeTrace trace;
  expect_ok(decode_each_token(p.host, trace), s, "decode");
  p.host.restore(fresh);
  expect_ok(reference::verify(*p.host.verify), s, "verify");
  expect_ok(reference::commit(*p.host.commit), s, "commit");
  std::vector<std::vector<double>> committed;
  for (const TensorView& slot : p.replay_commit_writes()) committed.push_back(read_floats(slot));
  p.host.restore(fresh);

  // record_verify: the decodes' outputs, only out and active records written.
  // Poisoned: out here, the records since materialize_records (poison_outputs would poison a
  // commit problem's committed slots, which record_verify reads).
  poison(std::vector<TensorView>{*p.host.verify->out});
  const Snapshot before_verify = p.host.snapshot();
  expect_ok(reference::record_verify(p.record_verify()), s, "record_verify");
  const auto verify_writes = p.record_verify_writes();
  if (const auto where = changed_outside(p.host, before_verify, verify_writes))
    fuzz_failure("record_verify wrote outside its outputs: " + *where + "\n" + describe(s));
  if (const auto poisoned = still_poisoned(verify_writes))
    fuzz_failure("record_verify: " + *poisoned + "\n" + describe(s));
  i64 first = 0;
  for (std::size_t n = 0; n < s.row_lengths.size(); ++n) {
    for (i64 t = 0; s.slot_of_row[n] >= 0 && t < s.row_lengths[n]; ++t)
      if (read_floats(slice_rows(*p.host.verify->out, first + t, 1)) != trace.out[n][t])
        fuzz_failure(fmt::format("record_verify row {} step {}: output differs from decoding the "
                                 "token\n{}", n, t, describe(s)));
    first += s.row_lengths[n];
  }

  // replay_commit: the state-writing commit's slots within the tolerance, nothing else written.
  const Snapshot before_replay = p.host.snapshot();
  expect_ok(reference::replay_commit(p.replay_commit()), s, "replay_commit");
  const auto replay_writes = p.replay_commit_writes();
  if (const auto where = changed_outside(p.host, before_replay, replay_writes))
    fuzz_failure("replay_commit wrote outside the accepted rows' slots: " + *where + "\n" + describe(s));
  const double tolerance = s.state_dtype == DType::f32 ? 1e-5 : 1e-2;
  for (std::size_t i = 0; i < replay_writes.size(); ++i) {
    const reference::ErrorStats e = reference::compare(read_floats(replay_writes[i]), committed[i]);
    if (!e.pass(tolerance))
      fuzz_failure(fmt::format("replay_commit slot {} differs from commit: {}\n{}", i,
                               e.to_string(), describe(s)));
  }

  // accept_verify on a copy of these records (the same draft again) against replay_commit then
  // record_verify, from the pool before the replay.
  p.host.restore(before_replay);
  const TensorView prior_records = add_record_buffer(p.host, "prior_records", p.records);
  std::memcpy(p.host.allocation_of(prior_records)->data(), p.host.allocation_of(p.records)->data(),
              p.host.allocation_of(p.records)->bytes());
  const RecordVerifyCall rv = p.record_verify();
  const AcceptVerifyCall fused =
      accept_verify_call(rv, prior_records, add_index(p.host, "prior_accepted", s.accepted));
  const Snapshot before_fused = p.host.snapshot();
  expect_ok(reference::accept_verify(fused), s, "accept_verify");
  const Snapshot fused_result = p.host.snapshot();
  p.host.restore(before_fused);
  expect_ok(reference::replay_commit(p.replay_commit()), s, "replay_commit");
  expect_ok(reference::record_verify(rv), s, "record_verify after replay_commit");
  if (p.host.snapshot() != fused_result)
    fuzz_failure("accept_verify differs from replay_commit then record_verify\n" + describe(s));
}

}  // namespace
}  // namespace kdaguard::support

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kdaguard::support;
  FuzzedDataProvider bytes(data, size);
  FuzzChooser choose(bytes);
  const RecordsCase c = draw_records_case(choose);
  if (c.mode == RecordsMode::contracts) check_contracts(c);
  else check_reference(c);
  return 0;
}
