// sm90 step 66 (docs/perf.md): the TP8 shard's two GEMMs for one token with no hand-over between CTAs.
// A probe, not a tactic: it serves GLM-5's TP8 shard at T = 1 (8 routed pairs, I = 256, H = 6144) and
// `bench_sm90 --resident-cc` checks its outputs against the CPU reference before timing them.
//
// Steps 61-65 cut FC1 by K (two CTAs an FC1 tile, wgmma's M = 64 rows), so FC2 had to wait for a
// publication of every FC1 sum of the pair: the bound they measured is the publication plus FC2's math
// after it. Here CTA (j, p) of pair j owns SwiGLU columns [16p, 16p + 16) of its expert whole: the 16 gate
// rows and 16 up rows over all of K = 6144 (FC1), then FC2's K slice of the same 16 columns for all 6144
// output rows (a partial product it adds into y with red.global.add.v2.f32; y is zeroed before the launch).
// No CTA waits for another. One token on n8 wgmmas wastes 7/8 of the tensor core (steps 62-65: 35-43 SM
// clocks an m64n8k16), so the math runs on the CUDA cores as f16x2 FMAs:
//   - codes decode to f16x2 pairs with 9 operations a word of 8 (resident_cc_layout.h: each half is the
//     code's e2m1 value times 2^-14, exactly, as an e5m2 byte in the half's high byte);
//   - the token (FC1) and the SwiGLU row (FC2) are scaled by a power of two into [2^13, 2^14) at their
//     largest and stored as f16; a k16 block's 16 products sum in f16x2 (at most 96 in magnitude), are
//     multiplied by the block's e4m3 scale in f16 (at most 43,008 < 65,504) and added in fp32.
// 128 CTAs of 512 threads (1024 in the wide build), 16 a pair; every bulk copy is issued at the start (the
// token first), one mbarrier per 9,216-byte chunk, 190,808 bytes of shared memory:
//   FC1: 12 chunks of K 512; warp w takes SwiGLU column 16p + w (its gate and up rows), lane l the chunk's
//        k16 block l.
//   FC2: 6 chunks of 1024 output rows; thread t takes rows 2t and 2t + 1 of the chunk over the CTA's k16
//        block.
//   The bytes of each chunk and the decode: resident_cc_layout.h.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp4moe/dtype.h"
#include "kernels/sm90_wgmma/sm90_cc_math.cuh"
#include "kernels/sm90_wgmma/sm90_e4m3.h"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"
#include "resident_cc_layout.h"
#include "resident_common.cuh"

