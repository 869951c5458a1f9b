// kdaguard._C: the entry points of kda.h as PyTorch dispatcher ops (torch.ops.kdaguard.*), built
// against LibTorch's stable ABI so that one binary serves every torch >= 2.10 and, tagged abi3,
// every CPython >= 3.10.
//
// The ops mirror kda.h one to one: decode, prefill, verify and commit mutate the tensors their
// schemas annotate and return nothing; can_* validate the same arguments and launch nothing. CPU
// tensors run the f64 reference (so the whole binding is testable without a GPU), CUDA tensors
// the sm_90a kernels on the current stream of their device, read on every call. A torch tensor
// becomes a TensorView from its metadata alone (no device read, no sync): dtype, shape, strides,
// storage offset, and its storage's base address and size, so views of one allocation (q, k, v
// sliced from a packed projection; a scratch carved out of the pool) are seen as such by
// alias.overlap. Nothing is copied, reshaped or made contiguous: a view the kernels cannot take
// is refused with its rule.
//
// Errors cross the dispatcher as standard exceptions, whose types torch maps to Python's: a call
// the contracts refuse throws std::invalid_argument (ValueError) whose first line is
//   kdaguard: <entry> rejected [<rule id>, ...]
// followed by describe(verdict); an unsupported call or a failed launch throws std::runtime_error
// (RuntimeError) starting "kdaguard: <entry> unsupported: " or "kdaguard: <entry> launch failed: ".
// kdaguard/__init__.py turns these into ContractViolation and Unsupported.
#include <Python.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kdaguard/contracts/call.h"
#include "kdaguard/contracts/rules.h"
#include "kdaguard/contracts/validate.h"
#include "kdaguard/contracts/value_checks.h"
#include "kdaguard/reference.h"
#include "kdaguard/status.h"

#ifdef KDAGUARD_TORCH_CUDA
#include <cuda_runtime_api.h>
#include <torch/csrc/stable/accelerator.h>

#include "kdaguard/kda.h"
#endif

// The module object Python imports; the ops register themselves when the library loads.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "kdaguard's PyTorch ops", -1,
                               nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}

