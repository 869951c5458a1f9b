// Device building blocks of the prefill kernels: where a sequence lives and whether it may run,
// the gate and beta activations, and thin wrappers over the Hopper warp-level instructions the
// chunked kernel uses (ldmatrix, mma.sync m16n8k16 bf16 with f32 accumulation, cp.async).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "device_common.cuh"
#include "kdaguard/contracts/row_rules.h"
#include "kdaguard/params.h"
#include "launch.h"

namespace kdaguard::gpu::prefill {

using detail::cp_async_16;
using detail::cp_async_commit;
using detail::cp_async_wait_all;
using detail::cp_async_wait_pending;
using detail::GuardState;
using detail::smem_address;
namespace vc = kdaguard::value_checks;

inline constexpr float kLog2e = 1.4426950408889634f;

// ---- sequences ------------------------------------------------------------------------------

__device__ __forceinline__ std::int64_t seq_offset(const PrefillParams& p, std::int64_t i) {
  return p.cu_seqlens_dtype == DType::i64 ? static_cast<const std::int64_t*>(p.cu_seqlens)[i]
                                          : static_cast<const std::int32_t*>(p.cu_seqlens)[i];
}

// Sequence n's tokens and slot. A sequence whose offsets or slot break a value rule (seen here on
// the device, whether or not a guard ran before) is skipped: `runs` is false and the rule's bit
// is raised once per sequence. Every memory access of a running sequence stays inside the
// buffers: its tokens lie in [0, total_tokens) and its slot in [0, num_slots).
struct Sequence {
  std::int64_t begin = 0, length = 0, slot = 0;
  bool runs = false;
};

// The memory-safety value rules sequence n breaks on its own (its offsets and its slot): the
// shared row function of row_rules.h, the host validators' code.
__device__ __forceinline__ std::uint64_t sequence_faults(const PrefillParams& p, std::int32_t n) {
  const row_rules::PrefillRows<row_rules::DeviceIndex> rows{
      p.num_seqs, p.total_tokens, p.state.num_slots,
      {p.cu_seqlens, p.cu_seqlens_dtype == DType::i64, 0}, {p.state_indices, false, 0}};
  return row_rules::row_faults<row_rules::kPrefillMemoryRules>(rows, n);
}

__device__ __forceinline__ Sequence resolve_sequence(const PrefillParams& p, std::int32_t n,
                                                     const GuardState& guard, bool report) {
  Sequence s;
  if (const std::uint64_t faults = sequence_faults(p, n) & guard.enabled; faults != 0) {
    if (report) detail::raise(guard.error_word, faults);
    return s;
  }
  if (guard.row_flags != nullptr && guard.row_flags[n] != 0) return s;
  s.begin = seq_offset(p, n);
  s.length = seq_offset(p, n + 1) - s.begin;
  s.slot = p.state_indices[n];
  s.runs = true;
  return s;
}

__device__ __forceinline__ float fast_rcp(float x) {  // 1/x, ~1 ulp; 1/inf = 0
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// 2^x by the MUFU instruction alone: the value exp2f gives wherever the result is a normal float;
// results below 2^-126 flush to zero (exp2f, and __expf, spend four more instructions keeping them).
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// ---- gates and beta (kda-math.md "Gate and beta"), f32 ----------------------------------------

struct GateConstants {
  GateKind kind;
  float rate;         // exp(A_log[hv]) for raw gates
  float lower_bound;  // bounded gate
};

__device__ __forceinline__ GateConstants gate_constants(const TokenInputs& in, int hv) {
  GateConstants c;
  c.kind = in.gate_kind;
  c.rate = in.gate_kind == GateKind::activated ? 0.f : expf(in.A_log[hv]);
  c.lower_bound = in.lower_bound;
  return c;
}

// g from the raw value `a` of channel k (dt_bias already added by the caller for raw gates), in
// full f32 accuracy, for the f32 path (the prepare kernel forms its gates with fast intrinsics).
__device__ __forceinline__ float activate_gate_exact(const GateConstants& c, float x) {
  switch (c.kind) {
    case GateKind::softplus: return -c.rate * (x > 20.f ? x : log1pf(expf(x)));
    case GateKind::bounded: return c.lower_bound / (1.f + expf(-c.rate * x));
    default: return x;
  }
}

__device__ __forceinline__ float activate_beta(BetaKind kind, float b) {
  return kind == BetaKind::logits ? 1.f / (1.f + expf(-b)) : b;
}
__device__ __forceinline__ float activate_beta_fast(BetaKind kind, float b) {
  return kind == BetaKind::logits ? fast_rcp(1.f + __expf(-b)) : b;
}

// ---- 16-bit element conversions, the dtype known at compile time ----------------------------

template <class IO> struct IoBits;
template <> struct IoBits<__nv_bfloat16> {
  __device__ __forceinline__ static float to_f32(std::uint16_t bits) {
    return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
  }
  __device__ __forceinline__ static std::uint16_t round(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  // Two f32 values rounded to bf16, `lo` in the low half (the lower address).
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
};
template <> struct IoBits<__half> {
  __device__ __forceinline__ static float to_f32(std::uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
  }
  __device__ __forceinline__ static std::uint16_t round(float x) { return __half_as_ushort(__float2half_rn(x)); }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
};

// What rounding (lo, hi) to f16 dropped, itself rounded to f16, `lo` in the low half: the second
// term of a two-term f16 split (f16(x) + this = x to about 22 bits while |x| is normal in f16),
// from the first term as the caller packed it (IoBits<__half>::pack(lo, hi)).
__device__ __forceinline__ std::uint32_t f16_residual_pack(float lo, float hi,
                                                         std::uint32_t kept_bits) {
  const float2 kept = __half22float2(*reinterpret_cast<const __half2*>(&kept_bits));
  return IoBits<__half>::pack(lo - kept.x, hi - kept.y);
}

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// ---- warp-level matrix instructions ----------------------------------------------------------
// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 * group + quad.
//   A (16x16, row major): a0 = A[group][2q..], a1 = A[group+8][2q..], a2 = A[group][8+2q..],
//                         a3 = A[group+8][8+2q..]
//   B (16x8):             b0 = B[2q..][group], b1 = B[8+2q..][group]
//   C/D (16x8, f32):      d0,d1 = D[group][2q, 2q+1], d2,d3 = D[group+8][2q, 2q+1]

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x2(std::uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x2_trans(std::uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row))
               : "memory");
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const std::uint32_t (&a)[4],
                                        std::uint32_t b0, std::uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma.sync m16n8k16 with f32 accumulation on operands of type Op (__nv_bfloat16 or __half).
template <class Op>
__device__ __forceinline__ void mma16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                      std::uint32_t b1) {
  if constexpr (std::is_same_v<Op, __half>) {
    mma_f16(d, a, b0, b1);
  } else {
    mma_bf16(d, a, b0, b1);
  }
}

// Two f16 values (a b16 pair of a fragment) as two bf16 values, each rounded to nearest.
__device__ __forceinline__ std::uint32_t half2_to_bf16x2(std::uint32_t x) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x));
  return pack_bf16(f.x, f.y);
}

// The transpose of an 8x8 b16 matrix held in the fragment layout above (lane 4 g + q holds row g,
// columns 2q and 2q + 1), returned in the same layout.
__device__ __forceinline__ std::uint32_t movmatrix_trans(std::uint32_t x) {
  std::uint32_t r;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

}  // namespace kdaguard::gpu::prefill
