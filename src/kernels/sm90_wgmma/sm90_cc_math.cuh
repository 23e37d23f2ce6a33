// The f16x2 arithmetic of the resident design (sm90_cc.cu, the library's tactic, and the step 66 probe,
// tests/sm90/resident_cc.cu): the PTX wrappers, the prescale of a row into [2^13, 2^14), the decode of a
// word of 8 codes (sm90_cc_layout.h) fused with its multiply-adds, and one thread's share of an FC1 or FC2
// chunk. Device code.
#pragma once
#include <cstdint>

#include "fp4moe/dtype.h"
#include "kernels/sm90_wgmma/sm90_cc_layout.h"
#include "kernels/sm90_wgmma/sm90_e4m3.h"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"

namespace fp4moe {
namespace sm90 {

__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t hadd2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t f32x2_to_f16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ uint32_t ld_shared_u16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u8(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 ld_shared_u2(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ float bf16_lo(uint32_t w) { return bf16_bits_to_f32(static_cast<uint16_t>(w)); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return bf16_bits_to_f32(static_cast<uint16_t>(w >> 16)); }

// The power-of-two exponent that puts a largest magnitude m into [2^13, 2^14) (0 for m = 0 or NaN),
// clamped so that the scale and its inverse times 2^14 stay normal fp32.
__device__ __forceinline__ int cc_prescale(float m) {
  if (!(m > 0.f)) return 0;
  const int e = static_cast<int>((__float_as_uint(m) >> 23) & 0xFF) - 127;
  const int s = 13 - e;
  return s < -100 ? -100 : (s > 100 ? 100 : s);
}

// m and the largest magnitude of 16 bf16 values (two 16-byte words of a row).
__device__ __forceinline__ float cc_max_abs_bf16x16(uint4 v0, uint4 v1, float m) {
  const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fmaxf(fabsf(bf16_lo(w[i])), fabsf(bf16_hi(w[i]))));
  return m;
}
// The largest of every thread's m in the CTA (all threads call it): the warp's shuffles, then the warps'
// values through red[0 .. warps) (shared floats, free before the call) after a barrier.
__device__ __forceinline__ float cc_cta_max(float m, float* red, int warps) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = 0.f;
  for (int i = 0; i < warps; ++i) m = fmaxf(m, red[i]);
  return m;
}

// One k16 block of the token (16 bf16 values in two 16-byte words) times sx as f16: its k 0..7 to lo, its
// k 8..15 to hi (16 bytes each, shared memory).
__device__ __forceinline__ void cc_token_block_to_f16(uint4 v0, uint4 v1, float sx, uint8_t* lo, uint8_t* hi) {
  const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  uint32_t h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = f32x2_to_f16x2(bf16_lo(w[i]) * sx, bf16_hi(w[i]) * sx);
  *reinterpret_cast<uint4*>(lo) = make_uint4(h[0], h[1], h[2], h[3]);
  *reinterpret_cast<uint4*>(hi) = make_uint4(h[4], h[5], h[6], h[7]);
}

// acc += the 8 codes of word w times x0..x3 (f16x2, k0 k1 .. k6 k7).
__device__ __forceinline__ uint32_t cc_decode_fma(uint32_t w, uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3,
                                                  uint32_t acc) {
  uint32_t h[4];
  cc_decode_word(w, h);
  acc = hfma2(h[0], x0, acc);
  acc = hfma2(h[1], x1, acc);
  acc = hfma2(h[2], x2, acc);
  return hfma2(h[3], x3, acc);
}
// Two rows' block sums (f16x2 accumulators a, b: each half a partial sum) -> (sum a, sum b) as f16x2.
__device__ __forceinline__ uint32_t cc_pair_sum(uint32_t a, uint32_t b) {
  return hadd2(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632));
}

// One row's block sum (an f16x2 accumulator, each half a partial sum) times its e4m3 scale (one byte), in fp32.
__device__ __forceinline__ float cc_row_sum(uint32_t a, uint32_t scale_byte) {
  return f16x2_to_f32(hmul2(hadd2(a, __byte_perm(a, a, 0x1032)), e4m3x2_to_f16x2(scale_byte))).x;
}

// The f16 token's k16 block kb (xh: its k 0..7 at 16 kb, its k 8..15 at half_bytes + 16 kb).
struct CcTokenBlock {
  uint4 lo, hi;
};
__device__ __forceinline__ CcTokenBlock cc_token_block(uint32_t xh, uint32_t half_bytes, uint32_t kb) {
  return {ld_shared_u4(xh + 16 * kb), ld_shared_u4(xh + half_bytes + 16 * kb)};
}

// One row's k16 block (two code words at shared address `codes`, its e4m3 scale byte at `scale`) times the
// token's block x, in fp32 (still scaled by the token's 2^e and the codes' 2^-14).
__device__ __forceinline__ float cc_fc1_row(uint32_t codes, uint32_t scale, const CcTokenBlock& x) {
  const uint2 w = ld_shared_u2(codes);
  uint32_t a = cc_decode_fma(w.x, x.lo.x, x.lo.y, x.lo.z, x.lo.w, 0u);
  a = cc_decode_fma(w.y, x.hi.x, x.hi.y, x.hi.z, x.hi.w, a);
  return cc_row_sum(a, ld_shared_u8(scale));
}

// FC1 unit `unit` of the chunk at shared address `base` (a warp's SwiGLU column, a lane's k16 block kb):
// its gate and up rows' block sums with the f16 token (xh: block kb's k 0..7 at 16 kb, its k 8..15 at
// half_bytes + 16 kb), times the blocks' e4m3 scales, in fp32 (gate, up; still scaled by the token's 2^e
// and the codes' 2^-14).
__device__ __forceinline__ float2 cc_fc1_unit(uint32_t base, uint32_t unit, uint32_t xh, uint32_t half_bytes,
                                              uint32_t kb) {
  const uint4 w = ld_shared_u4(base + 16 * unit);
  const uint32_t sc = ld_shared_u16(base + kCcCodeBytes + 2 * unit);
  const uint4 x0 = ld_shared_u4(xh + 16 * kb), x1 = ld_shared_u4(xh + half_bytes + 16 * kb);
  uint32_t ag = cc_decode_fma(w.x, x0.x, x0.y, x0.z, x0.w, 0u);
  ag = cc_decode_fma(w.y, x1.x, x1.y, x1.z, x1.w, ag);
  uint32_t au = cc_decode_fma(w.z, x0.x, x0.y, x0.z, x0.w, 0u);
  au = cc_decode_fma(w.w, x1.x, x1.y, x1.z, x1.w, au);
  return f16x2_to_f32(hmul2(cc_pair_sum(ag, au), e4m3x2_to_f16x2(sc)));
}

// A SwiGLU column from its gate and up sums (cc_fc1_unit's, still scaled by the token's 2^ex and the codes'
// 2^-14) and the expert's tensor scales, as the reference computes it (reference.h R3), rounded to bf16 as
// FC1's output is. The fast exp and division: the value is rounded to bf16 next.
__device__ __forceinline__ uint16_t cc_swiglu_bf16(float gsum, float usum, int ex, float sg, float su) {
  const float unscale = e4m3_pow2(14 - ex);
  const float g = gsum * unscale * sg, u = usum * unscale * su;
  return f32_to_bf16_bits(__fdividef(g, 1.0f + __expf(-g)) * u);
}

// The 16 SwiGLU values v[0..15] times 2^e, which puts their largest magnitude into [2^13, 2^14), as eight
// f16x2 words (v0 v1, .., v14 v15); returns e.
__device__ __forceinline__ int cc_row_to_f16x2(const float* v, uint32_t hv[8]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < kCcCols; ++i) m = fmaxf(m, fabsf(v[i]));
  const int e = cc_prescale(m);
  const float s = e4m3_pow2(e);
#pragma unroll
  for (int i = 0; i < 8; ++i) hv[i] = f32x2_to_f16x2(v[2 * i] * s, v[2 * i + 1] * s);
  return e;
}

