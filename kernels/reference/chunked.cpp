// The chunked form of the prefill recurrence on the CPU (kda-math.md, "Chunked form"), in f32 or
// f64: the algorithm the GPU prefill implements, runnable where its numerics can be studied.
// Per chunk of C tokens, with the state Sk (K x V) at the chunk start:
//   G_r     = sum_{i<=r} g_i                       (in-chunk cumulative gate, per key channel)
//   L[i,j]  = beta_i sum_k k_i k_j exp(G_i - G_j)  (i > j)
//   A[i,j]  = sum_k q_i k_j exp(G_i - G_j)         (i >= j)
//   T       = (I + L)^-1
//   W       = T diag(beta) (exp(G) * K),  U = T diag(beta) V
//   Vnew    = U - W Sk
//   O       = (exp(G) * Q) Sk + A Vnew
//   Sk_next = diag(exp(G_C)) Sk + (exp(G_C - G) * K)^T Vnew
// Every exponent is the sum of the gates over a span of tokens, G_i - G_j with i >= j, G_r, or
// G_C - G_r, so it is <= 0: nothing overflows however negative the gates, only underflows to 0
// where the true factor is smaller still. By default each is summed from the gates it spans
// rather than subtracted from two cumulative sums (ChunkExponents says why).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kdaguard/lower.h"
#include "kdaguard/reference.h"
#include "prefill_io.h"
#include "token_head.h"

namespace kdaguard::reference {
namespace {

template <class Real>
class ChunkedPrefill {
 public:
  ChunkedPrefill(const PrefillParams& p, ChunkOptions options)
      : p_(p),
        options_(options),
        K_(p.in.K),
        V_(p.in.V),
        C_(options.chunk),
        token_(K_, V_),
        q_(C_ * K_), k_(C_ * K_), v_(C_ * V_), g_(C_ * K_), G_(C_ * K_), to_end_(C_ * K_),
        span_(K_), beta_(C_),
        L_(C_ * C_), A_(C_ * C_), T_(C_ * C_), product_(C_ * C_), power_(C_ * C_),
        scaled_k_(C_ * K_), scaled_v_(C_ * V_), W_(C_ * K_), U_(C_ * V_), v_new_(C_ * V_),
        out_(C_ * V_), S_(K_ * V_) {}

  PrefillValues run() {
    PrefillValues r = detail::prefill_shape(p_);
    for (std::int32_t n = 0; n < p_.num_seqs; ++n) {
      const std::int64_t begin = detail::seq_offset(p_, n), end = detail::seq_offset(p_, n + 1);
      for (int hv = 0; hv < p_.in.HV; ++hv) run_sequence_head(n, hv, begin, end, r);
    }
    return r;
  }

 private:
  Real& at(std::vector<Real>& m, int row, int col, int cols) { return m[row * cols + col]; }

  void run_sequence_head(std::int32_t n, int hv, std::int64_t begin, std::int64_t end,
                         PrefillValues& r) {
    const std::int64_t slot = p_.state_indices[n];
    const std::int64_t base = detail::head_offset(p_.state, slot, hv, V_, K_);
    // The pool holds S (V x K); the chunked form works on Sk = S^T (K x V).
    for (int v = 0; v < V_; ++v)
      for (int k = 0; k < K_; ++k)
        S_[k * V_ + v] = static_cast<Real>(
            numeric::load(p_.state.data, p_.state.dtype, base + static_cast<std::int64_t>(v) * K_ + k));

    for (std::int64_t first = begin; first < end; first += C_) {
      const int rows = static_cast<int>(std::min<std::int64_t>(C_, end - first));
      run_chunk(first, rows, hv);
      for (int i = 0; i < rows; ++i)
        for (int v = 0; v < V_; ++v)
          r.out[(static_cast<std::size_t>(first + i) * p_.in.HV + hv) * V_ + v] = out_[i * V_ + v];
    }

    double* final_state =
        r.final_state.data() + (static_cast<std::size_t>(n) * p_.in.HV + hv) * V_ * K_;
    for (int v = 0; v < V_; ++v)
      for (int k = 0; k < K_; ++k) final_state[v * K_ + k] = S_[k * V_ + v];
  }

