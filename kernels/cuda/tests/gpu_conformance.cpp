// GPU conformance: random valid decode, verify and commit calls (the harness's generators) run on
// the GPU and against the f64 reference on the same bytes. Outputs are poisoned first; every
// output element must be written, every byte outside what the entry point may write must be
// bit-identical, and outputs and states must be within kda-math.md's tolerances:
// f32 inputs and state 1e-5, 16-bit inputs with f32 state 5e-3, bf16 state 1e-2.
// Calls whose index tensors carry no host copy run through the device guard, which must stay
// silent on valid calls. Each test prints the worst error it saw per dtype combination.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gen_problem.h"
#include "gpu_support.h"
#include "kdaguard/kda.h"
#include "kdaguard/reference.h"
#include "problem.h"

namespace kdaguard::gputest {
namespace {

using reference::ErrorStats;
using support::HostProblem;
using support::CallPlan;

double tolerance(const CallPlan& s) {
  if (s.state_dtype == DType::bf16) return 1e-2;
  const bool all_f32 = s.io_dtype == DType::f32 && s.gate_dtype == DType::f32 &&
                       s.beta_dtype == DType::f32;
  return all_f32 ? 1e-5 : 5e-3;
}

std::string category(const CallPlan& s) {
  const bool all_f32 = s.io_dtype == DType::f32 && s.gate_dtype == DType::f32 &&
                       s.beta_dtype == DType::f32;
  return fmt::format("{} inputs {} state {}", entry_name(s.entry),
                     all_f32 ? "f32" : "16-bit", dtype_name(s.state_dtype));
}

// The worst errors seen per category, printed when a test ends.
struct Worst {
  long cases = 0, guarded = 0;
  double rms_ratio = 0, max_abs = 0;
  std::string plan;
};
std::map<std::string, Worst>& worst_table() {
  static std::map<std::string, Worst> table;
  return table;
}
void record(const CallPlan& s, const ErrorStats& e) {
  Worst& w = worst_table()[category(s)];
  if (e.rms_ratio > w.rms_ratio || w.plan.empty()) {
    w.rms_ratio = std::max(w.rms_ratio, e.rms_ratio);
    w.plan = support::describe(s);
  }
  w.max_abs = std::max(w.max_abs, e.max_abs);
}
void print_worst(const char* test) {
  for (const auto& [name, w] : worst_table())
    std::printf("conformance %s | %s | cases %ld (device guard %ld) | worst rms ratio %.3e | "
                "worst max abs %.3e\n",
                test, name.c_str(), w.cases, w.guarded, w.rms_ratio, w.max_abs);
  worst_table().clear();
}

std::vector<double> concat_slots(const TensorView& pool, const std::vector<std::int64_t>& slots) {
  std::vector<double> all;
  for (std::int64_t s : slots) {
    const std::vector<double> one = support::read_slot(pool, s);
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

void expect_close(const CallPlan& spec, const char* what, const std::vector<double>& gpu,
                  const std::vector<double>& ref) {
  const ErrorStats e = reference::compare(gpu, ref);
  record(spec, e);
  if (!e.pass(tolerance(spec)))
    RC_FAIL(fmt::format("{}: {} (tolerance {})", what, e.to_string(), tolerance(spec)));
}

// The flat scratch slots verify writes for the plan: active rows, steps within the row, not -1.
std::vector<std::int64_t> written_scratch(const CallPlan& s) {
  std::vector<std::int64_t> slots;
  for (std::int64_t n = 0; n < s.rows(); ++n) {
    if (s.slot_of_row[n] < 0) continue;
    for (std::int64_t t = 0; t < s.row_lengths[n]; ++t) {
      const std::int64_t flat = s.scratch_slot(n, t);
      if (flat >= 0) slots.push_back(flat);
    }
  }
  return slots;
}

const TensorView& out_of(const AnyCall& c) {
  if (const auto* d = std::get_if<DecodeCall>(&c)) return *d->out;
  return *std::get<VerifyCall>(c).out;
}

// One generated spec on the GPU and on the reference; returns after every check passed.
void check_case(const CallPlan& spec, std::uint64_t seed, int chunks_per_block,
                DeviceArena& arena) {
  HostProblem ref = support::materialize(spec, seed);
  HostProblem dev = support::materialize(spec, seed);
  ref.poison_outputs();
  dev.poison_outputs();
  const support::Snapshot before = dev.snapshot();

  arena.reset();
  const DeviceCopy copy = upload(dev, arena);
  const AnyCall call = dev.relocated(dev.call, Device{Device::Kind::cuda, 0}, copy.bases);
  gpu::LaunchOptions options;
  options.guard = make_guard(arena, spec.rows() + spec.extra_index_entries);
  options.chunks_per_block = chunks_per_block;
  const Status status = run_gpu(call, options);
  if (!status.ok()) RC_FAIL(to_string(status));
  check_cuda(cudaDeviceSynchronize(), "kernel");
  download(dev, copy);
  const std::uint64_t word = read_error_word(options.guard);
  if (word != 0) RC_FAIL("the device guard fired on a valid call: " + rule_list(word));

  const Status ref_status = reference::run(ref.call);
  if (!ref_status.ok()) RC_FAIL("reference: " + to_string(ref_status));

  if (auto unwritten = dev.unwritten_outputs()) RC_FAIL("unwritten output: " + *unwritten);
  if (auto stray = dev.unexpected_writes(before)) RC_FAIL("write outside the outputs: " + *stray);

  ++worst_table()[category(spec)].cases;
  if ((spec.values_mask & support::kIndexArgBits) == 0) ++worst_table()[category(spec)].guarded;
  switch (spec.entry) {
    case Entry::decode:
      expect_close(spec, "out", support::read_floats(out_of(dev.call)),
                   support::read_floats(out_of(ref.call)));
      expect_close(spec, "state", support::read_floats(*std::get<DecodeCall>(dev.call).state),
                   support::read_floats(*std::get<DecodeCall>(ref.call).state));
      break;
    case Entry::verify: {
      expect_close(spec, "out", support::read_floats(out_of(dev.call)),
                   support::read_floats(out_of(ref.call)));
      const std::vector<std::int64_t> slots = written_scratch(spec);
      expect_close(spec, "scratch", concat_slots(*dev.verify->scratch, slots),
                   concat_slots(*ref.verify->scratch, slots));
      // The chain a serving step runs: commit the accepted prefix of this verify.
      const AnyCall commit = dev.relocated(AnyCall{*dev.commit}, Device{Device::Kind::cuda, 0}, copy.bases);
      const Status commit_status = run_gpu(commit, options);
      if (!commit_status.ok()) RC_FAIL("commit: " + to_string(commit_status));
      check_cuda(cudaDeviceSynchronize(), "commit kernel");
      download(dev, copy);
      if (const std::uint64_t w = read_error_word(options.guard); w != 0)
        RC_FAIL("the device guard fired on a valid commit: " + rule_list(w));
      const Status ref_commit = reference::commit(*ref.commit);
      if (!ref_commit.ok()) RC_FAIL("reference commit: " + to_string(ref_commit));
      expect_close(spec, "state after commit", support::read_floats(*dev.commit->state),
                   support::read_floats(*ref.commit->state));
      break;
    }
    case Entry::commit: {
      // A commit copies bytes: the pool must equal the reference's bit for bit.
      const std::vector<double> got = support::read_floats(*dev.commit->state);
      const std::vector<double> want = support::read_floats(*ref.commit->state);
      RC_ASSERT(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))))
          RC_FAIL(fmt::format("pool element {}: {} vs {}", i, got[i], want[i]));
      record(spec, ErrorStats{});
      break;
    }
    case Entry::prefill: RC_FAIL("prefill is not a recurrent-kernel case");
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: RC_FAIL("the record-based path has no GPU kernels yet");
  }
}

support::GenLimits limits() {
  support::GenLimits l;
  l.max_rows = 12;          // decode draws up to 24 rows
  l.max_draft_tokens = 12;  // past verify's 8-token batch, so the step loop turns over
  return l;
}

void run_property(Entry entry, const char* name) {
  DeviceArena arena(std::size_t{1} << 30);
  const int rounds = (case_count(300) + 99) / 100;
  for (int round = 0; round < rounds; ++round) {
    const bool ok = rc::check(fmt::format("{} matches the f64 reference (round {})", name, round),
                              [&] {
                                const CallPlan spec = *support::gen_problem(entry, limits());
                                const auto seed = *rc::gen::arbitrary<std::uint64_t>();
                                const int chunks_per_block = *rc::gen::inRange(0, 9);
                                check_case(spec, seed, chunks_per_block, arena);
                              });
    EXPECT_TRUE(ok);
    if (!ok) break;
  }
  print_worst(name);
}

TEST(GpuConformance, DecodeMatchesReference) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property(Entry::decode, "decode");
}

TEST(GpuConformance, VerifyAndCommitMatchReference) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property(Entry::verify, "verify+commit");
}

TEST(GpuConformance, CommitCopiesTheAcceptedStep) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property(Entry::commit, "commit");
}

}  // namespace
}  // namespace kdaguard::gputest
