// The validators. One pass over the call: derive the call's dimensions from its anchor tensors,
// check every argument against its entry point's argument table, then the pool, index and value
// rules. Every check reports through Report::add, which keeps the rule id, the argument and a
// message naming the expected and the actual value. Messages are only formatted on failure, so an
// accepted call costs a few hundred nanoseconds and allocates only for deferred value rules.
#include "kdaguard/contracts/validate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "kdaguard/contracts/row_rules.h"
#include "kdaguard/contracts/supported.h"

namespace kdaguard {
namespace {

using i64 = std::int64_t;

// a * b and a + b, or INT64_MAX / INT64_MIN when that overflows: for checks on absurd inputs,
// where any out-of-range value fails the comparison it feeds.
i64 saturating_mul(i64 a, i64 b) {
  i64 product = 0;
  if (__builtin_mul_overflow(a, b, &product))
    return ((a < 0) != (b < 0)) ? std::numeric_limits<i64>::min() : std::numeric_limits<i64>::max();
  return product;
}

i64 saturating_add(i64 a, i64 b) {
  i64 sum = 0;
  if (__builtin_add_overflow(a, b, &sum))
    return b < 0 ? std::numeric_limits<i64>::min() : std::numeric_limits<i64>::max();
  return sum;
}

// ------------------------------------------------------------------------------------------------
// Reporting
// ------------------------------------------------------------------------------------------------

// Sort position of a violation's argument: tensor arguments in Arg order, then scalars.
int argument_order(std::string_view argument) {
  if (auto a = arg_from_name(argument)) return static_cast<int>(*a);
  return kArgCount;
}

class Report {
 public:
  // enabled_rules(): every rule, but one in a knockout build (scripts/knockout.sh).
  Report() : enabled_(enabled_rules()) {
    verdict_.deferred.reserve(8);  // a call without host values defers a handful of value rules
  }

  void add(RuleId rule, std::string_view argument, std::string message) {
    if ((enabled_ & value_checks::rule_bit(rule)) == 0) return;
    verdict_.violations.push_back({rule, argument, std::move(message)});
  }
  void defer(RuleId rule, std::string_view argument) {
    verdict_.deferred.push_back({rule, argument});
  }

  // Violations are sorted into catalogue order (the failure path only); deferred checks keep the
  // fixed order in which the checks run, one entry per (rule, argument).
  Verdict finish() && {
    sort_by_rule_then_argument(verdict_.violations);
    return std::move(verdict_);
  }