namespace kdaguard::torch_binding {
namespace {

using Tensor = torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::headeronly::ScalarType;

std::optional<DType> dtype_of(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return DType::f32;
    case ScalarType::Half: return DType::f16;
    case ScalarType::BFloat16: return DType::bf16;
    case ScalarType::Int: return DType::i32;
    case ScalarType::Long: return DType::i64;
    default: return std::nullopt;
  }
}

std::string rule_list(const Verdict& verdict) {
  std::string ids;
  for (const Violation& v : verdict.violations) {
    const std::string_view id = rule_id(v.rule);
    if (ids.find(std::string(id)) != std::string::npos) continue;
    ids += fmt::format("{}{}", ids.empty() ? "" : ", ", id);
  }
  return ids;
}

[[noreturn]] void raise(Entry entry, const Status& status) {
  switch (status.code) {
    case StatusCode::rejected:
      throw std::invalid_argument(fmt::format("kdaguard: {} rejected [{}]\n{}", entry_name(entry),
                                              rule_list(status.verdict), status.detail));
    case StatusCode::unsupported:
      throw std::runtime_error(
          fmt::format("kdaguard: {} unsupported: {}", entry_name(entry), status.detail));
    default:
      throw std::runtime_error(
          fmt::format("kdaguard: {} launch failed: {}", entry_name(entry), status.detail));
  }
}

// The text a can_* op returns: empty when the call can run, else what raise() would throw.
std::string verdict_text(Entry entry, const Status& status) {
  if (status.ok()) return {};
  try {
    raise(entry, status);
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Builds one call's views. Violations that a TensorView cannot even express (a dtype outside
// its set, a rank past kMaxRank) are collected here and refused in the same format as the
// contracts' own, before validate() runs.
class CallBuilder {
 public:
  explicit CallBuilder(Entry entry) : entry_(entry) {}

  void set(OptionalView& slot, const Tensor& t, std::string_view name) {
    TensorView view;
    const int64_t rank = t.dim();
    const std::optional<DType> dtype = dtype_of(t.scalar_type());
    if (!dtype) {
      early_.violations.push_back(
          {RuleId::arg_dtype, name,
           fmt::format("{} has a dtype kdaguard does not take (torch ScalarType {}); expected one "
                       "of f32, f16, bf16, i32, i64 as the argument allows",
                       name, static_cast<int>(t.scalar_type()))});
      slot = view;
      return;
    }
    if (rank > kMaxRank) {
      early_.violations.push_back(
          {RuleId::arg_rank, name,
           fmt::format("{} has rank {}; no kdaguard argument has more than {} dims", name, rank,
                       kMaxRank)});
      slot = view;
      return;
    }
    view.dtype = *dtype;
    if (t.is_cuda()) {
      view.device = Device{Device::Kind::cuda, t.get_device_index()};
      if (!cuda_device_) cuda_device_ = view.device->index;
    } else if (t.is_cpu()) {
      view.device = Device{Device::Kind::cpu, 0};
    } else {
      throw std::runtime_error(fmt::format(
          "kdaguard: {} unsupported: {} is on a device that is neither cpu nor cuda",
          entry_name(entry_), name));
    }
    view.rank = static_cast<int>(rank);
    const auto sizes = t.sizes();
    const auto strides = t.strides();
    for (int i = 0; i < view.rank; ++i) {
      view.shape[i] = sizes[i];
      view.stride[i] = strides[i];
    }
    const int64_t offset = t.storage_offset();
    const int64_t esize = element_size(*dtype);
    view.storage_offset = Elements{offset};
    view.address = reinterpret_cast<std::uintptr_t>(t.data_ptr()) -
                   static_cast<std::uint64_t>(offset) * static_cast<std::uint64_t>(esize);
    int64_t storage_bytes = 0;
    if (aoti_torch_get_storage_size(t.get(), &storage_bytes) == AOTI_TORCH_SUCCESS)
      view.storage_size = Elements{storage_bytes / esize};
    slot = view;
  }
  void set(OptionalView& slot, const OptTensor& t, std::string_view name) {
    if (t) set(slot, *t, name);
  }

  // The host copy of an index tensor's values, from a CPU tensor the caller passes beside it.
  void host_values(OptionalView& slot, const OptTensor& copy, std::string_view name) {
    if (!copy || !slot) return;
    const Tensor& c = *copy;
    if (!c.is_cpu() || c.dim() != 1 || slot->rank != 1 || c.size(0) != slot->shape[0] ||
        (c.scalar_type() != ScalarType::Int && c.scalar_type() != ScalarType::Long))
      throw std::invalid_argument(fmt::format(
          "kdaguard: {}: {}_cpu must be a 1-D int32 or int64 CPU tensor of {}'s length",
          entry_name(entry_), name, name));
    std::vector<std::int64_t> values(static_cast<std::size_t>(c.size(0)));
    const int64_t stride = c.stride(0);
    if (c.scalar_type() == ScalarType::Int) {
      const auto* p = static_cast<const std::int32_t*>(c.data_ptr());
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = p[i * stride];
    } else {
      const auto* p = static_cast<const std::int64_t*>(c.data_ptr());
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = p[i * stride];
    }
    slot->values = std::move(values);
  }

  void refuse_early() const {
    if (!early_.accepted()) raise(entry_, Status::refused(early_));
  }
  // The device the call runs on: the first CUDA tensor's, for the CUDA impls.
  int cuda_device() const { return cuda_device_.value_or(0); }

 private:
  Entry entry_;
  Verdict early_;
  std::optional<int> cuda_device_;
};

void set_scalars(Scalars& s, std::optional<double> scale, std::optional<double> lower_bound,
                 bool use_qk_l2norm) {
  s.scale = scale;
  s.lower_bound = lower_bound;
  s.use_qk_l2norm = use_qk_l2norm;
}

// ---- the calls, built from the ops' arguments (names and order as in call.h) ----

struct TokenArgs {
  const Tensor &q, &k, &v;
  const OptTensor &a, &g, &A_log, &dt_bias, &b, &beta;
};

template <class Call> void set_tokens(CallBuilder& c, Call& call, const TokenArgs& t) {
  c.set(call.q, t.q, "q");
  c.set(call.k, t.k, "k");
  c.set(call.v, t.v, "v");
  c.set(call.a, t.a, "a");
  c.set(call.g, t.g, "g");
  c.set(call.A_log, t.A_log, "A_log");
  c.set(call.dt_bias, t.dt_bias, "dt_bias");
  c.set(call.b, t.b, "b");
  c.set(call.beta, t.beta, "beta");
}

#ifdef KDAGUARD_TORCH_CUDA
// The current stream of `device`, from the shim: the raw cudaStream_t (torch::stable's
// Stream::id() is torch's stream id, not the handle).
cudaStream_t current_stream(int device) {
  void* stream = nullptr;
  if (aoti_torch_get_current_cuda_stream(device, &stream) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("kdaguard: could not read the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return true;  // unknown: treat as capturing, so no host copy is trusted
  }
  return status != cudaStreamCaptureStatusNone;
}

// Row flags for the device guard, from torch's caching allocator on the current stream (inside a
// capture: the graph's pool). Freed when the op returns; the caching allocator reuses it only
// after the stream has run past the kernels that use it.
Tensor row_flags_for(int64_t rows, int device) {
  const int64_t size = rows > 0 ? rows : 1, stride = 1;
  AtenTensorHandle handle = nullptr;
  if (aoti_torch_empty_strided(1, &size, &stride, aoti_torch_dtype_int32(),
                               aoti_torch_device_type_cuda(), device,
                               &handle) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("kdaguard: could not allocate the guard's row flags");
  return Tensor(handle);
}

// The launch options of one call: its stream, the caller's error word and row flags that live as
// long as this object (the op's scope).
struct GuardedLaunch {
  gpu::LaunchOptions options;
  Tensor row_flags;
};

GuardedLaunch guarded_launch(Entry entry, int device, const Tensor& error_word, int64_t rows,
                             int64_t chunks_per_block, cudaStream_t stream) {
  if (!error_word.is_cuda() || error_word.get_device_index() != device ||
      error_word.scalar_type() != ScalarType::Long || error_word.numel() < 1)
    throw std::invalid_argument(fmt::format(
        "kdaguard: {}: error_word must be an int64 tensor of at least one element on cuda:{}",
        entry_name(entry), device));
  GuardedLaunch launch{gpu::LaunchOptions{}, row_flags_for(rows, device)};
  gpu::LaunchOptions& options = launch.options;
  options.stream = stream;
  options.guard.error_word = static_cast<unsigned long long*>(error_word.data_ptr());
  options.guard.row_flags = static_cast<std::int32_t*>(launch.row_flags.data_ptr());
  options.guard.row_flags_capacity = rows > 0 ? rows : 1;
  options.chunks_per_block = static_cast<int>(chunks_per_block);
  return launch;
}
#endif

#ifndef KDAGUARD_TORCH_CUDA
[[noreturn]] void no_cuda(Entry entry) {
  throw std::runtime_error(fmt::format(
      "kdaguard: {} unsupported: this kdaguard module was built without the CUDA kernels (no "
      "nvcc at build time); only CPU tensors run, on the f64 reference",
      entry_name(entry)));
}
#endif

// Used by the CUDA entry points only: unused in a CPU-only build.
[[maybe_unused]] int64_t leading(const Tensor& t) { return t.dim() >= 1 ? t.size(0) : 0; }

// ---- decode ----
DecodeCall decode_call(CallBuilder& c, const Tensor& q, const Tensor& k, const Tensor& v,
                       const OptTensor& a, const OptTensor& g, const OptTensor& A_log,
                       const OptTensor& dt_bias, const OptTensor& b, const OptTensor& beta,
                       const Tensor& state, const Tensor& cache_indices,
                       const OptTensor& cu_seqlens, const Tensor& out,
                       std::optional<double> scale, std::optional<double> lower_bound,
                       bool use_qk_l2norm) {
  DecodeCall call;
  set_tokens(c, call, {q, k, v, a, g, A_log, dt_bias, b, beta});
  c.set(call.state, state, "state");
  c.set(call.cache_indices, cache_indices, "cache_indices");
  c.set(call.cu_seqlens, cu_seqlens, "cu_seqlens");
  c.set(call.out, out, "out");
  set_scalars(call.scalars, scale, lower_bound, use_qk_l2norm);
  c.refuse_early();
  return call;
}

void decode_cpu(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor state,
                Tensor cache_indices, OptTensor cu_seqlens, Tensor out, Tensor /*error_word*/,
                std::optional<double> scale, std::optional<double> lower_bound,
                bool use_qk_l2norm, OptTensor /*cache_indices_cpu*/,
                int64_t /*chunks_per_block*/) {
  CallBuilder c(Entry::decode);
  DecodeCall call = decode_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, state, cache_indices,
                                cu_seqlens, out, scale, lower_bound, use_qk_l2norm);
  call.device = Device{Device::Kind::cpu, 0};
  if (Status s = reference::decode(call); !s.ok()) raise(Entry::decode, s);
}

void decode_cuda(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                 OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor state,
                 Tensor cache_indices, OptTensor cu_seqlens, Tensor out, Tensor error_word,
                 std::optional<double> scale, std::optional<double> lower_bound,
                 bool use_qk_l2norm, OptTensor cache_indices_cpu, int64_t chunks_per_block) {
#ifdef KDAGUARD_TORCH_CUDA
  CallBuilder c(Entry::decode);
  DecodeCall call = decode_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, state, cache_indices,
                                cu_seqlens, out, scale, lower_bound, use_qk_l2norm);
  const int device = c.cuda_device();
  call.device = Device{Device::Kind::cuda, device};
  const torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  if (!capturing(stream)) c.host_values(call.cache_indices, cache_indices_cpu, "cache_indices");
  const GuardedLaunch launch =
      guarded_launch(Entry::decode, device, error_word, leading(q), chunks_per_block, stream);
  if (Status s = gpu::decode(call, launch.options); !s.ok()) raise(Entry::decode, s);
#else
  (void)q, (void)k, (void)v, (void)a, (void)g, (void)A_log, (void)dt_bias, (void)b, (void)beta,
      (void)state, (void)cache_indices, (void)cu_seqlens, (void)out, (void)error_word,
      (void)scale, (void)lower_bound, (void)use_qk_l2norm, (void)cache_indices_cpu,
      (void)chunks_per_block;
  no_cuda(Entry::decode);
#endif
}

std::string can_decode(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                       OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor state,
                       Tensor cache_indices, OptTensor cu_seqlens, Tensor out,
                       std::optional<double> scale, std::optional<double> lower_bound,
                       bool use_qk_l2norm) {
  try {
    CallBuilder c(Entry::decode);
    DecodeCall call = decode_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, state,
                                  cache_indices, cu_seqlens, out, scale, lower_bound,
                                  use_qk_l2norm);
    if (q.is_cpu()) {
      call.device = Device{Device::Kind::cpu, 0};
      return verdict_text(Entry::decode, reference::admit(call));
    }
#ifdef KDAGUARD_TORCH_CUDA
    call.device = Device{Device::Kind::cuda, c.cuda_device()};
    const torch::stable::accelerator::DeviceGuard guard(c.cuda_device());
    return verdict_text(Entry::decode, gpu::can_implement(call));
#else
    no_cuda(Entry::decode);
#endif
  } catch (const std::exception& e) {
    return e.what();
  }
}

// ---- prefill ----
PrefillCall prefill_call(CallBuilder& c, const Tensor& q, const Tensor& k, const Tensor& v,
                         const OptTensor& a, const OptTensor& g, const OptTensor& A_log,
                         const OptTensor& dt_bias, const OptTensor& b, const OptTensor& beta,
                         const Tensor& cu_seqlens, const Tensor& initial_state,
                         const Tensor& initial_state_indices, const Tensor& out,
                         std::optional<double> scale, std::optional<double> lower_bound,
                         bool use_qk_l2norm) {
  PrefillCall call;
  set_tokens(c, call, {q, k, v, a, g, A_log, dt_bias, b, beta});
  c.set(call.cu_seqlens, cu_seqlens, "cu_seqlens");
  c.set(call.initial_state, initial_state, "initial_state");
  c.set(call.initial_state_indices, initial_state_indices, "initial_state_indices");
  c.set(call.out, out, "out");
  set_scalars(call.scalars, scale, lower_bound, use_qk_l2norm);
  c.refuse_early();
  return call;
}

void prefill_cpu(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                 OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor cu_seqlens,
                 Tensor initial_state, Tensor initial_state_indices, Tensor out,
                 Tensor /*error_word*/, OptTensor /*workspace*/, std::optional<double> scale,
                 std::optional<double> lower_bound, bool use_qk_l2norm,
                 OptTensor /*cu_seqlens_cpu*/, OptTensor /*initial_state_indices_cpu*/) {
  CallBuilder c(Entry::prefill);
  PrefillCall call = prefill_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens,
                                  initial_state, initial_state_indices, out, scale, lower_bound,
                                  use_qk_l2norm);
  call.device = Device{Device::Kind::cpu, 0};
  if (Status s = reference::prefill(call); !s.ok()) raise(Entry::prefill, s);
}

void prefill_cuda(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                  OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor cu_seqlens,
                  Tensor initial_state, Tensor initial_state_indices, Tensor out,
                  Tensor error_word, OptTensor workspace, std::optional<double> scale,
                  std::optional<double> lower_bound, bool use_qk_l2norm,
                  OptTensor cu_seqlens_cpu, OptTensor initial_state_indices_cpu) {
#ifdef KDAGUARD_TORCH_CUDA
  CallBuilder c(Entry::prefill);
  PrefillCall call = prefill_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens,
                                  initial_state, initial_state_indices, out, scale, lower_bound,
                                  use_qk_l2norm);
  const int device = c.cuda_device();
  call.device = Device{Device::Kind::cuda, device};
  const torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  if (!capturing(stream)) {
    c.host_values(call.cu_seqlens, cu_seqlens_cpu, "cu_seqlens");
    c.host_values(call.initial_state_indices, initial_state_indices_cpu,
                  "initial_state_indices");
  }
  GuardedLaunch launch =
      guarded_launch(Entry::prefill, device, error_word, leading(cu_seqlens) - 1, 0, stream);
  gpu::LaunchOptions& options = launch.options;
  if (workspace) {
    if (!workspace->is_cuda() || workspace->get_device_index() != device ||
        !workspace->is_contiguous())
      throw std::invalid_argument(fmt::format(
          "kdaguard: prefill: workspace must be a contiguous tensor on cuda:{}", device));
    options.workspace.data = workspace->data_ptr();
    options.workspace.bytes = workspace->numel() * static_cast<int64_t>(workspace->element_size());
  }
  if (Status s = gpu::prefill(call, options); !s.ok()) raise(Entry::prefill, s);
#else
  (void)q, (void)k, (void)v, (void)a, (void)g, (void)A_log, (void)dt_bias, (void)b, (void)beta,
      (void)cu_seqlens, (void)initial_state, (void)initial_state_indices, (void)out,
      (void)error_word, (void)workspace, (void)scale, (void)lower_bound, (void)use_qk_l2norm,
      (void)cu_seqlens_cpu, (void)initial_state_indices_cpu;
  no_cuda(Entry::prefill);
#endif
}

