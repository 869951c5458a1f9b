// The bounds oracle: what memory does the reference touch for this call, and is all of it
// allowed? Written from contracts.md's semantics, not from the validators: it derives the
// dimensions from q, v (commit: the state), cu_seqlens and the scalars, walks every element each
// entry point reads or writes (token rows of each sequence, the pool slot named by each index,
// the scratch slot of each (row, step)), and checks that
//   - every element it touches lies inside its argument's shape and inside its allocation
//     (storage offset >= 0, and below storage_size when that is known),
//   - no written byte lies inside another argument, and no byte is written twice.
// Index values it lacks (no host copy) are taken at their widest: every slot of the pool.
//
// The walk works on byte ranges: dims that are laid out compactly merge, so a slot of a compact
// pool is one range. It stops after `max_ranges` ranges and then says it is incomplete.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kdaguard/contracts/call.h"

namespace kdaguard::support {

struct BoundsReport {
  std::vector<std::string> findings;  // empty: every access allowed
  bool complete = true;               // false: the cap stopped the walk; only part was checked
  std::int64_t ranges = 0;            // byte ranges walked

  bool ok() const { return findings.empty(); }
  std::string summary() const;
};

BoundsReport check_bounds(const AnyCall& call, std::int64_t max_ranges = 1 << 16);

}  // namespace kdaguard::support
