// The CUDA entry points of kda.h: validate, refuse or lower, guard, launch.
#include "kdaguard/kda.h"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kdaguard/contracts/supported.h"
#include "kdaguard/lower.h"
#include "launch.h"
#include "prefill/prefill_launch.h"

namespace kdaguard::gpu {
namespace {

Status cuda_failure(const char* what, cudaError_t error) {
  return Status::failed(fmt::format("{}: {} ({})", what, cudaGetErrorString(error),
                                    cudaGetErrorName(error)));
}

// The call must be for the current device, and that device must run sm_90a code.
Status device_ready(Device device) {
  if (device.kind != Device::Kind::cuda)
    return Status::unsupported_because(
        fmt::format("the CUDA backend runs calls on a cuda device; this call is for {}",
                    device_name(device)));
  int current = -1;
  if (const cudaError_t e = cudaGetDevice(&current); e != cudaSuccess) {
    cudaGetLastError();  // a missing device is an answer, not a sticky error for the caller
    return Status::unsupported_because(
        fmt::format("no usable CUDA device: {}", cudaGetErrorString(e)));
  }
  if (current != device.index)
    return Status::unsupported_because(fmt::format(
        "the call is for cuda:{} but the current device is cuda:{}", device.index, current));
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, current);
  if (major != 9 || minor != 0)
    return Status::unsupported_because(fmt::format(
        "the kernels are built for sm_90a; cuda:{} has compute capability {}.{}", current, major,
        minor));
  return Status::success();
}

template <class Call> Status admit(const Call& call, Verdict& verdict) {
  verdict = validate(call);
  if (!verdict.accepted()) return Status::refused(std::move(verdict));
  return device_ready(call.device);
}

// Value rules the host could not check run on the device; that needs the caller's guard: an
// error word, and for verify and prefill (whose guard kernel hands its verdicts to the kernels
// after it) one row flag per row. flagged_rows: 0 for the entry points whose kernels judge their
// own rows.
Status guard_ready(const Verdict& verdict, const DeviceGuard& guard, std::int64_t flagged_rows) {
  if (verdict.deferred.empty()) return Status::success();
  if (guard.error_word != nullptr &&
      (flagged_rows == 0 || (guard.row_flags != nullptr && guard.row_flags_capacity >= flagged_rows)))
    return Status::success();
  std::string checks;
  for (const DeferredCheck& d : verdict.deferred)
    checks += fmt::format("{}{} ({})", checks.empty() ? "" : ", ", rule_id(d.rule), d.argument);
  if (flagged_rows == 0)
    return Status::unsupported_because(fmt::format(
        "value rules {} must be checked on the device: pass host copies of those index values, "
        "or a DeviceGuard with an error word",
        checks));
  return Status::unsupported_because(fmt::format(
      "value rules {} must be checked on the device: pass host copies of those index values, or "
      "a DeviceGuard with an error word and row_flags for {} rows (capacity given: {})",
      checks, flagged_rows, guard.row_flags_capacity));
}

// ---- which (entry, K, V, io dtype, state dtype) are prepared on which device ----
// One bit per device in a word per combination; only dims and dtypes the kernels run have a word.
constexpr int kPreparedDevices = 64;
constexpr int kHeadDimCount = static_cast<int>(supported::kHeadDims.size());
constexpr int kPreparedKeys = kEntryCount * kHeadDimCount * kHeadDimCount *
                              static_cast<int>(supported::kIoDTypes.size()) *
                              static_cast<int>(supported::kStateDTypes.size());
std::array<std::atomic<std::uint64_t>, kPreparedKeys> prepared_devices{};

// The word of a combination, or -1 for one no kernel runs. Commit has no q/k/v: its io dtype is
// ignored (taken as the state's), as is replay_commit's.
int prepared_key(Entry entry, std::int32_t K, std::int32_t V, DType io, DType state) {
  if (entry == Entry::commit || entry == Entry::replay_commit) io = state;
  const int k = supported::index_in(supported::kHeadDims, K);
  const int v = supported::index_in(supported::kHeadDims, V);
  const int io_index = supported::index_in(supported::kIoDTypes, io);
  const int state_index = supported::index_in(supported::kStateDTypes, state);
  if (k < 0 || v < 0 || io_index < 0 || state_index < 0) return -1;
  return ((((static_cast<int>(entry) * kHeadDimCount + k) * kHeadDimCount + v) *
               static_cast<int>(supported::kIoDTypes.size()) +
           io_index) *
              static_cast<int>(supported::kStateDTypes.size()) +
          state_index);
}

struct PreparedKey {
  int key = -1;
  int device = 0;
  bool prepared() const {
    return key >= 0 && device >= 0 && device < kPreparedDevices &&
           (prepared_devices[key].load(std::memory_order_acquire) >> device) & 1u;
  }
  void mark() const {
    if (key >= 0 && device >= 0 && device < kPreparedDevices)
      prepared_devices[key].fetch_or(std::uint64_t{1} << device, std::memory_order_release);
  }
};

// Refuses a call under capture whose kernels were never readied, before anything is captured:
// readying makes host calls (function attributes, the workspace pool) that a capture may not
// contain. `capturing` tells the caller whether an accepted launch may mark the key prepared.
Status capture_ready(Entry entry, const PreparedKey& key, const TokenInputs* in, DType state,
                     std::int32_t K, std::int32_t V, cudaStream_t stream, bool& capturing) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess) {
    cudaGetLastError();
    return cuda_failure("cudaStreamIsCapturing on the launch stream", e);
  }
  capturing = capture != cudaStreamCaptureStatusNone;
  if (!capturing || key.prepared()) return Status::success();
  return Status::unsupported_because(fmt::format(
      "not prepared for capture: {} with K = {}, V = {}, {}state {} on cuda:{} has not run on this "
      "device yet, and its first run makes host calls a CUDA graph capture cannot contain; call "
      "kdaguard::gpu::prepare({}, {}, {}, {}, {}, cuda:{}) (or make one uncaptured call) before "
      "capturing",
      entry_name(entry), K, V, in ? fmt::format("q/k/v {}, ", dtype_name(in->io_dtype)) : "",
      dtype_name(state), key.device, entry_name(entry), K, V,
      dtype_name(in ? in->io_dtype : state), dtype_name(state), key.device));
}

