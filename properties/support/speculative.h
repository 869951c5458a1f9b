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
