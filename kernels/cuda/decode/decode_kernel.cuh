// decode: row n is request n, token n; state slot cache_indices[n] updated in place.
//
// Work split: every warp is an independent worker (no barrier across warps). A state row of K
// elements is held by kLanes = K * sizeof(ST) / 16 lanes, one 16-byte vector each, so one warp
// instruction moves 512 contiguous bytes; a lane carries 4 rows per chunk (a chunk is 2 KB of
// contiguous state), whose reductions are independent of each other. A lane's channels of k, q
// and the decay are the same for every row of a head, so a warp prepares them once per head, in
// registers (the norms are summed over the lane group). The work is the flat list of chunks
// [row n][value head hv][chunk]; each warp takes a contiguous share (shares differ by one chunk at
// most: about kChunksPerWarp, or the whole resident grid's equal shares for small batches) and
// walks it across head and row boundaries.
//
// Loads: each warp owns a ring of kStages chunk buffers and two head-input buffers in shared
// memory, filled by bulk copies (bulk_copy.cuh) that lane 0 issues kStages - 1 chunks ahead of the
// chunk being computed; a head's q, k, gate, dt_bias and v rows arrive the same way when the issue
// cursor enters the head. So about 8 KB per warp are in flight without holding registers, and a
// warp waits on memory only when the whole ring is behind. Launched with programmatic stream
// serialisation, a call's blocks are resident when the previous kernel on the stream finishes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "decode/bulk_copy.cuh"
#include "decode/decode_launch.h"
#include "decode/warp_rows.cuh"
#include "kernel_residency.h"
#include "launch.h"
#include "recurrent.cuh"
#include "row_checks.cuh"