// Decode and commit: the kernels judge their own rows (their prologues), every value rule when
// some were deferred; only a call without rows needs the guard kernel, for its single offset.
template <class Params, class MainLaunch>
Status launch_self_judged(const Verdict& verdict, const DeviceGuard& guard, const Params& params,
                          std::int64_t rows, MainLaunch&& run_main, cudaStream_t stream) {
  const detail::GuardState state{guard.error_word, nullptr, !verdict.deferred.empty(),
                                 enabled_device_rules()};
  if (state.judge_values && rows == 0) {
    if (const cudaError_t e = detail::launch_empty_call_guard(params, state, stream);
        e != cudaSuccess)
      return cuda_failure("guard kernel launch", e);
  }
  if (const cudaError_t e = run_main(params, state, stream); e != cudaSuccess)
    return cuda_failure("kernel launch", e);
  return Status::success();
}

// Verify and prefill: when the host deferred value rules, the guard kernel (run_guard) judges them
// first and hands each row's verdict to the kernels after it through row_flags.
template <class Params, class MainLaunch>
Status launch_after_guard(const Verdict& verdict, const DeviceGuard& guard, const Params& params,
                          cudaError_t (*run_guard)(const Params&, std::uint64_t,
                                                   unsigned long long*, std::int32_t*,
                                                   cudaStream_t),
                          MainLaunch&& run_main, cudaStream_t stream) {
  const bool deferred = !verdict.deferred.empty();
  const detail::GuardState state{guard.error_word, deferred ? guard.row_flags : nullptr, false,
                                 enabled_device_rules()};
  if (deferred) {
    if (const cudaError_t e =
            run_guard(params, state.enabled, guard.error_word, guard.row_flags, stream);
        e != cudaSuccess)
      return cuda_failure("guard kernel launch", e);
  }
  if (const cudaError_t e = run_main(params, state, stream); e != cudaSuccess)
    return cuda_failure("kernel launch", e);
  return Status::success();
}

