// Plain parameter structs, one per entry point: pointers, dims, strides in elements, flags.
// They are built only from a validated call (lower.h) and are all a kernel ever sees, on the
// CPU reference backend and the CUDA backend alike. No CUDA header, no std containers.
#pragma once

#include <cstdint>

#include "kdaguard/contracts/tensor_view.h"

namespace kdaguard {

enum class GateKind : std::uint8_t {
  softplus,   // raw gate a: g = -exp(A_log) * softplus(a + dt_bias)
  bounded,    // raw gate a with lower_bound L: g = L * sigmoid(exp(A_log) * (a + dt_bias))
  activated,  // g given, already in log space
};
enum class BetaKind : std::uint8_t { logits, activated };

// [tokens, heads, dim] with the last dim contiguous.
struct TokenHeadRows {
  const void* data = nullptr;
  std::int64_t token_stride = 0;  // elements
  std::int64_t head_stride = 0;   // elements
};

struct OutputRows {
  void* data = nullptr;
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
};

// The per-token inputs shared by decode, prefill and verify.
struct TokenInputs {
  std::int32_t H = 0, HV = 0, K = 0, V = 0;
  DType io_dtype = DType::bf16;   // q, k, v and out
  TokenHeadRows q, k, v;          // q, k: [T, H, K]; v: [T, HV, V]
  GateKind gate_kind = GateKind::softplus;
  DType gate_dtype = DType::bf16;
  TokenHeadRows gate;             // a or g: [>= T, HV, K]
  const float* A_log = nullptr;   // [HV], raw gates only
  const float* dt_bias = nullptr; // [HV*K] or null
  float lower_bound = 0.0f;       // bounded gate only
  BetaKind beta_kind = BetaKind::logits;
  DType beta_dtype = DType::bf16;
  TokenHeadRows beta;             // b or beta: [>= T, HV] (head_stride is the last dim's, 1)
  float scale = 0.0f;
  bool use_qk_l2norm = false;
};

// A state pool [S, HV, V, K] whose inner dims are compact; only the slot stride is free.
struct StatePool {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t num_slots = 0;
  std::int64_t slot_stride = 0;  // elements, >= HV*V*K, multiple of 16
};

struct DecodeParams {
  TokenInputs in;
  std::int32_t batch = 0;
  StatePool state;
  const std::int32_t* cache_indices = nullptr;  // [B], -1 = padding row
  // [B+1] or null; the kernels never need it (one token per row), only the device checks of
  // decode.one_token when its values were not on the host.
  const std::int32_t* cu_seqlens = nullptr;
  OutputRows out;                                // [B, HV, V]
};

struct PrefillParams {
  TokenInputs in;
  std::int64_t total_tokens = 0;
  std::int32_t num_seqs = 0;
  const void* cu_seqlens = nullptr;  // [N+1]
  DType cu_seqlens_dtype = DType::i32;
  StatePool state;                   // initial_state, final state written back in place
  const std::int32_t* state_indices = nullptr;  // [N]
  OutputRows out;                    // [T_tot, HV, V]
  // Device memory of the CUDA kernels' chunk operands, from the caller (gpu::LaunchOptions), and
  // its size; null: the kernels take it from the library's own pool. Never set by lower(); unused
  // on the CPU.
  void* workspace = nullptr;
  std::int64_t workspace_bytes = 0;
};

// Where verify writes step t of row n: scratch_indices[n * indices_row_stride + t] when
// scratch_indices is given (-1 = skip), else flat slot n * scratch_steps + t (the row map was
// proven to be the identity, on the host or by the device checks of verify.row_map_identity,
// the only reader of scratch_row_map).
struct ScratchTarget {
  StatePool scratch;                 // flattened [S_spec * T_alloc, HV, V, K]
  std::int64_t scratch_steps = 0;    // T_alloc
  const std::int32_t* scratch_indices = nullptr;
  std::int64_t indices_row_stride = 0;
  const std::int32_t* scratch_row_map = nullptr;  // [>= N]; null when scratch_indices is given
};

struct VerifyParams {
  TokenInputs in;
  std::int64_t total_tokens = 0;
  std::int32_t rows = 0;             // N
  std::int32_t draft_tokens = 0;     // T
  const std::int32_t* cu_seqlens = nullptr;     // [N+1]
  StatePool state;                   // committed pool, read only
  const std::int32_t* cache_indices = nullptr;  // [>= N], -1 = padding row
  ScratchTarget target;
  OutputRows out;
};

struct CommitParams {
  std::int32_t rows = 0;
  std::int32_t draft_tokens = 0;
  std::int32_t HV = 0, V = 0, K = 0;
  StatePool state;
  const std::int32_t* cache_indices = nullptr;
  ScratchTarget source;              // same addressing as the verify that filled it
  const std::int32_t* accepted = nullptr;       // [N]
  // [N+1] or null: the rows' lengths bound their accepted counts (commit.accepted); read only by
  // the device checks when the values were not on the host.
  const std::int32_t* cu_seqlens = nullptr;
};

// ---- the record-based speculative path (contracts/NOTES.md) ----

// A record buffer [S_rec, T_alloc, HV, 2K+V] of f32: the record of (row n, step t, value head hv)
// starts at n * row_stride + t * step_stride + hv * head_stride and holds g [K], k [K], u [V].
struct RecordBuffer {
  float* data = nullptr;           // read only where the entry point only reads it
  std::int64_t row_stride = 0;     // elements
  std::int64_t step_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t steps = 0;          // T_alloc
};

struct RecordVerifyParams {
  TokenInputs in;
  std::int64_t total_tokens = 0;
  std::int32_t rows = 0;             // N
  std::int32_t draft_tokens = 0;     // T
  const std::int32_t* cu_seqlens = nullptr;     // [N+1]
  StatePool state;                   // committed pool: read only (record_verify), read and
                                     // written in place (accept_verify)
  const std::int32_t* cache_indices = nullptr;  // [>= N], -1 = padding row
  RecordBuffer records;              // written
  OutputRows out;
};

struct ReplayCommitParams {
  std::int32_t rows = 0;
  std::int32_t draft_tokens = 0;
  std::int32_t HV = 0, V = 0, K = 0;
  StatePool state;
  const std::int32_t* cache_indices = nullptr;
  RecordBuffer records;              // read
  const std::int32_t* accepted = nullptr;       // [N]
  const std::int32_t* cu_seqlens = nullptr;     // [N+1] or null, as for commit
};

struct AcceptVerifyParams {
  RecordVerifyParams verify;         // the new draft; its state is the pool written in place
  RecordBuffer prior_records;        // read
  const std::int32_t* prior_accepted = nullptr;  // [N]
};

}  // namespace kdaguard
