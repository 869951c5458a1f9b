// Conversions between the storage dtypes (bf16, f16, f32) and f32/f64, rounding to nearest with
// ties to even. Host code; the bit layouts are IEEE 754 binary16 and the top half of binary32.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kdaguard/contracts/tensor_view.h"

namespace kdaguard::numeric {

// ---- bf16: sign, 8 exponent bits, 7 mantissa bits (the top 16 bits of an f32) ----

inline float bf16_to_f32(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

inline std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)  // NaN: keep sign and top payload, force quiet
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  // Adding 0x7FFF plus the lowest kept bit rounds the dropped half to nearest, ties to even;
  // a carry into the exponent is the right result (up to infinity).
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// ---- f16: sign, 5 exponent bits (bias 15), 10 mantissa bits ----

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in f32
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F)  // infinity or NaN, payload kept
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline std::uint16_t f32_to_f16(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u)  // NaN: quiet, top payload bits kept
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  // 65520 is halfway between the largest f16 (65504, odd mantissa) and 2^16: ties go up to inf.
  if (magnitude >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (magnitude >= 0x38800000u) {  // >= 2^-14: a normal f16
    // Rebias the exponent (127 -> 15), then round the 13 dropped bits to nearest even.
    std::uint32_t rebased = magnitude - 0x38000000u;
    rebased += 0x0FFFu + ((rebased >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (rebased >> 13));
  }
  // 2^-25 is halfway between 0 and the smallest subnormal 2^-24: ties to even give 0.
  if (magnitude <= 0x33000000u) return sign;
  // Subnormal f16: n * 2^-24 with n = significand * 2^(e - 126), e the biased f32 exponent.
  const std::uint32_t exponent = magnitude >> 23;
  const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - exponent;  // 14 .. 24
  std::uint32_t n = significand >> shift;
  const std::uint32_t rest = significand & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (n & 1u))) ++n;  // may carry into the smallest normal
  return static_cast<std::uint16_t>(sign | n);
}

// ---- from f64 with a single rounding ----

// f64 -> f32 rounding to odd: truncate, then set the last bit when inexact. An f32 has at least
// two more significand bits than bf16 or f16 anywhere in their ranges, so rounding this result to
// nearest even once more gives the correctly rounded narrow value (no double-rounding error).
inline float f64_to_f32_round_to_odd(double d) {
  const float nearest = static_cast<float>(d);
  if (static_cast<double>(nearest) == d || d != d) return nearest;  // exact, or NaN
  std::uint32_t bits = std::bit_cast<std::uint32_t>(nearest);
  // Rounded away from zero (possibly to infinity): one step back toward zero truncates. Sign and
  // magnitude are separate fields, so that step is the magnitude's bits minus one.
  if (std::fabs(static_cast<double>(nearest)) > std::fabs(d)) bits -= 1u;
  return std::bit_cast<float>(bits | 1u);
}

inline float f64_to_f32(double d) { return static_cast<float>(d); }  // IEEE: nearest even
inline std::uint16_t f64_to_bf16(double d) { return f32_to_bf16(f64_to_f32_round_to_odd(d)); }
inline std::uint16_t f64_to_f16(double d) { return f32_to_f16(f64_to_f32_round_to_odd(d)); }

// ---- element access by dtype (floating dtypes only) ----

// The value of element `index` of a buffer of `dtype`, exactly.
inline double load(const void* base, DType dtype, std::int64_t index) {
  const auto* bytes = static_cast<const unsigned char*>(base);
  switch (dtype) {
    case DType::f32: {
      float f;
      std::memcpy(&f, bytes + index * 4, 4);
      return f;
    }
    case DType::bf16:
    case DType::f16: {
      std::uint16_t h;
      std::memcpy(&h, bytes + index * 2, 2);
      return dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    case DType::i32:
    case DType::i64: break;
  }
  return std::nan("");
}

// Stores `value` rounded once to `dtype`.
inline void store(void* base, DType dtype, std::int64_t index, double value) {
  auto* bytes = static_cast<unsigned char*>(base);
  switch (dtype) {
    case DType::f32: {
      const float f = f64_to_f32(value);
      std::memcpy(bytes + index * 4, &f, 4);
      return;
    }
    case DType::bf16:
    case DType::f16: {
      const std::uint16_t h = dtype == DType::bf16 ? f64_to_bf16(value) : f64_to_f16(value);
      std::memcpy(bytes + index * 2, &h, 2);
      return;
    }
    case DType::i32:
    case DType::i64: return;
  }
}

// `value` as it reads back after being stored in `dtype`.
inline double round_to(DType dtype, double value) {
  switch (dtype) {
    case DType::f32: return f64_to_f32(value);
    case DType::bf16: return bf16_to_f32(f64_to_bf16(value));
    case DType::f16: return f16_to_f32(f64_to_f16(value));
    case DType::i32:
    case DType::i64: break;
  }
  return value;
}

// An integer element (i32 or i64) of an index buffer.
inline std::int64_t load_index(const void* base, DType dtype, std::int64_t index) {
  const auto* bytes = static_cast<const unsigned char*>(base);
  if (dtype == DType::i64) {
    std::int64_t v;
    std::memcpy(&v, bytes + index * 8, 8);
    return v;
  }
  std::int32_t v;
  std::memcpy(&v, bytes + index * 4, 4);
  return v;
}

}  // namespace kdaguard::numeric
