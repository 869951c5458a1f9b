// Issue 3: the reference against a second, deliberately literal transcription of kda-math.md's
// per-token steps, written here from scratch on whole tensors read back through their views: GVA
// head mapping, L2 norm, scale, both gate forms, beta logits, decay, delta correction, output.
// The chunked form and verify are checked against the reference elsewhere; this is what checks
// the reference itself.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gen_problem.h"
#include "kdaguard/numeric.h"
#include "kdaguard/reference.h"
#include "problem.h"

namespace kdaguard {
namespace {

using support::HostProblem;
using support::CallPlan;
using support::read_floats;

struct Tensors {
  std::vector<double> q, k, v, gate, A_log, dt_bias, beta, state;
};

template <class Call>
Tensors read_inputs(const Call& c) {
  Tensors t;
  t.q = read_floats(*c.q);
  t.k = read_floats(*c.k);
  t.v = read_floats(*c.v);
  t.gate = read_floats(c.a ? *c.a : *c.g);
  if (c.A_log) t.A_log = read_floats(*c.A_log);
  if (c.dt_bias) t.dt_bias = read_floats(*c.dt_bias);
  t.beta = read_floats(c.b ? *c.b : *c.beta);
  return t;
}

// One token of kda-math.md on the state S of value head hv (V x K, row-major), literally.
std::vector<double> textbook_token(const CallPlan& s, const Tensors& in, std::int64_t t, int hv,
                                   std::vector<double>& S) {
  const int K = s.K, V = s.V;
  const int h = hv / (s.HV / s.H);  // consecutive value heads share a q/k head
  std::vector<double> q(in.q.begin() + (t * s.H + h) * K, in.q.begin() + (t * s.H + h + 1) * K);
  std::vector<double> k(in.k.begin() + (t * s.H + h) * K, in.k.begin() + (t * s.H + h + 1) * K);
  const double* v = &in.v[(t * s.HV + hv) * V];

  // 1. optional L2 norm; 2. scale q.
  if (s.use_qk_l2norm) {
    for (std::vector<double>* x : {&q, &k}) {
      double sum = 0;
      for (double e : *x) sum += e * e;
      for (double& e : *x) e = e / std::sqrt(sum + 1e-6);
    }
  }
  const double scale = s.scale ? *s.scale : 1.0 / std::sqrt(static_cast<double>(K));
  for (double& e : q) e *= scale;

  // Gate and beta.
  std::vector<double> g(K);
  for (int i = 0; i < K; ++i) {
    const double raw = in.gate[(t * s.HV + hv) * K + i];
    if (s.gate_kind() == GateKind::activated) {
      g[i] = raw;
      continue;
    }
    const double x = raw + (s.dt_bias ? in.dt_bias[hv * K + i] : 0.0);
    if (s.gate_kind() == GateKind::softplus) {
      const double softplus = x > 20 ? x : std::log(1 + std::exp(x));
      g[i] = -std::exp(in.A_log[hv]) * softplus;
    } else {
      g[i] = *s.lower_bound / (1 + std::exp(-std::exp(in.A_log[hv]) * x));
    }
  }
  const double b = in.beta[t * s.HV + hv];
  const double beta = s.beta_logits ? 1 / (1 + std::exp(-b)) : b;

  // 3. decay column k by exp(g[k]).
  for (int r = 0; r < V; ++r)
    for (int i = 0; i < K; ++i) S[r * K + i] *= std::exp(g[i]);
  // 4. u = beta (v - S k).
  std::vector<double> u(V);
  for (int r = 0; r < V; ++r) {
    double Sk = 0;
    for (int i = 0; i < K; ++i) Sk += S[r * K + i] * k[i];
    u[r] = beta * (v[r] - Sk);
  }
  // 5. S += u k^T.
  for (int r = 0; r < V; ++r)
    for (int i = 0; i < K; ++i) S[r * K + i] += u[r] * k[i];
  // 6. o = S q.
  std::vector<double> o(V, 0.0);
  for (int r = 0; r < V; ++r)
    for (int i = 0; i < K; ++i) o[r] += S[r * K + i] * q[i];
  return o;
}

// Each stored value within one unit in the last place of its dtype of the textbook value rounded
// into that dtype: the two f64 computations differ by a few f64 ulps of their O(1) terms (1e-12
// absolute covers that, also where a sum cancels to near zero), which can tip a rounding.
bool agrees(const std::vector<double>& stored, const std::vector<double>& textbook, DType dtype) {
  const double ulp = dtype == DType::f32 ? 0x1p-23 : dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
  const double f16_subnormal_step = 0x1p-24;
  if (stored.size() != textbook.size()) return false;
  for (std::size_t i = 0; i < stored.size(); ++i) {
    const double want = numeric::round_to(dtype, textbook[i]);
    const double d = std::fabs(stored[i] - want);
    const double allowed = ulp * std::fabs(want) + 1e-12 +
                           (dtype == DType::f16 ? f16_subnormal_step : 0.0);
    if (!(d <= allowed)) return false;
  }
  return true;
}

std::vector<double> slot_of(const std::vector<double>& pool_rows, const CallPlan& s,
                            std::int64_t slot) {
  const std::int64_t n = static_cast<std::int64_t>(s.HV) * s.V * s.K;
  return {pool_rows.begin() + slot * n, pool_rows.begin() + (slot + 1) * n};
}

// Runs the textbook over rows of tokens from their slots; returns out [T, HV, V] and the final
// states per row (empty for padding rows).
struct Textbook {
  std::vector<double> out;
  std::vector<std::vector<double>> final_state;
};
Textbook run_textbook(const CallPlan& s, const Tensors& in, const std::vector<double>& pool) {
  Textbook r;
  r.out.assign(static_cast<std::size_t>(s.total_tokens() * s.HV * s.V), 0.0);
  const std::size_t VK = static_cast<std::size_t>(s.V) * s.K;
  std::int64_t first = 0;
  for (std::size_t n = 0; n < s.row_lengths.size(); ++n) {
    std::vector<double>& final_state = r.final_state.emplace_back();
    if (s.slot_of_row[n] >= 0) {
      final_state = slot_of(pool, s, s.slot_of_row[n]);
      for (int hv = 0; hv < s.HV; ++hv) {
        std::vector<double> S(final_state.begin() + hv * VK, final_state.begin() + (hv + 1) * VK);
        for (std::int64_t t = first; t < first + s.row_lengths[n]; ++t) {
          const std::vector<double> o = textbook_token(s, in, t, hv, S);
          std::copy(o.begin(), o.end(), r.out.begin() + (t * s.HV + hv) * s.V);
        }
        std::copy(S.begin(), S.end(), final_state.begin() + hv * VK);
      }
    }
    first += s.row_lengths[n];
  }
  return r;
}

template <class Call>
void check_against_textbook(HostProblem& problem, const Call& call, const TensorView& pool) {
  const CallPlan& s = problem.plan;
  const Textbook want = run_textbook(s, read_inputs(call), read_floats(pool));
  RC_ASSERT(reference::run(problem.call).ok());
  RC_ASSERT(agrees(read_floats(*call.out), want.out, s.io_dtype));
  const std::vector<double> pool_after = read_floats(pool);
  for (std::size_t n = 0; n < s.row_lengths.size(); ++n)
    if (s.slot_of_row[n] >= 0 && s.row_lengths[n] > 0)
      RC_ASSERT(agrees(slot_of(pool_after, s, s.slot_of_row[n]), want.final_state[n], s.state_dtype));
}

RC_GTEST_PROP(ReferenceTextbook, DecodeFollowsKdaMath, ()) {
  const CallPlan spec = *support::gen_decode_problem();
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  const auto& call = std::get<DecodeCall>(problem.call);
  check_against_textbook(problem, call, *call.state);
}

RC_GTEST_PROP(ReferenceTextbook, PrefillFollowsKdaMath, ()) {
  support::GenLimits limits;
  limits.max_seq_len = 40;  // the textbook is slow on purpose; a few tokens per sequence suffice
  const CallPlan spec = *support::gen_prefill_problem(limits);
  HostProblem problem = support::materialize(spec, *rc::gen::arbitrary<std::uint64_t>());
  const auto& call = std::get<PrefillCall>(problem.call);
  check_against_textbook(problem, call, *call.initial_state);
}

}  // namespace
}  // namespace kdaguard
