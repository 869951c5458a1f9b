// What the two record kernels share (records_kernel.cuh: the step form on verify's row tiles, every
// state dtype; records_mma.cuh: f32 state on tensor cores): the views of the three entry points'
// parameters, the row prologue, the replayed steps in shared memory and the replay of one element.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dispatch.cuh"
#include "guard/guard_kernel.cuh"
#include "launch.h"
#include "recurrent.cuh"

namespace kdaguard::gpu::detail {

inline constexpr int kRecordStepBatch = 8;  // steps prepared per barrier, as verify

// What every record entry point has: the pool, the slot map and the head geometry.
struct RecordPool {
  std::int32_t rows, HV, V;
  StatePool state;
  const std::int32_t* cache_indices;
};
__host__ __device__ inline RecordPool pool_of(const RecordVerifyParams& p) {
  return {p.rows, p.in.HV, p.in.V, p.state, p.cache_indices};
}
__host__ __device__ inline RecordPool pool_of(const ReplayCommitParams& p) {
  return {p.rows, p.HV, p.V, p.state, p.cache_indices};
}
__host__ __device__ inline RecordPool pool_of(const AcceptVerifyParams& p) {
  return pool_of(p.verify);
}

// The records a call replays and their counts (replay_commit, accept_verify).
struct ReplaySource {
  RecordBuffer records;
  const std::int32_t* counts;
};
__device__ __forceinline__ ReplaySource replay_of(const ReplayCommitParams& p) {
  return {p.records, p.accepted};
}
__device__ __forceinline__ ReplaySource replay_of(const AcceptVerifyParams& p) {
  return {p.prior_records, p.prior_accepted};
}
__host__ __device__ inline const RecordVerifyParams& draft_of(const RecordVerifyParams& p) { return p; }
__host__ __device__ inline const RecordVerifyParams& draft_of(const AcceptVerifyParams& p) {
  return p.verify;
}
template <class Params> inline constexpr bool kReplays = !std::is_same_v<Params, RecordVerifyParams>;
template <class Params> inline constexpr bool kDrafts = !std::is_same_v<Params, ReplayCommitParams>;

// The rows the guard kernel judges for a call without rows (its single cu_seqlens offset,
// row_rules::call_faults): accept_verify's are its draft's.
inline rr::VerifyRows<DeviceIndex> empty_call_rows(const RecordVerifyParams& p) {
  return record_verify_rows(p);
}
inline rr::CommitRows<DeviceIndex> empty_call_rows(const ReplayCommitParams& p) {
  return replay_commit_rows(p);
}
inline rr::VerifyRows<DeviceIndex> empty_call_rows(const AcceptVerifyParams& p) {
  return record_verify_rows(p.verify);
}

// The largest number of records a row of the call replays (replay_commit: accepted <= T;
// accept_verify: prior_accepted <= prior_records' steps), and of draft tokens it verifies.
inline std::int64_t replay_bound(const RecordVerifyParams&) { return 0; }
inline std::int64_t replay_bound(const ReplayCommitParams& p) { return p.draft_tokens; }
inline std::int64_t replay_bound(const AcceptVerifyParams& p) { return p.prior_records.steps; }
inline std::int64_t draft_bound(const RecordVerifyParams& p) { return p.draft_tokens; }
inline std::int64_t draft_bound(const ReplayCommitParams&) { return 0; }
inline std::int64_t draft_bound(const AcceptVerifyParams& p) { return p.verify.draft_tokens; }

// Calls f.template operator()<IO, K>() for the call's (IO dtype, K) with state element type ST;
// replay_commit reads no q/k/v, so its IO is f32 whatever the call.
template <class ST, class Params, class F>
cudaError_t with_record_config(const Params& p, F&& f) {
  if constexpr (std::is_same_v<Params, ReplayCommitParams>) {
    return with_head_dim<float, ST>(p.K, [&]<class IO, class S, int K>() {
      return f.template operator()<IO, K>();
    });
  } else {
    const TokenInputs& in = draft_of(p).in;
    return with_element<supported::kIoDTypes>(in.io_dtype, [&]<class IO>() -> cudaError_t {
      return with_head_dim<IO, ST>(in.K, [&]<class I, class S, int K>() {
        return f.template operator()<I, K>();
      });
    });
  }
}

// One block's row of the call after the prologue: the state slot, the steps it replays and its
// draft tokens. run is false when the block has nothing left to do.
struct RecordRow {
  bool run = false;
  std::int64_t slot = 0;
  int replay_steps = 0;
  std::int64_t first_token = 0;
  int length = 0;
};

// The prologue (row_checks.cuh) of the block (n, hv) owning state rows [row0, row0 + rows): the
// verdict on its row before any access it guards (the row's first block raises it), then the
// row's counts; a padding row's outputs are zeroed and it writes no record. Every thread of the
// block calls it.
template <class Params, class IO>
__device__ __forceinline__ RecordRow begin_record_row(const Params& p, const GuardState& guard,
                                                      const RecordPool& pool, std::int32_t n,
                                                      std::int32_t hv, bool first_block_of_row,
                                                      int row0, int rows) {
  RecordRow row;
  const std::uint64_t faults = row_verdict(p, guard, n);
  if (faults != 0) {
    if (threadIdx.x == 0 && first_block_of_row) raise(guard.error_word, faults);
    return row;
  }
  row.slot = pool.cache_indices[n];
  const bool active = vc::is_active(row.slot);
  if constexpr (kReplays<Params>) {
    if (active) row.replay_steps = replay_of(p).counts[n];
  }
  if constexpr (kDrafts<Params>) {
    const RecordVerifyParams& d = draft_of(p);
    row.first_token = d.cu_seqlens[n];  // the row's tokens: judged in range
    row.length = static_cast<int>(d.cu_seqlens[n + 1] - row.first_token);
    if (!active) {
      for (int t = 0; t < row.length; ++t)
        for (int i = threadIdx.x; i < rows; i += blockDim.x)
          if (row0 + i < pool.V) store_out<IO>(d.out, row.first_token + t, hv, row0 + i, 0.f);
      return row;
    }
  }
  row.run = active && (row.replay_steps > 0 || row.length > 0);
  return row;
}

// The shared memory of a part a kernel's entry point does not have.
struct NoShared {};

// A batch of recorded steps as the replay reads them: exp(g) and k per key channel, and the
// block's rows' u.
template <int K> struct alignas(16) ReplaySteps {
  float decay[kRecordStepBatch][K];
  float k[kRecordStepBatch][K];
  float u[kRecordStepBatch][kMaxRowsPerBlock];
};

// One step of the records at `head` (one row and value head) as a warp holds it between its loads
// and its store into a batch (load_replay_step, store_replay_step): split so that a kernel can
// issue these small loads before its state's, which would otherwise queue ahead of them.
template <int K> struct LoadedReplayStep {
  float g[K / 32], k[K / 32], u[kMaxRowsPerBlock / 32];
};

// Loads step t for the block's state rows [row0, row0 + rows), channels and rows lane + 32 i.
template <int K>
__device__ __forceinline__ LoadedReplayStep<K> load_replay_step(const float* head,
                                                                std::int64_t step_stride, int t,
                                                                int row0, int rows, int V,
                                                                int lane) {
  LoadedReplayStep<K> x;
  const float* record = head + t * step_stride;
#pragma unroll
  for (int i = 0; i < K / 32; ++i) {
    const int c = lane + 32 * i;
    x.g[i] = record[c];
    x.k[i] = record[K + c];
  }
#pragma unroll
  for (int i = 0; i < kMaxRowsPerBlock / 32; ++i) {
    const int r = lane + 32 * i;
    x.u[i] = r < rows && row0 + r < V ? record[2 * K + row0 + r] : 0.f;
  }
  return x;
}

// Stores a loaded step as entry `step` of the batch: exp(g), k and u.
template <int K>
__device__ __forceinline__ void store_replay_step(const LoadedReplayStep<K>& x, int step, int lane,
                                                  ReplaySteps<K>& rs) {
#pragma unroll
  for (int i = 0; i < K / 32; ++i) {
    const int c = lane + 32 * i;
    rs.decay[step][c] = expf(x.g[i]);
    rs.k[step][c] = x.k[i];
  }
#pragma unroll
  for (int i = 0; i < kMaxRowsPerBlock / 32; ++i) rs.u[step][lane + 32 * i] = x.u[i];
}

// Loads steps [t0, t0 + steps) of the records at `head` into rs, for the block's state rows
// [row0, row0 + rows): a warp per step. The caller synchronises the block before (the buffer's
// previous batch) and after.
template <int K>
__device__ __forceinline__ void load_replay_steps(const float* head, std::int64_t step_stride,
                                                  int t0, int steps, int row0, int rows, int V,
                                                  ReplaySteps<K>& rs) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int step = warp; step < steps; step += blockDim.x / 32)
    store_replay_step<K>(load_replay_step<K>(head, step_stride, t0 + step, row0, rows, V, lane),
                         step, lane, rs);
}

// One recorded step on one state element: s <- s exp(g) + u k, rounded as step_row's decay and
// rank-1 update are (one product, then one fused multiply-add), so that both kernels' replays and
// verify's steps give the same bits.
__device__ __forceinline__ float replay_element(float s, float decay, float u, float k) {
  return __fmaf_rn(u, k, __fmul_rn(s, decay));
}

}  // namespace kdaguard::gpu::detail
