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
//   (p0, p1, p2, p3) = decode_code_word(word): word & M, (word << 6) & M, rotl(word, 10) & M and
//   slot 3 from two pieces (sm90_layout.h: the bit placement, and why every product is exact)
//   a0 = p0 * S.lo   a1 = p1 * S.hi   a2 = p2 * S.lo   a3 = p3 * S.hi,   M = 0x81C081C0,
//   '*' = mul.rn.bf16x2 with a broadcast half.
// That is 9 integer operations (five LOP3 and four shifts; ptxas puts left shifts on the FMA pipe as
// IMAD.SHL, the rotation and the right shift are SHF on the ALU pipe), 2 for the scale pair and 4 bf16x2
// multiplies (HMUL2.BF16 with the .H0_H0 / .H1_H1 operand swizzle) per 8 weights.
//
// Pipeline per stage: wait on the full barrier, fence.proxy.async (the token bytes came through
// cp.async, the generic proxy, and wgmma reads through the async proxy), then per chunk: dequantise
// four k16 steps, wgmma.fence, issue four wgmmas per tile. Tiles with two or more chunks per stage
// commit each chunk as its own group and keep up to B-1 groups in flight across stage boundaries
// (consume_pipelined); the k64 tile commits per stage and waits for it (consume_serial). A stage is
// freed when every consumer thread has arrived on its empty barrier (128 per consumer warpgroup).
#pragma once
#include <cstdint>

#include "kernels/sm90_wgmma/sm90_e4m3.cuh"
#include "kernels/sm90_wgmma/sm90_layout.h"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"
#include "kernels/sm90_wgmma/sm90_wgmma_ops.cuh"

