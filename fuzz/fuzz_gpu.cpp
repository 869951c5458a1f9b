// fuzz_gpu: bytes -> a problem of any entry point (gpu_case.h) -> the CUDA kernels (gpu::*) and
// the f64 CPU reference on the same bytes. The record-based entry points run on their plan's
// verify or commit problem with record buffers: replay_commit on the records the reference's
// record_verify wrote for the plan's draft, accept_verify on those as prior records (the plan's
// accepted counts as prior_accepted) with its own records in a second buffer. Every buffer is uploaded into one device image with
// 256-byte red zones around each allocation. Invariants, per mode (byte 0):
//   conformance: the call is accepted and runs; the device guard (index values without host
//     copies) stays silent; every output element was written (outputs are poisoned first);
//     outputs and states agree with the reference within kda-math.md's tolerances (f32 inputs
//     and state 1e-5, 16-bit inputs with an f32 state 5e-3, a bf16 state 1e-2; commit copies bit
//     for bit); every other byte of every buffer, and every red-zone byte, is unchanged. A verify
//     is followed by the commit of its accepted prefix, compared the same way.
//   planted: bad index values that only the device sees: the error word equals the value rules
//     of the host verdict for the same values (the call with those values as host copies); the
//     rows those values break are skipped (their outputs stay poisoned, their slots untouched);
//     every other row matches the reference of the problem before planting; nothing else changed.
// A machine without an sm_90 GPU has nothing to fuzz: the target says so and exits with 77 (the
// corpus test's skip code).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_chooser.h"
#include "fuzz_failure.h"
#include "gpu_case.h"
#include "gpu_support.h"
#include "kdaguard/contracts/row_rules.h"
#include "kdaguard/contracts/validate.h"
#include "kdaguard/contracts/value_checks.h"
#include "kdaguard/kda.h"
#include "kdaguard/reference.h"
#include "problem.h"
#include "record_problem.h"
#include "speculative.h"

