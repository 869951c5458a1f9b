// Valid calls of the record-based speculative entry points (record_verify, replay_commit,
// accept_verify; contracts/NOTES.md), drawn like gen_calls.h's and from the same choices.
//
// A record call is a verify call (record_verify, accept_verify) or a commit call (replay_commit)
// of gen_calls.h with its scratch addressing replaced by record buffers: the call keeps the
// verify's token inputs, pool, slot map, cu_seqlens and draft-token count, or the commit's pool,
// slot map, accepted counts and cu_seqlens, and gains records [S_rec, T_alloc, HV, 2K+V] of f32
// (accept_verify: prior_records and prior_accepted too). So every verify/commit mutation that
// edits only those shared arguments breaks a record call the same way (record_mutations.h).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "gen_calls.h"

namespace rc {
template <class T> class Gen;
}

namespace kdaguard::support {

// The record buffers of a plan; strides in 16-byte units (4 floats) over the compact ones.
struct RecordBufferPlan {
  std::int64_t rows = 1, steps = 1;  // S_rec, T_alloc
  std::int64_t head_pad = 0, step_pad = 0, row_pad = 0;
  std::int64_t view_offset = 0;      // 16-byte units before element 0
};

struct RecordPlan {
  Entry entry = Entry::record_verify;
  // The verify (record_verify, accept_verify) or commit (replay_commit) plan behind the call;
  // its scratch fields describe buffers the record call does not take.
  CallPlan base;
  RecordBufferPlan records;
  // accept_verify: the previous step's records and accepted counts (in [0, prior.steps]).
  RecordBufferPlan prior;
  std::vector<std::int64_t> prior_accepted;
  bool prior_accepted_values = true;  // prior_accepted carries a host copy of its values
};

std::ostream& operator<<(std::ostream& os, const RecordPlan& plan);

// A record call with its plan and, as for GeneratedCall, the texts a mutation's message must hold.
// `base` is the verify or commit call the record call was derived from (record_mutations.h edits
// it with gen_calls' mutations and derives the record call again).
struct GeneratedRecordCall {
  RecordPlan plan;
  GeneratedCall base;
  CatalogueCall call;
  std::vector<std::string> message_texts;
};

// The entry point a record entry point's base plan is drawn as: verify or commit.
Entry base_entry(Entry record_entry);

// A record buffer plan for `rows` rows (S_rec in [rows, rows + 2]) and at least `min_steps` steps,
// with drawn pitches and view offset; the one drawing of record layouts (calls and host problems).
RecordBufferPlan draw_record_buffer(std::int64_t rows, std::int64_t min_steps, Chooser& choose);
// [S_rec, T_alloc, HV, 2K+V] of f32 with the plan's pitches over `base`'s dims, at `address` where
// the base plan gives buffers addresses (sizes and device as the base plan says).
TensorView record_buffer_view(const RecordBufferPlan& buffer, const CallPlan& base, std::uint64_t address);

// Draws a valid plan of a record entry point meeting `needs` (the base plan's needs).
RecordPlan draw_record_plan(Entry e, const PlanNeeds& needs, Chooser& choose);
// The record call of a plan over a base call: the base call's shared arguments and scalars, and
// record buffers placed where no base buffer is. Deterministic.
CatalogueCall derive_record_call(const RecordPlan& plan, const AnyCall& base);
GeneratedRecordCall generate_record_call(Entry e, const PlanNeeds& needs, Chooser& choose);

rc::Gen<GeneratedRecordCall> gen_record_call(Entry e, PlanNeeds needs = {});
// record_verify, replay_commit or accept_verify among the bits of entry_mask (bit 1 << Entry).
rc::Gen<Entry> gen_record_entry(std::uint8_t entry_mask);

std::ostream& operator<<(std::ostream& os, const GeneratedRecordCall& generated);

// The addresses of the record buffers where the plan gives buffers addresses: far from every
// address build_call places and from mutations' moved buffers.
inline constexpr std::uint64_t kRecordsAddress = kFakeAddressBase + 2048 * kFakeAddressPitch;
inline constexpr std::uint64_t kPriorRecordsAddress = kFakeAddressBase + 2049 * kFakeAddressPitch;
inline constexpr std::uint64_t kPriorAcceptedAddress = kFakeAddressBase + 2050 * kFakeAddressPitch;

}  // namespace kdaguard::support
