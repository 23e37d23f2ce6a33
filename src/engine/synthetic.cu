// Synthetic layers generated in device memory with the host generator's formulas
// (include/fp4moe/synthetic_hash.h, synthetic_values.h), byte for byte, so a GLM-5-sized layer never
// exists on the host. Codes: thread i produces the 8 bytes of hash word i (byte j of a tensor is byte
// j % 8 of word j / 8); block scales: one thread per byte. grid.y walks the experts.
#include <cuda_runtime.h>

#include "engine/cuda_check.h"
#include "engine/engine_kernels.h"
#include "fp4moe/synthetic_values.h"

namespace fp4moe::engine {

namespace {

__global__ void synthetic_codes_kernel(uint64_t seed, int64_t expert0, uint32_t tensor, uint8_t* dst,
                                       int64_t dst_stride, int64_t bytes, int vec8) {
  const int64_t word = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (word * 8 >= bytes) return;
  const int64_t expert = expert0 + blockIdx.y;
  uint8_t* d = dst + static_cast<int64_t>(blockIdx.y) * dst_stride;
  const uint64_t bits = synthetic_bits(seed, expert, tensor, static_cast<uint64_t>(word));
  if (vec8 && word * 8 + 8 <= bytes) {
    reinterpret_cast<uint64_t*>(d)[word] = bits;  // little-endian: byte j % 8 of the word
  } else {
    for (int b = 0; b < 8 && word * 8 + b < bytes; ++b) d[word * 8 + b] = static_cast<uint8_t>(bits >> (8 * b));
  }
}

__global__ void synthetic_scales_kernel(uint64_t seed, int64_t expert0, uint32_t tensor, uint8_t* dst,
                                        int64_t dst_stride, int64_t bytes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= bytes) return;
  const int64_t expert = expert0 + blockIdx.y;
  dst[static_cast<int64_t>(blockIdx.y) * dst_stride + i] =
      synthetic_scale_byte(seed, expert, tensor, static_cast<uint64_t>(i));
}

__global__ void synthetic_router_kernel(uint64_t seed, int64_t count, float scale, float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = synthetic_router_value(seed, static_cast<uint64_t>(i), scale);
}

__global__ void synthetic_bias_kernel(uint64_t seed, int64_t experts, float* dst) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < experts) dst[e] = synthetic_bias_value(seed, e);
}

}  // namespace

Status launch_synthetic_bytes(uint64_t seed, int64_t expert0, int64_t count, uint32_t tensor, bool scales,
                              uint8_t* dst, int64_t dst_stride, int64_t bytes, Stream stream) {
  if (count <= 0 || bytes <= 0) return Status::ok();
  if (count > 65535)
    return Status(StatusCode::kInvalidArgument, fmt::format("synthetic weights: {} experts exceed 65535", count));
  constexpr int kThreads = 256;
  if (scales) {
    const dim3 grid(static_cast<unsigned>((bytes + kThreads - 1) / kThreads), static_cast<unsigned>(count));
    synthetic_scales_kernel<<<grid, kThreads, 0, stream>>>(seed, expert0, tensor, dst, dst_stride, bytes);
  } else {
    const int64_t words = (bytes + 7) / 8;
    const bool vec8 = reinterpret_cast<uintptr_t>(dst) % 8 == 0 && dst_stride % 8 == 0;
    const dim3 grid(static_cast<unsigned>((words + kThreads - 1) / kThreads), static_cast<unsigned>(count));
    synthetic_codes_kernel<<<grid, kThreads, 0, stream>>>(seed, expert0, tensor, dst, dst_stride, bytes, vec8 ? 1 : 0);
  }
  return cuda_launch_status(scales ? "synthetic_scales_kernel launch" : "synthetic_codes_kernel launch", __FILE__,
                            __LINE__);
}

Status launch_synthetic_router(uint64_t seed, int64_t experts, int64_t hidden, float scale, float* dst, Stream stream) {
  const int64_t count = experts * hidden;
  if (count <= 0) return Status::ok();
  synthetic_router_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(seed, count, scale, dst);
  return cuda_launch_status("synthetic_router_kernel launch", __FILE__, __LINE__);
}

Status launch_synthetic_bias(uint64_t seed, int64_t experts, float* dst, Stream stream) {
  if (experts <= 0) return Status::ok();
  synthetic_bias_kernel<<<static_cast<unsigned>((experts + 255) / 256), 256, 0, stream>>>(seed, experts, dst);
  return cuda_launch_status("synthetic_bias_kernel launch", __FILE__, __LINE__);
}

}  // namespace fp4moe::engine
