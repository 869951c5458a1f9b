#include "record_problem.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "kdaguard/numeric.h"

namespace kdaguard::support {

using i64 = std::int64_t;

namespace {

// Calls f(element offset from the view's data address) for every element, row-major.
template <class F> void for_each_offset(const TensorView& t, F&& f) {
  const i64 n = t.numel();
  std::array<i64, kMaxRank> index{};
  for (i64 i = 0; i < n; ++i) {
    i64 offset = 0;
    for (int d = 0; d < t.rank; ++d) offset += index[d] * t.stride[d];
    f(offset);
    for (int d = t.rank - 1; d >= 0; --d) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
}

void* data_of(const TensorView& t) { return reinterpret_cast<void*>(*t.data_address()); }

template <class Record, class Verify> void copy_token_arguments(Record& r, const Verify& v) {
  r.device = v.device;
  r.q = v.q; r.k = v.k; r.v = v.v; r.a = v.a; r.g = v.g; r.A_log = v.A_log;
  r.dt_bias = v.dt_bias; r.b = v.b; r.beta = v.beta; r.cu_seqlens = v.cu_seqlens;
  r.state = v.state; r.cache_indices = v.cache_indices; r.out = v.out;
  r.scalars = v.scalars;
}

}  // namespace

AcceptVerifyCall accept_verify_call(const RecordVerifyCall& draft, const TensorView& prior_records,
                                    const TensorView& prior_accepted) {
  AcceptVerifyCall f;
  copy_token_arguments(f, draft);
  f.records = draft.records;
  f.prior_records = prior_records;
  f.prior_accepted = prior_accepted;
  return f;
}

TensorView add_record_buffer(HostProblem& host, std::string name, const TensorView& like) {
  i64 span = 0;
  for (int d = 0; d < 4; ++d) span += (std::max<i64>(like.shape[d], 1) - 1) * like.stride[d];
  const i64 elements = like.storage_offset.count + (like.numel() == 0 ? 1 : span + 1);
  host.allocations.emplace_back(std::move(name), static_cast<std::size_t>(elements) * 4);
  Allocation& a = host.allocations.back();
  a.args.push_back(Arg::records);
  TensorView t = like;
  t.address = a.address();
  t.storage_size = Elements{elements};
  t.device = std::nullopt;
  t.values.reset();
  return t;
}

TensorView add_index(HostProblem& host, std::string name, const std::vector<i64>& values) {
  host.allocations.emplace_back(std::move(name), std::max<std::size_t>(values.size(), 1) * 4);
  const Allocation& a = host.allocations.back();
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto v = static_cast<std::int32_t>(values[i]);
    std::memcpy(a.data() + i * 4, &v, 4);
  }
  TensorView t = TensorView::contiguous(DType::i32, {static_cast<i64>(values.size())});
  t.address = a.address();
  t.storage_size = Elements{static_cast<i64>(std::max<std::size_t>(values.size(), 1))};
  t.values = values;
  return t;
}

RecordProblem materialize_records(const CallPlan& spec, std::uint64_t seed,
                                  const RecordBufferPlan& records) {
  if (spec.entry != Entry::verify && spec.entry != Entry::commit)
    throw std::logic_error("materialize_records: a verify or commit plan");
  if (records.rows < spec.rows() || records.steps < spec.T)
    throw std::logic_error("materialize_records: fewer record rows or steps than the plan's");
  RecordProblem p{materialize(spec, seed), {}};
  p.records = add_record_buffer(p.host, "records", record_buffer_view(records, spec, 0));
  p.poison_records();
  return p;
}

RecordBufferPlan compact_records(const CallPlan& spec) {
  RecordBufferPlan compact;
  compact.rows = spec.rows();
  compact.steps = spec.T;
  return compact;
}

RecordProblem materialize_records(const CallPlan& spec, std::uint64_t seed) {
  return materialize_records(spec, seed, compact_records(spec));
}

RecordVerifyCall RecordProblem::record_verify() const {
  RecordVerifyCall c;
  copy_token_arguments(c, *host.verify);
  c.records = records;
  return c;
}

ReplayCommitCall RecordProblem::replay_commit() const {
  if (!host.commit) throw std::logic_error("replay_commit: not a commit problem");
  const CommitCall& commit = *host.commit;
  ReplayCommitCall c;
  c.device = commit.device;
  c.records = records;
  c.state = commit.state;
  c.cache_indices = commit.cache_indices;
  c.accepted = commit.accepted;
  c.cu_seqlens = commit.cu_seqlens;
  c.scalars = commit.scalars;
  return c;
}

TensorView record_at(const TensorView& records, i64 n, i64 t) {
  TensorView r = records;
  r.rank = 2;
  r.shape = {records.shape[2], records.shape[3]};
  r.stride = {records.stride[2], 1};
  r.storage_offset = Elements{records.storage_offset.count + n * records.stride[0] +
                              t * records.stride[1]};
  return r;
}

std::vector<TensorView> RecordProblem::record_verify_writes() const {
  std::vector<TensorView> writes{*host.verify->out};
  const CallPlan& s = host.plan;
  for (i64 n = 0; n < s.rows(); ++n)
    for (i64 t = 0; s.slot_of_row[n] >= 0 && t < s.row_lengths[n]; ++t) writes.push_back(record_at(records, n, t));
  return writes;
}

std::vector<TensorView> RecordProblem::replay_commit_writes() const {
  std::vector<TensorView> writes;
  const CallPlan& s = host.plan;
  for (i64 n = 0; n < s.rows(); ++n)
    if (s.slot_of_row[n] >= 0 && s.accepted[n] > 0)
      writes.push_back(slice_rows(*host.commit->state, s.slot_of_row[n], 1));
  return writes;
}

void RecordProblem::poison_records() {
  const Allocation* a = host.allocation_of(records);
  std::memset(a->data(), 0xff, a->bytes());  // every f32 a NaN
}

std::optional<std::string> changed_outside(const HostProblem& host, const Snapshot& before,
                                           std::span<const TensorView> writable) {
  std::vector<std::vector<bool>> mask(host.allocations.size());
  for (std::size_t i = 0; i < host.allocations.size(); ++i)
    mask[i].assign(host.allocations[i].bytes(), false);
  for (const TensorView& v : writable) {
    const Allocation* a = host.allocation_of(v);
    if (a == nullptr) throw std::logic_error("changed_outside: a view outside the problem");
    const auto index = static_cast<std::size_t>(a - host.allocations.data());
    const i64 es = element_size(v.dtype);
    const i64 base = static_cast<i64>(*v.data_address() - a->address());
    for_each_offset(v, [&](i64 offset) {
      for (i64 b = 0; b < es; ++b) mask[index][static_cast<std::size_t>(base + offset * es + b)] = true;
    });
  }
  for (std::size_t i = 0; i < host.allocations.size(); ++i) {
    const std::byte* now = host.allocations[i].data();
    for (std::size_t b = 0; b < host.allocations[i].bytes(); ++b)
      if (!mask[i][b] && now[b] != before.bytes[i][b])
        return fmt::format("byte {} of {} changed outside the call's outputs", b,
                           host.allocations[i].name());
  }
  return std::nullopt;
}

std::optional<std::string> still_poisoned(std::span<const TensorView> views) {
  for (const TensorView& v : views) {
    std::optional<std::string> found;
    for_each_offset(v, [&](i64 offset) {
      if (!found && std::isnan(numeric::load(data_of(v), v.dtype, offset)))
        found = fmt::format("a written element at offset {} of a {} view still holds NaN", offset,
                            dtype_name(v.dtype));
    });
    if (found) return found;
  }
  return std::nullopt;
}

void poison(std::span<const TensorView> views) {
  for (const TensorView& v : views)
    for_each_offset(v, [&](i64 offset) {
      numeric::store(data_of(v), v.dtype, offset, std::numeric_limits<double>::quiet_NaN());
    });
}

}  // namespace kdaguard::support
