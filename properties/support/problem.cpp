#include "problem.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
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

std::int64_t slot_elements(const ProblemSpec& s) {
  return static_cast<std::int64_t>(s.HV) * s.V * s.K;
}

class Builder {
 public:
  Builder(const ProblemSpec& spec, std::uint64_t seed) : s_(normalized(spec)), random_(seed) {
    p_.spec = s_;
    p_.allocations.reserve(24);
  }

  HostProblem build() {
    validate_spec();
    switch (s_.entry) {
      case Entry::decode: build_decode(); break;
      case Entry::prefill: build_prefill(); break;
      case Entry::verify:
      case Entry::commit: build_speculative(); break;
      case Entry::record_verify:
      case Entry::replay_commit:
      case Entry::accept_verify: break;  // not a HostProblem entry point
    }
    return std::move(p_);
  }

 private:
  // Allocates `elements` of `dtype` (at least one alignment unit) filled with random bytes, so
  // gaps between a view's elements hold something recognisable as untouched.
  const Allocation& allocate(std::string name, DType dtype, std::int64_t elements) {
    const std::size_t bytes = std::max<std::size_t>(
        static_cast<std::size_t>(elements * element_size(dtype)), 1);
    Allocation& a = p_.allocations.emplace_back(std::move(name), bytes);
    for (std::size_t i = 0; i < a.bytes(); i += 8) {
      const std::uint64_t r = random_.bits();
      std::memcpy(a.data() + i, &r, std::min<std::size_t>(8, a.bytes() - i));
    }
    return a;
  }

  TensorView view(const Allocation& a, Arg arg, DType dtype,
                  std::initializer_list<std::int64_t> shape,
                  std::initializer_list<std::int64_t> stride, std::int64_t offset = 0) {
    TensorView t;
    t.dtype = dtype;
    t.rank = static_cast<int>(shape.size());
    std::copy(shape.begin(), shape.end(), t.shape.begin());
    std::copy(stride.begin(), stride.end(), t.stride.begin());
    t.storage_offset = Elements{offset};
    t.address = a.address();
    t.storage_size = Elements{static_cast<std::int64_t>(a.bytes()) / element_size(dtype)};
    // The allocation is found again by name: a reference into the vector would dangle.
    for (Allocation& mine : p_.allocations)
      if (mine.address() == a.address()) mine.args.push_back(arg);
    return t;
  }