std::string can_prefill(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g,
                        OptTensor A_log, OptTensor dt_bias, OptTensor b, OptTensor beta,
                        Tensor cu_seqlens, Tensor initial_state, Tensor initial_state_indices,
                        Tensor out, std::optional<double> scale,
                        std::optional<double> lower_bound, bool use_qk_l2norm) {
  try {
    CallBuilder c(Entry::prefill);
    PrefillCall call = prefill_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens,
                                    initial_state, initial_state_indices, out, scale,
                                    lower_bound, use_qk_l2norm);
    if (q.is_cpu()) {
      call.device = Device{Device::Kind::cpu, 0};
      return verdict_text(Entry::prefill, reference::admit(call));
    }
#ifdef KDAGUARD_TORCH_CUDA
    call.device = Device{Device::Kind::cuda, c.cuda_device()};
    const torch::stable::accelerator::DeviceGuard guard(c.cuda_device());
    return verdict_text(Entry::prefill, gpu::can_implement(call));
#else
    no_cuda(Entry::prefill);
#endif
  } catch (const std::exception& e) {
    return e.what();
  }
}

// ---- verify ----
VerifyCall verify_call(CallBuilder& c, const Tensor& q, const Tensor& k, const Tensor& v,
                       const OptTensor& a, const OptTensor& g, const OptTensor& A_log,
                       const OptTensor& dt_bias, const OptTensor& b, const OptTensor& beta,
                       const Tensor& cu_seqlens, const Tensor& state,
                       const Tensor& cache_indices, const Tensor& scratch,
                       const OptTensor& scratch_row_map, const OptTensor& scratch_indices,
                       const Tensor& out, int64_t draft_token_num, std::optional<double> scale,
                       std::optional<double> lower_bound, bool use_qk_l2norm) {
  VerifyCall call;
  set_tokens(c, call, {q, k, v, a, g, A_log, dt_bias, b, beta});
  c.set(call.cu_seqlens, cu_seqlens, "cu_seqlens");
  c.set(call.state, state, "state");
  c.set(call.cache_indices, cache_indices, "cache_indices");
  c.set(call.scratch, scratch, "scratch");
  c.set(call.scratch_row_map, scratch_row_map, "scratch_row_map");
  c.set(call.scratch_indices, scratch_indices, "scratch_indices");
  c.set(call.out, out, "out");
  set_scalars(call.scalars, scale, lower_bound, use_qk_l2norm);
  call.scalars.draft_token_num = draft_token_num;
  c.refuse_early();
  return call;
}

