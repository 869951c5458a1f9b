// GPU conformance of the record-based speculative path (contracts/NOTES.md, records): random valid
// record_verify, replay_commit and accept_verify calls on the GPU, against the f64 reference on
// the same bytes and against single-token decodes run on the GPU one call per token.
// - record_verify: outputs and records within kda-math.md's tolerances of the reference, outputs
//   within them of the decodes; every output element written (poisoned first), no other byte
//   changed (pool, padding rows' records, steps past a row's length, the records' padding).
// - replay_commit after record_verify: the written slots within the tolerances of the reference's
//   state-writing verify + commit and of the decodes' state after the last accepted step; only
//   slots of rows that accepted a step change; a commit of 0 accepted steps changes no byte.
// - accept_verify: bit for bit replay_commit followed by record_verify on the GPU, and within the
//   tolerances of the reference's accept_verify on the same prior records.
// - the device guard: a deferred bad prior_accepted value trips accept.prior_accepted and skips
//   exactly its row.
// Index tensors without host copies (the generators draw some) run through the device guard,
// which must stay silent on valid calls.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gen_problem.h"
#include "gpu_support.h"
#include "kdaguard/contracts/value_checks.h"
#include "kdaguard/kda.h"
#include "kdaguard/reference.h"
#include "problem.h"
#include "record_problem.h"
#include "speculative.h"

