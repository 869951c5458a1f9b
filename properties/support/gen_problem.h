// RapidCheck generators of valid plans for host problems (materialize), one per entry point. Every choice is drawn with a
// generator that shrinks (indices into option lists, never gen::element), so a failing case
// shrinks toward the first option of each list: K = V = 64, H = HV = 1, f32, softplus gate, beta
// logits, no padding rows, identity slots, compact layouts, known storage sizes. Shapes stay small (HV <= 4, a few
// hundred tokens at most) so that 200 cases of a property run in seconds.
#pragma once

#include <rapidcheck.h>

#include <cstdint>

#include "problem.h"

namespace kdaguard::support {

struct GenLimits {
  std::int64_t max_rows = 4;        // sequences (prefill) or rows (decode, verify)
  std::int64_t max_seq_len = 130;   // prefill sequence length (specials 0..65 included)
  std::int64_t max_draft_tokens = 8;
  double strong_decay_fraction = 0.05;  // when a case draws strong decays at all
};

// Sequence lengths the chunked form must get right at chunk edges: 0, 1, 15, 16, 17, 63, 64, 65.
rc::Gen<std::int64_t> gen_seq_len(std::int64_t max_len);

rc::Gen<CallPlan> gen_decode_problem(GenLimits limits = {});
rc::Gen<CallPlan> gen_prefill_problem(GenLimits limits = {});
rc::Gen<CallPlan> gen_verify_problem(GenLimits limits = {});
rc::Gen<CallPlan> gen_commit_problem(GenLimits limits = {});
rc::Gen<CallPlan> gen_problem(Entry entry, GenLimits limits = {});

}  // namespace kdaguard::support