namespace kdaguard::support {
namespace {

using i64 = std::int64_t;
using reference::ErrorStats;

constexpr Device kGpu{Device::Kind::cuda, 0};

// ---- the device image ---------------------------------------------------------------------------

constexpr std::size_t kRedZone = 256;
constexpr std::byte kRedZoneByte{0xA5};

gputest::DeviceArena& arena() {
  static gputest::DeviceArena a(std::size_t{512} << 20);
  return a;
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fuzz_failure(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

// Every allocation of a problem at its own offset in one device buffer, red zones between.
struct DeviceImage {
  std::byte* base = nullptr;
  std::size_t extent = 0;
  std::vector<std::size_t> offsets;
  std::vector<std::uint64_t> bases;  // device address of each allocation
  gpu::DeviceGuard guard;
};

DeviceImage upload(const HostProblem& p) {
  arena().reset();
  DeviceImage image;
  std::size_t at = kRedZone;
  for (const Allocation& a : p.allocations) {
    image.offsets.push_back(at);
    at = (at + a.bytes() + kRedZone + 255) / 256 * 256;
  }
  image.extent = at;
  image.base = static_cast<std::byte*>(arena().allocate(image.extent));
  std::vector<std::byte> host(image.extent, kRedZoneByte);
  for (std::size_t i = 0; i < p.allocations.size(); ++i) {
    std::memcpy(host.data() + image.offsets[i], p.allocations[i].data(), p.allocations[i].bytes());
    image.bases.push_back(reinterpret_cast<std::uint64_t>(image.base + image.offsets[i]));
  }
  cuda_ok(cudaMemcpy(image.base, host.data(), image.extent, cudaMemcpyHostToDevice), "upload");
  image.guard = gputest::make_guard(arena(), std::max<i64>(p.plan.rows() + p.plan.extra_index_entries, 1));
  return image;
}

// Copies the allocations back into p; the first red-zone byte that changed, or nullopt.
std::optional<std::string> download(HostProblem& p, const DeviceImage& image) {
  std::vector<std::byte> host(image.extent);
  cuda_ok(cudaMemcpy(host.data(), image.base, image.extent, cudaMemcpyDeviceToHost), "download");
  std::optional<std::string> stray;
  std::size_t zone_begin = 0;
  for (std::size_t i = 0; i <= p.allocations.size(); ++i) {
    const std::size_t zone_end = i < p.allocations.size() ? image.offsets[i] : image.extent;
    for (std::size_t b = zone_begin; b < zone_end && !stray; ++b)
      if (host[b] != kRedZoneByte)
        stray = fmt::format("red-zone byte {} before {} changed to {:#04x}", b - zone_begin,
                            i < p.allocations.size() ? p.allocations[i].name() : "the image's end",
                            static_cast<unsigned>(host[b]));
    if (i == p.allocations.size()) break;
    std::memcpy(p.allocations[i].data(), host.data() + image.offsets[i], p.allocations[i].bytes());
    zone_begin = image.offsets[i] + p.allocations[i].bytes();
  }
  return stray;
}

// The CUDA entry point of each call type.
struct RunOnGpu {
  const gpu::LaunchOptions& options;
  Status operator()(const DecodeCall& c) const { return gpu::decode(c, options); }
  Status operator()(const PrefillCall& c) const { return gpu::prefill(c, options); }
  Status operator()(const VerifyCall& c) const { return gpu::verify(c, options); }
  Status operator()(const CommitCall& c) const { return gpu::commit(c, options); }
  Status operator()(const RecordVerifyCall& c) const { return gpu::record_verify(c, options); }
  Status operator()(const ReplayCommitCall& c) const { return gpu::replay_commit(c, options); }
  Status operator()(const AcceptVerifyCall& c) const { return gpu::accept_verify(c, options); }
};

// Runs `call` (host addresses of p) on the image; returns the error word.
std::uint64_t run_on_device(const HostProblem& p, const CatalogueCall& call, const DeviceImage& image,
                            int chunks_per_block, std::string_view what) {
  gpu::LaunchOptions options;
  options.guard = image.guard;
  options.chunks_per_block = chunks_per_block;
  const Status status = std::visit(RunOnGpu{options}, p.relocated(call, kGpu, image.bases));
  if (!status.ok())
    fuzz_failure(fmt::format("{} refused on the GPU: {}\n{}", what, to_string(status), describe(p.plan)));
  cuda_ok(cudaDeviceSynchronize(), std::string(what).c_str());
  return gputest::read_error_word(image.guard);
}

// ---- the problem of a case ------------------------------------------------------------------------

// A case's problem and the call under test over its buffers (see the header for the record-based
// entry points' buffers).
struct CaseProblem {
  RecordProblem rp;  // rp.records: an empty view for the four state-writing entry points
  std::optional<TensorView> next_records;  // accept_verify's records of its new draft
  CatalogueCall call;
};

// The case's problem and call; every check builds its problems with it.
CaseProblem build_problem(const GpuCase& c) {
  if (!is_record_entry(c.entry)) {
    CaseProblem cp{RecordProblem{materialize(c.plan, c.data_seed), {}}, std::nullopt, {}};
    cp.call = widen(cp.rp.host.call);
    return cp;
  }
  CaseProblem cp{materialize_records(c.plan, c.data_seed, c.records), std::nullopt, {}};
  RecordProblem& rp = cp.rp;
  if (c.entry == Entry::record_verify) {
    cp.call = rp.record_verify();
    return cp;
  }
  const Status drafted = reference::record_verify(rp.record_verify());
  if (!drafted.ok())
    fuzz_failure(fmt::format("reference record_verify of the draft: {}\n{}", to_string(drafted), describe(c.plan)));
  if (c.entry == Entry::replay_commit) {
    cp.call = rp.replay_commit();
    return cp;
  }
  TensorView prior_accepted = add_index(rp.host, "prior_accepted", c.plan.accepted);
  if (!c.prior_accepted_values) prior_accepted.values.reset();
  cp.next_records = add_record_buffer(rp.host, "next_records", rp.records);
  poison(std::vector<TensorView>{*cp.next_records});
  RecordVerifyCall draft = rp.record_verify();
  draft.records = *cp.next_records;
  cp.call = accept_verify_call(draft, rp.records, prior_accepted);
  return cp;
}

// What row n of the case's call writes, as views of its problem: its tokens' rows of out (padding
// rows write zeros), and its slots as HostProblem::slots_written_by_row() gives them for the four
// state-writing entry points (replay_commit writes commit's); record_verify its records,
// accept_verify its slot and its new records (active rows only).
void row_writes(const CaseProblem& cp, const GpuCase& c, std::int64_t n, std::vector<TensorView>& regions) {
  const CallPlan& s = c.plan;
  const HostProblem& p = cp.rp.host;
  std::int64_t first = 0;
  for (std::int64_t m = 0; m < n; ++m) first += s.row_lengths[m];
  const std::int64_t length = s.row_lengths[n], slot_index = s.slot_of_row[n];
  auto tokens = [&](const TensorView& out) {
    for (std::int64_t t = first; t < first + length; ++t) regions.push_back(slice_rows(out, t, 1));
  };
  auto slots = [&] {
    for (const WrittenRegion& r : p.slots_written_by_row(n)) regions.push_back(r.view);
  };
  auto records = [&](const TensorView& buffer) {
    for (std::int64_t t = 0; slot_index >= 0 && t < length; ++t) regions.push_back(record_at(buffer, n, t));
  };
  switch (c.entry) {
    case Entry::decode:
      tokens(*std::get<DecodeCall>(p.call).out);
      slots();
      break;
    case Entry::prefill:
      tokens(*std::get<PrefillCall>(p.call).out);
      slots();
      break;
    case Entry::verify:
      tokens(*p.verify->out);
      slots();
      break;
    case Entry::commit:
    case Entry::replay_commit: slots(); break;
    case Entry::record_verify:
      tokens(*p.verify->out);
      records(cp.rp.records);
      break;
    case Entry::accept_verify:
      tokens(*p.verify->out);
      if (slot_index >= 0) regions.push_back(slice_rows(flat_pool(*p.verify->state), slot_index, 1));
      records(*cp.next_records);
      break;
  }
}

// ---- tolerances ---------------------------------------------------------------------------------

double tolerance(const CallPlan& s) {
  if (s.state_dtype == DType::bf16) return 1e-2;
  const bool all_f32 = s.io_dtype == DType::f32 && s.gate_dtype == DType::f32 && s.beta_dtype == DType::f32;
  return all_f32 ? 1e-5 : 5e-3;
}

std::string describe(const GpuCase& c) {
  return is_record_entry(c.entry) ? fmt::format("{} on the {}", entry_name(c.entry), describe(c.plan))
                                  : describe(c.plan);
}

void expect_close(const GpuCase& c, std::string_view what, const std::vector<double>& got,
                  const std::vector<double>& want) {
  const ErrorStats e = reference::compare(got, want);
  if (!e.pass(tolerance(c.plan)))
    fuzz_failure(fmt::format("{} differs from the f64 reference: {} (tolerance {})\n{}", what,
                             e.to_string(), tolerance(c.plan), describe(c)));
}

void expect_identical(const GpuCase& c, std::string_view what, const std::vector<double>& got,
                      const std::vector<double>& want) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))))
      fuzz_failure(fmt::format("{} element {}: {} on the GPU, {} in the reference\n{}", what, i,
                               got[i], want[i], describe(c)));
}