 private:
  // Violations come out of the checks mostly in order; sorting, when needed, uses keys computed
  // once per entry (argument names map to their Arg position).
  static void sort_by_rule_then_argument(std::vector<Violation>& entries) {
    auto key_less = [](const Violation& x, const Violation& y) {
      if (x.rule != y.rule) return x.rule < y.rule;
      return argument_order(x.argument) < argument_order(y.argument);
    };
    if (std::is_sorted(entries.begin(), entries.end(), key_less)) return;
    std::vector<std::pair<int, std::size_t>> keys(entries.size());
    for (std::size_t i = 0; i < entries.size(); ++i)
      keys[i] = {static_cast<int>(entries[i].rule) * (kArgCount + 1) +
                     argument_order(entries[i].argument),
                 i};
    std::stable_sort(keys.begin(), keys.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<Violation> sorted;
    sorted.reserve(entries.size());
    for (const auto& key : keys) sorted.push_back(std::move(entries[key.second]));
    entries = std::move(sorted);
  }

  Verdict verdict_;
  std::uint64_t enabled_;
};

// The dims a view really holds: a rank outside [0, kMaxRank] is reported, never indexed with.
std::size_t held_dims(const TensorView& t) {
  return static_cast<std::size_t>(std::clamp(t.rank, 0, kMaxRank));
}
std::string shape_text(const TensorView& t) {
  return fmt::format("({})", fmt::join(std::span(t.shape.data(), held_dims(t)), ", "));
}
std::string stride_text(const TensorView& t) {
  return fmt::format("({})", fmt::join(std::span(t.stride.data(), held_dims(t)), ", "));
}

// ------------------------------------------------------------------------------------------------
// Argument tables: what each entry point expects of each argument
// ------------------------------------------------------------------------------------------------

// A symbolic size. kRows is B (decode) or T_tot (prefill, verify): the rows of q.
enum class Dim : std::uint8_t {
  kRows, kH, kK, kHV, kV, kHVxK, kSlots, kN, kNPlus1, kT, kRecordWidth, kAny
};

enum class DTypeRule : std::uint8_t {
  kFloating,     // bf16, f16 or f32 (q itself)
  kIo,           // the dtype of q (bf16, f16 or f32 where q is missing or not floating)
  kF32OrIo,      // f32 or the dtype of q
  kF32,
  kState,        // f32 or bf16
  kI32,
  kI32OrI64,
};

enum class Kind : std::uint8_t {
  kVector,  // [.., dim] read or written with 16-byte vectors along a contiguous last dim
  kScalars, // read element by element (beta, A_log, index maps)
  kPool,    // a state pool: the state.* rules replace the generic layout rules
  kScratch, // the verify scratch [S_spec, T_alloc, HV, V, K]
};

struct ArgSpec {
  Arg arg;
  Kind kind;
  DTypeRule dtype;
  bool output;
  // Leading dim may exceed its size (rows past the end are ignored); shorter is its own rule.
  bool leading_at_least;
  std::array<Dim, 5> dims;
  int rank;
  // The rule a leading dim shorter than its size breaks (leading_at_least only): the gates and
  // beta cover q's tokens (gate.cover_tokens), the index maps the call's rows (index.length).
  RuleId short_leading = RuleId::index_length;
  // One rule of the argument's own covering its dtype, rank and shape together, in place of
  // arg.dtype, arg.rank and arg.shape (scratch_indices: verify.scratch_indices).
  std::optional<RuleId> form_rule;
};

constexpr ArgSpec spec(Arg arg, Kind kind, DTypeRule dtype, bool output, bool at_least,
                       std::initializer_list<Dim> dims) {
  ArgSpec s{arg, kind, dtype, output, at_least, {}, static_cast<int>(dims.size()), {}, {}};
  int i = 0;
  for (Dim d : dims) s.dims[i++] = d;
  return s;
}

// A per-token gate or beta: too few rows is gate.cover_tokens.
constexpr ArgSpec covering_tokens(ArgSpec s) {
  s.short_leading = RuleId::gate_cover_tokens;
  return s;
}

using enum Dim;
using enum DTypeRule;
using enum Kind;

// Shared by decode, prefill and verify: the per-token inputs.
constexpr ArgSpec kQ = spec(Arg::q, kVector, kFloating, false, false, {kRows, kH, kK});
constexpr ArgSpec kKey = spec(Arg::k, kVector, kIo, false, false, {kRows, kH, kK});
constexpr ArgSpec kVal = spec(Arg::v, kVector, kIo, false, false, {kRows, kHV, kV});
constexpr ArgSpec kA =
    covering_tokens(spec(Arg::a, kVector, kF32OrIo, false, true, {kRows, kHV, kK}));
constexpr ArgSpec kG =
    covering_tokens(spec(Arg::g, kVector, kF32OrIo, false, true, {kRows, kHV, kK}));
constexpr ArgSpec kALog = spec(Arg::A_log, kScalars, kF32, false, false, {kHV});
constexpr ArgSpec kDtBias = spec(Arg::dt_bias, kVector, kF32, false, false, {kHVxK});
constexpr ArgSpec kB =
    covering_tokens(spec(Arg::b, kScalars, kF32OrIo, false, true, {kRows, kHV}));
constexpr ArgSpec kBeta =
    covering_tokens(spec(Arg::beta, kScalars, kF32OrIo, false, true, {kRows, kHV}));
constexpr ArgSpec kOut = spec(Arg::out, kVector, kIo, true, false, {kRows, kHV, kV});

constexpr std::array kDecodeSpecs = {
    kQ, kKey, kVal, kA, kG, kALog, kDtBias, kB, kBeta,
    spec(Arg::state, kPool, kState, true, false, {kSlots, kHV, kV, kK}),
    spec(Arg::cache_indices, kScalars, kI32, false, true, {kRows}),
    spec(Arg::cu_seqlens, kScalars, kI32, false, false, {kNPlus1}),
    kOut};

constexpr std::array kPrefillSpecs = {
    kQ, kKey, kVal, kA, kG, kALog, kDtBias, kB, kBeta,
    spec(Arg::cu_seqlens, kScalars, kI32OrI64, false, false, {kNPlus1}),
    spec(Arg::initial_state, kPool, kState, true, false, {kSlots, kHV, kV, kK}),
    spec(Arg::initial_state_indices, kScalars, kI32, false, true, {kN}),
    kOut};

constexpr ArgSpec kScratchSpec = spec(Arg::scratch, kScratch, kState, true, false,
                                      {kAny, kAny, kHV, kV, kK});
constexpr ArgSpec kRowMap = spec(Arg::scratch_row_map, kScalars, kI32, false, true, {kN});
constexpr ArgSpec kScratchIndices = [] {
  ArgSpec s = spec(Arg::scratch_indices, kScalars, kI32, false, false, {kN, kT});
  s.form_rule = RuleId::verify_scratch_indices;
  return s;
}();

constexpr std::array kVerifySpecs = {
    kQ, kKey, kVal, kA, kG, kALog, kDtBias, kB, kBeta,
    spec(Arg::cu_seqlens, kScalars, kI32, false, false, {kNPlus1}),
    spec(Arg::state, kPool, kState, false, false, {kSlots, kHV, kV, kK}),
    spec(Arg::cache_indices, kScalars, kI32, false, true, {kN}),
    kScratchSpec, kRowMap, kScratchIndices, kOut};

// A record buffer [S_rec, T_alloc, HV, 2K+V] of f32, read or written with 16-byte vectors along
// its contiguous last dim; its two outer sizes have rules of their own (records.rows,
// records.steps).
constexpr ArgSpec records_spec(Arg arg, bool output) {
  return spec(arg, kVector, kF32, output, false, {kAny, kAny, kHV, kRecordWidth});
}
constexpr ArgSpec kCacheIndicesN = spec(Arg::cache_indices, kScalars, kI32, false, true, {kN});
constexpr ArgSpec kCuSeqlensI32 = spec(Arg::cu_seqlens, kScalars, kI32, false, false, {kNPlus1});
constexpr ArgSpec kAccepted = spec(Arg::accepted, kScalars, kI32, false, false, {kN});

constexpr std::array kRecordVerifySpecs = {
    kQ, kKey, kVal, kA, kG, kALog, kDtBias, kB, kBeta, kCuSeqlensI32,
    spec(Arg::state, kPool, kState, false, false, {kSlots, kHV, kV, kK}),
    kCacheIndicesN, records_spec(Arg::records, true), kOut};

constexpr std::array kReplayCommitSpecs = {
    records_spec(Arg::records, false),
    spec(Arg::state, kPool, kState, true, false, {kSlots, kHV, kV, kK}),
    kCacheIndicesN, kAccepted, kCuSeqlensI32};

constexpr std::array kAcceptVerifySpecs = {
    kQ, kKey, kVal, kA, kG, kALog, kDtBias, kB, kBeta, kCuSeqlensI32,
    spec(Arg::state, kPool, kState, true, false, {kSlots, kHV, kV, kK}),
    kCacheIndicesN, records_spec(Arg::prior_records, false),
    spec(Arg::prior_accepted, kScalars, kI32, false, false, {kN}),
    records_spec(Arg::records, true), kOut};

constexpr std::array kCommitSpecs = {
    kScratchSpec, kRowMap, kScratchIndices,
    spec(Arg::state, kPool, kState, true, false, {kSlots, kHV, kV, kK}),
    spec(Arg::cache_indices, kScalars, kI32, false, true, {kN}),
    spec(Arg::accepted, kScalars, kI32, false, false, {kN}),
    spec(Arg::cu_seqlens, kScalars, kI32, false, false, {kNPlus1})};

// ------------------------------------------------------------------------------------------------
// The call as the checks see it
// ------------------------------------------------------------------------------------------------

struct Dims {
  std::optional<i64> rows, H, K, HV, V, slots, N, T, scratch_rows, scratch_steps;
  std::optional<i64> record_rows, record_steps, prior_record_rows, prior_record_steps;
};

// Entry points without q, k, v, gates or out: their dims come from the state pool.
bool has_token_inputs(Entry e) { return e != Entry::commit && e != Entry::replay_commit; }
// Entry points with a draft-token count T and accepted counts or rows of at most T tokens.
bool speculative(Entry e) { return e != Entry::decode && e != Entry::prefill; }

struct Context {
  Entry entry;
  Device device;
  const Scalars* scalars;
  std::array<const TensorView*, kArgCount> views{};
  std::span<const ArgSpec> specs;
  Dims dims;
  // Arguments whose own layout checks passed: only these feed derived checks (values, aliasing).
  std::array<bool, kArgCount> sound{};

  const TensorView* view(Arg a) const { return views[static_cast<std::size_t>(a)]; }
  bool has(Arg a) const { return view(a) != nullptr; }
  bool is_sound(Arg a) const { return sound[static_cast<std::size_t>(a)]; }
};

template <class Call>
Context make_context(const Call& call, std::span<const ArgSpec> specs) {
  Context ctx{Call::kEntry, call.device, &call.scalars, {}, specs, {}, {}};
  for_each_argument(call, [&](Arg a, const OptionalView& v) {
    if (v) ctx.views[static_cast<std::size_t>(a)] = &*v;
  });
  return ctx;
}

std::optional<i64> dim_of(const TensorView* t, int d, int expected_rank) {
  if (t == nullptr || t->rank != expected_rank || t->shape[d] < 0) return std::nullopt;
  return t->shape[d];
}

void derive_dims(Context& ctx) {
  Dims& d = ctx.dims;
  const TensorView* q = ctx.view(Arg::q);
  const TensorView* v = ctx.view(Arg::v);
  const TensorView* state =
      ctx.entry == Entry::prefill ? ctx.view(Arg::initial_state) : ctx.view(Arg::state);
  const TensorView* scratch = ctx.view(Arg::scratch);
  if (!has_token_inputs(ctx.entry)) {
    d.HV = dim_of(state, 1, 4);
    d.V = dim_of(state, 2, 4);
    d.K = dim_of(state, 3, 4);
    d.N = dim_of(ctx.view(Arg::accepted), 0, 1);
  } else {
    d.rows = dim_of(q, 0, 3);
    d.H = dim_of(q, 1, 3);
    d.K = dim_of(q, 2, 3);
    d.HV = dim_of(v, 1, 3);
    d.V = dim_of(v, 2, 3);
  }
  d.slots = dim_of(state, 0, 4);
  if (ctx.entry == Entry::decode) {
    d.N = d.rows;
  } else if (has_token_inputs(ctx.entry)) {
    if (auto cu = dim_of(ctx.view(Arg::cu_seqlens), 0, 1); cu && *cu >= 1) d.N = *cu - 1;
  }
  if (ctx.scalars->draft_token_num) d.T = *ctx.scalars->draft_token_num;
  d.scratch_rows = dim_of(scratch, 0, 5);
  d.scratch_steps = dim_of(scratch, 1, 5);
  d.record_rows = dim_of(ctx.view(Arg::records), 0, 4);
  d.record_steps = dim_of(ctx.view(Arg::records), 1, 4);
  d.prior_record_rows = dim_of(ctx.view(Arg::prior_records), 0, 4);
  d.prior_record_steps = dim_of(ctx.view(Arg::prior_records), 1, 4);
}

std::optional<i64> expected_size(const Dims& d, Dim dim) {
  switch (dim) {
    case kRows: return d.rows;
    case kH: return d.H;
    case kK: return d.K;
    case kHV: return d.HV;
    case kV: return d.V;
    case kHVxK:
      if (d.HV && d.K) return saturating_mul(*d.HV, *d.K);
      return std::nullopt;
    case kSlots: return d.slots;
    case kN: return d.N;
    case kNPlus1:
      if (d.N) return saturating_add(*d.N, 1);  // N = INT64_MAX rows: absurd, refused by arg.extent
      return std::nullopt;
    case kT: return d.T;
    case kRecordWidth:
      if (d.K && d.V) return saturating_add(saturating_mul(2, *d.K), *d.V);
      return std::nullopt;
    case kAny: return std::nullopt;
  }
  return std::nullopt;
}

std::string_view dim_name(Dim dim, Entry entry) {
  switch (dim) {
    case kRows: return entry == Entry::decode ? "B" : "T_tot";
    case kH: return "H";
    case kK: return "K";
    case kHV: return "HV";
    case kV: return "V";
    case kHVxK: return "HV*K";
    case kSlots: return "S";
    case kN: return entry == Entry::decode ? "B" : "N";
    case kNPlus1: return entry == Entry::decode ? "B+1" : "N+1";
    case kT: return "T";
    case kRecordWidth: return "2K+V";
    case kAny: return "any";
  }
  return "?";
}

// ------------------------------------------------------------------------------------------------
// Layout arithmetic (all overflow-checked)
// ------------------------------------------------------------------------------------------------

// Largest element offset from element [0..0], or nullopt on overflow. Strides are non-negative.
std::optional<i64> span_elements(const TensorView& t) {
  i64 last = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] == 0) return 0;
    i64 step = 0;
    if (__builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &step)) return std::nullopt;
    if (__builtin_add_overflow(last, step, &last)) return std::nullopt;
  }
  return last;
}