// The last stretch every entry point's call travels: on a capturing stream the combination must
// be prepared (capture_ready); then `launch` runs the call's kernels, and an accepted launch
// outside a capture that ran kernels (runs_kernels) marks the combination prepared on the device.
template <class Launch>
Status launch_prepared(Entry entry, const TokenInputs* in, DType state, std::int32_t K,
                       std::int32_t V, int device, bool runs_kernels, cudaStream_t stream,
                       Launch&& launch) {
  const PreparedKey key{prepared_key(entry, K, V, in ? in->io_dtype : state, state), device};
  bool capturing = false;
  if (Status s = capture_ready(entry, key, in, state, K, V, stream, capturing); !s.ok()) return s;
  Status launched = launch();
  if (launched.ok() && !capturing && runs_kernels) key.mark();
  return launched;
}

}  // namespace

Status can_implement(const DecodeCall& call) {
  Verdict verdict;
  return admit(call, verdict);
}
Status can_implement(const PrefillCall& call) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  if (std::string why = detail::prefill_unsupported_reason(lower(call)); !why.empty())
    return Status::unsupported_because(std::move(why));
  return Status::success();
}
Status can_implement(const VerifyCall& call) {
  Verdict verdict;
  return admit(call, verdict);
}
Status can_implement(const CommitCall& call) {
  Verdict verdict;
  return admit(call, verdict);
}

Status can_implement(const RecordVerifyCall& call) {
  Verdict verdict;
  return admit(call, verdict);
}
Status can_implement(const ReplayCommitCall& call) {
  Verdict verdict;
  return admit(call, verdict);
}
Status can_implement(const AcceptVerifyCall& call) {
  Verdict verdict;
  return admit(call, verdict);
}

Status decode(const DecodeCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const DecodeParams params = lower(call);
  if (Status s = guard_ready(verdict, options.guard, 0); !s.ok()) return s;
  return launch_prepared(
      Entry::decode, &params.in, params.state.dtype, params.in.K, params.in.V, call.device.index,
      params.batch > 0, options.stream, [&] {
        return launch_self_judged(
            verdict, options.guard, params, params.batch,
            [&](const DecodeParams& p, detail::GuardState g, cudaStream_t s) {
              return detail::launch_decode(p, g, options.chunks_per_block, s);
            },
            options.stream);
      });
}

Status prefill(const PrefillCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  PrefillParams params = lower(call);
  if (std::string why = detail::prefill_unsupported_reason(params); !why.empty())
    return Status::unsupported_because(std::move(why));
  if (Status s = guard_ready(verdict, options.guard, params.num_seqs); !s.ok()) return s;
  const std::int64_t workspace_bytes = detail::prefill_workspace_bytes(params);
  if (workspace_bytes < 0)
    return Status::unsupported_because("the prefill workspace size overflows int64");
  if (options.workspace.data != nullptr) {
    if (options.workspace.bytes < workspace_bytes)
      return Status::unsupported_because(fmt::format(
          "the workspace has {} bytes; this prefill needs {} (prefill_workspace_bytes)",
          options.workspace.bytes, workspace_bytes));
    if (reinterpret_cast<std::uintptr_t>(options.workspace.data) % 16 != 0)
      return Status::unsupported_because(fmt::format(
          "the workspace address {} is not 16-byte aligned", options.workspace.data));
    params.workspace = options.workspace.data;
    params.workspace_bytes = options.workspace.bytes;
  }
  return launch_prepared(
      Entry::prefill, &params.in, params.state.dtype, params.in.K, params.in.V, call.device.index,
      params.num_seqs > 0 && params.total_tokens > 0, options.stream, [&] {
        return launch_after_guard(
            verdict, options.guard, params, detail::launch_prefill_guard, detail::launch_prefill,
            options.stream);
      });
}