void expect_status(const Status& s, const CallPlan& spec, const char* what) {
  if (!s.ok()) fuzz_failure(fmt::format("{}: {}\n{}", what, to_string(s), describe(spec)));
}

// ---- conformance --------------------------------------------------------------------------------

// Poisons what the case's call writes as outputs: out, and (already, at their allocation) the
// records the call writes.
void poison_outputs(CaseProblem& cp, const GpuCase& c) {
  if (!is_record_entry(c.entry)) cp.rp.host.poison_outputs();
  else if (c.entry != Entry::replay_commit) poison(std::vector<TensorView>{*cp.rp.host.verify->out});
}

// A record-based call: every row's writes (row_writes) written and within the tolerances of the
// reference on the same bytes; no other byte changed.
void check_record_conformance(const GpuCase& c) {
  CaseProblem cp = build_problem(c);
  HostProblem& p = cp.rp.host;
  poison_outputs(cp, c);
  std::vector<TensorView> writes;
  for (i64 n = 0; n < c.plan.rows(); ++n) row_writes(cp, c, n, writes);
  const Snapshot before = p.snapshot();
  const DeviceImage image = upload(p);

  expect_status(reference::run_catalogue(cp.call), c.plan, "reference");
  const Snapshot expected = p.snapshot();
  const std::uint64_t word = run_on_device(p, cp.call, image, c.chunks_per_block, entry_name(c.entry));
  if (const auto stray = download(p, image)) fuzz_failure(*stray + "\n" + describe(c));
  if (word != 0)
    fuzz_failure(fmt::format("the device guard fired on a valid call: {}\n{}", gputest::rule_list(word), describe(c)));
  if (const auto where = changed_outside(p, before, writes)) fuzz_failure(*where + "\n" + describe(c));
  if (const auto unwritten = still_poisoned(writes)) fuzz_failure("unwritten output: " + *unwritten + "\n" + describe(c));
  const Snapshot actual = p.snapshot();
  std::vector<double> got, want;
  for (const TensorView& region : writes) {
    const std::vector<double> g = p.read_floats_in(actual, region), w = p.read_floats_in(expected, region);
    got.insert(got.end(), g.begin(), g.end());
    want.insert(want.end(), w.begin(), w.end());
  }
  expect_close(c, entry_name(c.entry), got, want);
}

