// Eight (four) bf16 values in a 16-byte (8-byte) word -> fp32 (exact), for device code that loads bf16 rows
// 16 (8) bytes at a time (the finalize combine, the sm90 e4m3 tile's activation split; the router-logits
// kernels). CUDA header for .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace fp4moe {

// The two bf16 values of one 32-bit word: lo the low half (the lower address).
__device__ __forceinline__ void bf16x2_to_f32(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xFFFF0000u);
}

// Element 0 is the low half of x.x, element 7 the high half of x.w.
__device__ __forceinline__ void bf16x8_to_f32(const uint4& x, float (&v)[8]) {
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) bf16x2_to_f32(w[i], v[2 * i], v[2 * i + 1]);
}

// Element 0 is the low half of x.x, element 3 the high half of x.y.
__device__ __forceinline__ void bf16x4_to_f32(const uint2& x, float (&v)[4]) {
  bf16x2_to_f32(x.x, v[0], v[1]);
  bf16x2_to_f32(x.y, v[2], v[3]);
}

}  // namespace fp4moe
