// The CUDA entry points of kda.h: validate, refuse or lower, guard, launch.
#include "kdaguard/kda.h"

#include <fmt/format.h>

#include <string>

#include "kdaguard/lower.h"
#include "launch.h"
#include "prefill_launch.h"

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

const std::int32_t* i32_data(const OptionalView& view) {
  return view ? reinterpret_cast<const std::int32_t*>(*view->data_address()) : nullptr;
}

// Value rules the host could not check run on the device; that needs the caller's guard.
Status guard_ready(const Verdict& verdict, const DeviceGuard& guard, std::int64_t rows) {
  if (verdict.deferred.empty()) return Status::success();
  if (guard.error_word != nullptr && guard.row_flags != nullptr &&
      guard.row_flags_capacity >= rows)
    return Status::success();
  std::string checks;
  for (const DeferredCheck& d : verdict.deferred)
    checks += fmt::format("{}{} ({})", checks.empty() ? "" : ", ", rule_id(d.rule), d.argument);
  return Status::unsupported_because(fmt::format(
      "value rules {} must be checked on the device: pass host copies of those index values, or "
      "a DeviceGuard with an error word and row_flags for {} rows (capacity given: {})",
      checks, rows, guard.row_flags_capacity));
}

detail::GuardState guard_state(const Verdict& verdict, const DeviceGuard& guard) {
  return {guard.error_word, verdict.deferred.empty() ? nullptr : guard.row_flags};
}

// Runs the guard (when values are deferred) and the main kernel on the caller's stream.
template <class Params, class GuardLaunch, class MainLaunch>
Status launch(const Verdict& verdict, const DeviceGuard& guard, const Params& params,
              const detail::GuardExtras& extras, GuardLaunch&& run_guard, MainLaunch&& run_main,
              cudaStream_t stream) {
  if (!verdict.deferred.empty()) {
    if (const cudaError_t e = run_guard(params, extras, guard.error_word, guard.row_flags, stream);
        e != cudaSuccess)
      return cuda_failure("guard kernel launch", e);
  }
  if (const cudaError_t e = run_main(params, guard_state(verdict, guard), stream); e != cudaSuccess)
    return cuda_failure("kernel launch", e);
  return Status::success();
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

Status decode(const DecodeCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const DecodeParams params = lower(call);
  if (Status s = guard_ready(verdict, options.guard, params.batch); !s.ok()) return s;
  detail::GuardExtras extras;
  extras.cu_seqlens = i32_data(call.cu_seqlens);
  return launch(
      verdict, options.guard, params, extras, detail::launch_decode_guard,
      [&](const DecodeParams& p, detail::GuardState g, cudaStream_t s) {
        return detail::launch_decode(p, g, options.chunks_per_block, s);
      },
      options.stream);
}

Status prefill(const PrefillCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const PrefillParams params = lower(call);
  if (std::string why = detail::prefill_unsupported_reason(params); !why.empty())
    return Status::unsupported_because(std::move(why));
  if (Status s = guard_ready(verdict, options.guard, params.num_seqs); !s.ok()) return s;
  return launch(verdict, options.guard, params, detail::GuardExtras{},
                detail::launch_prefill_guard, detail::launch_prefill, options.stream);
}

Status verify(const VerifyCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const VerifyParams params = lower(call);
  if (Status s = guard_ready(verdict, options.guard, params.rows); !s.ok()) return s;
  detail::GuardExtras extras;
  extras.scratch_row_map = i32_data(call.scratch_row_map);
  return launch(
      verdict, options.guard, params, extras, detail::launch_verify_guard,
      [&](const VerifyParams& p, detail::GuardState g, cudaStream_t s) {
        return detail::launch_verify(p, g, options.chunks_per_block, s);
      },
      options.stream);
}

Status commit(const CommitCall& call, const LaunchOptions& options) {
  Verdict verdict;
  if (Status s = admit(call, verdict); !s.ok()) return s;
  const CommitParams params = lower(call);
  if (Status s = guard_ready(verdict, options.guard, params.rows); !s.ok()) return s;
  detail::GuardExtras extras;
  extras.cu_seqlens = i32_data(call.cu_seqlens);
  extras.scratch_row_map = i32_data(call.scratch_row_map);
  return launch(verdict, options.guard, params, extras, detail::launch_commit_guard,
                detail::launch_commit, options.stream);
}

}  // namespace kdaguard::gpu
