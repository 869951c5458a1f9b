// The device half of every value rule, generated from the mutation tables (mutations.h for
// decode, prefill, verify and commit; record_mutations.h for record_verify, replay_commit and
// accept_verify): for each value-rule mutation on each entry point it applies to, a call drawn
// and broken as the host properties do,
// laid out in device memory, run with no host copies of its index values (so the device guard
// judges them) and compared with the host verdict of the same call with its values: the error
// word must equal the set of value rules the host reports, exactly. Inputs the call only reads
// must come back bit-identical.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "gpu_support.h"
#include "kdaguard/contracts/validate.h"
#include "kdaguard/contracts/value_checks.h"
#include "kdaguard/kda.h"
#include "mutations.h"
#include "record_mutations.h"

namespace kdaguard::gputest {
namespace {

// What entry point e may write: replay_commit only reads its records.
bool is_output(Entry e, Arg a) {
  if (a == Arg::records) return e == Entry::record_verify || e == Entry::accept_verify;
  return a == Arg::out || a == Arg::state || a == Arg::initial_state || a == Arg::scratch;
}

std::int64_t view_bytes(const TensorView& t) {
  std::int64_t last = t.storage_offset.count;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] == 0) return 0;
    last += (t.shape[d] - 1) * t.stride[d];
  }
  return (last + 1) * element_size(t.dtype);
}

// Every buffer of a generated call (views with one address share it; address 0 is a buffer of
// its own) on the device: floats small and random, index tensors holding their host values.
struct DeviceCall {
  CatalogueCall call;  // relocated, without host values
  std::vector<void*> buffers;
  std::vector<std::vector<std::byte>> uploaded;
  std::vector<bool> read_only;
  ~DeviceCall() {
    for (void* b : buffers) cudaFree(b);
  }
};

void write_element(std::byte* base, const TensorView& t, std::int64_t offset, double value) {
  std::byte* at = base + offset * element_size(t.dtype);
  switch (t.dtype) {
    case DType::f32: {
      const float f = static_cast<float>(value);
      std::memcpy(at, &f, 4);
      break;
    }
    case DType::bf16:
    case DType::f16: {
      const float f = static_cast<float>(value);
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      // bf16: the top half; f16 values in [-0.5, 0.5] through the bf16 pattern would be wrong,
      // so f16 takes a fixed small value's encoding with a random mantissa.
      const std::uint16_t h = t.dtype == DType::bf16
                                  ? static_cast<std::uint16_t>(bits >> 16)
                                  : static_cast<std::uint16_t>(0x3400 | (bits & 0x3ff));
      std::memcpy(at, &h, 2);
      break;
    }
    case DType::i32: {
      const auto i = static_cast<std::int32_t>(value);
      std::memcpy(at, &i, 4);
      break;
    }
    case DType::i64: {
      const auto i = static_cast<std::int64_t>(value);
      std::memcpy(at, &i, 8);
      break;
    }
  }
}

// Calls f(element offset) for every element of t in row-major order.
template <class F> void for_each_offset(const TensorView& t, F&& f) {
  std::int64_t count = 1;
  for (int d = 0; d < t.rank; ++d) count *= t.shape[d];
  for (std::int64_t i = 0; i < count; ++i) {
    std::int64_t rest = i, offset = t.storage_offset.count;
    for (int d = t.rank - 1; d >= 0; --d) {
      offset += (rest % t.shape[d]) * t.stride[d];
      rest /= t.shape[d];
    }
    f(i, offset);
  }
}

