// The verify kernel and its launcher for one (IO element type, state element type, K): row n owns
// tokens [cu[n], cu[n+1]); the work split and the row tiles are in common/recurrent.cuh.
#pragma once

#include <climits>

#include "launch.h"
#include "recurrent.cuh"
#include "verify/verify_launch.h"

namespace kdaguard::gpu::detail {

// verify: row n owns tokens [cu[n], cu[n+1]); reads committed slot cache_indices[n] (never
// written), writes the state after step t to its scratch slot. Each chunk's rows stay in
// registers across the steps; between steps the state is rounded to the pool's dtype, so verify
// reproduces T single-token decodes exactly. Tokens are prepared 8 at a time; rows of up to 8
// tokens (the usual draft lengths) prepare them once for all chunks.
inline constexpr int kVerifyStepBatch = 8;  // tokens prepared per barrier
// Chunks of 16-bit state in flight (start_chunks, walk_chunks): 24 KB a block beside the 16.5 KB
// of prepared tokens.
inline constexpr int kVerifyRingDepth = 3;

template <class IO, class ST, int K>
__global__ void __launch_bounds__(kRowThreads, 4)
    verify_kernel(const VerifyParams p, const GuardState guard, const std::int32_t slices,
                  const std::int32_t chunks) {
  using Tile = RowTile<ST, K>;
  __shared__ StepInputs<K, kVerifyStepBatch> sm;
  __shared__ StateRing<ST, kVerifyRingDepth> ring;

  const BlockCoords bc = block_coords(p.in.HV, slices);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int V = p.in.V;
  const int block_rows = chunks * Tile::kChunkRows;
  const ChunkRows<ST, K> rows{bc.slice * block_rows, static_cast<int>(threadIdx.x) / Tile::kLanes,
                              static_cast<int>(threadIdx.x) % Tile::kLanes};

  // The memory-safety rules on the block's row (row_checks.cuh), then the guard kernel's verdict.
  const std::uint64_t faults = row_verdict(p, guard, bc.n);
  const bool first_block_of_row = bc.hv == 0 && bc.slice == 0;
  if (faults != 0) {
    if (threadIdx.x == 0 && first_block_of_row) raise(guard.error_word, faults);
    return;
  }
  if (guard.row_flags != nullptr && guard.row_flags[bc.n] != 0) return;
  const std::int64_t slot = p.cache_indices[bc.n];
  const std::int64_t first_token = p.cu_seqlens[bc.n];  // the row's tokens: judged in range
  const int length = static_cast<int>(p.cu_seqlens[bc.n + 1] - first_token);
  if (length == 0) return;
  if (!vc::is_active(slot)) {  // padding row: zero outputs, no scratch
    for (int t = 0; t < length; ++t)
      for (int i = threadIdx.x; i < block_rows; i += kRowThreads)
        if (rows.block_row0 + i < V)
          store_out<IO>(p.out, first_token + t, bc.hv, rows.block_row0 + i, 0.f);
    return;
  }

  const std::int64_t head_offset = static_cast<std::int64_t>(bc.hv) * V * K;
  const ST* head = static_cast<const ST*>(p.state.data) + slot * p.state.slot_stride + head_offset;

  // Token t's inputs, loaded (load_step), then prepared into entry `step` of the shared batch with
  // the scratch slot its state goes to (store_step).
  auto load_step = [&](int t) {
    return load_token<IO, K>(p.in, bc.hv, first_token + t, rows.block_row0, block_rows, lane);
  };
  auto store_step = [&](int t, int step, const LoadedToken<K>& loaded) {
    store_token<K, kVerifyStepBatch>(p.in, loaded, lane, step, sm);
    if (lane == 0) {
      std::int64_t dst = scratch_slot(p.target, bc.n, t);
      if (!vc::slot_in_range(dst, p.target.scratch.num_slots, true)) {
        if (first_block_of_row) raise(guard.error_word, bit(RuleId::index_range) & guard.enabled);
        dst = -1;
      }
      sm.dst[step] = dst;
    }
  };
  int prepared = -1;  // first token of the batch in shared memory; uniform across the block
  auto prepare = [&](int t0) {
    if (prepared == t0) return;
    if (prepared >= 0) __syncthreads();  // the previous batch is consumed
    const int steps = min(kVerifyStepBatch, length - t0);
    for (int step = warp; step < steps; step += kRowThreads / 32)
      store_step(t0 + step, step, load_step(t0 + step));
    __syncthreads();
    prepared = t0;
  };

  // Rows of at most one batch of tokens (the usual draft lengths) prepare it once, before the
  // chunk loop, so no chunk's rows or loads are live across a preparation: with bf16 state that
  // halved the local-memory (spill) requests and made verify up to 5% faster (the v7 verify, bench/NOTES.md).
  auto process = [&]<bool kOneBatch>(const uint4 (&raw)[4], int chunk) {
    float s[Tile::kRows][16];
#pragma unroll
    for (int r = 0; r < Tile::kRows; ++r) rows.unpack(raw, r, s[r]);
    for (int t0 = 0; t0 < length; t0 += kVerifyStepBatch) {
      if constexpr (!kOneBatch) prepare(t0);
      const int steps = min(kVerifyStepBatch, length - t0);
      for (int step = 0; step < steps; ++step) {
        const std::int64_t dst = sm.dst[step];
        ST* dst_head = dst >= 0 ? static_cast<ST*>(p.target.scratch.data) +
                                      dst * p.target.scratch.slot_stride + head_offset
                                : nullptr;
#pragma unroll
        for (int r = 0; r < Tile::kRows; ++r) {
          const float o = step_row<ST, K, kVerifyStepBatch>(s[r], sm, step, rows.group_lane,
                                                            sm.v[step][rows.local(chunk, r)]);
#pragma unroll
          for (int e = 0; e < 16; ++e) s[r][e] = StateVec<ST>::round(s[r][e]);
          const int at = rows.row(chunk, r);
          if (at < V) {
            if (dst_head != nullptr) rows.store(dst_head, at, s[r]);
            if (rows.group_lane == 0) store_out<IO>(p.out, first_token + t0 + step, bc.hv, at, o);
          }
        }
      }
    }
  };
  if (length <= kVerifyStepBatch) {
    // Each warp's first token is loaded before the first chunk of state, whose bytes would
    // otherwise be queued ahead of it: the token's round trip then overlaps the state's instead
    // of preceding it.
    [[maybe_unused]] LoadedToken<K> first_step;
    if (warp < length) first_step = load_step(warp);
    uint4 first[4];  // the first chunk, where the state is f32 (start_chunks)
    start_chunks<ST, K>(rows, head, V, chunks, ring, first);
    if (warp < length) store_step(warp, warp, first_step);
    for (int step = warp + kRowThreads / 32; step < length; step += kRowThreads / 32)
      store_step(step, step, load_step(step));
    __syncthreads();
    walk_chunks<ST, K>(rows, head, V, chunks, ring, first, [&](const uint4 (&raw)[4], int chunk) {
      process.template operator()<true>(raw, chunk);
    });
  } else {
    stream_chunks<ST, K>(rows, head, V, chunks, ring, [&](const uint4 (&raw)[4], int chunk) {
      process.template operator()<false>(raw, chunk);
    });
  }
}

template <class IO, class ST, int K>
cudaError_t launch_verify_tile(const VerifyParams& p, GuardState guard, int chunks_per_block,
                               cudaStream_t stream) {
  using Tile = RowTile<ST, K>;
  const int per_head = (p.in.V + Tile::kChunkRows - 1) / Tile::kChunkRows;
  const int chunks = pick_chunks_per_block(p.rows, p.in.HV, per_head, chunks_per_block);
  const std::int32_t slices = (per_head + chunks - 1) / chunks;
  const std::int64_t blocks = static_cast<std::int64_t>(p.rows) * p.in.HV * slices;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  verify_kernel<IO, ST, K><<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(p, guard, slices,
                                                                                      chunks);
  return cudaGetLastError();
}

}  // namespace kdaguard::gpu::detail
