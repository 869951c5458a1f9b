// The rule ids contracts.md defines. They are a public interface, never renamed or dropped, so the
// list only grows; the catalogue may hold more. Shared by the catalogue test and the CLI's `rules`
// tests, so a new spec id is added in one place.
#pragma once

#include <array>
#include <string_view>

namespace kdaguard {

inline constexpr std::array<std::string_view, 39> kSpecRuleIds = {
    "arg.missing", "arg.rank", "arg.shape", "arg.dtype", "arg.device", "arg.last_dim_contiguous",
    "arg.stride", "arg.extent", "arg.alignment", "alias.overlap", "dims.heads", "dims.head_dim",
    "scalar.scale", "scalar.lower_bound", "gate.params", "gate.cover_tokens", "state.rank",
    "state.inner_strides", "state.slot_stride_align", "state.base_align", "state.slot_stride_min",
    "state.empty", "index.length", "index.range", "index.unique", "index.padding",
    "seqlens.start", "seqlens.monotone", "seqlens.total", "decode.one_token",
    "prefill.indexed_pool", "verify.draft_tokens", "verify.scratch_steps",
    "verify.scratch_layout", "verify.scratch_rows", "verify.row_length",
    "verify.row_map_identity", "verify.scratch_indices", "commit.accepted"};

}  // namespace kdaguard
