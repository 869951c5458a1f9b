// Dispatch of a prefill to the kernels of its (K, V) shape.
#include "prefill_launch.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "kdaguard/contracts/supported.h"
#include "prefill_workspace.cuh"

namespace kdaguard::gpu::detail {

std::string prefill_unsupported_reason(const PrefillParams& p) {
  if (!supported::head_dim(p.in.K) || !supported::head_dim(p.in.V))
    return "prefill kernels exist for K and V in {64, 128}; got K = " + std::to_string(p.in.K) +
           ", V = " + std::to_string(p.in.V);
  if (p.in.H <= 0 || p.in.HV <= 0 || p.in.HV % p.in.H != 0)
    return "HV must be a positive multiple of H; got H = " + std::to_string(p.in.H) +
           ", HV = " + std::to_string(p.in.HV);
  if (!supported::state_dtype(p.state.dtype)) return "prefill state must be f32 or bf16";
  if (!supported::io_dtype(p.in.io_dtype)) return "prefill inputs must be bf16, f16 or f32";
  if (p.cu_seqlens_dtype != DType::i32 && p.cu_seqlens_dtype != DType::i64)
    return "cu_seqlens must be i32 or i64";
  return {};
}

// Calls f.template operator()<K, V>() for the pair of supported::kHeadDims equal to (K, V) (the
// first at or after [I][J]) and returns its result; `otherwise` for any other pair, never another
// shape's code.
template <std::size_t I = 0, std::size_t J = 0, class Result, class F>
Result with_supported_head_dims(int K, int V, Result otherwise, F&& f) {
  constexpr auto& dims = supported::kHeadDims;
  if constexpr (I == dims.size()) {
    return otherwise;
  } else if constexpr (J == dims.size()) {
    return with_supported_head_dims<I + 1, 0>(K, V, otherwise, f);
  } else {
    if (K == dims[I] && V == dims[J]) return f.template operator()<dims[I], dims[J]>();
    return with_supported_head_dims<I, J + 1>(K, V, otherwise, f);
  }
}

std::int64_t prefill_workspace_bytes(const PrefillParams& p) {
  if (p.in.io_dtype == DType::f32 || p.total_tokens <= 0 || p.num_seqs <= 0 || p.in.HV <= 0)
    return 0;  // the f32 kernel keeps everything in registers; an empty call launches nothing
  // The layout of the shortest span the split may choose: every choice's layout fits in it.
  return with_supported_head_dims(p.in.K, p.in.V, std::int64_t{-1}, [&]<int K, int V>() -> std::int64_t {
    const prefill::WorkspaceLayout w =
        prefill::workspace_layout<K, V>(p.total_tokens, p.num_seqs, p.in.HV, kMinChunksPerSpan);
    return w.overflows ? -1 : static_cast<std::int64_t>(w.bytes);
  });
}

cudaError_t prefill_workspace_take(const PrefillParams& p, std::size_t bytes, cudaStream_t stream,
                                   void** workspace) {
  if (p.workspace != nullptr) {
    *workspace = p.workspace;
    return cudaSuccess;
  }
  cudaMemPool_t pool = nullptr;
  if (cudaError_t e = prefill_workspace_pool(&pool); e != cudaSuccess) return e;
  return cudaMallocFromPoolAsync(workspace, bytes, pool, stream);
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

// The model, in units of one chunk step of a chain block that has its SM to itself (~0.71 us per
// step on the H200). Blocks run in waves of `resident` (one per SM: counting the 3 resident
// blocks per SM as free made T = 8192, H = 64, B = 1 split and run 1.15 ms against 0.85 ms
// unsplit, H200, 2026-12-03), and each wave after the first costs kExtraWave of a step, since the
// co-resident blocks overlap partly:
//   a phase of `blocks` blocks walking `steps` chunks takes steps * (1 + kExtraWave * (waves - 1));
//   whole:       C steps (C: mean chunks per sequence), N HV value_slices blocks;
//   split in S spans of L chunks: transition L steps over N HV transition_slices (S - 1) blocks,
//   combine kCombineSteps per span (S spans one after another) over N HV value_slices blocks,
//   span kernel L steps over N HV value_slices S blocks.
// kExtraWave and kCombineSteps are a least-squares fit (relative error, rms 6%) of the 126 times
// of bench_prefill's BM_PrefillSpan sweep on the H200 (2026-12-04, bench/NOTES_prefill.md) with
// one free offset per shape for the prepare phase; the fitted cost of the two extra launches
// came out at zero, so the model has none.
std::int32_t choose_chunks_per_span(const ChainSplitCosts& c) {
  constexpr double kExtraWave = 0.75;
  constexpr double kCombineSteps = 4.0;  // one span of the combine: 128 mma per warp and its loads
  constexpr std::int64_t kMaxSpans = 1024;
  if (c.num_seqs <= 0 || c.HV <= 0 || c.resident_blocks <= 0) return 0;
  const std::int64_t chunks = (c.total_tokens / 16 + c.num_seqs - 1) / c.num_seqs;  // mean, rounded up
  const std::int64_t heads = static_cast<std::int64_t>(c.num_seqs) * c.HV;
  const auto phase = [&](double steps, std::int64_t blocks) {
    const std::int64_t waves = (blocks + c.resident_blocks - 1) / c.resident_blocks;
    return steps * (1.0 + kExtraWave * static_cast<double>(std::max<std::int64_t>(waves, 1) - 1));
  };
  double best = phase(static_cast<double>(chunks), heads * c.value_slices);
  std::int32_t best_span = 0;
  for (std::int64_t spans = 2; spans <= std::min(chunks, kMaxSpans); ++spans) {
    const std::int64_t span = (chunks + spans - 1) / spans;
    if (span < kMinChunksPerSpan) break;  // more spans only shorten it
    const double cost = phase(static_cast<double>(span), heads * c.transition_slices * (spans - 1)) +
                        phase(kCombineSteps * static_cast<double>(spans), heads * c.value_slices) +
                        phase(static_cast<double>(span), heads * c.value_slices * spans);
    if (cost < best) {
      best = cost;
      best_span = static_cast<std::int32_t>(span);
    }
  }
  return best_span;
}

cudaError_t resident_chain_blocks(const void* kernel, int threads, int smem, std::int64_t* blocks) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    return e;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
      e != cudaSuccess)
    return e;
  // One block per SM (see choose_chunks_per_span); the occupancy query only checks one fits.
  *blocks = per_sm > 0 ? sms : 0;
  return cudaSuccess;
}

cudaError_t launch_prefill(const PrefillParams& p, GuardState guard, cudaStream_t stream) {
  return launch_prefill_with_span(p, guard, stream, kChooseSpan);
}

cudaError_t launch_prefill_with_span(const PrefillParams& p, GuardState guard, cudaStream_t stream,
                                     std::int32_t chunks_per_span) {
  if (!prefill_unsupported_reason(p).empty() || chunks_per_span < kChooseSpan) return cudaErrorInvalidValue;
  return with_supported_head_dims(p.in.K, p.in.V, cudaErrorInvalidValue, [&]<int K, int V>() {
    return launch_prefill_shape<K, V>(p, guard, stream, chunks_per_span);
  });
}

}  // namespace kdaguard::gpu::detail
