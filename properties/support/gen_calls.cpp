#include "gen_calls.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <sstream>

#include "kdaguard/contracts/supported.h"

namespace kdaguard::support {

using i64 = std::int64_t;

// ------------------------------------------------------------------------------------------------
// Choosers
// ------------------------------------------------------------------------------------------------

// Every choice is a small range, drawn uniformly (at RapidCheck's full size, not scaled down
// for early cases: a rare layout must not wait for the last cases); shrinking still heads to lo.
i64 RapidCheckChooser::pick(i64 lo, i64 hi) {
  if (hi <= lo) return lo;
  return *rc::gen::resize(rc::kNominalSize, rc::gen::inRange<i64>(lo, hi + 1));
}

i64 SeededChooser::pick(i64 lo, i64 hi) {
  if (hi <= lo) return lo;
  state_ += 0x9e3779b97f4a7c15ull;
  std::uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const std::uint64_t range = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo) + 1;
  return lo + static_cast<i64>(range == 0 ? z : z % range);
}

// ------------------------------------------------------------------------------------------------
// Plans
// ------------------------------------------------------------------------------------------------

i64 CallPlan::total_tokens() const {
  return std::accumulate(row_lengths.begin(), row_lengths.end(), i64{0});
}

void CallPlan::set_values(Arg a, bool on) {
  const std::uint32_t bit = 1u << static_cast<unsigned>(a);
  values_mask = on ? (values_mask | bit) : (values_mask & ~bit);
}

void CallPlan::set_all_values(bool on) {
  values_mask = on ? (values_mask | kIndexArgBits) : (values_mask & ~kIndexArgBits);
}

i64 CallPlan::scratch_slot(i64 n, i64 t) const {
  if (!explicit_scratch_indices) return n * T_alloc + t;
  if (!scratch_indices.empty()) {
    const auto i = static_cast<std::size_t>(n * T + t);
    return i < scratch_indices.size() ? scratch_indices[i] : -1;
  }
  const auto r = static_cast<std::size_t>(n);
  const bool active = r < slot_of_row.size() && slot_of_row[r] >= 0;
  const i64 row = r < scratch_row_of_row.size() ? scratch_row_of_row[r] : n;
  return active && t < row_lengths[r] ? row * T_alloc + t : -1;
}

namespace {

constexpr Arg kIndexArgs[] = {Arg::cache_indices, Arg::cu_seqlens, Arg::initial_state_indices,
                              Arg::scratch_row_map, Arg::scratch_indices, Arg::accepted};

// The first `count` entries of a random permutation of [0, n): shrinks towards 0, 1, 2, ...
std::vector<i64> draw_injection(i64 count, i64 n, Chooser& c) {
  std::vector<i64> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), i64{0});
  for (i64 i = 0; i < count && i < n; ++i)
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(c.pick(i, n - 1))]);
  perm.resize(static_cast<std::size_t>(std::min(count, n)));
  return perm;
}

}  // namespace

