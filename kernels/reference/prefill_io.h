// Internal to the reference backend: the prefill result buffers and their write-back, shared by
// the per-token and the chunked forms so both round into storage the same way.
#pragma once

#include "kdaguard/params.h"
#include "kdaguard/reference.h"

namespace kdaguard::reference::detail {

// A PrefillValues sized for p, all zeros.
PrefillValues prefill_shape(const PrefillParams& p);
// Rounds r into p's out and pool; a sequence of length 0 leaves its slot untouched.
void write_prefill(const PrefillParams& p, const PrefillValues& r);

}  // namespace kdaguard::reference::detail
