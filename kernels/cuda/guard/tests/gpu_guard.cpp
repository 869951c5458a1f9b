// The CUDA entry points in front of bad calls and hostile index values:
// - every catalogue mutation is refused before any launch, naming its rule (no GPU needed);
// - a refused call leaves every device byte bit-identical;
// - index values the host never saw are judged on the device: the rule's bit is set in the
//   error word, the offending rows are skipped (outputs still poisoned, slots untouched) and the
//   other rows still run;
// - deferred checks without a guard are refused; the launch path is CUDA-graph capturable.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "gpu_support.h"
#include "kdaguard/contracts/validate.h"
#include "kdaguard/contracts/value_checks.h"
#include "kdaguard/kda.h"
#include "kdaguard/reference.h"
#include "mutations.h"
#include "problem.h"

namespace kdaguard::gputest {
namespace {

using support::HostProblem;
using support::CallPlan;

constexpr Device kGpu{Device::Kind::cuda, 0};

// ---- refusals -----------------------------------------------------------------------------------

TEST(GpuRefusal, EveryMutationIsRefusedWithItsRule) {
  int refused = 0, deferred = 0;
  for (const support::Mutation& m : support::mutation_table()) {
    for (Entry e : {Entry::decode, Entry::verify, Entry::commit}) {
      if (!m.applies_to(e)) continue;
      for (std::uint64_t seed = 1; seed <= 5; ++seed) {
        support::SeededChooser choose(seed * 7919 + static_cast<std::uint64_t>(m.rule));
        const support::GeneratedCall g = support::mutated_call(m, e, choose);
        // A value rule whose values carry no host copy is the device guard's, not the host's.
        if (validate(g.call).accepted()) {
          ++deferred;
          continue;
        }
        // The call's addresses are fake: a launch would fault, so being refused is the test.
        const Status s = run_gpu(g.call, {});
        ASSERT_EQ(s.code, StatusCode::rejected)
            << m.name << " on " << entry_name(e) << ": " << to_string(s);
        EXPECT_TRUE(s.verdict.breaks(m.rule))
            << m.name << " on " << entry_name(e) << " did not report " << rule_id(m.rule) << ":\n"
            << s.detail;
        ++refused;
      }
    }
  }
  std::printf("refusals: %d mutated calls refused, %d left to the device guard\n", refused,
              deferred);
  EXPECT_GT(refused, 100);
}

// A small valid problem of each entry point (host copies of the index values unless asked).
CallPlan small_spec(Entry entry, bool host_values) {
  CallPlan s;
  s.entry = entry;
  s.H = 2;
  s.HV = 4;
  s.K = 128;
  s.V = 64;
  s.io_dtype = DType::bf16;
  s.gate_dtype = DType::bf16;
  s.beta_dtype = DType::f32;
  s.state_dtype = DType::f32;
  s.use_qk_l2norm = true;
  s.set_all_values(host_values);
  s.cu_seqlens = entry != Entry::decode;
  if (entry == Entry::decode) {
    s.row_lengths = {1, 1, 1, 1, 1};
    s.slot_of_row = {3, 0, -1, 5, 1};
    s.slots = 7;
  } else {
    s.T = 4;
    s.T_alloc = 5;
    s.S_spec = 5;
    s.row_lengths = {4, 2, 3, 4};
    s.slot_of_row = {2, -1, 0, 4};
    s.slots = 6;
    s.accepted = {3, 0, 2, 4};
  }
  return s;
}

struct OnDevice {
  HostProblem host;
  DeviceCopy copy;
  AnyCall call;
  support::Snapshot before;
};

OnDevice put_on_device(const CallPlan& spec, DeviceArena& arena,
                       const std::function<void(HostProblem&)>& corrupt = {}) {
  OnDevice d{support::materialize(spec, 20260101), {}, {}, {}};
  if (corrupt) corrupt(d.host);
  d.host.poison_outputs();
  d.before = d.host.snapshot();
  d.copy = upload(d.host, arena);
  d.call = d.host.relocated(d.host.call, kGpu, d.copy.bases);
  return d;
}

TEST(GpuRefusal, RefusedCallTouchesNoDeviceByte) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  struct Breakage {
    const char* name;
    Entry entry;
    RuleId rule;
    std::function<void(AnyCall&)> apply;
  };
  const Breakage breakages[] = {
      {"out dtype", Entry::decode, RuleId::arg_dtype,
       [](AnyCall& c) { std::get<DecodeCall>(c).out->dtype = DType::f16; }},
      {"state inner stride", Entry::decode, RuleId::state_inner_strides,
       [](AnyCall& c) { std::get<DecodeCall>(c).state->stride[2] += 16; }},
      {"duplicate slot (host copy)", Entry::decode, RuleId::index_unique,
       [](AnyCall& c) { (*std::get<DecodeCall>(c).cache_indices->values)[3] = 3; }},
      {"T past scratch steps", Entry::verify, RuleId::verify_scratch_steps,
       [](AnyCall& c) { std::get<VerifyCall>(c).scalars.draft_token_num = 6; }},
      {"row longer than T (host copy)", Entry::verify, RuleId::verify_row_length,
       [](AnyCall& c) { std::get<VerifyCall>(c).scalars.draft_token_num = 3; }},
      {"accepted past T (host copy)", Entry::commit, RuleId::commit_accepted,
       [](AnyCall& c) { (*std::get<CommitCall>(c).accepted->values)[1] = 5; }},
  };
  for (const Breakage& b : breakages) {
    arena.reset();
    OnDevice d = put_on_device(small_spec(b.entry, true), arena);
    b.apply(d.call);
    const Status s = run_gpu(d.call, {});
    EXPECT_EQ(s.code, StatusCode::rejected) << b.name << ": " << to_string(s);
    EXPECT_TRUE(s.verdict.breaks(b.rule)) << b.name << ": " << s.detail;
    check_cuda(cudaDeviceSynchronize(), "sync");
    download(d.host, d.copy);
    EXPECT_TRUE(d.host.snapshot() == d.before) << b.name << ": a refused call wrote memory";
  }
}

TEST(GpuRefusal, DeferredChecksNeedAGuard) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  OnDevice d = put_on_device(small_spec(Entry::decode, false), arena);
  const Status s = run_gpu(d.call, {});
  EXPECT_EQ(s.code, StatusCode::unsupported) << to_string(s);
  EXPECT_NE(s.detail.find("index.range"), std::string::npos) << s.detail;
  gpu::LaunchOptions no_word;
  no_word.guard = make_guard(arena, 8);
  no_word.guard.error_word = nullptr;  // row flags alone report nothing
  EXPECT_EQ(run_gpu(d.call, no_word).code, StatusCode::unsupported);
  check_cuda(cudaDeviceSynchronize(), "sync");
  download(d.host, d.copy);
  EXPECT_TRUE(d.host.snapshot() == d.before);
  // Decode judges its rows in its own prologue: an error word is all the guard it needs.
  gpu::LaunchOptions word_only;
  word_only.guard = make_guard(arena, 1);
  word_only.guard.row_flags = nullptr;
  word_only.guard.row_flags_capacity = 0;
  EXPECT_TRUE(run_gpu(d.call, word_only).ok());
  check_cuda(cudaDeviceSynchronize(), "sync");
  EXPECT_EQ(read_error_word(word_only.guard), 0u);
}