  void load_chunk(std::int64_t first, int rows, int hv) {
    for (int i = 0; i < rows; ++i) {
      detail::load_token_head(p_.in, first + i, hv, token_);
      std::copy(token_.q.begin(), token_.q.end(), q_.begin() + i * K_);
      std::copy(token_.k.begin(), token_.k.end(), k_.begin() + i * K_);
      std::copy(token_.v.begin(), token_.v.end(), v_.begin() + i * V_);
      std::copy(token_.g.begin(), token_.g.end(), g_.begin() + i * K_);
      for (int k = 0; k < K_; ++k)
        G_[i * K_ + k] = (i == 0 ? Real(0) : G_[(i - 1) * K_ + k]) + token_.g[k];
      beta_[i] = token_.beta;
    }
    // G_C - G_i: the gates after token i to the chunk's end.
    for (int i = rows - 1; i >= 0; --i)
      for (int k = 0; k < K_; ++k)
        to_end_[i * K_ + k] =
            options_.exponents == ChunkExponents::cumsum_differences
                ? G_[(rows - 1) * K_ + k] - G_[i * K_ + k]
                : (i == rows - 1 ? Real(0) : to_end_[(i + 1) * K_ + k] + g_[(i + 1) * K_ + k]);
  }

  // L (strictly lower) and A (lower with the diagonal), each exponent G_i - G_j formed per pair:
  // walking j down from i, span_ accumulates the gates of tokens j+1 .. i.
  void pair_products(int rows) {
    const bool differences = options_.exponents == ChunkExponents::cumsum_differences;
    for (int i = 0; i < rows; ++i) {
      const Real* ki = &k_[i * K_];
      const Real* qi = &q_[i * K_];
      std::fill(span_.begin(), span_.end(), Real(0));
      for (int j = i; j >= 0; --j) {
        const Real* kj = &k_[j * K_];
        Real kk = 0, qk = 0;
        for (int c = 0; c < K_; ++c) {
          const Real exponent = differences ? G_[i * K_ + c] - G_[j * K_ + c] : span_[c];
          const Real decayed_kj = kj[c] * std::exp(exponent);
          kk += ki[c] * decayed_kj;
          qk += qi[c] * decayed_kj;
          span_[c] += g_[j * K_ + c];
        }
        at(A_, i, j, C_) = qk;
        at(L_, i, j, C_) = j < i ? beta_[i] * kk : Real(0);
      }
      for (int j = i + 1; j < rows; ++j) at(A_, i, j, C_) = at(L_, i, j, C_) = Real(0);
    }
  }

  // T = (I + L)^-1, unit lower triangular: row i of T (I + L) = e_i solved left to right.
  void invert_by_substitution(int rows) {
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < rows; ++j) at(T_, i, j, C_) = Real(i == j);
      for (int j = i - 1; j >= 0; --j) {
        Real sum = 0;
        for (int m = j; m < i; ++m) sum += at(L_, i, m, C_) * at(T_, m, j, C_);
        at(T_, i, j, C_) = -sum;
      }
    }
  }

