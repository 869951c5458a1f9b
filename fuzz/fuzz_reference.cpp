// fuzz_reference: bytes -> a small valid host problem (CallPlan, real buffers, random
// non-zero data) -> the f64 CPU reference. Invariants:
//   - prefill: the chunked form (f64, any chunk size, either inverse) equals the per-token
//     recurrence to 1e-10 (rms ratio), and the f32 chunked form to 1e-5 (kda-math.md);
//   - verify: outputs and per-step scratch states equal those of single-token decodes, bit for
//     bit; padding rows output zeros;
//   - commit: the committed slot holds the state after the last accepted decode, bit for bit;
//   - nothing is written outside what the entry point may write.
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_chooser.h"
#include "fuzz_failure.h"
#include "kdaguard/reference.h"
#include "problem.h"
#include "reference_case.h"
#include "speculative.h"

namespace kdaguard::support {
namespace {

using i64 = std::int64_t;

void expect_ok(const Status& status, const CallPlan& spec, const char* what) {
  if (!status.ok())
    fuzz_failure(fmt::format("{} refused a valid problem: {}\n{}", what, to_string(status), describe(spec)));
}

void check_prefill(HostProblem& problem, const reference::ChunkOptions options) {
  const auto& call = std::get<PrefillCall>(problem.call);
  const reference::PrefillResult per_token = reference::prefill_values(call);
  expect_ok(per_token.status, problem.plan, "prefill_values");
  auto compare_with = [&](const reference::PrefillResult& chunked, double tolerance, const char* form) {
    expect_ok(chunked.status, problem.plan, form);
    const auto out = reference::compare(chunked.values.out, per_token.values.out);
    const auto state = reference::compare(chunked.values.final_state, per_token.values.final_state);
    if (!out.pass(tolerance) || !state.pass(tolerance))
      fuzz_failure(fmt::format("{} (chunk {}, {}) differs from per-token f64 beyond {}: out {}, "
                               "final state {}\n{}",
                               form, options.chunk,
                               options.inverse == reference::ChunkInverse::neumann_product ? "neumann" : "substitution",
                               tolerance, out.to_string(), state.to_string(), describe(problem.plan)));
  };
  compare_with(reference::prefill_chunked_values<double>(call, options), 1e-10, "chunked f64");
  if (options.chunk == 16 || options.chunk == 64)
    compare_with(reference::prefill_chunked_values<float>(call, options), 1e-5, "chunked f32");

  // The rounded entry point writes only out and the sequences' slots.
  problem.poison_outputs();
  const Snapshot before = problem.snapshot();
  expect_ok(reference::prefill(call), problem.plan, "prefill");
  if (const auto where = problem.unexpected_writes(before))
    fuzz_failure("prefill wrote outside its outputs: " + *where + "\n" + describe(problem.plan));
}

DecodeTrace decode_each_token(HostProblem& problem) {
  DecodeTrace trace;
  expect_ok(support::decode_each_token(problem, trace), problem.plan, "decode");
  return trace;
}

void check_speculative(HostProblem& problem) {
  const CallPlan& s = problem.plan;
  const Snapshot fresh = problem.snapshot();
  const DecodeTrace trace = decode_each_token(problem);
  problem.restore(fresh);

  // For a verify problem, also: nothing written outside out and the active rows' scratch steps.
  if (s.entry == Entry::verify) problem.poison_outputs();
  const Snapshot before_verify = problem.snapshot();
  expect_ok(reference::verify(*problem.verify), s, "verify");
  if (s.entry == Entry::verify)
    if (const auto where = problem.unexpected_writes(before_verify))
      fuzz_failure("verify wrote outside its outputs: " + *where + "\n" + describe(s));
  if (const auto mismatch = verify_mismatch(problem, trace)) fuzz_failure(*mismatch + "\n" + describe(s));
  if (s.entry != Entry::commit) return;
  problem.poison_outputs();
  const Snapshot before = problem.snapshot();
  expect_ok(reference::commit(*problem.commit), s, "commit");
  if (const auto where = problem.unexpected_writes(before))
    fuzz_failure("commit wrote outside its outputs: " + *where + "\n" + describe(s));
  if (const auto mismatch = commit_mismatch(problem, trace)) fuzz_failure(*mismatch + "\n" + describe(s));
}

}  // namespace
}  // namespace kdaguard::support

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kdaguard::support;
  FuzzedDataProvider bytes(data, size);
  FuzzChooser choose(bytes);
  const ReferenceCase c = draw_reference_case(choose);
  HostProblem problem = materialize(c.plan, c.data_seed);
  if (c.plan.entry == kdaguard::Entry::prefill) check_prefill(problem, c.chunk);
  else check_speculative(problem);
  return 0;
}