// ---- the device guard ---------------------------------------------------------------------------

// The host copy of an index tensor of a problem (its view points into host memory).
std::int32_t* host_index(const OptionalView& view, std::int64_t i) {
  return reinterpret_cast<std::int32_t*>(*view->data_address()) + i;
}

bool all_nan(const std::vector<double>& values) {
  for (double v : values)
    if (!std::isnan(v)) return false;
  return !values.empty();
}
bool none_nan(const std::vector<double>& values) {
  for (double v : values)
    if (std::isnan(v)) return false;
  return true;
}

struct GuardedRun {
  OnDevice d;
  std::uint64_t word = 0;
};

GuardedRun run_guarded(const CallPlan& spec, DeviceArena& arena,
                       const std::function<void(HostProblem&)>& corrupt) {
  arena.reset();
  GuardedRun r{put_on_device(spec, arena, corrupt)};
  gpu::LaunchOptions options;
  options.guard = make_guard(arena, spec.rows() + spec.extra_index_entries);
  const Status s = run_gpu(r.d.call, options);
  EXPECT_TRUE(s.ok()) << to_string(s);
  check_cuda(cudaDeviceSynchronize(), "guarded kernel");
  download(r.d.host, r.d.copy);
  r.word = read_error_word(options.guard);
  return r;
}