Status verify(const VerifyCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const VerifyParams params = lower(call);
  if (Status s = guard_ready(verdict, options.guard, params.rows); !s.ok()) return s;
  return launch_prepared(
      Entry::verify, &params.in, params.state.dtype, params.in.K, params.in.V, call.device.index,
      params.rows > 0, options.stream, [&] {
        return launch_after_guard(
            verdict, options.guard, params, detail::launch_verify_guard,
            [&](const VerifyParams& p, detail::GuardState g, cudaStream_t s) {
              return detail::launch_verify(p, g, options.chunks_per_block, s);
            },
            options.stream);
      });
}

Status commit(const CommitCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const CommitParams params = lower(call);
  if (Status s = guard_ready(verdict, options.guard, 0); !s.ok()) return s;
  return launch_prepared(Entry::commit, nullptr, params.state.dtype, params.K, params.V,
                         call.device.index, params.rows > 0, options.stream, [&] {
                           return launch_self_judged(verdict, options.guard, params, params.rows,
                                                     detail::launch_commit, options.stream);
                         });
}

std::int64_t prefill_workspace_bytes(std::int64_t total_tokens, std::int64_t num_seqs,
                                     std::int32_t HV, std::int32_t K, std::int32_t V,
                                     DType io_dtype) {
  if (total_tokens < 0 || num_seqs < 0 || num_seqs > INT32_MAX) return -1;
  PrefillParams p;
  p.total_tokens = total_tokens;
  p.num_seqs = static_cast<std::int32_t>(num_seqs);
  p.in.H = 1;
  p.in.HV = HV;
  p.in.K = K;
  p.in.V = V;
  p.in.io_dtype = io_dtype;
  p.state.dtype = DType::f32;
  p.cu_seqlens_dtype = DType::i32;
  if (!detail::prefill_unsupported_reason(p).empty()) return -1;
  return detail::prefill_workspace_bytes(p);
}

bool prepared(Entry entry, std::int32_t K, std::int32_t V, DType io_dtype, DType state_dtype,
              Device device) {
  return device.kind == Device::Kind::cuda &&
         PreparedKey{prepared_key(entry, K, V, io_dtype, state_dtype), device.index}.prepared();
}

namespace {

// Device buffers of one warm-up call, freed together.
class WarmUpBuffers {
 public:
  WarmUpBuffers() = default;
  WarmUpBuffers(const WarmUpBuffers&) = delete;
  WarmUpBuffers& operator=(const WarmUpBuffers&) = delete;
  ~WarmUpBuffers() {
    for (void* p : allocations_) cudaFree(p);
  }
  cudaError_t error() const { return error_; }

  // A zero-filled compact tensor, or the given int32 values.
  TensorView tensor(DType dtype, const std::vector<std::int64_t>& shape,
                    const std::vector<std::int32_t>& values = {}) {
    TensorView view = TensorView::contiguous(dtype, shape);
    const std::size_t bytes = static_cast<std::size_t>(view.numel() * element_size(dtype));
    void* p = allocate(bytes);
    if (p != nullptr && !values.empty())
      record(cudaMemcpy(p, values.data(), values.size() * sizeof(std::int32_t),
                        cudaMemcpyHostToDevice));
    view.address = reinterpret_cast<std::uint64_t>(p);
    view.storage_size = Elements{view.numel()};
    return view;
  }
  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    if (error_ != cudaSuccess) return nullptr;
    if (record(cudaMalloc(&p, bytes < 256 ? 256 : bytes)) != cudaSuccess) return nullptr;
    allocations_.push_back(p);
    record(cudaMemset(p, 0, bytes));
    return p;
  }

 private:
  cudaError_t record(cudaError_t e) {
    if (error_ == cudaSuccess) error_ = e;
    return e;
  }
  std::vector<void*> allocations_;
  cudaError_t error_ = cudaSuccess;
};

// Restores the caller's current device on the way out.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    set_ = cudaSetDevice(device);
  }
  ~CurrentDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  cudaError_t error() const { return set_; }

 private:
  int previous_ = -1;
  cudaError_t set_ = cudaSuccess;
};

