// The skeleton of a resident-weights launch for one token on a small-I shard (docs/perf.md, sm90 step
// 61; GLM-5's TP8 shard at T = 1: 8 experts, I = 256, H = 6144, 21.2 MB of NVFP4 weights). Not a GEMM:
// the bytes are read as if they were packed codes and scales and go through about the integer and half2
// work per weight that a one-token consumer would do, so that its time is the design's floor, not its
// result (the outputs are not checked). What it keeps of the design:
//   - 128 CTAs, 16 an expert; CTA (e, p) holds gate rows [16p, 16p + 16) and their up rows of expert e over
//     the whole K = 6144 (FC1 cut by rows, so SwiGLU is local and no partial sums are reduced: 110,592
//     bytes), and FC2's output rows [384p, 384p + 384) over K = 256 (55,296 bytes), both in shared memory
//     at once with the token's row (12,288 bytes);
//   - every FC1 bulk copy issued at the launch's start, one mbarrier per 9,216-byte chunk, so the
//     consumers follow the stream chunk by chunk; FC2's copies with them, or held back until FC1's chunk
//     fc2_after - 1 (0-based) has landed in the CTA, so that they do not take HBM from the FC1 bytes that the
//     publication waits for;
//   - one publication between the GEMMs: the CTA's 16 SwiGLU values to global memory, a GPU-scope fence
//     and a counter per expert that only grows (the last replay's target is read from the CTA's own
//     atomicAdd), then FC2 from the resident rows once all 16 of its expert have published; or, with
//     `cluster`, the expert's 16 CTAs as one thread-block cluster (a non-portable size) exchanging the
//     values through distributed shared memory and a cluster barrier.
// The stand-in math: per 8 codes four 3-operation decodes to half2 and four HFMA2, a scale per 16 codes;
// FC1's lanes take a row's consecutive 8-byte pieces, FC2's eight lanes a row's 16-byte pieces, so the
// shared-memory reads are free of bank conflicts. It is latency-bound at 8 warps a CTA (FC2 takes about
// 3 us after the publication), so the run without math is the design's structural floor.
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sm90_wgmma/sm90_ptx.cuh"
#include "resident_common.cuh"