const TensorView& decode_out(HostProblem& p) { return *std::get<DecodeCall>(p.call).out; }
const TensorView& decode_state(HostProblem& p) { return *std::get<DecodeCall>(p.call).state; }

TEST(GpuGuard, DecodeSlotOutOfRangeSkipsTheRow) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  const CallPlan spec = small_spec(Entry::decode, false);
  GuardedRun r = run_guarded(spec, arena, [](HostProblem& p) {
    *host_index(std::get<DecodeCall>(p.call).cache_indices, 3) = 1 << 20;  // S = 7
  });
  EXPECT_EQ(r.word, value_checks::rule_bit(RuleId::index_range)) << rule_list(r.word);
  EXPECT_TRUE(all_nan(support::read_floats(support::slice_rows(decode_out(r.d.host), 3, 1))));
  for (int row : {0, 1, 2, 4})
    EXPECT_TRUE(none_nan(support::read_floats(support::slice_rows(decode_out(r.d.host), row, 1))))
        << "row " << row << " should have run";
}

TEST(GpuGuard, DecodeRepeatedSlotSkipsBothRows) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  const CallPlan spec = small_spec(Entry::decode, false);
  GuardedRun r = run_guarded(spec, arena, [](HostProblem& p) {
    *host_index(std::get<DecodeCall>(p.call).cache_indices, 4) = 3;  // row 0 has slot 3
  });
  EXPECT_EQ(r.word, value_checks::rule_bit(RuleId::index_unique)) << rule_list(r.word);
  HostProblem pristine = support::materialize(spec, 20260101);
  for (int row : {0, 4})
    EXPECT_TRUE(all_nan(support::read_floats(support::slice_rows(decode_out(r.d.host), row, 1))));
  EXPECT_EQ(support::read_slot(decode_state(r.d.host), 3),
            support::read_slot(decode_state(pristine), 3));
  EXPECT_TRUE(none_nan(support::read_floats(support::slice_rows(decode_out(r.d.host), 1, 1))));
}

TEST(GpuGuard, DecodeCuSeqlensNotOnePerRow) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  CallPlan spec = small_spec(Entry::decode, false);
  spec.cu_seqlens = true;
  GuardedRun r = run_guarded(spec, arena, [](HostProblem& p) {
    *host_index(std::get<DecodeCall>(p.call).cu_seqlens, 2) = 3;
  });
  EXPECT_EQ(r.word, value_checks::rule_bit(RuleId::decode_one_token)) << rule_list(r.word);
}

TEST(GpuGuard, VerifyBadSeqlensNeverReadPastTheTokens) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  const CallPlan spec = small_spec(Entry::verify, false);
  // cu_seqlens[N] one past T_tot: the last row would read a token that does not exist.
  GuardedRun r = run_guarded(spec, arena, [](HostProblem& p) {
    *host_index(std::get<VerifyCall>(p.call).cu_seqlens, 4) += 1;
  });
  EXPECT_EQ(r.word, value_checks::rule_bit(RuleId::seqlens_total)) << rule_list(r.word);
  // An offset below its predecessor: the rows on both sides of it are seqlens.monotone's alone.
  r = run_guarded(spec, arena, [](HostProblem& p) {
    const auto& cu = std::get<VerifyCall>(p.call).cu_seqlens;
    *host_index(cu, 1) = -2;  // row 0 ends before it starts, row 1 starts below 0
  });
  EXPECT_EQ(r.word, value_checks::rule_bit(RuleId::seqlens_monotone)) << rule_list(r.word);
  const TensorView& out = *std::get<VerifyCall>(r.d.host.call).out;
  EXPECT_TRUE(all_nan(support::read_floats(support::slice_rows(out, 0, 4))));
}

