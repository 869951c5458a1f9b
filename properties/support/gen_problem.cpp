#include "gen_problem.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <vector>

#include "kdaguard/contracts/supported.h"

namespace kdaguard::support {
namespace {

// An index in [0, n), uniform at every size (inRange alone only yields 0 at small sizes),
// shrinking toward 0. Call inside gen::exec.
int pick(int n) { return *rc::gen::resize(100, rc::gen::inRange(0, n)); }

template <class T, std::size_t N>
T pick_from(const std::array<T, N>& options) {
  return options[static_cast<std::size_t>(pick(static_cast<int>(N)))];
}

// The first `count` entries of a permutation of [0, n): the identity unless the case draws a
// shuffle (shrinks toward no shuffle).
std::vector<std::int64_t> distinct_slots(std::int64_t count, std::int64_t n) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (pick(2) == 1) {
    std::mt19937_64 shuffle_with(*rc::gen::arbitrary<std::uint64_t>());
    for (std::size_t i = all.size(); i > 1; --i)
      std::swap(all[i - 1], all[static_cast<std::size_t>(shuffle_with() % i)]);
  }
  all.resize(static_cast<std::size_t>(count));
  return all;
}

// Dtypes, gate and beta forms, scalars and layout knobs: everything but rows and slots.
void draw_common(CallPlan& s, Entry entry, const GenLimits& limits) {
  s.entry = entry;
  s.device = Device{Device::Kind::cpu, 0};
  s.K = pick_from(supported::kHeadDims);
  s.V = pick_from(supported::kHeadDims);
  s.H = pick_from(std::array<std::int64_t, 2>{1, 2});
  const std::int64_t group = pick_from(std::array<std::int64_t, 3>{1, 2, 4});
  if (s.H * group > 4) s.H = 1;  // keep HV <= 4: property cases stay cheap
  s.HV = s.H * group;

  s.io_dtype = pick_from(std::array{DType::f32, DType::bf16, DType::f16});
  s.state_dtype = pick_from(std::array{DType::f32, DType::bf16});
  const GateKind gate =
      pick_from(std::array{GateKind::softplus, GateKind::bounded, GateKind::activated});
  s.raw_gate = gate != GateKind::activated;
  s.gate_dtype = gate == GateKind::activated ? pick_from(std::array{DType::f32, s.io_dtype})
                                             : s.io_dtype;
  s.beta_logits = pick_from(std::array{true, false});
  s.beta_dtype = pick_from(std::array{DType::f32, s.io_dtype});
  s.use_qk_l2norm = pick_from(std::array{false, true});
  const double scale = pick_from(std::array{0.0, 1.0, 0.5, 0.1});  // 0: the default
  s.scale = scale > 0 ? std::optional<double>(scale) : std::nullopt;
  const double lower_bound = pick_from(std::array{-5.0, -3.0, -1.0, -0.25});
  if (gate == GateKind::bounded) s.lower_bound = lower_bound;
  s.dt_bias = pick_from(std::array{true, false});  // raw gates only
  s.strong_decay_fraction = pick_from(std::array{0.0, limits.strong_decay_fraction});

  // One pitch pad for the pool and the scratch, as a serving engine's allocator gives them.
  s.slot_pad = s.step_pad = pick_from(std::array<std::int64_t, 3>{0, 1, 3});
  s.pool_offset = pick_from(std::array<std::int64_t, 3>{0, 1, 3});
  s.packed_qkv = pick_from(std::array{false, true});
  s.row_pad = pick_from(std::array<std::int64_t, 3>{0, 1, 2});
  s.set_all_values(pick_from(std::array{true, false}));
  s.known_sizes = true;
}

// Slots for rows that may be padding (-1): one in four rows, drawn per row.
std::vector<std::int64_t> slots_with_padding(std::int64_t rows, std::int64_t pool_slots) {
  std::vector<std::int64_t> slots = distinct_slots(rows, pool_slots);
  for (std::int64_t& slot : slots)
    if (pick(4) == 3) slot = -1;
  return slots;
}

}  // namespace

rc::Gen<std::int64_t> gen_seq_len(std::int64_t max_len) {
  static constexpr std::array<std::int64_t, 8> kEdges{0, 1, 15, 16, 17, 63, 64, 65};
  return rc::gen::oneOf(
      rc::gen::map(rc::gen::resize(100, rc::gen::inRange(0, 8)),
                   [max_len](int i) { return std::min(kEdges[static_cast<std::size_t>(i)], max_len); }),
      rc::gen::inRange<std::int64_t>(0, max_len + 1));
}

