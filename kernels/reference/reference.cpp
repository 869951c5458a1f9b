// The per-token f64 reference for decode, prefill, verify and commit (kda-math.md, "Per token").
#include "kdaguard/reference.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <variant>

#include "kdaguard/lower.h"
#include "kdaguard/numeric.h"
#include "prefill_io.h"
#include "token_head.h"

namespace kdaguard::reference {
namespace {

using detail::TokenHead;

// ------------------------------------------------------------------------------------------------
// Admission
// ------------------------------------------------------------------------------------------------

bool is_index_argument(Arg a) {
  switch (a) {
    case Arg::cache_indices:
    case Arg::cu_seqlens:
    case Arg::initial_state_indices:
    case Arg::scratch_row_map:
    case Arg::scratch_indices:
    case Arg::accepted:
    case Arg::prior_accepted: return true;
    default: return false;
  }
}

// The elements of an index view in row-major order, read from host memory. Only called on a
// view the meta rules accepted (dtype i32/i64, inside its allocation).
std::vector<std::int64_t> read_index_values(const TensorView& t) {
  std::vector<std::int64_t> values;
  const std::int64_t n = t.numel();
  if (n == 0) return values;
  values.reserve(static_cast<std::size_t>(n));
  const void* data = reinterpret_cast<const void*>(*t.data_address());
  std::array<std::int64_t, kMaxRank> index{};
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t offset = 0;
    for (int d = 0; d < t.rank; ++d) offset += index[d] * t.stride[d];
    values.push_back(numeric::load_index(data, t.dtype, offset));
    for (int d = t.rank - 1; d >= 0; --d) {  // row-major odometer
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
  return values;
}

template <class Call>
Status admit_call(const Call& call) {
  Verdict as_given = validate(call);
  if (!as_given.accepted()) return Status::refused(std::move(as_given));
  if (call.device.kind != Device::Kind::cpu)
    return Status::unsupported_because(
        fmt::format("the reference backend reads host memory; this call is on {}",
                    device_name(call.device)));
  Call from_memory = call;
  for_each_argument(from_memory, [](Arg a, OptionalView& view) {
    if (view && is_index_argument(a)) view->values = read_index_values(*view);
  });
  Verdict by_value = validate(from_memory);
  if (!by_value.accepted()) return Status::refused(std::move(by_value));
  return Status::success();
}

// ------------------------------------------------------------------------------------------------
// The recurrence
// ------------------------------------------------------------------------------------------------

}  // namespace

namespace detail {

// One token on one head's state S (V x K, row-major; row v is independent of the others):
// decay the columns, correct by the prediction error on the decayed state, read the output from
// the updated state. The prediction errors go to u when it is given (the records).
void step(std::vector<double>& S, const TokenHead<double>& x, std::vector<double>& decay,
          double* o, double* u_out) {
  const std::size_t K = x.k.size(), V = x.v.size();
  for (std::size_t i = 0; i < K; ++i) decay[i] = std::exp(x.g[i]);
  for (std::size_t r = 0; r < V; ++r) {
    double* row = S.data() + r * K;
    double predicted = 0;
    for (std::size_t i = 0; i < K; ++i) {
      row[i] *= decay[i];
      predicted += row[i] * x.k[i];
    }
    const double u = x.beta * (x.v[r] - predicted);
    if (u_out != nullptr) u_out[r] = u;
    double out = 0;
    for (std::size_t i = 0; i < K; ++i) {
      row[i] += u * x.k[i];
      out += row[i] * x.q[i];
    }
    o[r] = out;
  }
}

// The state as it reads back from its storage dtype.
void round_state(DType dtype, std::vector<double>& S) {
  for (double& e : S) e = numeric::round_to(dtype, e);
}

}  // namespace detail

namespace {

using detail::round_state;
using detail::step;

void run_decode(const DecodeParams& p) {
  const TokenInputs& in = p.in;
  TokenHead<double> x(in.K, in.V);
  std::vector<double> S(static_cast<std::size_t>(in.V) * in.K), decay(in.K), o(in.V);
  const std::vector<double> zeros(in.V, 0.0);
  for (std::int32_t b = 0; b < p.batch; ++b) {
    const std::int64_t slot = p.cache_indices[b];
    for (int hv = 0; hv < in.HV; ++hv) {
      if (slot < 0) {  // padding row
        detail::store_output(p.out, in.io_dtype, b, hv, in.V, zeros.data());
        continue;
      }
      detail::load_state(p.state, slot, hv, in.V, in.K, S);
      detail::load_token_head(in, b, hv, x);
      step(S, x, decay, o.data());
      detail::store_state(p.state, slot, hv, in.V, in.K, S.data());
      detail::store_output(p.out, in.io_dtype, b, hv, in.V, o.data());
    }
  }
}

PrefillValues empty_values(const PrefillParams& p) {
  PrefillValues r;
  r.total_tokens = p.total_tokens;
  r.num_seqs = p.num_seqs;
  r.HV = p.in.HV;
  r.V = p.in.V;
  r.K = p.in.K;
  r.out.assign(static_cast<std::size_t>(p.total_tokens) * p.in.HV * p.in.V, 0.0);
  r.final_state.assign(static_cast<std::size_t>(p.num_seqs) * p.in.HV * p.in.V * p.in.K, 0.0);
  return r;
}

PrefillValues run_prefill_values(const PrefillParams& p) {
  const TokenInputs& in = p.in;
  PrefillValues r = empty_values(p);
  const std::size_t VK = static_cast<std::size_t>(in.V) * in.K;
  TokenHead<double> x(in.K, in.V);
  std::vector<double> S(VK), decay(in.K);
  for (std::int32_t n = 0; n < p.num_seqs; ++n) {
    const std::int64_t begin = detail::seq_offset(p, n), end = detail::seq_offset(p, n + 1);
    for (int hv = 0; hv < in.HV; ++hv) {
      detail::load_state(p.state, p.state_indices[n], hv, in.V, in.K, S);
      for (std::int64_t t = begin; t < end; ++t) {
        detail::load_token_head(in, t, hv, x);
        step(S, x, decay, r.out.data() + (static_cast<std::size_t>(t) * in.HV + hv) * in.V);
      }
      std::copy(S.begin(), S.end(),
                r.final_state.begin() + (static_cast<std::size_t>(n) * in.HV + hv) * VK);
    }
  }
  return r;
}

void run_verify(const VerifyParams& p) {
  const TokenInputs& in = p.in;
  const ScratchTarget& target = p.target;
  TokenHead<double> x(in.K, in.V);
  std::vector<double> S(static_cast<std::size_t>(in.V) * in.K), decay(in.K), o(in.V);
  const std::vector<double> zeros(in.V, 0.0);
  for (std::int32_t n = 0; n < p.rows; ++n) {
    const std::int64_t begin = p.cu_seqlens[n], end = p.cu_seqlens[n + 1];
    const std::int64_t slot = p.cache_indices[n];
    for (int hv = 0; hv < in.HV; ++hv) {
      if (slot < 0) {  // padding row: zero outputs, no scratch
        for (std::int64_t t = begin; t < end; ++t)
          detail::store_output(p.out, in.io_dtype, t, hv, in.V, zeros.data());
        continue;
      }
      detail::load_state(p.state, slot, hv, in.V, in.K, S);
      for (std::int64_t t = begin; t < end; ++t) {
        const std::int64_t step_index = t - begin;
        detail::load_token_head(in, t, hv, x);
        step(S, x, decay, o.data());
        // Carried as stored, exactly what a decode of this token would read back next.
        round_state(p.state.dtype, S);
        detail::store_output(p.out, in.io_dtype, t, hv, in.V, o.data());
        const std::int64_t flat =
            target.scratch_indices
                ? target.scratch_indices[n * target.indices_row_stride + step_index]
                : n * target.scratch_steps + step_index;
        if (flat >= 0) detail::store_state(target.scratch, flat, hv, in.V, in.K, S.data());
      }
    }
  }
}

void run_commit(const CommitParams& p) {
  const ScratchTarget& source = p.source;
  const std::int64_t esize = element_size(p.state.dtype);
  const std::size_t slot_bytes =
      static_cast<std::size_t>(p.HV) * p.V * p.K * static_cast<std::size_t>(esize);
  for (std::int32_t n = 0; n < p.rows; ++n) {
    const std::int64_t slot = p.cache_indices[n];
    const std::int64_t accepted = p.accepted[n];
    if (slot < 0 || accepted == 0) continue;
    const std::int64_t last_step = accepted - 1;
    const std::int64_t flat = source.scratch_indices
                                  ? source.scratch_indices[n * source.indices_row_stride + last_step]
                                  : n * source.scratch_steps + last_step;
    const auto* from = static_cast<const unsigned char*>(source.scratch.data) +
                       flat * source.scratch.slot_stride * esize;
    auto* to = static_cast<unsigned char*>(p.state.data) + slot * p.state.slot_stride * esize;
    std::memcpy(to, from, slot_bytes);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Shared with the chunked form
// ------------------------------------------------------------------------------------------------

namespace detail {

PrefillValues prefill_shape(const PrefillParams& p) { return empty_values(p); }

void write_prefill(const PrefillParams& p, const PrefillValues& r) {
  const TokenInputs& in = p.in;
  const std::size_t VK = static_cast<std::size_t>(in.V) * in.K;
  for (std::int64_t t = 0; t < p.total_tokens; ++t)
    for (int hv = 0; hv < in.HV; ++hv)
      store_output(p.out, in.io_dtype, t, hv, in.V,
                   r.out.data() + (static_cast<std::size_t>(t) * in.HV + hv) * in.V);
  for (std::int32_t n = 0; n < p.num_seqs; ++n) {
    if (seq_offset(p, n + 1) == seq_offset(p, n)) continue;  // nothing ran: the slot stays as is
    for (int hv = 0; hv < in.HV; ++hv)
      store_state(p.state, p.state_indices[n], hv, in.V, in.K,
                  r.final_state.data() + (static_cast<std::size_t>(n) * in.HV + hv) * VK);
  }
}

}  // namespace detail

// ------------------------------------------------------------------------------------------------
// Public entry points
// ------------------------------------------------------------------------------------------------

Status admit(const DecodeCall& call) { return admit_call(call); }
Status admit(const PrefillCall& call) { return admit_call(call); }
Status admit(const VerifyCall& call) { return admit_call(call); }
Status admit(const CommitCall& call) { return admit_call(call); }
Status admit(const RecordVerifyCall& call) { return admit_call(call); }
Status admit(const ReplayCommitCall& call) { return admit_call(call); }
Status admit(const AcceptVerifyCall& call) { return admit_call(call); }

Status decode(const DecodeCall& call) {
  Status status = admit(call);
  if (status.ok()) run_decode(lower(call));
  return status;
}

PrefillResult prefill_values(const PrefillCall& call) {
  PrefillResult result{admit(call), {}};
  if (result.status.ok()) result.values = run_prefill_values(lower(call));
  return result;
}

Status prefill(const PrefillCall& call) {
  PrefillResult result = prefill_values(call);
  if (result.status.ok()) detail::write_prefill(lower(call), result.values);
  return std::move(result.status);
}

Status verify(const VerifyCall& call) {
  Status status = admit(call);
  if (status.ok()) run_verify(lower(call));
  return status;
}

Status commit(const CommitCall& call) {
  Status status = admit(call);
  if (status.ok()) run_commit(lower(call));
  return status;
}

Status run(const AnyCall& call) {
  return std::visit(
      [](const auto& c) -> Status {
        using Call = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<Call, DecodeCall>) return decode(c);
        else if constexpr (std::is_same_v<Call, PrefillCall>) return prefill(c);
        else if constexpr (std::is_same_v<Call, VerifyCall>) return verify(c);
        else return commit(c);
      },
      call);
}

Status run_catalogue(const CatalogueCall& call) {
  return std::visit(
      [](const auto& c) -> Status {
        using Call = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<Call, RecordVerifyCall>) return record_verify(c);
        else if constexpr (std::is_same_v<Call, ReplayCommitCall>) return replay_commit(c);
        else if constexpr (std::is_same_v<Call, AcceptVerifyCall>) return accept_verify(c);
        else return run(AnyCall(c));
      },
      call);
}

// ------------------------------------------------------------------------------------------------
// The error metric
// ------------------------------------------------------------------------------------------------

ErrorStats compare(std::span<const double> actual, std::span<const double> expected) {
  ErrorStats s;
  s.count = expected.size();
  if (actual.size() != expected.size()) {
    s.comparable = false;
    return s;
  }
  double diff_squares = 0, ref_squares = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (!std::isfinite(actual[i]) || !std::isfinite(expected[i])) {
      s.comparable = false;
      continue;
    }
    const double d = actual[i] - expected[i];
    diff_squares += d * d;
    ref_squares += expected[i] * expected[i];
    s.max_abs = std::max(s.max_abs, std::fabs(d));
  }
  if (diff_squares == 0) s.rms_ratio = 0;
  else if (ref_squares == 0) s.rms_ratio = INFINITY;
  else s.rms_ratio = std::sqrt(diff_squares / ref_squares);  // the 1/n of both rms cancels
  if (!s.comparable) {
    s.rms_ratio = NAN;
    s.max_abs = NAN;
  }
  return s;
}

std::string ErrorStats::to_string() const {
  if (!comparable)
    return fmt::format("not comparable ({} elements: length mismatch or a NaN/inf)", count);
  return fmt::format("rms ratio {:.3e}, max abs error {:.3e} over {} elements", rms_ratio,
                     max_abs, count);
}

}  // namespace kdaguard::reference
