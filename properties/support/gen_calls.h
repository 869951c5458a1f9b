// Valid call descriptions of every entry point, built by construction.
//
// A call is drawn in two steps: draw_plan() makes every choice (dimensions, dtypes, layouts,
// index maps, which index tensors carry host values) into a CallPlan, and build_call() turns the
// plan into an AnyCall deterministically. The choices come from a Chooser, so the same drawing
// code serves RapidCheck (which shrinks every choice towards its simplest value) and the fuzzers
// (which read the choices from their input bytes). Calls carry no data: addresses are 0 (an
// allocation of its own) or fake non-zero addresses shared by views of one buffer.
//
// The CallPlan is the one description of a call's layout in test support: materialize()
// (problem.h) lays out the same plan with the same code over real host buffers holding data.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kdaguard/contracts/call.h"
#include "kdaguard/contracts/validate.h"
#include "kdaguard/params.h"

namespace rc {
template <class T> class Gen;
}

namespace kdaguard::support {

// ------------------------------------------------------------------------------------------------
// Sources of choices
// ------------------------------------------------------------------------------------------------

class Chooser {
 public:
  virtual ~Chooser() = default;
  // A value in [lo, hi], both inclusive; lo is the simplest (shrinking goes towards it).
  // Returns lo when hi <= lo.
  virtual std::int64_t pick(std::int64_t lo, std::int64_t hi) = 0;

  bool coin() { return pick(0, 1) == 1; }
  // true with probability about 1/n (n >= 1), false being the simpler answer.
  bool one_in(std::int64_t n) { return pick(0, n - 1) == n - 1; }
  template <class T> const T& element(std::span<const T> options) {
    return options[static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(options.size()) - 1))];
  }
  template <class T, std::size_t N> const T& element(const T (&options)[N]) {
    return element(std::span<const T>(options, N));
  }
};

// Draws from RapidCheck; only usable inside a generator (gen::exec) or a property body.
class RapidCheckChooser final : public Chooser {
 public:
  std::int64_t pick(std::int64_t lo, std::int64_t hi) override;
};

// A seeded pseudo-random source (splitmix64), for code that wants a plan without RapidCheck:
// benchmarks, GPU conformance tests, corpus writers.
class SeededChooser final : public Chooser {
 public:
  explicit SeededChooser(std::uint64_t seed) : state_(seed) {}
  std::int64_t pick(std::int64_t lo, std::int64_t hi) override;

 private:
  std::uint64_t state_;
};

// ------------------------------------------------------------------------------------------------
// The plan
// ------------------------------------------------------------------------------------------------

// Requirements on a drawn plan, so a mutation can start from a call where it applies.
struct PlanNeeds {
  int min_rows = 0;           // N (B for decode)
  int min_active_rows = 0;    // rows that own a slot (are not -1 padding)
  int min_tokens = 0;         // T_tot (decode: B)
  std::optional<bool> raw_gate;           // a with A_log (true) or an activated g (false)
  bool cu_seqlens = false;    // decode and commit pass their optional cu_seqlens
  bool index_values = false;  // every index tensor carries a host copy of its values
  std::optional<bool> explicit_scratch_indices;
  bool row_map = false;       // verify/commit pass scratch_row_map even with scratch_indices
  int min_scratch_rows = 0;   // S_spec
  int min_draft_tokens = 1;   // T
  bool padding_rows = true;   // decode/verify/commit may have -1 rows
  int min_heads_ratio = 1;    // HV / H
  int min_rows_with_tokens = 0;  // rows whose length is at least 1
};

// The index tensors: bit (1 << Arg) of each.
inline constexpr std::uint32_t kIndexArgBits =
    1u << static_cast<unsigned>(Arg::cache_indices) | 1u << static_cast<unsigned>(Arg::cu_seqlens) |
    1u << static_cast<unsigned>(Arg::initial_state_indices) |
    1u << static_cast<unsigned>(Arg::scratch_row_map) |
    1u << static_cast<unsigned>(Arg::scratch_indices) | 1u << static_cast<unsigned>(Arg::accepted);