CallPlan draw_plan(Entry e, const PlanNeeds& needs, Chooser& c) {
  CallPlan p;
  p.entry = e;
  if (c.one_in(6)) p.device = Device{Device::Kind::cpu, 0};

  // Dimensions: HV = H * ratio with HV <= 4, K and V in {64, 128}.
  p.H = c.pick(1, 2);
  static constexpr i64 kRatios[] = {1, 2, 4};
  i64 ratio = c.element(kRatios);
  while (ratio < needs.min_heads_ratio) ratio *= 2;
  if (p.H * ratio > 4) p.H = 1;
  p.HV = p.H * ratio;
  // One coin per dim, as the seed corpora were written with (coin: the larger).
  static_assert(supported::kHeadDims.size() == 2);
  p.K = supported::kHeadDims[c.coin() ? 1 : 0];
  p.V = supported::kHeadDims[c.coin() ? 1 : 0];
  static constexpr DType kIo[] = {DType::bf16, DType::f16, DType::f32};
  p.io_dtype = c.element(kIo);
  p.raw_gate = needs.raw_gate.value_or(c.pick(0, 2) != 2);
  p.gate_dtype = (p.raw_gate || c.coin()) ? p.io_dtype : DType::f32;
  p.dt_bias = p.raw_gate && c.coin();
  if (p.raw_gate && c.coin()) p.lower_bound = -static_cast<double>(c.pick(1, 80)) / 8.0;
  p.beta_logits = !c.one_in(3);
  p.beta_dtype = c.coin() ? p.io_dtype : DType::f32;
  p.state_dtype = c.one_in(3) ? DType::bf16 : DType::f32;
  if (c.coin()) p.scale = static_cast<double>(c.pick(1, 400)) / 1000.0;
  p.use_qk_l2norm = c.coin();

  // Rows.
  const bool verify_like = e == Entry::verify || e == Entry::commit;
  if (verify_like) p.T = c.pick(std::max(1, needs.min_draft_tokens), std::max(4, needs.min_draft_tokens));
  const i64 min_rows = std::max({needs.min_rows, needs.min_active_rows, needs.min_rows_with_tokens,
                                 e == Entry::decode ? needs.min_tokens : 0,
                                 needs.min_tokens > 0 ? 1 : 0});
  const i64 n = c.pick(min_rows, std::max<i64>(min_rows, 5));
  p.row_lengths.assign(static_cast<std::size_t>(n), 1);
  if (e != Entry::decode) {
    const i64 max_len = verify_like ? p.T : 6;
    for (i64 r = 0; r < n; ++r)
      p.row_lengths[r] = c.pick(r < needs.min_rows_with_tokens ? 1 : 0, max_len);
    // Top up rows (within their limit) until T_tot reaches the minimum.
    for (i64 r = 0; r < n && p.total_tokens() < needs.min_tokens; ++r)
      p.row_lengths[r] = std::min(max_len, p.row_lengths[r] + (needs.min_tokens - p.total_tokens()));
  }

  // Slots: padding rows (not in prefill) and an injective slot map into a pool of S slots.
  std::vector<bool> active(static_cast<std::size_t>(n), true);
  if (e != Entry::prefill && needs.padding_rows)
    for (i64 r = needs.min_active_rows; r < n; ++r) active[r] = !c.one_in(4);
  const i64 num_active = std::count(active.begin(), active.end(), true);
  p.slots = num_active + c.pick(num_active == 0 ? 1 : 0, 3);
  const auto slots = draw_injection(num_active, p.slots, c);
  p.slot_of_row.assign(static_cast<std::size_t>(n), -1);
  for (i64 r = 0, next = 0; r < n; ++r)
    if (active[r]) p.slot_of_row[r] = slots[next++];

  p.extra_token_rows = e == Entry::commit ? 0 : c.pick(0, 2);
  p.extra_index_entries = c.pick(0, 2);
  p.cu_seqlens = (e == Entry::prefill || e == Entry::verify) || needs.cu_seqlens || c.coin();
  p.cu_dtype = (e == Entry::prefill && c.coin()) ? DType::i64 : DType::i32;

  // Layouts.
  p.packed_qkv = e != Entry::commit && c.coin();
  p.row_pad = c.pick(0, 2);
  p.head_pad = c.pick(0, 1);
  p.slot_pad = c.pick(0, 3);
  p.step_pad = c.pick(0, 2);
  p.pool_offset = c.pick(0, 3);
  p.view_offset = c.pick(0, 2);
  p.known_sizes = c.coin();
  p.arena = c.one_in(4);
  p.distinct_addresses = c.coin();
  p.explicit_device = c.one_in(4);

  // Scratch addressing: explicit scratch_indices allow any row map; without them the row map
  // must be the identity (verify.row_map_identity).
  if (verify_like) {
    p.T_alloc = p.T + c.pick(0, 2);
    p.S_spec = std::max<i64>(n, needs.min_scratch_rows) + c.pick(0, 2);
    p.explicit_scratch_indices = needs.explicit_scratch_indices.value_or(c.coin());
    if (p.explicit_scratch_indices) {
      p.scratch_row_of_row = draw_injection(n, p.S_spec, c);
    } else {
      p.scratch_row_of_row.resize(static_cast<std::size_t>(n));
      std::iota(p.scratch_row_of_row.begin(), p.scratch_row_of_row.end(), i64{0});
    }
    p.row_map = !p.explicit_scratch_indices || needs.row_map || c.coin();
    p.scratch_indices_pad = c.pick(0, 2);
  }
  if (e == Entry::commit) {
    p.accepted.resize(static_cast<std::size_t>(n));
    for (i64 r = 0; r < n; ++r) p.accepted[r] = c.pick(0, std::min(p.T, p.row_lengths[r]));
  }

  for (Arg a : kIndexArgs) p.set_values(a, needs.index_values || !c.one_in(3));
  return p;
}

