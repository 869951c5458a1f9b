#include "problem.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "kdaguard/numeric.h"

namespace kdaguard::support {
namespace {

constexpr std::size_t kAlignment = 256;

// SplitMix64: fast, and deterministic across standard libraries (the std distributions are not).
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t bits() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(bits() >> 11) * 0x1.0p-53;
  }
  bool chance(double p) { return uniform(0.0, 1.0) < p; }

 private:
  std::uint64_t state_;
};


void store_index(const Allocation& a, DType dtype, std::int64_t element, std::int64_t value) {
  if (dtype == DType::i64) {
    std::memcpy(a.data() + element * 8, &value, 8);
  } else {
    const auto v = static_cast<std::int32_t>(value);
    std::memcpy(a.data() + element * 4, &v, 4);
  }
}

// Calls f(element offset) for every element of a view, row-major.
template <class F>
void for_each_element(const TensorView& t, F&& f) {
  const std::int64_t n = t.numel();
  std::array<std::int64_t, kMaxRank> index{};
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t offset = t.storage_offset.count;
    for (int d = 0; d < t.rank; ++d) offset += index[d] * t.stride[d];
    f(offset);
    for (int d = t.rank - 1; d >= 0; --d) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
}

// Lays out a plan over real host buffers (lay_out's layout, one Allocation per listed buffer) and
// fills them.
class Materializer {
 public:
  Materializer(const CallPlan& plan, std::uint64_t seed) : random_(seed) {
    p_.plan = plan;
    p_.plan.device = Device{Device::Kind::cpu, 0};
  }

  HostProblem build() {
    const CallPlan& s = p_.plan;
    require(s.slot_of_row.size() == s.row_lengths.size(), "one slot per row");
    require(s.entry != Entry::decode || std::all_of(s.row_lengths.begin(), s.row_lengths.end(),
                                                    [](std::int64_t l) { return l == 1; }),
            "decode rows hold one token each");
    require(s.entry == Entry::decode || s.entry == Entry::prefill || s.entry == Entry::verify ||
                s.entry == Entry::commit,
            "a decode, prefill, verify or commit plan");
    LaidOutCall laid = lay_out(s);
    p_.allocations.reserve(laid.buffers.size());
    for (const PlacedBuffer& b : laid.buffers) allocate(std::string(b.name), b.bytes);
    p_.call = relocate(laid.call, laid.buffers);
    if (laid.verify) p_.verify = std::get<VerifyCall>(relocate(*laid.verify, laid.buffers));
    if (laid.commit) p_.commit = std::get<CommitCall>(relocate(*laid.commit, laid.buffers));
    fill();
    keep_planned_values();
    return std::move(p_);
  }

