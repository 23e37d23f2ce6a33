// Eight bf16 values in a 16-byte word -> fp32 (exact), for device code that loads bf16 rows 16 bytes at a
// time (the finalize combine, the sm90 e4m3 tile's activation split). CUDA header for .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace fp4moe {

// Element 0 is the low half of x.x, element 7 the high half of x.w.
__device__ __forceinline__ void bf16x8_to_f32(const uint4& x, float (&v)[8]) {
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

}  // namespace fp4moe