// One row of one token, H = HV = 1, an activated gate and beta (all zero), indices {0}: the
// smallest call that runs the guard and main kernels of the combination.
template <class Call> void fill_token_inputs(Call& c, WarmUpBuffers& b, std::int32_t K,
                                             std::int32_t V, DType io) {
  c.q = b.tensor(io, {1, 1, K});
  c.k = b.tensor(io, {1, 1, K});
  c.v = b.tensor(io, {1, 1, V});
  c.g = b.tensor(io, {1, 1, K});
  c.beta = b.tensor(io, {1, 1});
  c.out = b.tensor(io, {1, 1, V});
}

}  // namespace

namespace {

// The record-based path (records/): its kernels judge their own rows in their prologues, and the
// launcher a call without rows by the guard kernel (launch_records_tile).
template <class Call, class Params, class Launch>
Status run_records(const Call& call, const Params& params, const Verdict& verdict,
                   std::int32_t K, std::int32_t V, const TokenInputs* in, DType state,
                   std::int64_t rows, const LaunchOptions& options, Launch&& launch) {
  if (Status s = guard_ready(verdict, options.guard, 0); !s.ok()) return s;
  const auto run = [&] {
    const detail::GuardState guard{options.guard.error_word, nullptr, !verdict.deferred.empty(),
                                   enabled_device_rules()};
    const cudaError_t e = launch(params, guard, options.chunks_per_block, options.stream);
    return e == cudaSuccess ? Status::success() : cuda_failure("kernel launch", e);
  };
  return launch_prepared(Call::kEntry, in, state, K, V, call.device.index, rows > 0,
                         options.stream, run);
}

}  // namespace

Status record_verify(const RecordVerifyCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const RecordVerifyParams params = lower(call);
  return run_records(call, params, verdict, params.in.K, params.in.V, &params.in,
                     params.state.dtype, params.rows, options, detail::launch_record_verify);
}

Status replay_commit(const ReplayCommitCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const ReplayCommitParams params = lower(call);
  return run_records(call, params, verdict, params.K, params.V, nullptr, params.state.dtype,
                     params.rows, options, detail::launch_replay_commit);
}

Status accept_verify(const AcceptVerifyCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const AcceptVerifyParams params = lower(call);
  const RecordVerifyParams& v = params.verify;
  return run_records(call, params, verdict, v.in.K, v.in.V, &v.in, v.state.dtype, v.rows,
                     options, detail::launch_accept_verify);
}

