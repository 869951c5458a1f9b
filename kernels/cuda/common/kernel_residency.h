// Readies a kernel that needs more dynamic shared memory than the default 48 KB a launch may take
// without asking, and tells how many of its blocks a device holds at once.
//
// Why once per (kernel, device): cudaFuncSetAttribute is a host call that a launch path should not
// repeat, and the grant belongs to one kernel on one device. The memo is keyed on the kernel
// itself (a template argument), so two instantiations of one kernel template never share it.
// The first call on a device makes the host calls, so it must not be captured in a CUDA graph
// (kda.h's warm-up note says so).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>

namespace kdaguard::gpu::detail {

// Grants `Kernel` `shared_bytes` of dynamic shared memory on the current device and returns in
// `resident` the blocks of `threads` threads the whole device holds at once (0 when it cannot be
// told). `shared_bytes` must be the same on every call for one Kernel.
template <auto Kernel> cudaError_t ready_kernel(int threads, int shared_bytes, int& resident) {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> known{};  // resident + 1; 0 = not yet readied
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device < kMaxDevices && known[device].load(std::memory_order_relaxed) > 0) {
    resident = known[device].load(std::memory_order_relaxed) - 1;
    return cudaSuccess;
  }
  if (const cudaError_t e =
          cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
      e != cudaSuccess)
    return e;
  int per_sm = 0, sms = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, threads, shared_bytes) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    per_sm = sms = 0;
  }
  resident = per_sm * sms;
  if (device < kMaxDevices) known[device].store(resident + 1, std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace kdaguard::gpu::detail