// One pass over the dims: what every per-argument check needs to know about sizes and strides.
struct DimScan {
  int negative_size_dim = -1;
  int negative_stride_dim = -1;
  bool empty = false;          // some size is 0
  std::optional<i64> span;     // largest element offset; nullopt on overflow or negative input
};

DimScan scan_dims(const TensorView& t) {
  DimScan scan;
  i64 last = 0;
  bool overflow = false;
  for (int d = 0; d < t.rank; ++d) {
    const i64 size = t.shape[d], stride = t.stride[d];
    if (size < 0 && scan.negative_size_dim < 0) scan.negative_size_dim = d;
    if (stride < 0 && scan.negative_stride_dim < 0) scan.negative_stride_dim = d;
    if (size == 0) scan.empty = true;
    i64 step = 0;
    overflow |= size > 0 && (__builtin_mul_overflow(size - 1, stride, &step) ||
                             __builtin_add_overflow(last, step, &last));
  }
  if (scan.empty) scan.span = 0;
  else if (!overflow && scan.negative_size_dim < 0 && scan.negative_stride_dim < 0)
    scan.span = last;
  return scan;
}

struct ByteRange {
  std::uint64_t begin = 0, end = 0;  // [begin, end), absolute
};

// Whether no two elements of the view share an address: sorting the dims of size > 1 by stride,
// each stride must step past everything the smaller dims span.
bool maps_elements_one_to_one(const TensorView& t) {
  std::array<int, kMaxRank> order{};
  int n = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] == 0) return true;  // an empty view maps nothing, whatever its strides
    if (t.shape[d] > 1) order[n++] = d;
  }
  // By stride, insertion sort: at most kMaxRank dims (std::sort's path for long ranges draws
  // GCC 12's -Warray-bounds on this 8-entry array).
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && t.stride[order[j]] < t.stride[order[j - 1]]; --j)
      std::swap(order[j], order[j - 1]);
  i64 spanned = 0;  // largest offset reachable with the smaller dims
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    if (t.stride[d] <= spanned) return false;
    spanned += (t.shape[d] - 1) * t.stride[d];  // bounded: the extent check passed
  }
  return true;
}

// ------------------------------------------------------------------------------------------------
// Per-argument checks
// ------------------------------------------------------------------------------------------------

bool is_floating(DType t) { return t == DType::bf16 || t == DType::f16 || t == DType::f32; }

// io: the dtype of q where the call has a floating q, else null.
bool dtype_allowed(DTypeRule rule, DType t, const DType* io) {
  const bool floating = is_floating(t);
  switch (rule) {
    case kFloating: return floating;
    case kIo: return io ? t == *io : floating;
    case kF32OrIo: return t == DType::f32 || (io ? t == *io : floating);
    case kF32: return t == DType::f32;
    case kState: return t == DType::f32 || t == DType::bf16;
    case kI32: return t == DType::i32;
    case kI32OrI64: return t == DType::i32 || t == DType::i64;
  }
  return false;
}

std::string dtype_expectation(DTypeRule rule, const DType* io) {
  const std::string io_text = io ? fmt::format("{} (the dtype of q)", dtype_name(*io))
                                 : std::string("bf16, f16 or f32");
  switch (rule) {
    case kFloating: return "bf16, f16 or f32";
    case kIo: return io_text;
    case kF32OrIo: return "f32 or " + io_text;
    case kF32: return "f32";
    case kState: return "f32 or bf16";
    case kI32: return "i32";
    case kI32OrI64: return "i32 or i64";
  }
  return "?";
}

// One argument's checks report through this: every failure is the argument's, and any failure
// makes the argument unsound.
struct ArgReport {
  Report& report;
  std::string_view name;
  bool sound = true;

  void fail(RuleId rule, std::string message) {
    report.add(rule, name, std::move(message));
    sound = false;
  }
};

// What the checks every argument gets leave to the layout checks of its kind.
struct CheckedView {
  bool rank_ok;        // the rank is the spec's
  bool sound;          // no check failed so far: the sizes, strides and extent can be relied on
  i64 esize;           // bytes per element
  std::uint64_t data;  // the address of element [0..0]
};

// The dtype rule, unless the argument's form rule covers its dtype.
void check_dtype(const Context& ctx, const ArgSpec& s, const TensorView& t, ArgReport& a) {
  if (s.form_rule) return;  // verify.scratch_indices covers its dtype, rank and shape together.
  const TensorView* q = ctx.view(Arg::q);
  const DType* io = q && is_floating(q->dtype) ? &q->dtype : nullptr;
  if (!dtype_allowed(s.dtype, t.dtype, io))
    // arg.dtype
    a.fail(RuleId::arg_dtype, fmt::format("{} has dtype {}; expected {}", a.name,
                                          dtype_name(t.dtype), dtype_expectation(s.dtype, io)));
}

// The rank rule: pools and the scratch have their own, and a form rule covers the rank too.
bool check_rank(const ArgSpec& s, const TensorView& t, ArgReport& a) {
  if (t.rank == s.rank) return true;
  if (s.kind == kPool) {
    // state.rank
    a.fail(RuleId::state_rank,
           fmt::format("recurrent_kda needs a [N, HV, V, K] state pool; got shape {} for {}",
                       shape_text(t), a.name));
  } else if (s.kind == kScratch) {
    // verify.scratch_layout
    a.fail(RuleId::verify_scratch_layout,
           fmt::format("scratch must be a 5-D [S_spec, T_alloc, HV, V, K] pool; got shape {}",
                       shape_text(t)));
  } else if (s.form_rule) {
    // verify.scratch_indices
    a.fail(RuleId::verify_scratch_indices,
           fmt::format("scratch_indices must be a 2-D [N, T] i32 tensor; got rank {}", t.rank));
  } else {
    // arg.rank
    a.fail(RuleId::arg_rank, fmt::format("{} must have {} dimensions; got {} (shape {})", a.name,
                                         s.rank, t.rank, shape_text(t)));
  }
  return false;
}