void check_conformance(const GpuCase& c) {
  if (is_record_entry(c.entry)) return check_record_conformance(c);
  HostProblem p = materialize(c.plan, c.data_seed);
  const CallPlan& s = p.plan;
  p.poison_outputs();
  const Snapshot before = p.snapshot();
  const DeviceImage image = upload(p);

  expect_status(reference::run(p.call), s, "reference");
  const Snapshot expected = p.snapshot();

  const std::uint64_t word = run_on_device(p, widen(p.call), image, c.chunks_per_block, entry_name(s.entry));
  if (const auto stray = download(p, image)) fuzz_failure(*stray + "\n" + describe(s));
  if (word != 0)
    fuzz_failure(fmt::format("the device guard fired on a valid call: {}\n{}", gputest::rule_list(word), describe(s)));
  if (const auto unwritten = p.unwritten_outputs()) fuzz_failure("unwritten output: " + *unwritten + "\n" + describe(s));
  if (const auto where = p.unexpected_writes(before)) fuzz_failure(*where + "\n" + describe(s));

  if (s.entry == Entry::commit) {  // a copy of bytes: identical to the reference's
    const auto& state = *p.commit->state;
    expect_identical(c, "committed pool", p.read_floats_in(p.snapshot(), state), p.read_floats_in(expected, state));
    return;
  }
  const Snapshot actual = p.snapshot();
  const OutputErrors e = p.compare_outputs(expected, actual);
  const double tol = tolerance(s);
  if (!e.out.pass(tol) || !e.state.pass(tol))
    fuzz_failure(fmt::format("{} differs from the f64 reference (tolerance {}): out {}, state {}\n{}",
                             entry_name(s.entry), tol, e.out.to_string(), e.state.to_string(), describe(s)));
  if (s.entry != Entry::verify) return;

  // The serving chain: commit the accepted prefix of this verify, on both sides.
  p.restore(expected);
  expect_status(reference::commit(*p.commit), s, "reference commit");
  const Snapshot committed = p.snapshot();
  p.restore(actual);
  const std::uint64_t commit_word = run_on_device(p, CatalogueCall{*p.commit}, image, c.chunks_per_block, "commit after verify");
  if (const auto stray = download(p, image)) fuzz_failure(*stray + "\n" + describe(s));
  if (commit_word != 0)
    fuzz_failure("the device guard fired on the commit of a valid verify: " + gputest::rule_list(commit_word));
  const auto& pool = *p.commit->state;
  expect_close(c, "pool after verify + commit", p.read_floats_in(p.snapshot(), pool),
               p.read_floats_in(committed, pool));
}

// ---- planted index values -----------------------------------------------------------------------