TEST(GpuGuard, VerifyRowMapMustBeIdentity) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  const CallPlan spec = small_spec(Entry::verify, false);
  GuardedRun r = run_guarded(spec, arena, [](HostProblem& p) {
    *host_index(std::get<VerifyCall>(p.call).scratch_row_map, 2) = 0;
  });
  EXPECT_EQ(r.word, value_checks::rule_bit(RuleId::verify_row_map_identity)) << rule_list(r.word);
  // Row 2 (tokens 6..8) was skipped; row 0 ran.
  const TensorView& out = *std::get<VerifyCall>(r.d.host.call).out;
  EXPECT_TRUE(all_nan(support::read_floats(support::slice_rows(out, 6, 3))));
  EXPECT_TRUE(none_nan(support::read_floats(support::slice_rows(out, 0, 4))));
}

TEST(GpuGuard, VerifyScratchIndexOutOfRange) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  CallPlan spec = small_spec(Entry::verify, false);
  std::vector<std::int64_t> indices(4 * 4);
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<std::int64_t>(i) + 3;
  spec.explicit_scratch_indices = true;
  spec.scratch_indices = indices;
  GuardedRun r = run_guarded(spec, arena, [](HostProblem& p) {
    *host_index(std::get<VerifyCall>(p.call).scratch_indices, 5) = 25;  // S_spec*T_alloc = 25
  });
  EXPECT_EQ(r.word, value_checks::rule_bit(RuleId::index_range)) << rule_list(r.word);
}

TEST(GpuGuard, CommitAcceptedPastT) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  const CallPlan spec = small_spec(Entry::commit, false);
  GuardedRun r = run_guarded(spec, arena, [](HostProblem& p) {
    *host_index(std::get<CommitCall>(p.call).accepted, 3) = 9;
  });
  EXPECT_EQ(r.word, value_checks::rule_bit(RuleId::commit_accepted)) << rule_list(r.word);
  // Row 3 (slot 4) was skipped: still poisoned. Rows 0 and 2 committed.
  const TensorView& pool = *std::get<CommitCall>(r.d.host.call).state;
  EXPECT_TRUE(all_nan(support::read_slot(pool, 4)));
  EXPECT_TRUE(none_nan(support::read_slot(pool, 2)));
  EXPECT_TRUE(none_nan(support::read_slot(pool, 0)));
}

// ---- CUDA graphs --------------------------------------------------------------------------------

TEST(GpuGraph, DecodeAndVerifyCaptureAndReplay) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  DeviceArena arena(std::size_t{64} << 20);
  for (Entry entry : {Entry::decode, Entry::verify}) {
    for (bool host_values : {true, false}) {
      arena.reset();
      const CallPlan spec = small_spec(entry, host_values);
      OnDevice d = put_on_device(spec, arena);
      gpu::LaunchOptions options;
      options.guard = make_guard(arena, spec.rows());
      OnDevice warm_up = put_on_device(spec, arena);  // the uncaptured first call kda.h asks for
      ASSERT_TRUE(run_gpu(warm_up.call, options).ok());
      check_cuda(cudaDeviceSynchronize(), "warm-up");
      const Status s = run_captured([&](cudaStream_t stream) {
        gpu::LaunchOptions captured = options;
        captured.stream = stream;
        return run_gpu(d.call, captured);
      });
      ASSERT_TRUE(s.ok()) << to_string(s);
      download(d.host, d.copy);
      EXPECT_EQ(read_error_word(options.guard), 0u);

      HostProblem ref = support::materialize(spec, 20260101);
      ref.poison_outputs();
      ASSERT_TRUE(reference::run(ref.call).ok());
      const TensorView& got = entry == Entry::decode ? *std::get<DecodeCall>(d.host.call).out
                                                     : *std::get<VerifyCall>(d.host.call).out;
      const TensorView& want = entry == Entry::decode ? *std::get<DecodeCall>(ref.call).out
                                                      : *std::get<VerifyCall>(ref.call).out;
      const auto e = reference::compare(support::read_floats(got), support::read_floats(want));
      EXPECT_TRUE(e.pass(5e-3)) << entry_name(entry) << ": " << e.to_string();
    }
  }
}

}  // namespace
}  // namespace kdaguard::gputest