std::unique_ptr<DeviceCall> to_device(const CatalogueCall& host_call, std::uint64_t seed) {
  auto d = std::make_unique<DeviceCall>();
  d->call = host_call;
  const Entry entry = entry_of(host_call);
  std::map<std::uint64_t, std::size_t> by_address;
  std::vector<std::int64_t> sizes;
  std::vector<std::size_t> group_of(kArgCount, SIZE_MAX);
  for_each_argument(d->call, [&](Arg a, OptionalView& v) {
    if (!v) return;
    std::size_t g;
    if (v->address != 0 && by_address.count(v->address)) {
      g = by_address[v->address];
    } else {
      g = sizes.size();
      sizes.push_back(0);
      d->read_only.push_back(true);
      if (v->address != 0) by_address[v->address] = g;
    }
    group_of[static_cast<std::size_t>(a)] = g;
    sizes[g] = std::max(sizes[g], view_bytes(*v));
    if (is_output(entry, a)) d->read_only[g] = false;
  });
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> small(-0.5, 0.5);
  for (std::int64_t bytes : sizes) d->uploaded.emplace_back(static_cast<std::size_t>(bytes + 16));
  for_each_argument(d->call, [&](Arg a, OptionalView& v) {
    if (!v) return;
    std::byte* base = d->uploaded[group_of[static_cast<std::size_t>(a)]].data();
    const bool index = v->dtype == DType::i32 || v->dtype == DType::i64;
    for_each_offset(*v, [&](std::int64_t i, std::int64_t offset) {
      const double value = index ? (v->values ? static_cast<double>((*v->values)[i]) : 0.0)
                                 : (a == Arg::beta ? 0.5 + 0.4 * small(rng) : small(rng));
      write_element(base, *v, offset, value);
    });
  });
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    void* buffer = nullptr;
    check_cuda(cudaMalloc(&buffer, d->uploaded[g].size()), "cudaMalloc");
    check_cuda(cudaMemcpy(buffer, d->uploaded[g].data(), d->uploaded[g].size(),
                          cudaMemcpyHostToDevice),
               "upload");
    d->buffers.push_back(buffer);
  }
  constexpr Device kGpu{Device::Kind::cuda, 0};  // generated calls may be for the cpu
  std::visit([&](auto& c) { c.device = kGpu; }, d->call);
  for_each_argument(d->call, [&](Arg a, OptionalView& v) {
    if (!v) return;
    if (v->device) v->device = kGpu;
    v->address = reinterpret_cast<std::uint64_t>(d->buffers[group_of[static_cast<std::size_t>(a)]]);
    v->storage_size.reset();
    v->values.reset();
  });
  return d;
}

Status run_any(const CatalogueCall& call, const gpu::LaunchOptions& options) {
  if (const auto* c = std::get_if<PrefillCall>(&call)) return gpu::prefill(*c, options);
  if (const auto* c = std::get_if<RecordVerifyCall>(&call)) return gpu::record_verify(*c, options);
  if (const auto* c = std::get_if<ReplayCommitCall>(&call)) return gpu::replay_commit(*c, options);
  if (const auto* c = std::get_if<AcceptVerifyCall>(&call)) return gpu::accept_verify(*c, options);
  return run_gpu(*narrow(call), options);
}

bool is_record_entry(Entry e) {
  return e == Entry::record_verify || e == Entry::replay_commit || e == Entry::accept_verify;
}

// The value-rule mutations of `rule` that apply to e, from e's table, each with its name, its
// rule and a function that draws the broken call.
struct AnyMutation {
  std::string_view name;
  RuleId rule;
  std::function<CatalogueCall(support::Chooser&)> draw;
};
std::vector<AnyMutation> mutations_on(RuleId rule, Entry e) {
  std::vector<AnyMutation> found;
  if (is_record_entry(e)) {
    for (const support::RecordMutation* m : support::record_mutations_for(rule))
      if (m->applies_to(e))
        found.push_back({m->name, m->rule, [m, e](support::Chooser& c) {
                           return support::mutated_record_call(*m, e, c).call;
                         }});
  } else {
    for (const support::Mutation* m : support::mutations_for(rule))
      if (m->applies_to(e))
        found.push_back({m->name, m->rule, [m, e](support::Chooser& c) {
                           return widen(support::mutated_call(*m, e, c).call);
                         }});
  }
  return found;
}

std::uint64_t value_rules_of(const Verdict& v) {
  std::uint64_t mask = 0;
  for (const Violation& x : v.violations) mask |= value_checks::rule_bit(x.rule);
  return mask;
}

// One case per (value rule, entry point) with a mutation, named after both (index_range_decode),
// so that scripts/knockout_device.sh can run each alone with that rule's device checks removed.
struct RuleOnEntry {
  RuleId rule;
  Entry entry;
};