// Every choice behind one generated call. Sizes are in elements unless named otherwise. The
// defaults are a plain valid layout (f32, one row, compact, sizes and index values known) for
// plans written by hand; draw_plan() sets every field.
struct CallPlan {
  Entry entry = Entry::decode;
  Device device{Device::Kind::cuda, 0};

  // Dimensions and dtypes.
  std::int64_t H = 1, HV = 1, K = 64, V = 64;
  DType io_dtype = DType::f32;   // q, k, v, out
  bool raw_gate = true;          // a + A_log (+ dt_bias); else an activated g
  DType gate_dtype = DType::f32;
  bool dt_bias = true;
  bool beta_logits = true;       // b; else beta
  DType beta_dtype = DType::f32;
  DType state_dtype = DType::f32;

  // Scalars.
  std::optional<double> scale;
  std::optional<double> lower_bound;
  bool use_qk_l2norm = false;

  // Rows: decode has one token per row; prefill and verify rows own cu_seqlens ranges.
  std::vector<std::int64_t> row_lengths;
  std::vector<std::int64_t> slot_of_row;  // committed slot per row; -1 = padding row
  std::int64_t slots = 1;                 // S
  std::int64_t extra_token_rows = 0;      // gate and beta rows past T_tot
  std::int64_t extra_index_entries = 0;   // cache_indices / row map entries past N (junk values)
  bool cu_seqlens = true;                 // always for prefill and verify
  DType cu_dtype = DType::i32;            // prefill may use i64

  // Layouts.
  bool packed_qkv = false;        // q, k, v sliced from one projection buffer [T, 2HK + HV*V + pad]
  std::int64_t row_pad = 0;       // extra 16-byte units per token row of q/k/v/a/g/out (b/beta: elements)
  std::int64_t head_pad = 0;      // extra 16-byte units per head of separate q and k
  std::int64_t slot_pad = 0;      // extra 16-element units per pool slot (envelope pitch)
  std::int64_t step_pad = 0;      // extra 16-element units per scratch step
  std::int64_t pool_offset = 0;   // 32-byte units between a pool's buffer start and slot 0
  std::int64_t view_offset = 0;   // 16-byte units before every other buffer's element 0
  bool known_sizes = true;        // views carry storage_size
  bool arena = false;             // every buffer lives in one shared allocation, disjoint
  bool distinct_addresses = false;  // buffers of their own get distinct non-zero addresses
  bool explicit_device = false;   // views name the call's device instead of leaving it implied

  // Verify and commit.
  std::int64_t T = 1, T_alloc = 1, S_spec = 1;
  // The row map: its first N entries, identity past its end.
  std::vector<std::int64_t> scratch_row_of_row;
  bool explicit_scratch_indices = false;
  // The explicit flat scratch slot of each (row, step), [N * T] row-major, -1 = skip; empty:
  // step t of an active row r at scratch_row_of_row[r] * T_alloc + t, -1 past its length.
  std::vector<std::int64_t> scratch_indices;
  bool row_map = true;
  std::int64_t scratch_indices_pad = 0;  // extra i32 entries per scratch_indices row
  std::vector<std::int64_t> accepted;

  // Which index tensors carry host copies of their values: bit (1 << Arg).
  std::uint32_t values_mask = kIndexArgBits;

  // Values (materialize only): the fraction of gate elements set to a decay far past any lower
  // bound (activated g = -1000; a raw gate a = +1000, so g <= -1000; a bounded gate saturates).
  double strong_decay_fraction = 0.0;

