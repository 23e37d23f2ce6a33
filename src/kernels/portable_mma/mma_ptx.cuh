// The few PTX instructions the portable family uses (sm_80+): cp.async with zero fill, shared loads,
// mma.sync m16n8k16 bf16 -> fp32, and the NVFP4 -> bf16 conversions. Device-only helpers.
//
// NVFP4 -> bf16 (exact, no table):
//   A nibble s.e1.e0.m placed so that e1 e0 land on the two low bits of the bf16 exponent and m on the
//   top mantissa bit encodes code_value * 2^-126 (code 0.5 becomes the subnormal 2^-127). One bf16x2
//   multiply by (e4m3_scale * 2^118) then gives code * scale * 2^-8 exactly: the products have at most
//   6 significant bits and lie in [2^-18, 2^4], well inside bf16's normal range. The kernel's epilogue
//   multiplies the fp32 accumulator by tensor_scale * 2^8, which undoes the 2^-8 exactly (powers of two).
//   The scale cannot carry the whole 2^126 (448 * 2^126 overflows bf16), hence the split 2^118 / 2^8.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace fp4moe::portable {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async of 16/8/4 bytes; when `valid` is false nothing is read and the destination is zero-filled.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void lds_64(uint32_t addr, uint32_t& a, uint32_t& b) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(a), "=r"(b) : "r"(addr));
}
__device__ __forceinline__ void lds_128(uint32_t addr, uint32_t (&v)[4]) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr));
}

// D = A * B + D, m16n8k16, A row-major bf16 (4 regs), B column-major bf16 (2 regs), fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// bf16x2 product, exact here (see the header comment). fma with -0.0 is the sm_80 form of a multiply
// and keeps subnormal inputs (bf16 arithmetic has no flush-to-zero mode).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

// Two E2M1 codes -> bf16x2 holding code * 2^-126. `q` is a word of 8 packed codes shifted left by
// SHIFT: the code in bits 12..15 goes to the low half, the code in bits 28..31 to the high half.
// For a canonical word (code i in bits 4i..4i+3), SHIFT = 12, 8, 4, 0 yields the code pairs
// (0, 4), (1, 5), (2, 6), (3, 7).
template <int SHIFT>
__device__ __forceinline__ uint32_t e2m1x2_to_bf16x2_raw(uint32_t word) {
  const uint32_t q = word << SHIFT;
  return (q & 0x80008000u) | ((q >> 6) & 0x01C001C0u);
}

// E4M3 (e4m3fn) byte -> bf16x2 holding scale * 2^118 in both halves.
__device__ __forceinline__ uint32_t e4m3_to_bf16x2_scaled(uint32_t byte) {
  const uint32_t mag = byte & 0x7Fu;
  float f;
  if (mag >= 8u) {
    f = __uint_as_float((mag << 20) + (238u << 23));  // 2^(E-7) (1 + M/8) * 2^118, exponent field E + 238
  } else {
    f = static_cast<float>(mag) * __uint_as_float(236u << 23);  // subnormal: M * 2^-9 * 2^118 = M * 2^109
  }
  const uint32_t h = (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(f)))) | ((byte & 0x80u) << 8);
  return h | (h << 16);
}

// Two bf16 pairs (x0, x1), (x4, x5) -> the pairs (x0, x4) and (x1, x5): the B (and bf16 A) fragments
// are built in the same code-pair order as the NVFP4 A fragments above.
__device__ __forceinline__ uint32_t pair_lo(uint32_t w01, uint32_t w45) { return __byte_perm(w01, w45, 0x5410); }
__device__ __forceinline__ uint32_t pair_hi(uint32_t w01, uint32_t w45) { return __byte_perm(w01, w45, 0x7632); }

__device__ __forceinline__ uint16_t f32_to_bf16_rn(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

}  // namespace fp4moe::portable
