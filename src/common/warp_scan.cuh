// Warp-wide scans for the device code's small bookkeeping kernels (permutation offsets, the sm90 work
// table). CUDA header for .cu files.
#pragma once
#include <cuda_runtime.h>

namespace fp4moe {

// Inclusive prefix sum of v over the 32 lanes of a full, converged warp (lane = threadIdx.x & 31):
// lane i gets v(0) + ... + v(i).
__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

}  // namespace fp4moe
