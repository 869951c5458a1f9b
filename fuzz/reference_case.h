// How fuzz_reference turns its choices into a problem (shared with the seed writer): a small
// valid CallPlan of prefill, verify or commit, the seed of its random data, and for prefill
// the chunked form to compare. Every choice is made here, before any work. fuzz_gpu draws its
// specs with the same code (draw_spec_for, larger limits, decode too).
#pragma once

#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "gen_calls.h"
#include "kdaguard/reference.h"
#include "problem.h"

namespace kdaguard::support {

struct ReferenceCase {
  CallPlan plan;
  std::uint64_t data_seed = 0;
  reference::ChunkOptions chunk;  // prefill: the chunked form compared with the per-token one
};

namespace reference_case_detail {

using i64 = std::int64_t;

// The first `count` entries of a permutation of [0, n) (identity when the picks are simplest).
inline std::vector<i64> injection(i64 count, i64 n, Chooser& c) {
  std::vector<i64> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), i64{0});
  for (i64 i = 0; i < count && i < n; ++i) std::swap(all[i], all[c.pick(i, n - 1)]);
  all.resize(static_cast<std::size_t>(std::min(count, n)));
  return all;
}

// How large drawn problems get: fuzz_reference's defaults keep the f64 checks cheap; fuzz_gpu
// draws past the kernels' batch and chunk edges (verify's 8-token step batch, prefill's 64-token
// chunks) and runs decode.
struct SpecLimits {
  std::span<const i64> prefill_lengths;  // lengths drawn as specials half the time
  i64 max_prefill_length = 24;           // the other half: 0..max
  i64 max_rows = 3;                      // prefill, verify, commit
  i64 max_decode_rows = 1;               // decode batch
  i64 max_draft_tokens = 5;
};

inline constexpr i64 kReferenceLengths[] = {0, 1, 15, 16, 17, 31, 32, 33};

// A valid spec of entry point `entry`.
inline CallPlan draw_spec_for(Entry entry, Chooser& c, const SpecLimits& limits) {
  CallPlan s;
  s.entry = entry;
  s.K = c.one_in(4) ? 128 : 64;
  s.V = c.one_in(4) ? 128 : 64;
  s.H = c.pick(1, 2);
  s.HV = s.H * (c.coin() ? 2 : 1);
  static constexpr DType kIo[] = {DType::f32, DType::bf16, DType::f16};
  s.io_dtype = c.element(kIo);
  s.state_dtype = c.coin() ? DType::bf16 : DType::f32;
  static constexpr GateKind kGates[] = {GateKind::softplus, GateKind::bounded, GateKind::activated};
  const GateKind gate = c.element(kGates);
  s.gate_dtype = gate == GateKind::activated && c.coin() ? DType::f32 : s.io_dtype;
  s.beta_logits = !c.coin();
  s.beta_dtype = c.coin() ? s.io_dtype : DType::f32;
  s.use_qk_l2norm = c.coin();
  static constexpr double kScales[] = {0.0, 1.0, 0.5, 0.1};
  const double scale = c.element(kScales);
  if (scale > 0) s.scale = scale;
  static constexpr double kBounds[] = {-5.0, -3.0, -1.0, -0.25};
  s.set_gate_kind(gate, c.element(kBounds));
  s.dt_bias = c.coin();
  static constexpr double kStrong[] = {0.0, 0.05, 0.5};
  s.strong_decay_fraction = c.element(kStrong);
  static constexpr i64 kSlotPads[] = {0, 1, 3};  // 16-element units, the pool's and the scratch's
  s.slot_pad = s.step_pad = c.element(kSlotPads);
  s.pool_offset = c.pick(0, 3);
  s.packed_qkv = c.coin();
  s.row_pad = c.pick(0, 2);
  s.set_all_values(c.coin());

  if (s.entry == Entry::decode) {
    const i64 B = c.pick(1, limits.max_decode_rows);
    s.row_lengths.assign(static_cast<std::size_t>(B), 1);
    s.slots = B + c.pick(0, 2);
    s.slot_of_row = injection(B, s.slots, c);
    for (auto& slot : s.slot_of_row)
      if (c.one_in(4)) slot = -1;
    s.cu_seqlens = c.coin();
    return s;
  }
  const i64 n = c.pick(1, limits.max_rows);
  if (s.entry == Entry::prefill) {
    for (i64 r = 0; r < n; ++r)
      s.row_lengths.push_back(c.coin() ? c.element(limits.prefill_lengths)
                                    : c.pick(0, limits.max_prefill_length));
    s.slots = n + c.pick(0, 2);
    s.slot_of_row = injection(n, s.slots, c);
    s.cu_dtype = c.coin() ? DType::i64 : DType::i32;
    s.extra_token_rows = c.pick(0, 2);
    return s;
  }
  s.T = c.pick(1, limits.max_draft_tokens);
  const i64 T = s.T;
  s.T_alloc = T + c.pick(0, 2);
  for (i64 r = 0; r < n; ++r) s.row_lengths.push_back(c.pick(0, T));
  s.slots = n + c.pick(0, 2);
  s.slot_of_row = injection(n, s.slots, c);
  for (auto& slot : s.slot_of_row)
    if (c.one_in(4)) slot = -1;
  s.extra_index_entries = c.pick(0, 2);
  s.S_spec = n + s.extra_index_entries + c.pick(0, 2);
  if (c.coin()) {
    std::vector<i64> flat = injection(n * T, s.S_spec * s.T_alloc, c);
    for (auto& f : flat)
      if (c.one_in(6)) f = -1;
    s.explicit_scratch_indices = true;
    s.scratch_indices = flat;
    s.row_map = c.coin();
  }
  for (i64 r = 0; r < n; ++r) {
    i64 a = c.pick(0, s.row_lengths[r]);
    while (a > 0 && s.scratch_slot(r, a - 1) < 0) --a;
    s.accepted.push_back(a);
  }
  s.cu_seqlens = c.coin();
  return s;
}

// fuzz_reference's spec: prefill, verify or commit at the default limits.
inline CallPlan draw_spec(Chooser& c) {
  static constexpr Entry kEntries[] = {Entry::prefill, Entry::verify, Entry::commit};
  const Entry entry = c.element(kEntries);
  return draw_spec_for(entry, c, SpecLimits{.prefill_lengths = kReferenceLengths});
}

}  // namespace reference_case_detail

inline ReferenceCase draw_reference_case(Chooser& c) {
  ReferenceCase rc{reference_case_detail::draw_spec(c), 0, {}};
  rc.data_seed = static_cast<std::uint64_t>(c.pick(0, std::int64_t{1} << 30));
  static constexpr int kChunks[] = {1, 3, 16, 64};
  rc.chunk = {c.element(kChunks), reference::ChunkInverse::forward_substitution};
  if (rc.chunk.chunk <= 16 && c.coin()) rc.chunk.inverse = reference::ChunkInverse::neumann_product;
  return rc;
}

}  // namespace kdaguard::support