void verify_cpu(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor cu_seqlens, Tensor state,
                Tensor cache_indices, Tensor scratch, OptTensor scratch_row_map,
                OptTensor scratch_indices, Tensor out, Tensor /*error_word*/,
                int64_t draft_token_num, std::optional<double> scale,
                std::optional<double> lower_bound, bool use_qk_l2norm,
                OptTensor /*cu_seqlens_cpu*/, OptTensor /*cache_indices_cpu*/,
                int64_t /*chunks_per_block*/) {
  CallBuilder c(Entry::verify);
  VerifyCall call = verify_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, state,
                                cache_indices, scratch, scratch_row_map, scratch_indices, out,
                                draft_token_num, scale, lower_bound, use_qk_l2norm);
  call.device = Device{Device::Kind::cpu, 0};
  if (Status s = reference::verify(call); !s.ok()) raise(Entry::verify, s);
}

void verify_cuda(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                 OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor cu_seqlens,
                 Tensor state, Tensor cache_indices, Tensor scratch, OptTensor scratch_row_map,
                 OptTensor scratch_indices, Tensor out, Tensor error_word,
                 int64_t draft_token_num, std::optional<double> scale,
                 std::optional<double> lower_bound, bool use_qk_l2norm,
                 OptTensor cu_seqlens_cpu, OptTensor cache_indices_cpu,
                 int64_t chunks_per_block) {
#ifdef KDAGUARD_TORCH_CUDA
  CallBuilder c(Entry::verify);
  VerifyCall call = verify_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, state,
                                cache_indices, scratch, scratch_row_map, scratch_indices, out,
                                draft_token_num, scale, lower_bound, use_qk_l2norm);
  const int device = c.cuda_device();
  call.device = Device{Device::Kind::cuda, device};
  const torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  if (!capturing(stream)) {
    c.host_values(call.cu_seqlens, cu_seqlens_cpu, "cu_seqlens");
    c.host_values(call.cache_indices, cache_indices_cpu, "cache_indices");
  }
  const GuardedLaunch launch = guarded_launch(Entry::verify, device, error_word,
                                              leading(cu_seqlens) - 1, chunks_per_block, stream);
  if (Status s = gpu::verify(call, launch.options); !s.ok()) raise(Entry::verify, s);