 private:
  static void require(bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("materialize: ") + what);
  }

  // An allocation of `bytes` (at least one) filled with random bytes, so gaps between a view's
  // elements hold something recognisable as untouched.
  void allocate(std::string name, std::int64_t bytes) {
    Allocation& a = p_.allocations.emplace_back(
        std::move(name), static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)));
    for (std::size_t i = 0; i < a.bytes(); i += 8) {
      const std::uint64_t r = random_.bits();
      std::memcpy(a.data() + i, &r, std::min<std::size_t>(8, a.bytes() - i));
    }
  }

  // The call with every view moved from its listed buffer's fake address to its allocation.
  AnyCall relocate(AnyCall call, std::span<const PlacedBuffer> buffers) {
    for_each_argument(call, [&](Arg arg, OptionalView& v) {
      if (!v) return;
      for (std::size_t i = 0; i < buffers.size(); ++i) {
        if (buffers[i].address != v->address) continue;
        Allocation& a = p_.allocations[i];
        v->address = a.address();
        if (std::find(a.args.begin(), a.args.end(), arg) == a.args.end()) a.args.push_back(arg);
        return;
      }
      throw std::logic_error("materialize: a view outside every listed buffer");
    });
    return call;
  }

  // Every argument of the problem's calls once (verify and commit share all but accepted).
  template <class F> void for_each_view(F&& f) {
    std::array<bool, kArgCount> seen{};
    auto visit = [&](auto& call) {
      for_each_argument(call, [&](Arg arg, OptionalView& v) {
        if (!v || seen[static_cast<std::size_t>(arg)]) return;
        seen[static_cast<std::size_t>(arg)] = true;
        f(arg, *v);
      });
    };
    std::visit(visit, p_.call);
    if (p_.verify) visit(*p_.verify);
    if (p_.commit) visit(*p_.commit);
  }

  void fill() {
    const CallPlan& s = p_.plan;
    // k is kept short without the in-kernel norm (E|k|^2 = 1) so beta |k|^2 < 2 and the delta
    // rule stays contractive over long sequences, as it is for normed keys.
    const double k_range = s.use_qk_l2norm ? 1.0 : std::sqrt(3.0 / static_cast<double>(s.K));
    for_each_view([&](Arg arg, const TensorView& t) {
      if (t.values) {
        store_values(t);
        return;
      }
      switch (arg) {
        case Arg::q:
        case Arg::v: fill_view(t, [&] { return random_.uniform(-1, 1); }); return;
        case Arg::k: fill_view(t, [&] { return random_.uniform(-k_range, k_range); }); return;
        case Arg::a:
        case Arg::g: fill_view(t, [&] { return gate_value(); }); return;
        case Arg::A_log:
          // exp(A_log) in [1, 16] (the model's init) for softplus; about 1 for the bounded gate.
          fill_view(t, [&] {
            return s.gate_kind() == GateKind::softplus ? std::log(random_.uniform(1, 16))
                                                       : random_.uniform(-0.5, 0.5);
          });
          return;
        case Arg::dt_bias:
          // inverse softplus of dt, dt log-uniform in [1e-3, 1e-1] (the model's init)
          fill_view(t, [&] {
            return std::log(std::expm1(std::exp(random_.uniform(std::log(1e-3), std::log(1e-1)))));
          });
          return;
        case Arg::b: fill_view(t, [&] { return random_.uniform(-3, 3); }); return;
        case Arg::beta: fill_view(t, [&] { return random_.uniform(0.05, 0.95); }); return;
        case Arg::state:
        case Arg::initial_state:
        case Arg::scratch: fill_view(t, [&] { return random_.uniform(-1, 1); }); return;
        default: return;  // out: written by the entry point
      }
    });
  }

  double gate_value() {
    const bool strong = random_.chance(p_.plan.strong_decay_fraction);
    switch (p_.plan.gate_kind()) {
      case GateKind::activated:  // g log-uniform in [-2, -1e-3]
        return strong ? -1000.0 : -std::exp(random_.uniform(std::log(1e-3), std::log(2.0)));
      case GateKind::softplus:
      case GateKind::bounded:
        return strong ? 1000.0 : random_.uniform(-4, 4);
    }
    return 0;
  }

  // Stores draw() into every element of t, drawing again wherever the stored value is 0.
  template <class Draw>
  void fill_view(const TensorView& t, Draw&& draw) {
    std::byte* data = p_.allocation_of(t)->data();
    for_each_element(t, [&](std::int64_t offset) {
      do {
        numeric::store(data, t.dtype, offset, draw());
      } while (numeric::load(data, t.dtype, offset) == 0.0);
    });
  }

  // An index tensor's values into its buffer, row-major over its shape.
  void store_values(const TensorView& t) {
    const Allocation& a = *p_.allocation_of(t);
    std::size_t i = 0;
    for_each_element(t, [&](std::int64_t offset) {
      store_index(a, t.dtype, offset, (*t.values)[i++]);
    });
  }

  // Host copies only where the plan attaches them.
  void keep_planned_values() {
    auto strip = [&](auto& call) {
      for_each_argument(call, [&](Arg arg, OptionalView& v) {
        if (v && !p_.plan.has_values(arg)) v->values.reset();
      });
    };
    std::visit(strip, p_.call);
    if (p_.verify) strip(*p_.verify);
    if (p_.commit) strip(*p_.commit);
  }

  Random random_;
  HostProblem p_;
};

