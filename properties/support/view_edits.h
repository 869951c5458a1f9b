// The edits of a generated call's views that both mutation tables make (mutations.cpp for the
// decode/prefill/verify/commit calls, record_mutations.cpp for the record-based ones): reaching a
// view, the texts a violation quotes about it, and the mutations that break an argument or state
// pool rule the same way whatever the entry point. `Generated` is GeneratedCall or
// GeneratedRecordCall: a catalogue call (`call`) and the texts its violation must quote
// (`message_texts`).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gen_calls.h"

namespace kdaguard::support::view_edits {

// An address far from every buffer build_call places (those sit at kFakeAddressBase + i * 4 GiB
// for small i), for buffers a mutation moves.
inline constexpr std::uint64_t kMovedAddress = kFakeAddressBase + 4096 * kFakeAddressPitch;

std::string shape_text(const TensorView& t);
std::string stride_text(const TensorView& t);
// The address of the view's first element, and its first and one-past-last byte as
// alias.overlap quotes them.
std::uint64_t data_address(const TensorView& t);
std::string byte_range_text(const TensorView& t);

// Moves a view into an allocation of its own with compact row-major strides, no size known.
void detach_compact(TensorView& t);

// A device other than d.
Device other_device(Device d);

template <class Generated> OptionalView& slot(Generated& g, Arg a) {
  OptionalView* v = find_argument(g.call, a);
  if (v == nullptr) throw std::logic_error("mutation: entry point has no such argument");
  return *v;
}

template <class Generated> TensorView& present(Generated& g, Arg a) {
  OptionalView& v = slot(g, a);
  if (!v) throw std::logic_error("mutation: argument absent in the generated call");
  return *v;
}

// The views present in the call.
template <class Generated> std::vector<Arg> present_args(const Generated& g) {
  std::vector<Arg> args;
  for_each_argument(g.call, [&](Arg a, const OptionalView& v) {
    if (v) args.push_back(a);
  });
  return args;
}

// What the violation of the mutation's rule must say.
template <class Generated, class... Args>
void expect(Generated& g, fmt::format_string<Args...> text, Args&&... args) {
  g.message_texts.push_back(fmt::format(text, std::forward<Args>(args)...));
}

// ---- mutations of any present argument -----------------------------------------------------------

// arg.device
template <class Generated> void other_device_argument(Generated& g, Chooser& c) {
  const auto args = present_args(g);
  const Arg a = c.element(std::span<const Arg>(args));
  const Device call_device = device_of(g.call);
  present(g, a).device = other_device(call_device);
  expect(g, "{} is on {}; the call runs on {}", arg_name(a), device_name(*present(g, a).device),
         device_name(call_device));
}

// arg.stride: one positive stride made negative.
template <class Generated> void negative_stride(Generated& g, Chooser& c) {
  std::vector<std::pair<Arg, int>> candidates;  // (argument, dim) with a positive stride
  for (Arg a : present_args(g)) {
    const TensorView& t = present(g, a);
    for (int d = 0; d < t.rank; ++d)
      if (t.stride[d] > 0) candidates.emplace_back(a, d);
  }
  const auto [arg, dim] = c.element(std::span<const std::pair<Arg, int>>(candidates));
  TensorView& t = present(g, arg);
  // Element [0..0] moves to the far end, so every element stays inside the allocation.
  t.storage_offset.count += std::max<std::int64_t>(t.shape[dim] - 1, 0) * t.stride[dim];
  t.stride[dim] = -t.stride[dim];
  expect(g, "{} has a negative stride {} in dim {}; strides {}", arg_name(arg), t.stride[dim], dim,
         stride_text(t));
}

// arg.extent: an allocation one element short of a non-empty view.
template <class Generated> void storage_one_short(Generated& g, Chooser& c) {
  std::vector<Arg> candidates;
  for (Arg a : present_args(g))
    if (present(g, a).numel() > 0) candidates.push_back(a);
  const Arg a = c.element(std::span<const Arg>(candidates));
  TensorView& t = present(g, a);
  std::int64_t last = t.storage_offset.count;
  for (int d = 0; d < t.rank; ++d) last += (t.shape[d] - 1) * t.stride[d];
  t.storage_size = Elements{last};  // element `last` is the one past the end
  expect(g, "{} reaches element {} of its allocation, which holds {} elements (shape {}, strides {}, "
         "storage_offset {})", arg_name(a), last, last, shape_text(t), stride_text(t),
         t.storage_offset.count);
}

// arg.extent: a storage offset near INT64_MAX.
template <class Generated> void offset_overflows(Generated& g, Chooser& c) {
  const auto args = present_args(g);
  const Arg a = c.element(std::span<const Arg>(args));
  TensorView& t = present(g, a);
  t.storage_offset = Elements{std::numeric_limits<std::int64_t>::max() - c.pick(0, 3)};
  expect(g, "{} reaches past 64-bit arithmetic: shape {}, strides {}, storage_offset {}", arg_name(a),
         shape_text(t), stride_text(t), t.storage_offset.count);
}

// ---- the state.* layout rules on one pool -------------------------------------------------------

// A state pool ([S, HV, V, K]) or verify's scratch ([N, T, HV, V, K]): its HV dim is `inner`,
// its slot (scratch: step) dim inner - 1; `name` is what the violations call it.
struct Pool {
  TensorView& view;
  int inner;
  std::string_view name;
};

// Each breaks one rule of the pool and appends what its violation must say to `texts`.
void pad_pool_heads(Pool pool, Chooser& c, std::vector<std::string>& texts);       // state.inner_strides
void misalign_slot_stride(Pool pool, Chooser& c, std::vector<std::string>& texts); // state.slot_stride_align
void misalign_pool_base(Pool pool, Chooser& c, std::vector<std::string>& texts);   // state.base_align
void overlap_pool_slots(Pool pool, Chooser& c, std::vector<std::string>& texts);   // state.slot_stride_min

}  // namespace kdaguard::support::view_edits
