// kdaguard._C: the entry points of kda.h as PyTorch dispatcher ops (torch.ops.kdaguard.*), built
// against LibTorch's stable ABI so that one binary serves every torch >= 2.10 and, tagged abi3,
// every CPython >= 3.10.
//
// The ops mirror kda.h one to one: decode, prefill, verify, commit and the record-based path
// (record_verify, replay_commit, accept_verify) mutate the tensors their schemas annotate and
// return nothing; can_* validate the same arguments and launch nothing. CPU
// tensors run the f64 reference (so the whole binding is testable without a GPU), CUDA tensors
// the sm_90a kernels on the current stream of their device, read on every call. A torch tensor
// becomes a TensorView from its metadata alone (no device read, no sync): dtype, shape, strides,
// storage offset, and its storage's base address and size, so views of one allocation (q, k, v
// sliced from a packed projection; a scratch carved out of the pool) are seen as such by
// alias.overlap. Nothing is copied, reshaped or made contiguous: a view the kernels cannot take
// is refused with its rule. Besides the contract's shapes the ops take the engine layouts that
// kdaguard.ops documents (a leading batch dim of 1, a gate [T, HV*K], A_log [1, 1, HV, 1]) as the
// views torch would make of them, computed from the metadata, so an eager call creates no tensor
// for them.
//
// Host time matters at small batches (a decode per layer per step), so a call reads each
// tensor's metadata once through the shim, makes the device current only when it is not, takes
// the device guard's row flags from the caching allocator without a tensor around them, and asks
// for the stream's capture status only when host copies of index values would depend on it.
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

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "boxing.h"
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

// ---- one tensor's metadata, read through the shim ----

// The shim's dtype and device-type codes. They are functions of the loaded libtorch that return
// constants, so they are read once rather than on every tensor of every call.
struct ShimCodes {
  int32_t f32, f16, bf16, i32, i64, cpu, cuda;
};
const ShimCodes& shim_codes() {
  static const ShimCodes codes{aoti_torch_dtype_float32(), aoti_torch_dtype_float16(),
                               aoti_torch_dtype_bfloat16(), aoti_torch_dtype_int32(),
                               aoti_torch_dtype_int64(),    aoti_torch_device_type_cpu(),
                               aoti_torch_device_type_cuda()};
  return codes;
}

std::optional<DType> dtype_of_code(int32_t code) {
  const ShimCodes& c = shim_codes();
  if (code == c.f32) return DType::f32;
  if (code == c.f16) return DType::f16;
  if (code == c.bf16) return DType::bf16;
  if (code == c.i32) return DType::i32;
  if (code == c.i64) return DType::i64;
  return std::nullopt;
}

void shim_check(AOTITorchError error, const char* what) {
  if (error != AOTI_TORCH_SUCCESS)
    throw std::runtime_error(fmt::format("kdaguard: the torch shim failed to {}", what));
}

bool is_cpu(const Tensor& t) {
  int32_t device_type = 0;
  shim_check(aoti_torch_get_device_type(t.get(), &device_type), "read a tensor's device");
  return device_type == shim_codes().cpu;
}

// An owning tensor for the reads that no call makes unless asked to (host copies of index values,
// a caller's workspace): a second handle, so the borrowed one stays the boxed kernel's.
torch::stable::Tensor owned(const Tensor& t) {
  AtenTensorHandle copy = nullptr;
  shim_check(aoti_torch_new_tensor_handle(t.get(), &copy), "copy a tensor handle");
  return torch::stable::Tensor(copy);
}

// Sizes and strides of one argument as the call takes it: the tensor's own, or those of the view
// torch's Tensor.view would make of it, computed here so that adapting an engine's layout (see
// Layout) creates no tensor per call.
class Shape {
 public:
  Shape(int64_t rank, const int64_t* size, const int64_t* stride)
      : rank_(rank), size_(size), stride_(stride) {}
  Shape(const Shape&) = delete;
  Shape& operator=(const Shape&) = delete;

  int64_t rank() const { return rank_; }
  int64_t size(int64_t d) const { return size_[d]; }
  int64_t stride(int64_t d) const { return stride_[d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d = 0; d < rank_; ++d) n *= size_[d];
    return n;
  }

  // t[0] of a [1, ...] tensor of rank + 1.
  void drop_leading_one(int64_t rank) {
    if (rank_ == rank + 1 && size_[0] == 1) {
      --rank_;
      ++size_;
      ++stride_;
    }
  }
  // t[..., 0] of a [..., 1] tensor.
  void drop_trailing_one() {
    if (rank_ >= 1 && size_[rank_ - 1] == 1) --rank_;
  }

