// Dispatch of a prefill to the kernels of its (K, V) shape.
#include "prefill_launch.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "prefill_workspace.cuh"

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

std::int64_t prefill_workspace_bytes(const PrefillParams& p) {
  if (p.in.io_dtype == DType::f32 || p.total_tokens <= 0 || p.num_seqs <= 0 || p.in.HV <= 0)
    return 0;  // the f32 kernel keeps everything in registers; an empty call launches nothing
  std::int64_t chunk_bytes = 0;
  if (p.in.K == 64) chunk_bytes = p.in.V == 64 ? prefill::ChunkOperands<64, 64>::kBytes
                                               : prefill::ChunkOperands<64, 128>::kBytes;
  else chunk_bytes = p.in.V == 64 ? prefill::ChunkOperands<128, 64>::kBytes
                                  : prefill::ChunkOperands<128, 128>::kBytes;
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(prefill::workspace_slots(p.total_tokens, p.num_seqs),
                             static_cast<std::int64_t>(p.in.HV) * chunk_bytes, &bytes))
    return -1;
  return bytes;
}

cudaError_t prefill_workspace_take(const PrefillParams& p, cudaStream_t stream, void** workspace) {
  if (p.workspace != nullptr) {
    *workspace = p.workspace;
    return cudaSuccess;
  }
  cudaMemPool_t pool = nullptr;
  if (cudaError_t e = prefill_workspace_pool(&pool); e != cudaSuccess) return e;
  const std::int64_t bytes = prefill_workspace_bytes(p);
  if (bytes < 0) return cudaErrorInvalidConfiguration;
  return cudaMallocFromPoolAsync(workspace, static_cast<std::size_t>(bytes), pool, stream);
}

cudaError_t prefill_workspace_give_back(const PrefillParams& p, void* workspace,
                                        cudaStream_t stream) {
  return p.workspace != nullptr ? cudaSuccess : cudaFreeAsync(workspace, stream);
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