constexpr Arg kIndexArgs[] = {Arg::cache_indices,   Arg::initial_state_indices, Arg::cu_seqlens,
                              Arg::scratch_row_map, Arg::scratch_indices,       Arg::accepted,
                              Arg::prior_accepted};

// Every index tensor's values, row-major.
using IndexValues = std::map<Arg, std::vector<i64>>;

template <class F> void for_each_index_offset(const TensorView& t, F&& f) {
  const i64 rows = t.shape[0], cols = t.rank == 2 ? t.shape[1] : 1;
  for (i64 r = 0; r < rows; ++r)
    for (i64 col = 0; col < cols; ++col)
      f(r * cols + col, t.storage_offset.count + r * t.stride[0] + (t.rank == 2 ? col * t.stride[1] : 0));
}

IndexValues read_index_values(const CatalogueCall& call) {
  IndexValues values;
  for (Arg a : kIndexArgs) {
    const OptionalView* v = find_argument(call, a);
    if (v == nullptr || !*v) continue;
    const auto* base = reinterpret_cast<const std::byte*>(*(*v)->data_address() -
                                                          (*v)->storage_offset.count * element_size((*v)->dtype));
    std::vector<i64>& out = values[a];
    out.resize(static_cast<std::size_t>((*v)->numel()));
    for_each_index_offset(**v, [&](i64 i, i64 offset) {
      if ((*v)->dtype == DType::i64) {
        std::memcpy(&out[static_cast<std::size_t>(i)], base + offset * 8, 8);
      } else {
        std::int32_t x;
        std::memcpy(&x, base + offset * 4, 4);
        out[static_cast<std::size_t>(i)] = x;
      }
    });
  }
  return values;
}

void write_index_values(const CatalogueCall& call, const IndexValues& values) {
  for (const auto& [a, vals] : values) {
    const OptionalView* v = find_argument(call, a);
    auto* base = reinterpret_cast<std::byte*>(*(*v)->data_address() -
                                              (*v)->storage_offset.count * element_size((*v)->dtype));
    for_each_index_offset(**v, [&, &vals = vals](i64 i, i64 offset) {
      const i64 x = vals[static_cast<std::size_t>(i)];
      if ((*v)->dtype == DType::i64) {
        std::memcpy(base + offset * 8, &x, 8);
      } else {
        const auto narrow = static_cast<std::int32_t>(x);
        std::memcpy(base + offset * 4, &narrow, 4);
      }
    });
  }
}

Arg slot_map_of(Entry e) { return e == Entry::prefill ? Arg::initial_state_indices : Arg::cache_indices; }

// prior_records' steps (accept_verify): it is laid out like the records (build_problem).
i64 prior_steps(const GpuCase& c) { return c.records.steps; }

