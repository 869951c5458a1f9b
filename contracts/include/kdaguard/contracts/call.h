// One call type per entry point (contracts.md), each a set of named tensor arguments plus
// scalars. A serving engine fills these directly; `kdaguard check` builds them from JSON.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <variant>

#include "kdaguard/contracts/rules.h"
#include "kdaguard/contracts/tensor_view.h"

namespace kdaguard {

// Arg, every tensor argument name of contracts.md, is in rules.h.
std::string_view arg_name(Arg a);
std::optional<Arg> arg_from_name(std::string_view name);

struct Scalars {
  std::optional<double> scale;            // default K^-0.5
  std::optional<double> lower_bound;      // absent: the unbounded softplus gate
  bool use_qk_l2norm = false;
  std::optional<std::int64_t> draft_token_num;  // T, verify and commit
};

using OptionalView = std::optional<TensorView>;

// Each call type lists its arguments once, in `visit`, so generic code (JSON, generators,
// mutations, the bounds oracle) can walk them without knowing the entry point.
struct DecodeCall {
  static constexpr Entry kEntry = Entry::decode;
  Device device;
  OptionalView q, k, v, a, g, A_log, dt_bias, b, beta, state, cache_indices, cu_seqlens, out;
  Scalars scalars;

  template <class Self, class F> static void visit(Self& c, F&& f) {
    f(Arg::q, c.q); f(Arg::k, c.k); f(Arg::v, c.v); f(Arg::a, c.a); f(Arg::g, c.g);
    f(Arg::A_log, c.A_log); f(Arg::dt_bias, c.dt_bias); f(Arg::b, c.b); f(Arg::beta, c.beta);
    f(Arg::state, c.state); f(Arg::cache_indices, c.cache_indices);
    f(Arg::cu_seqlens, c.cu_seqlens); f(Arg::out, c.out);
  }
};

struct PrefillCall {
  static constexpr Entry kEntry = Entry::prefill;
  Device device;
  OptionalView q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, initial_state,
      initial_state_indices, out;
  Scalars scalars;

  template <class Self, class F> static void visit(Self& c, F&& f) {
    f(Arg::q, c.q); f(Arg::k, c.k); f(Arg::v, c.v); f(Arg::a, c.a); f(Arg::g, c.g);
    f(Arg::A_log, c.A_log); f(Arg::dt_bias, c.dt_bias); f(Arg::b, c.b); f(Arg::beta, c.beta);
    f(Arg::cu_seqlens, c.cu_seqlens); f(Arg::initial_state, c.initial_state);
    f(Arg::initial_state_indices, c.initial_state_indices); f(Arg::out, c.out);
  }
};

struct VerifyCall {
  static constexpr Entry kEntry = Entry::verify;
  Device device;
  OptionalView q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, state, cache_indices, scratch,
      scratch_row_map, scratch_indices, out;
  Scalars scalars;

  template <class Self, class F> static void visit(Self& c, F&& f) {
    f(Arg::q, c.q); f(Arg::k, c.k); f(Arg::v, c.v); f(Arg::a, c.a); f(Arg::g, c.g);
    f(Arg::A_log, c.A_log); f(Arg::dt_bias, c.dt_bias); f(Arg::b, c.b); f(Arg::beta, c.beta);
    f(Arg::cu_seqlens, c.cu_seqlens); f(Arg::state, c.state);
    f(Arg::cache_indices, c.cache_indices); f(Arg::scratch, c.scratch);
    f(Arg::scratch_row_map, c.scratch_row_map); f(Arg::scratch_indices, c.scratch_indices);
    f(Arg::out, c.out);
  }
};

// Commit keeps the accepted prefix of a verify. cu_seqlens is optional here: when given,
// an accepted count past its row's length is refused (commit.accepted).
struct CommitCall {
  static constexpr Entry kEntry = Entry::commit;
  Device device;
  OptionalView scratch, scratch_row_map, scratch_indices, state, cache_indices, accepted,
      cu_seqlens;
  Scalars scalars;

  template <class Self, class F> static void visit(Self& c, F&& f) {
    f(Arg::scratch, c.scratch); f(Arg::scratch_row_map, c.scratch_row_map);
    f(Arg::scratch_indices, c.scratch_indices); f(Arg::state, c.state);
    f(Arg::cache_indices, c.cache_indices); f(Arg::accepted, c.accepted);
    f(Arg::cu_seqlens, c.cu_seqlens);
  }
};

// The record-based speculative path (design: contracts/NOTES.md). A record is what one step of
// the delta rule needs to be replayed: per (row, step, value head) the activated gate g [K], the
// key k as the recurrence used it (normed when use_qk_l2norm) [K] and the prediction error on the
// decayed state u = beta (v - S k) [V], packed in that order along the last dim of an f32 buffer
// records [S_rec, T_alloc, HV, 2K+V]. Row n of a call owns records[n].

// record_verify: verify's inputs and outputs, with records in place of the scratch states. The
// committed state is read only; padding rows (cache index -1) get zero outputs and no records.
struct RecordVerifyCall {
  static constexpr Entry kEntry = Entry::record_verify;
  Device device;
  OptionalView q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, state, cache_indices, records,
      out;
  Scalars scalars;