#else
  (void)q, (void)k, (void)v, (void)a, (void)g, (void)A_log, (void)dt_bias, (void)b, (void)beta,
      (void)cu_seqlens, (void)state, (void)cache_indices, (void)scratch, (void)scratch_row_map,
      (void)scratch_indices, (void)out, (void)error_word, (void)draft_token_num, (void)scale,
      (void)lower_bound, (void)use_qk_l2norm, (void)cu_seqlens_cpu, (void)cache_indices_cpu,
      (void)chunks_per_block;
  no_cuda(Entry::verify);
#endif
}

std::string can_verify(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                       OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor cu_seqlens,
                       Tensor state, Tensor cache_indices, Tensor scratch,
                       OptTensor scratch_row_map, OptTensor scratch_indices, Tensor out,
                       int64_t draft_token_num, std::optional<double> scale,
                       std::optional<double> lower_bound, bool use_qk_l2norm) {
  try {
    CallBuilder c(Entry::verify);
    VerifyCall call = verify_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, cu_seqlens, state,
                                  cache_indices, scratch, scratch_row_map, scratch_indices, out,
                                  draft_token_num, scale, lower_bound, use_qk_l2norm);
    if (q.is_cpu()) {
      call.device = Device{Device::Kind::cpu, 0};
      return verdict_text(Entry::verify, reference::admit(call));
    }
#ifdef KDAGUARD_TORCH_CUDA
    call.device = Device{Device::Kind::cuda, c.cuda_device()};
    const torch::stable::accelerator::DeviceGuard guard(c.cuda_device());
    return verdict_text(Entry::verify, gpu::can_implement(call));
#else
    no_cuda(Entry::verify);
#endif
  } catch (const std::exception& e) {
    return e.what();
  }
}