namespace kdaguard::gpu::detail {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;

// Chunks per warp when the batch has more than the resident grid can take in equal shares of
// this size: the grid is then larger than resident and the block scheduler hands blocks to SMs as
// they free up. Equal static shares of the whole call finish unevenly across SMs; shorter shares
// balance better until the ring's fill at each block's start weighs more. Measured on the H200,
// f32 state, B = 64 / 128 / 256 / 512, % of the copy ceiling (the v7 measurements, bench/NOTES.md):
// 8 chunks 83.1 / 87.9 / 91.4 / 92.9, 16 chunks 82.6 / 86.5 / 89.8 / 91.6, 32 chunks 78.2 / 83.5
// / 85.9 / 87.9.
constexpr int kChunksPerWarp = 8;

// Chunk buffers per warp: kStages - 1 chunks (8 KB) in flight while one is computed. Five fit
// four blocks per SM when q, k and v are 16-bit (f32 inputs fit three). Measured against five
// (v7, bench/NOTES.md): four stages 0.4 to 1.0 points slower at B >= 64; six at three blocks per SM 0.7
// points faster for f32 state at B >= 256 but slower below (B = 8: 55.5 against 62.4% of copy).
constexpr int kStages = 5;
constexpr int kMinBlocksPerSm = 4;

// A head's inputs in shared memory, each row at a fixed offset (K, V <= 128): q, k and v in the
// call's IO dtype, the gate in its own (f32 at most), dt_bias (f32) only for raw gates that have
// one.
template <class IO> struct HeadBuffer {
  static constexpr int kIoRowBytes = 128 * static_cast<int>(sizeof(IO));
  static constexpr int kF32RowBytes = 128 * 4;
  alignas(16) unsigned char q[kIoRowBytes];
  alignas(16) unsigned char k[kIoRowBytes];
  alignas(16) unsigned char v[kIoRowBytes];
  alignas(16) unsigned char gate[kF32RowBytes];
  alignas(16) unsigned char dt_bias[kF32RowBytes];
};

// One warp's ring; 128-byte aligned so that every warp's buffers meet the bulk copies' 16-byte
// alignment whatever the size of HeadBuffer<IO>.
template <class IO> struct alignas(128) WarpRing {
  static constexpr int kChunkBytes = 4 * 512;  // WarpTile's chunk for every state dtype and K
  unsigned char chunk[kStages][kChunkBytes];
  HeadBuffer<IO> head[2];
  std::uint64_t chunk_ready[kStages];
  std::uint64_t head_ready[2];
};
template <class IO> constexpr int kSharedBytes = kDecodeWarps * sizeof(WarpRing<IO>);

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
// The verdict is the warp's own (row_checks.cuh's row_verdict, a warp-wide scan for
// index.unique): a guarded call needs no guard kernel before this one.
struct RowStatus {
  std::int32_t n = -1;
  std::int64_t slot = -1;
  std::uint64_t faults = 0;  // rules the row breaks: reported once, the row is skipped
  bool skip = true;          // faulty: nothing is written
  bool active = false;       // not skipped and not padding: the state is read and written
};

// Warp-uniform: every lane of the warp calls it for the same row.
__device__ __forceinline__ RowStatus decode_row(const DecodeParams& p, const GuardState& guard,
                                                std::int32_t n) {
  RowStatus r;
  r.n = n;
  r.slot = p.cache_indices[n];
  r.faults = row_verdict<WarpGroup>(p, guard, n);
  r.skip = r.faults != 0;
  r.active = !r.skip && vc::is_active(r.slot);
  return r;
}

// The size of a dtype's element as the kernels use it (f32 or 16-bit): the device's twin of the
// contracts' element_size, which is host-only (the contracts library includes no CUDA header).
__device__ __forceinline__ std::uint32_t element_bytes(DType dtype) {
  return dtype == DType::f32 ? 4u : 2u;
}

template <class IO, class ST, int K>
__global__ void __launch_bounds__(kDecodeThreads, kMinBlocksPerSm)
    decode_kernel(const DecodeParams p, const GuardState guard) {
  using Tile = WarpTile<ST, K>;
  using Ring = WarpRing<IO>;
  static_assert(Tile::kChunkRows * K * sizeof(ST) == Ring::kChunkBytes);
  extern __shared__ __align__(128) unsigned char shared[];
  wait_for_prior_grids();
  allow_next_grid();  // the next call's blocks may take free SM slots; they wait for this grid

  const int lane = threadIdx.x % 32;
  const int group_lane = lane % Tile::kLanes;
  const int row_in_pass = lane / Tile::kLanes;
  const int V = p.in.V;
  const std::int32_t heads = p.in.HV;
  const std::int32_t chunks_per_head = V / Tile::kChunkRows;

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

  Ring& ring = reinterpret_cast<Ring*>(shared)[threadIdx.x / 32];
  if (lane == 0) {
    for (int b = 0; b < kStages; ++b) init_barrier(&ring.chunk_ready[b]);
    for (int b = 0; b < 2; ++b) init_barrier(&ring.head_ready[b]);
  }
  __syncwarp();

  ST* const pool = static_cast<ST*>(p.state.data);
  const TokenInputs& in = p.in;
  const bool raw_gate = in.gate_kind != GateKind::activated;
  const bool copy_bias = raw_gate && in.dt_bias != nullptr;
  const std::uint32_t gate_element = element_bytes(in.gate_dtype);
  const std::uint32_t io_row = K * sizeof(IO), gate_row = K * gate_element;
  const std::uint32_t head_bytes = 2 * io_row + gate_row + (copy_bias ? K * 4 : 0) + V * sizeof(IO);
  auto head_of = [&](const RowStatus& row, std::int32_t hv) {
    return pool + row.slot * p.state.slot_stride + static_cast<std::int64_t>(hv) * V * K;
  };

  // Issue side: the bulk copies of the chunk at the issue cursor (active rows only) and, on
  // entering a head, of its inputs; beta and A_log are single values, loaded into registers.
  ChunkCursor issue_at = first;
  RowStatus issue_row = decode_row(p, guard, first.n);
  std::int64_t issued = begin;
  int issue_stage = 0;  // the ring buffer of chunk `issued`: (issued - begin) % kStages
  std::uint32_t heads_issued = 0;
  float b_of_buffer[2] = {0.f, 0.f}, a_log_of_buffer[2] = {0.f, 0.f};  // indexed by selects
  auto issue = [&] {
    if (issued >= end) return;
    if (issue_at.n != issue_row.n) issue_row = decode_row(p, guard, issue_at.n);
    if (issue_row.active) {
      __syncwarp();  // every lane is done with the buffers about to be refilled
      if (issue_at.c == 0 || issued == begin) {
        const std::uint32_t b = heads_issued++ & 1u;
        const std::int64_t n = issue_at.n;
        const int hv = issue_at.hv, h = hv / (in.HV / in.H);
        const float beta_in = load_f32(in.beta.data, in.beta_dtype,
                                       n * in.beta.token_stride + hv * in.beta.head_stride);
        const float a_log = raw_gate ? in.A_log[hv] : 0.f;
        (b == 0 ? b_of_buffer[0] : b_of_buffer[1]) = beta_in;
        (b == 0 ? a_log_of_buffer[0] : a_log_of_buffer[1]) = a_log;
        if (lane == 0) {
          HeadBuffer<IO>& dst = ring.head[b];
          std::uint64_t* bar = &ring.head_ready[b];
          expect_bytes(bar, head_bytes);
          copy_async(dst.q, static_cast<const IO*>(in.q.data) + n * in.q.token_stride + h * in.q.head_stride,
                     io_row, bar);
          copy_async(dst.k, static_cast<const IO*>(in.k.data) + n * in.k.token_stride + h * in.k.head_stride,
                     io_row, bar);
          copy_async(dst.gate,
                     static_cast<const unsigned char*>(in.gate.data) +
                         (n * in.gate.token_stride + hv * in.gate.head_stride) * gate_element,
                     gate_row, bar);
          if (copy_bias) copy_async(dst.dt_bias, in.dt_bias + hv * K, K * 4, bar);
          copy_async(dst.v, static_cast<const IO*>(in.v.data) + n * in.v.token_stride + hv * in.v.head_stride,
                     V * sizeof(IO), bar);
        }
      }
      if (lane == 0) {
        expect_bytes(&ring.chunk_ready[issue_stage], Ring::kChunkBytes);
        copy_async(ring.chunk[issue_stage],
                   head_of(issue_row, issue_at.hv) + static_cast<std::int64_t>(issue_at.c) * Tile::kChunkRows * K,
                   Ring::kChunkBytes, &ring.chunk_ready[issue_stage]);
      }
    }
    issue_at.advance(heads, chunks_per_head);
    ++issued;
    if (++issue_stage == kStages) issue_stage = 0;
  };

  // Use side. Phases flip per wait: bit b of chunk_phase is stage b's, of head_phase buffer b's.
  ChunkCursor use_at = first;
  RowStatus use_row = issue_row;
  std::uint32_t heads_used = 0, chunk_phase = 0, head_phase = 0;
  const IO* head_v = nullptr;
  LaneToken<Tile::kPerVec> token;
  auto row_of = [&](int c, int r) { return c * Tile::kChunkRows + r * Tile::kRowsPerPass + row_in_pass; };
  auto compute = [&](std::int64_t chunk, int stage) {
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
    if (use_at.c == 0 || chunk == begin) {  // a new head: its inputs from shared memory
      const std::uint32_t b = heads_used++ & 1u;
      wait_phase(&ring.head_ready[b], (head_phase >> b) & 1u);
      head_phase ^= 1u << b;
      const HeadBuffer<IO>& src = ring.head[b];
      LaneTokenInputs<Tile::kPerVec> x;
#pragma unroll
      for (int i = 0; i < Tile::kPerVec; ++i) {
        const int c = group_lane * Tile::kPerVec + i;
        x.k[i] = to_f32(reinterpret_cast<const IO*>(src.k)[c]);
        x.q[i] = to_f32(reinterpret_cast<const IO*>(src.q)[c]);
        x.gate[i] = load_f32(src.gate, in.gate_dtype, c);
        x.bias[i] = copy_bias ? reinterpret_cast<const float*>(src.dt_bias)[c] : 0.f;
      }
      x.b = b == 0 ? b_of_buffer[0] : b_of_buffer[1];
      x.a_log = b == 0 ? a_log_of_buffer[0] : a_log_of_buffer[1];
      token = finish_lane_token<K, Tile::kPerVec, Tile::kLanes>(in, x);
      head_v = reinterpret_cast<const IO*>(src.v);
    }
    wait_phase(&ring.chunk_ready[stage], (chunk_phase >> stage) & 1u);
    chunk_phase ^= 1u << stage;

    // Decay, then S k and S q of every row: 2 x kVecs sums over the lane group, scattered so
    // that each lane ends up with one total (value r: S k of row r, value kVecs + r: S q).
    constexpr int kValues = 2 * Tile::kVecs;
    using Owner = ScatterOwner<Tile::kLanes, kValues>;
    float s[Tile::kVecs][Tile::kPerVec];
    float sums[kValues];
#pragma unroll
    for (int r = 0; r < Tile::kVecs; ++r) {
      // Row r * kRowsPerPass + row_in_pass of the chunk, vector group_lane: byte r * 512 + lane * 16.
      StateVec<ST>::unpack(*reinterpret_cast<const uint4*>(&ring.chunk[stage][r * 512 + lane * 16]), s[r]);
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
      const int row = row_of(use_at.c, r);
      const float sk = __shfl_sync(0xffffffffu, owned, group_base + Owner::first_lane(r));
      const float u = token.beta * (to_f32(head_v[row]) - sk);
      if (owned_value == Tile::kVecs + r) my_u = u;
#pragma unroll
      for (int e = 0; e < Tile::kPerVec; ++e) s[r][e] += u * token.k[e];
      store_stream(head + static_cast<std::int64_t>(row) * K + group_lane * Tile::kPerVec,
                   StateVec<ST>::pack(s[r]));
    }
    if (owned_value >= Tile::kVecs && group_lane == Owner::first_lane(owned_value))
      store_out<IO>(p.out, use_at.n, use_at.hv, row_of(use_at.c, owned_value - Tile::kVecs),
                    owned + my_u * token.kq);
  };

  for (int b = 0; b + 1 < kStages; ++b) issue();
  int use_stage = 0;  // (chunk - begin) % kStages
  for (std::int64_t chunk = begin; chunk < end; ++chunk) {
    issue();
    compute(chunk, use_stage);
    use_at.advance(heads, chunks_per_head);
    if (++use_stage == kStages) use_stage = 0;
  }
}

}  // namespace

