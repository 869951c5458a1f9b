#include "kdaguard/contracts/call.h"

#include <array>

namespace kdaguard {
namespace {

constexpr std::array<std::string_view, kArgCount> kArgNames = {
    "q",     "k",          "v",             "a",
    "g",     "A_log",      "dt_bias",       "b",
    "beta",  "state",      "cache_indices", "cu_seqlens",
    "initial_state", "initial_state_indices", "out", "scratch",
    "scratch_row_map", "scratch_indices", "accepted", "records",
    "prior_records", "prior_accepted"};

}  // namespace

std::string_view arg_name(Arg a) { return kArgNames[static_cast<std::size_t>(a)]; }

std::optional<Arg> arg_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kArgNames.size(); ++i)
    if (kArgNames[i] == name) return static_cast<Arg>(i);
  return std::nullopt;
}

namespace {

template <class Variant>
Entry entry_of_variant(const Variant& call) {
  return std::visit([](const auto& c) { return std::decay_t<decltype(c)>::kEntry; }, call);
}

template <class Variant>
OptionalView* find_in(Variant& call, Arg arg) {
  OptionalView* found = nullptr;
  for_each_argument(call, [&](Arg a, OptionalView& view) {
    if (a == arg) found = &view;
  });
  return found;
}

template <class Variant>
const OptionalView* find_in(const Variant& call, Arg arg) {
  const OptionalView* found = nullptr;
  for_each_argument(call, [&](Arg a, const OptionalView& view) {
    if (a == arg) found = &view;
  });
  return found;
}

}  // namespace

CatalogueCall widen(const AnyCall& call) {
  return std::visit([](const auto& c) -> CatalogueCall { return c; }, call);
}

std::optional<AnyCall> narrow(const CatalogueCall& call) {
  return std::visit(
      [](const auto& c) -> std::optional<AnyCall> {
        if constexpr (std::is_constructible_v<AnyCall, decltype(c)>) return AnyCall(c);
        else return std::nullopt;
      },
      call);
}

Entry entry_of(const AnyCall& call) { return entry_of_variant(call); }
Entry entry_of(const CatalogueCall& call) { return entry_of_variant(call); }

OptionalView* find_argument(AnyCall& call, Arg arg) { return find_in(call, arg); }
const OptionalView* find_argument(const AnyCall& call, Arg arg) { return find_in(call, arg); }
OptionalView* find_argument(CatalogueCall& call, Arg arg) { return find_in(call, arg); }
const OptionalView* find_argument(const CatalogueCall& call, Arg arg) {
  return find_in(call, arg);
}

bool entry_takes(Entry e, Arg arg) {
  const CatalogueCall call = make_catalogue_call(e);
  return find_argument(call, arg) != nullptr;
}

const Scalars& scalars_of(const AnyCall& call) {
  return std::visit([](const auto& c) -> const Scalars& { return c.scalars; }, call);
}
Scalars& scalars_of(AnyCall& call) {
  return std::visit([](auto& c) -> Scalars& { return c.scalars; }, call);
}
const Scalars& scalars_of(const CatalogueCall& call) {
  return std::visit([](const auto& c) -> const Scalars& { return c.scalars; }, call);
}
Scalars& scalars_of(CatalogueCall& call) {
  return std::visit([](auto& c) -> Scalars& { return c.scalars; }, call);
}

Device device_of(const AnyCall& call) {
  return std::visit([](const auto& c) { return c.device; }, call);
}
Device device_of(const CatalogueCall& call) {
  return std::visit([](const auto& c) { return c.device; }, call);
}

AnyCall make_call(Entry e) {
  switch (e) {
    case Entry::decode: return DecodeCall{};
    case Entry::prefill: return PrefillCall{};
    case Entry::verify: return VerifyCall{};
    case Entry::commit: return CommitCall{};
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: break;
  }
  return DecodeCall{};
}

CatalogueCall make_catalogue_call(Entry e) {
  switch (e) {
    case Entry::record_verify: return RecordVerifyCall{};
    case Entry::replay_commit: return ReplayCommitCall{};
    case Entry::accept_verify: return AcceptVerifyCall{};
    default: return widen(make_call(e));
  }
}

}  // namespace kdaguard