// The rows the host's value rules reject for these values: each row's own faults (row_rules.h,
// the code the validators and the device guard share) and index.unique, worked out here apart:
// a row whose slot another row uses, or one of whose scratch steps another step names.
std::vector<bool> faulty_rows(const GpuCase& c, const IndexValues& v) {
  using row_rules::HostIndex;
  auto index = [&](Arg a, i64 row_stride = 0) -> HostIndex {
    const auto it = v.find(a);
    return it == v.end() ? HostIndex{} : HostIndex{it->second.data(), row_stride, true};
  };
  const CallPlan& s = c.plan;
  const i64 N = s.rows(), S = s.slots, T = s.T;
  const i64 scratch_slots = s.S_spec * s.T_alloc;
  const HostIndex slots = index(slot_map_of(c.entry)), cu = index(Arg::cu_seqlens);
  // Records are addressed by row: the record-based calls take no scratch addressing.
  const HostIndex scratch = is_record_entry(c.entry) ? HostIndex{} : index(Arg::scratch_indices, T);
  const HostIndex row_map = scratch.known() || is_record_entry(c.entry) ? HostIndex{} : index(Arg::scratch_row_map);
  const i64 T_tot = s.total_tokens();
  std::vector<bool> faulty(static_cast<std::size_t>(N));
  for (i64 n = 0; n < N; ++n) {
    using namespace row_rules;
    Mask f = 0;
    switch (c.entry) {
      case Entry::decode: f = row_faults(DecodeRows<HostIndex>{N, S, slots, cu}, n); break;
      case Entry::prefill: f = row_faults(PrefillRows<HostIndex>{N, T_tot, S, cu, slots}, n); break;
      case Entry::verify:
        f = row_faults(VerifyRows<HostIndex>{N, T_tot, T, S, scratch_slots, cu, slots, row_map, scratch}, n);
        break;
      case Entry::commit:
        f = row_faults(CommitRows<HostIndex>{N, T, S, scratch_slots, cu, slots, row_map, scratch,
                                             index(Arg::accepted)}, n);
        break;
      case Entry::record_verify:
        f = row_faults<kRecordVerifyRules>(VerifyRows<HostIndex>{N, T_tot, T, S, 0, cu, slots, {}, {}}, n);
        break;
      case Entry::replay_commit:
        f = row_faults<kReplayCommitRules>(
            CommitRows<HostIndex>{N, T, S, 0, cu, slots, {}, {}, index(Arg::accepted)}, n);
        break;
      case Entry::accept_verify:
        f = row_faults(AcceptVerifyRows<HostIndex>{{N, T_tot, T, S, 0, cu, slots, {}, {}},
                                                   prior_steps(c), index(Arg::prior_accepted)}, n);
        break;
    }
    faulty[static_cast<std::size_t>(n)] = f != 0;
  }
  const std::vector<i64>& slot_values = v.at(slot_map_of(c.entry));
  for (i64 n = 0; n < N; ++n)
    for (i64 m = 0; m < N; ++m)
      if (m != n && value_checks::unique_candidate(slot_values[n], S) && slot_values[n] == slot_values[m])
        faulty[static_cast<std::size_t>(n)] = true;
  if (scratch.known()) {
    const std::vector<i64>& flat = v.at(Arg::scratch_indices);
    for (i64 i = 0; i < N * T; ++i)
      for (i64 j = 0; j < N * T; ++j)
        if (i != j && value_checks::unique_candidate(flat[i], scratch_slots) && flat[i] == flat[j])
          faulty[static_cast<std::size_t>(i / T)] = true;
  }
  return faulty;
}

// Whether row n reads the same index values in a and b.
bool row_unchanged(const GpuCase& c, const IndexValues& a, const IndexValues& b, i64 n) {
  const CallPlan& s = c.plan;
  auto same = [&](Arg arg, i64 i) {
    const auto x = a.find(arg), y = b.find(arg);
    return x == a.end() || x->second[static_cast<std::size_t>(i)] == y->second[static_cast<std::size_t>(i)];
  };
  bool equal = same(slot_map_of(c.entry), n) && same(Arg::cu_seqlens, n) && same(Arg::cu_seqlens, n + 1) &&
               same(Arg::scratch_row_map, n) && same(Arg::accepted, n) && same(Arg::prior_accepted, n);
  if (a.count(Arg::scratch_indices))
    for (i64 t = 0; t < s.T; ++t) equal = equal && same(Arg::scratch_indices, n * s.T + t);
  return equal;
}

