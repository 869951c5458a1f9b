// Host problems: materialize() lays out a CallPlan (gen_calls.h: entry point, shapes, dtypes,
// gate and beta forms, rows, slots, and the layout knobs a serving engine uses) with the same code
// as build_call(), over real host buffers filled with fresh random non-zero values, and gives the
// call whose views describe them (device cpu, real addresses).
//
// The buffers are enumerable (one Allocation per buffer, with the arguments viewing it) so GPU
// tests can upload the very same bytes and relocate the call onto device addresses. Snapshots
// and the write oracle let any test check that memory outside what an entry point may write is
// bit-identical afterwards. A conformance check reads:
//
//   HostProblem p = materialize(plan, seed);
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

#include "gen_calls.h"
#include "kdaguard/contracts/call.h"
#include "kdaguard/params.h"
#include "kdaguard/reference.h"

namespace kdaguard::support {

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

// What an entry point writes, derived from the plan alone: out (all of it, padding rows as
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
  CallPlan plan;
  std::vector<Allocation> allocations;
  AnyCall call;                         // the plan's entry point
  std::optional<VerifyCall> verify;     // verify and commit plans: both calls over one set of buffers
  std::optional<CommitCall> commit;

  const Allocation* find(std::string_view name) const;
  const Allocation* allocation_of(const TensorView& view) const;  // by address

  Snapshot snapshot() const;
  void restore(const Snapshot& s);
  // Fills every output with a NaN pattern: out (whole buffer), the verify scratch (whole
  // buffer), and for commit the pool slots it may write; only the view itself where its buffer
  // holds other arguments too (an arena plan). Take the snapshot after this.
  void poison_outputs();

  // What the plan's entry point writes: out's elements, the pool slots of active rows (decode;
  // prefill sequences of length > 0; commit rows with accepted > 0), the scratch slots of active
  // rows' tokens (verify). Derived from the plan, not from any kernel.
  std::vector<WrittenRegion> written_regions() const;
  // The pool or scratch slots row n writes: written_regions() less out, one row's.
  std::vector<WrittenRegion> slots_written_by_row(std::int64_t n) const;
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
  CatalogueCall relocated(const CatalogueCall& c, Device device,
                          std::span<const std::uint64_t> new_bases) const;
};

// A decode, prefill, verify or commit plan over host buffers: the calls run on the cpu device
// whatever plan.device says. Every buffer holds random bytes, every input and pool element a
// random non-zero value, every index tensor its values (host copies attached per values_mask).
// Throws std::invalid_argument for a plan no call can be laid out from (one slot per row, one
// token per decode row, one accepted count per commit row).
HostProblem materialize(const CallPlan& plan, std::uint64_t seed);

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