// ---- commit ----
CommitCall commit_call(CallBuilder& c, const Tensor& scratch, const OptTensor& scratch_row_map,
                       const OptTensor& scratch_indices, const Tensor& state,
                       const Tensor& cache_indices, const Tensor& accepted,
                       const OptTensor& cu_seqlens, int64_t draft_token_num) {
  CommitCall call;
  c.set(call.scratch, scratch, "scratch");
  c.set(call.scratch_row_map, scratch_row_map, "scratch_row_map");
  c.set(call.scratch_indices, scratch_indices, "scratch_indices");
  c.set(call.state, state, "state");
  c.set(call.cache_indices, cache_indices, "cache_indices");
  c.set(call.accepted, accepted, "accepted");
  c.set(call.cu_seqlens, cu_seqlens, "cu_seqlens");
  call.scalars.draft_token_num = draft_token_num;
  c.refuse_early();
  return call;
}

void commit_cpu(Tensor scratch, OptTensor scratch_row_map, OptTensor scratch_indices,
                Tensor state, Tensor cache_indices, Tensor accepted, OptTensor cu_seqlens,
                Tensor /*error_word*/, int64_t draft_token_num) {
  CallBuilder c(Entry::commit);
  CommitCall call = commit_call(c, scratch, scratch_row_map, scratch_indices, state,
                                cache_indices, accepted, cu_seqlens, draft_token_num);
  call.device = Device{Device::Kind::cpu, 0};
  if (Status s = reference::commit(call); !s.ok()) raise(Entry::commit, s);
}

void commit_cuda(Tensor scratch, OptTensor scratch_row_map, OptTensor scratch_indices,
                 Tensor state, Tensor cache_indices, Tensor accepted, OptTensor cu_seqlens,
                 Tensor error_word, int64_t draft_token_num) {
#ifdef KDAGUARD_TORCH_CUDA
  CallBuilder c(Entry::commit);
  CommitCall call = commit_call(c, scratch, scratch_row_map, scratch_indices, state,
                                cache_indices, accepted, cu_seqlens, draft_token_num);
  const int device = c.cuda_device();
  call.device = Device{Device::Kind::cuda, device};
  const torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  const GuardedLaunch launch =
      guarded_launch(Entry::commit, device, error_word, leading(accepted), 0, stream);
  if (Status s = gpu::commit(call, launch.options); !s.ok()) raise(Entry::commit, s);
#else
  (void)scratch, (void)scratch_row_map, (void)scratch_indices, (void)state, (void)cache_indices,
      (void)accepted, (void)cu_seqlens, (void)error_word, (void)draft_token_num;
  no_cuda(Entry::commit);
#endif
}