  // Tensor.view(new_size): false where torch would raise. Torch's rule: the old dims split into
  // runs whose elements are evenly spaced (a dim of size 1 joins any run); each run maps onto
  // consecutive new dims of the same element count, strided from the run's innermost stride.
  bool view(std::initializer_list<int64_t> new_size) {
    const auto n = static_cast<int64_t>(new_size.size());
    const int64_t* ns = new_size.begin();
    int64_t new_numel = 1;
    for (int64_t d = 0; d < n; ++d) new_numel *= ns[d];
    const int64_t numel = this->numel();
    if (n > static_cast<int64_t>(own_size_.size()) || new_numel != numel) return false;
    std::array<int64_t, 3> st{};
    if (rank_ == 0) {
      st.fill(1);
    } else if (numel == 0) {
      const bool same = n == rank_ && std::equal(ns, ns + n, size_);
      for (int64_t d = n - 1; d >= 0; --d)
        st[d] = same ? stride_[d] : d == n - 1 ? 1 : std::max<int64_t>(ns[d + 1], 1) * st[d + 1];
    } else {
      int64_t view_d = n - 1, base = stride_[rank_ - 1], run_numel = 1, view_numel = 1;
      for (int64_t d = rank_ - 1; d >= 0; --d) {
        run_numel *= size_[d];
        if (d > 0 && (size_[d - 1] == 1 || stride_[d - 1] == run_numel * base)) continue;
        while (view_d >= 0 && (view_numel < run_numel || ns[view_d] == 1)) {
          st[view_d] = view_numel * base;
          view_numel *= ns[view_d];
          --view_d;
        }
        if (view_numel != run_numel) return false;
        if (d > 0) {
          base = stride_[d - 1];
          run_numel = view_numel = 1;
        }
      }
      if (view_d != -1) return false;
    }
    std::copy(ns, ns + n, own_size_.begin());
    own_stride_ = st;
    rank_ = n;
    size_ = own_size_.data();
    stride_ = own_stride_.data();
    return true;
  }

 private:
  int64_t rank_;
  const int64_t* size_;
  const int64_t* stride_;
  std::array<int64_t, 3> own_size_{}, own_stride_{};
};

// The engine layouts the ops accept beside the contract's own, as the views kdaguard.ops
// documents: a leading batch dim of 1 on q/k/v/out ([1, T, H, K]) and on the gates and betas, a
// gate [T, HV*K], beta [T, HV, 1] (also when T = 1, where [1, HV, 1] also has a leading 1), A_log
// of HV elements in any shape ([1, 1, HV, 1]). A tensor
// that is none of these is taken as it is, and refused with its rule when the contract's shape
// differs.
enum class Layout { as_is, tokens, gate, beta, a_log };

void adapt(Shape& s, Layout layout, int64_t HV, int64_t K) {
  switch (layout) {
    case Layout::as_is: return;
    case Layout::tokens: s.drop_leading_one(3); return;
    case Layout::gate:
      s.drop_leading_one(3);
      if (s.rank() == 2 && s.size(1) == HV * K) s.view({s.size(0), HV, K});
      return;
    case Layout::beta:  // [T, HV, 1] first: with T = 1 it also has a leading 1
      if (s.rank() == 3 && s.size(1) == HV && s.size(2) == 1)
        s.drop_trailing_one();
      else
        s.drop_leading_one(2);
      return;
    case Layout::a_log:
      if (s.rank() != 1 && s.numel() == HV) s.view({HV});
      return;
  }
}

// Builds one call's views. Violations that a TensorView cannot even express (a dtype outside
// its set, a rank past kMaxRank) are collected here and refused in the same format as the
// contracts' own, before validate() runs.
class CallBuilder {
 public:
  explicit CallBuilder(Entry entry) : entry_(entry) {}

