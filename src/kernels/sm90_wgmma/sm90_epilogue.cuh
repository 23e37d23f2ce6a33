// Epilogue of the sm90 family: fp32 accumulators -> bf16 output rows, with the tensor scale applied in
// fp32 and, for FC1, SwiGLU fused (reference.h rounding points R3 and R4).
//
// A consumer thread holds, per 64-row tile u and token group j (8 tokens), the accumulators of rows
// R0 = 16w + g and R1 = R0 + 8 for tokens 8j + 2q and 8j + 2q + 1 (sm90_consumer.cuh).
//   FC2: R0 and R1 are weight rows (output columns) 64t + R0 and 64t + R1:
//        out[token][col] = bf16(acc * tensor_scale[e] * 2^19).
//   FC1: packed rows R0 / R1 are the gate / up rows of output column j = 32t + 8w + g
//        (sm90_layout.h), so out[token][j] = bf16(silu(acc_R0 * sg) * (acc_R1 * su)) with
//        sg, su = tensor_scales[e][0|1] * 2^19, silu(v) = v / (1 + exp(-v)).
// Stores are 2-byte, eight lanes (g = 0..7) writing 16 contiguous bytes of one token row; tokens past
// the expert's rows and columns past N are skipped. The top-k weight is left to the engine's finalize.
#pragma once
#include <cstdint>

#include "kernels/sm90_wgmma/sm90_layout.h"

namespace fp4moe {
namespace sm90 {

__device__ __forceinline__ void store_bf16(uint16_t* p, float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  *p = *reinterpret_cast<const uint16_t*>(&b);
}

template <int BN, bool kFc1>
__device__ __forceinline__ void store_tile(const float (&acc)[BN / 2], uint16_t* __restrict__ out, int64_t n,
                                           int tile, int row_begin, int row_end, float scale0, float scale1,
                                           int tid) {
  const int w = tid >> 5, g = (tid & 31) >> 2, q = tid & 3;
  if (kFc1) {
    const int64_t col = 32 * static_cast<int64_t>(tile) + 8 * w + g;
    if (col >= n) return;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_begin + 8 * j + 2 * q + h;
        if (r < row_end) {
          const float gate = acc[4 * j + h] * scale0;
          const float up = acc[4 * j + 2 + h] * scale1;
          store_bf16(out + static_cast<int64_t>(r) * n + col, gate / (1.0f + __expf(-gate)) * up);
        }
      }
    }
  } else {
    const int64_t col0 = 64 * static_cast<int64_t>(tile) + 16 * w + g;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_begin + 8 * j + 2 * q + h;
        if (r < row_end) {
          uint16_t* row = out + static_cast<int64_t>(r) * n;
          if (col0 < n) store_bf16(row + col0, acc[4 * j + h] * scale0);
          if (col0 + 8 < n) store_bf16(row + col0 + 8, acc[4 * j + 2 + h] * scale0);
        }
      }
    }
  }
}

}  // namespace sm90
}  // namespace fp4moe
