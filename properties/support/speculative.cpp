#include "speculative.h"

#include <fmt/format.h>

#include <cstring>
#include <optional>

#include "kdaguard/reference.h"

namespace kdaguard::support {

Status decode_each_token(HostProblem& problem, DecodeTrace& trace) {
  const CallPlan& s = problem.plan;
  const VerifyCall& vc = *problem.verify;
  const Allocation slot_buffer("decode_cache_indices", 4);
  const Allocation out_buffer("decode_out", static_cast<std::size_t>(s.HV * s.V * element_size(s.io_dtype)));

  TensorView cache_indices = TensorView::contiguous(DType::i32, {1});
  cache_indices.address = slot_buffer.address();
  cache_indices.storage_size = Elements{1};
  TensorView out = TensorView::contiguous(s.io_dtype, {1, s.HV, s.V});
  out.address = out_buffer.address();
  out.storage_size = Elements{s.HV * s.V};

  trace.out.assign(s.row_lengths.size(), {});
  trace.state.assign(s.row_lengths.size(), {});
  std::int64_t first_token = 0;
  for (std::size_t n = 0; n < s.row_lengths.size(); ++n) {
    const std::int64_t slot = s.slot_of_row[n];
    for (std::int64_t t = 0; slot >= 0 && t < s.row_lengths[n]; ++t) {
      const auto slot32 = static_cast<std::int32_t>(slot);
      std::memcpy(slot_buffer.data(), &slot32, 4);
      cache_indices.values = std::vector<std::int64_t>{slot};
      const DecodeCall dc = token_decode(vc, first_token + t, vc.state, cache_indices, out);
      if (Status status = reference::decode(dc); !status.ok()) return status;
      trace.out[n].push_back(read_floats(out));
      trace.state[n].push_back(read_slot(*vc.state, slot));
    }
    first_token += s.row_lengths[n];
  }
  return Status::success();
}

std::optional<std::string> verify_mismatch(const HostProblem& problem, const DecodeTrace& trace) {
  const CallPlan& s = problem.plan;
  std::int64_t first_token = 0;
  for (std::size_t n = 0; n < s.row_lengths.size(); ++n) {
    for (std::int64_t t = 0; t < s.row_lengths[n]; ++t) {
      const std::vector<double> got = read_floats(slice_rows(*problem.verify->out, first_token + t, 1));
      if (s.slot_of_row[n] < 0) {
        if (got != std::vector<double>(got.size(), 0.0))
          return fmt::format("verify padding row {} step {}: output is not zero", n, t);
        continue;
      }
      if (got != trace.out[n][t])
        return fmt::format("verify row {} step {}: output differs from decoding the token", n, t);
      const std::int64_t flat = s.scratch_slot(static_cast<std::int64_t>(n), t);
      if (flat >= 0 && read_slot(*problem.verify->scratch, flat) != trace.state[n][t])
        return fmt::format("verify row {} step {}: scratch state differs from decoding the token", n, t);
    }
    first_token += s.row_lengths[n];
  }
  return std::nullopt;
}

std::optional<std::string> commit_mismatch(const HostProblem& problem, const DecodeTrace& trace) {
  const CallPlan& s = problem.plan;
  for (std::size_t n = 0; n < s.row_lengths.size(); ++n) {
    const std::int64_t a = s.accepted[n];
    if (s.slot_of_row[n] < 0 || a == 0) continue;
    if (read_slot(*problem.commit->state, s.slot_of_row[n]) != trace.state[n][a - 1])
      return fmt::format("commit row {} ({} accepted): state differs from decoding them", n, a);
  }
  return std::nullopt;
}


}  // namespace kdaguard::support