  // Sets `slot` from `t` taken in `layout` (HV and K: the call's, for the gate layouts) and
  // returns the view's rank and last two sizes (0 where absent).
  struct Tail {
    int64_t rank = 0, last = 0, before_last = 0;
  };
  Tail set(OptionalView& slot, const Tensor& t, std::string_view name,
           Layout layout = Layout::as_is, int64_t HV = 0, int64_t K = 0) {
    const AtenTensorHandle h = t.get();
    int64_t rank = 0;
    int64_t *sizes = nullptr, *strides = nullptr;
    int32_t dtype_code = 0;
    shim_check(aoti_torch_get_dim(h, &rank), "read a tensor's rank");
    shim_check(aoti_torch_get_sizes(h, &sizes), "read a tensor's sizes");
    shim_check(aoti_torch_get_strides(h, &strides), "read a tensor's strides");
    shim_check(aoti_torch_get_dtype(h, &dtype_code), "read a tensor's dtype");
    Shape shape(rank, sizes, strides);
    adapt(shape, layout, HV, K);
    Tail tail{shape.rank(), shape.rank() >= 1 ? shape.size(shape.rank() - 1) : 0,
              shape.rank() >= 2 ? shape.size(shape.rank() - 2) : 0};

    TensorView& view = slot.emplace();
    const std::optional<DType> dtype = dtype_of_code(dtype_code);
    if (!dtype) {
      early_.violations.push_back(
          {RuleId::arg_dtype, name,
           fmt::format("{} has a dtype kdaguard does not take (torch dtype code {}); expected "
                       "one of f32, f16, bf16, i32, i64 as the argument allows",
                       name, dtype_code)});
      return tail;
    }
    if (shape.rank() > kMaxRank) {
      early_.violations.push_back(
          {RuleId::arg_rank, name,
           fmt::format("{} has rank {}; no kdaguard argument has more than {} dims", name,
                       shape.rank(), kMaxRank)});
      return tail;
    }
    view.dtype = *dtype;
    int32_t device_type = 0;
    shim_check(aoti_torch_get_device_type(h, &device_type), "read a tensor's device");
    if (device_type == shim_codes().cuda) {
      int32_t index = 0;
      shim_check(aoti_torch_get_device_index(h, &index), "read a tensor's device index");
      view.device = Device{Device::Kind::cuda, index};
      if (!cuda_device_) cuda_device_ = index;
    } else if (device_type == shim_codes().cpu) {
      view.device = Device{Device::Kind::cpu, 0};
    } else {
      throw std::runtime_error(fmt::format(
          "kdaguard: {} unsupported: {} is on a device that is neither cpu nor cuda",
          entry_name(entry_), name));
    }
    view.rank = static_cast<int>(shape.rank());
    for (int i = 0; i < view.rank; ++i) {
      view.shape[i] = shape.size(i);
      view.stride[i] = shape.stride(i);
    }
    int64_t offset = 0;
    void* data = nullptr;
    shim_check(aoti_torch_get_storage_offset(h, &offset), "read a tensor's storage offset");
    shim_check(aoti_torch_get_data_ptr(h, &data), "read a tensor's data pointer");
    const int64_t esize = element_size(*dtype);
    view.storage_offset = Elements{offset};
    view.address = reinterpret_cast<std::uintptr_t>(data) -
                   static_cast<std::uint64_t>(offset) * static_cast<std::uint64_t>(esize);
    int64_t storage_bytes = 0;
    if (aoti_torch_get_storage_size(h, &storage_bytes) == AOTI_TORCH_SUCCESS)
      view.storage_size = Elements{storage_bytes / esize};
    return tail;
  }
  Tail set(OptionalView& slot, const OptTensor& t, std::string_view name,
           Layout layout = Layout::as_is, int64_t HV = 0, int64_t K = 0) {
    return t ? set(slot, *t, name, layout, HV, K) : Tail{};
  }