// Sizes against the call's dimensions, for a view of the spec's rank.
void check_sizes(const Context& ctx, const ArgSpec& s, const TensorView& t, ArgReport& a) {
  const std::string_view name = a.name;
  for (int d = 0; d < s.rank; ++d) {
    const auto want = expected_size(ctx.dims, s.dims[d]);
    if (!want) continue;
    const i64 got = t.shape[d];
    if (got == *want || (d == 0 && s.leading_at_least && got > *want)) continue;
    if (d == 0 && s.leading_at_least && got < *want) {
      if (s.short_leading == RuleId::gate_cover_tokens) {
        // gate.cover_tokens
        a.fail(RuleId::gate_cover_tokens,
               fmt::format("g and beta must cover every q token: {} has {} rows, q has {}", name,
                           got, *want));
      } else {
        // index.length
        a.fail(RuleId::index_length,
               fmt::format("{} has {} entries; the call has {} = {} rows", name, got,
                           dim_name(s.dims[d], ctx.entry), *want));
      }
      continue;
    }
    if (s.form_rule) {
      // verify.scratch_indices
      a.fail(RuleId::verify_scratch_indices,
             fmt::format("scratch_indices must be [N, T] = [{}, {}]; got shape {}",
                         ctx.dims.N.value_or(-1), ctx.dims.T.value_or(-1), shape_text(t)));
      continue;
    }
    // arg.shape
    a.fail(RuleId::arg_shape, fmt::format("{} dim {} must be {} = {}; got {} (shape {})", name, d,
                                          dim_name(s.dims[d], ctx.entry), *want, got,
                                          shape_text(t)));
  }
}

// Extent: the whole view inside 64-bit arithmetic and inside its allocation. Strides and sizes
// are non-negative by now.
void check_extent(const TensorView& t, const DimScan& scan, i64 esize, ArgReport& a) {
  const std::string_view name = a.name;
  const std::optional<i64>& span = scan.span;
  i64 last = 0, end_bytes = 0;
  if (t.storage_offset.count < 0) {
    // arg.extent
    a.fail(RuleId::arg_extent, fmt::format("{} starts before its allocation: storage_offset {}",
                                           name, t.storage_offset.count));
  } else if (!span || __builtin_add_overflow(*span, t.storage_offset.count, &last) ||
             __builtin_add_overflow(last, i64{1}, &end_bytes) ||
             __builtin_mul_overflow(end_bytes, esize, &end_bytes) ||
             t.address > std::numeric_limits<std::uint64_t>::max() -
                             static_cast<std::uint64_t>(end_bytes)) {
    // arg.extent
    a.fail(RuleId::arg_extent,
           fmt::format("{} reaches past 64-bit arithmetic: shape {}, strides {}, storage_offset {}",
                       name, shape_text(t), stride_text(t), t.storage_offset.count));
  } else if (t.storage_size && !scan.empty && last >= t.storage_size->count) {
    // arg.extent
    a.fail(RuleId::arg_extent,
           fmt::format("{} reaches element {} of its allocation, which holds {} elements "
                       "(shape {}, strides {}, storage_offset {})",
                       name, last, t.storage_size->count, shape_text(t), stride_text(t),
                       t.storage_offset.count));
  }
}

// The checks every argument gets: device, dtype, rank, sizes against the call's dimensions,
// strides never negative, extent. Nothing when the view's dims cannot be scanned (a rank outside
// [0, kMaxRank], a negative size or stride): no layout rule of its kind can be judged then.
std::optional<CheckedView> check_common(const Context& ctx, const ArgSpec& s,
                                        const TensorView& t, ArgReport& a) {
  const std::string_view name = a.name;
  const Device dev = t.device.value_or(ctx.device);
  if (dev != ctx.device)
    // arg.device
    a.fail(RuleId::arg_device, fmt::format("{} is on {}; the call runs on {}", name,
                                           device_name(dev), device_name(ctx.device)));
  check_dtype(ctx, s, t, a);
  const bool rank_ok = check_rank(s, t, a);
  if (t.rank < 0 || t.rank > kMaxRank) return std::nullopt;
  const DimScan scan = scan_dims(t);
  if (scan.negative_size_dim >= 0) {
    const int d = scan.negative_size_dim;
    // arg.shape
    a.fail(RuleId::arg_shape,
           fmt::format("{} has a negative size {} in dim {}", name, t.shape[d], d));
    return std::nullopt;
  }
  if (rank_ok) check_sizes(ctx, s, t, a);
  if (s.form_rule && t.dtype != DType::i32)
    // verify.scratch_indices
    a.fail(RuleId::verify_scratch_indices,
           fmt::format("scratch_indices must be i32; got {}", dtype_name(t.dtype)));
  if (scan.negative_stride_dim >= 0) {
    const int d = scan.negative_stride_dim;
    // arg.stride
    a.fail(RuleId::arg_stride, fmt::format("{} has a negative stride {} in dim {}; strides {}",
                                           name, t.stride[d], d, stride_text(t)));
    return std::nullopt;
  }
  const i64 esize = element_size(t.dtype);
  check_extent(t, scan, esize, a);
  const std::uint64_t data =
      t.address + static_cast<std::uint64_t>(std::max<i64>(t.storage_offset.count, 0)) *
                      static_cast<std::uint64_t>(esize);
  return CheckedView{rank_ok, a.sound, esize, data};
}

// Vectors and scalars: a contiguous last dim, aligned for the kernels' loads (16-byte vectors or
// single elements), and an output mapping its elements one to one.
void check_vector_layout(const ArgSpec& s, const TensorView& t, const CheckedView& v,
                         ArgReport& a) {
  const std::string_view name = a.name;
  const i64 esize = v.esize;
  if (t.rank >= 1 && t.shape[t.rank - 1] > 1 && t.stride[t.rank - 1] != 1)
    // arg.last_dim_contiguous
    a.fail(RuleId::arg_last_dim_contiguous,
           fmt::format("`{}` must be contiguous in the last dim.: its last stride is {} "
                       "(strides {})",
                       name, t.stride[t.rank - 1], stride_text(t)));
  if (s.kind == kVector && v.sound) {
    if (v.data % 16 != 0)
      // arg.alignment
      a.fail(RuleId::arg_alignment,
             fmt::format("{} data address {:#x} is not 16-byte aligned (address {:#x} + "
                         "storage_offset {} x {} bytes)",
                         name, v.data, t.address, t.storage_offset.count, esize));
    for (int d = 0; d + 1 < t.rank; ++d) {
      if (t.shape[d] > 1 && saturating_mul(t.stride[d], esize) % 16 != 0) {
        // arg.alignment
        a.fail(RuleId::arg_alignment,
               fmt::format("{} stride {} of dim {} is {} bytes, not a multiple of 16", name,
                           t.stride[d], d, saturating_mul(t.stride[d], esize)));
        break;
      }
    }
  } else if (v.data % static_cast<std::uint64_t>(esize) != 0) {
    // arg.alignment
    a.fail(RuleId::arg_alignment, fmt::format("{} data address {:#x} is not {}-byte aligned",
                                              name, v.data, esize));
  }
  if (s.output && v.sound && !maps_elements_one_to_one(t))
    // arg.stride
    a.fail(RuleId::arg_stride,
           fmt::format("output {} maps two elements to one address: shape {}, strides {}", name,
                       shape_text(t), stride_text(t)));
}

