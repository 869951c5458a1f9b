// Internal to the reference backend: reading one token of one value head from lowered params and
// turning it into what the recurrence consumes (normed and scaled q, normed k, v, activated gate
// g, beta), in a chosen arithmetic type; plus pool and output addressing.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kdaguard/numeric.h"
#include "kdaguard/params.h"

namespace kdaguard::reference::detail {

template <class Real>
struct TokenHead {
  std::vector<Real> q, k, g;  // [K]
  std::vector<Real> v;        // [V]
  Real beta = 0;

  TokenHead(int K, int V) : q(K), k(K), g(K), v(V) {}
};

inline double element(const TokenHeadRows& rows, DType dtype, std::int64_t token, int head,
                      int i) {
  return numeric::load(rows.data, dtype, token * rows.token_stride + head * rows.head_stride + i);
}

template <class Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}

template <class Real>
void l2_normalize(std::vector<Real>& x) {
  Real sum = 0;
  for (Real e : x) sum += e * e;
  const Real inv = Real(1) / std::sqrt(sum + Real(1e-6));
  for (Real& e : x) e *= inv;
}

// Fills x with token `token`, value head `hv` (q/k head hv / (HV / H)).
template <class Real>
void load_token_head(const TokenInputs& in, std::int64_t token, int hv, TokenHead<Real>& x) {
  const int head = hv / (in.HV / in.H);
  for (int i = 0; i < in.K; ++i) {
    x.q[i] = static_cast<Real>(element(in.q, in.io_dtype, token, head, i));
    x.k[i] = static_cast<Real>(element(in.k, in.io_dtype, token, head, i));
  }
  for (int i = 0; i < in.V; ++i)
    x.v[i] = static_cast<Real>(element(in.v, in.io_dtype, token, hv, i));
  if (in.use_qk_l2norm) {
    l2_normalize(x.q);
    l2_normalize(x.k);
  }
  const Real scale = static_cast<Real>(in.scale);
  for (Real& e : x.q) e *= scale;

  for (int i = 0; i < in.K; ++i) {
    const Real raw = static_cast<Real>(element(in.gate, in.gate_dtype, token, hv, i));
    if (in.gate_kind == GateKind::activated) {
      x.g[i] = raw;
      continue;
    }
    const Real gate_in = raw + (in.dt_bias ? static_cast<Real>(in.dt_bias[hv * in.K + i]) : Real(0));
    const Real rate = std::exp(static_cast<Real>(in.A_log[hv]));
    if (in.gate_kind == GateKind::softplus) {
      const Real softplus = gate_in > Real(20) ? gate_in : std::log1p(std::exp(gate_in));
      x.g[i] = -rate * softplus;
    } else {
      x.g[i] = static_cast<Real>(in.lower_bound) * sigmoid(rate * gate_in);
    }
  }

  const Real b = static_cast<Real>(numeric::load(in.beta.data, in.beta_dtype,
                                                 token * in.beta.token_stride + hv * in.beta.head_stride));
  x.beta = in.beta_kind == BetaKind::logits ? sigmoid(b) : b;
}

// Element offset of (slot, hv) in a pool: the start of that head's V x K matrix.
inline std::int64_t head_offset(const StatePool& pool, std::int64_t slot, int hv, int V, int K) {
  return slot * pool.slot_stride + static_cast<std::int64_t>(hv) * V * K;
}

inline void load_state(const StatePool& pool, std::int64_t slot, int hv, int V, int K,
                       std::vector<double>& S) {
  const std::int64_t base = head_offset(pool, slot, hv, V, K);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(V) * K; ++i)
    S[i] = numeric::load(pool.data, pool.dtype, base + i);
}

inline void store_state(const StatePool& pool, std::int64_t slot, int hv, int V, int K,
                        const double* S) {
  const std::int64_t base = head_offset(pool, slot, hv, V, K);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(V) * K; ++i)
    numeric::store(pool.data, pool.dtype, base + i, S[i]);
}

inline void store_output(const OutputRows& out, DType dtype, std::int64_t token, int hv, int V,
                         const double* o) {
  const std::int64_t base = token * out.token_stride + hv * out.head_stride;
  for (int i = 0; i < V; ++i) numeric::store(out.data, dtype, base + i, o[i]);
}

// The per-token recurrence on one head's V x K state (reference.cpp): u_out, when given, gets
// the V prediction errors u = beta (v - S k) on the decayed state.
void step(std::vector<double>& S, const TokenHead<double>& x, std::vector<double>& decay,
          double* o, double* u_out = nullptr);
// The state as it reads back from its storage dtype.
void round_state(DType dtype, std::vector<double>& S);

inline std::int64_t seq_offset(const PrefillParams& p, std::int64_t n) {
  return numeric::load_index(p.cu_seqlens, p.cu_seqlens_dtype, n);
}

}  // namespace kdaguard::reference::detail