rc::Gen<CallPlan> gen_decode_problem(GenLimits limits) {
  return rc::gen::exec([limits] {
    CallPlan s;
    draw_common(s, Entry::decode, limits);
    const std::int64_t B = *rc::gen::inRange<std::int64_t>(1, 2 * limits.max_rows + 1);
    s.row_lengths.assign(static_cast<std::size_t>(B), 1);
    s.slots = B + pick_from(std::array<std::int64_t, 3>{1, 0, 4});
    s.slot_of_row = slots_with_padding(B, s.slots);
    s.cu_seqlens = pick_from(std::array{false, true});
    return s;
  });
}

rc::Gen<CallPlan> gen_prefill_problem(GenLimits limits) {
  return rc::gen::exec([limits] {
    CallPlan s;
    draw_common(s, Entry::prefill, limits);
    const std::int64_t N = *rc::gen::inRange<std::int64_t>(1, limits.max_rows + 1);
    for (std::int64_t n = 0; n < N; ++n) s.row_lengths.push_back(*gen_seq_len(limits.max_seq_len));
    s.slots = N + pick_from(std::array<std::int64_t, 3>{1, 0, 4});
    s.slot_of_row = distinct_slots(N, s.slots);
    s.cu_dtype = pick_from(std::array{DType::i32, DType::i64});
    s.extra_token_rows = pick_from(std::array<std::int64_t, 3>{0, 1, 5});
    return s;
  });
}

namespace {

CallPlan draw_speculative(Entry entry, const GenLimits& limits) {
  CallPlan s;
  draw_common(s, entry, limits);
  const std::int64_t N = *rc::gen::inRange<std::int64_t>(1, limits.max_rows + 1);
  s.T = *rc::gen::inRange<std::int64_t>(1, limits.max_draft_tokens + 1);
  const std::int64_t T = s.T;
  s.T_alloc = T + pick_from(std::array<std::int64_t, 3>{0, 1, 3});
  const bool dense = pick(2) == 0;  // every row holds T tokens, or ragged rows of 0..T
  for (std::int64_t n = 0; n < N; ++n)
    s.row_lengths.push_back(dense ? T : pick(static_cast<int>(T) + 1));
  s.slots = N + pick_from(std::array<std::int64_t, 3>{1, 0, 4});
  s.slot_of_row = slots_with_padding(N, s.slots);
  s.extra_index_entries = pick_from(std::array<std::int64_t, 3>{0, 1, 3});
  s.S_spec = N + s.extra_index_entries + pick_from(std::array<std::int64_t, 2>{0, 2});
  s.scratch_row_of_row.resize(static_cast<std::size_t>(N));
  std::iota(s.scratch_row_of_row.begin(), s.scratch_row_of_row.end(), std::int64_t{0});

  if (pick(2) == 1) {  // explicit scratch slots: a permutation of the scratch, some steps skipped
    std::vector<std::int64_t> flat = distinct_slots(N * T, s.S_spec * s.T_alloc);
    for (std::int64_t& slot : flat)
      if (pick(6) == 5) slot = -1;
    s.explicit_scratch_indices = true;
    s.scratch_indices = flat;
    s.row_map = pick_from(std::array{true, false});  // unused then; may be absent
  }

  // Accepted counts: 0..length, never ending on a skipped step (that state was not kept).
  for (std::int64_t n = 0; n < N; ++n) {
    std::int64_t a = pick(static_cast<int>(s.row_lengths[n]) + 1);
    while (a > 0 && s.scratch_slot(n, a - 1) < 0) --a;
    s.accepted.push_back(a);
  }
  s.cu_seqlens = entry == Entry::verify || pick_from(std::array{true, false});
  return s;
}

}  // namespace

rc::Gen<CallPlan> gen_verify_problem(GenLimits limits) {
  return rc::gen::exec([limits] { return draw_speculative(Entry::verify, limits); });
}

rc::Gen<CallPlan> gen_commit_problem(GenLimits limits) {
  return rc::gen::exec([limits] { return draw_speculative(Entry::commit, limits); });
}

rc::Gen<CallPlan> gen_problem(Entry entry, GenLimits limits) {
  switch (entry) {
    case Entry::decode: return gen_decode_problem(limits);
    case Entry::prefill: return gen_prefill_problem(limits);
    case Entry::verify: return gen_verify_problem(limits);
    case Entry::commit: return gen_commit_problem(limits);
    case Entry::record_verify:
    case Entry::replay_commit:
    case Entry::accept_verify: break;  // no record-based problems
  }
  return gen_decode_problem(limits);
}

}  // namespace kdaguard::support