  // The host copy of an index tensor's values, from a CPU tensor the caller passes beside it.
  void host_values(OptionalView& slot, const OptTensor& copy, std::string_view name) {
    if (!copy || !slot) return;
    const torch::stable::Tensor c = owned(*copy);
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
  const int64_t K = c.set(call.q, t.q, "q", Layout::tokens).last;
  c.set(call.k, t.k, "k", Layout::tokens);
  const CallBuilder::Tail v = c.set(call.v, t.v, "v", Layout::tokens);
  const int64_t HV = v.rank >= 2 ? v.before_last : 0;
  c.set(call.a, t.a, "a", Layout::gate, HV, K);
  c.set(call.g, t.g, "g", Layout::gate, HV, K);
  c.set(call.A_log, t.A_log, "A_log", Layout::a_log, HV);
  c.set(call.dt_bias, t.dt_bias, "dt_bias");
  c.set(call.b, t.b, "b", Layout::beta, HV);
  c.set(call.beta, t.beta, "beta", Layout::beta, HV);
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

// Makes the call's device current for the op's scope; no guard (and no shim round trip to create
// one) when it already is.
class CallDevice {
 public:
  explicit CallDevice(int device) {
    int32_t current = -1;
    shim_check(aoti_torch_get_current_device_index(&current), "read the current device");
    if (current != device) guard_.emplace(device);
  }

 private:
  std::optional<torch::stable::accelerator::DeviceGuard> guard_;
};


// Whether the call needs the guard's row flags: verify and prefill hand their guard kernel's
// per-row verdicts to the main kernel through them; decode and commit judge their rows in the
// kernel's prologue. Only calls that defer value rules to the device run a guard at all.
template <class Call> bool needs_row_flags(const Call& call) {
  return (Call::kEntry == Entry::verify || Call::kEntry == Entry::prefill) &&
         defers_value_rules(call);
}

// Row flags for the device guard, one int32 per row, from torch's caching allocator on the
// current stream (inside a capture: the graph's pool), given back when the op returns; the
// allocator hands the block out again only to work queued on this stream after these kernels.
class RowFlags {
 public:
  RowFlags(int64_t rows, bool needed) {
    if (!needed) return;
    capacity_ = rows > 0 ? rows : 1;
    shim_check(aoti_torch_cuda_caching_allocator_raw_alloc(
                   static_cast<uint64_t>(capacity_) * sizeof(std::int32_t), &data_),
               "allocate the device guard's row flags");
  }
  RowFlags(const RowFlags&) = delete;
  RowFlags& operator=(const RowFlags&) = delete;
  ~RowFlags() {
    if (data_ != nullptr) aoti_torch_cuda_caching_allocator_raw_delete(data_);
  }
  std::int32_t* data() const { return static_cast<std::int32_t*>(data_); }
  int64_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  int64_t capacity_ = 0;
};

// The caller's error word: an int64 tensor of at least one element on the call's device.
unsigned long long* error_word_address(Entry entry, const Tensor& word, int device) {
  const AtenTensorHandle h = word.get();
  int32_t device_type = 0, index = -1, dtype = 0;
  int64_t numel = 0;
  void* data = nullptr;
  shim_check(aoti_torch_get_device_type(h, &device_type), "read the error word's device");
  shim_check(aoti_torch_get_device_index(h, &index), "read the error word's device index");
  shim_check(aoti_torch_get_dtype(h, &dtype), "read the error word's dtype");
  shim_check(aoti_torch_get_numel(h, &numel), "read the error word's size");
  if (device_type != shim_codes().cuda || index != device || dtype != shim_codes().i64 ||
      numel < 1)
    throw std::invalid_argument(fmt::format(
        "kdaguard: {}: error_word must be an int64 tensor of at least one element on cuda:{}",
        entry_name(entry), device));
  shim_check(aoti_torch_get_data_ptr(h, &data), "read the error word's data pointer");
  return static_cast<unsigned long long*>(data);
}

// The launch options of one call: its stream, the caller's error word, and row flags that live
// as long as this object (the op's scope).
struct GuardedLaunch {
  template <class Call>
  GuardedLaunch(const Call& call, int device, const Tensor& error_word, int64_t rows,
                int64_t chunks_per_block, cudaStream_t stream)
      : row_flags(rows, needs_row_flags(call)) {
    options.stream = stream;
    options.guard.error_word = error_word_address(Call::kEntry, error_word, device);
    options.guard.row_flags = row_flags.data();
    options.guard.row_flags_capacity = row_flags.capacity();
    options.chunks_per_block = static_cast<int>(chunks_per_block);
  }
  gpu::LaunchOptions options;
  RowFlags row_flags;
};
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
[[maybe_unused]] int64_t leading(const OptionalView& view) { return view && view->rank >= 1 ? view->shape[0] : 0; }

// The verdict of a query op on a built call: the reference's admission on CPU tensors, the
// kernels' can_implement on CUDA ones.
template <class Call> std::string query_verdict(CallBuilder& c, Call& call, bool cpu) {
  if (cpu) {
    call.device = Device{Device::Kind::cpu, 0};
    return verdict_text(Call::kEntry, reference::admit(call));
  }
#ifdef KDAGUARD_TORCH_CUDA
  call.device = Device{Device::Kind::cuda, c.cuda_device()};
  const CallDevice current(c.cuda_device());
  return verdict_text(Call::kEntry, gpu::can_implement(call));
#else
  (void)c;
  no_cuda(Call::kEntry);
#endif
}

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
  c.set(call.out, out, "out", Layout::tokens);
  set_scalars(call.scalars, scale, lower_bound, use_qk_l2norm);
  c.refuse_early();
  return call;
}

void decode_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& a,
                const OptTensor& g, const OptTensor& A_log, const OptTensor& dt_bias,
                const OptTensor& b, const OptTensor& beta, const Tensor& state,
                const Tensor& cache_indices, const OptTensor& cu_seqlens, const Tensor& out,
                const Tensor& /*error_word*/, std::optional<double> scale,
                std::optional<double> lower_bound, bool use_qk_l2norm,
                const OptTensor& /*cache_indices_cpu*/, int64_t /*chunks_per_block*/) {
  CallBuilder c(Entry::decode);
  DecodeCall call = decode_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, state, cache_indices,
                                cu_seqlens, out, scale, lower_bound, use_qk_l2norm);
  call.device = Device{Device::Kind::cpu, 0};
  if (Status s = reference::decode(call); !s.ok()) raise(Entry::decode, s);
}

void decode_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& a,
                 const OptTensor& g, const OptTensor& A_log, const OptTensor& dt_bias,
                 const OptTensor& b, const OptTensor& beta, const Tensor& state,
                 const Tensor& cache_indices, const OptTensor& cu_seqlens, const Tensor& out,
                 const Tensor& error_word, std::optional<double> scale,
                 std::optional<double> lower_bound, bool use_qk_l2norm,
                 const OptTensor& cache_indices_cpu, int64_t chunks_per_block) {
#ifdef KDAGUARD_TORCH_CUDA
  CallBuilder c(Entry::decode);
  DecodeCall call = decode_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, state, cache_indices,
                                cu_seqlens, out, scale, lower_bound, use_qk_l2norm);
  const int device = c.cuda_device();
  call.device = Device{Device::Kind::cuda, device};
  const CallDevice current(device);
  const cudaStream_t stream = current_stream(device);
  if (cache_indices_cpu && !capturing(stream))
    c.host_values(call.cache_indices, cache_indices_cpu, "cache_indices");
  const GuardedLaunch launch(call, device, error_word, leading(call.q), chunks_per_block, stream);
  if (Status s = gpu::decode(call, launch.options); !s.ok()) raise(Entry::decode, s);
