// The CUDA entry points: decode, prefill, verify and commit on an NVIDIA Hopper GPU (sm_90a).
//
// Every entry point takes its call, validates it (the meta rules always; the value rules on the
// host for every index tensor that carries a host copy of its values) and refuses a rejected call
// with the violations before any launch: a refused call touches no memory. An accepted call is
// lowered to its params struct and launched on the given stream. The launch path never
// synchronises the device, so it can be captured in a CUDA graph once the entry point is prepared
// for its head dims, dtypes and device: by prepare() or by one uncaptured call with at least one
// row (that loads the kernels, grants decode its shared memory and, for prefill, creates the
// workspace pool: steps CUDA may refuse during a capture). A call made under capture before that
// is refused as unsupported, naming prepare(), before anything is captured.
//
// Only prefill needs memory of its own (the chunk operands between its two kernels):
// prefill_workspace_bytes() says how much. The caller may pass it (LaunchOptions::workspace), so
// that its allocator owns and accounts for it; otherwise prefill takes it stream-ordered from a
// per-device pool of the library's and frees it on the stream after its kernels (under capture
// that becomes the graph's own allocation; the pool keeps what it has handed out).
//
// Value rules whose values live only on the device are checked there, with the host validators'
// own row functions (contracts/row_rules.h): decode and commit judge each row in their kernel's
// prologue, before its first access (no extra launch); verify and prefill run a guard kernel
// before their main kernels on the same stream. That needs a DeviceGuard from the caller: an
// error word, into which the bit value_checks::rule_bit(rule) of every rule that fired is OR-ed,
// and, for verify and prefill, one int32 of scratch per row. A rejected row is skipped entirely (no
// output, no state read or written); the other rows run normally. The kernels also re-check, on
// their own row, every index they dereference, so no index value can send them outside the
// buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kdaguard/contracts/call.h"
#include "kdaguard/contracts/rules.h"
#include "kdaguard/contracts/value_checks.h"
#include "kdaguard/status.h"

namespace kdaguard::gpu {

struct DeviceGuard {
  // Device memory, one 64-bit word; the kernels only OR bits into it (the caller clears it).
  unsigned long long* error_word = nullptr;
  // Device memory, row_flags_capacity int32 entries; the guard kernel's per-row verdicts for
  // verify and prefill, one entry per row (N). Decode and commit do not use it.
  std::int32_t* row_flags = nullptr;
  std::int64_t row_flags_capacity = 0;
};

// Device memory for prefill's chunk operands, owned by the caller: at least
// prefill_workspace_bytes() bytes, 16-byte aligned, not used by anything else until the stream
// has run past the call. Only prefill uses it; the other entry points ignore it.
struct Workspace {
  void* data = nullptr;
  std::int64_t bytes = 0;
};

struct LaunchOptions {
  cudaStream_t stream = nullptr;
  DeviceGuard guard;
  Workspace workspace;  // prefill; empty: the library's pool lends it
  // Tuning: chunks of state rows (64 bytes per thread each) that every decode warp or verify
  // block walks, with the next chunk's loads in flight; 0 chooses (decode: about 8 per warp, or
  // equal shares over the resident grid when the batch is smaller; verify: from the grid size).
  // Results are identical for every choice.
  int chunks_per_block = 0;
};

// Whether the call can run here, without launching anything: the contracts accept it, the call is
// for the current CUDA device, and that device is a compute capability 9.0 GPU. A refusal carries
// the verdict (rejected) or the reason (unsupported).
Status can_implement(const DecodeCall& call);
Status can_implement(const PrefillCall& call);
Status can_implement(const VerifyCall& call);
Status can_implement(const CommitCall& call);
Status can_implement(const RecordVerifyCall& call);
Status can_implement(const ReplayCommitCall& call);
Status can_implement(const AcceptVerifyCall& call);

// Bytes of workspace a prefill of total_tokens tokens in num_seqs sequences needs at these dims
// and input dtype: 0 for f32 inputs (their kernel needs none) and for an empty call, -1 for dims
// or a dtype the kernels do not run, or a size past int64. It includes room for the split chain
// the call may choose (about 14% over the chunk operands at K = V = 128), so a caller's workspace
// runs the same kernels as the library's pool. Non-decreasing in total_tokens and num_seqs, so a
// workspace sized for the largest call an engine makes serves every smaller one.
std::int64_t prefill_workspace_bytes(std::int64_t total_tokens, std::int64_t num_seqs,
                                     std::int32_t HV, std::int32_t K, std::int32_t V,
                                     DType io_dtype);

// Readies entry point `entry` for calls with these head dims, q/k/v dtype and state dtype on
// `device`, so that the next such call may be captured in a CUDA graph: it runs one small call of
// that shape (with its guard kernel) on a stream of its own, waits for it and frees what it used.
// Not capturable itself; calling it again is cheap (nothing runs once prepared).
Status prepare(Entry entry, std::int32_t K, std::int32_t V, DType io_dtype, DType state_dtype,
               Device device);
// Whether such calls may be captured now (prepare() or an uncaptured call has run).
bool prepared(Entry entry, std::int32_t K, std::int32_t V, DType io_dtype, DType state_dtype,
              Device device);

// One token per request; state slot cache_indices[b] is updated in place; -1 rows get zero
// outputs and no state access.
Status decode(const DecodeCall& call, const LaunchOptions& options = {});
// Varlen chunked prefill: sequence n owns tokens [cu_seqlens[n], cu_seqlens[n+1]); its state is
// read from slot initial_state_indices[n] and the final state written back there in place; v is
// never written. bf16/f16 inputs run on the tensor cores, f32 inputs on an f32 per-token kernel.
// The guard needs one row flag per sequence.
Status prefill(const PrefillCall& call, const LaunchOptions& options = {});
// N rows of up to T tokens from the committed state (read only); the state after step t of row n
// goes to its scratch slot. Padding rows get zero outputs and write no scratch.
Status verify(const VerifyCall& call, const LaunchOptions& options = {});
// The state after row n's last accepted step is copied into slot cache_indices[n]; rows that
// accepted nothing, and padding rows, are left alone.
Status commit(const CommitCall& call, const LaunchOptions& options = {});

// The record-based speculative path (contracts/NOTES.md). Every kernel judges its own rows in its
// prologue, so the guard needs an error word only (no row flags).
// record_verify: verify's outputs from the committed state (read only), writing per (row, step,
// value head) the record g | k | u to records[n, t, hv] instead of the state; padding rows get
// zero outputs and write no records.
Status record_verify(const RecordVerifyCall& call, const LaunchOptions& options = {});
// replay_commit: slot cache_indices[n] gets row n's first accepted[n] records replayed onto it,
// read once and written once; rows that accepted nothing, and padding rows, are left alone.
Status replay_commit(const ReplayCommitCall& call, const LaunchOptions& options = {});
// accept_verify: replays prior_records[n, 0..prior_accepted[n]) onto slot cache_indices[n], writes
// it back in place when that count is > 0, then record-verifies the new draft from it: one read
// and one write of the state per row whatever T.
Status accept_verify(const AcceptVerifyCall& call, const LaunchOptions& options = {});

// The rules whose bits are set in an error word read back from a DeviceGuard, in catalogue order.
inline std::vector<RuleId> rules_in(std::uint64_t error_word) {
  std::vector<RuleId> fired;
  for (const RuleInfo& info : rule_catalogue())
    if (error_word & value_checks::rule_bit(info.rule)) fired.push_back(info.rule);
  return fired;
}

}  // namespace kdaguard::gpu