std::string can_commit(Tensor scratch, OptTensor scratch_row_map, OptTensor scratch_indices,
                       Tensor state, Tensor cache_indices, Tensor accepted, OptTensor cu_seqlens,
                       int64_t draft_token_num) {
  try {
    CallBuilder c(Entry::commit);
    CommitCall call = commit_call(c, scratch, scratch_row_map, scratch_indices, state,
                                  cache_indices, accepted, cu_seqlens, draft_token_num);
    if (state.is_cpu()) {
      call.device = Device{Device::Kind::cpu, 0};
      return verdict_text(Entry::commit, reference::admit(call));
    }
#ifdef KDAGUARD_TORCH_CUDA
    call.device = Device{Device::Kind::cuda, c.cuda_device()};
    const torch::stable::accelerator::DeviceGuard guard(c.cuda_device());
    return verdict_text(Entry::commit, gpu::can_implement(call));
#else
    no_cuda(Entry::commit);
#endif
  } catch (const std::exception& e) {
    return e.what();
  }
}

// ---- queries without tensors ----

Entry entry_named(const std::string& name) {
  if (const std::optional<Entry> e = entry_from_name(name)) return *e;
  throw std::invalid_argument(fmt::format(
      "kdaguard: unknown entry point '{}'; expected decode, prefill, verify or commit", name));
}

// Used by the CUDA entry points only: unused in a CPU-only build.
[[maybe_unused]] DType io_dtype_named(ScalarType t, std::string_view what) {
  const std::optional<DType> d = dtype_of(t);
  if (!d) throw std::invalid_argument(fmt::format("kdaguard: {} has no kdaguard dtype", what));
  return *d;
}

int64_t prefill_workspace_bytes(int64_t total_tokens, int64_t num_seqs, int64_t HV, int64_t K,
                                int64_t V, ScalarType io_dtype) {
#ifdef KDAGUARD_TORCH_CUDA
  if (HV < 0 || HV > INT32_MAX || K < 0 || K > INT32_MAX || V < 0 || V > INT32_MAX) return -1;
  return gpu::prefill_workspace_bytes(total_tokens, num_seqs, static_cast<std::int32_t>(HV),
                                      static_cast<std::int32_t>(K), static_cast<std::int32_t>(V),
                                      io_dtype_named(io_dtype, "io_dtype"));
#else
  (void)total_tokens, (void)num_seqs, (void)HV, (void)K, (void)V, (void)io_dtype;
  return 0;  // the CPU reference needs no workspace
#endif
}

void prepare(std::string entry, int64_t K, int64_t V, ScalarType io_dtype, ScalarType state_dtype,
             int64_t device) {
  const Entry e = entry_named(entry);
#ifdef KDAGUARD_TORCH_CUDA
  const Status s = gpu::prepare(e, static_cast<std::int32_t>(K), static_cast<std::int32_t>(V),
                                io_dtype_named(io_dtype, "io_dtype"),
                                io_dtype_named(state_dtype, "state_dtype"),
                                Device{Device::Kind::cuda, static_cast<int>(device)});
  if (!s.ok()) raise(e, s);
#else
  (void)K, (void)V, (void)io_dtype, (void)state_dtype, (void)device;
  no_cuda(e);
#endif
}

bool built_with_cuda() {
#ifdef KDAGUARD_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

// The rule catalogue, one rule a line: id, tier, entry points (comma-separated), error-word bit,
// meaning, separated by tabs. kdaguard.rules() reads it, so Python has no copy of the table.
std::string rule_table() {
  std::string text;
  for (const RuleInfo& info : rule_catalogue()) {
    std::string entries;
    for (int e = 0; e < kEntryCount; ++e)
      if (info.applies_to(static_cast<Entry>(e)))
        entries += fmt::format("{}{}", entries.empty() ? "" : ",",
                               entry_name(static_cast<Entry>(e)));
    text += fmt::format("{}\t{}\t{}\t{}\t{}\n", info.id, tier_name(info.tier), entries,
                        value_checks::rule_bit(info.rule), info.meaning);
  }
  return text;
}

}  // namespace
}  // namespace kdaguard::torch_binding

namespace tb = kdaguard::torch_binding;

#define KDAGUARD_TOKEN_ARGS                                                                  \
  "Tensor q, Tensor k, Tensor v, Tensor? a, Tensor? g, Tensor? A_log, Tensor? dt_bias, "     \
  "Tensor? b, Tensor? beta, "
#define KDAGUARD_SCALARS "float? scale=None, float? lower_bound=None, bool use_qk_l2norm=False"