namespace kdaguard::gputest {
namespace {

using i64 = std::int64_t;
using reference::ErrorStats;
using support::HostProblem;
using support::CallPlan;
using support::RecordProblem;

constexpr Device kGpu{Device::Kind::cuda, 0};

double tolerance(const CallPlan& s) {
  if (s.state_dtype == DType::bf16) return 1e-2;
  const bool all_f32 = s.io_dtype == DType::f32 && s.gate_dtype == DType::f32 &&
                       s.beta_dtype == DType::f32;
  return all_f32 ? 1e-5 : 5e-3;
}

std::string category(const CallPlan& s, const char* what) {
  const bool all_f32 = s.io_dtype == DType::f32 && s.gate_dtype == DType::f32 &&
                       s.beta_dtype == DType::f32;
  return fmt::format("{} | inputs {} state {}", what, all_f32 ? "f32" : "16-bit",
                     dtype_name(s.state_dtype));
}

// The worst error per (comparison, dtype combination), printed when a test ends.
struct Worst {
  long checks = 0;
  double rms_ratio = 0, max_abs = 0;
};
std::map<std::string, Worst>& worst_table() {
  static std::map<std::string, Worst> table;
  return table;
}
void print_worst(const char* test) {
  for (const auto& [name, w] : worst_table())
    std::printf("records %s | %s | checks %ld | worst rms ratio %.3e | worst max abs %.3e\n", test,
                name.c_str(), w.checks, w.rms_ratio, w.max_abs);
  worst_table().clear();
}

void expect_close(const CallPlan& spec, const char* what, const std::vector<double>& got,
                  const std::vector<double>& want) {
  if (got.size() != want.size())
    RC_FAIL(fmt::format("{}: {} values against {}", what, got.size(), want.size()));
  const ErrorStats e = reference::compare(got, want);
  Worst& w = worst_table()[category(spec, what)];
  ++w.checks;
  w.rms_ratio = std::max(w.rms_ratio, e.rms_ratio);
  w.max_abs = std::max(w.max_abs, e.max_abs);
  if (!e.pass(tolerance(spec)))
    RC_FAIL(fmt::format("{}: {} (tolerance {})", what, e.to_string(), tolerance(spec)));
}

std::vector<double> concat(const std::vector<TensorView>& views) {
  std::vector<double> all;
  for (const TensorView& v : views) {
    const std::vector<double> one = support::read_floats(v);
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

// The views of `p` (problems and the device copies of their allocations) moved onto the device.
struct Placed {
  const HostProblem* host;
  const DeviceCopy* copy;
};
template <class Call> Call on_device(Call call, std::initializer_list<Placed> places) {
  call.device = kGpu;
  for_each_argument(call, [&](Arg, OptionalView& v) {
    if (!v) return;
    for (const Placed& p : places)
      if (const support::Allocation* a = p.host->allocation_of(*v)) {
        v->address = p.copy->bases[static_cast<std::size_t>(a - p.host->allocations.data())];
        v->device.reset();
        return;
      }
    throw std::logic_error("on_device: a view outside the problems");
  });
  return call;
}

// The bytes `view` spans, copied from the device copy into the host problem's allocation.
void download_view(HostProblem& p, const DeviceCopy& copy, const TensorView& view) {
  const support::Allocation* a = p.allocation_of(view);
  const auto index = static_cast<std::size_t>(a - p.allocations.data());
  i64 last = 0;
  for (int d = 0; d < view.rank; ++d) last += (view.shape[d] - 1) * view.stride[d];
  const i64 es = element_size(view.dtype);
  const auto begin = static_cast<std::size_t>(*view.data_address() - a->address());
  const auto bytes = static_cast<std::size_t>((last + 1) * es);
  check_cuda(cudaMemcpy(a->data() + begin, reinterpret_cast<const void*>(copy.bases[index] + begin),
                        bytes, cudaMemcpyDeviceToHost),
             "download view");
}

void upload_all(const HostProblem& p, const DeviceCopy& copy) {
  for (std::size_t i = 0; i < p.allocations.size(); ++i)
    check_cuda(cudaMemcpy(reinterpret_cast<void*>(copy.bases[i]), p.allocations[i].data(),
                          p.allocations[i].bytes(), cudaMemcpyHostToDevice),
               "upload");
}

gpu::LaunchOptions options_for(const CallPlan& spec, int chunks_per_block, DeviceArena& arena) {
  gpu::LaunchOptions options;
  options.guard = make_guard(arena, spec.rows() + spec.extra_index_entries);
  options.chunks_per_block = chunks_per_block;
  return options;
}

// Runs launch(), waits, and fails on a refused call or a device guard that fired.
template <class Launch>
void run_checked(const char* what, const gpu::LaunchOptions& options, Launch&& launch) {
  const Status status = launch();
  if (!status.ok()) RC_FAIL(fmt::format("{}: {}", what, to_string(status)));
  check_cuda(cudaDeviceSynchronize(), what);
  if (const std::uint64_t word = read_error_word(options.guard); word != 0)
    RC_FAIL(fmt::format("{}: the device guard fired on a valid call: {}", what, rule_list(word)));
}

// ---- single-token decodes on the GPU --------------------------------------------------------------

// Per active row, per step: the output [HV, V]; and per active row with accepted > 0 the state
// after its last accepted step.
struct GpuDecodeTrace {
  std::vector<std::vector<std::vector<double>>> out;
  std::vector<std::vector<double>> accepted_state;
};

// Decodes every token of every active row of a verify or commit problem on the GPU, one decode
// call per token, on a fresh copy of the problem's bytes (its own upload).
GpuDecodeTrace decode_on_gpu(const CallPlan& spec, std::uint64_t seed, DeviceArena& arena) {
  HostProblem p = support::materialize(spec, seed);
  const VerifyCall& vc = *p.verify;
  const TensorView slot_index = support::add_index(p, "decode_cache_indices", {0});
  p.allocations.emplace_back("decode_out",
                             static_cast<std::size_t>(spec.HV * spec.V * element_size(spec.io_dtype)));
  TensorView out = TensorView::contiguous(spec.io_dtype, {1, spec.HV, spec.V});
  out.address = p.allocations.back().address();
  out.storage_size = Elements{spec.HV * spec.V};
  const DeviceCopy copy = upload(p, arena);
  gpu::LaunchOptions options;
  options.guard = make_guard(arena, 1);

  GpuDecodeTrace trace;
  trace.out.assign(spec.row_lengths.size(), {});
  trace.accepted_state.assign(spec.row_lengths.size(), {});
  i64 first_token = 0;
  for (std::size_t n = 0; n < spec.row_lengths.size(); ++n) {
    const i64 slot = spec.slot_of_row[n];
    for (i64 t = 0; slot >= 0 && t < spec.row_lengths[n]; ++t) {
      TensorView slot_value = slot_index;
      slot_value.values = std::vector<i64>{slot};
      const DecodeCall dc = support::token_decode(vc, first_token + t, vc.state, slot_value, out);
      const auto slot32 = static_cast<std::int32_t>(slot);
      const support::Allocation* index_allocation = p.allocation_of(slot_index);
      check_cuda(cudaMemcpy(reinterpret_cast<void*>(
                                copy.bases[static_cast<std::size_t>(index_allocation - p.allocations.data())]),
                            &slot32, 4, cudaMemcpyHostToDevice),
                 "decode slot");
      const DecodeCall moved = on_device(dc, {Placed{&p, &copy}});
      run_checked("decode", options, [&] { return gpu::decode(moved, options); });
      download_view(p, copy, out);
      trace.out[n].push_back(support::read_floats(out));
      if (t + 1 == spec.accepted[n]) {
        const TensorView slot_view = support::slice_rows(*vc.state, slot, 1);
        download_view(p, copy, slot_view);
        trace.accepted_state[n] = support::read_floats(slot_view);
      }
    }
    first_token += spec.row_lengths[n];
  }
  return trace;
}

// The outputs of the active rows, step by step, in the decode trace's order.
std::vector<double> active_outputs(const HostProblem& p) {
  const CallPlan& s = p.plan;
  std::vector<double> all;
  i64 first = 0;
  for (std::size_t n = 0; n < s.row_lengths.size(); ++n) {
    for (i64 t = 0; s.slot_of_row[n] >= 0 && t < s.row_lengths[n]; ++t) {
      const std::vector<double> one = support::read_floats(support::slice_rows(*p.verify->out, first + t, 1));
      all.insert(all.end(), one.begin(), one.end());
    }
    first += s.row_lengths[n];
  }
  return all;
}
std::vector<double> flatten(const std::vector<std::vector<std::vector<double>>>& steps) {
  std::vector<double> all;
  for (const auto& row : steps)
    for (const auto& step : row) all.insert(all.end(), step.begin(), step.end());
  return all;
}

std::vector<TensorView> records_written(const RecordProblem& p) {
  std::vector<TensorView> writes = p.record_verify_writes();
  writes.erase(writes.begin());  // out
  return writes;
}

// ---- the properties -----------------------------------------------------------------------------

support::GenLimits limits() {
  support::GenLimits l;
  l.max_rows = 12;
  l.max_draft_tokens = 12;  // past the kernel's 8-step batch, so its step loop turns over
  return l;
}

// Record buffers for the plan's rows and steps, laid out as the generated record calls' are.
support::RecordBufferPlan draw_layout(const CallPlan& spec) {
  support::RapidCheckChooser choose;
  return support::draw_record_buffer(spec.rows(), spec.T, choose);
}

// record_verify on the GPU, then (commit specs) replay_commit; both checked as the header says.
void check_record_path(const CallPlan& spec, std::uint64_t seed, int chunks_per_block,
                       const support::RecordBufferPlan& layout, DeviceArena& arena) {
  arena.reset();
  RecordProblem dev = support::materialize_records(spec, seed, layout);
  RecordProblem ref = support::materialize_records(spec, seed, layout);
  // Not poison_outputs(): a commit problem's would poison the slots record_verify reads.
  support::poison(dev.record_verify_writes());
  support::poison(ref.record_verify_writes());
  const support::Snapshot before = dev.host.snapshot();
  const DeviceCopy copy = upload(dev.host, arena);
  const gpu::LaunchOptions options = options_for(spec, chunks_per_block, arena);

  const RecordVerifyCall rv = on_device(dev.record_verify(), {Placed{&dev.host, &copy}});
  run_checked("record_verify", options, [&] { return gpu::record_verify(rv, options); });
  download(dev.host, copy);
  RC_ASSERT(reference::record_verify(ref.record_verify()).ok());

  const std::vector<TensorView> writes = dev.record_verify_writes();
  if (auto stray = support::changed_outside(dev.host, before, writes)) RC_FAIL(*stray);
  if (auto poisoned = support::still_poisoned(writes)) RC_FAIL(*poisoned);
  expect_close(spec, "record_verify out vs reference", support::read_floats(*dev.host.verify->out),
               support::read_floats(*ref.host.verify->out));
  expect_close(spec, "record_verify records vs reference", concat(records_written(dev)),
               concat(records_written(ref)));
  const GpuDecodeTrace decodes = decode_on_gpu(spec, seed, arena);
  expect_close(spec, "record_verify out vs GPU decodes", active_outputs(dev.host),
               flatten(decodes.out));
  if (spec.entry != Entry::commit) return;

  // replay_commit of the accepted prefix; the reference commits its state-writing verify.
  const support::Snapshot verified = dev.host.snapshot();
  const ReplayCommitCall replay = on_device(dev.replay_commit(), {Placed{&dev.host, &copy}});
  run_checked("replay_commit", options, [&] { return gpu::replay_commit(replay, options); });
  download(dev.host, copy);
  const std::vector<TensorView> slots = dev.replay_commit_writes();
  if (auto stray = support::changed_outside(dev.host, verified, slots)) RC_FAIL(*stray);
  if (slots.empty()) RC_ASSERT(dev.host.snapshot() == verified);

  HostProblem state_writing = support::materialize(spec, seed);
  RC_ASSERT(reference::verify(*state_writing.verify).ok());
  RC_ASSERT(reference::commit(*state_writing.commit).ok());
  std::vector<double> got, want, decoded;
  for (std::size_t n = 0; n < spec.row_lengths.size(); ++n) {
    if (spec.slot_of_row[n] < 0 || spec.accepted[n] == 0) continue;
    const std::vector<double> g = support::read_slot(*dev.host.commit->state, spec.slot_of_row[n]);
    const std::vector<double> w = support::read_slot(*state_writing.commit->state, spec.slot_of_row[n]);
    got.insert(got.end(), g.begin(), g.end());
    want.insert(want.end(), w.begin(), w.end());
    decoded.insert(decoded.end(), decodes.accepted_state[n].begin(),
                   decodes.accepted_state[n].end());
  }
  expect_close(spec, "replay_commit state vs reference verify+commit", got, want);
  expect_close(spec, "replay_commit state vs GPU decodes", got, decoded);
}

void check_replay_of_nothing(CallPlan spec, std::uint64_t seed, int chunks_per_block,
                             DeviceArena& arena) {
  arena.reset();
  spec.accepted.assign(spec.row_lengths.size(), 0);
  RecordProblem dev = support::materialize_records(spec, seed);
  const DeviceCopy copy = upload(dev.host, arena);
  const gpu::LaunchOptions options = options_for(spec, chunks_per_block, arena);
  const RecordVerifyCall rv = on_device(dev.record_verify(), {Placed{&dev.host, &copy}});
  run_checked("record_verify", options, [&] { return gpu::record_verify(rv, options); });
  download(dev.host, copy);
  const support::Snapshot verified = dev.host.snapshot();
  const ReplayCommitCall replay = on_device(dev.replay_commit(), {Placed{&dev.host, &copy}});
  run_checked("replay_commit", options, [&] { return gpu::replay_commit(replay, options); });
  download(dev.host, copy);
  RC_ASSERT(dev.host.snapshot() == verified);
}

// Two speculative steps of one batch: the first verified by records on the GPU (its accepted
// counts are the commit spec's), the second a fresh draft of the same shape on the first's pool.
void check_accept_verify(const CallPlan& spec, std::uint64_t seed, std::uint64_t draft_seed,
                         int chunks_per_block, const support::RecordBufferPlan& layout,
                         DeviceArena& arena) {
  arena.reset();
  RecordProblem first = support::materialize_records(spec, seed, layout);
  RecordProblem second = support::materialize_records(spec, draft_seed, layout);
  const TensorView prior_accepted = support::add_index(first.host, "prior_accepted", spec.accepted);
  const DeviceCopy first_copy = upload(first.host, arena);
  const DeviceCopy second_copy = upload(second.host, arena);
  const gpu::LaunchOptions options = options_for(spec, chunks_per_block, arena);
  const std::initializer_list<Placed> both{Placed{&first.host, &first_copy},
                                           Placed{&second.host, &second_copy}};
  const RecordVerifyCall first_verify = on_device(first.record_verify(), both);
  run_checked("record_verify", options, [&] { return gpu::record_verify(first_verify, options); });
  download(first.host, first_copy);

  RecordVerifyCall draft_host = second.record_verify();
  draft_host.state = first.host.verify->state;
  const AcceptVerifyCall fused_host = support::accept_verify_call(draft_host, first.records, prior_accepted);
  const RecordVerifyCall draft = on_device(draft_host, both);
  const AcceptVerifyCall fused = on_device(fused_host, both);

  support::poison(second.record_verify_writes());
  upload_all(second.host, second_copy);
  const support::Snapshot first_before = first.host.snapshot(),
                          second_before = second.host.snapshot();
  // The reference on the same bytes (the GPU's first records).
  RC_ASSERT(reference::accept_verify(fused_host).ok());
  const std::vector<double> ref_out = support::read_floats(*second.host.verify->out);
  const std::vector<double> ref_records = concat(records_written(second));
  std::vector<double> ref_state;
  for (std::size_t n = 0; n < spec.row_lengths.size(); ++n)
    if (spec.slot_of_row[n] >= 0) {
      const auto s = support::read_slot(*first.host.verify->state, spec.slot_of_row[n]);
      ref_state.insert(ref_state.end(), s.begin(), s.end());
    }

  run_checked("accept_verify", options, [&] { return gpu::accept_verify(fused, options); });
  download(first.host, first_copy);
  download(second.host, second_copy);
  const support::Snapshot first_fused = first.host.snapshot(),
                          second_fused = second.host.snapshot();
  if (auto poisoned = support::still_poisoned(second.record_verify_writes())) RC_FAIL(*poisoned);
  std::vector<TensorView> first_writes = first.replay_commit_writes();
  if (auto stray = support::changed_outside(first.host, first_before, first_writes)) RC_FAIL(*stray);
  if (auto stray = support::changed_outside(second.host, second_before, second.record_verify_writes()))
    RC_FAIL(*stray);
  expect_close(spec, "accept_verify out vs reference", support::read_floats(*second.host.verify->out),
               ref_out);
  expect_close(spec, "accept_verify records vs reference", concat(records_written(second)),
               ref_records);
  std::vector<double> state;
  for (std::size_t n = 0; n < spec.row_lengths.size(); ++n)
    if (spec.slot_of_row[n] >= 0) {
      const auto s = support::read_slot(*first.host.verify->state, spec.slot_of_row[n]);
      state.insert(state.end(), s.begin(), s.end());
    }
  expect_close(spec, "accept_verify state vs reference", state, ref_state);

  // The unfused pair on the same bytes must give the same bytes.
  first.host.restore(first_before);
  second.host.restore(second_before);
  upload_all(first.host, first_copy);
  upload_all(second.host, second_copy);
  const ReplayCommitCall replay = on_device(first.replay_commit(), both);
  run_checked("replay_commit", options, [&] { return gpu::replay_commit(replay, options); });
  run_checked("record_verify", options, [&] { return gpu::record_verify(draft, options); });
  download(first.host, first_copy);
  download(second.host, second_copy);
  if (!(first.host.snapshot() == first_fused))
    RC_FAIL("accept_verify's pool or first-step buffers differ from replay_commit's");
  if (!(second.host.snapshot() == second_fused))
    RC_FAIL("accept_verify's outputs or records differ from record_verify's after replay_commit");
}

template <class Body> void run_property(const char* name, int fallback_cases, Body&& body) {
  DeviceArena arena(std::size_t{1} << 30);
  const int rounds = (case_count(fallback_cases) + 99) / 100;
  for (int round = 0; round < rounds; ++round) {
    const bool ok = rc::check(fmt::format("{} (round {})", name, round), [&] { body(arena); });
    EXPECT_TRUE(ok);
    if (!ok) break;
  }
  print_worst(name);
}

// Two speculative steps of a commit spec on the GPU: record_verify and replay_commit of the first
// draft, then accept_verify of a second draft on the same pool, replaying the first's records; on
// `stream` when given (captured), else on the default stream. Returns the pair's bytes afterwards.
std::pair<support::Snapshot, support::Snapshot> two_record_steps(const CallPlan& spec,
                                                                 std::uint64_t seed,
                                                                 DeviceArena& arena,
                                                                 bool captured) {
  arena.reset();
  RecordProblem first = support::materialize_records(spec, seed);
  RecordProblem second = support::materialize_records(spec, seed + 1);
  const TensorView prior_accepted = support::add_index(first.host, "prior_accepted", spec.accepted);
  const DeviceCopy a = upload(first.host, arena), b = upload(second.host, arena);
  const std::initializer_list<Placed> both{Placed{&first.host, &a}, Placed{&second.host, &b}};
  RecordVerifyCall draft = second.record_verify();
  draft.state = first.host.verify->state;
  const RecordVerifyCall rv = on_device(first.record_verify(), both);
  const ReplayCommitCall replay = on_device(first.replay_commit(), both);
  const AcceptVerifyCall fused = on_device(support::accept_verify_call(draft, first.records, prior_accepted), both);
  const gpu::LaunchOptions options = options_for(spec, 0, arena);
  auto steps = [&](cudaStream_t stream) {
    gpu::LaunchOptions on = options;
    on.stream = stream;
    Status s = gpu::record_verify(rv, on);
    if (s.ok()) s = gpu::replay_commit(replay, on);
    if (s.ok()) s = gpu::accept_verify(fused, on);
    return s;
  };
  const Status s = captured ? run_captured(steps) : steps(nullptr);
  if (!s.ok()) RC_FAIL(fmt::format("{} record steps: {}", captured ? "captured" : "direct", to_string(s)));
  check_cuda(cudaDeviceSynchronize(), "record steps");
  if (const std::uint64_t word = read_error_word(options.guard); word != 0)
    RC_FAIL("the device guard fired on a valid call: " + rule_list(word));
  download(first.host, a);
  download(second.host, b);
  return {first.host.snapshot(), second.host.snapshot()};
}

// prepare() readies the three record entry points for capture: right after it (and before any
// uncaptured call of the combination, for every combination this test meets first, since it is
// registered first in this binary) the captured steps run, and give the uncaptured steps' bytes.
TEST(GpuRecords, PreparedCallsCaptureAndReplay) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property("prepared record calls under capture", 20, [](DeviceArena& arena) {
    const CallPlan spec = *support::gen_commit_problem(limits());
    for (Entry e : {Entry::record_verify, Entry::replay_commit, Entry::accept_verify}) {
      const Status s = gpu::prepare(e, spec.K, spec.V, spec.io_dtype, spec.state_dtype, kGpu);
      if (!s.ok()) RC_FAIL(fmt::format("prepare({}): {}", entry_name(e), to_string(s)));
      RC_ASSERT(gpu::prepared(e, spec.K, spec.V, spec.io_dtype, spec.state_dtype, kGpu));
    }
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    const auto captured = two_record_steps(spec, seed, arena, true);
    const auto direct = two_record_steps(spec, seed, arena, false);
    if (!(captured.first == direct.first)) RC_FAIL("the captured steps' pool or first records differ");
    if (!(captured.second == direct.second)) RC_FAIL("the captured steps' outputs or records differ");
  });
}

TEST(GpuRecords, RecordVerifyMatchesReferenceAndDecodes) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property("record_verify", 200, [](DeviceArena& arena) {
    const CallPlan spec = *support::gen_verify_problem(limits());
    check_record_path(spec, *rc::gen::arbitrary<std::uint64_t>(), *rc::gen::inRange(0, 9),
                      draw_layout(spec), arena);
  });
}

TEST(GpuRecords, ReplayCommitMatchesReferenceAndDecodes) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property("record_verify+replay_commit", 200, [](DeviceArena& arena) {
    const CallPlan spec = *support::gen_commit_problem(limits());
    check_record_path(spec, *rc::gen::arbitrary<std::uint64_t>(), *rc::gen::inRange(0, 9),
                      draw_layout(spec), arena);
  });
}

TEST(GpuRecords, ReplayCommitOfNothingChangesNothing) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property("replay_commit of 0", 100, [](DeviceArena& arena) {
    check_replay_of_nothing(*support::gen_commit_problem(limits()),
                            *rc::gen::arbitrary<std::uint64_t>(), *rc::gen::inRange(0, 9), arena);
  });
}

