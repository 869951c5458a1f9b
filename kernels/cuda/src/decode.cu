// decode: row n is request n, token n; state slot cache_indices[n] updated in place.
//
// Work split: every warp is an independent worker (no shared memory, no barrier). A state row of
// K elements is held by kLanes = K * sizeof(ST) / 16 lanes, one 16-byte vector each, so one warp
// instruction moves 512 contiguous bytes of the pool; a lane carries 4 vectors (4 rows) per chunk,
// whose reductions are independent of each other. A lane's channels of k, q and the decay are the
// same for every row of a head, so a warp prepares them once per head, in registers (the norms are
// summed over the lane group). The work is the flat list of chunks [row n][value head hv][chunk];
// each warp of a persistent grid takes a contiguous share (shares differ by one chunk at most)
// and walks it with the next chunk's loads in flight, across head and row boundaries, so a warp's
// pipeline fills once per call. Launched with programmatic stream
// serialisation, a call's blocks are resident when the previous kernel on the stream finishes.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "dispatch.cuh"
#include "launch.h"
#include "recurrent.cuh"
#include "warp_rows.cuh"

namespace kdaguard::gpu::detail {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;

// One chunk's loads stay in flight while another is computed, with the register budget of four
// 128-thread blocks per SM (128 registers: no spill for f32 state, 84 bytes for bf16). Measured on
// the H200 (B = 64, f32 state): this 78.6 us; two chunks ahead at four blocks (80 bytes spilled)
// 84.6 us; one ahead at five blocks (96 registers, about 150 bytes spilled) 103 us.
constexpr int kChunksAhead = 1;
constexpr int kMinBlocksPerSm = 4;

// One chunk's loads as they arrive: the state vectors and each row's v (converted at use, so that
// issuing the loads never waits for them).
template <class IO> struct ChunkLoad {
  uint4 state[4];
  IO v[4];
};

struct ChunkCursor {
  std::int32_t n, hv, c;
  __device__ __forceinline__ void advance(std::int32_t heads, std::int32_t chunks_per_head) {
    if (++c == chunks_per_head) {
      c = 0;
      if (++hv == heads) {
        hv = 0;
        ++n;
      }
    }
  }
  __device__ __forceinline__ bool first_of_row() const { return hv == 0 && c == 0; }
};

// What a warp must know of row n before touching its state; each cursor looks a row up once.
struct RowStatus {
  std::int32_t n = -1;
  std::int64_t slot = -1;
  std::uint64_t faults = 0;  // rules the row breaks: reported once, the row is skipped
  bool skip = true;          // faulty or flagged by the guard: nothing is written
  bool active = false;       // not skipped and not padding: the state is read and written
};

__device__ __forceinline__ RowStatus decode_row(const DecodeParams& p, const GuardState& guard,
                                                std::int32_t n) {
  RowStatus r;
  r.n = n;
  r.slot = p.cache_indices[n];
  r.faults = slot_faults(r.slot, p.state.num_slots);
  r.skip = r.faults != 0 || (guard.row_flags != nullptr && guard.row_flags[n] != 0);
  r.active = !r.skip && vc::is_active(r.slot);
  return r;
}

template <class IO, class ST, int K>
__global__ void __launch_bounds__(kDecodeThreads, kMinBlocksPerSm)
    decode_kernel(const DecodeParams p, const GuardState guard) {
  using Tile = WarpTile<ST, K>;
  constexpr int kBuffers = kChunksAhead + 1;
  wait_for_prior_grids();
  allow_next_grid();  // the next call's blocks may take free SM slots; they wait for this grid

  const int lane = threadIdx.x % 32;
  const int group_lane = lane % Tile::kLanes;
  const int row_in_pass = lane / Tile::kLanes;
  const int V = p.in.V;
  const std::int32_t heads = p.in.HV;
  const std::int32_t chunks_per_head = (V + Tile::kChunkRows - 1) / Tile::kChunkRows;

  // This warp's share of the chunks.
  const std::int64_t total = static_cast<std::int64_t>(p.batch) * heads * chunks_per_head;
  const std::int64_t workers = static_cast<std::int64_t>(gridDim.x) * kDecodeWarps;
  const std::int64_t worker = static_cast<std::int64_t>(blockIdx.x) * kDecodeWarps + threadIdx.x / 32;
  const std::int64_t base = total / workers, extra = total % workers;
  const std::int64_t begin = worker * base + min(worker, extra);
  const std::int64_t end = begin + base + (worker < extra ? 1 : 0);
  if (begin >= end) return;
  ChunkCursor first;
  first.c = static_cast<std::int32_t>(begin % chunks_per_head);
  first.hv = static_cast<std::int32_t>((begin / chunks_per_head) % heads);
  first.n = static_cast<std::int32_t>(begin / chunks_per_head / heads);

  ST* const pool = static_cast<ST*>(p.state.data);
  const IO* const v_base = static_cast<const IO*>(p.in.v.data);
  auto row_of = [&](int c, int r) { return c * Tile::kChunkRows + r * Tile::kRowsPerPass + row_in_pass; };
  auto head_of = [&](const RowStatus& row, std::int32_t hv) {
    return pool + row.slot * p.state.slot_stride + static_cast<std::int64_t>(hv) * V * K;
  };

  // Loads of the chunk at the issue cursor (only for active rows; V is a multiple of the chunk).
  ChunkCursor issue_at = first;
  RowStatus issue_row = decode_row(p, guard, first.n);
  std::int64_t issued = begin;
  auto issue = [&](ChunkLoad<IO>& load) {
    if (issued >= end) return;
    if (issue_at.n != issue_row.n) issue_row = decode_row(p, guard, issue_at.n);
    if (issue_row.active) {
      const ST* head = head_of(issue_row, issue_at.hv);
      const IO* v = v_base + static_cast<std::int64_t>(issue_at.n) * p.in.v.token_stride +
                    static_cast<std::int64_t>(issue_at.hv) * p.in.v.head_stride;
#pragma unroll
      for (int r = 0; r < Tile::kVecs; ++r) {
        const int row = row_of(issue_at.c, r);
        load.state[r] = load_stream(head + static_cast<std::int64_t>(row) * K + group_lane * Tile::kPerVec);
        load.v[r] = v[row];
      }
    }
    issue_at.advance(heads, chunks_per_head);
    ++issued;
  };

  ChunkCursor use_at = first;
  RowStatus use_row = issue_row;
  std::int64_t prepared_head = -1;  // n * HV + hv of `token`
  LaneToken<Tile::kPerVec> token;
  auto compute = [&](const ChunkLoad<IO>& load) {
    if (use_at.n != use_row.n) use_row = decode_row(p, guard, use_at.n);
    if (use_row.skip) {
      if (use_row.faults != 0 && use_at.first_of_row() && lane == 0)
        raise(guard.error_word, use_row.faults);
      return;
    }
    if (!use_row.active) {  // padding row: zeros out, state untouched
      if (group_lane == 0)
#pragma unroll
        for (int r = 0; r < Tile::kVecs; ++r)
          store_out<IO>(p.out, use_at.n, use_at.hv, row_of(use_at.c, r), 0.f);
      return;
    }
    const std::int64_t head_key = static_cast<std::int64_t>(use_at.n) * heads + use_at.hv;
    if (head_key != prepared_head) {
      token = prepare_lane_token<IO, K, Tile::kPerVec, Tile::kLanes>(
          p.in, use_at.hv, use_at.n, [&](int i) { return group_lane * Tile::kPerVec + i; });
      prepared_head = head_key;
    }
    // Decay, then S k and S q of every row: 2 x kVecs sums over the lane group, scattered so
    // that each lane ends up with one total (value r: S k of row r, value kVecs + r: S q).
    constexpr int kValues = 2 * Tile::kVecs;
    using Owner = ScatterOwner<Tile::kLanes, kValues>;
    float s[Tile::kVecs][Tile::kPerVec];
    float sums[kValues];
#pragma unroll
    for (int r = 0; r < Tile::kVecs; ++r) {
      StateVec<ST>::unpack(load.state[r], s[r]);
      float sk = 0.f, sq = 0.f;
#pragma unroll
      for (int e = 0; e < Tile::kPerVec; ++e) {
        s[r][e] *= token.decay[e];
        sk += s[r][e] * token.k[e];
        sq += s[r][e] * token.q[e];
      }
      sums[r] = sk;
      sums[Tile::kVecs + r] = sq;
    }
    const float owned = scatter_sum<Tile::kLanes / 2, kValues>(sums, lane);
    const int owned_value = Owner::value_of(group_lane);
    const int group_base = lane - group_lane;
    // Rank-1 correction of every row with u = beta (v - S k); the lane that owns row r's S q
    // writes the output o = S' q + u (k . q).
    ST* head = head_of(use_row, use_at.hv);
    float my_u = 0.f;
#pragma unroll
    for (int r = 0; r < Tile::kVecs; ++r) {
      const float sk = __shfl_sync(0xffffffffu, owned, group_base + Owner::first_lane(r));
      const float u = token.beta * (to_f32(load.v[r]) - sk);
      if (owned_value == Tile::kVecs + r) my_u = u;
#pragma unroll
      for (int e = 0; e < Tile::kPerVec; ++e) s[r][e] += u * token.k[e];
      const int row = row_of(use_at.c, r);
      store_stream(head + static_cast<std::int64_t>(row) * K + group_lane * Tile::kPerVec,
                   StateVec<ST>::pack(s[r]));
    }
    if (owned_value >= Tile::kVecs && group_lane == Owner::first_lane(owned_value))
      store_out<IO>(p.out, use_at.n, use_at.hv, row_of(use_at.c, owned_value - Tile::kVecs),
                    owned + my_u * token.kq);
  };

  ChunkLoad<IO> loads[kBuffers];
#pragma unroll
  for (int b = 0; b < kChunksAhead; ++b) issue(loads[b]);
  for (std::int64_t chunk = begin; chunk < end; chunk += kBuffers) {
#pragma unroll
    for (int b = 0; b < kBuffers; ++b) {
      if (chunk + b < end) {
        issue(loads[(b + kChunksAhead) % kBuffers]);
        compute(loads[b]);
        use_at.advance(heads, chunks_per_head);
      }
    }
  }
}

// Blocks of `kernel` resident on the current device at once (0 when it cannot be told).
template <class Kernel> int resident_blocks(Kernel kernel) {
  static const int per_sm = [&] {  // per instantiation; the same on every call
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kDecodeThreads, 0) !=
        cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return blocks;
  }();
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return per_sm * sms;
}

}  // namespace