STABLE_TORCH_LIBRARY(kdaguard, m) {
  m.def("decode(" KDAGUARD_TOKEN_ARGS
        "Tensor(s!) state, Tensor cache_indices, Tensor? cu_seqlens, Tensor(o!) out, "
        "Tensor(e!) error_word, " KDAGUARD_SCALARS
        ", Tensor? cache_indices_cpu=None, int chunks_per_block=0) -> ()");
  m.def("prefill(" KDAGUARD_TOKEN_ARGS
        "Tensor cu_seqlens, Tensor(s!) initial_state, Tensor initial_state_indices, "
        "Tensor(o!) out, Tensor(e!) error_word, Tensor(w!)? workspace=None, " KDAGUARD_SCALARS
        ", Tensor? cu_seqlens_cpu=None, Tensor? initial_state_indices_cpu=None) -> ()");
  m.def("verify(" KDAGUARD_TOKEN_ARGS
        "Tensor cu_seqlens, Tensor state, Tensor cache_indices, Tensor(x!) scratch, "
        "Tensor? scratch_row_map, Tensor? scratch_indices, Tensor(o!) out, Tensor(e!) error_word, "
        "int draft_token_num, " KDAGUARD_SCALARS
        ", Tensor? cu_seqlens_cpu=None, Tensor? cache_indices_cpu=None, int chunks_per_block=0) "
        "-> ()");
  m.def("commit(Tensor scratch, Tensor? scratch_row_map, Tensor? scratch_indices, "
        "Tensor(s!) state, Tensor cache_indices, Tensor accepted, Tensor? cu_seqlens, "
        "Tensor(e!) error_word, int draft_token_num) -> ()");
  m.def("can_decode(" KDAGUARD_TOKEN_ARGS
        "Tensor state, Tensor cache_indices, Tensor? cu_seqlens, Tensor out, " KDAGUARD_SCALARS
        ") -> str");
  m.def("can_prefill(" KDAGUARD_TOKEN_ARGS
        "Tensor cu_seqlens, Tensor initial_state, Tensor initial_state_indices, Tensor out, "
        KDAGUARD_SCALARS ") -> str");
  m.def("can_verify(" KDAGUARD_TOKEN_ARGS
        "Tensor cu_seqlens, Tensor state, Tensor cache_indices, Tensor scratch, "
        "Tensor? scratch_row_map, Tensor? scratch_indices, Tensor out, int draft_token_num, "
        KDAGUARD_SCALARS ") -> str");
  m.def("can_commit(Tensor scratch, Tensor? scratch_row_map, Tensor? scratch_indices, "
        "Tensor state, Tensor cache_indices, Tensor accepted, Tensor? cu_seqlens, "
        "int draft_token_num) -> str");
  m.def("prefill_workspace_bytes(int total_tokens, int num_seqs, int HV, int K, int V, "
        "ScalarType io_dtype) -> int");
  m.def("prepare(str entry, int K, int V, ScalarType io_dtype, ScalarType state_dtype, "
        "int device) -> ()");
  m.def("built_with_cuda() -> bool");
  m.def("rule_table() -> str");
}

STABLE_TORCH_LIBRARY_IMPL(kdaguard, CPU, m) {
  m.impl("decode", TORCH_BOX(&tb::decode_cpu));
  m.impl("prefill", TORCH_BOX(&tb::prefill_cpu));
  m.impl("verify", TORCH_BOX(&tb::verify_cpu));
  m.impl("commit", TORCH_BOX(&tb::commit_cpu));
  m.impl("can_decode", TORCH_BOX(&tb::can_decode));
  m.impl("can_prefill", TORCH_BOX(&tb::can_prefill));
  m.impl("can_verify", TORCH_BOX(&tb::can_verify));
  m.impl("can_commit", TORCH_BOX(&tb::can_commit));
}

STABLE_TORCH_LIBRARY_IMPL(kdaguard, CUDA, m) {
  m.impl("decode", TORCH_BOX(&tb::decode_cuda));
  m.impl("prefill", TORCH_BOX(&tb::prefill_cuda));
  m.impl("verify", TORCH_BOX(&tb::verify_cuda));
  m.impl("commit", TORCH_BOX(&tb::commit_cuda));
  m.impl("can_decode", TORCH_BOX(&tb::can_decode));
  m.impl("can_prefill", TORCH_BOX(&tb::can_prefill));
  m.impl("can_verify", TORCH_BOX(&tb::can_verify));
  m.impl("can_commit", TORCH_BOX(&tb::can_commit));
}

STABLE_TORCH_LIBRARY_IMPL(kdaguard, CompositeExplicitAutograd, m) {
  m.impl("prefill_workspace_bytes", TORCH_BOX(&tb::prefill_workspace_bytes));
  m.impl("prepare", TORCH_BOX(&tb::prepare));
  m.impl("built_with_cuda", TORCH_BOX(&tb::built_with_cuda));
  m.impl("rule_table", TORCH_BOX(&tb::rule_table));
}
