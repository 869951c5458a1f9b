// The warp-row layout of the decode kernel: a state row of K elements spread over the lanes of a
// warp, one 16-byte vector per lane, so one warp instruction moves up to 512 contiguous bytes of
// the pool; and the reduce-scatter that sums a lane group's per-row values with few shuffles.
#pragma once

namespace kdaguard::gpu::detail {

template <class ST, int K> struct WarpTile {
  static constexpr int kPerVec = 16 / static_cast<int>(sizeof(ST));  // channels per lane
  static constexpr int kLanes = K / kPerVec;                          // lanes per row
  static constexpr int kRowsPerPass = 32 / kLanes;
  static constexpr int kVecs = 4;  // rows per lane per chunk: 64 bytes of state in flight
  static constexpr int kChunkRows = kRowsPerPass * kVecs;
  static_assert(kLanes <= 32 && 32 % kLanes == 0);
};

// Sums kValues values over an aligned group of kLanes lanes with fewer shuffles than one group
// sum per value: at each of the first log2(kValues) levels a lane keeps the half of its values
// that its partner (lane ^ offset) drops, and adds the partner's copy of that half; the last
// levels add one value. Returns the group's total of the one value this lane ends up owning
// (ScatterOwner says which).
template <int kOffset, int kCount, int kValues>
__device__ __forceinline__ float scatter_sum(float (&a)[kValues], int lane) {
  if constexpr (kOffset == 0) {
    return a[0];
  } else if constexpr (kCount > 1) {
    constexpr int kHalf = kCount / 2;
    const bool upper = (lane & kOffset) != 0;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      const float send = upper ? a[i] : a[i + kHalf];
      const float keep = upper ? a[i + kHalf] : a[i];
      a[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
    }
    return scatter_sum<kOffset / 2, kHalf>(a, lane);
  } else {
    a[0] += __shfl_xor_sync(0xffffffffu, a[0], kOffset);
    return scatter_sum<kOffset / 2, 1>(a, lane);
  }
}

// Which value of scatter_sum<kLanes / 2, kValues> a lane owns, and the first lane of the group
// (relative to the group) that owns value i.
template <int kLanes, int kValues> struct ScatterOwner {
  static_assert(kValues <= kLanes && (kValues & (kValues - 1)) == 0);
  __device__ __forceinline__ static int value_of(int group_lane) {
    int value = 0;
#pragma unroll
    for (int offset = kLanes / 2, half = kValues / 2; half > 0; offset /= 2, half /= 2)
      if (group_lane & offset) value += half;
    return value;
  }
  __host__ __device__ static constexpr int first_lane(int value) {
    int lane = 0;
    for (int offset = kLanes / 2, half = kValues / 2; half > 0; offset /= 2, half /= 2)
      if (value & half) lane += offset;
    return lane;
  }
};

}  // namespace kdaguard::gpu::detail