// ------------------------------------------------------------------------------------------------
// Building a call from a plan
// ------------------------------------------------------------------------------------------------

namespace {

// Sizes or strides of up to kMaxRank dims, without a heap allocation (this runs per fuzz input).
struct Dims {
  std::array<i64, kMaxRank> v{};
  int rank = 0;
  Dims() = default;
  Dims(std::initializer_list<i64> values) {
    for (i64 x : values) v[static_cast<std::size_t>(rank++)] = x;
  }
  i64 operator[](int d) const { return v[static_cast<std::size_t>(d)]; }
};

i64 span_of(const Dims& shape, const Dims& stride) {
  i64 span = 0;
  for (int d = 0; d < shape.rank; ++d) {
    if (shape[d] <= 0) return -1;  // empty
    span += (shape[d] - 1) * stride[d];
  }
  return span;
}

Dims row_major(const Dims& shape) {
  Dims stride = shape;
  i64 step = 1;
  for (int d = shape.rank - 1; d >= 0; --d) {
    stride.v[static_cast<std::size_t>(d)] = step;
    step *= std::max<i64>(shape[d], 1);
  }
  return stride;
}

// Hands out allocations for the buffers of one call: each of its own (address 0 or a distinct
// fake address), or all placed disjointly in one shared arena. Listing them (lay_out) gives
// every buffer of its own a distinct address.
class Placer {
 public:
  Placer(const CallPlan& p, std::vector<PlacedBuffer>* list) : plan_(p), list_(list) {}

  struct Spot {
    std::uint64_t address = 0;
    i64 byte_offset = 0;  // start of this buffer inside the allocation
  };

  // A buffer of `bytes`; `shared` buffers hold several views and need a non-zero address.
  Spot place(i64 bytes, bool shared, std::string_view name) {
    if (plan_.arena) {
      Spot s{kArenaAddress, cursor_};
      cursor_ += round_up(std::max<i64>(bytes, 1), 256) + 256;
      return s;
    }
    if (shared || plan_.distinct_addresses || list_ != nullptr) {
      const Spot s{kFakeAddressBase + kFakeAddressPitch * (next_++), 0};
      if (list_ != nullptr) list_->push_back({name, s.address, bytes});
      return s;
    }
    return Spot{0, 0};
  }
  i64 arena_bytes() const { return cursor_; }
  // Lists the arena as one buffer, once every view is placed.
  void list_arena() {
    if (plan_.arena && list_ != nullptr) list_->push_back({"arena", kArenaAddress, cursor_});
  }

  static constexpr std::uint64_t kArenaAddress = kFakeAddressBase - kFakeAddressPitch;

 private:
  static i64 round_up(i64 x, i64 m) { return (x + m - 1) / m * m; }
  const CallPlan& plan_;
  std::vector<PlacedBuffer>* list_;
  i64 cursor_ = 0;
  std::uint64_t next_ = 0;
};

class Builder {
 public:
  // list: null for build_call; lay_out's list of buffers, every index tensor then carrying its
  // values.
  Builder(const CallPlan& p, std::vector<PlacedBuffer>* list)
      : p_(p), placer_(p, list), all_values_(list != nullptr) {}

  // A view of its own buffer, placed for `arg`: `lead_bytes` of headroom before element 0.
  TensorView buffer(Arg arg, DType dt, const Dims& shape, const Dims& stride, i64 lead_bytes) {
    const i64 es = element_size(dt);
    const i64 span = span_of(shape, stride);
    const i64 bytes = lead_bytes + (span + 1) * es;
    const auto spot = placer_.place(bytes, false, arg_name(arg));
    TensorView v = view(dt, shape, stride);
    v.address = spot.address;
    v.storage_offset = Elements{(spot.byte_offset + lead_bytes) / es};
    if (p_.known_sizes) v.storage_size = Elements{v.storage_offset.count + span + 1};
    return v;
  }

  TensorView view(DType dt, const Dims& shape, const Dims& stride) const {
    TensorView v;
    v.dtype = dt;
    v.rank = shape.rank;
    for (int d = 0; d < v.rank; ++d) {
      v.shape[d] = shape[d];
      v.stride[d] = stride[d];
    }
    if (p_.explicit_device) v.device = p_.device;
    return v;
  }