#else
  (void)q, (void)k, (void)v, (void)a, (void)g, (void)A_log, (void)dt_bias, (void)b, (void)beta,
      (void)state, (void)cache_indices, (void)cu_seqlens, (void)out, (void)error_word,
      (void)scale, (void)lower_bound, (void)use_qk_l2norm, (void)cache_indices_cpu,
      (void)chunks_per_block;
  no_cuda(Entry::decode);
#endif
}

std::string can_decode(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& a,
                       const OptTensor& g, const OptTensor& A_log, const OptTensor& dt_bias,
                       const OptTensor& b, const OptTensor& beta, const Tensor& state,
                       const Tensor& cache_indices, const OptTensor& cu_seqlens,
                       const Tensor& out, std::optional<double> scale,
                       std::optional<double> lower_bound, bool use_qk_l2norm) {
  try {
    CallBuilder c(Entry::decode);
    DecodeCall call = decode_call(c, q, k, v, a, g, A_log, dt_bias, b, beta, state,
                                  cache_indices, cu_seqlens, out, scale, lower_bound,
                                  use_qk_l2norm);
    return query_verdict(c, call, is_cpu(q));
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
  c.set(call.out, out, "out", Layout::tokens);
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
  const CallDevice current(device);
  const cudaStream_t stream = current_stream(device);
  if ((cu_seqlens_cpu || initial_state_indices_cpu) && !capturing(stream)) {
    c.host_values(call.cu_seqlens, cu_seqlens_cpu, "cu_seqlens");
    c.host_values(call.initial_state_indices, initial_state_indices_cpu,
                  "initial_state_indices");
  }
  GuardedLaunch launch(call, device, error_word, leading(call.cu_seqlens) - 1, 0, stream);
  gpu::LaunchOptions& options = launch.options;
  if (workspace) {
    const torch::stable::Tensor w = owned(*workspace);
    if (!w.is_cuda() || w.get_device_index() != device || !w.is_contiguous())
      throw std::invalid_argument(fmt::format(
          "kdaguard: prefill: workspace must be a contiguous tensor on cuda:{}", device));
    options.workspace.data = w.data_ptr();
    options.workspace.bytes = w.numel() * static_cast<int64_t>(w.element_size());
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
    return query_verdict(c, call, is_cpu(q));
  } catch (const std::exception& e) {
    return e.what();
  }
}

// ---- verify ----
// The call of a drafting entry point (verify, record_verify, accept_verify: Call) from what they
// share: the draft's tokens, its offsets, the pool and slot map, out and the scalars; `more` sets
// the entry point's own arguments (scratch, records, the prior step's records).
template <class Call, class More>
Call draft_call(CallBuilder& c, const TokenArgs& tokens, const Tensor& cu_seqlens,
                const Tensor& state, const Tensor& cache_indices, const Tensor& out,
                int64_t draft_token_num, std::optional<double> scale,
                std::optional<double> lower_bound, bool use_qk_l2norm, More&& more) {
  Call call;
  set_tokens(c, call, tokens);
  c.set(call.cu_seqlens, cu_seqlens, "cu_seqlens");
  c.set(call.state, state, "state");
  c.set(call.cache_indices, cache_indices, "cache_indices");
  more(call, c);
  c.set(call.out, out, "out", Layout::tokens);
  set_scalars(call.scalars, scale, lower_bound, use_qk_l2norm);
  call.scalars.draft_token_num = draft_token_num;
  c.refuse_early();
  return call;
}

VerifyCall verify_call(CallBuilder& c, const Tensor& q, const Tensor& k, const Tensor& v,
                       const OptTensor& a, const OptTensor& g, const OptTensor& A_log,
                       const OptTensor& dt_bias, const OptTensor& b, const OptTensor& beta,
                       const Tensor& cu_seqlens, const Tensor& state,
                       const Tensor& cache_indices, const Tensor& scratch,
                       const OptTensor& scratch_row_map, const OptTensor& scratch_indices,
                       const Tensor& out, int64_t draft_token_num, std::optional<double> scale,
                       std::optional<double> lower_bound, bool use_qk_l2norm) {
  return draft_call<VerifyCall>(
      c, {q, k, v, a, g, A_log, dt_bias, b, beta}, cu_seqlens, state, cache_indices, out,
      draft_token_num, scale, lower_bound, use_qk_l2norm, [&](VerifyCall& call, CallBuilder& b) {
        b.set(call.scratch, scratch, "scratch");
        b.set(call.scratch_row_map, scratch_row_map, "scratch_row_map");
        b.set(call.scratch_indices, scratch_indices, "scratch_indices");
      });
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
  const CallDevice current(device);
  const cudaStream_t stream = current_stream(device);
  if ((cu_seqlens_cpu || cache_indices_cpu) && !capturing(stream)) {
    c.host_values(call.cu_seqlens, cu_seqlens_cpu, "cu_seqlens");
    c.host_values(call.cache_indices, cache_indices_cpu, "cache_indices");
  }
  const GuardedLaunch launch(call, device, error_word, leading(call.cu_seqlens) - 1,
                            chunks_per_block, stream);
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
    return query_verdict(c, call, is_cpu(q));
  } catch (const std::exception& e) {
    return e.what();
  }
}