Status prepare(Entry entry, std::int32_t K, std::int32_t V, DType io_dtype, DType state_dtype,
               Device device) {
  if (device.kind != Device::Kind::cuda)
    return Status::unsupported_because(
        fmt::format("prepare readies CUDA devices; got {}", device_name(device)));
  if (prepared_key(entry, K, V, io_dtype, state_dtype) < 0)
    return Status::unsupported_because(fmt::format(
        "no kernels for {} with K = {}, V = {}, q/k/v {}, state {}", entry_name(entry), K, V,
        dtype_name(io_dtype), dtype_name(state_dtype)));
  if (prepared(entry, K, V, io_dtype, state_dtype, device)) return Status::success();
  const CurrentDevice current(device.index);
  if (current.error() != cudaSuccess) return cuda_failure("cudaSetDevice", current.error());

  WarmUpBuffers b;
  DeviceGuard guard;
  guard.error_word = static_cast<unsigned long long*>(b.allocate(sizeof(unsigned long long)));
  guard.row_flags = static_cast<std::int32_t*>(b.allocate(sizeof(std::int32_t)));
  guard.row_flags_capacity = 1;
  const std::vector<std::int64_t> pool_shape{1, 1, V, K};
  // One step of one head's record (g | k | u, all zero: a decay of exp(0) and a zero update, so
  // the replay leaves the zero state as it is).
  const std::vector<std::int64_t> record_shape{1, 1, 1, 2 * std::int64_t{K} + V};
  CatalogueCall call = make_catalogue_call(entry);
  std::visit(
      [&](auto& c) {
        using C = std::decay_t<decltype(c)>;
        c.device = device;
        if constexpr (std::is_same_v<C, DecodeCall>) {
          fill_token_inputs(c, b, K, V, io_dtype);
          c.state = b.tensor(state_dtype, pool_shape);
          c.cache_indices = b.tensor(DType::i32, {1}, {0});
        } else if constexpr (std::is_same_v<C, PrefillCall>) {
          fill_token_inputs(c, b, K, V, io_dtype);
          c.cu_seqlens = b.tensor(DType::i32, {2}, {0, 1});
          c.initial_state = b.tensor(state_dtype, pool_shape);
          c.initial_state_indices = b.tensor(DType::i32, {1}, {0});
        } else if constexpr (std::is_same_v<C, VerifyCall>) {
          fill_token_inputs(c, b, K, V, io_dtype);
          c.cu_seqlens = b.tensor(DType::i32, {2}, {0, 1});
          c.state = b.tensor(state_dtype, pool_shape);
          c.cache_indices = b.tensor(DType::i32, {1}, {0});
          c.scratch = b.tensor(state_dtype, {1, 1, 1, V, K});
          c.scratch_row_map = b.tensor(DType::i32, {1}, {0});
          c.scalars.draft_token_num = 1;
        } else if constexpr (std::is_same_v<C, CommitCall>) {
          c.scratch = b.tensor(state_dtype, {1, 1, 1, V, K});
          c.scratch_row_map = b.tensor(DType::i32, {1}, {0});
          c.state = b.tensor(state_dtype, pool_shape);
          c.cache_indices = b.tensor(DType::i32, {1}, {0});
          c.accepted = b.tensor(DType::i32, {1}, {1});
          c.scalars.draft_token_num = 1;
        } else if constexpr (std::is_same_v<C, ReplayCommitCall>) {
          c.records = b.tensor(DType::f32, record_shape);
          c.state = b.tensor(state_dtype, pool_shape);
          c.cache_indices = b.tensor(DType::i32, {1}, {0});
          c.accepted = b.tensor(DType::i32, {1}, {1});
          c.scalars.draft_token_num = 1;
        } else {  // record_verify, accept_verify
          fill_token_inputs(c, b, K, V, io_dtype);
          c.cu_seqlens = b.tensor(DType::i32, {2}, {0, 1});
          c.state = b.tensor(state_dtype, pool_shape);
          c.cache_indices = b.tensor(DType::i32, {1}, {0});
          c.records = b.tensor(DType::f32, record_shape);
          c.scalars.draft_token_num = 1;
          if constexpr (std::is_same_v<C, AcceptVerifyCall>) {
            // A replayed step too, so the warm-up runs the kernel's replay and write-back.
            c.prior_records = b.tensor(DType::f32, record_shape);
            c.prior_accepted = b.tensor(DType::i32, {1}, {1});
          }
        }
      },
      call);
  if (b.error() != cudaSuccess) return cuda_failure("prepare: warm-up buffers", b.error());

  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess)
    return cuda_failure("prepare: cudaStreamCreateWithFlags", e);
  const std::unique_ptr<CUstream_st, decltype(&cudaStreamDestroy)> owned(stream,
                                                                         &cudaStreamDestroy);
  LaunchOptions options;
  options.stream = stream;
  options.guard = guard;
  const Status ran = std::visit(
      [&](const auto& c) -> Status {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, DecodeCall>) return decode(c, options);
        else if constexpr (std::is_same_v<C, PrefillCall>) return prefill(c, options);
        else if constexpr (std::is_same_v<C, VerifyCall>) return verify(c, options);
        else if constexpr (std::is_same_v<C, CommitCall>) return commit(c, options);
        else if constexpr (std::is_same_v<C, RecordVerifyCall>) return record_verify(c, options);
        else if constexpr (std::is_same_v<C, ReplayCommitCall>) return replay_commit(c, options);
        else return accept_verify(c, options);
      },
      call);
  if (!ran.ok()) return ran;
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return cuda_failure("prepare: the warm-up call", e);
  unsigned long long word = 0;
  if (const cudaError_t e =
          cudaMemcpy(&word, guard.error_word, sizeof word, cudaMemcpyDeviceToHost);
      e != cudaSuccess)
    return cuda_failure("prepare: reading the warm-up error word", e);
  if (word != 0)
    return Status::failed(fmt::format("prepare: the warm-up call set error word {:#x}", word));
  return Status::success();
}

}  // namespace kdaguard::gpu