  TensorView index(DType dt, const Dims& shape, std::vector<i64> values, Arg arg,
                   Dims stride = {}) {
    if (stride.rank == 0) stride = row_major(shape);
    TensorView v = buffer(arg, dt, shape, stride, p_.view_offset * 16);
    if (all_values_ || p_.has_values(arg)) v.values = std::move(values);
    return v;
  }

  i64 unit(DType dt) const { return 16 / element_size(dt); }  // elements in 16 bytes

  // [rows, heads, dim] with padded head and row pitches.
  TensorView token_rows(Arg arg, DType dt, i64 rows, i64 heads, i64 dim, bool pad_heads) {
    const i64 head_stride = dim + (pad_heads ? p_.head_pad * unit(dt) : 0);
    const i64 row_stride = heads * head_stride + p_.row_pad * unit(dt);
    return buffer(arg, dt, {rows, heads, dim}, {row_stride, head_stride, 1}, p_.view_offset * 16);
  }

  // q, k, v: separate buffers or slices of one packed projection [rows, 2HK + HV*V + pad].
  void qkv(i64 rows, OptionalView& q, OptionalView& k, OptionalView& v) {
    const DType dt = p_.io_dtype;
    if (!p_.packed_qkv) {
      q = token_rows(Arg::q, dt, rows, p_.H, p_.K, true);
      k = token_rows(Arg::k, dt, rows, p_.H, p_.K, true);
      v = token_rows(Arg::v, dt, rows, p_.HV, p_.V, false);
      return;
    }
    const i64 hk = p_.H * p_.K, width = 2 * hk + p_.HV * p_.V + p_.row_pad * unit(dt);
    const i64 es = element_size(dt);
    const i64 lead = p_.view_offset * 16;
    const auto spot = placer_.place(lead + std::max<i64>(rows, 1) * width * es, true, "qkv");
    const i64 base = (spot.byte_offset + lead) / es;
    auto slice = [&](i64 column, i64 heads, i64 dim) {
      TensorView t = view(dt, {rows, heads, dim}, {width, dim, 1});
      t.address = spot.address;
      t.storage_offset = Elements{base + column};
      if (p_.known_sizes) t.storage_size = Elements{base + std::max<i64>(rows, 1) * width};
      return t;
    };
    q = slice(0, p_.H, p_.K);
    k = slice(hk, p_.H, p_.K);
    v = slice(2 * hk, p_.HV, p_.V);
  }

  // The per-token inputs and outputs shared by decode, prefill and verify.
  template <class Call> void token_inputs(Call& call, i64 rows) {
    qkv(rows, call.q, call.k, call.v);
    const i64 gate_rows = rows + p_.extra_token_rows;
    if (p_.raw_gate) {
      call.a = token_rows(Arg::a, p_.gate_dtype, gate_rows, p_.HV, p_.K, false);
      call.A_log = buffer(Arg::A_log, DType::f32, {p_.HV}, {1}, p_.view_offset * 16);
      if (p_.dt_bias)
        call.dt_bias = buffer(Arg::dt_bias, DType::f32, {p_.HV * p_.K}, {1}, p_.view_offset * 16);
    } else {
      call.g = token_rows(Arg::g, p_.gate_dtype, gate_rows, p_.HV, p_.K, false);
    }
    const Arg beta_arg = p_.beta_logits ? Arg::b : Arg::beta;
    TensorView beta = buffer(beta_arg, p_.beta_dtype, {gate_rows, p_.HV}, {p_.HV + p_.row_pad, 1},
                             p_.view_offset * 16);
    (p_.beta_logits ? call.b : call.beta) = beta;
    call.out = token_rows(Arg::out, p_.io_dtype, rows, p_.HV, p_.V, false);
    call.scalars.scale = p_.scale;
    call.scalars.lower_bound = p_.lower_bound;
    call.scalars.use_qk_l2norm = p_.use_qk_l2norm;
  }

  i64 slot_size() const { return p_.HV * p_.V * p_.K; }

  TensorView pool(Arg arg) {
    const i64 vk = p_.V * p_.K, slot = slot_size() + p_.slot_pad * 16;
    return buffer(arg, p_.state_dtype, {p_.slots, p_.HV, p_.V, p_.K}, {slot, vk, p_.K, 1},
                  p_.pool_offset * 32);
  }

