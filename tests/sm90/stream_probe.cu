// The read-streaming ceiling for the weight-streaming GEMMs: 16-byte loads over a large buffer, folded
// into one word per thread so nothing is optimised away. One launch over `bytes` bytes.
// launch_stream_read_unrolled: the same with four independent loads per thread and iteration, so that a
// short read (tens of MB, a decode step's weights) keeps enough bytes in flight from its first microsecond;
// launch_empty: a launch of the same grid that reads nothing (a launch's fixed cost).
// launch_bulk_stream: the sm90 weight producer's access pattern without the math: one CTA per SM streams
// its own region of `stages` x 36,864 bytes (a four-tile m-tile's k256 stages) through a ring of five
// stages with bulk copies, `pieces` copies per stage: 4 is the kSm90Interleaved layout's pattern (each of
// the m-tile's four 64-row tiles is contiguous over K, so a stage takes 9,216 bytes from each of four
// streams 1/4 of the region apart), 1 the same bytes in one contiguous copy, 16 one copy per 2,304-byte
// block. One consumer warp waits for each stage and releases it.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sm90_wgmma/sm90_ptx.cuh"

namespace fp4moe {
namespace sm90test {

namespace {
// kUnroll independent 16-byte loads per thread and iteration, then the remainder one at a time.
template <int kUnroll>
__global__ void stream_read_kernel(const uint4* __restrict__ src, size_t n, uint32_t* __restrict__ sink) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldg(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // practically never true; keeps the loads alive
}
__global__ void empty_kernel(uint32_t* sink) {
  if (threadIdx.x == 1024) *sink = 0;  // never: blocks have fewer threads
}
constexpr int kBulkStageBytes = 36864;
constexpr int kBulkStages = 5;
__global__ void __launch_bounds__(64) bulk_stream_kernel(const uint8_t* __restrict__ src, int stages, int pieces,
                                                         uint32_t* __restrict__ sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace fp4moe::sm90;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBulkStages * kBulkStageBytes);
  uint64_t* empty = full + kBulkStages;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kBulkStages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], 32);
    }
    fence_barrier_init();
  }
  __syncthreads();
  const int64_t region = int64_t(stages) * kBulkStageBytes;
  const uint8_t* base = src + blockIdx.x * region;
  const int piece = kBulkStageBytes / pieces;
  const int64_t sub = region / pieces;  // piece p of every stage comes from sub-region p
  if (threadIdx.x == 0) {
    const uint64_t policy = policy_evict_first();
    for (int s = 0; s < stages; ++s) {
      const int st = s % kBulkStages;
      mbar_wait(&empty[st], ((s / kBulkStages) & 1u) ^ 1u);
      mbar_expect_tx(&full[st], kBulkStageBytes);
      for (int p = 0; p < pieces; ++p)
        bulk_copy_g2s(smem + st * kBulkStageBytes + p * piece, base + p * sub + int64_t(s) * piece, piece, &full[st],
                      policy);
      mbar_arrive(&full[st]);
    }
  } else if (threadIdx.x >= 32) {
    uint32_t acc = 0;
    for (int s = 0; s < stages; ++s) {
      const int st = s % kBulkStages;
      mbar_wait(&full[st], (s / kBulkStages) & 1u);
      acc ^= reinterpret_cast<const uint32_t*>(smem + st * kBulkStageBytes)[threadIdx.x];
      mbar_arrive(&empty[st]);
    }
    if (acc == 0x12345678u) *sink = acc;
  }
#endif
}
}  // namespace

cudaError_t launch_stream_read(const void* src, size_t bytes, uint32_t* sink, int sms, cudaStream_t s) {
  stream_read_kernel<1><<<sms * 4, 512, 0, s>>>(static_cast<const uint4*>(src), bytes / 16, sink);
  return cudaGetLastError();
}
cudaError_t launch_stream_read_unrolled(const void* src, size_t bytes, uint32_t* sink, int sms, cudaStream_t s) {
  stream_read_kernel<4><<<sms * 4, 512, 0, s>>>(static_cast<const uint4*>(src), bytes / 16, sink);
  return cudaGetLastError();
}
// Bytes the bulk probe reads per CTA for `stages` stages, and the launch (one CTA per SM).
int64_t bulk_stream_bytes_per_cta(int stages) { return int64_t(stages) * kBulkStageBytes; }
cudaError_t launch_bulk_stream(const void* src, int stages, int pieces, uint32_t* sink, int sms, cudaStream_t s) {
  const int smem = kBulkStages * kBulkStageBytes + 2 * kBulkStages * 8 + 1024;
  cudaError_t err = cudaFuncSetAttribute(bulk_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  bulk_stream_kernel<<<sms, 64, smem, s>>>(static_cast<const uint8_t*>(src), stages, pieces, sink);
  return cudaGetLastError();
}
cudaError_t launch_empty(uint32_t* sink, int sms, cudaStream_t s) {
  empty_kernel<<<sms * 4, 512, 0, s>>>(sink);
  return cudaGetLastError();
}

}  // namespace sm90test
}  // namespace fp4moe
