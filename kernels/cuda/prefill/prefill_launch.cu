// Dispatch of a prefill to the kernels of its (K, V) shape.
#include "prefill_launch.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace kdaguard::gpu::detail {

std::string prefill_unsupported_reason(const PrefillParams& p) {
  const auto head_dim_ok = [](std::int32_t d) { return d == 64 || d == 128; };
  if (!head_dim_ok(p.in.K) || !head_dim_ok(p.in.V))
    return "prefill kernels exist for K and V in {64, 128}; got K = " + std::to_string(p.in.K) +
           ", V = " + std::to_string(p.in.V);
  if (p.in.H <= 0 || p.in.HV <= 0 || p.in.HV % p.in.H != 0)
    return "HV must be a positive multiple of H; got H = " + std::to_string(p.in.H) +
           ", HV = " + std::to_string(p.in.HV);
  if (p.state.dtype != DType::f32 && p.state.dtype != DType::bf16)
    return "prefill state must be f32 or bf16";
  if (p.in.io_dtype != DType::bf16 && p.in.io_dtype != DType::f16 && p.in.io_dtype != DType::f32)
    return "prefill inputs must be bf16, f16 or f32";
  if (p.cu_seqlens_dtype != DType::i32 && p.cu_seqlens_dtype != DType::i64)
    return "cu_seqlens must be i32 or i64";
  return {};
}

cudaError_t prefill_workspace_pool(cudaMemPool_t* pool) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;  // by device ordinal; never destroyed
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto it = pools.find(device); it != pools.end()) {
    *pool = it->second;
    return cudaSuccess;
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t created = nullptr;
  if (cudaError_t e = cudaMemPoolCreate(&created, &props); e != cudaSuccess) return e;
  std::uint64_t keep_all = UINT64_MAX;
  if (cudaError_t e = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep_all);
      e != cudaSuccess) {
    cudaMemPoolDestroy(created);
    return e;
  }
  pools.emplace(device, created);
  *pool = created;
  return cudaSuccess;
}

cudaError_t launch_prefill(const PrefillParams& p, GuardState guard, cudaStream_t stream) {
  if (!prefill_unsupported_reason(p).empty()) return cudaErrorInvalidValue;
  if (p.in.K == 64) {
    return p.in.V == 64 ? launch_prefill_shape<64, 64>(p, guard, stream)
                        : launch_prefill_shape<64, 128>(p, guard, stream);
  }
  return p.in.V == 64 ? launch_prefill_shape<128, 64>(p, guard, stream)
                      : launch_prefill_shape<128, 128>(p, guard, stream);
}

}  // namespace kdaguard::gpu::detail
