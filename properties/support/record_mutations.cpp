#include "record_mutations.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "view_edits.h"

namespace kdaguard::support {

using i64 = std::int64_t;

namespace {

using namespace entry_masks;
using namespace view_edits;

Entry entry(const GeneratedRecordCall& g) { return g.plan.entry; }

// records, or for accept_verify sometimes prior_records.
Arg some_record_buffer(const GeneratedRecordCall& g, Chooser& c) {
  return entry(g) == Entry::accept_verify && c.coin() ? Arg::prior_records : Arg::records;
}

// ---- arg.* on the record call's own arguments ------------------------------------------------

void drop_required(GeneratedRecordCall& g, Chooser& c) {
  std::vector<Arg> candidates;
  switch (entry(g)) {
    case Entry::record_verify:
      candidates = {Arg::q, Arg::k, Arg::v, Arg::cu_seqlens, Arg::state, Arg::cache_indices,
                    Arg::records, Arg::out};
      break;
    case Entry::replay_commit:
      candidates = {Arg::records, Arg::state, Arg::cache_indices, Arg::accepted};
      break;
    default:
      candidates = {Arg::q, Arg::k, Arg::v, Arg::cu_seqlens, Arg::state, Arg::cache_indices,
                    Arg::prior_records, Arg::prior_accepted, Arg::records, Arg::out};
  }
  const Arg a = c.element(std::span<const Arg>(candidates));
  slot(g, a).reset();
  expect(g, "{} {} is required and absent", entry_name(entry(g)), arg_name(a));
}

void records_rank_three(GeneratedRecordCall& g, Chooser& c) {
  const Arg a = some_record_buffer(g, c);
  TensorView& t = present(g, a);
  t.rank = 3;  // [S_rec, T_alloc, HV * (2K+V)], compact
  t.shape[2] *= t.shape[3];
  detach_compact(t);
  expect(g, "{} must have 4 dimensions; got 3 (shape {})", arg_name(a), shape_text(t));
}

void records_wrong_size(GeneratedRecordCall& g, Chooser& c) {
  const Arg a = some_record_buffer(g, c);
  TensorView& t = present(g, a);
  const bool heads = c.coin();
  const int d = heads ? 2 : 3;
  const i64 want = t.shape[d];
  t.shape[d] = heads ? want + c.pick(1, 2) : 2 * g.plan.base.K;  // 2K+V without its u
  detach_compact(t);
  expect(g, "{} dim {} must be {} = {}; got {} (shape {})", arg_name(a), d, heads ? "HV" : "2K+V",
         want, t.shape[d], shape_text(t));
}

void records_other_dtype(GeneratedRecordCall& g, Chooser& c) {
  static constexpr DType kOther[] = {DType::bf16, DType::f16, DType::i32};
  const Arg a = some_record_buffer(g, c);
  TensorView& t = present(g, a);
  t.dtype = c.element(kOther);
  detach_compact(t);
  expect(g, "{} has dtype {}; expected f32", arg_name(a), dtype_name(t.dtype));
}

void prior_accepted_i64(GeneratedRecordCall& g, Chooser&) {
  TensorView& t = present(g, Arg::prior_accepted);
  t.dtype = DType::i64;
  detach_compact(t);
  expect(g, "prior_accepted has dtype i64; expected i32");
}

void records_every_other_element(GeneratedRecordCall& g, Chooser& c) {
  const Arg a = some_record_buffer(g, c);
  TensorView& t = present(g, a);
  detach_compact(t);
  for (int d = 0; d < t.rank; ++d) t.stride[d] *= 2;
  expect(g, "`{}` must be contiguous in the last dim.: its last stride is 2 (strides {})",
         arg_name(a), stride_text(t));
}

// Value heads of the written records on one address (HV >= 2: PlanNeeds).
void records_heads_share_memory(GeneratedRecordCall& g, Chooser&) {
  TensorView& t = present(g, Arg::records);
  t.stride[2] = 0;
  expect(g, "output records maps two elements to one address: shape {}, strides {}", shape_text(t),
         stride_text(t));
}

void records_misaligned(GeneratedRecordCall& g, Chooser& c) {
  const Arg a = some_record_buffer(g, c);
  TensorView& t = present(g, a);
  t.address = 0;
  t.storage_size.reset();
  t.storage_offset = Elements{c.pick(1, 3)};
  expect(g, "{} data address {:#x} is not 16-byte aligned (address {:#x} + storage_offset {} x 4 "
         "bytes)", arg_name(a), data_address(t), t.address, t.storage_offset.count);
}

// ---- alias.overlap -----------------------------------------------------------------------------

// The records on the state pool's bytes: records is an output of the verifying entry points,
// state one of replay_commit and accept_verify (reported on the first output of the pair).
void records_over_state(GeneratedRecordCall& g, Chooser&) {
  TensorView& state = present(g, Arg::state);
  if (state.address == 0) state.address = kMovedAddress;
  TensorView& records = present(g, Arg::records);
  records.address = state.address;
  records.storage_offset = Elements{state.storage_offset.count * element_size(state.dtype) / 4};
  records.storage_size.reset();
  if (entry(g) == Entry::record_verify)
    expect(g, "output records bytes {} overlap state bytes {}", byte_range_text(records),
           byte_range_text(state));
  else
    expect(g, "output state bytes {} overlap records bytes {}", byte_range_text(state),
           byte_range_text(records));
}

void prior_records_over_records(GeneratedRecordCall& g, Chooser&) {
  TensorView& records = present(g, Arg::records);
  if (records.address == 0) records.address = kRecordsAddress;
  TensorView& prior = present(g, Arg::prior_records);
  prior.address = records.address;
  prior.storage_offset = records.storage_offset;
  prior.storage_size.reset();
  expect(g, "output records bytes {} overlap prior_records bytes {}", byte_range_text(records),
         byte_range_text(prior));
}

// ---- state.* on the pool (the record calls have no scratch) -------------------------------------

Pool state_pool(GeneratedRecordCall& g) { return {present(g, Arg::state), 1, "state"}; }
void pool_heads_padded(GeneratedRecordCall& g, Chooser& c) {
  pad_pool_heads(state_pool(g), c, g.message_texts);
}
void slot_stride_unaligned(GeneratedRecordCall& g, Chooser& c) {
  misalign_slot_stride(state_pool(g), c, g.message_texts);
}
void pool_base_unaligned(GeneratedRecordCall& g, Chooser& c) {
  misalign_pool_base(state_pool(g), c, g.message_texts);
}
void slot_stride_too_small(GeneratedRecordCall& g, Chooser& c) {
  overlap_pool_slots(state_pool(g), c, g.message_texts);
}

// ---- the record rules ---------------------------------------------------------------------------

// records.steps: more draft tokens than the records hold, by a larger T or a shorter buffer.
void more_steps_than_records(GeneratedRecordCall& g, Chooser& c) {
  TensorView& t = present(g, Arg::records);
  auto& T = scalars_of(g.call).draft_token_num;
  if (*T >= 2 && c.coin()) {
    t.shape[1] = *T - c.pick(1, *T - 1);
  } else {
    T = t.shape[1] + c.pick(1, 3);
  }
  expect(g, "records holds {} steps (T_alloc); the call has T = {} draft tokens", t.shape[1], *T);
}

// records.rows: a record buffer with fewer rows than the call (N >= 1: PlanNeeds).
void fewer_record_rows(GeneratedRecordCall& g, Chooser& c) {
  const Arg a = some_record_buffer(g, c);
  TensorView& t = present(g, a);
  const i64 n = g.plan.base.rows();
  t.shape[0] = n - c.pick(1, n);
  expect(g, "{} has {} rows (S_rec); the call has N = {} rows", arg_name(a), t.shape[0], n);
}

// accept.prior_accepted: a count past the prior records' steps or negative (N >= 1: PlanNeeds).
void prior_accepted_out_of_range(GeneratedRecordCall& g, Chooser& c) {
  TensorView& t = present(g, Arg::prior_accepted);
  const i64 r = c.pick(0, g.plan.base.rows() - 1);
  const i64 steps = g.plan.prior.steps;
  const i64 a = c.coin() ? steps + c.pick(1, 3) : -c.pick(1, 3);
  (*t.values)[static_cast<std::size_t>(r)] = a;
  g.plan.prior_accepted[static_cast<std::size_t>(r)] = a;
  expect(g, "prior_accepted[{}] = {} is outside [0, T_alloc of prior_records = {}]", r, a, steps);
}

// ---- the table ----------------------------------------------------------------------------------

PlanNeeds rows(int n) { return PlanNeeds{.min_rows = n}; }
PlanNeeds with_values(PlanNeeds n) {
  n.index_values = true;
  return n;
}

const Mutation* base_mutation(RuleId rule, std::string_view name) {
  for (const Mutation* m : mutations_for(rule))
    if (m->name == name) return m;
  throw std::logic_error(fmt::format("record mutations: no mutation \"{}\" of {}", name, rule_id(rule)));
}

std::vector<RecordMutation> make_table() {
  using R = RuleId;
  const PlanNeeds none{};
  // A gen_calls mutation on the base call, for the record entry points in `mask`.
  auto shared = [](R rule, std::string_view name, std::uint8_t mask) {
    const Mutation* m = base_mutation(rule, name);
    return RecordMutation{rule, m->name, mask, m->exclusive, m->needs, nullptr, m};
  };
  return {
      {R::arg_missing, "drop a required argument of a record call", kRYF, true, none, drop_required},
      shared(R::arg_missing, "drop both forms of the gate or of beta", kRF),
      shared(R::arg_exclusive, "give b and beta", kRF),
      shared(R::arg_exclusive, "give a and g", kRF),
      {R::arg_rank, "a record buffer with 3 dims", kRYF, true, none, records_rank_three},
      shared(R::arg_rank, "b/beta with a third dim", kRF),
      shared(R::arg_rank, "cache_indices with a second dim", kY),
      {R::arg_shape, "a record buffer with a wrong HV or 2K+V", kRYF, true, none, records_wrong_size},
      shared(R::arg_shape, "out or k with a wrong size", kRF),
      shared(R::arg_shape, "cu_seqlens one entry too long", kY),
      {R::arg_dtype, "a record buffer not in f32", kRYF, true, none, records_other_dtype},
      {R::arg_dtype, "prior_accepted in i64", kF, true, none, prior_accepted_i64},
      shared(R::arg_dtype, "out in another dtype than q", kRF),
      shared(R::arg_dtype, "an index map in i64", kRYF),
      {R::arg_device, "one argument of a record call on another device", kRYF, true, none,
       other_device_argument},
      {R::arg_last_dim_contiguous, "a record buffer with last stride 2", kRYF, true, none,
       records_every_other_element},
      shared(R::arg_last_dim_contiguous, "q with last stride 2", kRF),
      shared(R::arg_last_dim_contiguous, "an index map with stride 2", kY),
      {R::arg_stride, "a negative stride in a record call", kRYF, true, none, negative_stride},
      {R::arg_stride, "records heads share memory", kRF, true,
       PlanNeeds{.min_rows = 1, .min_heads_ratio = 2},
       records_heads_share_memory},
      shared(R::arg_stride, "out heads share memory", kRF),
      {R::arg_extent, "storage one element short in a record call", kRYF, true, none,
       storage_one_short},
      {R::arg_extent, "storage offset near INT64_MAX in a record call", kRYF, false, none,
       offset_overflows},
      {R::arg_alignment, "a record buffer not 16-byte aligned", kRYF, true, none, records_misaligned},
      shared(R::arg_alignment, "q not 16-byte aligned", kRF),
      shared(R::arg_alignment, "an index map at an odd address", kY),
      {R::alias_overlap, "records on the state pool", kRYF, true, rows(1), records_over_state},
      {R::alias_overlap, "prior_records on records", kF, true, rows(1), prior_records_over_records},
      shared(R::alias_overlap, "v aliases out", kRF),
      shared(R::alias_overlap, "cache_indices inside the state pool", kY | kF),
      shared(R::dims_heads, "HV not a multiple of H", kRF),
      shared(R::dims_head_dim, "K or V outside {64, 128}", kRF),
      shared(R::scalar_scale, "scale zero, negative or not finite", kRF),
      shared(R::scalar_lower_bound, "lower_bound >= 0 or not finite", kRF),
      shared(R::gate_params, "raw gate without A_log", kRF),
      shared(R::gate_params, "lower_bound with an activated g", kRF),
      shared(R::gate_cover_tokens, "gate or beta shorter than q", kRF),
      shared(R::state_rank, "a 3-D pool", kRYF),
      {R::state_inner_strides, "state with padded or transposed inner dims", kRYF, true, none,
       pool_heads_padded},
      {R::state_slot_stride_align, "state slot stride not a multiple of 16", kRYF, true, none,
       slot_stride_unaligned},
      {R::state_base_align, "state base 16 bytes off", kRYF, true, none, pool_base_unaligned},
      {R::state_slot_stride_min, "state slots overlap", kRYF, true, none, slot_stride_too_small},
      shared(R::state_empty, "a pool of 0 slots", kRYF),
      shared(R::index_length, "slot map one entry short", kRYF),
      shared(R::index_range, "a slot past the pool", kRYF),
      shared(R::index_unique, "two rows share a slot", kRYF),
      shared(R::seqlens_start, "cu_seqlens[0] != 0", kRYF),
      shared(R::seqlens_monotone, "cu_seqlens decreases", kRYF),
      shared(R::seqlens_total, "cu_seqlens[N] != T_tot", kRF),
      shared(R::verify_draft_tokens, "draft_token_num absent", kRYF),
      shared(R::verify_draft_tokens, "draft_token_num < 1", kRYF),
      shared(R::verify_row_length, "a row longer than T", kRYF),
      shared(R::commit_accepted, "accepted outside [0, T]", kY),
      {R::records_steps, "T > T_alloc of records", kRYF, true, none, more_steps_than_records},
      {R::records_rows, "a record buffer with fewer rows than N", kRYF, true, rows(1),
       fewer_record_rows},
      {R::accept_prior_accepted, "prior_accepted outside [0, T_alloc of prior_records]", kF, true,
       with_values(rows(1)), prior_accepted_out_of_range},
  };
}

// The base call edited by a gen_calls mutation, and the record call derived from it again.
void apply_to_base(GeneratedRecordCall& g, const Mutation& m, Chooser& c) {
  m.apply(g.base, c);
  g.plan.base = g.base.plan;
  g.call = derive_record_call(g.plan, g.base.call);
  g.message_texts = g.base.message_texts;
}

// An interesting integer near or far from `current` (random_record_edit).
i64 nearby(Chooser& c, i64 current) {
  static constexpr i64 kValues[] = {0, 1, -1, 2, 4, 16, 64, 384, std::int64_t{1} << 31,
                                    std::int64_t{1} << 62, std::numeric_limits<i64>::max(),
                                    std::numeric_limits<i64>::min()};
  const auto u = static_cast<std::uint64_t>(current);
  switch (c.pick(0, 3)) {
    case 0: return static_cast<i64>(u + 1);
    case 1: return static_cast<i64>(u - 1);
    case 2: return c.pick(-8, 64);
    default: return c.element(kValues);
  }
}

}  // namespace

std::span<const RecordMutation> record_mutation_table() {
  static const std::vector<RecordMutation> table = make_table();
  return table;
}

std::vector<const RecordMutation*> record_mutations_for(RuleId rule) {
  std::vector<const RecordMutation*> found;
  for (const RecordMutation& m : record_mutation_table())
    if (m.rule == rule) found.push_back(&m);
  return found;
}

GeneratedRecordCall mutated_record_call(const RecordMutation& m, Entry e, Chooser& choose) {
  GeneratedRecordCall g = generate_record_call(e, m.needs, choose);
  if (m.base != nullptr) apply_to_base(g, *m.base, choose);
  else m.apply(g, choose);
  return g;
}

void random_record_edit(GeneratedRecordCall& g, Chooser& c) {
  std::vector<Arg> record_args;
  for (Arg a : {Arg::records, Arg::prior_records, Arg::prior_accepted})
    if (find_argument(g.call, a) != nullptr) record_args.push_back(a);
  if (c.coin()) {
    // An edit of a shared argument: on the base call, keeping the record call's own slots.
    random_edit(g.base, c);
    CatalogueCall again = derive_record_call(g.plan, g.base.call);
    for (Arg a : record_args) *find_argument(again, a) = *find_argument(g.call, a);
    g.call = std::move(again);
    return;
  }
  OptionalView& v = slot(g, c.element(std::span<const Arg>(record_args)));
  if (!v) return;
  TensorView& t = *v;
  const int rank = std::clamp(t.rank, 0, kMaxRank);
  const int d = rank > 0 ? static_cast<int>(c.pick(0, rank - 1)) : 0;
  switch (c.pick(0, 8)) {
    case 0: v.reset(); break;
    case 1: {
      static constexpr DType kAll[] = {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64};
      t.dtype = c.element(kAll);
      break;
    }
    case 2: t.rank = static_cast<int>(c.pick(-1, kMaxRank + 1)); break;
    case 3: if (rank > 0) t.shape[d] = nearby(c, t.shape[d]); break;
    case 4: if (rank > 0) t.stride[d] = nearby(c, t.stride[d]); break;
    case 5: t.storage_offset.count = nearby(c, t.storage_offset.count); break;
    case 6: t.address = c.coin() ? 0 : kMovedAddress + static_cast<std::uint64_t>(c.pick(0, 64)); break;
    case 7:
      if (c.coin()) t.storage_size.reset();
      else t.storage_size = Elements{nearby(c, t.storage_size.value_or(Elements{}).count)};
      break;
    default:
      if (t.values && !t.values->empty())
        (*t.values)[static_cast<std::size_t>(c.pick(0, static_cast<i64>(t.values->size()) - 1))] =
            nearby(c, 0);
      else if (t.values) t.values.reset();
      break;
  }
}

}  // namespace kdaguard::support