// The NaN a poisoned element of `dtype` holds: quiet, with a payload that is easy to spot.
void store_poison(std::byte* at, DType dtype) {
  switch (dtype) {
    case DType::f32: {
      const std::uint32_t bits = 0x7FDEAD00u;
      std::memcpy(at, &bits, 4);
      return;
    }
    case DType::bf16: {
      const std::uint16_t bits = 0x7FDEu;
      std::memcpy(at, &bits, 2);
      return;
    }
    case DType::f16: {
      const std::uint16_t bits = 0x7EADu;
      std::memcpy(at, &bits, 2);
      return;
    }
    default: return;
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------

Allocation::Allocation(std::string name, std::size_t bytes)
    : name_(std::move(name)), bytes_(bytes) {
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  memory_.reset(static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded)));
  if (!memory_) throw std::bad_alloc();
}

void Allocation::Free::operator()(std::byte* p) const { std::free(p); }

const Allocation* HostProblem::find(std::string_view name) const {
  for (const Allocation& a : allocations)
    if (a.name() == name) return &a;
  return nullptr;
}

const Allocation* HostProblem::allocation_of(const TensorView& view) const {
  for (const Allocation& a : allocations)
    if (a.address() == view.address) return &a;
  return nullptr;
}

Snapshot HostProblem::snapshot() const {
  Snapshot s;
  for (const Allocation& a : allocations) s.bytes.emplace_back(a.data(), a.data() + a.bytes());
  return s;
}

void HostProblem::restore(const Snapshot& s) {
  for (std::size_t i = 0; i < allocations.size(); ++i)
    std::memcpy(allocations[i].data(), s.bytes[i].data(), allocations[i].bytes());
}

namespace {

// Marks the bytes of every element of `view` in its allocation's mask; a pool slot (compact, one
// byte range) at once.
void mark(const HostProblem& p, const WrittenRegion& region,
          std::vector<std::vector<bool>>& masks) {
  const TensorView& view = region.view;
  const Allocation* a = p.allocation_of(view);
  auto& mask = masks[static_cast<std::size_t>(a - p.allocations.data())];
  const std::int64_t esize = element_size(view.dtype);
  if (region.kind != WrittenRegion::Kind::out) {
    const auto begin = mask.begin() + view.storage_offset.count * esize;
    std::fill(begin, begin + view.numel() * esize, true);
    return;
  }
  for_each_element(view, [&](std::int64_t offset) {
    for (std::int64_t b = 0; b < esize; ++b) mask[static_cast<std::size_t>(offset * esize + b)] = true;
  });
}

// Row n's accepted count (0 past the plan's counts, as the commit call holds it).
std::int64_t accepted_count(const CallPlan& p, std::int64_t n) {
  return n < static_cast<std::int64_t>(p.accepted.size()) ? p.accepted[n] : 0;
}

// Every element of a view as f64, read from `bytes` standing in for the view's allocation.
std::vector<double> read_floats_from(const TensorView& view, const std::byte* bytes) {
  std::vector<double> values;
  values.reserve(static_cast<std::size_t>(view.numel()));
  for_each_element(view, [&](std::int64_t offset) {
    values.push_back(numeric::load(bytes, view.dtype, offset));
  });
  return values;
}

}  // namespace

std::vector<WrittenRegion> HostProblem::written_regions() const {
  std::vector<WrittenRegion> regions;
  switch (plan.entry) {
    case Entry::decode: regions.push_back({WrittenRegion::Kind::out, -1, *std::get<DecodeCall>(call).out}); break;
    case Entry::prefill: regions.push_back({WrittenRegion::Kind::out, -1, *std::get<PrefillCall>(call).out}); break;
    case Entry::verify: regions.push_back({WrittenRegion::Kind::out, -1, *verify->out}); break;
    case Entry::commit: break;  // writes no out
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: return regions;  // not a HostProblem entry point
  }
  for (std::int64_t n = 0; n < plan.rows(); ++n) {
    std::vector<WrittenRegion> slots = slots_written_by_row(n);
    regions.insert(regions.end(), slots.begin(), slots.end());
  }
  return regions;
}