  TensorView scratch() {
    const i64 vk = p_.V * p_.K, step = slot_size() + p_.step_pad * 16;
    return buffer(Arg::scratch, p_.state_dtype, {p_.S_spec, p_.T_alloc, p_.HV, p_.V, p_.K},
                  {p_.T_alloc * step, step, vk, p_.K, 1}, p_.pool_offset * 32);
  }

  std::vector<i64> with_junk(std::vector<i64> values) const {
    for (i64 i = 0; i < p_.extra_index_entries; ++i) values.push_back(1000 + i);
    return values;
  }

  std::vector<i64> cu_values() const {
    std::vector<i64> cu{0};
    for (i64 len : p_.row_lengths) cu.push_back(cu.back() + len);
    return cu;
  }

  TensorView cu_seqlens() {
    return index(p_.cu_dtype, {p_.rows() + 1}, cu_values(), Arg::cu_seqlens);
  }

  TensorView slot_map(Arg arg) {
    return index(DType::i32, {p_.rows() + p_.extra_index_entries}, with_junk(p_.slot_of_row), arg);
  }

  // Verify and commit: the scratch and how rows address it.
  template <class Call> void scratch_addressing(Call& call) {
    const i64 n = p_.rows();
    call.scratch = scratch();
    if (p_.row_map) {
      std::vector<i64> map = p_.scratch_row_of_row;
      for (i64 r = static_cast<i64>(map.size()); r < n; ++r) map.push_back(r);  // identity
      map.resize(static_cast<std::size_t>(n));
      call.scratch_row_map = index(DType::i32, {n + p_.extra_index_entries}, with_junk(map),
                                   Arg::scratch_row_map);
    }
    if (p_.explicit_scratch_indices) {
      std::vector<i64> flat;
      for (i64 r = 0; r < n; ++r)
        for (i64 t = 0; t < p_.T; ++t) flat.push_back(p_.scratch_slot(r, t));
      call.scratch_indices = index(DType::i32, {n, p_.T}, std::move(flat), Arg::scratch_indices,
                                   {p_.T + p_.scratch_indices_pad, 1});
    }
    call.scalars.draft_token_num = p_.T;
  }

  // The call of the plan's entry point.
  void build(AnyCall& result) {
    std::visit(
        [&](auto& call) {
          using Call = std::decay_t<decltype(call)>;
          call.device = p_.device;
          if constexpr (std::is_same_v<Call, DecodeCall>) {
            token_inputs(call, p_.rows());
            call.state = pool(Arg::state);
            call.cache_indices = slot_map(Arg::cache_indices);
            if (p_.cu_seqlens) call.cu_seqlens = cu_seqlens();
          } else if constexpr (std::is_same_v<Call, PrefillCall>) {
            token_inputs(call, p_.total_tokens());
            call.cu_seqlens = cu_seqlens();
            call.initial_state = pool(Arg::initial_state);
            call.initial_state_indices = slot_map(Arg::initial_state_indices);
          } else if constexpr (std::is_same_v<Call, VerifyCall>) {
            verify(call);
          } else {
            call.state = pool(Arg::state);
            call.cache_indices = slot_map(Arg::cache_indices);
            scratch_addressing(call);
            call.accepted = index(DType::i32, {p_.rows()}, p_.accepted, Arg::accepted);
            if (p_.cu_seqlens) call.cu_seqlens = cu_seqlens();
          }
        },
        result);
    finish(result);
  }

  void verify(VerifyCall& call) {
    token_inputs(call, p_.total_tokens());
    call.cu_seqlens = cu_seqlens();
    call.state = pool(Arg::state);
    call.cache_indices = slot_map(Arg::cache_indices);
    scratch_addressing(call);
  }

  // A verify call, and the commit call over its buffers (plus accepted, one count per row).
  void verify_and_commit(VerifyCall& vc, CommitCall& cc) {
    vc.device = cc.device = p_.device;
    verify(vc);
    cc.scratch = vc.scratch;
    cc.scratch_row_map = vc.scratch_row_map;
    cc.scratch_indices = vc.scratch_indices;
    cc.state = vc.state;
    cc.cache_indices = vc.cache_indices;
    std::vector<i64> accepted = p_.accepted;
    accepted.resize(static_cast<std::size_t>(p_.rows()), 0);
    cc.accepted = index(DType::i32, {p_.rows()}, std::move(accepted), Arg::accepted);
    if (p_.cu_seqlens) cc.cu_seqlens = vc.cu_seqlens;
    cc.scalars.draft_token_num = p_.T;
    AnyCall v = vc, c = cc;
    finish(v);
    finish(c);
    vc = std::get<VerifyCall>(v);
    cc = std::get<CommitCall>(c);
  }

