// Small valid calls of the record-based speculative entry points (record_verify, replay_commit,
// accept_verify), built by hand like example_calls.h: verify()'s three rows of 4, 2 and 3 tokens
// with row 1 padding, T = 4, and records [4, 4, HV, 2K+V] of f32.
#pragma once

#include "example_calls.h"

namespace kdaguard::examples {

inline TensorView records(const Shape& s, std::int64_t rows, std::int64_t steps) {
  return TensorView::contiguous(DType::f32, {rows, steps, s.HV, 2 * s.K + s.V});
}

inline RecordVerifyCall record_verify() {
  const Shape s = verify_shape();
  RecordVerifyCall c;
  fill_token_inputs(c, s);
  c.cu_seqlens = index_view({0, 4, 6, 9});
  c.state = pool(DType::f32, s, 6);
  c.cache_indices = index_view({1, -1, 5});
  c.records = records(s, 4, 4);
  c.scalars.draft_token_num = 4;
  return c;
}

inline ReplayCommitCall replay_commit() {
  const Shape s = verify_shape();
  ReplayCommitCall c;
  c.records = records(s, 4, 4);
  c.state = pool(DType::f32, s, 6);
  c.cache_indices = index_view({1, -1, 5});
  c.accepted = index_view({2, 0, 3});
  c.cu_seqlens = index_view({0, 4, 6, 9});
  c.scalars.draft_token_num = 4;
  return c;
}

// The previous step accepted 1, 0 and 4 tokens, recorded with T_alloc = 4.
inline AcceptVerifyCall accept_verify() {
  const Shape s = verify_shape();
  AcceptVerifyCall c;
  fill_token_inputs(c, s);
  c.cu_seqlens = index_view({0, 4, 6, 9});
  c.state = pool(DType::f32, s, 6);
  c.cache_indices = index_view({1, -1, 5});
  c.prior_records = records(s, 3, 4);
  c.prior_accepted = index_view({1, 0, 4});
  c.records = records(s, 4, 4);
  c.scalars.draft_token_num = 4;
  return c;
}

}  // namespace kdaguard::examples