std::vector<WrittenRegion> HostProblem::slots_written_by_row(std::int64_t n) const {
  using Kind = WrittenRegion::Kind;
  std::vector<WrittenRegion> regions;
  const CallPlan& s = plan;
  auto slot = [&](const TensorView& pool, std::int64_t flat, Kind kind) {
    regions.push_back({kind, flat, slice_rows(flat_pool(pool), flat, 1)});
  };
  const std::int64_t slot_index = s.slot_of_row[n];
  switch (s.entry) {
    case Entry::decode:
      if (slot_index >= 0) slot(*std::get<DecodeCall>(call).state, slot_index, Kind::state_slot);
      break;
    case Entry::prefill:
      if (s.row_lengths[n] > 0) slot(*std::get<PrefillCall>(call).initial_state, slot_index, Kind::state_slot);
      break;
    case Entry::verify:
      for (std::int64_t t = 0; slot_index >= 0 && t < s.row_lengths[n]; ++t) {
        const std::int64_t flat = s.scratch_slot(n, t);
        if (flat >= 0) slot(*verify->scratch, flat, Kind::scratch_slot);
      }
      break;
    case Entry::commit:
      if (slot_index >= 0 && accepted_count(s, n) > 0) slot(*commit->state, slot_index, Kind::state_slot);
      break;
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: break;  // not a HostProblem entry point
  }
  return regions;
}

std::string WrittenRegion::name() const {
  switch (kind) {
    case Kind::out: return "out";
    case Kind::state_slot: return fmt::format("state slot {}", slot);
    case Kind::scratch_slot: return fmt::format("scratch slot {}", slot);
  }
  return "?";
}

std::vector<std::vector<bool>> HostProblem::writable() const {
  std::vector<std::vector<bool>> masks;
  for (const Allocation& a : allocations) masks.emplace_back(a.bytes(), false);
  for (const WrittenRegion& region : written_regions()) mark(*this, region, masks);
  return masks;
}