cudaError_t launch_decode(const DecodeParams& p, GuardState guard, int chunks_per_block,
                          cudaStream_t stream) {
  return dispatch_tile(p.in.io_dtype, p.state.dtype, p.in.K,
                       [&]<class IO, class ST, int K>() -> cudaError_t {
                         using Tile = WarpTile<ST, K>;
                         const auto kernel = decode_kernel<IO, ST, K>;
                         const std::int64_t chunks =
                             static_cast<std::int64_t>(p.batch) * p.in.HV *
                             ((p.in.V + Tile::kChunkRows - 1) / Tile::kChunkRows);
                         if (chunks == 0) return cudaSuccess;
                         const std::int64_t warps_wanted =
                             chunks_per_block > 0 ? (chunks + chunks_per_block - 1) / chunks_per_block
                                                  : chunks;
                         std::int64_t blocks = (warps_wanted + kDecodeWarps - 1) / kDecodeWarps;
                         if (chunks_per_block <= 0) {
                           const int resident = resident_blocks(kernel);
                           if (resident > 0) blocks = std::min<std::int64_t>(blocks, resident);
                         }
                         if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
                         cudaLaunchConfig_t config{};
                         config.gridDim = dim3(static_cast<unsigned>(blocks));
                         config.blockDim = dim3(kDecodeThreads);
                         config.stream = stream;
                         cudaLaunchAttribute attribute{};
                         attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                         attribute.val.programmaticStreamSerializationAllowed = 1;
                         config.attrs = &attribute;
                         config.numAttrs = 1;
                         return cudaLaunchKernelEx(&config, kernel, p, guard);
                       });
}

}  // namespace kdaguard::gpu::detail
