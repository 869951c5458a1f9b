#include "bounds_oracle.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <optional>

namespace kdaguard::support {

using i64 = std::int64_t;
using i128 = __int128;

std::string BoundsReport::summary() const {
  std::string text = fmt::format("{} byte ranges walked{}", ranges, complete ? "" : " (capped)");
  for (const auto& f : findings) text += "\n  " + f;
  return text;
}

namespace {

constexpr std::size_t kMaxFindings = 16;

// Checked arithmetic: absurd views (the fuzzers make them) must not overflow the oracle itself.
std::optional<i128> mul(i128 a, i128 b) {
  i128 r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<i128> add(i128 a, i128 b) {
  i128 r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<i64> add64(i64 a, i64 b) {
  i64 r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<i64> mul64(i64 a, i64 b) {
  i64 r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

struct Range {
  int space;      // 0: absolute addresses; 1 + arg: an allocation of its own (address 0)
  i128 begin, end;  // bytes, [begin, end)
  Arg arg;
  bool write;
};

// [lo, hi) per dim of the box of elements one access touches.
struct Box {
  std::array<i64, kMaxRank> lo{}, hi{};
  int rank = 0;
};

Box box(std::initializer_list<std::pair<i64, i64>> dims) {
  Box b;
  for (auto [lo, hi] : dims) {
    b.lo[b.rank] = lo;
    b.hi[b.rank] = hi;
    ++b.rank;
  }
  return b;
}

class Walker {
 public:
  Walker(const AnyCall& call, BoundsReport& report, i64 max_ranges)
      : call_(call), report_(report), max_ranges_(max_ranges) {}

  const TensorView* view(Arg a) const {
    const OptionalView* v = find_argument(call_, a);
    return v && *v ? &**v : nullptr;
  }

  void finding(std::string text) {
    if (report_.findings.size() < kMaxFindings) report_.findings.push_back(std::move(text));
  }

  // A required argument: its absence is a finding (an accepted call has it).
  const TensorView* need(Arg a) {
    const TensorView* t = view(a);
    if (t == nullptr) finding(fmt::format("{} is absent but the entry point needs it", arg_name(a)));
    return t;
  }

  // Size of dim d of `a`, when `a` is present with the expected rank.
  std::optional<i64> dim(Arg a, int d, int rank) {
    const TensorView* t = need(a);
    if (t == nullptr) return std::nullopt;
    if (t->rank != rank) {
      finding(fmt::format("{} has rank {}; the entry point indexes it with {} dims", arg_name(a),
                          t->rank, rank));
      return std::nullopt;
    }
    return t->shape[d];
  }

  // The host value of index tensor `a` at a row-major position, when known and present.
  std::optional<i64> value(Arg a, i64 position) {
    const TensorView* t = view(a);
    if (t == nullptr || !t->values || position < 0 ||
        position >= static_cast<i64>(t->values->size()))
      return std::nullopt;
    return (*t->values)[static_cast<std::size_t>(position)];
  }
  bool has_values(Arg a) {
    const TensorView* t = view(a);
    return t != nullptr && t->values.has_value();
  }

  // Touches every element of `b` in argument `a`.
  void touch(Arg a, bool write, const Box& b) {
    const TensorView* t = need(a);
    if (t == nullptr) return;
    const std::string_view name = arg_name(a);
    if (t->rank != b.rank || t->rank < 0 || t->rank > kMaxRank) {
      finding(fmt::format("{} has rank {}; the entry point indexes it with {} dims", name, t->rank,
                          b.rank));
      return;
    }
    for (int d = 0; d < b.rank; ++d) {
      if (b.lo[d] >= b.hi[d]) return;  // nothing touched
      if (b.lo[d] < 0 || b.hi[d] > t->shape[d]) {
        finding(fmt::format("{} {} dim {} range [{}, {}) lies outside its size {}", write ? "writes" : "reads",
                            name, d, b.lo[d], b.hi[d], t->shape[d]));
        return;
      }
    }
    // The sub-view: sizes, strides and the element offset of its first element.
    std::array<i64, kMaxRank> size{}, stride{};
    int n = 0;
    std::optional<i128> first = t->storage_offset.count;
    for (int d = 0; d < b.rank && first; ++d) {
      const auto step = mul(b.lo[d], t->stride[d]);
      first = step ? add(*first, *step) : std::nullopt;
      const i64 extent = b.hi[d] - b.lo[d];
      if (extent == 1) continue;
      // Merge with the previous dim when the two are laid out as one.
      const auto merged = n > 0 ? mul64(size[n - 1], extent) : std::nullopt;
      if (merged && static_cast<i128>(stride[n - 1]) == static_cast<i128>(extent) * t->stride[d]) {
        size[n - 1] = *merged;
        stride[n - 1] = t->stride[d];
        continue;
      }
      size[n] = extent;
      stride[n] = t->stride[d];
      ++n;
    }
    if (!first) {
      finding(fmt::format("{}: an element offset overflows 128-bit arithmetic", name));
      return;
    }
    // The innermost dim is one run when its stride is 1 (or -1: the same bytes, backwards).
    i64 run = 1;
    i128 run_start_shift = 0;
    if (n > 0 && (stride[n - 1] == 1 || stride[n - 1] == -1)) {
      run = size[n - 1];
      if (stride[n - 1] == -1) run_start_shift = -(static_cast<i128>(run) - 1);
      --n;
    }
    i128 runs = 1;
    for (int d = 0; d < n; ++d) {
      runs *= size[d];
      if (report_.ranges + runs > max_ranges_) {
        report_.complete = false;
        return;
      }
    }
    if (report_.ranges + runs > max_ranges_) {
      report_.complete = false;
      return;
    }
    const i64 es = element_size(t->dtype);
    std::array<i64, kMaxRank> at{};
    for (i128 r = 0; r < runs; ++r) {
      std::optional<i128> offset = add(*first, run_start_shift);
      for (int d = 0; d < n && offset; ++d) {
        const auto step = mul(at[d], stride[d]);
        offset = step ? add(*offset, *step) : std::nullopt;
      }
      if (!offset) {
        finding(fmt::format("{}: an element offset overflows 128-bit arithmetic", name));
        return;
      }
      add_range(*t, a, write, *offset, run, es);
      for (int d = n - 1; d >= 0; --d) {  // odometer
        if (++at[d] < size[d]) break;
        at[d] = 0;
      }
    }
  }

  // Whether the walk has run out of its budget (ranges, or findings worth reporting): loops over
  // rows stop then.
  bool exhausted() const { return !report_.complete || report_.findings.size() >= kMaxFindings; }

  void add_range(const TensorView& t, Arg a, bool write, i128 first, i64 count, i64 es) {
    ++report_.ranges;
    const std::string_view name = arg_name(a);
    // Past 2^96 elements no allocation can hold it; keeping below keeps the byte math exact.
    constexpr i128 kFar = static_cast<i128>(1) << 96;
    if (first < 0) {
      finding(fmt::format("{} touches an element before the start of its allocation (offset {})",
                          name, static_cast<long double>(first)));
      return;
    }
    const i128 last = first + count - 1;
    if (t.storage_size && last >= t.storage_size->count) {
      finding(fmt::format("{} touches element {} of an allocation of {} elements", name,
                          static_cast<long double>(last), t.storage_size->count));
      return;
    }
    if (last >= kFar) {
      finding(fmt::format("{} touches element {}, past any address space", name,
                          static_cast<long double>(last)));
      return;
    }
    Range r{0, first * es, (last + 1) * es, a, write};
    if (t.address == 0) {
      r.space = 1 + static_cast<int>(a);
    } else {
      r.begin += t.address;
      r.end += t.address;
      if (r.end > (static_cast<i128>(1) << 64)) {
        finding(fmt::format("{} touches bytes past the 64-bit address space", name));
        return;
      }
    }
    ranges_.push_back(r);
  }

  // Writes that land in another argument, or twice on the same bytes.
  void check_overlaps() {
    std::sort(ranges_.begin(), ranges_.end(), [](const Range& x, const Range& y) {
      if (x.space != y.space) return x.space < y.space;
      return x.begin < y.begin;
    });
    std::vector<const Range*> open;
    for (const Range& r : ranges_) {
      std::erase_if(open, [&](const Range* o) { return o->space != r.space || o->end <= r.begin; });
      for (const Range* o : open) {
        if (!o->write && !r.write) continue;
        if (o->arg == r.arg && (!o->write || !r.write)) continue;  // in-place update
        const Range& w = o->write ? *o : r;
        const Range& other = o->write ? r : *o;
        if (w.arg == other.arg)
          finding(fmt::format("{} bytes [{:#x}, +{}) are written twice", arg_name(w.arg),
                              static_cast<std::uint64_t>(std::max(w.begin, other.begin)),
                              static_cast<i64>(std::min(w.end, other.end) - std::max(w.begin, other.begin))));
        else
          finding(fmt::format("output {} writes bytes that {} {}", arg_name(w.arg),
                              arg_name(other.arg), other.write ? "also writes" : "reads"));
      }
      open.push_back(&r);
      if (open.size() > 64) open.erase(open.begin());  // bounded: generated calls rarely stack
    }
  }

 private:
  const AnyCall& call_;
  BoundsReport& report_;
  i64 max_ranges_;
  std::vector<Range> ranges_;
};

// ------------------------------------------------------------------------------------------------
// What each entry point touches
// ------------------------------------------------------------------------------------------------

// x + 1, saturating (row counts from absurd shapes).
i64 plus1(i64 x) { return x == std::numeric_limits<i64>::max() ? x : x + 1; }

struct TokenDims {
  i64 rows = 0, H = 0, K = 0, HV = 0, V = 0;
};

std::optional<TokenDims> token_dims(Walker& w) {
  auto rows = w.dim(Arg::q, 0, 3), H = w.dim(Arg::q, 1, 3), K = w.dim(Arg::q, 2, 3);
  auto HV = w.dim(Arg::v, 1, 3), V = w.dim(Arg::v, 2, 3);
  if (!rows || !H || !K || !HV || !V) return std::nullopt;
  return TokenDims{*rows, *H, *K, *HV, *V};
}

// Tokens [t0, t1) of the per-token inputs and the output rows.
void touch_tokens(Walker& w, const TokenDims& d, i64 t0, i64 t1) {
  w.touch(Arg::q, false, box({{t0, t1}, {0, d.H}, {0, d.K}}));
  w.touch(Arg::k, false, box({{t0, t1}, {0, d.H}, {0, d.K}}));
  w.touch(Arg::v, false, box({{t0, t1}, {0, d.HV}, {0, d.V}}));
  w.touch(w.view(Arg::a) ? Arg::a : Arg::g, false, box({{t0, t1}, {0, d.HV}, {0, d.K}}));
  w.touch(w.view(Arg::b) ? Arg::b : Arg::beta, false, box({{t0, t1}, {0, d.HV}}));
  w.touch(Arg::out, true, box({{t0, t1}, {0, d.HV}, {0, d.V}}));
}

void touch_gate_params(Walker& w, const TokenDims& d) {
  if (w.view(Arg::a)) w.touch(Arg::A_log, false, box({{0, d.HV}}));
  if (w.view(Arg::dt_bias))
    w.touch(Arg::dt_bias, false, box({{0, mul64(d.HV, d.K).value_or(std::numeric_limits<i64>::max())}}));
}

// Slot `slot` of a pool [S, HV, V, K] (all slots when the slot is unknown).
void touch_pool(Walker& w, Arg pool, std::optional<i64> slot, bool write) {
  const TensorView* t = w.need(pool);
  if (t == nullptr) return;
  if (t->rank != 4) {
    w.finding(fmt::format("{} has rank {}; pools are [S, HV, V, K]", arg_name(pool), t->rank));
    return;
  }
  if (slot && (*slot < 0 || *slot >= t->shape[0])) {
    w.finding(fmt::format("{} slot {} lies outside its {} slots", arg_name(pool), *slot, t->shape[0]));
    return;
  }
  const i64 lo = slot.value_or(0), hi = slot ? *slot + 1 : t->shape[0];
  w.touch(pool, false, box({{lo, hi}, {0, t->shape[1]}, {0, t->shape[2]}, {0, t->shape[3]}}));
  if (write)
    w.touch(pool, true, box({{lo, hi}, {0, t->shape[1]}, {0, t->shape[2]}, {0, t->shape[3]}}));
}

// Flat scratch slot `flat` (row * T_alloc + step) of the scratch [S_spec, T_alloc, HV, V, K],
// with the state's inner dims.
void touch_scratch(Walker& w, i64 flat, i64 HV, i64 V, i64 K, bool write) {
  const TensorView* s = w.view(Arg::scratch);
  if (s == nullptr || s->rank != 5 || s->shape[1] <= 0) {
    w.finding("the scratch is not a [S_spec, T_alloc, HV, V, K] pool");
    return;
  }
  const i64 steps = s->shape[1];
  if (flat < 0 || flat / steps >= s->shape[0]) {
    w.finding(fmt::format("scratch slot {} lies outside the scratch's {} slots", flat,
                          s->shape[0] * steps));
    return;
  }
  w.touch(Arg::scratch, write,
          box({{flat / steps, flat / steps + 1}, {flat % steps, flat % steps + 1}, {0, HV}, {0, V},
               {0, K}}));
}

void touch_whole(Walker& w, Arg a, bool write) {
  const TensorView* t = w.view(a);
  if (t == nullptr || t->rank < 0 || t->rank > kMaxRank) return;
  Box b;
  b.rank = t->rank;
  for (int d = 0; d < t->rank; ++d) b.hi[d] = t->shape[d];
  w.touch(a, write, b);
}

void walk_decode(Walker& w) {
  const auto d = token_dims(w);
  if (!d) return;
  touch_tokens(w, *d, 0, d->rows);
  touch_gate_params(w, *d);
  w.touch(Arg::cache_indices, false, box({{0, d->rows}}));
  if (w.view(Arg::cu_seqlens)) w.touch(Arg::cu_seqlens, false, box({{0, plus1(d->rows)}}));
  if (!w.has_values(Arg::cache_indices)) {
    touch_pool(w, Arg::state, std::nullopt, true);
    return;
  }
  for (i64 b = 0; b < d->rows && !w.exhausted(); ++b) {
    const auto slot = w.value(Arg::cache_indices, b);
    if (slot && *slot == -1) continue;  // padding row: state untouched
    touch_pool(w, Arg::state, slot, true);
  }
}

// Token ranges of the N rows from cu_seqlens; nullopt when the values are not on the host.
std::optional<std::vector<std::pair<i64, i64>>> row_ranges(Walker& w, i64 n) {
  if (!w.has_values(Arg::cu_seqlens)) return std::nullopt;
  std::vector<std::pair<i64, i64>> rows;
  if (n > (1 << 20)) return std::nullopt;
  for (i64 r = 0; r < n; ++r) {
    const auto b = w.value(Arg::cu_seqlens, r), e = w.value(Arg::cu_seqlens, r + 1);
    if (!b || !e) return std::nullopt;
    rows.emplace_back(*b, *e);
  }
  return rows;
}

void walk_prefill(Walker& w) {
  const auto d = token_dims(w);
  const auto cu_len = w.dim(Arg::cu_seqlens, 0, 1);
  if (!d || !cu_len) return;
  const i64 n = *cu_len - 1;
  touch_gate_params(w, *d);
  w.touch(Arg::cu_seqlens, false, box({{0, plus1(n)}}));
  w.touch(Arg::initial_state_indices, false, box({{0, n}}));
  const auto rows = row_ranges(w, n);
  if (rows) {
    for (auto [t0, t1] : *rows) {
      if (w.exhausted()) break;
      touch_tokens(w, *d, t0, t1);
    }
  } else {
    touch_tokens(w, *d, 0, d->rows);
  }
  if (!w.has_values(Arg::initial_state_indices)) {
    touch_pool(w, Arg::initial_state, std::nullopt, true);
    return;
  }
  for (i64 r = 0; r < n && !w.exhausted(); ++r)
    touch_pool(w, Arg::initial_state, w.value(Arg::initial_state_indices, r), true);
}

std::optional<i64> draft_tokens(const AnyCall& call, Walker& w) {
  const auto T = scalars_of(call).draft_token_num;
  if (!T || *T < 0) {
    w.finding("draft_token_num is absent or negative");
    return std::nullopt;
  }
  return *T;
}

std::optional<i64> scratch_steps(Walker& w) {
  const TensorView* s = w.need(Arg::scratch);
  if (s == nullptr || s->rank != 5 || s->shape[1] <= 0) {
    if (s) w.finding("the scratch is not a [S_spec, T_alloc, HV, V, K] pool with T_alloc > 0");
    return std::nullopt;
  }
  return s->shape[1];
}

// The flat scratch slot of (row, step): explicit scratch_indices or row * T_alloc + step.
// nullopt: unknown (no host values); -1: skipped.
std::optional<i64> flat_slot(Walker& w, i64 row, i64 step, i64 T, i64 steps) {
  const i64 per_row = w.view(Arg::scratch_indices) ? T : steps;
  const auto base = mul64(row, per_row);
  const auto flat = base ? add64(*base, step) : std::nullopt;
  if (!flat) {
    w.finding(fmt::format("the scratch slot of row {} step {} overflows 64-bit arithmetic", row, step));
    return std::nullopt;
  }
  if (w.view(Arg::scratch_indices)) return w.value(Arg::scratch_indices, *flat);
  return *flat;
}

void read_addressing_maps(Walker& w, i64 n, i64 T) {
  w.touch(Arg::cache_indices, false, box({{0, n}}));
  if (w.view(Arg::scratch_row_map) && !w.view(Arg::scratch_indices))
    w.touch(Arg::scratch_row_map, false, box({{0, n}}));
  if (w.view(Arg::scratch_indices)) w.touch(Arg::scratch_indices, false, box({{0, n}, {0, T}}));
}

void walk_verify(const AnyCall& call, Walker& w) {
  const auto d = token_dims(w);
  const auto cu_len = w.dim(Arg::cu_seqlens, 0, 1);
  const auto T = draft_tokens(call, w);
  const auto steps = scratch_steps(w);
  if (!d || !cu_len || !T || !steps) return;
  const i64 n = *cu_len - 1;
  touch_gate_params(w, *d);
  w.touch(Arg::cu_seqlens, false, box({{0, plus1(n)}}));
  read_addressing_maps(w, n, *T);
  const auto rows = row_ranges(w, n);
  if (!rows) touch_tokens(w, *d, 0, d->rows);
  const bool indices_unknown = w.view(Arg::scratch_indices) && !w.has_values(Arg::scratch_indices);
  if (indices_unknown) touch_whole(w, Arg::scratch, true);
  const bool slots_unknown = !w.has_values(Arg::cache_indices);
  if (slots_unknown) touch_pool(w, Arg::state, std::nullopt, false);
  for (i64 r = 0; r < n && !w.exhausted(); ++r) {
    if (rows) touch_tokens(w, *d, (*rows)[r].first, (*rows)[r].second);
    const auto slot = w.value(Arg::cache_indices, r);
    if (slot && *slot == -1) continue;  // padding row: outputs zeros, no scratch
    if (!slots_unknown) touch_pool(w, Arg::state, slot, false);
    if (indices_unknown) continue;
    i64 length = *T;
    if (rows && __builtin_sub_overflow((*rows)[r].second, std::min((*rows)[r].first, (*rows)[r].second), &length))
      length = std::numeric_limits<i64>::max();
    for (i64 t = 0; t < length && !w.exhausted(); ++t) {
      const auto flat = flat_slot(w, r, t, *T, *steps);
      if (flat && *flat == -1) continue;
      if (flat) touch_scratch(w, *flat, d->HV, d->V, d->K, true);
    }
  }
}

void walk_commit(const AnyCall& call, Walker& w) {
  const auto n = w.dim(Arg::accepted, 0, 1);
  const auto HV = w.dim(Arg::state, 1, 4), V = w.dim(Arg::state, 2, 4), K = w.dim(Arg::state, 3, 4);
  const auto T = draft_tokens(call, w);
  const auto steps = scratch_steps(w);
  if (!n || !HV || !V || !K || !T || !steps) return;
  w.touch(Arg::accepted, false, box({{0, *n}}));
  if (w.view(Arg::cu_seqlens)) w.touch(Arg::cu_seqlens, false, box({{0, plus1(*n)}}));
  read_addressing_maps(w, *n, *T);
  const bool slots_unknown = !w.has_values(Arg::cache_indices);
  if (slots_unknown) touch_pool(w, Arg::state, std::nullopt, true);
  const bool indices_unknown = w.view(Arg::scratch_indices) && !w.has_values(Arg::scratch_indices);
  if (indices_unknown) touch_whole(w, Arg::scratch, false);
  for (i64 r = 0; r < *n && !w.exhausted(); ++r) {
    const auto slot = w.value(Arg::cache_indices, r);
    if (slot && *slot == -1) continue;
    const auto accepted = w.value(Arg::accepted, r);
    if (accepted && *accepted == 0) continue;  // keeps the committed state
    if (accepted && (*accepted < 0 || *accepted > *T)) {
      w.finding(fmt::format("commit row {} accepts {} of {} draft tokens", r, *accepted, *T));
      continue;
    }
    if (!slots_unknown) touch_pool(w, Arg::state, slot, true);
    if (indices_unknown) continue;
    // The state after the last accepted step; every step when the count is unknown.
    const i64 first = accepted ? *accepted - 1 : 0, last = accepted ? *accepted - 1 : *T - 1;
    for (i64 t = first; t <= last && !w.exhausted(); ++t) {
      const auto flat = flat_slot(w, r, t, *T, *steps);
      if (flat && *flat == -1) {
        // With the count and the slot on the host this reads a step that holds nothing;
        // without them, the row is padding or the device guard refuses it (commit.accepted).
        if (accepted && slot) w.finding(fmt::format("commit row {} reads step {}, which verify skipped", r, t));
        continue;
      }
      if (flat) touch_scratch(w, *flat, *HV, *V, *K, false);
    }
  }
}

}  // namespace

BoundsReport check_bounds(const AnyCall& call, std::int64_t max_ranges) {
  BoundsReport report;
  Walker w(call, report, max_ranges);
  switch (entry_of(call)) {
    case Entry::decode: walk_decode(w); break;
    case Entry::prefill: walk_prefill(w); break;
    case Entry::verify: walk_verify(call, w); break;
    case Entry::commit: walk_commit(call, w); break;
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: break;  // AnyCall holds none of these
  }
  w.check_overlaps();
  return report;
}

}  // namespace kdaguard::support
