// The per-token recurrence on the GPU: the token preparation shared by decode and verify, and the
// row tiles and chunk pipeline of verify. The kernels are in their families' folders:
// decode/decode_kernel.cuh (one token per row, state updated in place) and
// verify/verify_kernel.cuh (up to T tokens per row, every step's state to a scratch slot).
//
// Verify's work split: rows of a state are independent given the token's q, k, g and beta (row v
// needs v[v] and nothing of the other rows), so a block owns one (row n, value head hv) and a slice
// of its state rows. A group of K/16 lanes holds one state row, 16 elements per lane, in
// registers; the K reductions stay inside the group (shuffles). The slice is walked in chunks of
// 64 bytes of state per thread (one f32 row or two bf16 rows per thread), and the next chunk's
// loads are issued before the current chunk is computed. The token's L2 norms, gate and sigmoid
// are recomputed by every block (one warp per token, all its loads issued at once). Each chunk's
// rows stay in registers across the T steps.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device_common.cuh"
#include "kdaguard/params.h"
#include "row_checks.cuh"

namespace kdaguard::gpu::detail {

inline constexpr int kRowThreads = 128;
inline constexpr int kMaxRowsPerBlock = 128;  // V <= 128

// The geometry of one (state dtype, K): lanes per row, rows a thread carries per chunk (64 bytes
// of state per thread either way), rows per chunk of the block.
template <class ST, int K> struct RowTile {
  static constexpr int kLanes = K / 16;                      // lanes per state row
  static constexpr int kRowsPerPass = kRowThreads / kLanes;  // rows the block holds at once
  static constexpr int kPerVec = StateVec<ST>::kPerVec;      // elements per 16-byte vector
  static constexpr int kVecs = 16 / kPerVec;                 // vectors per lane per row
  static constexpr int kRows = 4 / kVecs;                    // rows per thread per chunk
  static constexpr int kChunkRows = kRowsPerPass * kRows;
  static_assert(K % 32 == 0 && kLanes <= 32 && 32 % kLanes == 0 && kRows * kVecs == 4);
};

// The prepared inputs of up to kSteps tokens, as the row groups read them.
template <int K, int kSteps> struct alignas(16) StepInputs {
  float k[kSteps][K];
  float q[kSteps][K];      // normalised and scaled
  float decay[kSteps][K];  // exp(g)
  float v[kSteps][kMaxRowsPerBlock];
  float beta[kSteps];
  float kq[kSteps];        // k . q, so o = S' q + u (k . q) needs one reduction pass
  std::int64_t dst[kSteps];  // verify: flat scratch slot of the step, -1 = not written
};

// The prepared inputs of one token on the kCh key channels a lane owns: k (L2-normalised when
// asked), q (normalised and scaled), the decay exp(g) per channel, beta, and k . q.
template <int kCh> struct LaneToken {
  float k[kCh], q[kCh], decay[kCh];
  float g[kCh];  // the activated log-space decay: what a record keeps (records/)
  float beta, kq;
  float q_factor;  // q = q's input x q_factor: its inverse norm (when normalised) times the scale
};

// The inputs of one token on the kCh key channels a lane owns, as loaded: k and q, the gate
// (a or g), dt_bias (0 when absent or not used), A_log (0 for activated gates) and beta's input.
template <int kCh> struct LaneTokenInputs {
  float k[kCh], q[kCh], gate[kCh], bias[kCh];
  float a_log, b;
};

// Loads one token of value head hv on the channels channel(0..kCh-1) of this lane. Every load is
// issued before the first conversion, so it costs one memory round trip: the gate and beta, whose
// dtype is the call's, are loaded as raw bits (load_bits) and converted after, since converting
// each where it was loaded (load_f32's branch per element) put a round trip per element in series.
template <class IO, int K, int kCh, class Channel>
__device__ __forceinline__ LaneTokenInputs<kCh> load_lane_token(const TokenInputs& in, int hv,
                                                                std::int64_t token,
                                                                Channel&& channel) {
  const int h = hv / (in.HV / in.H);
  const bool raw_gate = in.gate_kind != GateKind::activated;
  const IO* qp = static_cast<const IO*>(in.q.data) + token * in.q.token_stride + h * in.q.head_stride;
  const IO* kp = static_cast<const IO*>(in.k.data) + token * in.k.token_stride + h * in.k.head_stride;
  const std::int64_t gate_base = token * in.gate.token_stride + hv * in.gate.head_stride;
  LaneTokenInputs<kCh> x;
  std::uint32_t gate_bits[kCh];
#pragma unroll
  for (int i = 0; i < kCh; ++i) {
    const int c = channel(i);
    x.k[i] = to_f32(kp[c]);
    x.q[i] = to_f32(qp[c]);
    gate_bits[i] = load_bits(in.gate.data, in.gate_dtype, gate_base + c);
    x.bias[i] = raw_gate && in.dt_bias != nullptr ? in.dt_bias[hv * K + c] : 0.f;
  }
  x.a_log = raw_gate ? in.A_log[hv] : 0.f;
  const std::uint32_t b_bits =
      load_bits(in.beta.data, in.beta_dtype, token * in.beta.token_stride + hv * in.beta.head_stride);
#pragma unroll
  for (int i = 0; i < kCh; ++i) x.gate[i] = bits_to_f32(gate_bits[i], in.gate_dtype);
  x.b = bits_to_f32(b_bits, in.beta_dtype);
  return x;
}

// Prepares a token from its loaded inputs: the norms and k . q are summed over aligned groups of
// kGroup lanes that together own all K channels. Every lane of the warp must call it (the sums
// shuffle across the warp). kFastSoftplus: the softplus gate as log(1 + e^x) by the MUFU
// instructions (about 5 instructions a channel instead of log1pf's ~35), for a kernel bound by
// instruction issue whose inputs are 16-bit: its error, at most ~1e-7 of g absolute, is far
// below the inputs' rounding (prefill's prepare kernel forms its 16-bit gates the same way).
template <int K, int kCh, int kGroup, bool kFastSoftplus = false>
__device__ __forceinline__ LaneToken<kCh> finish_lane_token(const TokenInputs& in,
                                                            const LaneTokenInputs<kCh>& x) {
  static_assert(kCh * kGroup == K);
  const bool raw_gate = in.gate_kind != GateKind::activated;
  LaneToken<kCh> t;
#pragma unroll
  for (int i = 0; i < kCh; ++i) {
    t.k[i] = x.k[i];
    t.q[i] = x.q[i];
  }
  float q_factor = in.scale;
  if (in.use_qk_l2norm) {
    float kk = 0.f, qq = 0.f;
#pragma unroll
    for (int i = 0; i < kCh; ++i) {
      kk += t.k[i] * t.k[i];
      qq += t.q[i] * t.q[i];
    }
    kk = group_sum<kGroup>(kk);
    qq = group_sum<kGroup>(qq);
    const float k_factor = 1.0f / sqrtf(kk + 1e-6f);
#pragma unroll
    for (int i = 0; i < kCh; ++i) t.k[i] *= k_factor;
    q_factor = (1.0f / sqrtf(qq + 1e-6f)) * in.scale;
  }
  float kq = 0.f;
#pragma unroll
  for (int i = 0; i < kCh; ++i) {
    t.q[i] *= q_factor;
    kq += t.k[i] * t.q[i];
  }
  t.kq = group_sum<kGroup>(kq);
  t.q_factor = q_factor;

  const float a_exp = raw_gate ? expf(x.a_log) : 0.f;
#pragma unroll
  for (int i = 0; i < kCh; ++i) {
    float g = x.gate[i];
    if (raw_gate) {
      const float gx = g + x.bias[i];
      if (in.gate_kind == GateKind::softplus) {
        const float softplus =
            gx > 20.f ? gx : (kFastSoftplus ? __logf(1.f + __expf(gx)) : log1pf(expf(gx)));
        g = -a_exp * softplus;
      } else {
        g = in.lower_bound / (1.f + expf(-a_exp * gx));
      }
    }
    t.g[i] = g;
    t.decay[i] = expf(g);
  }
  t.beta = in.beta_kind == BetaKind::logits ? 1.f / (1.f + expf(-x.b)) : x.b;
  return t;
}

// Loads and prepares one token of value head hv on the channels channel(0..kCh-1) of this lane.
template <class IO, int K, int kCh, int kGroup, class Channel>
__device__ __forceinline__ LaneToken<kCh> prepare_lane_token(const TokenInputs& in, int hv,
                                                             std::int64_t token, Channel&& channel) {
  return finish_lane_token<K, kCh, kGroup>(in, load_lane_token<IO, K, kCh>(in, hv, token, channel));
}

// One warp prepares one token for value head hv into shared memory (verify): the lane-token
// preparation over channels lane + 32 i, and v for the block's `rows` rows from row0. record_gk
// non-null (record-based verify): the token's g and k are also written there, g at [0, K) and k
// at [K, 2K) of its record. In two halves, so that a caller can overlap the loads' round trip with
// other work: load_token issues every load, store_token uses them.
template <int K> struct LoadedToken {
  static constexpr int kPerLane = K / 32;
  static constexpr int kVPerLane = kMaxRowsPerBlock / 32;
  LaneTokenInputs<kPerLane> x;
  float v[kVPerLane];
};

template <class IO, int K>
__device__ __forceinline__ LoadedToken<K> load_token(const TokenInputs& in, int hv,
                                                     std::int64_t token, int row0, int rows,
                                                     int lane) {
  using Loaded = LoadedToken<K>;
  const IO* vp = static_cast<const IO*>(in.v.data) + token * in.v.token_stride + hv * in.v.head_stride;
  Loaded loaded;
#pragma unroll
  for (int i = 0; i < Loaded::kVPerLane; ++i) {
    const int r = lane + 32 * i;
    loaded.v[i] = r < rows && row0 + r < in.V ? to_f32(vp[row0 + r]) : 0.f;
  }
  loaded.x = load_lane_token<IO, K, Loaded::kPerLane>(in, hv, token,
                                                      [&](int i) { return lane + 32 * i; });
  return loaded;
}

template <int K, int kSteps>
__device__ __forceinline__ void store_token(const TokenInputs& in, const LoadedToken<K>& loaded,
                                            int lane, int step, StepInputs<K, kSteps>& sm,
                                            float* record_gk = nullptr) {
  using Loaded = LoadedToken<K>;
  const LaneToken<Loaded::kPerLane> t = finish_lane_token<K, Loaded::kPerLane, 32>(in, loaded.x);
#pragma unroll
  for (int i = 0; i < Loaded::kPerLane; ++i) {
    const int c = lane + 32 * i;
    sm.k[step][c] = t.k[i];
    sm.q[step][c] = t.q[i];
    sm.decay[step][c] = t.decay[i];
    if (record_gk != nullptr) {
      record_gk[c] = t.g[i];
      record_gk[K + c] = t.k[i];
    }
  }
#pragma unroll
  for (int i = 0; i < Loaded::kVPerLane; ++i) sm.v[step][lane + 32 * i] = loaded.v[i];
  if (lane == 0) {
    sm.beta[step] = t.beta;
    sm.kq[step] = t.kq;
  }
}

template <class IO, int K, int kSteps>
__device__ __forceinline__ void prepare_token(const TokenInputs& in, int hv, std::int64_t token,
                                              int row0, int rows, int lane, int step,
                                              StepInputs<K, kSteps>& sm,
                                              float* record_gk = nullptr) {
  store_token<K, kSteps>(in, load_token<IO, K>(in, hv, token, row0, rows, lane), lane, step, sm,
                         record_gk);
}

// One token on one state row held by a lane group: decay, prediction error on the decayed row,
// rank-1 correction; returns the row's output o = S_new . q. k, q and the decay are read from
// shared memory in the lane's element order. Every lane of the warp must call it (the reductions
// shuffle across the whole warp).
// u_out: the row's prediction error u = beta (v - S k), what a record keeps of the row.
template <class ST, int K, int kSteps>
__device__ __forceinline__ float step_row(float (&s)[16], const StepInputs<K, kSteps>& sm, int step,
                                          int group_lane, float v, float& u_out) {
  using Tile = RowTile<ST, K>;
  float sk = 0.f, sq = 0.f;
  float k[16];
#pragma unroll
  for (int c = 0; c < Tile::kVecs; ++c) {
#pragma unroll
    for (int w = 0; w < Tile::kPerVec; w += 4) {
      const int at = (c * Tile::kLanes + group_lane) * Tile::kPerVec + w;
      const float4 kv = *reinterpret_cast<const float4*>(&sm.k[step][at]);
      const float4 qv = *reinterpret_cast<const float4*>(&sm.q[step][at]);
      const float4 dv = *reinterpret_cast<const float4*>(&sm.decay[step][at]);
      const int e = c * Tile::kPerVec + w;
      const float kk[4] = {kv.x, kv.y, kv.z, kv.w};
      const float qq[4] = {qv.x, qv.y, qv.z, qv.w};
      const float dd[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[e + j] *= dd[j];
        sk += s[e + j] * kk[j];
        sq += s[e + j] * qq[j];
        k[e + j] = kk[j];
      }
    }
  }
  sk = group_sum<Tile::kLanes>(sk);
  sq = group_sum<Tile::kLanes>(sq);
  const float u = sm.beta[step] * (v - sk);
#pragma unroll
  for (int e = 0; e < 16; ++e) s[e] += u * k[e];
  u_out = u;
  return sq + u * sm.kq[step];
}
template <class ST, int K, int kSteps>
__device__ __forceinline__ float step_row(float (&s)[16], const StepInputs<K, kSteps>& sm, int step,
                                          int group_lane, float v) {
  float u;
  return step_row<ST, K, kSteps>(s, sm, step, group_lane, v, u);
}

// Block coordinates: blockIdx.x enumerates (row n, head hv, slice), slices fastest.
struct BlockCoords {
  std::int32_t n, hv, slice;
};
__device__ __forceinline__ BlockCoords block_coords(std::int32_t heads, std::int32_t slices) {
  const std::int64_t b = blockIdx.x;
  BlockCoords c;
  c.slice = static_cast<std::int32_t>(b % slices);
  const std::int64_t rest = b / slices;
  c.hv = static_cast<std::int32_t>(rest % heads);
  c.n = static_cast<std::int32_t>(rest / heads);
  return c;
}

template <class IO>
__device__ __forceinline__ void store_out(const OutputRows& out, std::int64_t token, int hv, int row,
                                          float value) {
  static_cast<IO*>(out.data)[token * out.token_stride + hv * out.head_stride + row] =
      from_f32<IO>(value);
}

// Where a thread's rows of a chunk live: row of the head, and index among the block's rows.
template <class ST, int K> struct ChunkRows {
  using Tile = RowTile<ST, K>;
  int block_row0, row_in_pass, group_lane;

  __device__ __forceinline__ int local(int chunk, int r) const {
    return chunk * Tile::kChunkRows + r * Tile::kRowsPerPass + row_in_pass;
  }
  __device__ __forceinline__ int row(int chunk, int r) const { return block_row0 + local(chunk, r); }
  // The thread's 16-byte vector c of state row `at` of a head.
  template <class T> __device__ __forceinline__ T* vector(T* head, int at, int c) const {
    return head + static_cast<std::int64_t>(at) * K +
           (c * Tile::kLanes + group_lane) * Tile::kPerVec;
  }

  // Issues the loads of the thread's part of a chunk: raw 16-byte vectors, zeros past V.
  __device__ __forceinline__ void load(const ST* head, int V, int chunk, uint4 (&raw)[4]) const {
#pragma unroll
    for (int r = 0; r < Tile::kRows; ++r) {
      const int at = row(chunk, r);
#pragma unroll
      for (int c = 0; c < Tile::kVecs; ++c)
        raw[r * Tile::kVecs + c] =
            at < V ? load_stream(vector(head, at, c)) : make_uint4(0, 0, 0, 0);
    }
  }
  // Issues the copies of the thread's part of a chunk into its column of a ring slot (below):
  // zeros past V.
  __device__ __forceinline__ void copy(const ST* head, int V, int chunk,
                                       uint4 (&slot)[4][kRowThreads]) const {
#pragma unroll
    for (int r = 0; r < Tile::kRows; ++r) {
      const int at = row(chunk, r);
#pragma unroll
      for (int c = 0; c < Tile::kVecs; ++c) {
        uint4& dst = slot[r * Tile::kVecs + c][threadIdx.x];
        if (at < V)
          cp_async_16(&dst, vector(head, at, c));
        else
          dst = make_uint4(0, 0, 0, 0);
      }
    }
  }
  __device__ __forceinline__ void unpack(const uint4 (&raw)[4], int r, float (&s)[16]) const {
#pragma unroll
    for (int c = 0; c < Tile::kVecs; ++c)
      StateVec<ST>::unpack(raw[r * Tile::kVecs + c], &s[c * Tile::kPerVec]);
  }
  __device__ __forceinline__ void store(ST* head, int at, const float (&s)[16]) const {
#pragma unroll
    for (int c = 0; c < Tile::kVecs; ++c)
      store_stream(vector(head, at, c), StateVec<ST>::pack(&s[c * Tile::kPerVec]));
  }
};

// The chunks through a ring of kDepth slots in shared memory (cp.async): kDepth chunks are in
// flight before the first is computed and kDepth - 1 while each is, without the registers a
// pipeline of loads into registers holds (with four blocks an SM, room for one chunk ahead). A
// thread copies and reads only its own column, so no barrier is needed.
template <int kDepth> struct ChunkRing {
  uint4 raw[kDepth][4][kRowThreads];
};

// Issues the copies of the first kDepth chunks (ring_chunks' prologue, split from it so that a
// caller can issue a token's small loads ahead of them and prepare the token while they fly).
template <class ST, int K, int kDepth>
__device__ __forceinline__ void fill_ring(const ChunkRows<ST, K>& rows, const ST* head, int V,
                                          int chunks, ChunkRing<kDepth>& ring) {
#pragma unroll
  for (int i = 0; i < kDepth; ++i) {
    if (i < chunks) rows.copy(head, V, i, ring.raw[i]);
    cp_async_commit();  // one group per chunk, empty past the end, so the counts stay uniform
  }
}

// Walks `chunks` chunks from a filled ring: process(raw, chunk) gets each chunk's raw vectors in
// order; a slot is refilled once its chunk is processed.
template <class ST, int K, int kDepth, class Process>
__device__ __forceinline__ void ring_chunks(const ChunkRows<ST, K>& rows, const ST* head, int V,
                                            int chunks, ChunkRing<kDepth>& ring,
                                            Process&& process) {
  for (int chunk = 0; chunk < chunks; ++chunk) {
    cp_async_wait_pending<kDepth - 1>();
    uint4(&slot)[4][kRowThreads] = ring.raw[chunk % kDepth];
    uint4 raw[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) raw[j] = slot[j][threadIdx.x];
    process(raw, chunk);
    if (chunk + kDepth < chunks) rows.copy(head, V, chunk + kDepth, slot);
    cp_async_commit();
  }
}

// Walks `chunks` chunks with the next chunk's loads in flight while the current one is computed:
// process(raw, chunk) gets each chunk's raw vectors in order, chunk 0's already issued into `even`
// by rows.load. Two named buffers (not an indexed array) keep both in registers.
template <class ST, int K, class Process>
__device__ __forceinline__ void pipeline_preloaded_chunks(const ChunkRows<ST, K>& rows,
                                                          const ST* head, int V, int chunks,
                                                          uint4 (&even)[4], Process&& process) {
  uint4 odd[4];
  for (int chunk = 0; chunk < chunks; chunk += 2) {
    if (chunk + 1 < chunks) rows.load(head, V, chunk + 1, odd);
    process(even, chunk);
    if (chunk + 1 < chunks) {
      if (chunk + 2 < chunks) rows.load(head, V, chunk + 2, even);
      process(odd, chunk + 1);
    }
  }
}

// How a block's chunks of state reach its threads, by the state's dtype. f32: through registers,
// one chunk ahead (128 registers a thread hold it beside the step's work). 16-bit: through a
// ChunkRing, where the same register pipeline spilled. Measured on an H100 (bench/NOTES.md, "State
// chunks through a shared-memory ring"): the ring took bf16 verify from 77-83% to 81-88% of the
// copy ceiling and made f32 verify 1-2% slower at B = 64.
template <class ST> inline constexpr bool kChunksThroughRing = sizeof(ST) == 2;
struct NoRing {};
template <class ST, int kDepth>
using StateRing = std::conditional_t<kChunksThroughRing<ST>, ChunkRing<kDepth>, NoRing>;

// start_chunks issues the first chunks' loads (into `first` or the ring), so that a caller can
// prepare its tokens while they are in flight; walk_chunks then hands process(raw, chunk) every
// chunk in order and returns with no copy outstanding.
template <class ST, int K, class Ring>
__device__ __forceinline__ void start_chunks(const ChunkRows<ST, K>& rows, const ST* head, int V,
                                             int chunks, Ring& ring, uint4 (&first)[4]) {
  if constexpr (std::is_same_v<Ring, NoRing>)
    rows.load(head, V, 0, first);
  else
    fill_ring<ST, K>(rows, head, V, chunks, ring);
}
template <class ST, int K, class Ring, class Process>
__device__ __forceinline__ void walk_chunks(const ChunkRows<ST, K>& rows, const ST* head, int V,
                                            int chunks, Ring& ring, uint4 (&first)[4],
                                            Process&& process) {
  if constexpr (std::is_same_v<Ring, NoRing>) {
    pipeline_preloaded_chunks<ST, K>(rows, head, V, chunks, first, static_cast<Process&&>(process));
  } else {
    ring_chunks<ST, K>(rows, head, V, chunks, ring, static_cast<Process&&>(process));
    cp_async_wait_all();  // the empty groups past the end included
  }
}
// start_chunks then walk_chunks, for a caller with nothing to prepare while the first chunks fly.
template <class ST, int K, class Ring, class Process>
__device__ __forceinline__ void stream_chunks(const ChunkRows<ST, K>& rows, const ST* head, int V,
                                              int chunks, Ring& ring, Process&& process) {
  uint4 first[4];  // the first chunk, where the state is f32
  start_chunks<ST, K>(rows, head, V, chunks, ring, first);
  walk_chunks<ST, K>(rows, head, V, chunks, ring, first, static_cast<Process&&>(process));
}

}  // namespace kdaguard::gpu::detail