std::optional<std::string> HostProblem::unexpected_writes(const Snapshot& before) const {
  const auto masks = writable();
  for (std::size_t i = 0; i < allocations.size(); ++i) {
    const Allocation& a = allocations[i];
    constexpr std::size_t kBlock = 4096;  // skip unchanged blocks wholesale
    for (std::size_t block = 0; block < a.bytes(); block += kBlock) {
      const std::size_t end = std::min(a.bytes(), block + kBlock);
      if (std::memcmp(a.data() + block, before.bytes[i].data() + block, end - block) == 0) continue;
      for (std::size_t b = block; b < end; ++b) {
        if (masks[i][b] || a.data()[b] == before.bytes[i][b]) continue;
        return fmt::format("{} byte {} changed from {:#04x} to {:#04x}, outside what {} may write",
                           a.name(), b, static_cast<unsigned>(before.bytes[i][b]),
                           static_cast<unsigned>(a.data()[b]), entry_name(plan.entry));
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> HostProblem::unwritten_outputs() const {
  for (const WrittenRegion& region : written_regions()) {
    const std::vector<double> values = read_floats(region.view);
    for (std::size_t i = 0; i < values.size(); ++i)
      if (std::isnan(values[i]))
        return fmt::format("{} element {} (row-major) still holds the poison", region.name(), i);
  }
  return std::nullopt;
}

std::vector<double> HostProblem::read_floats_in(const Snapshot& s, const TensorView& view) const {
  const Allocation* a = allocation_of(view);
  return read_floats_from(view, s.bytes[static_cast<std::size_t>(a - allocations.data())].data());
}

OutputErrors HostProblem::compare_outputs(const Snapshot& expected, const Snapshot& actual) const {
  OutputErrors errors;
  std::vector<double> want_state, got_state;
  for (const WrittenRegion& region : written_regions()) {
    std::vector<double> want = read_floats_in(expected, region.view);
    std::vector<double> got = read_floats_in(actual, region.view);
    if (region.kind == WrittenRegion::Kind::out) {
      errors.out = reference::compare(got, want);
    } else {
      want_state.insert(want_state.end(), want.begin(), want.end());
      got_state.insert(got_state.end(), got.begin(), got.end());
    }
  }
  errors.state = reference::compare(got_state, want_state);
  return errors;
}

void HostProblem::poison_outputs() {
  auto poison_view = [&](const TensorView& t) {
    const Allocation* a = allocation_of(t);
    const std::int64_t esize = element_size(t.dtype);
    for_each_element(t, [&](std::int64_t offset) { store_poison(a->data() + offset * esize, t.dtype); });
  };
  // The view's whole buffer, unless other arguments live in it too (an arena plan).
  auto poison_whole = [&](const TensorView& t) {
    const Allocation* a = allocation_of(t);
    if (a->args.size() > 1) return poison_view(t);
    const std::int64_t esize = element_size(t.dtype);
    for (std::size_t b = 0; b + esize <= a->bytes(); b += static_cast<std::size_t>(esize))
      store_poison(a->data() + b, t.dtype);
  };
  switch (plan.entry) {
    case Entry::decode: poison_whole(*std::get<DecodeCall>(call).out); break;
    case Entry::prefill: poison_whole(*std::get<PrefillCall>(call).out); break;
    case Entry::verify:
      poison_whole(*verify->out);
      poison_whole(*verify->scratch);
      break;
    case Entry::commit:
      for (std::int64_t n = 0; n < plan.rows(); ++n)
        if (plan.slot_of_row[n] >= 0 && accepted_count(plan, n) > 0)
          poison_view(slice_rows(*commit->state, plan.slot_of_row[n], 1));
      break;
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: break;  // not a HostProblem entry point
  }
}

namespace {
template <class Call>
Call relocated_call(const HostProblem& p, const Call& c, Device device,
                    std::span<const std::uint64_t> new_bases) {
  Call moved = c;
  std::visit([&](auto& typed) { typed.device = device; }, moved);
  for_each_argument(moved, [&](Arg, OptionalView& v) {
    if (!v) return;
    const Allocation* a = p.allocation_of(*v);
    if (a == nullptr) throw std::invalid_argument("relocated: a view outside this problem");
    v->address = new_bases[static_cast<std::size_t>(a - p.allocations.data())];
    v->device.reset();
  });
  return moved;
}
}  // namespace

AnyCall HostProblem::relocated(const AnyCall& c, Device device,
                               std::span<const std::uint64_t> new_bases) const {
  return relocated_call(*this, c, device, new_bases);
}

CatalogueCall HostProblem::relocated(const CatalogueCall& c, Device device,
                                     std::span<const std::uint64_t> new_bases) const {
  return relocated_call(*this, c, device, new_bases);
}

HostProblem materialize(const CallPlan& plan, std::uint64_t seed) {
  return Materializer(plan, seed).build();
}

// ------------------------------------------------------------------------------------------------

std::vector<double> read_floats(const TensorView& view) {
  std::vector<double> values;
  values.reserve(static_cast<std::size_t>(view.numel()));
  const void* base = reinterpret_cast<const void*>(view.address);
  for_each_element(view,
                   [&](std::int64_t offset) { values.push_back(numeric::load(base, view.dtype, offset)); });
  return values;
}

TensorView slice_rows(const TensorView& view, std::int64_t first, std::int64_t count) {
  TensorView t = view;
  t.storage_offset.count += first * view.stride[0];
  t.shape[0] = count;
  if (t.values) {
    const std::int64_t per_row = view.shape[0] > 0 ? view.numel() / view.shape[0] : 0;
    t.values = std::vector<std::int64_t>(t.values->begin() + first * per_row,
                                         t.values->begin() + (first + count) * per_row);
  }
  return t;
}

TensorView flat_pool(const TensorView& pool) {
  if (pool.rank != 5) return pool;
  TensorView t = pool;
  t.rank = 4;
  t.shape = {pool.shape[0] * pool.shape[1], pool.shape[2], pool.shape[3], pool.shape[4]};
  t.stride = {pool.stride[1], pool.stride[2], pool.stride[3], pool.stride[4]};
  return t;
}

std::vector<double> read_slot(const TensorView& pool, std::int64_t flat_slot) {
  return read_floats(slice_rows(flat_pool(pool), flat_slot, 1));
}

}  // namespace kdaguard::support
