// Lowering a validated call to its params struct. Every size, stride and pointer below was
// checked by validate(); nothing here re-derives or re-checks it.
#include "kdaguard/lower.h"

#include <cmath>

namespace kdaguard {
namespace {

const void* data_of(const TensorView& t) {
  return reinterpret_cast<const void*>(*t.data_address());
}
void* mutable_data_of(const TensorView& t) { return reinterpret_cast<void*>(*t.data_address()); }

TokenHeadRows rows_of(const TensorView& t) {
  // [tokens, heads, dim] or [tokens, heads] (beta): the head stride is dim 1's either way.
  return {data_of(t), t.stride[0], t.stride[1]};
}

// A [S, HV, V, K] pool; the scratch [S_spec, T_alloc, HV, V, K] is flattened to
// [S_spec * T_alloc, HV, V, K], whose slot stride is the step stride (validated to flatten).
StatePool pool_of(const TensorView& t) {
  const bool scratch = t.rank == 5;
  return {mutable_data_of(t), t.dtype, scratch ? t.shape[0] * t.shape[1] : t.shape[0],
          scratch ? t.stride[1] : t.stride[0]};
}

template <class Call>
TokenInputs token_inputs(const Call& c) {
  TokenInputs in;
  in.H = static_cast<std::int32_t>(c.q->shape[1]);
  in.K = static_cast<std::int32_t>(c.q->shape[2]);
  in.HV = static_cast<std::int32_t>(c.v->shape[1]);
  in.V = static_cast<std::int32_t>(c.v->shape[2]);
  in.io_dtype = c.q->dtype;
  in.q = rows_of(*c.q);
  in.k = rows_of(*c.k);
  in.v = rows_of(*c.v);

  const TensorView& gate = c.a ? *c.a : *c.g;
  in.gate_kind = c.g ? GateKind::activated
                     : (c.scalars.lower_bound ? GateKind::bounded : GateKind::softplus);
  in.gate_dtype = gate.dtype;
  in.gate = rows_of(gate);
  if (c.a) {
    in.A_log = static_cast<const float*>(data_of(*c.A_log));
    if (c.dt_bias) in.dt_bias = static_cast<const float*>(data_of(*c.dt_bias));
    if (c.scalars.lower_bound) in.lower_bound = static_cast<float>(*c.scalars.lower_bound);
  }

  const TensorView& beta = c.b ? *c.b : *c.beta;
  in.beta_kind = c.b ? BetaKind::logits : BetaKind::activated;
  in.beta_dtype = beta.dtype;
  in.beta = rows_of(beta);

  in.scale = static_cast<float>(c.scalars.scale ? *c.scalars.scale
                                                : 1.0 / std::sqrt(static_cast<double>(in.K)));
  in.use_qk_l2norm = c.scalars.use_qk_l2norm;
  return in;
}

OutputRows out_of(const TensorView& t) { return {mutable_data_of(t), t.stride[0], t.stride[1]}; }

const std::int32_t* indices_of(const OptionalView& t) {
  return t ? static_cast<const std::int32_t*>(data_of(*t)) : nullptr;
}

ScratchTarget scratch_target(const TensorView& scratch, const OptionalView& scratch_indices,
                             const OptionalView& scratch_row_map) {
  ScratchTarget target;
  target.scratch = pool_of(scratch);
  target.scratch_steps = scratch.shape[1];
  target.scratch_indices = indices_of(scratch_indices);
  target.indices_row_stride = scratch_indices ? scratch_indices->stride[0] : 0;
  if (!scratch_indices) target.scratch_row_map = indices_of(scratch_row_map);
  return target;
}

RecordBuffer records_of(const TensorView& t) {
  return {static_cast<float*>(mutable_data_of(t)), t.stride[0], t.stride[1], t.stride[2],
          t.shape[1]};
}

template <class Call>
RecordVerifyParams record_verify_params(const Call& c) {
  RecordVerifyParams p;
  p.in = token_inputs(c);
  p.total_tokens = c.q->shape[0];
  p.rows = static_cast<std::int32_t>(c.cu_seqlens->shape[0] - 1);
  p.draft_tokens = static_cast<std::int32_t>(*c.scalars.draft_token_num);
  p.cu_seqlens = indices_of(c.cu_seqlens);
  p.state = pool_of(*c.state);
  p.cache_indices = indices_of(c.cache_indices);
  p.records = records_of(*c.records);
  p.out = out_of(*c.out);
  return p;
}

}  // namespace

DecodeParams lower(const DecodeCall& c) {
  DecodeParams p;
  p.in = token_inputs(c);
  p.batch = static_cast<std::int32_t>(c.q->shape[0]);
  p.state = pool_of(*c.state);
  p.cache_indices = indices_of(c.cache_indices);
  p.cu_seqlens = indices_of(c.cu_seqlens);
  p.out = out_of(*c.out);
  return p;
}

PrefillParams lower(const PrefillCall& c) {
  PrefillParams p;
  p.in = token_inputs(c);
  p.total_tokens = c.q->shape[0];
  p.num_seqs = static_cast<std::int32_t>(c.cu_seqlens->shape[0] - 1);
  p.cu_seqlens = data_of(*c.cu_seqlens);
  p.cu_seqlens_dtype = c.cu_seqlens->dtype;
  p.state = pool_of(*c.initial_state);
  p.state_indices = indices_of(c.initial_state_indices);
  p.out = out_of(*c.out);
  return p;
}

VerifyParams lower(const VerifyCall& c) {
  VerifyParams p;
  p.in = token_inputs(c);
  p.total_tokens = c.q->shape[0];
  p.rows = static_cast<std::int32_t>(c.cu_seqlens->shape[0] - 1);
  p.draft_tokens = static_cast<std::int32_t>(*c.scalars.draft_token_num);
  p.cu_seqlens = indices_of(c.cu_seqlens);
  p.state = pool_of(*c.state);
  p.cache_indices = indices_of(c.cache_indices);
  p.target = scratch_target(*c.scratch, c.scratch_indices, c.scratch_row_map);
  p.out = out_of(*c.out);
  return p;
}

CommitParams lower(const CommitCall& c) {
  CommitParams p;
  p.rows = static_cast<std::int32_t>(c.accepted->shape[0]);
  p.draft_tokens = static_cast<std::int32_t>(*c.scalars.draft_token_num);
  p.HV = static_cast<std::int32_t>(c.state->shape[1]);
  p.V = static_cast<std::int32_t>(c.state->shape[2]);
  p.K = static_cast<std::int32_t>(c.state->shape[3]);
  p.state = pool_of(*c.state);
  p.cache_indices = indices_of(c.cache_indices);
  p.source = scratch_target(*c.scratch, c.scratch_indices, c.scratch_row_map);
  p.accepted = indices_of(c.accepted);
  p.cu_seqlens = indices_of(c.cu_seqlens);
  return p;
}

RecordVerifyParams lower(const RecordVerifyCall& c) { return record_verify_params(c); }

ReplayCommitParams lower(const ReplayCommitCall& c) {
  ReplayCommitParams p;
  p.rows = static_cast<std::int32_t>(c.accepted->shape[0]);
  p.draft_tokens = static_cast<std::int32_t>(*c.scalars.draft_token_num);
  p.HV = static_cast<std::int32_t>(c.state->shape[1]);
  p.V = static_cast<std::int32_t>(c.state->shape[2]);
  p.K = static_cast<std::int32_t>(c.state->shape[3]);
  p.state = pool_of(*c.state);
  p.cache_indices = indices_of(c.cache_indices);
  p.records = records_of(*c.records);
  p.accepted = indices_of(c.accepted);
  p.cu_seqlens = indices_of(c.cu_seqlens);
  return p;
}

AcceptVerifyParams lower(const AcceptVerifyCall& c) {
  AcceptVerifyParams p;
  p.verify = record_verify_params(c);
  p.prior_records = records_of(*c.prior_records);
  p.prior_accepted = indices_of(c.prior_accepted);
  return p;
}

}  // namespace kdaguard
