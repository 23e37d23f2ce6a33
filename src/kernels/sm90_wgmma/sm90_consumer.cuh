// Consumer of the sm90 family: dequantise packed NVFP4 weights in registers and issue RS wgmma.
//
// What a consumer warpgroup computes per work item: for each of its BM/128 packed 64-row tiles u,
// D_u[64 rows, BN tokens] = W_u[64, K] . X[BN, K]^T, fp32, with W_u dequantised to bf16 as wgmma's A
// operand in registers and the token tile X as B from shared memory (K-major, 128-byte swizzle).
//
// Fragments (PTX ISA, wgmma .m64nNk16, A in registers): thread T of the warpgroup, warp w = T/32,
// g = lane/4, q = lane%4, rows R0 = 16w + g and R1 = R0 + 8 of the 64-row tile:
//   a0 = (R0, k 2q | 2q+1)   a1 = (R1, 2q | 2q+1)   a2 = (R0, 2q+8 | 2q+9)   a3 = (R1, 2q+8 | 2q+9)
//   accumulator d[4j + {0,1,2,3}] = (R0, token 8j+2q), (R0, 8j+2q+1), (R1, 8j+2q), (R1, 8j+2q+1).
// Per packed k64 chunk a thread loads 16 bytes of codes (LDS.128 at 16*T: conflict-free) and 8 bytes of
// scales (LDS.64, the four lanes of a quad read the same 8 bytes: broadcast), then per k16 step s:
//   word = codes[s];  S = ((u << 4 or u >> 4) & 0x0FF00FF0) | 0x70007000  (scale pair of R0, R1)
//   a0 = (word & M) * S.lo   a1 = ((word << 3) & M) * S.hi   a2 = ((word << 6) & M) * S.lo
//   a3 = (three shifts, masks) * S.hi,   M = 0x81C081C0, '*' = mul.rn.bf16x2 with a broadcast half
// (sm90_layout.h explains the bit placement and why every product is exact). That is 11 integer
// operations (left shifts go to the FMA pipe as IMAD.SHL), 2 for the scale pair and 4 bf16x2
// multiplies (HMUL2.BF16 with the .H0_H0 / .H1_H1 operand swizzle) per 8 weights.
//
// Pipeline per stage: wait on the full barrier, fence.proxy.async (the token bytes came through
// cp.async, the generic proxy, and wgmma reads through the async proxy), then per chunk: dequantise
// four k16 steps, wgmma.fence, issue four wgmmas per tile; commit, wait for the group, and one lane per
// warp arrives on the stage's empty barrier (8 arrivals free it).
#pragma once
#include <cstdint>

#include "kernels/sm90_wgmma/sm90_layout.h"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"
#include "kernels/sm90_wgmma/sm90_wgmma_ops.cuh"

