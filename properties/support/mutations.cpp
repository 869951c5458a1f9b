#include "mutations.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "view_edits.h"

namespace kdaguard::support {

using i64 = std::int64_t;

namespace {

using namespace entry_masks;
using namespace view_edits;

bool has(const GeneratedCall& g, Arg a) {
  const OptionalView* v = find_argument(g.call, a);
  return v != nullptr && v->has_value();
}

Arg pool_arg(const GeneratedCall& g) {
  return g.plan.entry == Entry::prefill ? Arg::initial_state : Arg::state;
}
Arg slot_map_arg(const GeneratedCall& g) {
  return g.plan.entry == Entry::prefill ? Arg::initial_state_indices : Arg::cache_indices;
}

void rebuild(GeneratedCall& g) { g.call = build_call(g.plan); }

Arg pick_arg(std::span<const Arg> args, Chooser& c) { return c.element(args); }

std::vector<i64>& values_of(GeneratedCall& g, Arg a) {
  TensorView& t = present(g, a);
  if (!t.values) throw std::logic_error("mutation: index tensor without host values");
  return *t.values;
}

// Rows of q (the token count), or B for decode.
i64 token_rows(GeneratedCall& g) { return present(g, Arg::q).shape[0]; }

// Index of an active row (slot >= 0), the `k`-th one.
i64 active_row(const CallPlan& p, i64 k) {
  for (i64 r = 0; r < p.rows(); ++r)
    if (p.slot_of_row[r] >= 0 && k-- == 0) return r;
  throw std::logic_error("mutation: not enough active rows");
}

// ------------------------------------------------------------------------------------------------
// The mutations, one function each
// ------------------------------------------------------------------------------------------------

// arg.missing
void drop_required(GeneratedCall& g, Chooser& c) {
  std::vector<Arg> candidates;
  switch (g.plan.entry) {
    case Entry::decode:
      candidates = {Arg::q, Arg::k, Arg::v, Arg::state, Arg::cache_indices, Arg::out};
      break;
    case Entry::prefill: candidates = {Arg::q, Arg::k, Arg::v, Arg::cu_seqlens, Arg::out}; break;
    case Entry::verify:
      candidates = {Arg::q, Arg::k, Arg::v, Arg::cu_seqlens, Arg::state, Arg::cache_indices,
                    Arg::scratch, Arg::out};
      break;
    case Entry::commit:
      candidates = {Arg::scratch, Arg::state, Arg::cache_indices, Arg::accepted};
      break;
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify:
      break;  // AnyCall's entry points only (record_mutations.cpp has its own)
  }
  const Arg a = pick_arg(candidates, c);
  slot(g, a).reset();
  expect(g, "{} {} is required and absent", entry_name(g.plan.entry), arg_name(a));
}
void drop_both_gate_forms(GeneratedCall& g, Chooser& c) {
  if (c.coin()) {
    slot(g, Arg::b).reset();
    slot(g, Arg::beta).reset();
    expect(g, "{} needs b or beta; both are absent", entry_name(g.plan.entry));
  } else {
    // Without a gate, A_log and dt_bias have nothing to apply to; they go too.
    for (Arg a : {Arg::a, Arg::g, Arg::A_log, Arg::dt_bias}) slot(g, a).reset();
    expect(g, "{} needs a or g; both are absent", entry_name(g.plan.entry));
  }
}
void drop_row_map(GeneratedCall& g, Chooser&) {
  slot(g, Arg::scratch_row_map).reset();
  expect(g, "scratch_row_map is required when scratch_indices is absent");
}

// arg.exclusive
void both_beta_forms(GeneratedCall& g, Chooser&) {
  OptionalView& b = slot(g, Arg::b);
  OptionalView& beta = slot(g, Arg::beta);
  if (b) beta = b;
  else b = beta;
  expect(g, "give b or beta, not both");
}
void both_gate_forms(GeneratedCall& g, Chooser&) {
  slot(g, Arg::g) = present(g, Arg::a);
  expect(g, "give a or g, not both");
}

// arg.rank
void beta_rank_three(GeneratedCall& g, Chooser&) {
  const Arg a = has(g, Arg::b) ? Arg::b : Arg::beta;
  TensorView& t = present(g, a);
  t.rank = 3;
  t.shape[2] = 1;
  t.stride[2] = 1;
  expect(g, "{} must have 2 dimensions; got 3 (shape {})", arg_name(a), shape_text(t));
}
void index_rank_two(GeneratedCall& g, Chooser&) {
  TensorView& t = present(g, Arg::cache_indices);
  t.rank = 2;
  t.shape[1] = 1;
  t.stride[1] = 1;
  expect(g, "cache_indices must have 1 dimensions; got 2 (shape {})", shape_text(t));
}

// arg.shape
// A dim of out (rows, HV or V) or of k (H or K) off its size; head dims swap 64 and 128, so the
// rows stay 16-byte aligned.
void wrong_size(GeneratedCall& g, Chooser& c) {
  const bool key = c.one_in(3);
  TensorView& t = present(g, key ? Arg::k : Arg::out);
  const int d = static_cast<int>(c.pick(key ? 1 : 0, 2));
  const i64 want = t.shape[d];
  if (d == 2) t.shape[d] = want == 64 ? 128 : 64;
  else if (d == 0 && want > 0 && c.coin()) t.shape[d] -= 1;
  else t.shape[d] += 1;
  detach_compact(t);
  static constexpr std::string_view kOutDims[] = {"", "HV", "V"}, kKeyDims[] = {"", "H", "K"};
  const std::string_view dim = d == 0 ? (g.plan.entry == Entry::decode ? "B" : "T_tot")
                               : key ? kKeyDims[d] : kOutDims[d];
  expect(g, "{} dim {} must be {} = {}; got {} (shape {})", key ? "k" : "out", d, dim, want,
         t.shape[d], shape_text(t));
}
// A gate parameter one entry long or short: A_log [HV] or dt_bias [HV*K] (given the call a
// dt_bias first when its plan has none), named by contracts.md's symbol for its size.
void gate_param_wrong_size(GeneratedCall& g, Chooser& c) {
  const bool bias = c.coin();
  if (bias && !g.plan.dt_bias) {
    g.plan.dt_bias = true;
    rebuild(g);
  }
  const Arg a = bias ? Arg::dt_bias : Arg::A_log;
  TensorView& t = present(g, a);
  const i64 want = t.shape[0];
  t.shape[0] = c.coin() ? want + 1 : want - 1;
  detach_compact(t);
  expect(g, "{} dim 0 must be {} = {}; got {} (shape {})", arg_name(a), bias ? "HV*K" : "HV",
         want, t.shape[0], shape_text(t));
}
void cu_seqlens_too_long(GeneratedCall& g, Chooser&) {
  TensorView& cu = present(g, Arg::cu_seqlens);
  cu.shape[0] += 1;
  if (cu.values) cu.values->push_back(cu.values->back());  // an empty extra row: still monotone
  detach_compact(cu);
  expect(g, "cu_seqlens dim 0 must be N+1 = {}; got {}", cu.shape[0] - 1, cu.shape[0]);
}

// arg.dtype
void out_other_dtype(GeneratedCall& g, Chooser&) {
  TensorView& out = present(g, Arg::out);
  out.dtype = out.dtype == DType::f32 ? DType::bf16 : DType::f32;
  detach_compact(out);
  expect(g, "out has dtype {}; expected {} (the dtype of q)", dtype_name(out.dtype),
         dtype_name(present(g, Arg::q).dtype));
}
void q_integer(GeneratedCall& g, Chooser& c) {
  TensorView& q = present(g, Arg::q);
  q.dtype = c.coin() ? DType::i32 : DType::i64;
  detach_compact(q);
  expect(g, "q has dtype {}; expected bf16, f16 or f32", dtype_name(q.dtype));
}
void index_i64(GeneratedCall& g, Chooser& c) {
  const Arg a = g.plan.entry == Entry::commit && c.coin() ? Arg::accepted : slot_map_arg(g);
  TensorView& t = present(g, a);
  t.dtype = DType::i64;
  detach_compact(t);
  expect(g, "{} has dtype i64; expected i32", arg_name(a));
}

// arg.last_dim_contiguous
void q_every_other_element(GeneratedCall& g, Chooser&) {
  TensorView& q = present(g, Arg::q);
  detach_compact(q);
  for (int d = 0; d < q.rank; ++d) q.stride[d] *= 2;
  expect(g, "`q` must be contiguous in the last dim.: its last stride is 2 (strides {})",
         stride_text(q));
}
void index_every_other_entry(GeneratedCall& g, Chooser& c) {
  const Arg a = c.coin() ? Arg::accepted : Arg::cache_indices;
  TensorView& t = present(g, a);
  detach_compact(t);
  t.stride[0] = 2;
  expect(g, "`{}` must be contiguous in the last dim.: its last stride is 2 (strides (2))",
         arg_name(a));
}

// arg.stride
void out_heads_share_memory(GeneratedCall& g, Chooser&) {
  TensorView& out = present(g, Arg::out);
  out.stride[1] = 0;
  expect(g, "output out maps two elements to one address: shape {}, strides {}", shape_text(out),
         stride_text(out));
}

// arg.alignment
void q_misaligned(GeneratedCall& g, Chooser& c) {
  TensorView& q = present(g, Arg::q);
  if (c.coin() || q.shape[0] < 2) {  // a row pitch only matters with two rows
    q.address = 0;
    q.storage_size.reset();
    q.storage_offset = Elements{c.pick(1, 16 / element_size(q.dtype) - 1)};
    expect(g, "q data address {:#x} is not 16-byte aligned (address {:#x} + storage_offset {} x {} "
           "bytes)", data_address(q), q.address, q.storage_offset.count, element_size(q.dtype));
  } else {
    detach_compact(q);
    q.stride[0] += 16 / element_size(q.dtype) - 1;  // a row pitch that is not 16-byte aligned
    expect(g, "q stride {} of dim 0 is {} bytes, not a multiple of 16", q.stride[0],
           q.stride[0] * element_size(q.dtype));
  }
}
void index_misaligned(GeneratedCall& g, Chooser& c) {
  const Arg a = c.coin() ? Arg::accepted : Arg::cache_indices;
  TensorView& t = present(g, a);
  detach_compact(t);
  t.address = kMovedAddress + static_cast<std::uint64_t>(c.pick(1, 3));
  expect(g, "{} data address {:#x} is not 4-byte aligned", arg_name(a), t.address);
}

// alias.overlap
void v_aliases_out(GeneratedCall& g, Chooser&) {
  TensorView& out = present(g, Arg::out);
  if (out.address == 0) out.address = kMovedAddress;
  present(g, Arg::v) = out;
  expect(g, "output out bytes {} overlap v bytes {}", byte_range_text(out), byte_range_text(out));
}
void index_inside_pool(GeneratedCall& g, Chooser&) {
  TensorView& pool = present(g, Arg::state);
  if (pool.address == 0) pool.address = kMovedAddress;
  TensorView& idx = present(g, Arg::cache_indices);
  const i64 pool_bytes = pool.storage_offset.count * element_size(pool.dtype);
  idx.address = pool.address;
  idx.storage_offset = Elements{pool_bytes / 4};
  idx.storage_size.reset();
  if (pool.storage_size)
    idx.storage_size = Elements{pool.storage_size->count * element_size(pool.dtype) / 4};
  expect(g, "output state bytes {} overlap cache_indices bytes {}", byte_range_text(pool),
         byte_range_text(idx));
}

// dims.heads, dims.head_dim
void heads_not_a_multiple(GeneratedCall& g, Chooser& c) {
  g.plan.H = c.one_in(3) ? 0 : g.plan.HV + c.pick(1, 2);
  rebuild(g);
  expect(g, "HV must be a positive multiple of H; got HV = {} (v), H = {} (q)", g.plan.HV, g.plan.H);
}
void unsupported_head_dim(GeneratedCall& g, Chooser& c) {
  static constexpr i64 kOdd[] = {32, 96, 192, 256};
  const bool key = c.coin();
  const i64 size = c.element(kOdd);
  (key ? g.plan.K : g.plan.V) = size;
  rebuild(g);
  expect(g, "{} must be 64 or 128; got {} ({})", key ? "K" : "V", size, key ? "q" : "v");
}

// scalar.scale, scalar.lower_bound, gate.params
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
void bad_scale(GeneratedCall& g, Chooser& c) {
  static constexpr double kBad[] = {0.0, -0.125, kNaN, kInf, -kInf};
  const double scale = c.element(kBad);
  scalars_of(g.call).scale = scale;
  expect(g, "scale must be finite and > 0; got {}", scale);
}
void bad_lower_bound(GeneratedCall& g, Chooser& c) {
  static constexpr double kBad[] = {0.0, 0.5, kNaN, -kInf, kInf};
  const double bound = c.element(kBad);
  scalars_of(g.call).lower_bound = bound;
  expect(g, "lower_bound must be finite and < 0; got {}", bound);
}
void raw_gate_without_A_log(GeneratedCall& g, Chooser&) {
  slot(g, Arg::A_log).reset();
  expect(g, "a raw gate a needs A_log to be activated in the kernel; A_log is absent");
}
void lower_bound_with_activated_gate(GeneratedCall& g, Chooser& c) {
  const double bound = -static_cast<double>(c.pick(1, 40)) / 8.0;
  scalars_of(g.call).lower_bound = bound;
  expect(g, "lower_bound {} applies to a raw gate a; g is already activated", bound);
}

// gate.cover_tokens
void gate_or_beta_short(GeneratedCall& g, Chooser& c) {
  const i64 rows = token_rows(g);
  const Arg gate = has(g, Arg::a) ? Arg::a : Arg::g;
  const Arg beta = has(g, Arg::b) ? Arg::b : Arg::beta;
  const Arg a = c.coin() ? gate : beta;
  TensorView& t = present(g, a);
  t.shape[0] = rows - c.pick(1, rows);
  expect(g, "g and beta must cover every q token: {} has {} rows, q has {}", arg_name(a), t.shape[0],
         rows);
}

// state.*
void pool_rank_three(GeneratedCall& g, Chooser&) {
  TensorView& t = present(g, pool_arg(g));
  t.rank = 3;
  t.shape[2] *= t.shape[3];
  t.stride[2] = 1;
  expect(g, "recurrent_kda needs a [N, HV, V, K] state pool; got shape {} for {}", shape_text(t),
         arg_name(pool_arg(g)));
}
// The pool (or, in verify and commit, sometimes the scratch) whose layout a state.* mutation
// breaks; `inner` is the index of its HV dim.
// The state pool of the call, or for verify and commit sometimes the scratch.
Pool some_pool(GeneratedCall& g, Chooser& c) {
  const bool scratch = (g.plan.entry == Entry::verify || g.plan.entry == Entry::commit) && c.coin();
  const Arg a = scratch ? Arg::scratch : pool_arg(g);
  return {present(g, a), scratch ? 2 : 1, arg_name(a)};
}
void pool_heads_padded(GeneratedCall& g, Chooser& c) { pad_pool_heads(some_pool(g, c), c, g.message_texts); }
void slot_stride_unaligned(GeneratedCall& g, Chooser& c) {
  misalign_slot_stride(some_pool(g, c), c, g.message_texts);
}
void pool_base_unaligned(GeneratedCall& g, Chooser& c) {
  misalign_pool_base(some_pool(g, c), c, g.message_texts);
}
void slot_stride_too_small(GeneratedCall& g, Chooser& c) {
  overlap_pool_slots(some_pool(g, c), c, g.message_texts);
}
void empty_pool(GeneratedCall& g, Chooser&) {
  present(g, pool_arg(g)).shape[0] = 0;
  present(g, slot_map_arg(g)).values.reset();  // no slot is in range now: defer, don't report
  expect(g, "{} has 0 slots; the call has {} rows that need one", arg_name(pool_arg(g)),
         g.plan.rows());
}

// index.*
void slot_map_short(GeneratedCall& g, Chooser&) {
  TensorView& t = present(g, slot_map_arg(g));
  t.shape[0] = g.plan.rows() - 1;
  if (t.values) t.values->resize(static_cast<std::size_t>(t.shape[0]));
  expect(g, "{} has {} entries; the call has {} = {} rows", arg_name(slot_map_arg(g)), t.shape[0],
         g.plan.entry == Entry::decode ? "B" : "N", g.plan.rows());
}
void row_map_short(GeneratedCall& g, Chooser&) {
  TensorView& t = present(g, Arg::scratch_row_map);
  t.shape[0] = g.plan.rows() - 1;
  if (t.values) t.values->resize(static_cast<std::size_t>(t.shape[0]));
  expect(g, "scratch_row_map has {} entries; the call has N = {} rows", t.shape[0], g.plan.rows());
}
void slot_out_of_range(GeneratedCall& g, Chooser& c) {
  const i64 r = active_row(g.plan, c.pick(0, 0));
  const bool low = g.plan.entry != Entry::prefill && c.coin();
  const i64 slot = low ? -2 - c.pick(0, 5) : g.plan.slots + c.pick(0, 5);
  values_of(g, slot_map_arg(g))[r] = slot;
  expect(g, "{}[{}] = {} is outside [{}, {})", arg_name(slot_map_arg(g)), r, slot,
         g.plan.entry == Entry::prefill ? 0 : -1, g.plan.slots);
}
void scratch_index_out_of_range(GeneratedCall& g, Chooser& c) {
  // Row 0 is active and has a token (PlanNeeds), so entry [0, 0] names a scratch slot.
  const i64 entry = g.plan.S_spec * g.plan.T_alloc + c.pick(0, 5);
  values_of(g, Arg::scratch_indices)[0] = entry;
  expect(g, "scratch_indices[0, 0] = {} is outside [-1, {})", entry, g.plan.S_spec * g.plan.T_alloc);
}
void slot_shared_by_two_rows(GeneratedCall& g, Chooser&) {
  const i64 first = active_row(g.plan, 0), second = active_row(g.plan, 1);
  auto& values = values_of(g, slot_map_arg(g));
  values[second] = values[first];
  expect(g, "{}[{}] = {} names a slot an earlier row already uses", arg_name(slot_map_arg(g)), second,
         values[first]);
}
void prefill_padding_row(GeneratedCall& g, Chooser& c) {
  const i64 r = c.pick(0, g.plan.rows() - 1);
  values_of(g, Arg::initial_state_indices)[r] = -1;
  expect(g, "initial_state_indices[{}] is -1, but padding rows are not allowed here", r);
}

// seqlens.*, decode.one_token
void seqlens_not_from_zero(GeneratedCall& g, Chooser& c) {
  auto& cu = values_of(g, Arg::cu_seqlens);
  const i64 len0 = cu[1] - cu[0];
  const bool verify_like = g.plan.entry != Entry::prefill;
  if (!verify_like || len0 < g.plan.T) {
    cu[0] = -c.pick(1, verify_like ? g.plan.T - len0 : 4);  // row 0 grows, within T
  } else {
    cu[0] = cu[1];  // row 0 becomes empty; it can then accept nothing
    if (g.plan.entry == Entry::commit) values_of(g, Arg::accepted)[0] = 0;
  }
  expect(g, "cu_seqlens[0] must be 0; got {}", cu[0]);
}
void seqlens_decrease(GeneratedCall& g, Chooser& c) {
  auto& cu = values_of(g, Arg::cu_seqlens);
  const i64 i = c.pick(1, g.plan.rows() - 1);
  cu[i] = cu[i + 1] + c.pick(1, 3);
  expect(g, "cu_seqlens decreases: cu_seqlens[{}] = {} > cu_seqlens[{}] = {}", i, cu[i], i + 1,
         cu[i + 1]);
}
void seqlens_wrong_total(GeneratedCall& g, Chooser&) {
  auto& cu = values_of(g, Arg::cu_seqlens);
  const std::size_t n = cu.size() - 1;
  if (cu[n] > cu[n - 1]) cu[n] -= 1;  // the last row gives up a token
  else cu[n] += 1;                    // the (empty) last row claims one past T_tot
  expect(g, "cu_seqlens[N] must equal T_tot = {} (the rows of q); got {}", token_rows(g), cu[n]);
}
void decode_cu_not_one_token(GeneratedCall& g, Chooser& c) {
  auto& cu = values_of(g, Arg::cu_seqlens);
  const auto i = static_cast<std::size_t>(c.pick(0, static_cast<i64>(cu.size()) - 1));
  cu[i] += c.pick(1, 3);
  // The first row whose offsets are not n, n + 1 is row i - 1 (row 0 for i = 0): it quotes cu[i].
  expect(g, "cu_seqlens must be 0, 1, ..., B; cu_seqlens[{}] = {}", i, cu[i]);
}

// prefill.indexed_pool
void prefill_without_pool(GeneratedCall& g, Chooser& c) {
  slot(g, c.coin() ? Arg::initial_state_indices : Arg::initial_state).reset();
  if (!has(g, Arg::initial_state) && c.coin()) slot(g, Arg::initial_state_indices).reset();
  expect(g, "KDA prefill requires an indexed initial-state pool: initial_state is {}, "
         "initial_state_indices is {}", has(g, Arg::initial_state) ? "given" : "absent",
         has(g, Arg::initial_state_indices) ? "given" : "absent");
}

// verify.*
void draft_tokens_absent(GeneratedCall& g, Chooser&) {
  scalars_of(g.call).draft_token_num.reset();
  expect(g, "draft_token_num is required");
}
void draft_tokens_below_one(GeneratedCall& g, Chooser& c) {
  const i64 T = -c.pick(0, 2);
  scalars_of(g.call).draft_token_num = T;
  expect(g, "draft_token_num must be >= 1; got {}", T);
}
void more_steps_than_scratch(GeneratedCall& g, Chooser& c) {
  const i64 T = g.plan.T_alloc + c.pick(1, 3);
  scalars_of(g.call).draft_token_num = T;
  expect(g, "KDA verify needs {} scratch steps, but intermediate_ssm only has {}.", T, g.plan.T_alloc);
}
void scratch_rows_do_not_flatten(GeneratedCall& g, Chooser& c) {
  TensorView& t = present(g, Arg::scratch);
  if (c.coin()) {
    t.address = 0;
    t.storage_size.reset();
    t.stride[0] += 16 * c.pick(1, 3);
    expect(g, "scratch rows must flatten into steps: stride[0] must be T_alloc * stride[1] = {}; got {}",
           t.shape[1] * t.stride[1], t.stride[0]);
  } else {
    t.dtype = t.dtype == DType::f32 ? DType::bf16 : DType::f32;
    t.address = 0;
    t.storage_size.reset();
    t.storage_offset = Elements{0};
    expect(g, "scratch has dtype {}; it must be the state's dtype {}", dtype_name(t.dtype),
           dtype_name(present(g, Arg::state).dtype));
  }
}
void too_few_scratch_rows(GeneratedCall& g, Chooser& c) {
  const i64 rows = g.plan.rows() - c.pick(1, g.plan.rows());
  present(g, Arg::scratch).shape[0] = rows;
  // Explicit indices may now name slots past the scratch: leave those to the device.
  if (has(g, Arg::scratch_indices)) present(g, Arg::scratch_indices).values.reset();
  expect(g, "scratch has {} rows (S_spec); the call has N = {} rows", rows, g.plan.rows());
}
void row_longer_than_draft(GeneratedCall& g, Chooser& c) {
  const i64 r = c.pick(0, g.plan.rows() - 1);
  g.plan.row_lengths[r] = g.plan.T + c.pick(1, 2);
  rebuild(g);
  const auto& cu = values_of(g, Arg::cu_seqlens);
  expect(g, "verify row {} holds {} tokens (cu_seqlens[{}] = {} to cu_seqlens[{}] = {}); at most T = {}",
         r, g.plan.row_lengths[r], r, cu[r], r + 1, cu[r + 1], g.plan.T);
}
// A padding row writes no scratch, so its map entry is free: the mutation moves an active row's,
// up, down (below 0 too) or onto another row's entry (a map that is not a permutation).
void row_map_not_identity(GeneratedCall& g, Chooser& c) {
  auto& map = values_of(g, Arg::scratch_row_map);
  const i64 r = active_row(g.plan, 0);
  switch (c.pick(0, 2)) {
    case 0: map[r] += c.pick(1, 3); break;
    case 1: map[r] -= c.pick(1, 3); break;
    default: {  // a padding row's entry may already be r
      const i64 other = c.pick(0, g.plan.rows() - 2);
      const i64 copied = g.plan.rows() >= 2 ? map[other < r ? other : other + 1] : r;
      map[r] = copied != r ? copied : r + 1;
    }
  }
  expect(g, "scratch_row_map[{}] = {}, expected {} for a row that is not padding", r, map[r], r);
}
void scratch_indices_wrong_form(GeneratedCall& g, Chooser& c) {
  TensorView& t = present(g, Arg::scratch_indices);
  if (c.coin()) {
    t.dtype = DType::i64;
    detach_compact(t);
    expect(g, "scratch_indices must be i32; got i64");
  } else {
    // [N, T + 1]: one step more per row than the draft holds.
    const i64 n = t.shape[0], steps = t.shape[1];
    if (t.values) {
      std::vector<i64> wider;
      for (i64 r = 0; r < n; ++r) {
        for (i64 s = 0; s < steps; ++s) wider.push_back((*t.values)[r * steps + s]);
        wider.push_back(-1);
      }
      t.values = std::move(wider);
    }
    t.shape[1] = steps + 1;
    detach_compact(t);
    expect(g, "scratch_indices must be [N, T] = [{}, {}]; got shape ({}, {})", n, g.plan.T, n,
           steps + 1);
  }
}

// commit.accepted
void accepted_out_of_range(GeneratedCall& g, Chooser& c) {
  auto& acc = values_of(g, Arg::accepted);
  const i64 r = c.pick(0, g.plan.rows() - 1);
  acc[r] = c.coin() ? g.plan.T + c.pick(1, 3) : -c.pick(1, 3);
  expect(g, "accepted[{}] = {} is outside [0, T = {}]", r, acc[r], g.plan.T);
}

// A row commits a step its explicit scratch indices skip (-1): that step's state was never written.
void accepted_skipped_step(GeneratedCall& g, Chooser& c) {
  i64 r = 0;
  while (r < g.plan.rows() && (g.plan.slot_of_row[r] < 0 || g.plan.row_lengths[r] < 1)) ++r;
  if (r == g.plan.rows()) throw std::logic_error("mutation: no active row with a token");
  const i64 t = c.pick(0, std::min(g.plan.T, g.plan.row_lengths[r]) - 1);
  values_of(g, Arg::scratch_indices)[r * present(g, Arg::scratch_indices).shape[1] + t] = -1;
  values_of(g, Arg::accepted)[r] = t + 1;
  expect(g, "accepted[{}] = {} needs step {} of row {}, but scratch_indices[{}, {}] is -1 (that step "
         "was not written)", r, t + 1, t, r, r, t);
}

// ------------------------------------------------------------------------------------------------
// The table
// ------------------------------------------------------------------------------------------------

PlanNeeds rows(int n) { return PlanNeeds{.min_rows = n}; }
PlanNeeds with_values(PlanNeeds n) {
  n.index_values = true;
  return n;
}

std::vector<Mutation> make_table() {
  using R = RuleId;
  const PlanNeeds none{};
  return {
      {R::arg_missing, "drop a required argument", kDPVC, true, none, drop_required},
      {R::arg_missing, "drop both forms of the gate or of beta", kDPV, true, none,
       drop_both_gate_forms},
      {R::arg_missing, "drop scratch_row_map when scratch_indices is absent", kVC, true,
       PlanNeeds{.explicit_scratch_indices = false}, drop_row_map},
      {R::arg_exclusive, "give b and beta", kDPV, true, none, both_beta_forms},
      {R::arg_exclusive, "give a and g", kDPV, true, PlanNeeds{.raw_gate = true}, both_gate_forms},
      {R::arg_rank, "b/beta with a third dim", kDPV, true, none, beta_rank_three},
      {R::arg_rank, "cache_indices with a second dim", kC, true, none, index_rank_two},
      {R::arg_shape, "out or k with a wrong size", kDPV, true, none, wrong_size},
      {R::arg_shape, "cu_seqlens one entry too long", kC, true, PlanNeeds{.cu_seqlens = true},
       cu_seqlens_too_long},
      {R::arg_dtype, "out in another dtype than q", kDPV, true, none, out_other_dtype},
      {R::arg_dtype, "an index map in i64", kDPVC, true, none, index_i64},
      {R::arg_device, "one argument on another device", kDPVC, true, none, other_device_argument},
      {R::arg_last_dim_contiguous, "q with last stride 2", kDPV, true, none,
       q_every_other_element},
      {R::arg_last_dim_contiguous, "an index map with stride 2", kC, true, rows(2),
       index_every_other_entry},
      {R::arg_stride, "a negative stride", kDPVC, true, none, negative_stride},
      {R::arg_stride, "out heads share memory", kDPV, true,
       PlanNeeds{.min_tokens = 1, .min_heads_ratio = 2}, out_heads_share_memory},
      {R::arg_extent, "storage one element short", kDPVC, true, none, storage_one_short},
      {R::arg_extent, "storage offset near INT64_MAX", kDPVC, false, none, offset_overflows},
      {R::arg_alignment, "q not 16-byte aligned", kDPV, true, none, q_misaligned},
      {R::arg_alignment, "an index map at an odd address", kC, true, none, index_misaligned},
      {R::alias_overlap, "v aliases out", kDPV, true, PlanNeeds{.min_tokens = 1}, v_aliases_out},
      {R::alias_overlap, "cache_indices inside the state pool", kC, true, rows(1),
       index_inside_pool},
      {R::dims_heads, "HV not a multiple of H", kDPV, true, none, heads_not_a_multiple},
      {R::dims_head_dim, "K or V outside {64, 128}", kDPV, true, none, unsupported_head_dim},
      {R::scalar_scale, "scale zero, negative or not finite", kDPV, true, none, bad_scale},
      {R::scalar_lower_bound, "lower_bound >= 0 or not finite", kDPV, true,
       PlanNeeds{.raw_gate = true}, bad_lower_bound},
      {R::gate_params, "raw gate without A_log", kDPV, true, PlanNeeds{.raw_gate = true},
       raw_gate_without_A_log},
      {R::gate_params, "lower_bound with an activated g", kDPV, true, PlanNeeds{.raw_gate = false},
       lower_bound_with_activated_gate},
      {R::gate_cover_tokens, "gate or beta shorter than q", kDPV, true,
       PlanNeeds{.min_tokens = 1}, gate_or_beta_short},
      {R::state_rank, "a 3-D pool", kDPVC, true, none, pool_rank_three},
      {R::state_inner_strides, "padded or transposed inner dims", kDPVC, true, none,
       pool_heads_padded},
      {R::state_slot_stride_align, "slot stride not a multiple of 16", kDPVC, true, none,
       slot_stride_unaligned},
      {R::state_base_align, "pool base 16 bytes off", kDPVC, true, none, pool_base_unaligned},
      {R::state_slot_stride_min, "slots overlap", kDPVC, true, none, slot_stride_too_small},
      {R::state_empty, "a pool of 0 slots", kDPVC, true, rows(1), empty_pool},
      {R::index_length, "slot map one entry short", kDPVC, true, rows(1), slot_map_short},
      {R::index_length, "row map one entry short", kVC, true,
       PlanNeeds{.min_rows = 1, .explicit_scratch_indices = false}, row_map_short},
      {R::index_range, "a slot past the pool", kDPVC, true,
       with_values(PlanNeeds{.min_active_rows = 1}), slot_out_of_range},
      {R::index_range, "a scratch index past the scratch", kVC, true,
       with_values(PlanNeeds{.min_active_rows = 1, .explicit_scratch_indices = true,
                             .min_rows_with_tokens = 1}),
       scratch_index_out_of_range},
      {R::index_unique, "two rows share a slot", kDPVC, true,
       with_values(PlanNeeds{.min_active_rows = 2}), slot_shared_by_two_rows},
      {R::index_padding, "-1 in initial_state_indices", kP, true, with_values(rows(1)),
       prefill_padding_row},
      {R::seqlens_start, "cu_seqlens[0] != 0", kPVC, true,
       with_values(PlanNeeds{.min_rows = 1, .cu_seqlens = true}), seqlens_not_from_zero},
      {R::seqlens_monotone, "cu_seqlens decreases", kPVC, true,
       with_values(PlanNeeds{.min_rows = 2, .cu_seqlens = true}), seqlens_decrease},
      {R::seqlens_total, "cu_seqlens[N] != T_tot", kPV, true, with_values(rows(1)),
       seqlens_wrong_total},
      {R::decode_one_token, "decode cu_seqlens not 0..B", kD, true,
       with_values(PlanNeeds{.cu_seqlens = true}), decode_cu_not_one_token},
      {R::prefill_indexed_pool, "prefill without its pool or indices", kP, true, none,
       prefill_without_pool},
      {R::verify_draft_tokens, "draft_token_num absent", kVC, true, none, draft_tokens_absent},
      {R::verify_draft_tokens, "draft_token_num < 1", kVC, false,
       with_values(PlanNeeds{.cu_seqlens = true, .min_rows_with_tokens = 1}),
       draft_tokens_below_one},
      {R::verify_scratch_steps, "T > T_alloc", kVC, true,
       PlanNeeds{.explicit_scratch_indices = false}, more_steps_than_scratch},
      {R::verify_scratch_layout, "scratch rows that do not flatten, or another dtype", kVC, true,
       PlanNeeds{.min_scratch_rows = 2}, scratch_rows_do_not_flatten},
      {R::verify_scratch_rows, "S_spec < N", kVC, true, rows(1), too_few_scratch_rows},
      {R::verify_row_length, "a row longer than T", kVC, true,
       with_values(PlanNeeds{.min_rows = 1, .cu_seqlens = true}), row_longer_than_draft},
      {R::verify_row_map_identity, "permuted row map without scratch_indices", kVC, true,
       with_values(PlanNeeds{.min_active_rows = 1, .explicit_scratch_indices = false}),
       row_map_not_identity},
      {R::verify_scratch_indices, "scratch_indices in i64 or [N, T+1]", kVC, true,
       PlanNeeds{.explicit_scratch_indices = true}, scratch_indices_wrong_form},
      {R::commit_accepted, "accepted outside [0, T]", kC, true, with_values(rows(1)),
       accepted_out_of_range},
      // Added after the fuzz seed corpus was written: at the end, so its inputs (which name a
      // mutation by its index) keep their meaning.
      {R::arg_dtype, "q in an integer dtype", kDPV, true, none, q_integer},
      {R::commit_accepted, "accepted names a skipped scratch step", kC, true,
       with_values(PlanNeeds{.min_active_rows = 1, .explicit_scratch_indices = true,
                             .min_rows_with_tokens = 1}),
       accepted_skipped_step},
      {R::arg_shape, "A_log or dt_bias with a wrong size", kDPV, true,
       PlanNeeds{.raw_gate = true}, gate_param_wrong_size},
  };
}

}  // namespace

std::span<const Mutation> mutation_table() {
  static const std::vector<Mutation> table = make_table();
  return table;
}

std::vector<const Mutation*> mutations_for(RuleId rule) {
  std::vector<const Mutation*> found;
  for (const Mutation& m : mutation_table())
    if (m.rule == rule) found.push_back(&m);
  return found;
}

GeneratedCall mutated_call(const Mutation& m, Entry e, Chooser& choose) {
  GeneratedCall g = generate_call(e, m.needs, choose);
  m.apply(g, choose);
  return g;
}

// ------------------------------------------------------------------------------------------------
// Random edits (fuzzing)
// ------------------------------------------------------------------------------------------------

namespace {

i64 interesting(Chooser& c, i64 current) {
  static constexpr i64 kValues[] = {0,
                                    1,
                                    -1,
                                    2,
                                    15,
                                    16,
                                    17,
                                    31,
                                    32,
                                    64,
                                    128,
                                    4096,
                                    std::int64_t{1} << 31,
                                    (std::int64_t{1} << 31) - 1,
                                    std::int64_t{1} << 32,
                                    std::int64_t{1} << 62,
                                    std::numeric_limits<i64>::max(),
                                    std::numeric_limits<i64>::min(),
                                    std::numeric_limits<i64>::max() / 2};
  auto wrap = [](std::uint64_t x) { return static_cast<i64>(x); };
  const auto u = static_cast<std::uint64_t>(current);
  switch (c.pick(0, 4)) {
    case 0: return wrap(u + 1);
    case 1: return wrap(u - 1);
    case 2: return wrap(u * 2);
    case 3: return c.pick(-64, 256);
    default: return c.element(kValues);
  }
}

double interesting_real(Chooser& c) {
  static constexpr double kValues[] = {0.0, -0.0, 1.0, -1.0, 1e-300, 1e300, kNaN, kInf, -kInf,
                                       0.125, -5.0};
  return c.element(kValues);
}

}  // namespace

void random_edit(GeneratedCall& g, Chooser& c) {
  // Every argument slot of the entry point, present or not (arrays: this runs per fuzz input).
  std::array<Arg, kArgCount> slot_storage{}, present_storage{};
  std::array<OptionalView*, kArgCount> views{};
  std::size_t slot_count = 0, present_count = 0;
  for_each_argument(g.call, [&](Arg a, OptionalView& view) {
    views[slot_count] = &view;
    slot_storage[slot_count++] = a;
    if (view) present_storage[present_count++] = a;
  });
  const std::span<const Arg> present_list(present_storage.data(), present_count);
  const std::size_t which = static_cast<std::size_t>(c.pick(0, static_cast<i64>(slot_count) - 1));
  OptionalView& v = *views[which];
  const int what = static_cast<int>(c.pick(0, 12));
  if (what == 11) {  // scalars
    Scalars& s = scalars_of(g.call);
    switch (c.pick(0, 4)) {
      case 0: s.scale = interesting_real(c); break;
      case 1: s.lower_bound = interesting_real(c); break;
      case 2: s.use_qk_l2norm = !s.use_qk_l2norm; break;
      case 3: s.draft_token_num = interesting(c, s.draft_token_num.value_or(1)); break;
      default: s.scale.reset(); s.lower_bound.reset(); s.draft_token_num.reset(); break;
    }
    return;
  }
  if (what == 12) {  // the call's own device
    std::visit([&](auto& call) { call.device = other_device(call.device); }, g.call);
    return;
  }
  if (what == 0) {  // presence
    if (v) v.reset();
    else if (!present_list.empty()) v = present(g, c.element(present_list));
    return;
  }
  if (!v) return;
  TensorView& t = *v;
  const int rank = std::clamp(t.rank, 0, kMaxRank);
  const int d = rank > 0 ? static_cast<int>(c.pick(0, rank - 1)) : 0;
  switch (what) {
    case 1: {
      static constexpr DType kAll[] = {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64};
      t.dtype = c.element(kAll);
      break;
    }
    case 2: t.device = other_device(t.device.value_or(device_of(g.call))); break;
    case 3: {  // rank, occasionally outside [0, kMaxRank]
      const int new_rank = static_cast<int>(c.pick(-1, kMaxRank + 1));
      for (int i = rank; i < std::clamp(new_rank, 0, kMaxRank); ++i) {
        t.shape[i] = 1;
        t.stride[i] = 1;
      }
      t.rank = new_rank;
      break;
    }
    case 4: if (rank > 0) t.shape[d] = interesting(c, t.shape[d]); break;
    case 5: if (rank > 0) t.stride[d] = interesting(c, t.stride[d]); break;
    case 6: t.storage_offset.count = interesting(c, t.storage_offset.count); break;
    case 7: {
      switch (c.pick(0, 3)) {
        case 0: t.address = 0; break;
        case 1: t.address = kMovedAddress + static_cast<std::uint64_t>(c.pick(0, 64)); break;
        case 2:
          if (!present_list.empty())
            t.address = present(g, c.element(present_list)).address;
          break;
        default: t.address = ~std::uint64_t{0} - static_cast<std::uint64_t>(c.pick(0, 4096)); break;
      }
      break;
    }
    case 8:
      if (c.coin()) t.storage_size.reset();
      else t.storage_size = Elements{interesting(c, t.storage_size.value_or(Elements{}).count)};
      break;
    case 9: {  // values
      if (!t.values || c.one_in(4)) {
        if (t.values) t.values.reset();
        else t.values = std::vector<i64>(static_cast<std::size_t>(std::clamp<i64>(t.numel(), 0, 64)), 0);
        break;
      }
      auto& vals = *t.values;
      if (vals.empty() || c.one_in(4)) vals.resize(static_cast<std::size_t>(c.pick(0, 16)), -1);
      else vals[static_cast<std::size_t>(c.pick(0, static_cast<i64>(vals.size()) - 1))] =
          interesting(c, 0);
      break;
    }
    default:  // 10: a shape and its stride together, staying row-major-ish
      if (rank > 0) {
        t.shape[d] = c.pick(0, 9);
        if (c.coin()) detach_compact(t);
      }
      break;
  }
}

}  // namespace kdaguard::support