  // dst = x * y over rows x rows lower-triangular matrices.
  void multiply_lower(const std::vector<Real>& x, const std::vector<Real>& y, std::vector<Real>& dst,
                      int rows) {
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < rows; ++j) {
        Real sum = 0;
        for (int m = j; m <= i; ++m) sum += x[i * C_ + m] * y[m * C_ + j];
        dst[i * C_ + j] = j <= i ? sum : Real(0);
      }
  }

  // T = (I - L)(I + L^2)(I + L^4)(I + L^8): exact because L^16 = 0 for at most 16 rows.
  void invert_by_neumann_product(int rows) {
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < rows; ++j) at(T_, i, j, C_) = Real(i == j) - at(L_, i, j, C_);
    std::copy(L_.begin(), L_.end(), power_.begin());
    for (int squarings = 0; squarings < 3; ++squarings) {
      multiply_lower(power_, power_, product_, rows);  // L^2, L^4, L^8
      std::swap(power_, product_);
      for (int i = 0; i < rows; ++i) at(power_, i, i, C_) += Real(1);   // I + L^(2^s)
      multiply_lower(T_, power_, product_, rows);
      std::swap(T_, product_);
      for (int i = 0; i < rows; ++i) at(power_, i, i, C_) -= Real(1);   // back to L^(2^s)
    }
  }

  void run_chunk(std::int64_t first, int rows, int hv) {
    load_chunk(first, rows, hv);
    pair_products(rows);
    if (options_.inverse == ChunkInverse::neumann_product) invert_by_neumann_product(rows);
    else invert_by_substitution(rows);

    // W = T diag(beta) (exp(G) * K), U = T diag(beta) V.
    for (int j = 0; j < rows; ++j) {
      for (int c = 0; c < K_; ++c)
        scaled_k_[j * K_ + c] = beta_[j] * std::exp(G_[j * K_ + c]) * k_[j * K_ + c];
      for (int c = 0; c < V_; ++c) scaled_v_[j * V_ + c] = beta_[j] * v_[j * V_ + c];
    }
    std::fill(W_.begin(), W_.end(), Real(0));
    std::fill(U_.begin(), U_.end(), Real(0));
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j <= i; ++j) {
        const Real t = at(T_, i, j, C_);
        for (int c = 0; c < K_; ++c) W_[i * K_ + c] += t * scaled_k_[j * K_ + c];
        for (int c = 0; c < V_; ++c) U_[i * V_ + c] += t * scaled_v_[j * V_ + c];
      }

    // Vnew = U - W Sk;  O = (exp(G) * Q) Sk + A Vnew.
    for (int i = 0; i < rows; ++i) {
      Real* vn = &v_new_[i * V_];
      Real* o = &out_[i * V_];
      std::copy(&U_[i * V_], &U_[i * V_] + V_, vn);
      std::fill(o, o + V_, Real(0));
      for (int c = 0; c < K_; ++c) {
        const Real w = W_[i * K_ + c];
        const Real decayed_q = std::exp(G_[i * K_ + c]) * q_[i * K_ + c];
        const Real* s = &S_[c * V_];
        for (int v = 0; v < V_; ++v) {
          vn[v] -= w * s[v];
          o[v] += decayed_q * s[v];
        }
      }
    }
    for (int i = 0; i < rows; ++i) {
      Real* o = &out_[i * V_];
      for (int j = 0; j <= i; ++j) {
        const Real a = at(A_, i, j, C_);
        const Real* vn = &v_new_[j * V_];
        for (int v = 0; v < V_; ++v) o[v] += a * vn[v];
      }
    }

    // Sk_next = diag(exp(G_C)) Sk + (exp(G_C - G) * K)^T Vnew.
    const Real* G_last = &G_[(rows - 1) * K_];
    for (int c = 0; c < K_; ++c) {
      Real* s = &S_[c * V_];
      const Real decay = std::exp(G_last[c]);
      for (int v = 0; v < V_; ++v) s[v] *= decay;
      for (int i = 0; i < rows; ++i) {
        const Real kd = std::exp(to_end_[i * K_ + c]) * k_[i * K_ + c];
        const Real* vn = &v_new_[i * V_];
        for (int v = 0; v < V_; ++v) s[v] += kd * vn[v];
      }
    }
  }

  const PrefillParams p_;
  ChunkOptions options_;
  int K_, V_, C_;
  detail::TokenHead<Real> token_;
  std::vector<Real> q_, k_, v_, g_, G_, to_end_;  // chunk rows: gates, G_r, G_C - G_r
  std::vector<Real> span_;                        // [K], a running exponent
  std::vector<Real> beta_;
  std::vector<Real> L_, A_, T_, product_, power_;  // C x C
  std::vector<Real> scaled_k_, scaled_v_, W_, U_, v_new_, out_;
  std::vector<Real> S_;                            // K x V
};

}  // namespace

template <class Real>
PrefillResult prefill_chunked_values(const PrefillCall& call, ChunkOptions options) {
  PrefillResult result{admit(call), {}};
  if (!result.status.ok()) return result;
  if (options.chunk < 1)
    result.status = Status::unsupported_because(
        fmt::format("chunk size must be at least 1; got {}", options.chunk));
  else if (options.inverse == ChunkInverse::neumann_product && options.chunk > 16)
    result.status = Status::unsupported_because(fmt::format(
        "the Neumann product (I - L)(I + L^2)(I + L^4)(I + L^8) inverts chunks of at most 16 "
        "tokens; got chunk {}",
        options.chunk));
  else
    result.values = ChunkedPrefill<Real>(lower(call), options).run();
  return result;
}

template <class Real>
Status prefill_chunked(const PrefillCall& call, ChunkOptions options) {
  PrefillResult result = prefill_chunked_values<Real>(call, options);
  if (result.status.ok()) detail::write_prefill(lower(call), result.values);
  return std::move(result.status);
}

template PrefillResult prefill_chunked_values<float>(const PrefillCall&, ChunkOptions);
template PrefillResult prefill_chunked_values<double>(const PrefillCall&, ChunkOptions);
template Status prefill_chunked<float>(const PrefillCall&, ChunkOptions);
template Status prefill_chunked<double>(const PrefillCall&, ChunkOptions);

}  // namespace kdaguard::reference
