// Host problems: a ProblemSpec says what a call looks like (entry point, shapes, dtypes, gate and
// beta forms, rows, slots, and the layout knobs a serving engine uses), and materialize() turns it
// into real host buffers filled with fresh random non-zero values plus the call whose views
// describe them (device cpu, real addresses, known storage sizes).
//
// The buffers are enumerable (one Allocation per buffer, with the arguments viewing it) so GPU
// tests can upload the very same bytes and relocate the call onto device addresses. Snapshots
// and the write oracle let any test check that memory outside what an entry point may write is
// bit-identical afterwards. A conformance check reads:
//
//   HostProblem p = materialize(spec, seed);
//   p.poison_outputs();
//   const Snapshot before = p.snapshot();
//   reference::run(p.call);                      // the f64 reference, on the host buffers
//   const Snapshot expected = p.snapshot();
//   p.restore(before);
//   // copy every p.allocations[i] to a device buffer at bases[i]; run
//   // p.relocated(p.call, Device{Device::Kind::cuda, 0}, bases); copy the buffers back
//   const OutputErrors e = p.compare_outputs(expected, p.snapshot());   // e.out, e.state
//   p.unexpected_writes(before);  p.unwritten_outputs();                // both nullopt
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kdaguard/contracts/call.h"
#include "kdaguard/params.h"
#include "kdaguard/reference.h"

namespace kdaguard::support {

struct ProblemSpec {
  Entry entry = Entry::decode;
  int H = 1, HV = 1, K = 64, V = 64;
  DType io_dtype = DType::f32;     // q, k, v, out (and a raw gate a)
  DType state_dtype = DType::f32;  // pool and scratch: f32 or bf16
  DType gate_dtype = DType::f32;   // a: io_dtype; g: f32 or io_dtype
  DType beta_dtype = DType::f32;   // f32 or io_dtype
  GateKind gate_kind = GateKind::softplus;
  BetaKind beta_kind = BetaKind::logits;
  bool use_qk_l2norm = false;
  std::optional<double> scale;     // absent: the default K^-0.5
  double lower_bound = -5.0;       // bounded gate only
  bool dt_bias = true;             // raw gates only

  // One entry per row: prefill sequence lengths, verify/commit row lengths (<= T), decode ones.
  std::vector<std::int64_t> seq_lens;
  std::int64_t pool_slots = 1;     // S
  // Slot per row (cache_indices / initial_state_indices); -1 = padding row (not for prefill).
  std::vector<std::int64_t> slots;

  // verify and commit
  std::int64_t draft_tokens = 1;   // T
  std::int64_t scratch_steps = 1;  // T_alloc >= T
  std::int64_t scratch_rows = 1;   // S_spec >= N (+ extra_index_entries)
  // Explicit flat scratch slot per (row, step), [N * T] row-major, -1 = skip; absent: the
  // identity row map (flat slot n * T_alloc + t).
  std::optional<std::vector<std::int64_t>> scratch_indices;
  bool scratch_row_map = true;     // pass the (identity) row map; required without indices
  std::vector<std::int64_t> accepted;  // per row, <= its length (both verify and commit specs)
  bool commit_cu_seqlens = true;   // commit: pass cu_seqlens (optional there)

  // Layout knobs.
  std::int64_t slot_pad = 0;        // extra elements per pool/scratch slot, a multiple of 16
  std::int64_t state_offset_32B = 0;  // pool/scratch start this many 32-byte units into their buffer
  bool packed_qkv = false;          // q, k, v sliced from one [T, 2HK + HV V] projection buffer
  std::int64_t token_pad_16B = 0;   // extra 16-byte units between token rows of q, k, v and out
  std::int64_t extra_gate_rows = 0; // prefill: a/g and b/beta rows past T_tot
  std::int64_t extra_index_entries = 0;  // verify/commit: cache_indices and row-map entries past N
  bool decode_cu_seqlens = false;   // decode: pass cu_seqlens = 0, 1, ..., B
  DType cu_seqlens_dtype = DType::i32;  // prefill may use i64
  bool host_values = true;          // attach host copies of the index tensors' values

  // Values: the fraction of gate elements set to a decay far past any lower bound (activated
  // g = -1000; a raw softplus gate a = +1000, so g <= -1000; a bounded gate saturates at L).
  double strong_decay_fraction = 0.0;