  std::int64_t rows() const { return static_cast<std::int64_t>(row_lengths.size()); }
  std::int64_t total_tokens() const;
  bool has_values(Arg a) const { return (values_mask >> static_cast<unsigned>(a)) & 1u; }
  void set_values(Arg a, bool on);
  void set_all_values(bool on);  // every index tensor
  // softplus (a, no lower bound), bounded (a with lower_bound) or activated (g).
  GateKind gate_kind() const {
    return !raw_gate ? GateKind::activated : lower_bound ? GateKind::bounded : GateKind::softplus;
  }
  void set_gate_kind(GateKind kind, double bound) {  // bound: the bounded gate's lower_bound
    raw_gate = kind != GateKind::activated;
    lower_bound = kind == GateKind::bounded ? std::optional<double>(bound) : std::nullopt;
  }
  // The flat scratch slot step t of row n writes, or -1 (see scratch_indices).
  std::int64_t scratch_slot(std::int64_t n, std::int64_t t) const;
};

std::ostream& operator<<(std::ostream& os, const CallPlan& plan);
std::string describe(const CallPlan& plan);  // the same, as one line for logs

// A call together with the plan it was built from (mutations may edit either). A mutation also
// says what the violation of its rule must say: texts naming the argument and the expected and
// actual values, each of which the message contains.
struct GeneratedCall {
  CallPlan plan;
  AnyCall call;
  std::vector<std::string> message_texts;
};

// Draws a valid plan of entry point `e` meeting `needs`. Cheap: a few dozen choices.
CallPlan draw_plan(Entry e, const PlanNeeds& needs, Chooser& choose);
// Builds the call a plan describes. Deterministic; any plan builds (an invalid plan, as made by
// a mutation, builds the call it describes).
AnyCall build_call(const CallPlan& plan);

// The buffers behind a laid-out call: every view of one buffer has the buffer's address.
struct PlacedBuffer {
  std::string_view name;  // the argument it was placed for ("qkv" for the packed projection)
  std::uint64_t address;  // fake, distinct per buffer
  std::int64_t bytes;
};
struct LaidOutCall {
  AnyCall call;                     // plan.entry
  std::optional<VerifyCall> verify; // verify and commit plans: both calls over one set of
  std::optional<CommitCall> commit; // buffers (accepted padded with 0 to one count per row)
  std::vector<PlacedBuffer> buffers;
};
// build_call's layout for materialize(): every buffer at a distinct fake address and listed, and
// every index tensor carrying its values (materialize writes them, then keeps values_mask's).
LaidOutCall lay_out(const CallPlan& plan);

GeneratedCall generate_call(Entry e, const PlanNeeds& needs, Chooser& choose);

// RapidCheck generators (shrinking) over the above.
rc::Gen<CallPlan> gen_plan(Entry e, PlanNeeds needs = {});
rc::Gen<GeneratedCall> gen_call(Entry e, PlanNeeds needs = {});
rc::Gen<GeneratedCall> gen_any_call(PlanNeeds needs = {});
rc::Gen<Entry> gen_entry(std::uint8_t entry_mask = 0xF);

// A readable one-call summary: entry, every argument's dtype/shape/strides/offset/address and
// values, the scalars. Used by counterexample printing and fuzz findings.
std::string describe_call(const AnyCall& call);
// The same for any entry point of the catalogue (the record-based ones too).
std::string describe_catalogue_call(const CatalogueCall& call);

// Fake addresses used by build_call: distinct buffers sit this far apart.
inline constexpr std::uint64_t kFakeAddressBase = 0x100000000000ull;
inline constexpr std::uint64_t kFakeAddressPitch = 0x100000000ull;  // 4 GiB

// Two verdicts with the same violations (rule, argument, message) and deferred checks, in order.
bool same_verdict(const Verdict& x, const Verdict& y);

// Counterexamples print the plan and the call (RapidCheck finds these through operator<<).
std::ostream& operator<<(std::ostream& os, const GeneratedCall& generated);

}  // namespace kdaguard::support

namespace kdaguard {
// RapidCheck prints generated entry points through this (found by argument-dependent lookup).
void showValue(Entry e, std::ostream& os);
}  // namespace kdaguard