  void finish(AnyCall& call) {
    if (!p_.arena || !p_.known_sizes) return;
    for_each_argument(call, [&](Arg, OptionalView& v) {
      if (v && v->address == Placer::kArenaAddress)
        v->storage_size = Elements{placer_.arena_bytes() / element_size(v->dtype)};
    });
  }

  void list_arena() { placer_.list_arena(); }

 private:
  const CallPlan& p_;
  Placer placer_;
  bool all_values_;
};

}  // namespace

AnyCall build_call(const CallPlan& p) {
  Builder b(p, nullptr);
  AnyCall result = make_call(p.entry);
  b.build(result);
  return result;
}

LaidOutCall lay_out(const CallPlan& p) {
  LaidOutCall out{make_call(p.entry), {}, {}, {}};
  Builder b(p, &out.buffers);
  if (p.entry == Entry::verify || p.entry == Entry::commit) {
    VerifyCall vc;
    CommitCall cc;
    b.verify_and_commit(vc, cc);
    out.verify = vc;
    out.commit = cc;
    if (p.entry == Entry::verify) out.call = vc;
    else out.call = cc;
  } else {
    b.build(out.call);
  }
  b.list_arena();
  return out;
}

GeneratedCall generate_call(Entry e, const PlanNeeds& needs, Chooser& choose) {
  GeneratedCall g{draw_plan(e, needs, choose), make_call(e), {}};
  g.call = build_call(g.plan);
  return g;
}

// ------------------------------------------------------------------------------------------------
// RapidCheck generators
// ------------------------------------------------------------------------------------------------

rc::Gen<CallPlan> gen_plan(Entry e, PlanNeeds needs) {
  return rc::gen::exec([e, needs] {
    RapidCheckChooser choose;
    return draw_plan(e, needs, choose);
  });
}

rc::Gen<GeneratedCall> gen_call(Entry e, PlanNeeds needs) {
  return rc::gen::map(gen_plan(e, needs), [](CallPlan plan) {
    AnyCall call = build_call(plan);
    return GeneratedCall{std::move(plan), std::move(call), {}};
  });
}

rc::Gen<Entry> gen_entry(std::uint8_t entry_mask) {
  std::vector<Entry> entries;
  for (Entry e : {Entry::decode, Entry::prefill, Entry::verify, Entry::commit})
    if ((entry_mask >> static_cast<int>(e)) & 1u) entries.push_back(e);
  // An index rather than gen::elementOf, so a counterexample shrinks towards decode.
  return rc::gen::map(rc::gen::inRange<std::size_t>(0, entries.size()),
                      [entries](std::size_t i) { return entries[i]; });
}

rc::Gen<GeneratedCall> gen_any_call(PlanNeeds needs) {
  return rc::gen::mapcat(gen_entry(), [needs](Entry e) { return gen_call(e, needs); });
}

// ------------------------------------------------------------------------------------------------
// Printing
// ------------------------------------------------------------------------------------------------

namespace {

template <class Call> std::string describe_any(const Call& call) {
  std::string text = fmt::format("{{\"entry\": \"{}\", \"device\": \"{}\", \"tensors\": {{",
                                 entry_name(entry_of(call)), device_name(device_of(call)));
  bool first = true;
  for_each_argument(call, [&](Arg a, const OptionalView& v) {
    if (!v) return;
    const std::span<const i64> shape(v->shape.data(), static_cast<std::size_t>(std::clamp(v->rank, 0, kMaxRank)));
    const std::span<const i64> stride(v->stride.data(), shape.size());
    text += fmt::format("{}\n  \"{}\": {{\"dtype\": \"{}\", \"shape\": [{}], \"stride\": [{}], "
                        "\"storage_offset\": {}, \"address\": {}",
                        first ? "" : ",", arg_name(a), dtype_name(v->dtype), fmt::join(shape, ", "),
                        fmt::join(stride, ", "), v->storage_offset.count, v->address);
    if (v->device) text += fmt::format(", \"device\": \"{}\"", device_name(*v->device));
    if (v->storage_size) text += fmt::format(", \"storage_size\": {}", v->storage_size->count);
    if (v->values) text += fmt::format(", \"values\": [{}]", fmt::join(*v->values, ", "));
    text += "}";
    first = false;
  });
  const Scalars& s = scalars_of(call);
  text += "},\n \"scalars\": {";
  std::vector<std::string> scalars;
  if (s.scale) scalars.push_back(fmt::format("\"scale\": {}", *s.scale));
  if (s.lower_bound) scalars.push_back(fmt::format("\"lower_bound\": {}", *s.lower_bound));
  scalars.push_back(fmt::format("\"use_qk_l2norm\": {}", s.use_qk_l2norm));
  if (s.draft_token_num) scalars.push_back(fmt::format("\"draft_token_num\": {}", *s.draft_token_num));
  text += fmt::format("{}}}}}", fmt::join(scalars, ", "));
  return text;
}

}  // namespace