std::vector<RuleOnEntry> value_rules_on_entries() {
  std::vector<RuleOnEntry> cases;
  for (const RuleInfo& info : rule_catalogue()) {
    if (info.tier != Tier::value) continue;
    for (Entry e : {Entry::decode, Entry::prefill, Entry::verify, Entry::commit,
                    Entry::record_verify, Entry::replay_commit, Entry::accept_verify})
      if (!mutations_on(info.rule, e).empty()) cases.push_back({info.rule, e});
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<RuleOnEntry>& info) {
  std::string name = fmt::format("{}_{}", rule_id(info.param.rule), entry_name(info.param.entry));
  for (char& c : name)
    if (c == '.') c = '_';
  return name;
}

class GpuValueRule : public ::testing::TestWithParam<RuleOnEntry> {};

TEST_P(GpuValueRule, DeviceWordEqualsTheHostVerdict) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  const auto [rule, e] = GetParam();
  const int seeds = case_count(6);
  DeviceArena arena(std::size_t{1} << 20);
  int cases = 0;
  for (const AnyMutation& m : mutations_on(rule, e)) {
    for (int seed = 1; seed <= seeds; ++seed) {
      support::SeededChooser choose(static_cast<std::uint64_t>(seed) * 104729 +
                                    static_cast<std::uint64_t>(m.rule) * 31 +
                                    static_cast<std::uint64_t>(e));
      const CatalogueCall call = m.draw(choose);
      const Verdict host = validate(call);
      const std::string what = fmt::format("{} on {} (seed {})", m.name, entry_name(e), seed);
      ASSERT_FALSE(host.accepted()) << what;
      const std::uint64_t expected = value_rules_of(host);
      ASSERT_EQ(expected & ~value_checks::rule_bit(m.rule), 0u)
          << what << ": the mutation broke more than its rule\n" << describe(host);
      auto d = to_device(call, static_cast<std::uint64_t>(seed));
      arena.reset();
      gpu::LaunchOptions options;
      options.guard = make_guard(arena, 4096);
      const Status s = run_any(d->call, options);
      EXPECT_TRUE(s.ok()) << what << ": " << to_string(s);
      if (!s.ok()) continue;
      check_cuda(cudaDeviceSynchronize(), "guarded call");
      const std::uint64_t word = read_error_word(options.guard);
      EXPECT_EQ(word, expected) << what << ": device " << rule_list(word) << ", host "
                                << rule_list(expected) << "\n" << describe(host);
      for (std::size_t b = 0; b < d->buffers.size(); ++b) {
        if (!d->read_only[b]) continue;
        std::vector<std::byte> after(d->uploaded[b].size());
        check_cuda(cudaMemcpy(after.data(), d->buffers[b], after.size(), cudaMemcpyDeviceToHost),
                   "download");
        EXPECT_TRUE(after == d->uploaded[b]) << what << ": an input buffer changed";
      }
      ++cases;
    }
  }
  EXPECT_GT(cases, 0);
}

INSTANTIATE_TEST_SUITE_P(Mutations, GpuValueRule, ::testing::ValuesIn(value_rules_on_entries()),
                         case_name);

// The case worked out by hand in the architecture review: cu_seqlens = [0, 5, 6] with 3 tokens
// is seqlens.total alone, on the device as on the host.
TEST(GpuValueRules, OffsetsPastTheTokensAreTheTotalOnTheDevice) {
  KDAGUARD_SKIP_WITHOUT_GPU();
  support::SeededChooser choose(7);
  support::GeneratedCall g =
      support::generate_call(Entry::verify, support::PlanNeeds{.min_rows = 2, .cu_seqlens = true,
                                                              .index_values = true},
                             choose);
  auto& c = std::get<VerifyCall>(g.call);
  const std::int64_t N = c.cu_seqlens->shape[0] - 1, T_tot = c.q->shape[0];
  for (std::int64_t i = 0; i <= N; ++i) (*c.cu_seqlens->values)[i] = T_tot + i;  // all past
  (*c.cu_seqlens->values)[0] = 0;
  const Verdict host = validate(g.call);
  ASSERT_EQ(value_rules_of(host), value_checks::rule_bit(RuleId::seqlens_total)) << describe(host);
  auto d = to_device(widen(g.call), 7);
  DeviceArena arena(std::size_t{1} << 20);
  gpu::LaunchOptions options;
  options.guard = make_guard(arena, 4096);
  ASSERT_TRUE(run_any(d->call, options).ok());
  check_cuda(cudaDeviceSynchronize(), "guarded call");
  EXPECT_EQ(read_error_word(options.guard), value_checks::rule_bit(RuleId::seqlens_total));
}

}  // namespace
}  // namespace kdaguard::gputest
