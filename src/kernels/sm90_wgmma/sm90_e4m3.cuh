// Device side of the e4m3 path (formats: sm90_e4m3.h): one token's activations split into an e4m3 token
// tile, and one packed k64 chunk of a 64-row tile multiplied with it on two m64n8k32 e4m3 wgmmas. Checked
// against the CPU reference by sm90_e4m3_test; the e4m3 tile's token producer (sm90_producer.cuh,
// e4m3_token_load / e4m3_token_store) and consumers (sm90_consumer.cuh, consume_item_e4m3) are built from them.
#pragma once
#include <cstdint>

#include "common/bf16x8.cuh"
#include "kernels/sm90_wgmma/sm90_e4m3.h"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"

namespace fp4moe {
namespace sm90 {

// (a, b) -> e4m3 bytes, a in the high byte, b in the low one; round to nearest even, saturating.
__device__ __forceinline__ uint32_t cvt_e4m3x2(float a, float b) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(a), "f"(b));
  return r;
}
// e4m3 byte -> fp32 (exact: every e4m3 value is an f16 value).
__device__ __forceinline__ float e4m3_to_f32(uint32_t byte) { return f16x2_to_f32(e4m3x2_to_f16x2(byte & 0xFFu)).x; }

// Four activations v[0..3] (already times 2^-E) -> their hi and lo e4m3 bytes, element i in byte i.
__device__ __forceinline__ void e4m3_split_word(const float* v, uint32_t& hi, uint32_t& lo) {
  hi = lo = 0;
#pragma unroll
  for (int b = 0; b < 4; b += 2) {
    const uint32_t h = cvt_e4m3x2(v[b + 1], v[b]);  // byte 0: element b, byte 1: element b + 1
    hi |= h << (8 * b);
    lo |= cvt_e4m3x2(v[b + 1] - e4m3_to_f32(h >> 8), v[b] - e4m3_to_f32(h)) << (8 * b);
  }
}

// One 16-byte unit of an e4m3 token tile: half p (0 hi, 1 lo) of a k16 block whose 16 bf16 activations
// are x[0..1] (8 each, element 0 in the low half of x[0].x). Returns the unit and the block exponent E.
__device__ __forceinline__ uint4 e4m3_split_unit(const uint4 (&x)[2], int p, int& e) {
  float v[2][8];
  bf16x8_to_f32(x[0], v[0]);
  bf16x8_to_f32(x[1], v[1]);
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(v[i / 8][i % 8]));
  e = e4m3_block_exponent(m);
  const float inv = e4m3_pow2(-e);
  uint32_t out[2][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float s[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) s[t] = v[i / 2][4 * (i % 2) + t] * inv;
    e4m3_split_word(s, out[0][i], out[1][i]);
  }
  return make_uint4(out[p][0], out[p][1], out[p][2], out[p][3]);
}

// Half h = lane % 2 of k16 block lane / 2 (its 8 bf16 activations in x), split by a pair of lanes (the
// sm90 e4m3 tile's token producer): the block's largest magnitude from both lanes (every lane of the
// warp calls it), then this half's 8 hi and 8 lo bytes (element i in byte i) and the block exponent E.
// Same result as e4m3_split_unit's bytes 8h..8h+7.
__device__ __forceinline__ void e4m3_split_half(const uint4& x, uint2& hi, uint2& lo, int& e) {
  float v[8];
  bf16x8_to_f32(x, v);
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  e = e4m3_block_exponent(m);
  const float inv = e4m3_pow2(-e);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] *= inv;
  e4m3_split_word(v, hi.x, lo.x);
  e4m3_split_word(v + 4, hi.y, lo.y);
}

// The B descriptor of k64 chunk kb of a token tile whose first sub-tile starts at desc0: 128 bytes of k
// per 1 KB sub-tile row, so chunk kb is sub-tile kb / 2 at byte 64 (kb % 2) of its rows.
__device__ __forceinline__ uint64_t e4m3_chunk_desc(uint64_t desc0, int kb) {
  return desc0 + static_cast<uint64_t>(((kb >> 1) * 1024 + (kb & 1) * 64) >> 4);
}

// m64n8k32 e4m3 x e4m3 -> f32, A in registers, B from shared memory. scale_d = 0 starts a fresh
// accumulator; it must come from a register (a constant 0 lets ptxas give D the A fragment's registers,
// which serialises the wgmmas: docs/perf.md, sm90 step 48).
__device__ __forceinline__ void wgmma_e4m3_m64n8k32(float (&d)[4], const uint32_t* a, uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

// A fragments of one packed k64 chunk (kSm90E4m3 block at `block`) for thread tid of the warpgroup:
// a[0..3] the first k32 wgmma's, a[4..7] the second's.
__device__ __forceinline__ void e4m3_decode_chunk(const uint8_t* block, int tid, uint32_t (&a)[8]) {
  const uint4 c = *reinterpret_cast<const uint4*>(block + 16 * tid);
  decode_e4m3_word(c.x, a[0], a[1]);
  decode_e4m3_word(c.y, a[2], a[3]);
  decode_e4m3_word(c.z, a[4], a[5]);
  decode_e4m3_word(c.w, a[6], a[7]);
}
// The chunk's two wgmmas into d (fresh when zero == 0); desc: the chunk's first k32 in the token tile
// (sub-tile kb/2, + 64 (kb % 2) bytes).
__device__ __forceinline__ void e4m3_issue_chunk(const uint32_t (&a)[8], uint64_t desc, int zero, float (&d)[4]) {
  wgmma_e4m3_m64n8k32(d, a, desc, zero);
  wgmma_e4m3_m64n8k32(d, a + 4, desc + 2, 1);
}
// The scale half-word that thread tid's quad (rows R0 and R1 of warp tid / 32's 16) needs for block
// q = tid % 4 of the packed chunk at `block`: row R0's E5M3u scale in the low byte, R1's in the high
// (e4m3_scale_site of both rows).
__device__ __forceinline__ uint32_t e4m3_quad_scales(const uint8_t* block, int tid) {
  const int quad = (tid >> 5) * 8 + ((tid & 31) >> 2);
  return *reinterpret_cast<const uint16_t*>(block + kPackCodeBytes + 8 * quad + 2 * (tid & 3));
}
// After the chunk's wgmmas retired: rows R0 and R1 of block q (q = tid % 4) scaled into f0 and f1.
// u: e4m3_quad_scales of the chunk; e: block q's activation exponent.
__device__ __forceinline__ void e4m3_accumulate(const float (&d)[4], uint32_t u, int e, float& f0, float& f1) {
  f0 = fmaf(__uint_as_float(e4m3_block_factor_bits(u & 0xFFu, e)), d[0] + d[1], f0);
  f1 = fmaf(__uint_as_float(e4m3_block_factor_bits(u >> 8, e)), d[2] + d[3], f1);
}
// The quad's sum of its four blocks (every lane of the quad gets it).
__device__ __forceinline__ float quad_sum(float f) {
  f += __shfl_xor_sync(0xffffffffu, f, 1);
  return f + __shfl_xor_sync(0xffffffffu, f, 2);
}

}  // namespace sm90
}  // namespace fp4moe