  TensorView contiguous(const Allocation& a, Arg arg, DType dtype,
                        std::initializer_list<std::int64_t> shape) {
    std::vector<std::int64_t> stride(shape.size());
    std::int64_t step = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
      stride[d] = step;
      step *= *(shape.begin() + d);
    }
    TensorView t = view(a, arg, dtype, shape, {});
    std::copy(stride.begin(), stride.end(), t.stride.begin());
    return t;
  }

  // An index tensor [count] holding `values`, optionally with the host copy attached.
  TensorView index_tensor(std::string name, Arg arg, DType dtype,
                          const std::vector<std::int64_t>& values) {
    const Allocation& a = allocate(std::move(name), dtype, static_cast<std::int64_t>(values.size()));
    for (std::size_t i = 0; i < values.size(); ++i)
      store_index(a, dtype, static_cast<std::int64_t>(i), values[i]);
    TensorView t = contiguous(a, arg, dtype, {static_cast<std::int64_t>(values.size())});
    if (s_.host_values) t.values = values;
    return t;
  }

  void validate_spec() const {
    auto require = [](bool ok, const char* what) {
      if (!ok) throw std::invalid_argument(std::string("ProblemSpec: ") + what);
    };
    require(s_.slots.size() == s_.seq_lens.size(), "one slot per row");
    require(s_.slot_pad % 16 == 0 && s_.slot_pad >= 0, "slot_pad a multiple of 16");
    if (s_.entry == Entry::decode)
      require(std::all_of(s_.seq_lens.begin(), s_.seq_lens.end(),
                          [](std::int64_t l) { return l == 1; }),
              "decode rows hold one token each");
    if (s_.entry == Entry::verify || s_.entry == Entry::commit)
      require(s_.accepted.size() == s_.seq_lens.size(), "accepted has one entry per row");
  }

  // ---- token inputs ----

  // q, k, v: separate buffers, or slices of one packed projection; token rows padded.
  void token_inputs(OptionalView& q, OptionalView& k, OptionalView& v, OptionalView& gate_a,
                    OptionalView& gate_g, OptionalView& A_log, OptionalView& dt_bias,
                    OptionalView& b, OptionalView& beta, std::int64_t gate_rows) {
    const DType io = s_.io_dtype;
    const std::int64_t T = s_.total_tokens(), H = s_.H, HV = s_.HV, K = s_.K, V = s_.V;
    const std::int64_t pad = s_.token_pad_16B * 16 / element_size(io);
    if (s_.packed_qkv) {
      const std::int64_t row = 2 * H * K + HV * V + pad;
      const Allocation& a = allocate("qkv", io, T * row);
      q = view(a, Arg::q, io, {T, H, K}, {row, K, 1}, 0);
      k = view(a, Arg::k, io, {T, H, K}, {row, K, 1}, H * K);
      v = view(a, Arg::v, io, {T, HV, V}, {row, V, 1}, 2 * H * K);
    } else {
      q = view(allocate("q", io, T * (H * K + pad)), Arg::q, io, {T, H, K}, {H * K + pad, K, 1});
      k = view(allocate("k", io, T * (H * K + pad)), Arg::k, io, {T, H, K}, {H * K + pad, K, 1});
      v = view(allocate("v", io, T * (HV * V + pad)), Arg::v, io, {T, HV, V}, {HV * V + pad, V, 1});
    }
    // k is kept short without the in-kernel norm (E|k|^2 = 1) so beta |k|^2 < 2 and the delta
    // rule stays contractive over long sequences, as it is for normed keys.
    const double k_range = s_.use_qk_l2norm ? 1.0 : std::sqrt(3.0 / static_cast<double>(K));
    fill_view(*q, [&] { return random_.uniform(-1, 1); });
    fill_view(*k, [&] { return random_.uniform(-k_range, k_range); });
    fill_view(*v, [&] { return random_.uniform(-1, 1); });

    const bool raw = s_.gate_kind != GateKind::activated;
    const Allocation& gate_buffer = allocate(raw ? "a" : "g", s_.gate_dtype, gate_rows * HV * K);
    OptionalView& gate = raw ? gate_a : gate_g;
    gate = contiguous(gate_buffer, raw ? Arg::a : Arg::g, s_.gate_dtype, {gate_rows, HV, K});
    fill_view(*gate, [&] { return gate_value(); });
    if (raw) {
      A_log = contiguous(allocate("A_log", DType::f32, HV), Arg::A_log, DType::f32, {HV});
      // exp(A_log) in [1, 16] (the model's init) for softplus; about 1 for the bounded gate.
      fill_view(*A_log, [&] {
        return s_.gate_kind == GateKind::softplus ? std::log(random_.uniform(1, 16))
                                                  : random_.uniform(-0.5, 0.5);
      });
      if (s_.dt_bias) {
        dt_bias = contiguous(allocate("dt_bias", DType::f32, HV * K), Arg::dt_bias, DType::f32,
                             {HV * K});
        // inverse softplus of dt, dt log-uniform in [1e-3, 1e-1] (the model's init)
        fill_view(*dt_bias, [&] {
          return std::log(std::expm1(std::exp(random_.uniform(std::log(1e-3), std::log(1e-1)))));
        });
      }
    }

    const bool logits = s_.beta_kind == BetaKind::logits;
    const Allocation& beta_buffer = allocate(logits ? "b" : "beta", s_.beta_dtype, gate_rows * HV);
    OptionalView& beta_view = logits ? b : beta;
    beta_view = contiguous(beta_buffer, logits ? Arg::b : Arg::beta, s_.beta_dtype, {gate_rows, HV});
    fill_view(*beta_view,
              [&] { return logits ? random_.uniform(-3, 3) : random_.uniform(0.05, 0.95); });
  }

  double gate_value() {
    const bool strong = random_.chance(s_.strong_decay_fraction);
    switch (s_.gate_kind) {
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

  // ---- pools ----

  TensorView pool(std::string name, Arg arg, std::int64_t slots) {
    const DType dt = s_.state_dtype;
    const std::int64_t slot_stride = slot_elements(s_) + s_.slot_pad;
    const std::int64_t offset = s_.state_offset_32B * 32 / element_size(dt);
    const Allocation& a = allocate(std::move(name), dt, offset + slots * slot_stride);
    TensorView t = view(a, arg, dt, {slots, s_.HV, s_.V, s_.K},
                        {slot_stride, static_cast<std::int64_t>(s_.V) * s_.K, s_.K, 1}, offset);
    fill_view(t, [&] { return random_.uniform(-1, 1); });
    return t;
  }

  TensorView scratch() {
    const DType dt = s_.state_dtype;
    const std::int64_t slot_stride = slot_elements(s_) + s_.slot_pad;
    const std::int64_t offset = s_.state_offset_32B * 32 / element_size(dt);
    const std::int64_t flat = s_.scratch_rows * s_.scratch_steps;
    const Allocation& a = allocate("scratch", dt, offset + flat * slot_stride);
    TensorView t = view(a, Arg::scratch, dt, {s_.scratch_rows, s_.scratch_steps, s_.HV, s_.V, s_.K},
                        {s_.scratch_steps * slot_stride, slot_stride,
                         static_cast<std::int64_t>(s_.V) * s_.K, s_.K, 1},
                        offset);
    fill_view(t, [&] { return random_.uniform(-1, 1); });
    return t;
  }

  TensorView out() {
    const DType io = s_.io_dtype;
    const std::int64_t T = s_.total_tokens(), HV = s_.HV, V = s_.V;
    const std::int64_t row = HV * V + s_.token_pad_16B * 16 / element_size(io);
    return view(allocate("out", io, T * row), Arg::out, io, {T, HV, V}, {row, V, 1});
  }

  std::vector<std::int64_t> offsets() const {
    std::vector<std::int64_t> cu{0};
    for (std::int64_t l : s_.seq_lens) cu.push_back(cu.back() + l);
    return cu;
  }

  Scalars scalars() const {
    Scalars sc;
    sc.scale = s_.scale;
    if (s_.gate_kind == GateKind::bounded) sc.lower_bound = s_.lower_bound;
    sc.use_qk_l2norm = s_.use_qk_l2norm;
    if (s_.entry == Entry::verify || s_.entry == Entry::commit)
      sc.draft_token_num = s_.draft_tokens;
    return sc;
  }

  // ---- entry points ----

  void build_decode() {
    DecodeCall c;
    c.device = Device{Device::Kind::cpu, 0};
    const std::int64_t B = s_.rows();
    token_inputs(c.q, c.k, c.v, c.a, c.g, c.A_log, c.dt_bias, c.b, c.beta, B);
    c.state = pool("state", Arg::state, s_.pool_slots);
    c.cache_indices = index_tensor("cache_indices", Arg::cache_indices, DType::i32, s_.slots);
    if (s_.decode_cu_seqlens)
      c.cu_seqlens = index_tensor("cu_seqlens", Arg::cu_seqlens, DType::i32, offsets());
    c.out = out();
    c.scalars = scalars();
    p_.call = c;
  }

  void build_prefill() {
    PrefillCall c;
    c.device = Device{Device::Kind::cpu, 0};
    token_inputs(c.q, c.k, c.v, c.a, c.g, c.A_log, c.dt_bias, c.b, c.beta,
                 s_.total_tokens() + s_.extra_gate_rows);
    c.cu_seqlens = index_tensor("cu_seqlens", Arg::cu_seqlens, s_.cu_seqlens_dtype, offsets());
    c.initial_state = pool("initial_state", Arg::initial_state, s_.pool_slots);
    c.initial_state_indices =
        index_tensor("initial_state_indices", Arg::initial_state_indices, DType::i32, s_.slots);
    c.out = out();
    c.scalars = scalars();
    p_.call = c;
  }

  void build_speculative() {
    const std::int64_t N = s_.rows();
    VerifyCall vc;
    vc.device = Device{Device::Kind::cpu, 0};
    token_inputs(vc.q, vc.k, vc.v, vc.a, vc.g, vc.A_log, vc.dt_bias, vc.b, vc.beta,
                 s_.total_tokens());
    vc.cu_seqlens = index_tensor("cu_seqlens", Arg::cu_seqlens, DType::i32, offsets());
    vc.state = pool("state", Arg::state, s_.pool_slots);
    std::vector<std::int64_t> cache = s_.slots;
    cache.resize(static_cast<std::size_t>(N + s_.extra_index_entries), -1);
    vc.cache_indices = index_tensor("cache_indices", Arg::cache_indices, DType::i32, cache);
    vc.scratch = scratch();
    if (s_.scratch_row_map) {
      std::vector<std::int64_t> map(static_cast<std::size_t>(N + s_.extra_index_entries));
      std::iota(map.begin(), map.end(), 0);
      vc.scratch_row_map = index_tensor("scratch_row_map", Arg::scratch_row_map, DType::i32, map);
    }
    if (s_.scratch_indices) {
      const Allocation& a = allocate("scratch_indices", DType::i32, N * s_.draft_tokens);
      for (std::size_t i = 0; i < s_.scratch_indices->size(); ++i)
        store_index(a, DType::i32, static_cast<std::int64_t>(i), (*s_.scratch_indices)[i]);
      vc.scratch_indices = contiguous(a, Arg::scratch_indices, DType::i32, {N, s_.draft_tokens});
      if (s_.host_values) vc.scratch_indices->values = *s_.scratch_indices;
    }
    vc.out = out();
    vc.scalars = scalars();
    vc.scalars.draft_token_num = s_.draft_tokens;

    CommitCall cc;
    cc.device = vc.device;
    cc.scratch = vc.scratch;
    cc.scratch_row_map = vc.scratch_row_map;
    cc.scratch_indices = vc.scratch_indices;
    cc.state = vc.state;
    cc.cache_indices = vc.cache_indices;
    cc.accepted = index_tensor("accepted", Arg::accepted, DType::i32, s_.accepted);
    if (s_.commit_cu_seqlens) cc.cu_seqlens = vc.cu_seqlens;
    cc.scalars.draft_token_num = s_.draft_tokens;
    // Both calls view the shared buffers.
    for (Allocation& a : p_.allocations) {
      for (Arg arg : {Arg::scratch, Arg::scratch_row_map, Arg::scratch_indices, Arg::state,
                      Arg::cache_indices, Arg::cu_seqlens}) {
        const OptionalView* mine = find_argument_in(cc, arg);
        if (mine && *mine && (*mine)->address == a.address() &&
            std::find(a.args.begin(), a.args.end(), arg) == a.args.end())
          a.args.push_back(arg);
      }
    }
    p_.verify = vc;
    p_.commit = cc;
    if (s_.entry == Entry::verify) p_.call = vc;
    else p_.call = cc;
  }

  static const OptionalView* find_argument_in(const CommitCall& c, Arg arg) {
    const OptionalView* found = nullptr;
    for_each_argument(c, [&](Arg a, const OptionalView& v) {
      if (a == arg) found = &v;
    });
    return found;
  }

  // verify and commit specs carry one accepted count per row (0 where not given).
  static ProblemSpec normalized(ProblemSpec spec) {
    if (spec.entry == Entry::verify || spec.entry == Entry::commit)
      spec.accepted.resize(spec.seq_lens.size(), 0);
    return spec;
  }

  const ProblemSpec s_;
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

std::int64_t ProblemSpec::total_tokens() const {
  return std::accumulate(seq_lens.begin(), seq_lens.end(), std::int64_t{0});
}

std::string describe(const ProblemSpec& s) {
  static constexpr const char* kGate[] = {"softplus", "bounded", "activated"};
  std::string text = fmt::format(
      "{} H={} HV={} K={} V={} io={} state={} gate={}:{} beta={}:{} l2norm={} scale={} "
      "dt_bias={} lens=[{}] slots=[{}] S={}",
      entry_name(s.entry), s.H, s.HV, s.K, s.V, dtype_name(s.io_dtype), dtype_name(s.state_dtype),
      kGate[static_cast<int>(s.gate_kind)], dtype_name(s.gate_dtype),
      s.beta_kind == BetaKind::logits ? "logits" : "given", dtype_name(s.beta_dtype),
      s.use_qk_l2norm, s.scale ? fmt::format("{}", *s.scale) : std::string("default"), s.dt_bias,
      fmt::join(s.seq_lens, ","), fmt::join(s.slots, ","), s.pool_slots);
  if (s.gate_kind == GateKind::bounded) text += fmt::format(" lower_bound={}", s.lower_bound);
  if (s.entry == Entry::verify || s.entry == Entry::commit) {
    text += fmt::format(" T={} T_alloc={} S_spec={} accepted=[{}]", s.draft_tokens,
                        s.scratch_steps, s.scratch_rows, fmt::join(s.accepted, ","));
    if (s.scratch_indices) text += fmt::format(" scratch_indices=[{}]", fmt::join(*s.scratch_indices, ","));
  }
  text += fmt::format(
      " slot_pad={} state_offset_32B={} packed_qkv={} token_pad_16B={} extra_gate_rows={} "
      "extra_index_entries={} decode_cu_seqlens={} cu_dtype={} host_values={} strong_decay={}",
      s.slot_pad, s.state_offset_32B, s.packed_qkv, s.token_pad_16B, s.extra_gate_rows,
      s.extra_index_entries, s.decode_cu_seqlens, dtype_name(s.cu_seqlens_dtype), s.host_values,
      s.strong_decay_fraction);
  return text;
}

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
  using Kind = WrittenRegion::Kind;
  std::vector<WrittenRegion> regions;
  const ProblemSpec& s = spec;
  auto slot = [&](const TensorView& pool, std::int64_t flat, Kind kind) {
    regions.push_back({kind, flat, slice_rows(flat_pool(pool), flat, 1)});
  };
  switch (s.entry) {
    case Entry::decode: {
      const auto& c = std::get<DecodeCall>(call);
      regions.push_back({Kind::out, -1, *c.out});
      for (std::int64_t n = 0; n < s.rows(); ++n)
        if (s.slots[n] >= 0) slot(*c.state, s.slots[n], Kind::state_slot);
      break;
    }
    case Entry::prefill: {
      const auto& c = std::get<PrefillCall>(call);
      regions.push_back({Kind::out, -1, *c.out});
      for (std::int64_t n = 0; n < s.rows(); ++n)
        if (s.seq_lens[n] > 0) slot(*c.initial_state, s.slots[n], Kind::state_slot);
      break;
    }
    case Entry::verify:
      regions.push_back({Kind::out, -1, *verify->out});
      for (std::int64_t n = 0; n < s.rows(); ++n) {
        if (s.slots[n] < 0) continue;
        for (std::int64_t t = 0; t < s.seq_lens[n]; ++t) {
          const std::int64_t flat = s.scratch_indices ? (*s.scratch_indices)[n * s.draft_tokens + t]
                                                      : n * s.scratch_steps + t;
          if (flat >= 0) slot(*verify->scratch, flat, Kind::scratch_slot);
        }
      }
      break;
    case Entry::commit:
      for (std::int64_t n = 0; n < s.rows(); ++n)
        if (s.slots[n] >= 0 && s.accepted[n] > 0) slot(*commit->state, s.slots[n], Kind::state_slot);
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
                           static_cast<unsigned>(a.data()[b]), entry_name(spec.entry));
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
  auto poison_whole = [&](const TensorView& t) {
    const Allocation* a = allocation_of(t);
    const std::int64_t esize = element_size(t.dtype);
    for (std::size_t b = 0; b + esize <= a->bytes(); b += static_cast<std::size_t>(esize))
      store_poison(a->data() + b, t.dtype);
  };
  auto poison_view = [&](const TensorView& t) {
    const Allocation* a = allocation_of(t);
    const std::int64_t esize = element_size(t.dtype);
    for_each_element(t, [&](std::int64_t offset) { store_poison(a->data() + offset * esize, t.dtype); });
  };
  switch (spec.entry) {
    case Entry::decode: poison_whole(*std::get<DecodeCall>(call).out); break;
    case Entry::prefill: poison_whole(*std::get<PrefillCall>(call).out); break;
    case Entry::verify:
      poison_whole(*verify->out);
      poison_whole(*verify->scratch);
      break;
    case Entry::commit:
      for (std::int64_t n = 0; n < spec.rows(); ++n)
        if (spec.slots[n] >= 0 && spec.accepted[n] > 0)
          poison_view(slice_rows(*commit->state, spec.slots[n], 1));
      break;
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: break;  // not a HostProblem entry point
  }
}

AnyCall HostProblem::relocated(const AnyCall& c, Device device,
                               std::span<const std::uint64_t> new_bases) const {
  AnyCall moved = c;
  std::visit([&](auto& typed) { typed.device = device; }, moved);
  for_each_argument(moved, [&](Arg, OptionalView& v) {
    if (!v) return;
    const Allocation* a = allocation_of(*v);
    if (a == nullptr) throw std::invalid_argument("relocated: a view outside this problem");
    v->address = new_bases[static_cast<std::size_t>(a - allocations.data())];
    v->device.reset();
  });
  return moved;
}

HostProblem materialize(const ProblemSpec& spec, std::uint64_t seed) {
  return Builder(spec, seed).build();
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
