// The boxed kernels of kdaguard's PyTorch ops: how a stable-ABI kernel takes its arguments from
// the dispatcher's stack and gives back what it owns. Header-only, for the module (ops.cpp) and
// for bench/probes/torch_dispatch_floor.cpp, which times torch's own share of a call with the
// same boxing.
#pragma once

#include <Python.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace kdaguard::torch_binding {

// A tensor argument as the entry points see it: the dispatcher's handle, which the boxed kernel
// (KDAGUARD_BOX) owns and releases after the call. The entry points read metadata through the
// shim and keep nothing, so a borrowed handle is all they need; torch::stable::Tensor would wrap
// each handle in a shared pointer, an allocation and two atomic counts per tensor per call.
struct Tensor {
  AtenTensorHandle handle;
  AtenTensorHandle get() const { return handle; }
};
using OptTensor = std::optional<Tensor>;

// Since torch 2.10 a tensor's C++ references keep its Python object alive: when the last of them
// beside the object's own goes, torch drops the object's reference, taking the GIL to do so. The
// dispatcher runs a kernel with the GIL released and hands it one reference per tensor argument,
// so releasing them one by one takes the GIL once per tensor (nine times for an eager decode,
// 0.5-1 us of host time on our GPU machine). The entry points' boxed kernels release their
// arguments under one hold of the GIL instead; a thread that already holds it just counts one more.
// Only a thread that has run Python takes it here: elsewhere (a C++ caller's own threads) the
// handles go one by one, as torch would release them, and a tensor without a Python object never
// needs the GIL.
class GilHold {
 public:
  GilHold() : active_(Py_IsInitialized() != 0 && PyGILState_GetThisThreadState() != nullptr) {
    if (active_) state_ = PyGILState_Ensure();
  }
  ~GilHold() {
    if (active_) PyGILState_Release(state_);
  }
  GilHold(const GilHold&) = delete;
  GilHold& operator=(const GilHold&) = delete;

 private:
  bool active_;
  PyGILState_STATE state_{};
};

// How a boxed kernel takes one argument from the dispatcher's stack, and gives back what it owns
// once the call is over: a tensor's handle; the rest own nothing.
template <typename T>
struct Unboxed {
  static T take(StableIValue value) { return torch::stable::detail::to<T>(value); }
  static void release(T& /*arg*/) {}
};
template <>
struct Unboxed<Tensor> {
  static Tensor take(StableIValue value) {
    return Tensor{torch::stable::detail::to<AtenTensorHandle>(value)};
  }
  static void release(Tensor& t) { aoti_torch_delete_tensor_object(t.handle); }
};
template <>
struct Unboxed<OptTensor> {
  static OptTensor take(StableIValue value) {
    const auto handle = torch::stable::detail::to<std::optional<AtenTensorHandle>>(value);
    return handle ? OptTensor{Tensor{*handle}} : std::nullopt;
  }
  static void release(OptTensor& t) {
    if (t) aoti_torch_delete_tensor_object(t->handle);
  }
};

// TORCH_BOX's contract (unbox the arguments, call, box the result), with the tensors borrowed
// and their handles released under one GilHold after the call, returned or thrown.
template <typename Fn, Fn* fn>
struct OneGilRelease;

template <typename Result, typename... Params, Result (*fn)(Params...)>
struct OneGilRelease<Result(Params...), fn> {
  using Args = std::tuple<std::decay_t<Params>...>;

  static void boxed(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
    constexpr uint64_t outputs = std::is_void_v<Result> ? 0 : 1;
    STD_TORCH_CHECK(num_args == sizeof...(Params) && num_outputs == outputs,
                    "kdaguard: the registered schema has ", num_args, " arguments and ",
                    num_outputs, " outputs; its kernel takes ", sizeof...(Params), " and ",
                    outputs);
    Args args = take(stack, std::index_sequence_for<Params...>{});
    const Release release{args};
    if constexpr (std::is_void_v<Result>) {
      std::apply(fn, args);
    } else {
      stack[0] = torch::stable::detail::from<Result>(std::apply(fn, args));
    }
  }

 private:
  template <std::size_t... I>
  static Args take(StableIValue* stack, std::index_sequence<I...> /*unused*/) {
    return Args{Unboxed<std::decay_t<Params>>::take(stack[I])...};
  }
  struct Release {
    Args& args;
    ~Release() {
      const GilHold gil;
      std::apply([](auto&... arg) { (Unboxed<std::decay_t<decltype(arg)>>::release(arg), ...); },
                 args);
    }
  };
};

}  // namespace kdaguard::torch_binding

// The boxed kernel of an entry point `fn` (a plain function).
#define KDAGUARD_BOX(fn) \
  (kdaguard::torch_binding::OneGilRelease<std::remove_pointer_t<decltype(fn)>, (fn)>::boxed)

