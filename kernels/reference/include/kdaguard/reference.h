// The CPU reference backend: what every kernel is judged against (kda-math.md).
//
// The four entry points validate the call first and refuse a rejected call without touching any
// memory; they read and write host buffers through the same tensor views the contracts check
// (device "cpu"), so strided views, padded pools and packed projections all go through it.
// Index tensors are read back from memory and validated by value before anything is computed.
//
// Arithmetic is f64 throughout: inputs are read exactly, every result is rounded once (nearest
// even) into its storage dtype. decode and verify carry the state through its storage dtype after
// every token, so verify with T tokens equals T decodes bit for bit; prefill carries it in f64 and
// rounds it once at the end of each sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kdaguard/contracts/call.h"
#include "kdaguard/params.h"
#include "kdaguard/status.h"

namespace kdaguard::reference {

// ---- the entry points, per-token f64 ----
Status decode(const DecodeCall& call);
Status prefill(const PrefillCall& call);
Status verify(const VerifyCall& call);
Status commit(const CommitCall& call);
Status run(const AnyCall& call);

// ---- the record-based speculative path (contracts/NOTES.md), per-token f64 ----
// record_verify: verify's outputs, bit for bit, and per (row, step, value head) the record
// (g, k, u) rounded once into f32; the committed pool is not written.
Status record_verify(const RecordVerifyCall& call);
// replay_commit: slot cache_indices[n] <- its state with records[n, 0..accepted[n]) replayed,
// S <- S diag(exp(g)) + u k^T, carried through the state's dtype after every step as verify does.
Status replay_commit(const ReplayCommitCall& call);
// accept_verify: replay_commit of prior_records / prior_accepted in place, then record_verify.
Status accept_verify(const AcceptVerifyCall& call);
// Any entry point of the catalogue (run() takes AnyCall's four).
Status run_catalogue(const CatalogueCall& call);

// ---- prefill results before they are rounded into storage ----
struct PrefillValues {
  std::int64_t total_tokens = 0, num_seqs = 0;
  std::int32_t HV = 0, V = 0, K = 0;
  std::vector<double> out;          // [T_tot, HV, V]
  std::vector<double> final_state;  // [N, HV, V, K], the pool's layout; a sequence of length 0
                                    // keeps its initial state
};
struct PrefillResult {
  Status status;         // when not ok, values is empty and nothing was computed
  PrefillValues values;
};

// The per-token f64 recurrence; reads the call's buffers, writes nothing.
PrefillResult prefill_values(const PrefillCall& call);

// ---- the chunked form (kda-math.md "Chunked form"), the design the GPU prefill follows ----
enum class ChunkInverse : std::uint8_t {
  forward_substitution,  // T = (I + L)^-1 row by row; any chunk size
  neumann_product,       // T = (I - L)(I + L^2)(I + L^4)(I + L^8); chunks of at most 16 tokens
};
// How an exponent over the tokens (j, i] of a chunk is formed. Both are sums of gates <= 0,
// never factorised around a pivot, so every exponent is <= 0.
enum class ChunkExponents : std::uint8_t {
  // The gates between the two tokens summed directly (running sums per pair, suffix sums for
  // G_C - G_i): no cancellation, accurate in f32 whatever the decays.
  gate_sums,
  // G_i - G_j from the in-chunk cumulative sums, as kda-math.md writes it. In f32 this cancels:
  // after a decay of -1000 (or 64 tokens at -5) G is large and G_i - G_j loses |G| * 2^-24 of
  // absolute accuracy, a relative error of that size in exp(G_i - G_j).
  cumsum_differences,
};
struct ChunkOptions {
  int chunk = 64;  // tokens per chunk, >= 1 (16 and 64 are the designs in use)
  ChunkInverse inverse = ChunkInverse::forward_substitution;
  ChunkExponents exponents = ChunkExponents::gate_sums;
};

// Every step of the chunked form in `Real` (float or double): inputs converted to Real, gates,
// norms, products, exponentials and the state carried across chunks all in Real. Exponents are
// formed per pair (never factorised around a pivot), so they are all <= 0.
// Writes nothing; an unsupported option (neumann_product with chunk > 16, chunk < 1) is refused
// with StatusCode::unsupported.
template <class Real>
PrefillResult prefill_chunked_values(const PrefillCall& call, ChunkOptions options);
// The same, with results rounded into out and the pool like prefill().
template <class Real>
Status prefill_chunked(const PrefillCall& call, ChunkOptions options);

extern template PrefillResult prefill_chunked_values<float>(const PrefillCall&, ChunkOptions);
extern template PrefillResult prefill_chunked_values<double>(const PrefillCall&, ChunkOptions);
extern template Status prefill_chunked<float>(const PrefillCall&, ChunkOptions);
extern template Status prefill_chunked<double>(const PrefillCall&, ChunkOptions);

// ---- admission, shared by every CPU entry point ----
// validate(call) as given; then, for a call on the CPU, the host copies of its index tensors
// refilled from memory and validated again, so value rules are always checked. Memory is read
// only after the meta rules passed. Returns ok, rejected (with the verdict) or unsupported (a
// call whose buffers are not on the CPU).
Status admit(const DecodeCall& call);
Status admit(const PrefillCall& call);
Status admit(const VerifyCall& call);
Status admit(const CommitCall& call);
Status admit(const RecordVerifyCall& call);
Status admit(const ReplayCommitCall& call);
Status admit(const AcceptVerifyCall& call);

// ---- the error metric every conformance check uses ----
// rms(actual - expected) / rms(expected), passing outright when the largest absolute error is
// <= 1e-6; a NaN or infinity on either side, or a length mismatch, never passes.
struct ErrorStats {
  double rms_ratio = 0.0;
  double max_abs = 0.0;
  std::size_t count = 0;
  bool comparable = true;  // same length, everything finite

  static constexpr double kAbsolutePass = 1e-6;
  bool pass(double tolerance) const {
    return comparable && (max_abs <= kAbsolutePass || rms_ratio <= tolerance);
  }
  std::string to_string() const;
};
ErrorStats compare(std::span<const double> actual, std::span<const double> expected);

}  // namespace kdaguard::reference