TEST(GpuRecords, AcceptVerifyIsReplayCommitThenRecordVerify) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property("accept_verify", 200, [](DeviceArena& arena) {
    const CallPlan spec = *support::gen_commit_problem(limits());
    check_accept_verify(spec, *rc::gen::arbitrary<std::uint64_t>(),
                        *rc::gen::arbitrary<std::uint64_t>(), *rc::gen::inRange(0, 9),
                        draw_layout(spec), arena);
  });
}

// Batches of serving sizes (the generators stay at 12 rows): B rows of T tokens each, one padding
// row, the rest on distinct slots of a larger pool, accepted counts drawn per row.
CallPlan batch_spec(CallPlan spec, i64 B, i64 T) {
  spec.row_lengths.assign(static_cast<std::size_t>(B), T);
  spec.T = T;
  spec.T_alloc = T;
  spec.S_spec = B;
  spec.explicit_scratch_indices = false;
  spec.scratch_indices.clear();
  spec.row_map = true;
  spec.extra_index_entries = 0;
  spec.slots = B + 3;
  spec.slot_of_row.clear();
  for (i64 n = 0; n < B; ++n) spec.slot_of_row.push_back((n * 7 + 1) % (B + 3));
  spec.slot_of_row[static_cast<std::size_t>(B / 2)] = -1;
  spec.accepted.clear();
  for (i64 n = 0; n < B; ++n) spec.accepted.push_back(*rc::gen::inRange<i64>(0, T + 1));
  return spec;
}