namespace fp4moe {
namespace sm90test {

namespace {

constexpr int kExperts = 8, kParts = 16, kH = 6144, kI = 256;
constexpr int kChunk = 9216;                     // 32 rows x k512 (FC1) or 64 rows x k256 (FC2): codes + scales
constexpr int kFc1Chunks = kH / 512;             // 12
constexpr int kFc2Chunks = kH / kParts / 64;     // 6
constexpr int kFc1Bytes = kFc1Chunks * kChunk;   // 110,592
constexpr int kFc2Bytes = kFc2Chunks * kChunk;   // 55,296
constexpr int kXBytes = kH * 2;                  // the token's row
constexpr int kThreads = 256;
constexpr int kSmem = kFc1Bytes + kFc2Bytes + kXBytes + (kFc1Chunks + kFc2Chunks + 1) * 8 + 32 * 4 + kI * 2;

// Two e2m1 codes (bits 0-3 and 16-19 of w) as two halves scaled by 2^-14: magnitude bits under the
// exponent's low bits, sign to bit 15 (three integer operations, about what a decode costs).
__device__ __forceinline__ __half2 decode_pair(uint32_t w) {
  const uint32_t h = ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u);
  return *reinterpret_cast<const __half2*>(&h);
}

// Eight codes of `w` against eight activations (four half2 from `xh`), summed in half2.
__device__ __forceinline__ __half2 dot8(uint32_t w, const __half2* xh, __half2 acc) {
  acc = __hfma2(decode_pair(w), xh[0], acc);
  acc = __hfma2(decode_pair(w >> 4), xh[1], acc);
  acc = __hfma2(decode_pair(w >> 8), xh[2], acc);
  acc = __hfma2(decode_pair(w >> 12), xh[3], acc);
  return acc;
}

__device__ __forceinline__ float scale_of(uint8_t s) { return __half2float(__ushort_as_half(uint16_t(s) << 7)); }

template <bool kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    resident_kernel(const uint8_t* __restrict__ fc1, const uint8_t* __restrict__ fc2, const uint16_t* __restrict__ x,
                    uint16_t* __restrict__ act, unsigned* __restrict__ counters, uint16_t* __restrict__ y,
                    unsigned long long* __restrict__ stamps, int math, int fc2_after) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace fp4moe::sm90;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* w1 = smem;
  uint8_t* w2 = w1 + kFc1Bytes;
  __half2* xs = reinterpret_cast<__half2*>(w2 + kFc2Bytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(w2 + kFc2Bytes + kXBytes);
  float* rows = reinterpret_cast<float*>(bars + kFc1Chunks + kFc2Chunks + 1);
  __half* hs = reinterpret_cast<__half*>(rows + 32);
  const int e = blockIdx.x / kParts, p = blockIdx.x % kParts, t = threadIdx.x, lane = t % 32, warp = t / 32;
  // Optional timeline (globaltimer ns): entry, FC1 rows summed, publication seen, the last FC2 row written.
  auto stamp = [&](int i) { resident_stamp(stamps == nullptr ? nullptr : stamps + blockIdx.x * 4, i); };
  stamp(0);
  uint64_t* xbar = bars + kFc1Chunks + kFc2Chunks;
  // FC2's copies: at the start (fc2_after = 0), or by thread 0 once FC1's chunk fc2_after - 1 has landed,
  // so that they do not share HBM with any CTA's FC1 bytes that the publication waits for.
  auto issue_fc2 = [&] {
    const uint8_t* src2 = fc2 + int64_t(blockIdx.x) * kFc2Bytes;
    for (int c = 0; c < kFc2Chunks; ++c) {
      mbar_arrive_expect_tx(&bars[kFc1Chunks + c], kChunk);
      bulk_copy_g2s(w2 + c * kChunk, src2 + c * kChunk, kChunk, &bars[kFc1Chunks + c], policy_evict_first());
    }
  };
  if (t == 0) {
    for (int i = 0; i < kFc1Chunks + kFc2Chunks + 1; ++i) mbar_init(&bars[i], 1);
    fence_barrier_init();
    const uint64_t policy = policy_evict_first();
    const uint8_t* src1 = fc1 + int64_t(blockIdx.x) * kFc1Bytes;
    mbar_arrive_expect_tx(xbar, kXBytes);
    bulk_copy_g2s(xs, x, kXBytes, xbar, policy_evict_normal());
    for (int c = 0; c < kFc1Chunks; ++c) {
      mbar_arrive_expect_tx(&bars[c], kChunk);
      bulk_copy_g2s(w1 + c * kChunk, src1 + c * kChunk, kChunk, &bars[c], policy);
    }
    if (fc2_after == 0) issue_fc2();
  }
  __syncthreads();
  if constexpr (kCluster) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  // FC1: warp w takes rows 4w .. 4w + 3 of the 32; lane l the chunk's k16 block l (8 code bytes a row).
  float acc[4] = {0, 0, 0, 0};
  mbar_wait(xbar, 0);
  for (int c = 0; c < kFc1Chunks; ++c) {
    mbar_wait(&bars[c], 0);
    if (t == 0 && c + 1 == fc2_after) issue_fc2();
    if (!math) continue;
    const uint8_t* ch = w1 + c * kChunk;
    const __half2* xh = xs + c * 256 + lane * 8;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = warp * 4 + r;
      const uint2 w = *reinterpret_cast<const uint2*>(ch + row * 256 + lane * 8);
      __half2 s2 = dot8(w.x, xh, __float2half2_rn(0.f));
      s2 = dot8(w.y, xh + 4, s2);
      acc[r] += (__low2float(s2) + __high2float(s2)) * scale_of(ch[8192 + row * 32 + lane]);
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    for (int o = 16; o > 0; o /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane == 0) rows[warp * 4 + r] = acc[r];
  }
  __syncthreads();
  stamp(1);
  if constexpr (kCluster) {
    // Each thread sends one SwiGLU value of this CTA's 16 to one CTA of the expert's cluster (t / 16).
    namespace cg = cooperative_groups;
    const float g = rows[t % 16], u = rows[16 + t % 16];
    const __half h = __float2half(g / (1.f + __expf(-g)) * u);
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // every CTA of the cluster has started
    cg::cluster_group cluster = cg::this_cluster();
    cluster.map_shared_rank(hs, static_cast<unsigned>(t / 16))[p * 16 + t % 16] = h;
    cluster.sync();
    stamp(2);
  } else {
    if (t < 16) {
      const float g = rows[t], u = rows[16 + t];
      act[e * kI + p * 16 + t] = __half_as_ushort(__float2half(g / (1.f + __expf(-g)) * u));
    }
    __syncthreads();
    if (t == 0)  // publish, then wait for the expert's other 15 CTAs of this launch
      resident_wait(&counters[e], resident_publish(&counters[e], kParts));
    __syncthreads();
    stamp(2);
    hs[t] = __ushort_as_half(__ldcg(act + e * kI + t));
    __syncthreads();
  }
  // FC2: chunk q holds rows 64q .. 64q + 63 over K = 256 (128 code bytes a row, then 16 scale bytes a row);
  // eight lanes a row, 16 code bytes each, so a warp reads four whole rows (512 contiguous bytes), twice.
  const int seg = t % 8, rgrp = t / 8;
  const __half2* hh = reinterpret_cast<const __half2*>(hs) + seg * 16;
  for (int q = 0; q < kFc2Chunks; ++q) {
    mbar_wait(&bars[kFc1Chunks + q], 0);
    if (!math) continue;
    const uint8_t* ch = w2 + q * kChunk;
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int row = rgrp + 32 * pass;
      const uint4 a = *reinterpret_cast<const uint4*>(ch + row * 128 + seg * 16);
      __half2 s0 = dot8(a.x, hh, __float2half2_rn(0.f));
      s0 = dot8(a.y, hh + 4, s0);
      __half2 s1 = dot8(a.z, hh + 8, __float2half2_rn(0.f));
      s1 = dot8(a.w, hh + 12, s1);
      float sum = (__low2float(s0) + __high2float(s0)) * scale_of(ch[8192 + row * 16 + seg * 2]) +
                  (__low2float(s1) + __high2float(s1)) * scale_of(ch[8192 + row * 16 + seg * 2 + 1]);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      if (seg == 0) y[e * kH + p * 384 + q * 64 + row] = __half_as_ushort(__float2half(sum));
    }
  }
  __syncthreads();
  stamp(3);
#endif
}

}  // namespace