// ---- commit ----
// What commit and replay_commit share: the pool written, its slot map, the accepted counts and
// the optional offsets.
template <class Call>
void set_commit_target(CallBuilder& c, Call& call, const Tensor& state, const Tensor& cache_indices,
                       const Tensor& accepted, const OptTensor& cu_seqlens,
                       int64_t draft_token_num) {
  c.set(call.state, state, "state");
  c.set(call.cache_indices, cache_indices, "cache_indices");
  c.set(call.accepted, accepted, "accepted");
  c.set(call.cu_seqlens, cu_seqlens, "cu_seqlens");
  call.scalars.draft_token_num = draft_token_num;
}

CommitCall commit_call(CallBuilder& c, const Tensor& scratch, const OptTensor& scratch_row_map,
                       const OptTensor& scratch_indices, const Tensor& state,
                       const Tensor& cache_indices, const Tensor& accepted,
                       const OptTensor& cu_seqlens, int64_t draft_token_num) {
  CommitCall call;
  c.set(call.scratch, scratch, "scratch");
  c.set(call.scratch_row_map, scratch_row_map, "scratch_row_map");
  c.set(call.scratch_indices, scratch_indices, "scratch_indices");
  set_commit_target(c, call, state, cache_indices, accepted, cu_seqlens, draft_token_num);
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
  const CallDevice current(device);
  const cudaStream_t stream = current_stream(device);
  const GuardedLaunch launch(call, device, error_word, leading(call.accepted), 0, stream);
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
    return query_verdict(c, call, is_cpu(state));
  } catch (const std::exception& e) {
    return e.what();
  }
}

// ---- the record-based speculative path ----
// Each record entry point on the reference and, in a CUDA build, on the kernels.
Status run_reference(const RecordVerifyCall& call) { return reference::record_verify(call); }
Status run_reference(const ReplayCommitCall& call) { return reference::replay_commit(call); }
Status run_reference(const AcceptVerifyCall& call) { return reference::accept_verify(call); }
#ifdef KDAGUARD_TORCH_CUDA
Status run_kernels(const RecordVerifyCall& call, const gpu::LaunchOptions& options) {
  return gpu::record_verify(call, options);
}
Status run_kernels(const ReplayCommitCall& call, const gpu::LaunchOptions& options) {
  return gpu::replay_commit(call, options);
}
Status run_kernels(const AcceptVerifyCall& call, const gpu::LaunchOptions& options) {
  return gpu::accept_verify(call, options);
}
#endif

// Runs a built record call: the reference on CPU tensors, the kernels on CUDA ones with the
// caller's error word, on the current stream of the tensors' device. Their kernels judge every
// row in their prologues, so no row flags are taken (needs_row_flags).
template <class Call>
void run_records_call(CallBuilder& c, Call& call, bool cpu, const Tensor& error_word,
                      int64_t rows) {
  if (cpu) {
    call.device = Device{Device::Kind::cpu, 0};
    if (Status s = run_reference(call); !s.ok()) raise(Call::kEntry, s);
    return;
  }
#ifdef KDAGUARD_TORCH_CUDA
  const int device = c.cuda_device();
  call.device = Device{Device::Kind::cuda, device};
  const CallDevice current(device);
  const GuardedLaunch launch(call, device, error_word, rows, 0, current_stream(device));
  if (Status s = run_kernels(call, launch.options); !s.ok()) raise(Call::kEntry, s);
#else
  (void)c, (void)error_word, (void)rows;
  no_cuda(Call::kEntry);
#endif
}

// record_verify's own argument beyond what draft_call sets.
auto records_arg(const Tensor& records) {
  return [&records](RecordVerifyCall& call, CallBuilder& c) {
    c.set(call.records, records, "records");
  };
}

void record_verify_op(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                      OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor cu_seqlens,
                      Tensor state, Tensor cache_indices, Tensor records, Tensor out,
                      Tensor error_word, int64_t draft_token_num, std::optional<double> scale,
                      std::optional<double> lower_bound, bool use_qk_l2norm) {
  CallBuilder c(Entry::record_verify);
  RecordVerifyCall call = draft_call<RecordVerifyCall>(
      c, {q, k, v, a, g, A_log, dt_bias, b, beta}, cu_seqlens, state, cache_indices, out,
      draft_token_num, scale, lower_bound, use_qk_l2norm, records_arg(records));
  run_records_call(c, call, is_cpu(q), error_word, leading(call.cu_seqlens) - 1);
}