void apply_plant(const Plant& p, const GpuCase& c, IndexValues& v) {
  const CallPlan& s = c.plan;
  const i64 N = s.rows(), T = s.T, m = p.magnitude;
  const i64 other = p.other_row != p.row ? p.other_row : (p.row + 1) % N;
  std::vector<i64>& slots = v.at(slot_map_of(c.entry));
  switch (p.kind) {
    case PlantKind::slot_out_of_range:
      slots[p.row] = bad_value(c.entry == Entry::prefill ? 0 : -1, s.slots, m);
      break;
    case PlantKind::slot_repeated: slots[other] = slots[p.row]; break;
    case PlantKind::slot_padding: slots[p.row] = -1; break;
    case PlantKind::cu_start: v.at(Arg::cu_seqlens)[0] = m % 2 ? 1 + m : -1 - m; break;
    case PlantKind::cu_order: {
      std::vector<i64>& cu = v.at(Arg::cu_seqlens);
      const i64 i = 1 + p.row % std::max<i64>(N - 1, 1);
      cu[i] = m % 2 ? cu[i - 1] - 1 - m : cu[i + 1] + 1 + m;
      break;
    }
    case PlantKind::cu_end: {
      std::vector<i64>& cu = v.at(Arg::cu_seqlens);
      const i64 T_tot = s.total_tokens();
      if (c.entry == Entry::commit || c.entry == Entry::replay_commit) cu[N] = cu[N - 1] - 1 - m;
      else cu[N] = m % 2 ? T_tot + 1 + m : T_tot - 1 - m;
      break;
    }
    case PlantKind::accepted_past_draft: v.at(Arg::accepted)[p.row] = m % 2 ? T + 1 + m : -1 - m; break;
    case PlantKind::scratch_out_of_range:
      v.at(Arg::scratch_indices)[p.row * T + p.step] = bad_value(-1, s.S_spec * s.T_alloc, m);
      break;
    case PlantKind::scratch_repeated: {
      std::vector<i64>& flat = v.at(Arg::scratch_indices);
      const i64 to = p.row * T + p.step, from = other * T + p.other_step;
      flat[to] = flat[from];
      break;
    }
    case PlantKind::row_map_permuted: v.at(Arg::scratch_row_map)[p.row] = p.row + 1 + m; break;
    case PlantKind::junk_past_rows: {
      const i64 i = N + p.row % s.extra_index_entries;
      slots[i] = bad_value(-1, s.slots, m);
      if (v.count(Arg::scratch_row_map)) v.at(Arg::scratch_row_map)[i] = 1000 + m;
      break;
    }
    case PlantKind::prior_past_records:
      v.at(Arg::prior_accepted)[p.row] = m % 2 ? prior_steps(c) + 1 + m : -1 - m;
      break;
  }
}

// Applies the plants one by one, dropping any that would leave a row with changed values that the
// rules still accept (a value that is merely different, not bad: e.g. a slot repeated from a
// padding row); so every row that reads a planted value is faulty.
IndexValues planted_values(const GpuCase& c, const IndexValues& original) {
  IndexValues v = original;
  for (const Plant& p : c.plants) {
    IndexValues next = v;
    apply_plant(p, c, next);
    const std::vector<bool> faulty = faulty_rows(c, next);
    bool keep = true;
    for (i64 n = 0; n < c.plan.rows(); ++n)
      keep = keep && (faulty[static_cast<std::size_t>(n)] || row_unchanged(c, next, original, n));
    if (keep) v = std::move(next);
  }
  return v;
}

template <class F> void for_each_element_offset(const TensorView& t, F&& f) {
  const i64 count = t.numel();
  for (i64 i = 0; i < count; ++i) {
    i64 rest = i, offset = t.storage_offset.count;
    for (int d = t.rank - 1; d >= 0; --d) {
      offset += (rest % t.shape[d]) * t.stride[d];
      rest /= t.shape[d];
    }
    f(offset);
  }
}