// The scratch's rules beyond a pool's: its rows flatten into steps, and its dtype is the state's.
void check_scratch_layout(const Context& ctx, const TensorView& t, ArgReport& a) {
  const i64 rows = t.shape[0], steps = t.shape[1];
  const i64 row_stride = saturating_mul(steps, t.stride[1]);
  if (rows > 1 && t.stride[0] != row_stride)
    // verify.scratch_layout
    a.fail(RuleId::verify_scratch_layout,
           fmt::format("scratch rows must flatten into steps: stride[0] must be T_alloc * "
                       "stride[1] = {}; got {}",
                       row_stride, t.stride[0]));
  const TensorView* state = ctx.view(Arg::state);
  if (state && state->dtype != t.dtype)
    // verify.scratch_layout
    a.fail(RuleId::verify_scratch_layout,
           fmt::format("scratch has dtype {}; it must be the state's dtype {}",
                       dtype_name(t.dtype), dtype_name(state->dtype)));
}

// A pool of the spec's rank: [S, HV, V, K], or the scratch flattened to
// [S_spec * T_alloc, HV, V, K]. Compact slots on the compiled stride contract.
void check_pool_layout(const Context& ctx, const ArgSpec& s, const TensorView& t,
                       const CheckedView& v, ArgReport& a) {
  const std::string_view name = a.name;
  const int o = s.kind == kScratch ? 1 : 0;  // index of the slot dim
  const i64 HV = t.shape[o + 1], V = t.shape[o + 2], K = t.shape[o + 3];
  const i64 VK = saturating_mul(V, K), slot_size = saturating_mul(HV, VK);
  const i64 slot = t.stride[o];
  // For pools this rule replaces arg.last_dim_contiguous; the upstream text of that one is
  // kept in the message so both upstream errors lead here.
  if (t.stride[o + 1] != VK || t.stride[o + 2] != K || t.stride[o + 3] != 1)
    // state.inner_strides
    a.fail(RuleId::state_inner_strides,
           fmt::format("recurrent_kda state inner strides must be compact (V*K, K, 1)=({}, {}, "
                       "1); got ({}, {}, {}) (only the slot stride may be non-compact) for {}{}",
                       VK, K, t.stride[o + 1], t.stride[o + 2], t.stride[o + 3], name,
                       t.stride[o + 3] != 1
                           ? fmt::format("; `{}` must be contiguous in the last dim.", name)
                           : std::string()));
  if (slot % 16 != 0)
    // state.slot_stride_align
    a.fail(RuleId::state_slot_stride_align,
           fmt::format("recurrent_kda state pool breaks the compiled stride contract: {} slot "
                       "stride {} elements must be a multiple of 16",
                       name, slot));
  // The base byte offset modulo 32 from the element offset's residue, so it stays exact where
  // offset x esize passes 64 bits (an offset near INT64_MIN, which arg.extent refuses too).
  const i64 base_residue = t.storage_offset.count % 32 * v.esize % 32;
  if (base_residue != 0 || v.data % 32 != 0) {
    i64 base_bytes = 0;
    const bool past_64_bits = __builtin_mul_overflow(t.storage_offset.count, v.esize, &base_bytes);
    // state.base_align
    a.fail(RuleId::state_base_align,
           fmt::format("recurrent_kda state pool breaks the compiled stride contract: {} base "
                       "byte offset {} (data address {:#x}) must be a multiple of 32",
                       name,
                       past_64_bits ? fmt::format("{} x {} (past 64 bits; {} modulo 32)",
                                                  t.storage_offset.count, v.esize, base_residue)
                                    : std::to_string(base_bytes),
                       v.data));
  }
  if (slot < slot_size)
    // state.slot_stride_min
    a.fail(RuleId::state_slot_stride_min,
           fmt::format("{} slot stride {} is smaller than a slot, HV*V*K = {}: slots would "
                       "overlap",
                       name, slot, slot_size));
  if (s.kind == kScratch) check_scratch_layout(ctx, t, a);
}

// The checks every argument gets, then the layout rules of its kind. Marks the argument sound
// when nothing about its own layout is wrong (ctx.sound starts false).
void check_argument(Context& ctx, const ArgSpec& s, Report& r) {
  const TensorView* t = ctx.view(s.arg);
  if (t == nullptr) return;
  ArgReport a{r, arg_name(s.arg)};
  const std::optional<CheckedView> v = check_common(ctx, s, *t, a);
  if (!v) return;
  if (s.kind == kVector || s.kind == kScalars) check_vector_layout(s, *t, *v, a);
  else if (v->rank_ok) check_pool_layout(ctx, s, *t, *v, a);
  ctx.sound[static_cast<std::size_t>(s.arg)] = a.sound;
}

// ------------------------------------------------------------------------------------------------
// Presence, dimensions and scalars
// ------------------------------------------------------------------------------------------------

void check_presence(const Context& ctx, Report& r) {
  auto need = [&](Arg a) {
    if (!ctx.has(a))
      // arg.missing
      r.add(RuleId::arg_missing, arg_name(a),
            fmt::format("{} {} is required and absent", entry_name(ctx.entry), arg_name(a)));
  };
  auto one_of = [&](Arg x, Arg y) {
    if (!ctx.has(x) && !ctx.has(y))
      // arg.missing
      r.add(RuleId::arg_missing, arg_name(x),
            fmt::format("{} needs {} or {}; both are absent", entry_name(ctx.entry), arg_name(x),
                        arg_name(y)));
    if (ctx.has(x) && ctx.has(y))
      // arg.exclusive
      r.add(RuleId::arg_exclusive, arg_name(y),
            fmt::format("give {} or {}, not both", arg_name(x), arg_name(y)));
  };
  switch (ctx.entry) {
    case Entry::decode:
      for (Arg a : {Arg::q, Arg::k, Arg::v, Arg::state, Arg::cache_indices, Arg::out}) need(a);
      break;
    case Entry::prefill:
      for (Arg a : {Arg::q, Arg::k, Arg::v, Arg::cu_seqlens, Arg::out}) need(a);
      if (!ctx.has(Arg::initial_state) || !ctx.has(Arg::initial_state_indices))
        // prefill.indexed_pool
        r.add(RuleId::prefill_indexed_pool,
              ctx.has(Arg::initial_state) ? "initial_state_indices" : "initial_state",
              fmt::format("KDA prefill requires an indexed initial-state pool: initial_state "
                          "is {}, initial_state_indices is {}",
                          ctx.has(Arg::initial_state) ? "given" : "absent",
                          ctx.has(Arg::initial_state_indices) ? "given" : "absent"));
      break;
    case Entry::verify:
      for (Arg a : {Arg::q, Arg::k, Arg::v, Arg::cu_seqlens, Arg::state, Arg::cache_indices,
                    Arg::scratch, Arg::out})
        need(a);
      break;
    case Entry::commit:
      for (Arg a : {Arg::scratch, Arg::state, Arg::cache_indices, Arg::accepted}) need(a);
      break;
    case Entry::record_verify:
      for (Arg a : {Arg::q, Arg::k, Arg::v, Arg::cu_seqlens, Arg::state, Arg::cache_indices,
                    Arg::records, Arg::out})
        need(a);
      break;
    case Entry::replay_commit:
      for (Arg a : {Arg::records, Arg::state, Arg::cache_indices, Arg::accepted}) need(a);
      break;
    case Entry::accept_verify:
      for (Arg a : {Arg::q, Arg::k, Arg::v, Arg::cu_seqlens, Arg::state, Arg::cache_indices,
                    Arg::prior_records, Arg::prior_accepted, Arg::records, Arg::out})
        need(a);
      break;
  }
  if (has_token_inputs(ctx.entry)) {
    one_of(Arg::a, Arg::g);
    one_of(Arg::b, Arg::beta);
  }
  if ((ctx.entry == Entry::verify || ctx.entry == Entry::commit) &&
      !ctx.has(Arg::scratch_indices) && !ctx.has(Arg::scratch_row_map))
    // arg.missing
    r.add(RuleId::arg_missing, "scratch_row_map",
          "scratch_row_map is required when scratch_indices is absent");
}