namespace fp4moe {
namespace sm90 {

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
  uint32_t o[4];
  decode_code_word(w, o);
  a[0] = mul_bf16x2_lo(o[0], s);
  a[1] = mul_bf16x2_hi(o[1], s);
  a[2] = mul_bf16x2_lo(o[2], s);
  a[3] = mul_bf16x2_hi(o[3], s);
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

// Accumulator sets per tile: k16 step i of a stage accumulates into set i % kSets, and the sets are summed
// at the end of an item. One set. Step 1 split the small-N tiles' steps over four sets (two for N <= 64)
// so that consecutive wgmmas would not wait on each other's accumulator; sm90_consumer_probe (docs/perf.md,
// sm90 step 42) shows the opposite for one warpgroup alone, 16 m64n8k16 of a k256 stage in 217 SM clocks
// chained on one accumulator against 767 over four sets, and little difference once four warpgroups share the
// SM's tensor pipe (832 against 886 clocks, about 13 a wgmma): the four-consumer and two-CTA tiles are
// bound by that pipe and by the dequantisation, not by the chain. One set measured the same or slightly
// faster (the T=8 chain -0.7%) and frees 12 (n8) or 24 (n16) registers per consumer thread.
// FP4MOE_SM90_SPLIT_ACCUMULATORS=1 at compile time brings back step 1's rule (the control binary).
#ifndef FP4MOE_SM90_SPLIT_ACCUMULATORS
#define FP4MOE_SM90_SPLIT_ACCUMULATORS 0
#endif
template <int BN>
constexpr int accumulator_sets() {
  return FP4MOE_SM90_SPLIT_ACCUMULATORS ? (BN <= 16 ? 4 : (BN <= 64 ? 2 : 1)) : 1;
}

// A-fragment buffers a consumer keeps in flight: each packed k64 chunk is one wgmma commit group whose
// RS wgmmas read their A registers asynchronously, so a buffer is rewritten only after wait_group<kBuffers-1>
// has retired the group that last read it. One buffer per chunk of a stage (four, 64 registers, for a
// k256 stage) where the register budget allows (one CTA per SM), two with two CTAs per SM (96
// registers per consumer thread, or 104 with four consumer warpgroups in one CTA).
template <class Cfg>
constexpr int a_buffers() { return Cfg::kChunksPerStage >= 2 && Cfg::Regs::kConsumer > 128 ? Cfg::kChunksPerStage : 2; }

// The pipelined schedule needs at least two chunks per stage: with one (the k64 tile) its loop body
// spans two stages and ptxas serialises every wgmma (C7513), so such tiles keep the serial schedule
// (one commit group per stage, wait_group<0> before the release). FP4MOE_SM90_SERIAL_STAGES=1 at
// compile time gives every tile the serial schedule (the control binary of docs/perf.md's step 14).
#ifndef FP4MOE_SM90_SERIAL_STAGES
#define FP4MOE_SM90_SERIAL_STAGES 0
#endif
template <class Cfg>
constexpr bool pipelined_consumer() { return !FP4MOE_SM90_SERIAL_STAGES && Cfg::kChunksPerStage >= 2; }

// A consumer thread's release of a stage: every consumer thread arrives on the stage's empty barrier
// (all 128 x CONS arrivals free it) after its own last read of the stage, so each thread's shared-memory reads are
// ordered before the producer's next copy into the stage by that thread's own arrive (release) and the
// producer's wait (acquire). With one arrive per warp by lane 0 after a __syncwarp (8 arrivals),
// compute-sanitizer's racecheck reported every reuse of a stage as a hazard between the bulk copy and the
// other lanes' loads; with every thread arriving it reports none, and the kernels measured the same
// (docs/perf.md, sm90 step 24).
__device__ __forceinline__ void release_stage(uint64_t* empty) { mbar_arrive(empty); }

// One packed k64 chunk kb of the stage at `st` (wgmma descriptor desc0 of its token tile): dequantise each
// of the consumer's 64-row tiles into `a`, then issue the chunk's four k16 wgmmas per tile, k16 step s
// into accumulator set (set0 + s) % kSets. Both schedules below are built from it.
template <class Cfg>
__device__ __forceinline__ void issue_chunk(
    const uint8_t* st, uint64_t desc0, int kb, int set0, int first_tile, int tid,
    float (&acc)[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2],
    uint32_t (&a)[Cfg::kM64PerConsumer][4][4]) {
  constexpr int kMW = Cfg::kM64PerConsumer;
  constexpr int kSets = accumulator_sets<Cfg::kBN>();
#pragma unroll
  for (int u = 0; u < kMW; ++u)
    dequant_chunk(st + Cfg::kTokenBytes + (first_tile + u) * Cfg::kWeightTileBytes + kb * kPackBlockBytes, tid, a[u]);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int u = 0; u < kMW; ++u)
      WgmmaRS<Cfg::kBN>::mma(acc[u][(set0 + s) % kSets], a[u][s],
                             desc0 + static_cast<uint64_t>((kb * Cfg::kTokenSubTileBytes + s * 32) >> 4));
}

// kBody chunks of the pipelined main loop (consume_pipelined); kFirst: the item's first body, where the
// groups the waits retire do not exist yet.
template <class Cfg, bool kFirst>
__device__ __forceinline__ void consume_body(
    uint8_t* smem, uint64_t* full, uint64_t* empty, int first_tile, int tid,
    float (&acc)[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2],
    uint32_t (&a)[a_buffers<Cfg>()][Cfg::kM64PerConsumer][4][4], int& stage, uint32_t& phase, int& release) {
  constexpr int kC = Cfg::kChunksPerStage;
  constexpr int kB = a_buffers<Cfg>();
  constexpr int kBody = kB > kC ? kB : kC;
  static_assert(kBody % kB == 0 && kBody % kC == 0 && 4 % kBody == 0, "buffers and stages must tile the body");
  const uint8_t* st = smem;
  uint64_t desc0 = 0;
#pragma unroll
  for (int j = 0; j < kBody; ++j) {
    const int kb = j % kC, b = j % kB;
    if (kb == 0) {
      mbar_wait(&full[stage], phase);
      fence_proxy_async_smem();
      st = smem + stage * Cfg::kStageBytes;
      desc0 = make_desc_sw128(smem_addr(st));  // offsets below stay inside the 14-bit field
    }
    // Retire group j - kB of this body's numbering (the last reader of buffer b) and release its stage
    // if it was the stage's last chunk; in the first body groups j - kB < 0 do not exist.
    wgmma_wait<kB - 1>();
    if (((j - kB + kBody) % kC) == kC - 1 && (j >= kB || !kFirst)) {
      release_stage(&empty[release]);
      if (++release == Cfg::kStages) release = 0;
    }
    issue_chunk<Cfg>(st, desc0, kb, j * 4, first_tile, tid, acc, a[b]);
    wgmma_commit();
    if (kb == kC - 1 && ++stage == Cfg::kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
}

// The serial schedule: one commit group per stage, wait_group<0> before the stage is released and before
// the next stage writes A registers. Inside a stage the chunks' A fragments live in distinct registers,
// so chunk kb+1 is dequantised while chunk kb's wgmmas run.
template <class Cfg>
__device__ __forceinline__ void consume_serial(
    uint8_t* smem, uint64_t* full, uint64_t* empty, int nstages, int first_tile, int tid,
    float (&acc)[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2], int& stage, uint32_t& phase) {
  constexpr int kC = Cfg::kChunksPerStage;
  for (int ks = 0; ks < nstages; ++ks) {
    mbar_wait(&full[stage], phase);
    fence_proxy_async_smem();
    const uint8_t* st = smem + stage * Cfg::kStageBytes;
    const uint64_t desc0 = make_desc_sw128(smem_addr(st));  // offsets below stay inside the 14-bit field
    uint32_t a[kC][Cfg::kM64PerConsumer][4][4];
#pragma unroll
    for (int kb = 0; kb < kC; ++kb) issue_chunk<Cfg>(st, desc0, kb, kb * 4, first_tile, tid, acc, a[kb]);
    wgmma_commit();
    wgmma_wait<0>();
    release_stage(&empty[stage]);
    if (++stage == Cfg::kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
}

// The pipelined schedule. Chunk c (one packed k64 block of a stage) is dequantised into A buffer c % B
// (B = a_buffers), its wgmmas are issued and committed as group c; before chunk c writes its buffer,
// wait_group<B-1> retires group c-B, the last reader of that buffer, so B-1 chunks of wgmmas stay in
// flight while the next one is dequantised and no wait on the tensor core falls at a stage boundary. A
// stage's shared memory is released (every consumer thread arrives on its empty barrier)
// once the group of its last chunk has retired, up to B-1 chunks late. The first body is peeled so that
// the loop is entered with the same groups in flight as its back edge carries: ptxas then sees each
// buffer rewritten only after the wait that retires its reader (without the peel it reports C7513 and
// serialises every wgmma). check_sass.py verifies on the SASS that no instruction writes an A buffer
// before the HGMMA group reading it has retired.
template <class Cfg>
__device__ __forceinline__ void consume_pipelined(
    uint8_t* smem, uint64_t* full, uint64_t* empty, int nstages, int first_tile, int tid,
    float (&acc)[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2], int& stage, uint32_t& phase) {
  constexpr int kC = Cfg::kChunksPerStage;
  constexpr int kB = a_buffers<Cfg>();
  constexpr int kBody = kB > kC ? kB : kC;          // chunks per loop body (every item has a multiple of 4)
  constexpr int kHeld = kB / kC > 1 ? kB / kC : 1;  // stages still held when the last group retires
  static_assert(Cfg::kStages > kHeld, "the ring must outlast the stages a consumer holds");
  const int total = nstages * kC;
  int release = stage;  // the oldest stage this consumer has not released yet
  uint32_t a[kB][Cfg::kM64PerConsumer][4][4];
  consume_body<Cfg, true>(smem, full, empty, first_tile, tid, acc, a, stage, phase, release);
  for (int c0 = kBody; c0 < total; c0 += kBody)
    consume_body<Cfg, false>(smem, full, empty, first_tile, tid, acc, a, stage, phase, release);
  wgmma_wait<0>();
#pragma unroll
  for (int h = 0; h < kHeld; ++h) {
    release_stage(&empty[release]);
    if (++release == Cfg::kStages) release = 0;
  }
}

// The main loop of one work item: accumulates acc[u][set] over all stages of the item, then sums the
// sets into acc[u][0]. There is no branch between wgmma.fence and the commit (a branch there makes ptxas
// serialise every wgmma): every stage is full (K is padded to kPackKAlign in the packed layout) and a
// tile the producer left out (past the expert's rows) is computed from stale shared memory into
// accumulators that are never stored. stage/phase: the consumer's position in the ring, advanced here.
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
  if constexpr (pipelined_consumer<Cfg>())
    consume_pipelined<Cfg>(smem, full, empty, nstages, first_tile, tid, acc, stage, phase);
  else
    consume_serial<Cfg>(smem, full, empty, nstages, first_tile, tid, acc, stage, phase);
#pragma unroll
  for (int u = 0; u < kMW; ++u)
#pragma unroll
    for (int v = 1; v < kSets; ++v)
#pragma unroll
      for (int i = 0; i < Cfg::kBN / 2; ++i) acc[u][0][i] += acc[u][v][i];
}

// The e4m3 tile's main loop of one work item (one token; the consumer's one 64-row tile `tile` of the
// CTA tile): per packed k64 chunk two m64n8k32 e4m3 wgmmas into a fresh accumulator (sm90_e4m3.h: D's
// column 2j + p is k16 block j's product with the token's half p), then, once they retired, row R0's
// and R1's block factors (the E5M3u scale with the block's activation exponent) applied to block q's two
// columns by one FFMA each. Two chunks per commit group and two A buffers: the next group's codes are
// decoded and its scales and exponents read before wait_group 0 retires the previous group, whose
// accumulators are read after it (read after wait_group 1, ptxas serialises every wgmma: docs/perf.md,
// sm90 step 48). A stage is released once its last group retired (at the next stage's first group, or
// the item's end). Returns the quad's sums f0 (row R0) and f1 (row R1) in every lane; zero: a run-time
// 0 (LaunchParams::zero).
template <class Cfg>
__device__ __forceinline__ void consume_item_e4m3(uint8_t* smem, uint64_t* full, uint64_t* empty, int nstages,
                                                  int tile, int tid, int zero, float& f0, float& f1, int& stage,
                                                  uint32_t& phase) {
  static_assert(Cfg::kE4m3 && Cfg::kChunksPerStage == 4, "the e4m3 tile: four chunks a stage, two groups of two");
  constexpr int kG = 2;  // chunks per commit group
  const int q = tid & 3;
  float acc[kG][4];
  uint32_t a[2][kG][8];
  uint32_t sc[2][kG];  // the quad's scale half-word of block q (row R0 low byte, R1 high)
  int ex[2][kG];       // block q's activation exponent
  f0 = f1 = 0.0f;
  int release = stage;
  for (int ks = 0; ks < nstages; ++ks) {
    mbar_wait(&full[stage], phase);
    fence_proxy_async_smem();
    const uint8_t* sp = smem + stage * Cfg::kStageBytes;
    const uint64_t desc0 = make_desc_sw128(smem_addr(sp));
    const uint8_t* wt = sp + Cfg::kTokenBytes + tile * Cfg::kWeightTileBytes;
    const int* exps = reinterpret_cast<const int*>(sp + Cfg::kE4m3ExponentOffset);
#pragma unroll
    for (int grp = 0; grp < 4 / kG; ++grp) {
      const int b = grp & 1;
#pragma unroll
      for (int c = 0; c < kG; ++c) {
        const int kb = grp * kG + c;
        const uint8_t* blk = wt + kb * kPackBlockBytes;
        e4m3_decode_chunk(blk, tid, a[b][c]);
        sc[b][c] = e4m3_quad_scales(blk, tid);
        ex[b][c] = exps[4 * kb + q];
      }
      wgmma_wait<0>();  // the previous group retired: its accumulators, then its A buffer, are free
      // (The item's first group has no previous one. Accumulators written by anything but the wgmmas, a
      // zero start that this fold could add unguarded, made ptxas serialise every wgmma: C7514.)
      if (grp > 0 || ks > 0) {
#pragma unroll
        for (int c = 0; c < kG; ++c) e4m3_accumulate(acc[c], sc[b ^ 1][c], ex[b ^ 1][c], f0, f1);
      }
      if (grp == 0 && ks > 0) {  // the previous stage's last group retired
        release_stage(&empty[release]);
        if (++release == Cfg::kStages) release = 0;
      }
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < kG; ++c) e4m3_issue_chunk(a[b][c], e4m3_chunk_desc(desc0, grp * kG + c), zero, acc[c]);
      wgmma_commit();
    }
    if (++stage == Cfg::kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int c = 0; c < kG; ++c) e4m3_accumulate(acc[c], sc[1][c], ex[1][c], f0, f1);
  release_stage(&empty[release]);
  f0 = quad_sum(f0);
  f1 = quad_sum(f1);
}

}  // namespace sm90
}  // namespace fp4moe