std::string can_record_verify(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g,
                              OptTensor A_log, OptTensor dt_bias, OptTensor b, OptTensor beta,
                              Tensor cu_seqlens, Tensor state, Tensor cache_indices,
                              Tensor records, Tensor out, int64_t draft_token_num,
                              std::optional<double> scale, std::optional<double> lower_bound,
                              bool use_qk_l2norm) {
  try {
    CallBuilder c(Entry::record_verify);
    RecordVerifyCall call = draft_call<RecordVerifyCall>(
        c, {q, k, v, a, g, A_log, dt_bias, b, beta}, cu_seqlens, state, cache_indices, out,
        draft_token_num, scale, lower_bound, use_qk_l2norm, records_arg(records));
    return query_verdict(c, call, is_cpu(q));
  } catch (const std::exception& e) {
    return e.what();
  }
}

ReplayCommitCall replay_commit_call(CallBuilder& c, const Tensor& records, const Tensor& state,
                                    const Tensor& cache_indices, const Tensor& accepted,
                                    const OptTensor& cu_seqlens, int64_t draft_token_num) {
  ReplayCommitCall call;
  c.set(call.records, records, "records");
  set_commit_target(c, call, state, cache_indices, accepted, cu_seqlens, draft_token_num);
  c.refuse_early();
  return call;
}

void replay_commit_op(Tensor records, Tensor state, Tensor cache_indices, Tensor accepted,
                      OptTensor cu_seqlens, Tensor error_word, int64_t draft_token_num) {
  CallBuilder c(Entry::replay_commit);
  ReplayCommitCall call =
      replay_commit_call(c, records, state, cache_indices, accepted, cu_seqlens, draft_token_num);
  run_records_call(c, call, is_cpu(state), error_word, leading(call.accepted));
}

std::string can_replay_commit(Tensor records, Tensor state, Tensor cache_indices,
                              Tensor accepted, OptTensor cu_seqlens, int64_t draft_token_num) {
  try {
    CallBuilder c(Entry::replay_commit);
    ReplayCommitCall call = replay_commit_call(c, records, state, cache_indices, accepted,
                                               cu_seqlens, draft_token_num);
    return query_verdict(c, call, is_cpu(state));
  } catch (const std::exception& e) {
    return e.what();
  }
}

// accept_verify's own arguments beyond what draft_call sets.
auto prior_and_records(const Tensor& prior_records, const Tensor& prior_accepted,
                       const Tensor& records) {
  return [&prior_records, &prior_accepted, &records](AcceptVerifyCall& call, CallBuilder& c) {
    c.set(call.prior_records, prior_records, "prior_records");
    c.set(call.prior_accepted, prior_accepted, "prior_accepted");
    c.set(call.records, records, "records");
  };
}

void accept_verify_op(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g, OptTensor A_log,
                      OptTensor dt_bias, OptTensor b, OptTensor beta, Tensor cu_seqlens,
                      Tensor state, Tensor cache_indices, Tensor prior_records,
                      Tensor prior_accepted, Tensor records, Tensor out, Tensor error_word,
                      int64_t draft_token_num, std::optional<double> scale,
                      std::optional<double> lower_bound, bool use_qk_l2norm) {
  CallBuilder c(Entry::accept_verify);
  AcceptVerifyCall call = draft_call<AcceptVerifyCall>(
      c, {q, k, v, a, g, A_log, dt_bias, b, beta}, cu_seqlens, state, cache_indices, out,
      draft_token_num, scale, lower_bound, use_qk_l2norm,
      prior_and_records(prior_records, prior_accepted, records));
  run_records_call(c, call, is_cpu(q), error_word, leading(call.cu_seqlens) - 1);
}

std::string can_accept_verify(Tensor q, Tensor k, Tensor v, OptTensor a, OptTensor g,
                              OptTensor A_log, OptTensor dt_bias, OptTensor b, OptTensor beta,
                              Tensor cu_seqlens, Tensor state, Tensor cache_indices,
                              Tensor prior_records, Tensor prior_accepted, Tensor records,
                              Tensor out, int64_t draft_token_num, std::optional<double> scale,
                              std::optional<double> lower_bound, bool use_qk_l2norm) {
  try {
    CallBuilder c(Entry::accept_verify);
    AcceptVerifyCall call = draft_call<AcceptVerifyCall>(
        c, {q, k, v, a, g, A_log, dt_bias, b, beta}, cu_seqlens, state, cache_indices, out,
        draft_token_num, scale, lower_bound, use_qk_l2norm,
        prior_and_records(prior_records, prior_accepted, records));
    return query_verdict(c, call, is_cpu(q));
  } catch (const std::exception& e) {
    return e.what();
  }
}