  template <class Self, class F> static void visit(Self& c, F&& f) {
    f(Arg::q, c.q); f(Arg::k, c.k); f(Arg::v, c.v); f(Arg::a, c.a); f(Arg::g, c.g);
    f(Arg::A_log, c.A_log); f(Arg::dt_bias, c.dt_bias); f(Arg::b, c.b); f(Arg::beta, c.beta);
    f(Arg::cu_seqlens, c.cu_seqlens); f(Arg::state, c.state);
    f(Arg::cache_indices, c.cache_indices); f(Arg::records, c.records); f(Arg::out, c.out);
  }
};

// replay_commit: slot cache_indices[n] gets its state with row n's first accepted[n] records
// replayed onto it; 0 accepted, and padding rows, leave the slot untouched. cu_seqlens is
// optional, as for commit.
struct ReplayCommitCall {
  static constexpr Entry kEntry = Entry::replay_commit;
  Device device;
  OptionalView records, state, cache_indices, accepted, cu_seqlens;
  Scalars scalars;

  template <class Self, class F> static void visit(Self& c, F&& f) {
    f(Arg::records, c.records); f(Arg::state, c.state); f(Arg::cache_indices, c.cache_indices);
    f(Arg::accepted, c.accepted); f(Arg::cu_seqlens, c.cu_seqlens);
  }
};

// accept_verify, the fused form: row n first replays prior_accepted[n] steps of prior_records[n]
// (the previous step's records) onto slot cache_indices[n] and writes it back in place, then
// verifies its new draft from it like record_verify, into records. One read and one write of the
// state per row, whatever T.
struct AcceptVerifyCall {
  static constexpr Entry kEntry = Entry::accept_verify;
  Device device;
  OptionalView q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, state, cache_indices,
      prior_records, prior_accepted, records, out;
  Scalars scalars;

  template <class Self, class F> static void visit(Self& c, F&& f) {
    f(Arg::q, c.q); f(Arg::k, c.k); f(Arg::v, c.v); f(Arg::a, c.a); f(Arg::g, c.g);
    f(Arg::A_log, c.A_log); f(Arg::dt_bias, c.dt_bias); f(Arg::b, c.b); f(Arg::beta, c.beta);
    f(Arg::cu_seqlens, c.cu_seqlens); f(Arg::state, c.state);
    f(Arg::cache_indices, c.cache_indices); f(Arg::prior_records, c.prior_records);
    f(Arg::prior_accepted, c.prior_accepted); f(Arg::records, c.records); f(Arg::out, c.out);
  }
};

// The four entry points both backends run.
using AnyCall = std::variant<DecodeCall, PrefillCall, VerifyCall, CommitCall>;
// Every entry point of the catalogue: AnyCall's four and the record-based path. Descriptions,
// `kdaguard check` and the validators take this one.
using CatalogueCall = std::variant<DecodeCall, PrefillCall, VerifyCall, CommitCall,
                                   RecordVerifyCall, ReplayCommitCall, AcceptVerifyCall>;
CatalogueCall widen(const AnyCall& call);
// The call as an AnyCall, when its entry point is one of AnyCall's four.
std::optional<AnyCall> narrow(const CatalogueCall& call);

Entry entry_of(const AnyCall& call);
Entry entry_of(const CatalogueCall& call);

// Calls f(Arg, OptionalView&) for every argument slot of the call's entry point.
template <class Call, class F> void for_each_argument(Call& call, F&& f) {
  std::remove_const_t<Call>::visit(call, f);
}
template <class F> void for_each_argument(AnyCall& call, F&& f) {
  std::visit([&](auto& c) { for_each_argument(c, f); }, call);
}
template <class F> void for_each_argument(const AnyCall& call, F&& f) {
  std::visit([&](const auto& c) { for_each_argument(c, f); }, call);
}
template <class F> void for_each_argument(CatalogueCall& call, F&& f) {
  std::visit([&](auto& c) { for_each_argument(c, f); }, call);
}
template <class F> void for_each_argument(const CatalogueCall& call, F&& f) {
  std::visit([&](const auto& c) { for_each_argument(c, f); }, call);
}

// The argument slot named `arg` in `call`, or nullptr when the entry point has no such argument.
OptionalView* find_argument(AnyCall& call, Arg arg);
const OptionalView* find_argument(const AnyCall& call, Arg arg);
OptionalView* find_argument(CatalogueCall& call, Arg arg);
const OptionalView* find_argument(const CatalogueCall& call, Arg arg);
// Whether entry point `e` takes argument `arg`.
bool entry_takes(Entry e, Arg arg);

const Scalars& scalars_of(const AnyCall& call);
Scalars& scalars_of(AnyCall& call);
const Scalars& scalars_of(const CatalogueCall& call);
Scalars& scalars_of(CatalogueCall& call);
Device device_of(const AnyCall& call);
Device device_of(const CatalogueCall& call);
// An empty call of entry point e. make_call takes AnyCall's four only (the record-based entry
// points give an empty decode call: callers pass a fixed entry point of theirs).
AnyCall make_call(Entry e);
CatalogueCall make_catalogue_call(Entry e);

}  // namespace kdaguard
