// Small valid calls of every entry point, built by hand, for the unit tests: each test applies the
// smallest change that breaks one rule and expects exactly that rule.
#pragma once

#include <cstdint>
#include <vector>

#include "kdaguard/contracts/call.h"

namespace kdaguard::examples {

struct Shape {
  std::int64_t rows = 4;  // B for decode, T_tot for prefill and verify
  std::int64_t H = 2, HV = 4, K = 64, V = 64;
  std::int64_t slots = 8;
  std::int64_t slot_padding = 16;  // extra elements per slot: an envelope-strided pool
};

inline TensorView view(DType t, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(t, shape);
}

inline TensorView index_view(std::vector<std::int64_t> values) {
  TensorView t = TensorView::contiguous(DType::i32, {static_cast<std::int64_t>(values.size())});
  t.values = std::move(values);
  return t;
}

inline TensorView pool(DType t, const Shape& s, std::int64_t slots) {
  TensorView p = TensorView::contiguous(t, {slots, s.HV, s.V, s.K});
  p.stride[0] = s.HV * s.V * s.K + s.slot_padding;
  return p;
}

template <class Call> void fill_token_inputs(Call& c, const Shape& s) {
  c.q = view(DType::bf16, {s.rows, s.H, s.K});
  c.k = view(DType::bf16, {s.rows, s.H, s.K});
  c.v = view(DType::bf16, {s.rows, s.HV, s.V});
  c.a = view(DType::bf16, {s.rows, s.HV, s.K});
  c.A_log = view(DType::f32, {s.HV});
  c.dt_bias = view(DType::f32, {s.HV * s.K});
  c.b = view(DType::bf16, {s.rows, s.HV});
  c.out = view(DType::bf16, {s.rows, s.HV, s.V});
  c.scalars.use_qk_l2norm = true;
}

// decode, B = 4, slots [3, 7, -1, 0] of an 8-slot f32 pool.
inline DecodeCall decode(const Shape& s = {}) {
  DecodeCall c;
  fill_token_inputs(c, s);
  c.state = pool(DType::f32, s, s.slots);
  c.cache_indices = index_view({3, 7, -1, 0});
  return c;
}

// prefill, 3 sequences of 4, 0 and 6 tokens, slots [2, 0, 4] of a 5-slot pool.
inline PrefillCall prefill() {
  Shape s;
  s.rows = 10;
  s.V = 128;
  PrefillCall c;
  fill_token_inputs(c, s);
  c.cu_seqlens = index_view({0, 4, 4, 10});
  c.initial_state = pool(DType::f32, s, 5);
  c.initial_state_indices = index_view({2, 0, 4});
  return c;
}

// verify, T = 4, 3 rows of 4, 2 and 3 tokens; row 1 is padding; scratch [4, 4, HV, V, K].
inline Shape verify_shape() {
  Shape s;
  s.rows = 9;
  return s;
}

inline TensorView scratch(const Shape& s, std::int64_t rows, std::int64_t steps) {
  TensorView t = TensorView::contiguous(DType::f32, {rows, steps, s.HV, s.V, s.K});
  return t;
}

inline VerifyCall verify() {
  const Shape s = verify_shape();
  VerifyCall c;
  fill_token_inputs(c, s);
  c.cu_seqlens = index_view({0, 4, 6, 9});
  c.state = pool(DType::f32, s, 6);
  c.cache_indices = index_view({1, -1, 5});
  c.scratch = scratch(s, 4, 4);
  c.scratch_row_map = index_view({0, 1, 2, 3});
  c.scalars.draft_token_num = 4;
  return c;
}

inline CommitCall commit() {
  const Shape s = verify_shape();
  CommitCall c;
  c.scratch = scratch(s, 4, 4);
  c.scratch_row_map = index_view({0, 1, 2, 3});
  c.state = pool(DType::f32, s, 6);
  c.cache_indices = index_view({1, -1, 5});
  c.accepted = index_view({2, 0, 3});
  c.scalars.draft_token_num = 4;
  return c;
}

}  // namespace kdaguard::examples