// FC2 rows 4v .. 4v + 3 of the chunk at shared address `base` (kSm90Cc: 8 planes of code words, then the
// rows' scale bytes) over the part's 16 SwiGLU values hv (f16x2: v0 v1, .., v14 v15): each row's 16
// products summed in f16x2, times the row's e4m3 scale, in fp32 (still scaled by the values' 2^e and the
// codes' 2^-14).
__device__ __forceinline__ float4 cc_fc2_quad(uint32_t base, uint32_t v, const uint32_t hv[8]) {
  uint32_t a[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t d[4];
    cc_decode_word(ld_shared_u32(base + 1024 * j + 4 * v), d);
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = hfma2(d[i], hv[j], a[i]);
  }
  const uint32_t sc = ld_shared_u32(base + kCcCodeBytes + 4 * v);
  const float2 s01 = f16x2_to_f32(hmul2(cc_pair_sum(a[0], a[1]), e4m3x2_to_f16x2(sc & 0xFFFFu)));
  const float2 s23 = f16x2_to_f32(hmul2(cc_pair_sum(a[2], a[3]), e4m3x2_to_f16x2(sc >> 16)));
  return make_float4(s01.x, s01.y, s23.x, s23.y);
}

// The spread form's FC2 share (sm90_cc_layout.h): rows 4v .. 4v + 3 of one column pair's plane (`codes`; the
// chunk's row scales at `scales`) times the pair's two SwiGLU values hp (f16x2), times the rows' scales, in
// fp32 (still scaled by the values' 2^e and the codes' 2^-14).
__device__ __forceinline__ float4 cc_fc2_pair_quad(uint32_t codes, uint32_t scales, uint32_t v, uint32_t hp) {
  uint32_t d[4];
  cc_decode_word(ld_shared_u32(codes + 4 * v), d);
  const uint32_t sc = ld_shared_u32(scales + 4 * v);
  const float2 s01 = f16x2_to_f32(hmul2(cc_pair_sum(hmul2(d[0], hp), hmul2(d[1], hp)), e4m3x2_to_f16x2(sc & 0xFFFFu)));
  const float2 s23 = f16x2_to_f32(hmul2(cc_pair_sum(hmul2(d[2], hp), hmul2(d[3], hp)), e4m3x2_to_f16x2(sc >> 16)));
  return make_float4(s01.x, s01.y, s23.x, s23.y);
}

}  // namespace sm90
}  // namespace fp4moe