namespace fp4moe {
namespace sm90test {

namespace {

using namespace sm90;
constexpr int kPairs = 8, kH = 6144, kI = 256, kCols = 16, kParts = kI / kCols;  // 16 CTAs a pair
constexpr int kWarps = 16, kThreads = 32 * kWarps;
constexpr int kChunkBytes = kCcChunkBytes, kCodeBytes = kCcCodeBytes;
constexpr int kChunks1 = kH / 512;                  // FC1: 12 chunks of K 512 (32 k16 blocks, one a lane)
constexpr int kRows2 = 2 * kThreads;                // FC2: 1024 output rows a chunk, two a thread
constexpr int kChunks2 = kH / kRows2;               // 6
constexpr int kChunks = kChunks1 + kChunks2;        // 18
constexpr int kPartBytes = kChunks * kChunkBytes;   // 165,888 bytes a CTA
constexpr int kXBytes = kH * 2;                     // the token, bf16
constexpr int kXBlocks = kH / 16;                   // 384 k16 blocks
// Shared memory: the bf16 token, its f16 copy (block kb's k 0..7 at 16 kb, its k 8..15 at 6144 + 16 kb, so
// that a warp's 32 lanes read 512 contiguous bytes), the chunks, the barriers (18 chunks, the token), and
// 48 floats for the CTA's reductions.
constexpr int kXhOffset = kXBytes;
constexpr int kChunkOffset = kXhOffset + kXBytes;
constexpr int kBarOffset = kChunkOffset + kPartBytes;
constexpr int kRedOffset = kBarOffset + (kChunks + 1) * 8;
constexpr int kSmem = kRedOffset + 48 * 4;  // [0, 32): per-warp values; [32, 48): the SwiGLU row
constexpr int kStamps = 8;
static_assert(kChunks1 * kCcChunkK == kH && kRows2 == kCcChunkRows && kChunks2 * kRows2 == kH && kWarps == kCols &&
                  kCols == kCcCols,
              "the probe's shape");
static_assert(kXBlocks <= kThreads, "one token block a thread");
static_assert(kChunks1 % 2 == 0, "FC1's loop takes one or two chunks a step");
static_assert(kSmem <= 227 * 1024, "shared memory of one H200 CTA");

// FC2 rows 2t and 2t + 1 of the chunk at shared address `base` in the probe's FC2 layout
// (resident_cc_layout.h): their block sums with the f16x2 SwiGLU values hv times the rows' e4m3 scales, in
// fp32 (still scaled by the values' 2^e and the codes' 2^-14).
__device__ __forceinline__ float2 cc_fc2_rows(uint32_t base, uint32_t t, const uint32_t hv[8]) {
  const uint4 w = ld_shared_u4(base + 16 * t);
  const uint32_t sc = ld_shared_u16(base + kCcCodeBytes + 2 * t);
  uint32_t a0 = cc_decode_fma(w.x, hv[0], hv[1], hv[2], hv[3], 0u);
  a0 = cc_decode_fma(w.y, hv[4], hv[5], hv[6], hv[7], a0);
  uint32_t a1 = cc_decode_fma(w.z, hv[0], hv[1], hv[2], hv[3], 0u);
  a1 = cc_decode_fma(w.w, hv[4], hv[5], hv[6], hv[7], a1);
  return f16x2_to_f32(hmul2(cc_pair_sum(a0, a1), e4m3x2_to_f16x2(sc)));
}

// kMode 0: the probe. 1: FC2's partial rows by plain stores instead of red.add (timed only: the atomics'
// cost). 2: no math (the waits and copies alone; timed only). kU: FC1 chunks a loop step (1 or 2: two
// independent chains a thread, half the loop's overhead). kWide: 1024 threads, one row a thread (FC1: warp w
// the gate (w < 16) or up row of column w % 16; FC2: one output row), twice the warps to hide latency.
// kPre (512 threads only): FC2's first kPre chunks decoded right after FC1's loop, before the SwiGLU row is
// known (the decode needs no activation), so that their decode overlaps FC1's epilogue.
template <int kMode, int kU, bool kWide, int kPre = 0>
__global__ void __launch_bounds__(kWide ? 2 * kThreads : kThreads, 1)
    resident_cc_kernel(const uint8_t* __restrict__ packed, const int* __restrict__ experts,
                       const uint16_t* __restrict__ x, const float* __restrict__ s1, const float* __restrict__ s2,
                       uint16_t* __restrict__ act, float* __restrict__ y, unsigned long long* stamps, int fc2_after) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kBarOffset);
  float* red = reinterpret_cast<float*>(smem + kRedOffset);
  constexpr int kNW = kWide ? 2 * kWarps : kWarps;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int j = blockIdx.x / kParts, p = blockIdx.x % kParts;
  unsigned long long* st = stamps != nullptr ? stamps + blockIdx.x * kStamps : nullptr;
  resident_stamp(st, 0);
  const int e = experts[j];
  // The tensor scales now: read where they are used, each would be a round trip to a cold L2 on the path.
  const float sg = s1[2 * e], su = s1[2 * e + 1], s2e = s2[e];
  const uint8_t* src = packed + (static_cast<size_t>(e) * kParts + p) * kPartBytes;
  uint8_t* chunks = smem + kChunkOffset;
  auto issue = [&](int c0, int c1, uint64_t policy) {
    for (int c = c0; c < c1; ++c) {
      mbar_arrive_expect_tx(&bars[c], kChunkBytes);
      bulk_copy_g2s(chunks + c * kChunkBytes, src + static_cast<size_t>(c) * kChunkBytes, kChunkBytes, &bars[c],
                    policy);
    }
  };
  if (tid == 0) {
    for (int c = 0; c <= kChunks; ++c) mbar_init(&bars[c], 1);
    fence_barrier_init();
    mbar_arrive_expect_tx(&bars[kChunks], kXBytes);
    bulk_copy_g2s(smem, x, kXBytes, &bars[kChunks], policy_evict_normal());
    issue(0, fc2_after > 0 ? kChunks1 : kChunks, policy_evict_first());
  }
  __syncthreads();
  // The token: the largest magnitude, then the f16 copy times 2^ex (thread tid converts block tid).
  mbar_wait(&bars[kChunks], 0);
  uint4 xb0 = make_uint4(0, 0, 0, 0), xb1 = xb0;
  float m = 0.f;
  if (tid < kXBlocks) {
    xb0 = ld_shared_u4(smem_addr(smem) + 32 * tid);
    xb1 = ld_shared_u4(smem_addr(smem) + 32 * tid + 16);
    m = cc_max_abs_bf16x16(xb0, xb1, m);
  }
  const int ex = cc_prescale(cc_cta_max(m, red, kNW));
  if (tid < kXBlocks)
    cc_token_block_to_f16(xb0, xb1, e4m3_pow2(ex), smem + kXhOffset + 16 * tid,
                          smem + kXhOffset + kXBytes / 2 + 16 * tid);
  __syncthreads();  // the f16 token written; red[] free again
  resident_stamp(st, 1);

