// The per-token f64 reference for the record-based speculative path: record_verify,
// replay_commit and accept_verify (contracts/NOTES.md). The verify half is reference.cpp's verify
// with the records written in place of the scratch states; the replay rebuilds a state from its
// records the way the verify built it, one rounding into the state's dtype per step.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kdaguard/lower.h"
#include "kdaguard/numeric.h"
#include "kdaguard/reference.h"
#include "token_head.h"

namespace kdaguard::reference {
namespace {

using detail::TokenHead;

std::int64_t record_offset(const RecordBuffer& r, std::int64_t row, std::int64_t step, int hv) {
  return row * r.row_stride + step * r.step_stride + hv * r.head_stride;
}

// g [K] | k [K] | u [V], each rounded once into f32.
void store_record(const RecordBuffer& r, std::int64_t row, std::int64_t step, int hv,
                  const TokenHead<double>& x, const std::vector<double>& u) {
  const std::int64_t base = record_offset(r, row, step, hv);
  const std::int64_t K = static_cast<std::int64_t>(x.k.size());
  for (std::int64_t i = 0; i < K; ++i) {
    numeric::store(r.data, DType::f32, base + i, x.g[i]);
    numeric::store(r.data, DType::f32, base + K + i, x.k[i]);
  }
  for (std::size_t i = 0; i < u.size(); ++i)
    numeric::store(r.data, DType::f32, base + 2 * K + static_cast<std::int64_t>(i), u[i]);
}

// One recorded step onto S: decay the columns by exp(g), add the rank-1 correction u k^T; then the
// state as its storage dtype reads it back, as the verify carried it.
void replay_step(std::vector<double>& S, const RecordBuffer& r, std::int64_t row,
                 std::int64_t step, int hv, int V, int K, DType state_dtype,
                 std::vector<double>& decay) {
  const std::int64_t base = record_offset(r, row, step, hv);
  for (int i = 0; i < K; ++i) decay[i] = std::exp(numeric::load(r.data, DType::f32, base + i));
  for (int v = 0; v < V; ++v) {
    const double u = numeric::load(r.data, DType::f32, base + 2 * K + v);
    double* state_row = S.data() + static_cast<std::size_t>(v) * K;
    for (int i = 0; i < K; ++i) {
      state_row[i] *= decay[i];
      state_row[i] += u * numeric::load(r.data, DType::f32, base + K + i);
    }
  }
  detail::round_state(state_dtype, S);
}

// Slot `slot`, head hv, with steps [0, count) of row `row` of the records replayed onto it.
void replay_head(const StatePool& state, std::int64_t slot, int hv, int V, int K,
                 const RecordBuffer& records, std::int64_t row, std::int64_t count,
                 std::vector<double>& S, std::vector<double>& decay) {
  detail::load_state(state, slot, hv, V, K, S);
  for (std::int64_t t = 0; t < count; ++t)
    replay_step(S, records, row, t, hv, V, K, state.dtype, decay);
}

void run_replay_commit(const ReplayCommitParams& p) {
  std::vector<double> S(static_cast<std::size_t>(p.V) * p.K), decay(p.K);
  for (std::int32_t n = 0; n < p.rows; ++n) {
    const std::int64_t slot = p.cache_indices[n], accepted = p.accepted[n];
    if (slot < 0 || accepted == 0) continue;  // padding, or nothing accepted: the slot stays
    for (int hv = 0; hv < p.HV; ++hv) {
      replay_head(p.state, slot, hv, p.V, p.K, p.records, n, accepted, S, decay);
      detail::store_state(p.state, slot, hv, p.V, p.K, S.data());
    }
  }
}

// The draft of row n, head hv, from the state S: outputs and records, S carried as stored.
void verify_head(const RecordVerifyParams& p, std::int32_t n, int hv, std::vector<double>& S,
                 TokenHead<double>& x, std::vector<double>& decay, std::vector<double>& o,
                 std::vector<double>& u) {
  const TokenInputs& in = p.in;
  const std::int64_t begin = p.cu_seqlens[n], end = p.cu_seqlens[n + 1];
  for (std::int64_t t = begin; t < end; ++t) {
    detail::load_token_head(in, t, hv, x);
    detail::step(S, x, decay, o.data(), u.data());
    detail::round_state(p.state.dtype, S);
    detail::store_output(p.out, in.io_dtype, t, hv, in.V, o.data());
    store_record(p.records, n, t - begin, hv, x, u);
  }
}

void zero_outputs(const RecordVerifyParams& p, std::int32_t n, int hv) {
  const std::vector<double> zeros(p.in.V, 0.0);
  for (std::int64_t t = p.cu_seqlens[n]; t < p.cu_seqlens[n + 1]; ++t)
    detail::store_output(p.out, p.in.io_dtype, t, hv, p.in.V, zeros.data());
}

// record_verify when prior is null; accept_verify otherwise (replay in place, then verify).
void run_record_verify(const RecordVerifyParams& p, const AcceptVerifyParams* prior) {
  const TokenInputs& in = p.in;
  TokenHead<double> x(in.K, in.V);
  std::vector<double> S(static_cast<std::size_t>(in.V) * in.K), decay(in.K), o(in.V), u(in.V);
  for (std::int32_t n = 0; n < p.rows; ++n) {
    const std::int64_t slot = p.cache_indices[n];
    for (int hv = 0; hv < in.HV; ++hv) {
      if (slot < 0) {  // padding row: zero outputs, no records, no state access
        zero_outputs(p, n, hv);
        continue;
      }
      const std::int64_t accepted = prior ? prior->prior_accepted[n] : 0;
      replay_head(p.state, slot, hv, in.V, in.K, prior ? prior->prior_records : RecordBuffer{},
                  n, accepted, S, decay);
      if (accepted > 0) detail::store_state(p.state, slot, hv, in.V, in.K, S.data());
      verify_head(p, n, hv, S, x, decay, o, u);
    }
  }
}

}  // namespace

Status record_verify(const RecordVerifyCall& call) {
  Status status = admit(call);
  if (status.ok()) run_record_verify(lower(call), nullptr);
  return status;
}

Status replay_commit(const ReplayCommitCall& call) {
  Status status = admit(call);
  if (status.ok()) run_replay_commit(lower(call));
  return status;
}

Status accept_verify(const AcceptVerifyCall& call) {
  Status status = admit(call);
  if (status.ok()) {
    const AcceptVerifyParams p = lower(call);
    run_record_verify(p.verify, &p);
  }
  return status;
}

}  // namespace kdaguard::reference