template <class IO, class ST, int K>
cudaError_t launch_decode_tile(const DecodeParams& p, GuardState guard, int chunks_per_block,
                               cudaStream_t stream) {
  using Tile = WarpTile<ST, K>;
  constexpr auto kernel = decode_kernel<IO, ST, K>;
  const int chunks_per_head = p.in.V / Tile::kChunkRows;
  // A warp's two head buffers are refilled safely only when a head spans at least kStages - 1
  // chunks (the fewest: 4, V = 64 with bf16 state and K = 64, 16 rows per chunk).
  if (p.in.V % Tile::kChunkRows != 0 || chunks_per_head < kStages - 1) return cudaErrorInvalidValue;
  const std::int64_t chunks = static_cast<std::int64_t>(p.batch) * p.in.HV * chunks_per_head;
  if (chunks == 0) return cudaSuccess;
  int resident = 0;
  if (const cudaError_t e = ready_kernel<kernel>(kDecodeThreads, kSharedBytes<IO>, resident);
      e != cudaSuccess)
    return e;
  const int per_warp = chunks_per_block > 0 ? chunks_per_block : kChunksPerWarp;
  const std::int64_t warps_wanted = (chunks + per_warp - 1) / per_warp;
  std::int64_t blocks = (warps_wanted + kDecodeWarps - 1) / kDecodeWarps;
  // Fewer chunks than the resident grid's warps x kChunksPerWarp: spread them over the whole
  // resident grid (small batches want every SM).
  if (chunks_per_block <= 0 && resident > 0 && blocks < resident)
    blocks = std::min<std::int64_t>(resident, (chunks + kDecodeWarps - 1) / kDecodeWarps);
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  return launch_after_prior_grid(kernel, static_cast<unsigned>(blocks), kDecodeThreads,
                                 kSharedBytes<IO>, stream, p, guard);
}

}  // namespace kdaguard::gpu::detail
