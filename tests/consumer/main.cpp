// Validates a decode call whose state pool is a transposed view (seed 003) and expects the rule
// state.inner_strides; exits 0 only then.
#include <cstdio>

#include "kdaguard/contracts/validate.h"
#include "kdaguard/reference.h"

int main() {
  using namespace kdaguard;
  DecodeCall call;
  call.q = TensorView::contiguous(DType::bf16, {2, 4, 128});
  call.k = TensorView::contiguous(DType::bf16, {2, 4, 128});
  call.v = TensorView::contiguous(DType::bf16, {2, 4, 128});
  call.g = TensorView::contiguous(DType::f32, {2, 4, 128});
  call.beta = TensorView::contiguous(DType::f32, {2, 4});
  TensorView state = TensorView::contiguous(DType::f32, {4, 4, 128, 128});
  std::swap(state.stride[2], state.stride[3]);
  call.state = state;
  call.cache_indices = TensorView::contiguous(DType::i32, {2});
  call.out = TensorView::contiguous(DType::bf16, {2, 4, 128});
  const Verdict verdict = validate(call);
  std::printf("%s", describe(verdict).c_str());
  const Status status = reference::decode(call);
  return verdict.breaks(RuleId::state_inner_strides) && status.code == StatusCode::rejected ? 0 : 1;
}
