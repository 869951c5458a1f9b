// The configurations the kernels are built for, in one place: the head dims K and V, and the
// dtypes of q/k/v/out and of the state pools. dims.head_dim and the dtype columns of the rule
// table accept exactly these; the CUDA dispatchers instantiate exactly these and refuse anything
// else (never a fall-through to another instantiation); the test generators draw from them.
// Adding a head dim means adding it here and giving every kernel family its instantiation. No
// CUDA header is included.
#pragma once

#include <array>
#include <cstdint>

#include "kdaguard/contracts/tensor_view.h"

namespace kdaguard::supported {

inline constexpr std::array<std::int32_t, 2> kHeadDims{64, 128};
inline constexpr std::array<DType, 3> kIoDTypes{DType::f32, DType::f16, DType::bf16};
inline constexpr std::array<DType, 2> kStateDTypes{DType::f32, DType::bf16};

// Host code (the dispatchers run on the host).
template <class T, class U, std::size_t N>
constexpr bool contains(const std::array<T, N>& set, U x) {
  for (const T& s : set)
    if (s == x) return true;
  return false;
}

constexpr bool head_dim(std::int64_t d) { return contains(kHeadDims, d); }
constexpr bool io_dtype(DType t) { return contains(kIoDTypes, t); }
constexpr bool state_dtype(DType t) { return contains(kStateDTypes, t); }

// Position of x in set, or -1.
template <class T, class U, std::size_t N>
constexpr int index_in(const std::array<T, N>& set, U x) {
  for (std::size_t i = 0; i < N; ++i)
    if (set[i] == x) return static_cast<int>(i);
  return -1;
}

}  // namespace kdaguard::supported
