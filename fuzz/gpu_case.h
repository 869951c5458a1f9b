// How fuzz_gpu turns its input into a case (shared with the seed writer). Byte 0 picks the mode
// (its low bit); the other bytes drive every choice through FuzzChooser:
//   - conformance: a valid problem of any entry point (reference_case.h's draw_spec_for at larger
//     limits: decode batches up to 24 rows, prefill lengths around the 64-token chunks, verify
//     past its 8-token step batch), host copies of the index values present or absent. A
//     record-based entry point runs on a verify plan (record_verify) or a commit plan
//     (replay_commit; accept_verify, whose prior accepted counts are the plan's accepted counts)
//     with record buffers of a drawn layout (record_problem.h);
//   - planted: the same problem without host copies, and one to three bad index values planted
//     where only the device sees them (a slot out of range, a repeated slot, a padding slot in
//     prefill, cu_seqlens out of order or not starting at 0 or not ending at T_tot, an accepted
//     count past T, a scratch index out of range or repeated, a row map that is not the
//     identity, junk in the entries past the rows, a prior accepted count past the prior
//     records' steps).
// CUDA-free: the seed writer draws cases with it.
#pragma once

#include <climits>
#include <cstdint>
#include <vector>

#include "gen_calls.h"
#include "problem.h"
#include "record_problem.h"
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
  prior_past_records,    // accept_verify: prior_accepted outside [0, prior_records' steps]
};

struct Plant {
  PlantKind kind;
  std::int64_t row = 0, other_row = 0, step = 0, other_step = 0;
  std::int64_t magnitude = 0;  // which bad value (bad_value()), or how far out of order
};

struct GpuCase {
  GpuMode mode = GpuMode::conformance;
  Entry entry = Entry::decode;  // the entry point run; plan.entry is its plan's (plan_entry())
  CallPlan plan;
  RecordBufferPlan records;           // record-based entry points: the record buffers' layout
  bool prior_accepted_values = true;  // accept_verify: prior_accepted carries a host copy
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

// The plan a record-based entry point runs on: its verify or commit problem.
inline constexpr Entry plan_entry(Entry e) {
  switch (e) {
    case Entry::record_verify: return Entry::verify;
    case Entry::replay_commit:
    case Entry::accept_verify: return Entry::commit;
    default: return e;
  }
}

inline constexpr bool is_record_entry(Entry e) {
  return e == Entry::record_verify || e == Entry::replay_commit || e == Entry::accept_verify;
}

namespace gpu_case_detail {

inline constexpr std::int64_t kGpuLengths[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129};

inline std::vector<PlantKind> plant_kinds(Entry entry, const CallPlan& s) {
  using K = PlantKind;
  std::vector<PlantKind> kinds{K::slot_out_of_range};
  const bool several = s.rows() >= 2;
  if (several) kinds.push_back(K::slot_repeated);
  auto offsets = [&] {
    kinds.insert(kinds.end(), {K::cu_start, K::cu_end});
    if (several) kinds.push_back(K::cu_order);
  };
  switch (entry) {
    case Entry::decode:
      if (s.cu_seqlens) kinds.insert(kinds.end(), {K::cu_start, K::cu_order, K::cu_end});
      break;
    case Entry::prefill:
      kinds.push_back(K::slot_padding);
      offsets();
      break;
    case Entry::verify:
    case Entry::commit:
      if (entry == Entry::verify || s.cu_seqlens) offsets();
      if (entry == Entry::commit) kinds.push_back(K::accepted_past_draft);
      if (s.explicit_scratch_indices) {
        kinds.push_back(K::scratch_out_of_range);
        kinds.push_back(K::scratch_repeated);
      } else if (s.row_map) {
        kinds.push_back(K::row_map_permuted);
      }
      break;
    // Records are addressed by row: no scratch indices, no row map.
    case Entry::record_verify: offsets(); break;
    case Entry::replay_commit:
      if (s.cu_seqlens) offsets();
      kinds.push_back(K::accepted_past_draft);
      break;
    case Entry::accept_verify:
      offsets();
      kinds.push_back(K::prior_past_records);
      break;
  }
  if (entry != Entry::decode && entry != Entry::prefill && s.extra_index_entries > 0)
    kinds.push_back(K::junk_past_rows);
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

// Every entry point the CUDA backend runs; the seed writer records a case of each by its index.
inline constexpr Entry kGpuEntries[] = {Entry::decode,        Entry::prefill,       Entry::verify,
                                        Entry::commit,        Entry::record_verify, Entry::replay_commit,
                                        Entry::accept_verify};

inline GpuCase draw_gpu_case(GpuMode mode, Chooser& c) {
  GpuCase g;
  g.mode = mode;
  g.entry = c.element(kGpuEntries);
  g.plan = reference_case_detail::draw_spec_for(plan_entry(g.entry), c, gpu_spec_limits());
  g.data_seed = static_cast<std::uint64_t>(c.pick(0, std::int64_t{1} << 30));
  g.chunks_per_block = static_cast<int>(c.pick(0, 9));
  if (is_record_entry(g.entry)) {
    g.records = draw_record_buffer(g.plan.rows(), g.plan.T, c);
    g.prior_accepted_values = c.coin();
  }
  if (mode != GpuMode::planted) return g;
  g.plan.set_all_values(false);  // the device alone sees the values
  g.prior_accepted_values = false;
  const std::vector<PlantKind> kinds = gpu_case_detail::plant_kinds(g.entry, g.plan);
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
