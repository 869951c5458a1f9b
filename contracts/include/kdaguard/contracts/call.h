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

using AnyCall = std::variant<DecodeCall, PrefillCall, VerifyCall, CommitCall>;

Entry entry_of(const AnyCall& call);

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

// The argument slot named `arg` in `call`, or nullptr when the entry point has no such argument.
OptionalView* find_argument(AnyCall& call, Arg arg);
const OptionalView* find_argument(const AnyCall& call, Arg arg);
// Whether entry point `e` takes argument `arg`.
bool entry_takes(Entry e, Arg arg);

const Scalars& scalars_of(const AnyCall& call);
Scalars& scalars_of(AnyCall& call);
Device device_of(const AnyCall& call);
AnyCall make_call(Entry e);  // an empty call of that entry point

}  // namespace kdaguard