  std::int64_t rows() const { return static_cast<std::int64_t>(seq_lens.size()); }
  std::int64_t total_tokens() const;
};

std::string describe(const ProblemSpec& spec);  // one line, for counterexamples and logs

// One host buffer, 256-byte aligned, and the arguments that view it.
class Allocation {
 public:
  Allocation(std::string name, std::size_t bytes);
  const std::string& name() const { return name_; }
  std::size_t bytes() const { return bytes_; }
  std::byte* data() const { return memory_.get(); }
  std::uint64_t address() const { return reinterpret_cast<std::uint64_t>(memory_.get()); }
  std::vector<Arg> args;

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::string name_;
  std::size_t bytes_;
  std::unique_ptr<std::byte[], Free> memory_;
};

// What an entry point writes, derived from the spec alone: out (all of it, padding rows as
// zeros), and whole pool or scratch slots.
struct WrittenRegion {
  enum class Kind : std::uint8_t { out, state_slot, scratch_slot };
  Kind kind;
  std::int64_t slot;  // flat slot (scratch: row * T_alloc + step); -1 for out
  TensorView view;    // out, or the slot as a [1, HV, V, K] view
  std::string name() const;
};

// Errors of a run's outputs against expected ones (reference::compare on each).
struct OutputErrors {
  reference::ErrorStats out;    // every element of out (empty for commit)
  reference::ErrorStats state;  // every written pool or scratch slot, together
};

// A copy of every allocation's bytes.
struct Snapshot {
  std::vector<std::vector<std::byte>> bytes;
  friend bool operator==(const Snapshot&, const Snapshot&) = default;
};

struct HostProblem {
  ProblemSpec spec;
  std::vector<Allocation> allocations;
  AnyCall call;                         // the spec's entry point
  std::optional<VerifyCall> verify;     // verify and commit specs: both calls over one set of buffers
  std::optional<CommitCall> commit;

  const Allocation* find(std::string_view name) const;
  const Allocation* allocation_of(const TensorView& view) const;  // by address

  Snapshot snapshot() const;
  void restore(const Snapshot& s);
  // Fills every output with a NaN pattern: out (whole buffer), the verify scratch (whole
  // buffer), and for commit the pool slots it may write. Take the snapshot after this.
  void poison_outputs();

  // What the spec's entry point writes: out's elements, the pool slots of active rows (decode;
  // prefill sequences of length > 0; commit rows with accepted > 0), the scratch slots of active
  // rows' tokens (verify). Derived from the spec, not from any kernel.
  std::vector<WrittenRegion> written_regions() const;
  // Per allocation, a mask of the bytes of written_regions().
  std::vector<std::vector<bool>> writable() const;
  // A description of the first byte that changed since `before` although it is not writable,
  // or nullopt.
  std::optional<std::string> unexpected_writes(const Snapshot& before) const;
  // After poison_outputs() and a run: the first written-region element still holding NaN.
  std::optional<std::string> unwritten_outputs() const;

  // A view's elements as they are in snapshot `s` (the view must be one of this problem's).
  std::vector<double> read_floats_in(const Snapshot& s, const TensorView& view) const;
  // The written regions of `actual` against `expected`: e.g. expected = the snapshot after
  // reference::run, actual = after a device run whose results were copied back.
  OutputErrors compare_outputs(const Snapshot& expected, const Snapshot& actual) const;

  // The same call on another device: each view's address moved to new_bases[i] for the
  // allocation i it views (storage offsets unchanged), device set. For uploading to a GPU.
  AnyCall relocated(const AnyCall& c, Device device, std::span<const std::uint64_t> new_bases) const;
};

HostProblem materialize(const ProblemSpec& spec, std::uint64_t seed);

// ---- reading host views ----
// Every element of a floating view as f64, row-major over its shape.
std::vector<double> read_floats(const TensorView& view);
// Rows [first, first + count) of dim 0.
TensorView slice_rows(const TensorView& view, std::int64_t first, std::int64_t count);
// A scratch [S_spec, T_alloc, HV, V, K] seen as the pool [S_spec * T_alloc, HV, V, K]; a pool
// is returned as is.
TensorView flat_pool(const TensorView& pool_or_scratch);
// The V x K matrices of every head of one slot ([HV, V, K] row-major).
std::vector<double> read_slot(const TensorView& pool_or_scratch, std::int64_t flat_slot);

}  // namespace kdaguard::support
