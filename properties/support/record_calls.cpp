#include "record_calls.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck.h>

#include <algorithm>
#include <stdexcept>

namespace kdaguard::support {

using i64 = std::int64_t;

Entry base_entry(Entry record_entry) {
  switch (record_entry) {
    case Entry::record_verify:
    case Entry::accept_verify: return Entry::verify;
    case Entry::replay_commit: return Entry::commit;
    default: throw std::logic_error(fmt::format("base_entry: {} is not a record-based entry point", static_cast<int>(record_entry)));
  }
}

RecordBufferPlan draw_record_buffer(i64 rows, i64 min_steps, Chooser& c) {
  RecordBufferPlan b;
  b.rows = rows + c.pick(0, 2);
  b.steps = min_steps + c.pick(0, 2);
  b.head_pad = c.pick(0, 1);
  b.step_pad = c.pick(0, 2);
  b.row_pad = c.pick(0, 2);
  b.view_offset = c.pick(0, 2);
  return b;
}

TensorView record_buffer_view(const RecordBufferPlan& b, const CallPlan& base, std::uint64_t address) {
  const i64 width = 2 * base.K + base.V;
  const i64 head = width + 4 * b.head_pad;
  const i64 step = base.HV * head + 4 * b.step_pad;
  const i64 row = b.steps * step + 4 * b.row_pad;
  TensorView t;
  t.dtype = DType::f32;
  t.rank = 4;
  t.shape = {b.rows, b.steps, base.HV, width};
  t.stride = {row, step, head, 1};
  t.address = (base.arena || base.distinct_addresses) ? address : 0;
  t.storage_offset = Elements{4 * b.view_offset};
  if (base.known_sizes) {
    i64 span = 0;
    bool empty = false;
    for (int d = 0; d < 4; ++d) {
      empty = empty || t.shape[d] <= 0;
      span += (std::max<i64>(t.shape[d], 1) - 1) * t.stride[d];
    }
    t.storage_size = Elements{t.storage_offset.count + (empty ? 0 : span + 1)};
  }
  if (base.explicit_device) t.device = base.device;
  return t;
}

namespace {

TensorView prior_accepted_view(const RecordPlan& p) {
  const CallPlan& base = p.base;
  TensorView t = TensorView::contiguous(DType::i32, {static_cast<i64>(p.prior_accepted.size())});
  t.address = (base.arena || base.distinct_addresses) ? kPriorAcceptedAddress : 0;
  t.storage_offset = Elements{4 * base.view_offset};
  if (base.known_sizes)
    t.storage_size = Elements{t.storage_offset.count + static_cast<i64>(p.prior_accepted.size())};
  if (base.explicit_device) t.device = base.device;
  if (p.prior_accepted_values) t.values = p.prior_accepted;
  return t;
}

template <class Record, class Verify> void copy_token_arguments(Record& r, const Verify& v) {
  r.q = v.q; r.k = v.k; r.v = v.v; r.a = v.a; r.g = v.g; r.A_log = v.A_log;
  r.dt_bias = v.dt_bias; r.b = v.b; r.beta = v.beta; r.cu_seqlens = v.cu_seqlens;
  r.state = v.state; r.cache_indices = v.cache_indices; r.out = v.out;
}

}  // namespace

RecordPlan draw_record_plan(Entry e, const PlanNeeds& needs, Chooser& c) {
  RecordPlan p;
  p.entry = e;
  p.base = draw_plan(base_entry(e), needs, c);
  const i64 n = p.base.rows();
  p.records = draw_record_buffer(n, p.base.T, c);
  if (e == Entry::accept_verify) {
    p.prior = draw_record_buffer(n, 1, c);  // the previous step's T_alloc, unrelated to this T
    p.prior_accepted.resize(static_cast<std::size_t>(n));
    for (auto& a : p.prior_accepted) a = c.pick(0, p.prior.steps);
    p.prior_accepted_values = needs.index_values || !c.one_in(3);
  }
  return p;
}

CatalogueCall derive_record_call(const RecordPlan& p, const AnyCall& base) {
  const TensorView records = record_buffer_view(p.records, p.base, kRecordsAddress);
  switch (p.entry) {
    case Entry::record_verify: {
      const auto& v = std::get<VerifyCall>(base);
      RecordVerifyCall r;
      r.device = v.device;
      copy_token_arguments(r, v);
      r.records = records;
      r.scalars = v.scalars;
      return r;
    }
    case Entry::accept_verify: {
      const auto& v = std::get<VerifyCall>(base);
      AcceptVerifyCall r;
      r.device = v.device;
      copy_token_arguments(r, v);
      r.prior_records = record_buffer_view(p.prior, p.base, kPriorRecordsAddress);
      r.prior_accepted = prior_accepted_view(p);
      r.records = records;
      r.scalars = v.scalars;
      return r;
    }
    case Entry::replay_commit: {
      const auto& c = std::get<CommitCall>(base);
      ReplayCommitCall r;
      r.device = c.device;
      r.records = records;
      r.state = c.state;
      r.cache_indices = c.cache_indices;
      r.accepted = c.accepted;
      r.cu_seqlens = c.cu_seqlens;
      r.scalars = c.scalars;
      return r;
    }
    default: throw std::logic_error("derive_record_call: not a record-based entry point");
  }
}

GeneratedRecordCall generate_record_call(Entry e, const PlanNeeds& needs, Chooser& choose) {
  GeneratedRecordCall g;
  g.plan = draw_record_plan(e, needs, choose);
  g.base = GeneratedCall{g.plan.base, build_call(g.plan.base), {}};
  g.call = derive_record_call(g.plan, g.base.call);
  return g;
}

rc::Gen<GeneratedRecordCall> gen_record_call(Entry e, PlanNeeds needs) {
  return rc::gen::exec([e, needs] {
    RapidCheckChooser choose;
    return generate_record_call(e, needs, choose);
  });
}

rc::Gen<Entry> gen_record_entry(std::uint8_t entry_mask) {
  std::vector<Entry> entries;
  for (Entry e : {Entry::record_verify, Entry::replay_commit, Entry::accept_verify})
    if ((entry_mask >> static_cast<int>(e)) & 1u) entries.push_back(e);
  if (entries.empty()) throw std::logic_error("gen_record_entry: no record-based entry point");
  return rc::gen::map(rc::gen::inRange<std::size_t>(0, entries.size()),
                      [entries](std::size_t i) { return entries[i]; });
}

std::ostream& operator<<(std::ostream& os, const RecordPlan& p) {
  auto buffer = [](const RecordBufferPlan& b) {
    return fmt::format("[{} rows, {} steps, pads {}/{}/{}, offset {}]", b.rows, b.steps, b.head_pad,
                       b.step_pad, b.row_pad, b.view_offset);
  };
  os << entry_name(p.entry) << " records " << buffer(p.records);
  if (p.entry == Entry::accept_verify)
    os << " prior_records " << buffer(p.prior)
       << fmt::format(" prior_accepted {}{}", p.prior_accepted,
                      p.prior_accepted_values ? "" : " (no host values)");
  return os << "\nover " << p.base;
}

std::ostream& operator<<(std::ostream& os, const GeneratedRecordCall& g) {
  return os << g.plan << "\n" << describe_catalogue_call(g.call);
}

}  // namespace kdaguard::support