void check_dims_and_scalars(const Context& ctx, Report& r) {
  const Dims& d = ctx.dims;
  const Scalars& s = *ctx.scalars;
  if (has_token_inputs(ctx.entry)) {
    if (d.H && d.HV && (*d.H <= 0 || *d.HV <= 0 || *d.HV % *d.H != 0))
      // dims.heads
      r.add(RuleId::dims_heads, "v",
            fmt::format("HV must be a positive multiple of H; got HV = {} (v), H = {} (q)", *d.HV,
                        *d.H));
    auto head_dim = [&](std::optional<i64> size, std::string_view which, Arg where) {
      if (size && !supported::head_dim(*size))
        // dims.head_dim
        r.add(RuleId::dims_head_dim, arg_name(where),
              fmt::format("{} must be 64 or 128; got {} ({})", which, *size, arg_name(where)));
    };
    head_dim(d.K, "K", Arg::q);
    head_dim(d.V, "V", Arg::v);
    if (s.scale && !(std::isfinite(*s.scale) && *s.scale > 0))
      // scalar.scale
      r.add(RuleId::scalar_scale, "scale",
            fmt::format("scale must be finite and > 0; got {}", *s.scale));
    if (s.lower_bound && !(std::isfinite(*s.lower_bound) && *s.lower_bound < 0))
      // scalar.lower_bound
      r.add(RuleId::scalar_lower_bound, "lower_bound",
            fmt::format("lower_bound must be finite and < 0; got {}", *s.lower_bound));
    if (ctx.has(Arg::a) && !ctx.has(Arg::A_log))
      // gate.params
      r.add(RuleId::gate_params, "A_log",
            "a raw gate a needs A_log to be activated in the kernel; A_log is absent");
    if (ctx.has(Arg::g) && !ctx.has(Arg::a) && s.lower_bound)
      // gate.params
      r.add(RuleId::gate_params, "lower_bound",
            fmt::format("lower_bound {} applies to a raw gate a; g is already activated",
                        *s.lower_bound));
  }
  if (speculative(ctx.entry)) {
    if (!d.T || *d.T < 1)
      // verify.draft_tokens
      r.add(RuleId::verify_draft_tokens, "draft_token_num",
            d.T ? fmt::format("draft_token_num must be >= 1; got {}", *d.T)
                : std::string("draft_token_num is required"));
    if (d.T && d.scratch_steps && *d.T > *d.scratch_steps)
      // verify.scratch_steps
      r.add(RuleId::verify_scratch_steps, "scratch",
            fmt::format("KDA verify needs {} scratch steps, but intermediate_ssm only has {}.",
                        *d.T, *d.scratch_steps));
    if (d.N && d.scratch_rows && *d.scratch_rows < *d.N)
      // verify.scratch_rows
      r.add(RuleId::verify_scratch_rows, "scratch",
            fmt::format("scratch has {} rows (S_spec); the call has N = {} rows",
                        *d.scratch_rows, *d.N));
    if (d.T && d.record_steps && *d.T > *d.record_steps)
      // records.steps
      r.add(RuleId::records_steps, "records",
            fmt::format("records holds {} steps (T_alloc); the call has T = {} draft tokens",
                        *d.record_steps, *d.T));
    auto record_rows = [&](std::optional<i64> rows, Arg buffer) {
      if (d.N && rows && *rows < *d.N)
        // records.rows
        r.add(RuleId::records_rows, arg_name(buffer),
              fmt::format("{} has {} rows (S_rec); the call has N = {} rows", arg_name(buffer),
                          *rows, *d.N));
    };
    record_rows(d.record_rows, Arg::records);
    record_rows(d.prior_record_rows, Arg::prior_records);
  }
  // A pool with no slots while some row needs one.
  const Arg pool = ctx.entry == Entry::prefill ? Arg::initial_state : Arg::state;
  if (d.slots && *d.slots == 0 && d.N && *d.N > 0)
    // state.empty
    r.add(RuleId::state_empty, arg_name(pool),
          fmt::format("{} has 0 slots; the call has {} rows that need one", arg_name(pool),
                      *d.N));
}

// ------------------------------------------------------------------------------------------------
// Aliasing
// ------------------------------------------------------------------------------------------------

std::optional<ByteRange> byte_range(const TensorView& t) {
  if (t.address == 0 || t.numel() == 0) return std::nullopt;  // an allocation of its own
  const auto span = span_elements(t);
  const i64 esize = element_size(t.dtype);
  const std::uint64_t begin = t.address + static_cast<std::uint64_t>(t.storage_offset.count * esize);
  return ByteRange{begin, begin + static_cast<std::uint64_t>((*span + 1) * esize)};
}