  // FC1: warp w's gate and up rows, lane l's k16 block of each chunk.
  const uint32_t chunk_s = smem_addr(chunks), xh_s = smem_addr(smem + kXhOffset);
  float accg = 0.f, accu = 0.f;
  // Chunk c's share of the thread's two rows, scaled by the blocks' scales: (gate, up) in fp32 (kWide: its
  // one row's in .x).
  auto fc1_chunk = [&](int c) {
    if constexpr (kWide) {
      const uint32_t base = chunk_s + c * kChunkBytes, unit = 32 * (warp & 15) + lane, half = warp >> 4;
      const uint2 w = ld_shared_u2(base + 16 * unit + 8 * half);
      const uint32_t sc = ld_shared_u8(base + kCodeBytes + 2 * unit + half);
      const uint4 x0 = ld_shared_u4(xh_s + 16 * (32 * c + lane));
      const uint4 x1 = ld_shared_u4(xh_s + kXBytes / 2 + 16 * (32 * c + lane));
      uint32_t a = cc_decode_fma(w.x, x0.x, x0.y, x0.z, x0.w, 0u);
      a = cc_decode_fma(w.y, x1.x, x1.y, x1.z, x1.w, a);
      return make_float2(cc_row_sum(a, sc), 0.f);
    } else {
      return cc_fc1_unit(chunk_s + c * kChunkBytes, 32 * warp + lane, xh_s, kXBytes / 2, 32 * c + lane);
    }
  };
  for (int c0 = 0; c0 < kChunks1; c0 += kU) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u;
      mbar_wait(&bars[c], 0);
      if (c == 0) resident_stamp(st, 2);
      if (c == kChunks1 - 1) resident_stamp(st, 3);
      if (tid == 0 && fc2_after > 0 && c + 1 == fc2_after) issue(kChunks1, kChunks, policy_evict_first());
    }
    if (kMode != 2) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const float2 gu = fc1_chunk(c0 + u);
        accg += gu.x;
        accu += gu.y;
      }
    }
  }
  static_assert(kPre >= 0 && kPre <= kChunks2 && (kPre == 0 || !kWide), "kPre: FC2 chunks decoded early");
  uint32_t pre[kPre > 0 ? kPre : 1][16], pre_sc[kPre > 0 ? kPre : 1];
#pragma unroll
  for (int f = 0; f < kPre; ++f) {
    mbar_wait(&bars[kChunks1 + f], 0);
    const uint32_t base = chunk_s + (kChunks1 + f) * kChunkBytes;
    const uint4 w = ld_shared_u4(base + 16 * tid);
    pre_sc[f] = ld_shared_u16(base + kCodeBytes + 2 * tid);
    cc_decode_word(w.x, &pre[f][0]);
    cc_decode_word(w.y, &pre[f][4]);
    cc_decode_word(w.z, &pre[f][8]);
    cc_decode_word(w.w, &pre[f][12]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    accg += __shfl_xor_sync(0xFFFFFFFFu, accg, o);
    accu += __shfl_xor_sync(0xFFFFFFFFu, accu, o);
  }
  // SwiGLU column i (cc_swiglu_bf16): to act and to red[32 + i].
  auto swiglu = [&](float gsum, float usum, int i) {
    const uint16_t rounded = cc_swiglu_bf16(gsum, usum, ex, sg, su);
    act[j * kI + kCols * p + i] = rounded;
    red[32 + i] = bf16_bits_to_f32(rounded);
  };
  if constexpr (kWide) {
    if (lane == 0) red[warp] = accg;
    __syncthreads();
    if (tid < kCols) swiglu(red[tid], red[kCols + tid], tid);
  } else {
    if (lane == 0) swiglu(accg, accu, warp);
  }
  __syncthreads();
  resident_stamp(st, 4);

  // FC2: the 16 SwiGLU values times 2^eh as f16x2, then thread t's two rows of each chunk.
  uint32_t hv[8];
  const int eh = cc_row_to_f16x2(red + 32, hv);
  const float unscale2 = e4m3_pow2(14 - eh) * s2e;
  float* yrow = y + static_cast<size_t>(j) * kH;
#pragma unroll
  for (int f = 0; f < kChunks2; ++f) {
    const int c = kChunks1 + f;
    mbar_wait(&bars[c], 0);
    if (f == 0) resident_stamp(st, 5);
    if (f == kChunks2 - 1) resident_stamp(st, 6);
    if (kMode == 2) continue;
    const uint32_t base = chunk_s + c * kChunkBytes;
    if constexpr (kWide) {
      const uint2 w = ld_shared_u2(base + 8 * tid);
      const uint32_t sc = ld_shared_u8(base + kCodeBytes + tid);
      uint32_t a = cc_decode_fma(w.x, hv[0], hv[1], hv[2], hv[3], 0u);
      a = cc_decode_fma(w.y, hv[4], hv[5], hv[6], hv[7], a);
      const float v = cc_row_sum(a, sc) * unscale2;
      float* dst = yrow + kRows2 * f + tid;
      if (kMode == 0)
        asm volatile("red.global.add.f32 [%0], %1;" ::"l"(dst), "f"(v) : "memory");
      else
        *dst = v;
      continue;
    }
    float2 v;
    if (f < kPre) {  // decoded before the SwiGLU row: the same multiply-adds in the same order
      uint32_t a0 = 0u, a1 = 0u;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        a0 = hfma2(pre[f][q], hv[q], a0);
        a1 = hfma2(pre[f][8 + q], hv[q], a1);
      }
      v = f16x2_to_f32(hmul2(cc_pair_sum(a0, a1), e4m3x2_to_f16x2(pre_sc[f])));
    } else {
      v = cc_fc2_rows(base, tid, hv);
    }
    float* dst = yrow + kRows2 * f + 2 * tid;
    if (kMode == 0)
      asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(v.x * unscale2), "f"(v.y * unscale2)
                   : "memory");
    else
      *reinterpret_cast<float2*>(dst) = make_float2(v.x * unscale2, v.y * unscale2);
  }
  __syncthreads();
  resident_stamp(st, 7);
}

}  // namespace

