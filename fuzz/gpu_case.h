// How fuzz_gpu turns its input into a case (shared with the seed writer). Byte 0 picks the mode
// (its low bit); the other bytes drive every choice through FuzzChooser:
//   - conformance: a valid problem of any entry point (reference_case.h's draw_spec_for at larger
//     limits: decode batches up to 24 rows, prefill lengths around the 64-token chunks, verify
//     past its 8-token step batch), host copies of the index values present or absent;
//   - planted: the same problem without host copies, and one to three bad index values planted
//     where only the device sees them (a slot out of range, a repeated slot, a padding slot in
//     prefill, cu_seqlens out of order or not starting at 0 or not ending at T_tot, an accepted
//     count past T, a scratch index out of range or repeated, a row map that is not the
//     identity, junk in the entries past the rows).
// CUDA-free: the seed writer draws cases with it.
#pragma once

#include <climits>
#include <cstdint>
#include <vector>

#include "gen_calls.h"
#include "problem.h"
#include "reference_case.h"

namespace kdaguard::support {

enum class GpuMode : std::uint8_t { conformance = 0, planted = 1 };

enum class PlantKind : std::uint8_t {
  slot_out_of_range,     // the slot map entry of a row names no slot (or is < -1)
  slot_repeated,         // a row takes the slot another row uses
  slot_padding,          // prefill: -1, which prefill does not allow
  cu_start,              // cu_seqlens[0] != 0
  cu_order,              // an inner offset below its predecessor or above its successor
  cu_end,                // cu_seqlens[N] != T_tot (commit, which knows no T_tot: below cu[N-1])
  accepted_past_draft,   // commit: accepted outside [0, T]
  scratch_out_of_range,  // an explicit scratch index past S_spec * T_alloc (or < -1)
  scratch_repeated,      // an explicit scratch index another step uses
  row_map_permuted,      // without scratch_indices: scratch_row_map[n] != n
  junk_past_rows,        // cache_indices / scratch_row_map entries past N: never read
};

struct Plant {
  PlantKind kind;
  std::int64_t row = 0, other_row = 0, step = 0, other_step = 0;
  std::int64_t magnitude = 0;  // which bad value (bad_value()), or how far out of order
};

struct GpuCase {
  GpuMode mode = GpuMode::conformance;
  CallPlan plan;
  std::uint64_t data_seed = 0;
  int chunks_per_block = 0;  // LaunchOptions tuning; results must not depend on it
  std::vector<Plant> plants;
};

// A value outside [lo, hi) chosen by `magnitude`: just past either end, far past, the i32 limits.
inline std::int64_t bad_value(std::int64_t lo, std::int64_t hi, std::int64_t magnitude) {
  switch (magnitude % 6) {
    case 0: return hi;
    case 1: return hi + 1 + magnitude;
    case 2: return std::int64_t{1} << 20;
    case 3: return INT32_MAX;
    case 4: return lo - 1 - magnitude;
    default: return INT32_MIN;
  }
}

namespace gpu_case_detail {

inline constexpr std::int64_t kGpuLengths[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129};

inline std::vector<PlantKind> plant_kinds(const CallPlan& s) {
  using K = PlantKind;
  std::vector<PlantKind> kinds{K::slot_out_of_range};
  const bool several = s.rows() >= 2;
  if (several) kinds.push_back(K::slot_repeated);
  switch (s.entry) {
    case Entry::decode:
      if (s.cu_seqlens) kinds.insert(kinds.end(), {K::cu_start, K::cu_order, K::cu_end});
      break;
    case Entry::prefill:
      kinds.insert(kinds.end(), {K::slot_padding, K::cu_start, K::cu_end});
      if (several) kinds.push_back(K::cu_order);
      break;
    case Entry::verify:
    case Entry::commit:
      if (s.entry == Entry::verify || s.cu_seqlens) {
        kinds.insert(kinds.end(), {K::cu_start, K::cu_end});
        if (several) kinds.push_back(K::cu_order);
      }
      if (s.entry == Entry::commit) kinds.push_back(K::accepted_past_draft);
      if (s.explicit_scratch_indices) {
        kinds.push_back(K::scratch_out_of_range);
        kinds.push_back(K::scratch_repeated);
      } else if (s.row_map) {
        kinds.push_back(K::row_map_permuted);
      }
      if (s.extra_index_entries > 0) kinds.push_back(K::junk_past_rows);
      break;
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: break;  // not drawn here (kEntries): gpu_records covers their kernels
  }
  return kinds;
}

}  // namespace gpu_case_detail

inline reference_case_detail::SpecLimits gpu_spec_limits() {
  return reference_case_detail::SpecLimits{.prefill_lengths = gpu_case_detail::kGpuLengths,
                    .max_prefill_length = 130,
                    .max_rows = 4,
                    .max_decode_rows = 24,
                    .max_draft_tokens = 12};
}

inline GpuCase draw_gpu_case(GpuMode mode, Chooser& c) {
  static constexpr Entry kEntries[] = {Entry::decode, Entry::prefill, Entry::verify, Entry::commit};
  GpuCase g;
  g.mode = mode;
  const Entry entry = c.element(kEntries);
  g.plan = reference_case_detail::draw_spec_for(entry, c, gpu_spec_limits());
  g.data_seed = static_cast<std::uint64_t>(c.pick(0, std::int64_t{1} << 30));
  g.chunks_per_block = static_cast<int>(c.pick(0, 9));
  if (mode != GpuMode::planted) return g;
  g.plan.set_all_values(false);  // the device alone sees the values
  const std::vector<PlantKind> kinds = gpu_case_detail::plant_kinds(g.plan);
  const std::int64_t count = c.pick(1, 3);
  const std::int64_t rows = g.plan.rows(), T = std::max<std::int64_t>(g.plan.T, 1);
  for (std::int64_t i = 0; i < count; ++i) {
    Plant p{c.element(std::span<const PlantKind>(kinds))};
    p.row = c.pick(0, rows - 1);
    p.other_row = c.pick(0, rows - 1);
    p.step = c.pick(0, T - 1);
    p.other_step = c.pick(0, T - 1);
    p.magnitude = c.pick(0, 11);
    g.plants.push_back(p);
  }
  return g;
}

}  // namespace kdaguard::support