std::string describe_call(const AnyCall& call) { return describe_any(call); }
std::string describe_catalogue_call(const CatalogueCall& call) { return describe_any(call); }

bool same_verdict(const Verdict& x, const Verdict& y) {
  if (x.violations.size() != y.violations.size() || x.deferred.size() != y.deferred.size())
    return false;
  for (std::size_t i = 0; i < x.violations.size(); ++i) {
    const Violation &a = x.violations[i], &b = y.violations[i];
    if (a.rule != b.rule || a.argument != b.argument || a.message != b.message) return false;
  }
  for (std::size_t i = 0; i < x.deferred.size(); ++i)
    if (x.deferred[i].rule != y.deferred[i].rule || x.deferred[i].argument != y.deferred[i].argument)
      return false;
  return true;
}

std::ostream& operator<<(std::ostream& os, const CallPlan& p) {
  os << fmt::format(
      "plan{{{} {} H={} HV={} K={} V={} io={} gate={}({}) beta={}({}) state={} scale={} "
      "lower_bound={} l2norm={} dt_bias={} row_lengths=[{}] slot_of_row=[{}] S={}",
      entry_name(p.entry), device_name(p.device), p.H, p.HV, p.K, p.V, dtype_name(p.io_dtype),
      p.raw_gate ? "a" : "g", dtype_name(p.gate_dtype), p.beta_logits ? "b" : "beta",
      dtype_name(p.beta_dtype), dtype_name(p.state_dtype),
      p.scale ? fmt::format("{}", *p.scale) : std::string("default"),
      p.lower_bound ? fmt::format("{}", *p.lower_bound) : std::string("none"), p.use_qk_l2norm,
      p.dt_bias, fmt::join(p.row_lengths, ","), fmt::join(p.slot_of_row, ","), p.slots);
  if (p.entry == Entry::verify || p.entry == Entry::commit)
    os << fmt::format(
        " T={} T_alloc={} S_spec={} scratch_row_of_row=[{}] row_map={} explicit_indices={} "
        "scratch_indices=[{}] scratch_indices_pad={} accepted=[{}]",
        p.T, p.T_alloc, p.S_spec, fmt::join(p.scratch_row_of_row, ","), p.row_map,
        p.explicit_scratch_indices, fmt::join(p.scratch_indices, ","), p.scratch_indices_pad,
        fmt::join(p.accepted, ","));
  os << fmt::format(
      " extra_token_rows={} extra_index_entries={} cu_seqlens={}({}) packed_qkv={} row_pad={} "
      "head_pad={} slot_pad={} step_pad={} pool_offset={} view_offset={} known_sizes={} arena={} "
      "distinct_addresses={} explicit_device={} values_mask={:#x} strong_decay={}}}",
      p.extra_token_rows, p.extra_index_entries, p.cu_seqlens, dtype_name(p.cu_dtype),
      p.packed_qkv, p.row_pad, p.head_pad, p.slot_pad, p.step_pad, p.pool_offset, p.view_offset,
      p.known_sizes, p.arena, p.distinct_addresses, p.explicit_device, p.values_mask,
      p.strong_decay_fraction);
  return os;
}

std::string describe(const CallPlan& plan) {
  std::ostringstream os;
  os << plan;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const GeneratedCall& g) {
  return os << g.plan << "\n" << describe_call(g.call);
}

}  // namespace kdaguard::support

void kdaguard::showValue(Entry e, std::ostream& os) { os << entry_name(e); }