void check_planted(const GpuCase& c) {
  CaseProblem cp = build_problem(c);
  HostProblem& p = cp.rp.host;
  const CallPlan& s = p.plan;
  const IndexValues original = read_index_values(cp.call);
  const IndexValues planted = planted_values(c, original);
  const std::vector<bool> faulty = faulty_rows(c, planted);

  // The host verdict of the same call with the planted values as host copies.
  CatalogueCall with_values = cp.call;
  for (const auto& [a, vals] : planted) (*find_argument(with_values, a))->values = vals;
  const Verdict host = validate(with_values);
  std::uint64_t expected_word = 0;
  for (const Violation& v : host.violations) {
    if (rule_info(v.rule).tier != Tier::value)
      fuzz_failure(fmt::format("planted index values broke {}, not a value rule\n{}\n{}", rule_id(v.rule),
                               describe(host), describe(c)));
    expected_word |= value_checks::rule_bit(v.rule);
  }
  const bool any_faulty = std::find(faulty.begin(), faulty.end(), true) != faulty.end();
  if (host.accepted() == any_faulty)
    fuzz_failure(fmt::format("the host verdict ({}) and the faulty rows disagree\n{}",
                             host.accepted() ? "accepted" : describe(host), describe(c)));

  // The reference of the problem before planting: what the healthy rows must produce.
  CaseProblem ref = build_problem(c);
  poison_outputs(ref, c);
  expect_status(reference::run_catalogue(ref.call), s, "reference");

  write_index_values(cp.call, planted);
  poison_outputs(cp, c);
  const Snapshot before = p.snapshot();
  const DeviceImage image = upload(p);
  const std::uint64_t word = run_on_device(p, cp.call, image, c.chunks_per_block, entry_name(c.entry));
  if (const auto stray = download(p, image)) fuzz_failure(*stray + "\n" + describe(c));
  if (word != expected_word)
    fuzz_failure(fmt::format("error word {:#x} ({}) but the host verdict's value rules are {:#x} ({})\n{}\n{}",
                             word, gputest::rule_list(word), expected_word, gputest::rule_list(expected_word),
                             describe(host), describe(c)));

  // Healthy rows: written and close to the reference; every other byte as before.
  std::vector<TensorView> regions;
  for (i64 n = 0; n < s.rows(); ++n)
    if (!faulty[static_cast<std::size_t>(n)]) row_writes(cp, c, n, regions);
  std::vector<std::vector<bool>> writable;
  for (const Allocation& a : p.allocations) writable.emplace_back(a.bytes(), false);
  std::vector<double> got, want;
  for (const TensorView& region : regions) {
    const Allocation* a = p.allocation_of(region);
    const auto index = static_cast<std::size_t>(a - p.allocations.data());
    const i64 esize = element_size(region.dtype);
    for_each_element_offset(region, [&](i64 offset) {
      std::fill_n(writable[index].begin() + offset * esize, esize, true);
    });
    TensorView in_ref = region;  // the same elements in the reference problem's allocation
    in_ref.address = ref.rp.host.allocations[index].address();
    const std::vector<double> g = read_floats(region);
    const std::vector<double> w = read_floats(in_ref);
    for (double x : g)
      if (std::isnan(x)) fuzz_failure(fmt::format("a row the guard passed left an output unwritten\n{}", describe(c)));
    got.insert(got.end(), g.begin(), g.end());
    want.insert(want.end(), w.begin(), w.end());
  }
  if (c.entry == Entry::commit) expect_identical(c, "committed slots of healthy rows", got, want);
  else expect_close(c, "outputs and states of healthy rows", got, want);
  std::string faulty_list;
  for (std::size_t n = 0; n < faulty.size(); ++n)
    if (faulty[n]) faulty_list += fmt::format(" {}", n);
  for (std::size_t i = 0; i < p.allocations.size(); ++i) {
    const Allocation& a = p.allocations[i];
    for (std::size_t b = 0; b < a.bytes(); ++b)
      if (!writable[i][b] && a.data()[b] != before.bytes[i][b])
        fuzz_failure(fmt::format("{} byte {} changed, outside what the healthy rows may write "
                                 "(faulty rows:{})\n{}", a.name(), b, faulty_list, describe(c)));
  }
}

}  // namespace
}  // namespace kdaguard::support

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (!kdaguard::gputest::have_sm90()) {
    std::fprintf(stderr, "fuzz_gpu: no sm_90 CUDA device here; the GPU fuzz target has nothing to run on\n");
    std::exit(77);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kdaguard::support;
  const auto mode = size > 0 && (data[0] & 1) ? GpuMode::planted : GpuMode::conformance;
  // KDAGUARD_FUZZ_GPU_MODE=conformance|planted keeps one process on one mode (inputs of the other
  // are refused, so its corpus holds only its own).
  static const char* forced = std::getenv("KDAGUARD_FUZZ_GPU_MODE");
  if (forced != nullptr && std::string(forced) != (mode == GpuMode::planted ? "planted" : "conformance"))
    return -1;
  FuzzedDataProvider bytes(size > 0 ? data + 1 : data, size > 0 ? size - 1 : 0);
  FuzzChooser choose(bytes);
  const GpuCase c = draw_gpu_case(mode, choose);
  if (mode == GpuMode::planted) check_planted(c);
  else check_conformance(c);
  return 0;
}