// Bytes the skeleton reads from its two weight buffers (FC1's, then FC2's), each kExperts * kParts regions.
size_t resident_fc1_bytes() { return size_t(kExperts) * kParts * kFc1Bytes; }
size_t resident_fc2_bytes() { return size_t(kExperts) * kParts * kFc2Bytes; }

namespace {

// The clustered kernel's attributes and launch configuration: one 16-CTA cluster (a non-portable size)
// per expert. `attr` must outlive `cfg`.
cudaError_t cluster_config(cudaStream_t s, cudaLaunchAttribute* attr, cudaLaunchConfig_t* cfg) {
  cudaError_t err = cudaFuncSetAttribute(resident_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(resident_kernel<true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  *cfg = cudaLaunchConfig_t{};
  cfg->gridDim = dim3(kExperts * kParts);
  cfg->blockDim = dim3(kThreads);
  cfg->dynamicSmemBytes = kSmem;
  cfg->stream = s;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = kParts;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg->attrs = attr;
  cfg->numAttrs = 1;
  return err;
}

}  // namespace

// x: kH bf16; act: kExperts * kI; counters: kExperts (zero once, before the first launch); y: kExperts * kH.
// stamps: null, or 4 x 128 globaltimer values (entry, FC1 summed, publication seen, end) per CTA.
// math = false: the same copies, waits and publication, the consumers doing nothing with the bytes.
// cluster = true: each expert's 16 CTAs are one thread-block cluster and exchange their SwiGLU values
// through distributed shared memory and a cluster barrier instead of global memory, a fence and the
// counter.
// fc2_after: 0, FC2's copies issued with FC1's at the start; 1..12, once the fc2_after-th of FC1's 12
// chunks has landed in the CTA.
cudaError_t launch_resident_skeleton(const void* fc1, const void* fc2, const void* x, void* act, unsigned* counters,
                                     void* y, unsigned long long* stamps, bool math, bool cluster, int fc2_after,
                                     cudaStream_t s) {
  const auto* f1 = static_cast<const uint8_t*>(fc1);
  const auto* f2 = static_cast<const uint8_t*>(fc2);
  const auto* xx = static_cast<const uint16_t*>(x);
  auto* a = static_cast<uint16_t*>(act);
  auto* yy = static_cast<uint16_t*>(y);
  const int m = math ? 1 : 0;
  if (!cluster) {
    cudaError_t err = cudaFuncSetAttribute(resident_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
    resident_kernel<false><<<kExperts * kParts, kThreads, kSmem, s>>>(f1, f2, xx, a, counters, yy, stamps, m,
                                                                      fc2_after);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg;
  const cudaError_t err = cluster_config(s, &attr, &cfg);
  if (err != cudaSuccess) return err;
  return cudaLaunchKernelEx(&cfg, resident_kernel<true>, f1, f2, xx, a, counters, yy, stamps, m, fc2_after);
}

// How many of the clustered launch's 16-CTA clusters the device holds at once (it needs 8), or -1.
int resident_max_active_clusters() {
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg;
  int n = -1;
  if (cluster_config(nullptr, &attr, &cfg) != cudaSuccess) return -1;
  return cudaOccupancyMaxActiveClusters(&n, resident_kernel<true>, &cfg) == cudaSuccess ? n : -1;
}

}  // namespace sm90test
}  // namespace fp4moe