TEST(GpuRecords, ServingBatchSizes) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property("serving batch sizes", 12, [](DeviceArena& arena) {
    const i64 B = *rc::gen::element<i64>(2, 33, 64);
    const i64 T = *rc::gen::element<i64>(2, 4, 8);
    support::GenLimits l = limits();
    l.max_draft_tokens = T;
    const CallPlan spec = batch_spec(*support::gen_commit_problem(l), B, T);
    RC_TAG(B, T, dtype_name(spec.state_dtype));
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    check_record_path(spec, seed, 0, support::compact_records(spec), arena);
    check_accept_verify(spec, seed, seed ^ 0x9e3779b97f4a7c15ull, 0, support::compact_records(spec), arena);
  });
}

// ---- the device guard of accept.prior_accepted ----------------------------------------------------

// A prior_accepted value past prior_records' steps, deferred to the device (no host copy): the
// error word holds accept.prior_accepted alone, the row's outputs stay poisoned and its records
// and slot untouched, and every other row gives what the unbroken call gives.
TEST(GpuRecords, DeferredPriorAcceptedSkipsExactlyItsRow) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  run_property("deferred prior_accepted", 30, [](DeviceArena& arena) {
    const CallPlan spec = batch_spec(*support::gen_commit_problem(limits()), 5,
                                        *rc::gen::inRange<i64>(1, 9));
    const i64 bad_row = *rc::gen::element<i64>(0, 1, 3, 4);  // row 2 is the padding row
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    // One speculative step's pool, prior records (the reference's record_verify) and draft.
    auto run = [&](bool broken, RecordProblem& p, RecordProblem& draft_problem) {
      arena.reset();
      RC_ASSERT(reference::record_verify(p.record_verify()).ok());
      TensorView prior_accepted = support::add_index(p.host, "prior_accepted", spec.accepted);
      if (broken) {
        const auto bad = static_cast<std::int32_t>(p.records.shape[1] + 1);
        std::memcpy(p.host.allocation_of(prior_accepted)->data() + bad_row * 4, &bad, 4);
      }
      prior_accepted.values.reset();  // judged on the device
      support::poison(draft_problem.record_verify_writes());
      const DeviceCopy a = upload(p.host, arena), b = upload(draft_problem.host, arena);
      RecordVerifyCall draft = draft_problem.record_verify();
      draft.state = p.host.verify->state;
      const AcceptVerifyCall fused =
          on_device(support::accept_verify_call(draft, p.records, prior_accepted),
                    {Placed{&p.host, &a}, Placed{&draft_problem.host, &b}});
      gpu::LaunchOptions options;
      options.guard = make_guard(arena, spec.rows());
      const Status s = gpu::accept_verify(fused, options);
      if (!s.ok()) RC_FAIL(to_string(s));
      check_cuda(cudaDeviceSynchronize(), "accept_verify");
      download(p.host, a);
      download(draft_problem.host, b);
      return read_error_word(options.guard);
    };
    RecordProblem clean = support::materialize_records(spec, seed);
    RecordProblem clean_draft = support::materialize_records(spec, seed + 1);
    RecordProblem broken = support::materialize_records(spec, seed);
    RecordProblem broken_draft = support::materialize_records(spec, seed + 1);
    const std::uint64_t clean_word = run(false, clean, clean_draft);
    if (clean_word != 0) RC_FAIL("the guard fired on the unbroken call: " + rule_list(clean_word));
    const std::uint64_t word = run(true, broken, broken_draft);
    if (word != value_checks::rule_bit(RuleId::accept_prior_accepted))
      RC_FAIL("error word " + rule_list(word) + ", expected accept.prior_accepted alone");

    const HostProblem untouched = support::materialize(spec, seed);
    i64 first = 0;
    for (i64 n = 0; n < spec.rows(); ++n) {
      const i64 len = spec.row_lengths[static_cast<std::size_t>(n)];
      const std::vector<double> got =
          support::read_floats(support::slice_rows(*broken_draft.host.verify->out, first, len));
      first += len;
      const i64 slot = spec.slot_of_row[static_cast<std::size_t>(n)];
      if (n != bad_row) {
        RC_ASSERT(got == support::read_floats(
                             support::slice_rows(*clean_draft.host.verify->out, first - len, len)));
        if (slot >= 0)
          RC_ASSERT(support::read_slot(*broken.host.verify->state, slot) ==
                    support::read_slot(*clean.host.verify->state, slot));
        continue;
      }
      if (!std::all_of(got.begin(), got.end(), [](double x) { return std::isnan(x); }))
        RC_FAIL("the skipped row's outputs were written");
      if (support::read_slot(*broken.host.verify->state, slot) !=
          support::read_slot(*untouched.verify->state, slot))
        RC_FAIL("the skipped row's slot changed");
      for (i64 t = 0; t < len; ++t) {
        const std::vector<double> rec = support::read_floats(support::record_at(broken_draft.records, n, t));
        if (!std::all_of(rec.begin(), rec.end(), [](double x) { return std::isnan(x); }))
          RC_FAIL(fmt::format("the skipped row's record of step {} was written", t));
      }
    }
  });
}

}  // namespace
}  // namespace kdaguard::gputest