int resident_cc_stamps() { return kStamps; }
size_t resident_cc_bytes(int experts) { return static_cast<size_t>(experts) * kParts * kPartBytes; }

// packed: pack_cc_layout's bytes for E >= max(experts) + 1 experts; experts [8], x [6144] bf16, s1 [E][2],
// s2 [E] on the device; act: 8 x 256 bf16 (FC1's output, for the check); y: 8 x 6144 fp32, zero before each
// launch (mode 0 adds into it); stamps: null or kStamps x 128 globaltimer values; fc2_after: 0 (every copy
// at the start) or 1 .. 12 (FC2's copies once FC1's chunk fc2_after - 1 has landed); unroll: kU; wide: kWide;
// pre: kPre (0, or 1 or 2 with mode 0, unroll 2, 512 threads and fc2_after 0).
cudaError_t launch_resident_cc(const void* packed, const int* experts, const void* x, const float* s1,
                               const float* s2, void* act, float* y, unsigned long long* stamps, int mode,
                               int fc2_after, int unroll, bool wide, int pre, cudaStream_t s) {
  if (mode < 0 || mode > 2 || fc2_after < 0 || fc2_after > kChunks1 || (unroll != 1 && unroll != 2) || pre < 0 ||
      pre > 2 || (pre > 0 && (mode != 0 || unroll != 2 || wide || fc2_after != 0)))
    return cudaErrorInvalidValue;
  using Kernel = void (*)(const uint8_t*, const int*, const uint16_t*, const float*, const float*, uint16_t*, float*,
                          unsigned long long*, int);
  const Kernel kernels[2][2][3] = {
      {{resident_cc_kernel<0, 1, false>, resident_cc_kernel<1, 1, false>, resident_cc_kernel<2, 1, false>},
       {resident_cc_kernel<0, 2, false>, resident_cc_kernel<1, 2, false>, resident_cc_kernel<2, 2, false>}},
      {{resident_cc_kernel<0, 1, true>, resident_cc_kernel<1, 1, true>, resident_cc_kernel<2, 1, true>},
       {resident_cc_kernel<0, 2, true>, resident_cc_kernel<1, 2, true>, resident_cc_kernel<2, 2, true>}}};
  const Kernel kernel = pre == 1   ? resident_cc_kernel<0, 2, false, 1>
                        : pre == 2 ? resident_cc_kernel<0, 2, false, 2>
                                   : kernels[wide ? 1 : 0][unroll - 1][mode];
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  kernel<<<kPairs * kParts, wide ? 2 * kThreads : kThreads, kSmem, s>>>(
      static_cast<const uint8_t*>(packed), experts, static_cast<const uint16_t*>(x), s1, s2,
      static_cast<uint16_t*>(act), y, stamps, fc2_after);
  return cudaGetLastError();
}

}  // namespace sm90test
}  // namespace fp4moe
