// Bulk copies from global into shared memory (sm_90 `cp.async.bulk`) completed on mbarriers.
//
// Why: a memory-bound kernel needs tens of kilobytes of loads in flight per SM. Loads into
// registers hold those registers until the data arrives, and the registers a warp needs for its
// arithmetic leave too few for that (decode v5 kept about 31 KB in flight per SM at 128
// registers). A bulk copy is one instruction per contiguous block, lands in shared memory and
// holds no register, so the in-flight bytes are bounded by shared memory instead.
//
// Usage within one warp (the barriers here are warp-private: one arrival, by the lane that issues):
//   lane 0: init_barrier(bar) once; then per fill: expect_bytes(bar, n) and copy_async(...) of n
//   bytes in total; every lane: wait_phase(bar, phase) before reading, phase ^= 1 after each wait.
// Before a buffer is filled again, every lane must have finished reading it (__syncwarp).
#pragma once

#include <cstdint>

namespace kdaguard::gpu::detail {

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// A barrier completes a phase when its one expected arrival has come and every byte it expects
// has landed.
__device__ __forceinline__ void init_barrier(std::uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
  // Makes the initialisation visible to the async proxy that completes the copies.
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The issuing lane's arrival, announcing the bytes the phase's copies will deliver.
__device__ __forceinline__ void expect_bytes(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory;
// completion is counted on `bar`. A launch without clusters is a cluster of one, so the CTA's
// shared addresses are valid shared::cluster addresses.
__device__ __forceinline__ void copy_async(void* dst, const void* src, std::uint32_t bytes,
                                           std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}

// Waits until the barrier's phase with parity `phase` has completed.
__device__ __forceinline__ void wait_phase(std::uint64_t* bar, std::uint32_t phase) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred complete;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        " selp.u32 %0, 1, 0, complete;\n}"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(phase)
        : "memory");
  } while (done == 0);
}

}  // namespace kdaguard::gpu::detail