namespace fp4moe {
namespace sm90 {

constexpr uint32_t kCodeMask = 0x81C081C0u;

// x * (s.lo, s.lo) and x * (s.hi, s.hi) in bf16x2.
__device__ __forceinline__ uint32_t mul_bf16x2_lo(uint32_t x, uint32_t s) {
  uint32_t r;
  asm("{\n.reg .b16 l, h;\n.reg .b32 t;\nmov.b32 {l, h}, %2;\nmov.b32 t, {l, l};\nmul.rn.bf16x2 %0, %1, t;\n}\n"
      : "=r"(r)
      : "r"(x), "r"(s));
  return r;
}
__device__ __forceinline__ uint32_t mul_bf16x2_hi(uint32_t x, uint32_t s) {
  uint32_t r;
  asm("{\n.reg .b16 l, h;\n.reg .b32 t;\nmov.b32 {l, h}, %2;\nmov.b32 t, {h, h};\nmul.rn.bf16x2 %0, %1, t;\n}\n"
      : "=r"(r)
      : "r"(x), "r"(s));
  return r;
}

// (a & b) | c in one LOP3 (the compiler splits it in two when b and c are both immediates).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// One k16 step: the word of codes and the scale word (pair of steps) -> the four A registers.
template <bool kOddStep>
__device__ __forceinline__ void dequant_kstep(uint32_t w, uint32_t scale_word, uint32_t (&a)[4]) {
  const uint32_t s = and_or(kOddStep ? (scale_word >> 4) : (scale_word << 4), 0x0FF00FF0u, 0x70007000u);
  const uint32_t o0 = w & kCodeMask;
  const uint32_t o1 = (w << 3) & kCodeMask;
  const uint32_t o2 = (w << 6) & kCodeMask;
  const uint32_t o3 = ((w >> 4) & 0x00400040u) | ((w >> 6) & 0x01800180u) | ((w << 4) & 0x80008000u);
  a[0] = mul_bf16x2_lo(o0, s);
  a[1] = mul_bf16x2_hi(o1, s);
  a[2] = mul_bf16x2_lo(o2, s);
  a[3] = mul_bf16x2_hi(o3, s);
}

// One packed k64 chunk of one 64-row tile: block = its shared-memory copy (sm90_layout.h).
__device__ __forceinline__ void dequant_chunk(const uint8_t* block, int tid, uint32_t (&a)[4][4]) {
  const uint4 codes = *reinterpret_cast<const uint4*>(block + 16 * tid);
  const int quad = (tid >> 5) * 8 + ((tid & 31) >> 2);
  const uint2 sc = *reinterpret_cast<const uint2*>(block + kPackCodeBytes + 8 * quad);
  dequant_kstep<false>(codes.x, sc.x, a[0]);
  dequant_kstep<true>(codes.y, sc.x, a[1]);
  dequant_kstep<false>(codes.z, sc.y, a[2]);
  dequant_kstep<true>(codes.w, sc.y, a[3]);
}

// Independent accumulator sets per tile: k16 step i of a stage accumulates into set i % kSets, so
// consecutive small-N wgmmas do not wait on each other's accumulator; the sets are summed at the end.
template <int BN>
constexpr int accumulator_sets() { return BN <= 16 ? 4 : (BN <= 64 ? 2 : 1); }

// The main loop of one work item: accumulates acc[u][set] over all stages of the item. There is no
// branch between wgmma.fence and the commit (a branch there makes ptxas serialise every wgmma): every
// stage is full (K is padded to kPackKAlign in the packed layout) and a tile the producer left out (past
// the expert's rows) is computed from stale shared memory into accumulators that are never stored.
// Each stage ends with wait_group<0> before its slot is released and before the next stage writes A
// registers: an RS wgmma reads its A registers while in flight, and ptxas does not keep them from
// being reused across loop iterations (a deferred wait_group<1> here produced garbage under
// compute-sanitizer's slower timing). Inside a stage the chunks' A fragments live in distinct registers
// (checked on the SASS by check_sass.py).
// stage/phase: the consumer's position in the ring, advanced here.
template <class Cfg>
__device__ __forceinline__ void consume_item(uint8_t* smem, uint64_t* full, uint64_t* empty, int nstages,
                                             int first_tile, int tid,
                                             float (&acc)[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2],
                                             int& stage, uint32_t& phase) {
  constexpr int kMW = Cfg::kM64PerConsumer;
  constexpr int kSets = accumulator_sets<Cfg::kBN>();
#pragma unroll
  for (int u = 0; u < kMW; ++u)
#pragma unroll
    for (int v = 0; v < kSets; ++v)
#pragma unroll
      for (int i = 0; i < Cfg::kBN / 2; ++i) acc[u][v][i] = 0.0f;
  for (int ks = 0; ks < nstages; ++ks) {
    mbar_wait(&full[stage], phase);
    fence_proxy_async_smem();
    const uint8_t* st = smem + stage * Cfg::kStageBytes;
    const uint64_t desc0 = make_desc_sw128(smem_addr(st));  // offsets below stay inside the 14-bit field
    uint32_t a[Cfg::kChunksPerStage][kMW][4][4];
#pragma unroll
    for (int kb = 0; kb < Cfg::kChunksPerStage; ++kb) {
#pragma unroll
      for (int u = 0; u < kMW; ++u)
        dequant_chunk(st + Cfg::kTokenBytes + (first_tile + u) * Cfg::kWeightTileBytes + kb * kPackBlockBytes, tid,
                      a[kb][u]);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int u = 0; u < kMW; ++u)
          WgmmaRS<Cfg::kBN>::mma(acc[u][(kb * 4 + s) % kSets], a[kb][u][s],
                                 desc0 + static_cast<uint64_t>((kb * Cfg::kTokenSubTileBytes + s * 32) >> 4));
    }
    wgmma_commit();
    wgmma_wait<0>();
    if ((tid & 31) == 0) mbar_arrive(&empty[stage]);
    if (++stage == Cfg::kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
#pragma unroll
  for (int u = 0; u < kMW; ++u)
#pragma unroll
    for (int v = 1; v < kSets; ++v)
#pragma unroll
      for (int i = 0; i < Cfg::kBN / 2; ++i) acc[u][0][i] += acc[u][v][i];
}

}  // namespace sm90
}  // namespace fp4moe
