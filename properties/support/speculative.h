// The speculative-decoding oracle shared by the reference properties and fuzz_reference: a verify
// problem's draft tokens decoded one call per token, so verify and commit can be compared with
// what plain decodes produce.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kdaguard/status.h"
#include "problem.h"

namespace kdaguard::support {

// Per active row, per step: the output [HV, V] and the state after the step [HV, V, K].
struct DecodeTrace {
  std::vector<std::vector<std::vector<double>>> out, state;
};

// Token `token` of a prefill or verify call as a single-token decode: that row of q, k, v, the gate
// and beta, the call's gate parameters and scalars (no draft-token count), on `state` at the slot
// `cache_indices` names, writing `out` [1, HV, V].
template <class TokenCall>
DecodeCall token_decode(const TokenCall& c, std::int64_t token, const OptionalView& state,
                        const TensorView& cache_indices, const TensorView& out) {
  auto row = [&](const OptionalView& v) -> OptionalView {
    return v ? OptionalView(slice_rows(*v, token, 1)) : std::nullopt;
  };
  DecodeCall d;
  d.device = c.device;
  d.q = row(c.q);
  d.k = row(c.k);
  d.v = row(c.v);
  d.a = row(c.a);
  d.g = row(c.g);
  d.b = row(c.b);
  d.beta = row(c.beta);
  d.A_log = c.A_log;
  d.dt_bias = c.dt_bias;
  d.state = state;
  d.cache_indices = cache_indices;
  d.out = out;
  d.scalars = c.scalars;
  d.scalars.draft_token_num.reset();
  return d;
}

// Decodes every token of every active row of a verify or commit problem with the reference, one
// decode call per token, on the problem's committed pool in place (callers restore it afterwards).
// A refused decode stops the walk and is returned; `trace` then holds the steps before it.
Status decode_each_token(HostProblem& problem, DecodeTrace& trace);

// The first way a verify that has run differs from `trace`: a padding row's output not zero, an
// active step's output, or the state in its scratch slot; nullopt when it matches everywhere.
std::optional<std::string> verify_mismatch(const HostProblem& problem, const DecodeTrace& trace);

// The first row whose committed slot after a commit differs from the state after its last
// accepted step in `trace` (rows that accepted nothing are the unexpected-writes check's).
std::optional<std::string> commit_mismatch(const HostProblem& problem, const DecodeTrace& trace);

}  // namespace kdaguard::support
