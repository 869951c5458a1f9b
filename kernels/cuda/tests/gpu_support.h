// Helpers of the GPU tests: a device arena, moving a HostProblem's buffers to the GPU and back,
// the device guard's buffers, and running a call through the CUDA entry points.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kdaguard/kda.h"
#include "problem.h"

namespace kdaguard::gputest {

// Whether an sm_90 device is present (the kernels are built for sm_90a only).
inline bool have_sm90() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return false;
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 9 && minor == 0;
}

#define KDAGUARD_SKIP_WITHOUT_GPU() \
  if (!::kdaguard::gputest::have_sm90()) GTEST_SKIP() << "no sm_90 CUDA device"

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// check_cuda named by the expression itself.
#define KDAGUARD_CUDA_OK(expr) ::kdaguard::gputest::check_cuda((expr), #expr)

// Runs launch(stream) captured into a CUDA graph on a stream of its own, replays the graph once
// and waits for it (serving engines capture their steps this way). Returns launch's status, or
// why the capture failed. The entry point must have been called once outside a capture (kda.h).
template <class Launch> Status run_captured(Launch&& launch) {
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  const Status status = launch(stream);
  const cudaError_t captured = cudaStreamEndCapture(stream, &graph);
  if (status.ok() && captured == cudaSuccess) {
    cudaGraphExec_t exec = nullptr;
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    check_cuda(cudaStreamSynchronize(stream), "replay");
    check_cuda(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
  }
  if (graph != nullptr) check_cuda(cudaGraphDestroy(graph), "cudaGraphDestroy");
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  if (!status.ok()) return status;
  if (captured != cudaSuccess)
    return Status::failed(std::string("stream capture failed: ") + cudaGetErrorString(captured));
  return Status::success();
}

// Cases per property, from KDAGUARD_GPU_CASES (the GPU report raises it, sanitizer runs lower it).
inline int case_count(int fallback) {
  const char* text = std::getenv("KDAGUARD_GPU_CASES");
  return text != nullptr ? std::max(1, std::atoi(text)) : fallback;
}

// One cudaMalloc for the whole test binary, handed out 256-byte aligned and reset per case, so
// thousands of cases don't pay thousands of allocations.
class DeviceArena {
 public:
  explicit DeviceArena(std::size_t bytes) : capacity_(bytes) {
    check_cuda(cudaMalloc(&base_, bytes), "cudaMalloc(arena)");
  }
  ~DeviceArena() { cudaFree(base_); }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  void* allocate(std::size_t bytes) {
    const std::size_t at = (used_ + 255) / 256 * 256;
    if (at + bytes > capacity_) throw std::runtime_error("device arena exhausted");
    used_ = at + bytes;
    return static_cast<char*>(base_) + at;
  }
  void reset() { used_ = 0; }

 private:
  void* base_ = nullptr;
  std::size_t capacity_ = 0, used_ = 0;
};

// The problem's buffers on the device, in allocation order.
struct DeviceCopy {
  std::vector<std::uint64_t> bases;
};

inline DeviceCopy upload(const support::HostProblem& p, DeviceArena& arena) {
  DeviceCopy copy;
  for (const support::Allocation& a : p.allocations) {
    void* d = arena.allocate(a.bytes());
    check_cuda(cudaMemcpy(d, a.data(), a.bytes(), cudaMemcpyHostToDevice), "upload");
    copy.bases.push_back(reinterpret_cast<std::uint64_t>(d));
  }
  return copy;
}

inline void download(support::HostProblem& p, const DeviceCopy& copy) {
  for (std::size_t i = 0; i < p.allocations.size(); ++i)
    check_cuda(cudaMemcpy(p.allocations[i].data(), reinterpret_cast<const void*>(copy.bases[i]),
                          p.allocations[i].bytes(), cudaMemcpyDeviceToHost),
               "download");
}

// The guard's error word and row flags, cleared.
inline gpu::DeviceGuard make_guard(DeviceArena& arena, std::int64_t rows) {
  gpu::DeviceGuard g;
  g.error_word = static_cast<unsigned long long*>(arena.allocate(sizeof(unsigned long long)));
  g.row_flags_capacity = std::max<std::int64_t>(rows, 1);
  g.row_flags = static_cast<std::int32_t*>(arena.allocate(4 * g.row_flags_capacity));
  check_cuda(cudaMemset(g.error_word, 0, sizeof(unsigned long long)), "clear error word");
  return g;
}

inline std::uint64_t read_error_word(const gpu::DeviceGuard& g) {
  unsigned long long word = 0;
  check_cuda(cudaMemcpy(&word, g.error_word, sizeof word, cudaMemcpyDeviceToHost), "error word");
  return word;
}

inline Status run_gpu(const AnyCall& call, const gpu::LaunchOptions& options) {
  if (const auto* c = std::get_if<DecodeCall>(&call)) return gpu::decode(*c, options);
  if (const auto* c = std::get_if<VerifyCall>(&call)) return gpu::verify(*c, options);
  if (const auto* c = std::get_if<CommitCall>(&call)) return gpu::commit(*c, options);
  return Status::unsupported_because("the CUDA backend has no prefill in these tests");
}

inline std::string rule_list(std::uint64_t word) {
  std::string text;
  for (RuleId r : gpu::rules_in(word)) text += std::string(rule_id(r)) + " ";
  return text;
}

}  // namespace kdaguard::gputest