void check_aliasing(const Context& ctx, Report& r) {
  // Views without an address are allocations of their own: only placed outputs can overlap.
  const bool some_output_is_placed = std::any_of(ctx.specs.begin(), ctx.specs.end(), [&](const ArgSpec& s) {
    return s.output && ctx.has(s.arg) && ctx.view(s.arg)->address != 0;
  });
  if (!some_output_is_placed) return;
  std::array<std::optional<ByteRange>, kArgCount> ranges{};
  for (const ArgSpec& s : ctx.specs)
    if (ctx.has(s.arg) && ctx.is_sound(s.arg))
      ranges[static_cast<std::size_t>(s.arg)] = byte_range(*ctx.view(s.arg));
  for (const ArgSpec& out : ctx.specs) {
    const auto& mine = ranges[static_cast<std::size_t>(out.arg)];
    if (!out.output || !mine) continue;
    for (const ArgSpec& other : ctx.specs) {
      const auto& theirs = ranges[static_cast<std::size_t>(other.arg)];
      if (other.arg == out.arg || !theirs) continue;
      // Two outputs overlapping are reported once, on the first of the pair.
      if (other.output && static_cast<int>(other.arg) < static_cast<int>(out.arg)) continue;
      if (mine->begin < theirs->end && theirs->begin < mine->end)
        // alias.overlap
        r.add(RuleId::alias_overlap, arg_name(out.arg),
              fmt::format("output {} bytes [{:#x}, {:#x}) overlap {} bytes [{:#x}, {:#x})",
                          arg_name(out.arg), mine->begin, mine->end, arg_name(other.arg),
                          theirs->begin, theirs->end));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Value rules
// ------------------------------------------------------------------------------------------------

// The value rules are row_rules.h's row functions, the same code the kernels run; this part only
// reads the host copies of the index values, derives what it defers from the rule table and
// words a message for every rule a row breaks.

using row_rules::HostIndex;
using row_rules::Mask;

bool values_match_view(const TensorView& t) {
  return static_cast<i64>(t.values->size()) == t.numel();
}

// The host copy of an index tensor's values when the tensor is sound, the copy matches it and it
// holds at least `needed` entries; otherwise not known.
HostIndex host_index(const Context& ctx, Arg a, i64 needed) {
  const TensorView* t = ctx.view(a);
  if (t == nullptr || !ctx.is_sound(a) || !t->values || !values_match_view(*t)) return {};
  if (needed < 0 || static_cast<i64>(t->values->size()) < needed) return {};
  return {t->values->data(), t->rank == 2 ? t->shape[1] : 0, true};
}

// An index tensor the value rules read: without host values, every value rule of the entry point
// that reads it is deferred to the device (the rule table's value-inputs column); with host values
// that are not one per element, the copy is reported, whatever else the call gets wrong.
void check_value_input(const Context& ctx, Arg a, Report& r) {
  const TensorView* t = ctx.view(a);
  if (t == nullptr || !ctx.is_sound(a)) return;
  if (!t->values) {
    for (const RuleInfo& rule : rule_catalogue())
      if (rule.tier == Tier::value && rule.applies_to(ctx.entry) && rule.reads(a))
        r.defer(rule.rule, arg_name(a));
  } else if (!values_match_view(*t)) {
    // arg.shape
    r.add(RuleId::arg_shape, arg_name(a),
          fmt::format("{} carries {} host values; the view has {} elements", arg_name(a),
                      t->values->size(), t->numel()));
  }
}

bool fired(Mask faults, RuleId rule) { return (faults & value_checks::rule_bit(rule)) != 0; }

// index.unique over the entries of a slot map that are value_checks::unique_candidate: sorted,
// a repeat is any entry after the first of its slot. One sort instead of a hash set: this runs
// per call on the serving path, and a node allocation per row cost ~50 ns a row at B = 512.
void check_unique(const HostIndex& entries, i64 count, std::string_view name, i64 num_slots,
                  Report& r) {
  if (!entries.known()) return;
  std::vector<std::pair<i64, i64>> active;  // (slot, entry)
  active.reserve(static_cast<std::size_t>(count));
  for (i64 i = 0; i < count; ++i)
    if (value_checks::unique_candidate(entries[i], num_slots)) active.emplace_back(entries[i], i);
  std::sort(active.begin(), active.end());
  std::vector<i64> repeats;
  for (std::size_t j = 1; j < active.size(); ++j)
    if (active[j].first == active[j - 1].first) repeats.push_back(active[j].second);
  std::sort(repeats.begin(), repeats.end());  // reported in entry order
  for (const i64 i : repeats)
    // index.unique
    r.add(RuleId::index_unique, name,
          fmt::format("{}[{}] = {} names a slot an earlier row already uses", name, i, entries[i]));
}

// The facts a message quotes, gathered from whichever entry point's rows.
struct RowContext {
  std::string_view slot_map_name;
  HostIndex slots, cu, row_map, scratch_indices, accepted, prior_accepted;
  i64 rows = 0, num_slots = 0, scratch_slots = 0, draft_tokens = 0, prior_steps = 0;
  std::optional<i64> total_tokens;  // T_tot (not for commit)
  bool padding_allowed = true;
};

// The messages of every rule in `faults` for row n (n < 0: the call's single offset). Rules
// quoted per entry (index.range, index.padding, commit.accepted) are reported for every row;
// the others once per call, for the first row that breaks them (`reported`).
void report_row(const RowContext& c, i64 n, Mask faults, Mask& reported, Report& r) {
  auto once = [&](RuleId rule) {
    if (!fired(faults, rule) || fired(reported, rule)) return false;
    reported |= value_checks::rule_bit(rule);
    return true;
  };
  if (n >= 0 && c.slots.known()) {
    const i64 slot = c.slots[n];
    const Mask slot_fault = row_rules::slot_faults(slot, c.num_slots, c.padding_allowed);
    if (fired(faults & slot_fault, RuleId::index_padding))  // index.padding
      r.add(RuleId::index_padding, c.slot_map_name,
            fmt::format("{}[{}] is -1, but padding rows are not allowed here", c.slot_map_name, n));
    if (fired(faults & slot_fault, RuleId::index_range))  // index.range
      r.add(RuleId::index_range, c.slot_map_name,
            fmt::format("{}[{}] = {} is outside [{}, {})", c.slot_map_name, n, slot,
                        c.padding_allowed ? -1 : 0, c.num_slots));
  }
  if (n >= 0 && c.scratch_indices.known() && fired(faults, RuleId::index_range)) {
    for (i64 t = 0; t < c.draft_tokens; ++t) {  // index.range
      const i64 entry = c.scratch_indices.at(n, t);
      if (row_rules::slot_faults(entry, c.scratch_slots, true) != 0)
        // index.range
        r.add(RuleId::index_range, "scratch_indices",
              fmt::format("scratch_indices[{}, {}] = {} is outside [-1, {})", n, t, entry,
                          c.scratch_slots));
    }
  }
  if (once(RuleId::seqlens_start))  // seqlens.start
    r.add(RuleId::seqlens_start, "cu_seqlens",
          fmt::format("cu_seqlens[0] must be 0; got {}", c.cu[0]));
  if (once(RuleId::seqlens_monotone)) {  // seqlens.monotone: some offset decreases
    for (i64 i = 0; i < c.rows; ++i) {
      if (c.cu[i + 1] < c.cu[i]) {
        // seqlens.monotone
        r.add(RuleId::seqlens_monotone, "cu_seqlens",
              fmt::format("cu_seqlens decreases: cu_seqlens[{}] = {} > cu_seqlens[{}] = {}", i,
                          c.cu[i], i + 1, c.cu[i + 1]));
        break;
      }
    }
  }
  if (once(RuleId::seqlens_total))  // seqlens.total
    r.add(RuleId::seqlens_total, "cu_seqlens",
          fmt::format("cu_seqlens[N] must equal T_tot = {} (the rows of q); got {}",
                      c.total_tokens.value_or(-1), c.cu[c.rows]));
  if (once(RuleId::decode_one_token)) {  // decode.one_token
    const i64 i = n < 0 || c.cu[n] != n ? std::max<i64>(n, 0) : n + 1;
    // decode.one_token
    r.add(RuleId::decode_one_token, "cu_seqlens",
          fmt::format("decode takes one token per request: cu_seqlens must be 0, 1, ..., B; "
                      "cu_seqlens[{}] = {}",
                      i, c.cu[i]));
  }
  if (once(RuleId::verify_row_length))  // verify.row_length
    r.add(RuleId::verify_row_length, "cu_seqlens",
          fmt::format("verify row {} holds {} tokens (cu_seqlens[{}] = {} to cu_seqlens[{}] = {}); "
                      "at most T = {}",
                      n, c.cu[n + 1] - c.cu[n], n, c.cu[n], n + 1, c.cu[n + 1], c.draft_tokens));
  if (once(RuleId::verify_row_map_identity))  // verify.row_map_identity
    r.add(RuleId::verify_row_map_identity, "scratch_row_map",
          fmt::format("KDA verify requires an identity intermediate row-map when scratch_indices "
                      "is absent: scratch_row_map[{}] = {}, expected {} for a row that is not "
                      "padding (pass scratch_indices to use a permuted map)",
                      n, c.row_map[n], n));
  if (n >= 0 && fired(faults, RuleId::commit_accepted)) {  // commit.accepted
    const i64 a = c.accepted[n];
    i64 length = -1;
    if (c.cu.known())
      if (const auto s = row_rules::row_span(c.cu, c.rows, n, -1); s.judged) length = s.end - s.begin;
    if (a < 0 || a > c.draft_tokens)
      // commit.accepted
      r.add(RuleId::commit_accepted, "accepted",
            fmt::format("accepted[{}] = {} is outside [0, T = {}]", n, a, c.draft_tokens));
    else if (length >= 0 && a > length)
      // commit.accepted
      r.add(RuleId::commit_accepted, "accepted",
            fmt::format("accepted[{}] = {} is past row {}'s length {}", n, a, n, length));
    else
      // commit.accepted
      r.add(RuleId::commit_accepted, "accepted",
            fmt::format("accepted[{}] = {} needs step {} of row {}, but scratch_indices[{}, {}] "
                        "is -1 (that step was not written)",
                        n, a, a - 1, n, n, a - 1));
  }
  if (n >= 0 && fired(faults, RuleId::accept_prior_accepted))  // accept.prior_accepted
    r.add(RuleId::accept_prior_accepted, "prior_accepted",
          fmt::format("prior_accepted[{}] = {} is outside [0, T_alloc of prior_records = {}]", n,
                      c.prior_accepted[n], c.prior_steps));
}

// Judges every row with the entry point's row function, then the cross-row index.unique.
template <class Rows>
void judge_rows(const Rows& rows, const RowContext& c, Report& r) {
  // Rows are only judged on known values, and a known index holds an entry per row: this bounds
  // the loop for absurd row counts.
  if (!c.slots.known() && !c.cu.known() && !c.row_map.known() && !c.scratch_indices.known() &&
      !c.accepted.known() && !c.prior_accepted.known())
    return;
  Mask reported = 0;
  if (const Mask call = row_rules::call_faults(rows); call != 0)
    report_row(c, -1, call, reported, r);
  for (i64 n = 0; n < c.rows; ++n)
    if (const Mask faults = row_rules::row_faults(rows, n); faults != 0)
      report_row(c, n, faults, reported, r);
  check_unique(c.slots, c.rows, c.slot_map_name, c.num_slots, r);
}

void check_values(const Context& ctx, Report& r) {
  const Dims& d = ctx.dims;
  const Entry e = ctx.entry;
  const bool verify_like = e == Entry::verify || e == Entry::commit;
  const Arg slot_map = e == Entry::prefill ? Arg::initial_state_indices : Arg::cache_indices;
  for (Arg a : {Arg::cu_seqlens, slot_map, Arg::scratch_indices, Arg::accepted, Arg::prior_accepted})
    check_value_input(ctx, a, r);
  // Verify and commit read the row map only without scratch_indices.
  const bool row_map_read = value_rules_read(e, Arg::scratch_row_map, ctx.has(Arg::scratch_indices));
  if (row_map_read) check_value_input(ctx, Arg::scratch_row_map, r);

  const i64 N = d.N.value_or(-1);
  if (N < 0) return;
  // An invalid T is verify.draft_tokens' to report; rows are judged against a valid one only.
  const i64 T = d.T && *d.T >= 1 ? *d.T : 0;
  RowContext c;
  c.slot_map_name = arg_name(slot_map);
  c.rows = N;
  c.num_slots = d.slots.value_or(-1);
  c.padding_allowed = e != Entry::prefill;
  c.draft_tokens = T;
  c.total_tokens = has_token_inputs(e) ? d.rows : std::nullopt;
  c.cu = host_index(ctx, Arg::cu_seqlens, saturating_add(N, 1));
  c.slots = d.slots ? host_index(ctx, slot_map, N) : HostIndex{};
  if (verify_like) {
    if (d.scratch_rows && d.scratch_steps && T >= 1)
      c.scratch_indices = host_index(ctx, Arg::scratch_indices, saturating_mul(N, T));
    c.scratch_slots = d.scratch_rows && d.scratch_steps
                          ? saturating_mul(*d.scratch_rows, *d.scratch_steps) : 0;
    if (row_map_read) c.row_map = host_index(ctx, Arg::scratch_row_map, N);
  }
  switch (e) {
    case Entry::decode:
      judge_rows(row_rules::DecodeRows<HostIndex>{N, c.num_slots, c.slots, c.cu}, c, r);
      break;
    case Entry::prefill:
      if (!d.rows) return;
      judge_rows(row_rules::PrefillRows<HostIndex>{N, *d.rows, c.num_slots, c.cu, c.slots}, c, r);
      break;
    case Entry::verify:
      if (!d.rows) return;
      judge_rows(row_rules::VerifyRows<HostIndex>{N, *d.rows, T, c.num_slots, c.scratch_slots,
                                                  c.cu, c.slots, c.row_map, c.scratch_indices},
                 c, r);
      check_unique(c.scratch_indices, saturating_mul(N, T), "scratch_indices", c.scratch_slots, r);
      break;
    case Entry::commit:
      c.accepted = host_index(ctx, Arg::accepted, N);
      judge_rows(row_rules::CommitRows<HostIndex>{N, T, c.num_slots, c.scratch_slots, c.cu,
                                                  c.slots, c.row_map, c.scratch_indices,
                                                  c.accepted},
                 c, r);
      check_unique(c.scratch_indices, saturating_mul(N, T), "scratch_indices", c.scratch_slots, r);
      break;
    // The record-based path has no scratch: its rows are verify's and commit's without the
    // scratch addressing (kRecordVerifyRules, kReplayCommitRules are those rule sets less the
    // rules that only the scratch addressing can break).
    case Entry::record_verify:
      if (!d.rows) return;
      judge_rows(row_rules::VerifyRows<HostIndex>{N, *d.rows, T, c.num_slots, 0, c.cu, c.slots,
                                                  {}, {}},
                 c, r);
      break;
    case Entry::replay_commit:
      c.accepted = host_index(ctx, Arg::accepted, N);
      judge_rows(row_rules::CommitRows<HostIndex>{N, T, c.num_slots, 0, c.cu, c.slots, {}, {},
                                                  c.accepted},
                 c, r);
      break;
    case Entry::accept_verify:
      if (!d.rows) return;
      // Prior counts are judged against prior_records' steps, when it has them.
      if (d.prior_record_steps) {
        c.prior_accepted = host_index(ctx, Arg::prior_accepted, N);
        c.prior_steps = *d.prior_record_steps;
      }
      judge_rows(row_rules::AcceptVerifyRows<HostIndex>{
                     {N, *d.rows, T, c.num_slots, 0, c.cu, c.slots, {}, {}},
                     c.prior_steps,
                     c.prior_accepted},
                 c, r);
      break;
  }
}

// ------------------------------------------------------------------------------------------------

template <class Call, std::size_t NSpecs>
Verdict run_validation(const Call& call, const std::array<ArgSpec, NSpecs>& specs) {
  Report report;
  Context ctx = make_context(call, specs);
  derive_dims(ctx);
  check_presence(ctx, report);
  for (const ArgSpec& s : specs) check_argument(ctx, s, report);
  check_dims_and_scalars(ctx, report);
  check_aliasing(ctx, report);
  check_values(ctx, report);
  return std::move(report).finish();
}

}  // namespace

bool Verdict::breaks(RuleId rule) const {
  return std::any_of(violations.begin(), violations.end(),
                     [&](const Violation& v) { return v.rule == rule; });
}

Verdict validate(const DecodeCall& call) { return run_validation(call, kDecodeSpecs); }
Verdict validate(const PrefillCall& call) { return run_validation(call, kPrefillSpecs); }
Verdict validate(const VerifyCall& call) { return run_validation(call, kVerifySpecs); }
Verdict validate(const CommitCall& call) { return run_validation(call, kCommitSpecs); }
Verdict validate(const RecordVerifyCall& call) {
  return run_validation(call, kRecordVerifySpecs);
}
Verdict validate(const ReplayCommitCall& call) {
  return run_validation(call, kReplayCommitSpecs);
}
Verdict validate(const AcceptVerifyCall& call) {
  return run_validation(call, kAcceptVerifySpecs);
}
Verdict validate(const AnyCall& call) {
  return std::visit([](const auto& c) { return validate(c); }, call);
}
Verdict validate(const CatalogueCall& call) {
  return std::visit([](const auto& c) { return validate(c); }, call);
}

std::string describe(const Verdict& verdict) {
  if (verdict.accepted()) return "accepted";
  std::string text;
  for (const Violation& v : verdict.violations)
    text += fmt::format("{} ({}): {}\n", rule_id(v.rule), v.argument, v.message);
  return text;
}

}  // namespace kdaguard