// ---- queries without tensors ----

Entry entry_named(const std::string& name) {
  if (const std::optional<Entry> e = entry_from_name(name)) return *e;
  throw std::invalid_argument(fmt::format(
      "kdaguard: unknown entry point '{}'; expected decode, prefill, verify, commit, "
      "record_verify, replay_commit or accept_verify", name));
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
  m.def("record_verify(" KDAGUARD_TOKEN_ARGS
        "Tensor cu_seqlens, Tensor state, Tensor cache_indices, Tensor(r!) records, "
        "Tensor(o!) out, Tensor(e!) error_word, int draft_token_num, " KDAGUARD_SCALARS ") -> ()");
  m.def("replay_commit(Tensor records, Tensor(s!) state, Tensor cache_indices, Tensor accepted, "
        "Tensor? cu_seqlens, Tensor(e!) error_word, int draft_token_num) -> ()");
  m.def("accept_verify(" KDAGUARD_TOKEN_ARGS
        "Tensor cu_seqlens, Tensor(s!) state, Tensor cache_indices, Tensor prior_records, "
        "Tensor prior_accepted, Tensor(r!) records, Tensor(o!) out, Tensor(e!) error_word, "
        "int draft_token_num, " KDAGUARD_SCALARS ") -> ()");
  m.def("can_record_verify(" KDAGUARD_TOKEN_ARGS
        "Tensor cu_seqlens, Tensor state, Tensor cache_indices, Tensor records, Tensor out, "
        "int draft_token_num, " KDAGUARD_SCALARS ") -> str");
  m.def("can_replay_commit(Tensor records, Tensor state, Tensor cache_indices, Tensor accepted, "
        "Tensor? cu_seqlens, int draft_token_num) -> str");
  m.def("can_accept_verify(" KDAGUARD_TOKEN_ARGS
        "Tensor cu_seqlens, Tensor state, Tensor cache_indices, Tensor prior_records, "
        "Tensor prior_accepted, Tensor records, Tensor out, int draft_token_num, "
        KDAGUARD_SCALARS ") -> str");
  m.def("prefill_workspace_bytes(int total_tokens, int num_seqs, int HV, int K, int V, "
        "ScalarType io_dtype) -> int");
  m.def("prepare(str entry, int K, int V, ScalarType io_dtype, ScalarType state_dtype, "
        "int device) -> ()");
  m.def("built_with_cuda() -> bool");
  m.def("rule_table() -> str");
}

// The impls that serve CPU and CUDA tensors alike (they pick the reference or the kernels by the
// tensors' device): the queries and the record-based path.
static void register_either_device(torch::stable::detail::StableLibrary& m) {
  m.impl("can_decode", KDAGUARD_BOX(&tb::can_decode));
  m.impl("can_prefill", KDAGUARD_BOX(&tb::can_prefill));
  m.impl("can_verify", KDAGUARD_BOX(&tb::can_verify));
  m.impl("can_commit", KDAGUARD_BOX(&tb::can_commit));
  m.impl("record_verify", KDAGUARD_BOX(&tb::record_verify_op));
  m.impl("replay_commit", KDAGUARD_BOX(&tb::replay_commit_op));
  m.impl("accept_verify", KDAGUARD_BOX(&tb::accept_verify_op));
  m.impl("can_record_verify", KDAGUARD_BOX(&tb::can_record_verify));
  m.impl("can_replay_commit", KDAGUARD_BOX(&tb::can_replay_commit));
  m.impl("can_accept_verify", KDAGUARD_BOX(&tb::can_accept_verify));
}

STABLE_TORCH_LIBRARY_IMPL(kdaguard, CPU, m) {
  m.impl("decode", KDAGUARD_BOX(&tb::decode_cpu));
  m.impl("prefill", KDAGUARD_BOX(&tb::prefill_cpu));
  m.impl("verify", KDAGUARD_BOX(&tb::verify_cpu));
  m.impl("commit", KDAGUARD_BOX(&tb::commit_cpu));
  register_either_device(m);
}

STABLE_TORCH_LIBRARY_IMPL(kdaguard, CUDA, m) {
  m.impl("decode", KDAGUARD_BOX(&tb::decode_cuda));
  m.impl("prefill", KDAGUARD_BOX(&tb::prefill_cuda));
  m.impl("verify", KDAGUARD_BOX(&tb::verify_cuda));
  m.impl("commit", KDAGUARD_BOX(&tb::commit_cuda));
  register_either_device(m);
}

STABLE_TORCH_LIBRARY_IMPL(kdaguard, CompositeExplicitAutograd, m) {
  m.impl("prefill_workspace_bytes", TORCH_BOX(&tb::prefill_workspace_bytes));
  m.impl("prepare", TORCH_BOX(&tb::prepare));
  m.impl("built_with_cuda", TORCH_BOX(&tb::built_with_cuda));
  m.impl("rule_table", TORCH_BOX(&tb::rule_table));
}
