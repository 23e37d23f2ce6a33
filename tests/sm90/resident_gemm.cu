// The resident-weights design of docs/perf.md's sm90 step 61, with the family's real math (steps 62-65):
// both GEMMs of GLM-5's TP8 shard for one token (8 routed experts, I = 256, H = 6144, 21.2 MB of NVFP4
// weights) in one launch that reads the kSm90Interleaved layout as the engine packs it. A probe, not a
// tactic: it serves this one shape, and `bench_sm90 --resident` checks its outputs against the CPU
// reference before timing it.
//   - 128 CTAs, 16 a routed pair, four consumer warpgroups each (thread 0 also issues the copies). CTA
//     (j, p) of pair j (expert e = experts[j]) holds, in shared memory, packed FC1 tile p / 2 (32 output
//     columns, gate and up rows) over K half p % 2 (48 k64 blocks, 110,592 contiguous bytes) and FC2's
//     tiles 6p .. 6p + 5 (rows 384p .. 384p + 383) over all of K = 256 (24 blocks, 55,296 contiguous
//     bytes). The token's K half and every FC1 bulk copy (12 mbarriers of four blocks) are issued at the
//     start, the token first: as one 6 KB copy that the threads spread over the B sub-tiles' rows
//     (xstage, step 63; a CTA's copies land in issue order, and the first build's 48 row copies of 128
//     bytes held FC1's first group back by 1 us), or as those 48 copies. FC2's six copies (one a tile)
//     once FC1's fc2_after-th group has landed in the CTA (9 in the benchmark's rows, step 61's best).
//   - FC1: warpgroup w takes block w of each group of four, dequant_chunk and RS wgmma m64n8k16 as the
//     family's consumer does (the token's K half is the B operand: row 0 of 48 swizzled 1 KB sub-tiles
//     whose other rows are zero), two A buffers, one commit group a block; the four accumulators meet in
//     shared memory.
//   - One publication a pair: the CTA's 64 fp32 partial sums to global memory, a GPU-scope fence and a
//     counter per pair that only grows. While the pair's other CTAs publish, each warpgroup dequantises
//     four of its six FC2 blocks (block w of each tile) into registers; once all 16 CTAs have published,
//     every CTA sums the two K halves of all 256 columns, applies SwiGLU (reference.h R3, bf16) and writes
//     FC2's B sub-tiles.
//   - FC2: each warpgroup issues its six blocks' 24 wgmmas (the last two blocks dequantised once the first
//     four's have retired, within 128 registers a thread); the four warpgroups' sums of each row meet in
//     shared memory; y = bf16(sum * s2 * 2^19).
//   - kSplit (step 63, slower): no publication; each FC1 tile's two CTAs are a cluster that exchanges
//     its K halves' sums through distributed shared memory, and FC2 is split by K (see the kernel).
//   - kLL (step 64; 0.3 us faster than the counter once step 65 read the scales early): the sums
//     published as 64-bit (value, epoch) words and polled per FC1 tile by the warpgroup whose FC2 K block
//     needs that tile, FC2's multiply-adds on wgmma or the CUDA cores.
//   - kE4m3 (step 65, the fastest): both GEMMs on the e4m3 tile's math (kSm90E4m3 layout, e4m3 token
//     tiles split from the token's row and from the SwiGLU row, m64n8k32 e4m3 wgmmas).
#include <cooperative_groups.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "fp4moe/dtype.h"
#include "kernels/sm90_wgmma/sm90_consumer.cuh"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"
#include "kernels/sm90_wgmma/sm90_wgmma_ops.cuh"
#include "resident_common.cuh"

namespace fp4moe {
namespace sm90test {

namespace {

using sm90::kPackBlockBytes;
constexpr int kPairs = 8, kParts = 16, kH = 6144, kI = 256;
constexpr int kTiles1 = kI / 32, kChunks1 = kH / 64;    // FC1: 8 packed tiles of 32 columns, 96 k64 blocks
constexpr int kTiles2 = kH / 64, kChunks2 = kI / 64;    // FC2: 96 tiles, 4 blocks
constexpr int kHalfChunks = kChunks1 / 2;               // 48 FC1 blocks a CTA
constexpr int kGroup1 = 4;                              // blocks an FC1 mbarrier covers
constexpr int kGroups1 = kHalfChunks / kGroup1;         // 12
constexpr int kTilesPerPart = kTiles2 / kParts;         // 6
constexpr int kWgs = 4, kThreads = 128 * kWgs;          // one FC1 block of each group, one FC2 block of each tile
constexpr int kBuf = 2;                                 // FC1's A buffers
constexpr int kPre = 4;                                 // FC2 blocks a warpgroup dequantises before the wait
constexpr int kStamps = 9;
constexpr int kCluster = 2;                             // kSplit: an FC1 tile's two K halves
constexpr int kSplitTiles = kTiles2 / kCluster;         // kSplit: FC2 row tiles a CTA takes (48)
constexpr int kHalfBlockBytes = kPackBlockBytes / 2;    // kSplit: FC2 in k32 half blocks (split_fc2_layout)
constexpr int kFc2Bars = kSplitTiles / 4;               // FC2 barriers: 6 tiles, or 12 steps of 4 half blocks
// Shared memory, from a 1024-aligned base: FC1's B sub-tiles, FC2's, FC1 blocks, FC2 blocks, the
// warpgroups' FC1 sums (and the cluster's exchange), the barriers (12 FC1 groups, FC2's, the token's row).
constexpr int kXsBytes = kHalfChunks * 1024, kAsBytes = kChunks2 * 1024;
constexpr int kW1Bytes = kHalfChunks * kPackBlockBytes, kW2Bytes = kTilesPerPart * kChunks2 * kPackBlockBytes;
constexpr int kOffAs = kXsBytes, kOffW1 = kOffAs + kAsBytes, kOffW2 = kOffW1 + kW1Bytes;
constexpr int kXStageBytes = kHalfChunks * 128;         // the token's K half as one copy (xstage)
constexpr int kOffXst = kOffW2 + kW2Bytes, kOffRed = kOffXst + kXStageBytes;
constexpr int kOffBars = kOffRed + (kWgs + kCluster) * 64 * 4;
constexpr int kSmem = kOffBars + (kGroups1 + kFc2Bars + 1) * 8 + 1024;
static_assert(kSplitTiles * kHalfBlockBytes == kW2Bytes && kSplitTiles * 64 * 4 <= kW1Bytes,
              "the split FC2's half blocks fill FC2's region and its rows fit where FC1's blocks were");
static_assert(kWgs == kGroup1 && kWgs == kChunks2, "a warpgroup takes one FC1 block of each group, one FC2 block of each tile");
static_assert(kGroups1 % kBuf == 0 && kPre < kTilesPerPart, "the buffers tile the blocks");
static_assert(kSmem <= 232448, "the resident CTA must fit the sm_90 shared-memory limit");
static_assert(kWgs * 4 * kTilesPerPart * 64 * 4 <= kW1Bytes, "FC2's per-lane sums fit where FC1's blocks were");
static_assert(kHalfChunks / 2 * 1024 <= kXsBytes / 2 && (kHalfChunks + kChunks2) * 4 * 4 + kI * 2 <= kXsBytes / 2,
              "kE4m3: the FC1 token tile fills xs's first half, the exponents and FC2's bf16 row fit in its second");

// Two k16 steps (2h, 2h + 1 of a packed chunk): the thread's two code words at `codes`, its quad's scale
// word at `scales` -> the A registers of the two steps.
__device__ __forceinline__ void dequant_two_steps(const uint8_t* codes, const uint8_t* scales, uint32_t (&a)[2][4]) {
  const uint2 c = *reinterpret_cast<const uint2*>(codes);
  const uint32_t sc = *reinterpret_cast<const uint32_t*>(scales);
  sm90::dequant_kstep<false>(c.x, sc, a[0]);
  sm90::dequant_kstep<true>(c.y, sc, a[1]);
}
__device__ __forceinline__ int quad_of(int tid) { return (tid >> 5) * 8 + ((tid & 31) >> 2); }

// One k32 half block of FC2 (split_fc2_layout): thread T's two code words at 8T, the quad's scale word at
// 1024 + 4 quad.
__device__ __forceinline__ void dequant_half(const uint8_t* block, int tid, uint32_t (&a)[2][4]) {
  dequant_two_steps(block + 8 * tid, block + 1024 + 4 * quad_of(tid), a);
}
// Steps 2h, 2h + 1 of a packed k64 chunk (sm90_layout.h): code words at 16T + 8h, scale word h of the quad.
template <int kH2>
__device__ __forceinline__ void dequant_steps(const uint8_t* block, int tid, uint32_t (&a)[2][4]) {
  dequant_two_steps(block + 16 * tid + 8 * kH2, block + sm90::kPackCodeBytes + 8 * quad_of(tid) + 4 * kH2, a);
}

// FC2's B value of one column from FC1's gate and up sums (the accumulators' scale and the tensor scales in
// sg, su): SwiGLU as reference.h R3 computes it, rounded to bf16.
__device__ __forceinline__ uint16_t swiglu_bf16(float gsum, float usum, float sg, float su) {
  const float gate = gsum * sg, up = usum * su;
  return f32_to_bf16_bits(gate / (1.0f + __expf(-gate)) * up);
}

// kE4m3: lane pair (2 bi, 2 bi + 1) splits k16 block bi of a bf16 row into an e4m3 token tile at `tile`
// (sm90_e4m3.h), lane h = T % 2 taking elements 8h .. 8h + 7 (e4m3_split_half; every lane of the warp
// calls it); the block's exponent goes to exps[bi].
__device__ __forceinline__ void e4m3_split_block(const uint8_t* row, uint8_t* tile, int* exps, int t) {
  const int bi = t / 2, kb = bi / 4, jb = bi % 4, h = t % 2;
  uint2 hi, lo;
  int eb;
  sm90::e4m3_split_half(reinterpret_cast<const uint4*>(row)[t], hi, lo, eb);
  uint8_t* sub = tile + (kb / 2) * 1024 + 8 * h;
  *reinterpret_cast<uint2*>(sub + sm90::e4m3_token_offset(2 * jb, 64 * (kb % 2) + 16 * jb)) = hi;
  *reinterpret_cast<uint2*>(sub + sm90::e4m3_token_offset(2 * jb + 1, 64 * (kb % 2) + 16 * jb)) = lo;
  if (h == 0) exps[bi] = eb;
}

// The flag-in-data publication (kLL): a 64-bit word holds a partial sum's bits and the launch's epoch, so one
// relaxed store publishes both and a reader that sees the epoch has the value (no fence, no counter).
__device__ __forceinline__ void st_relaxed_gpu_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_relaxed_gpu_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// One warpgroup's FC2 wgmmas into kV accumulators (B: the SwiGLU row at desca, kSteps k16 steps). The
// first kPre blocks' A fragments are in a2 already (dequantised while the publication was awaited);
// load(v, a) waits for block v and dequantises it into a, for the other kV - kPre once the first kPre's
// wgmmas have retired (within 128 registers a thread). k16 steps outermost: consecutive wgmmas go to
// different accumulators.
template <int kV, int kPre, int kSteps, class Load>
__device__ __forceinline__ void fc2_wgmmas(float (&acc2)[kV][4], uint32_t (&a2)[kPre][kSteps][4], uint64_t desca,
                                           Load load) {
  static_assert(kV - kPre <= kPre, "the later blocks reuse the first blocks' registers");
#pragma unroll
  for (int v = 0; v < kV; ++v)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      acc2[v][r] = 0.f;
      sm90::reg_fence(acc2[v][r]);
    }
  sm90::wgmma_fence();
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
#pragma unroll
    for (int v = 0; v < kPre; ++v)
      sm90::WgmmaRS<8>::mma(acc2[v], a2[v][s], desca + static_cast<uint64_t>((s * 32) >> 4));
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
#pragma unroll
  for (int v = kPre; v < kV; ++v) load(v, a2[v - kPre]);
  sm90::wgmma_fence();
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
#pragma unroll
    for (int v = kPre; v < kV; ++v)
      sm90::WgmmaRS<8>::mma(acc2[v], a2[v - kPre][s], desca + static_cast<uint64_t>((s * 32) >> 4));
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
}

// kMode, a diagnostic of FC1's main loop: 0 the real math; 1 no dequantisation (the code words go to the
// wgmmas as they are); 2 no FC1 wgmmas (the dequantised registers are consumed by an empty asm); 3 no
// waits (FC1's math on whatever shared memory holds, the barriers drained after it: the math alone); 4 no
// math (the waits alone). Modes 1 to 4 compute wrong results and are only timed.
// kPerCommit: FC1 blocks a commit group covers (1, or 2: blocks wg of groups k and k + 1 together).
// fc2_after: FC2's copies once that many FC1 groups have landed (0: at the start).
// lead: FC1's groups issued `lead` ahead of the one thread 0 waits for (0: all at the start).
// kSplit (docs/perf.md sm90 step 63): each FC1 tile's two CTAs (its K halves) are one cluster and exchange
// their partial sums through distributed shared memory and a cluster barrier instead of the pair's global
// publication; FC2 is then split by K: the CTA of half h multiplies FC2's row tiles 48h .. 48h + 47 over
// the tile's 32 output columns (FC2's K slice, from the half-block layout that split_fc2_layout writes)
// and adds its fp32 sums into yacc (red.global.add.v4.f32; yacc zeroed before the launch), so no CTA
// waits for another cluster.
// kLL (step 64; 0 off, 1 FC2 on wgmma, 2 FC2 on the CUDA cores, 3 as 1 with both tiles awaited before any
// FC2 step): the flag-in-data publication and FC2 by FC1 tiles. Each CTA stores its 64 sums as 64-bit
// words (value, epoch) with relaxed stores, no fence and no counter (the epoch is one more than what the
// CTA's own slot held at entry: every launch writes every slot once). Warpgroup wg's FC2 block (K columns
// 64 wg .. 64 wg + 63) needs only FC1 tiles 2 wg and 2 wg + 1, so it polls those tiles' four CTAs' words
// itself and issues its k16 steps 0-1 once the first tile is seen, 2-3 once the second is: FC2's math
// runs while the later tiles are awaited, and only a warpgroup's last 12 wgmmas follow the last tile.
// kE4m3 (step 65): both GEMMs on the e4m3 tile's math (sm90_e4m3.h; weights in the kSm90E4m3 layout, same
// blocks and copies): the token's K half split into an e4m3 token tile (hi and lo halves of each k16 block
// in B's eight columns), two m64n8k32 e4m3 wgmmas a k64 chunk into fresh accumulators, the block factors
// applied by FFMA once they retired; FC2's B tile from the SwiGLU row the same way after the publication.
template <int kMode, int kPerCommit, bool kSplit, int kLL, bool kE4m3>
__global__ void __launch_bounds__(kThreads, 1)
    resident_gemm_kernel(const uint8_t* __restrict__ fc1, const uint8_t* __restrict__ fc2,
                         const float* __restrict__ s1, const float* __restrict__ s2, const int* __restrict__ experts,
                         const uint16_t* __restrict__ x, float* __restrict__ partials, unsigned* __restrict__ counters,
                         uint16_t* __restrict__ act_out, uint16_t* __restrict__ y, float* __restrict__ yacc,
                         unsigned long long* __restrict__ stamps, unsigned long long* __restrict__ llpart,
                         int fc2_after, int lead, int xstage, int zero) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace fp4moe::sm90;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint8_t* xs = smem;
  uint8_t* as = smem + kOffAs;
  uint8_t* w1 = smem + kOffW1;
  uint8_t* w2 = smem + kOffW2;
  float* red = reinterpret_cast<float*>(smem + kOffRed);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kOffBars);
  uint64_t* xbar = bars + kGroups1 + kFc2Bars;
  const int j = blockIdx.x / kParts, p = blockIdx.x % kParts, t = threadIdx.x;
  const int wg = t / 128, tid = t % 128, w = tid / 32, gq = (tid % 32) / 4, q = tid % 4;
  const int e = experts[j], tile1 = p / 2, half = p % 2;
  // Timeline (globaltimer ns, thread 0): entry, FC1's groups 0, 5 and 11 seen by thread 0, FC1 summed,
  // publication (or the cluster's exchange) seen, FC2's B operand written, FC2's wgmmas retired, end.
  auto stamp = [&](int i) { resident_stamp(stamps == nullptr ? nullptr : stamps + blockIdx.x * kStamps, i); };
  stamp(0);
  // kLL: this launch's epoch, from the CTA's own slot, read after FC1's first step (a fence waits for the
  // thread's loads: read at entry, the fence of the set-up held FC1's start back by 0.4 us).
  unsigned long long own_slot = 0;
  const uint8_t* src2 = fc2 + (int64_t(e) * kTiles2 + kTilesPerPart * p) * kChunks2 * kPackBlockBytes;
  const uint8_t* src1 = fc1 + ((int64_t(e) * kTiles1 + tile1) * kChunks1 + kHalfChunks * half) * kPackBlockBytes;
  auto issue_fc1 = [&](int g) {
    mbar_arrive_expect_tx(&bars[g], kGroup1 * kPackBlockBytes);
    bulk_copy_g2s(w1 + g * kGroup1 * kPackBlockBytes, src1 + g * kGroup1 * kPackBlockBytes, kGroup1 * kPackBlockBytes,
                  &bars[g], policy_evict_first());
  };
  if (t == 0) {
    for (int i = 0; i < kGroups1 + kFc2Bars + 1; ++i) mbar_init(&bars[i], 1);
    fence_barrier_init();
    // The token's K half into row 0 of each B sub-tile: 48 bulk copies of 128 bytes (the first build's
    // plain loads, each a round trip to a cold L2 under the weight stream, held FC1's end back by about
    // 2 us), or (xstage) one copy of 6 KB that the threads then spread over the rows. The token goes
    // first: a CTA's copies land in the order they were issued.
    const uint16_t* xh = x + kHalfChunks * 64 * half;
    mbar_arrive_expect_tx(xbar, kXStageBytes);
    if (xstage == 0)
      for (int c = 0; c < kHalfChunks; ++c) bulk_copy_g2s(xs + c * 1024, xh + c * 64, 128, xbar, policy_evict_normal());
    else
      bulk_copy_g2s(smem + kOffXst, xh, kXStageBytes, xbar, policy_evict_normal());
    for (int g = 0; g < (lead == 0 ? kGroups1 : lead); ++g) issue_fc1(g);
  }
  // The other rows of the B sub-tiles (and all of FC2's) are zero.
  for (int u = t; u < (kXsBytes + kAsBytes) / 16; u += kThreads)
    if (kE4m3 || u % 64 >= 8 || u / 64 >= kHalfChunks) reinterpret_cast<uint4*>(smem)[u] = make_uint4(0, 0, 0, 0);
  fence_proxy_async_smem();
  __syncthreads();
  if constexpr (kSplit) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  // FC1. Every block's addresses are the warpgroup's base plus constants and its group index a constant,
  // so the unrolled steps carry no address work (a first build indexed blocks by 3k + wg: 2 us slower).
  // The first block is dequantised before the token's row is awaited.
  const uint64_t descx = make_desc_sw128(smem_addr(xs)) + static_cast<uint64_t>(wg * (1024 >> 4));
  const uint8_t* w1w = w1 + wg * kPackBlockBytes;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 4; ++r) reg_fence(acc[r]);  // zeroed here, not between the wgmmas (ptxas would serialise them)
  // FC2's bytes: barrier v covers the four blocks that warpgroups 0..3 take at their step v: tile
  // 6p + v's four k64 chunks, or (kSplit) the k32 half blocks `tile1` of row tiles 48 half + 4v + w'.
  auto issue_fc2 = [&] {
    if constexpr (kSplit) {
#pragma unroll 1  // the lambda is inlined at each of FC1's 12 unrolled steps: unrolled, 10k instructions
      for (int v = 0; v < kFc2Bars; ++v) {  // the CTA's 48 half blocks are contiguous (split_fc2_layout)
        mbar_arrive_expect_tx(&bars[kGroups1 + v], kWgs * kHalfBlockBytes);
        const int64_t first = (int64_t(e) * kTiles1 + tile1) * kTiles2 + kSplitTiles * half + kWgs * v;
        bulk_copy_g2s(w2 + kWgs * v * kHalfBlockBytes, fc2 + first * kHalfBlockBytes, kWgs * kHalfBlockBytes,
                      &bars[kGroups1 + v], policy_evict_first());
      }
    } else {
#pragma unroll 1
      for (int v = 0; v < kTilesPerPart; ++v) {
        mbar_arrive_expect_tx(&bars[kGroups1 + v], kChunks2 * kPackBlockBytes);
        bulk_copy_g2s(w2 + v * kChunks2 * kPackBlockBytes, src2 + v * kChunks2 * kPackBlockBytes,
                      kChunks2 * kPackBlockBytes, &bars[kGroups1 + v], policy_evict_first());
      }
    }
  };
  if (fc2_after == 0 && t == 0) issue_fc2();
  // kE4m3: the FC1 token tile (24 sub-tiles) at xs, then in xs's second half FC1's 192 block exponents,
  // FC2's 16, and FC2's SwiGLU row as bf16 before its split; FC2's token tile (2 sub-tiles) at as.
  int* exps1 = reinterpret_cast<int*>(xs + kXsBytes / 2);
  int* exps2 = exps1 + kHalfChunks * 4;
  uint16_t* act_row = reinterpret_cast<uint16_t*>(exps2 + kChunks2 * 4);
  if constexpr (kE4m3) {
    // Per warpgroup: chunk wg of each FC1 group, two chunks a commit group, two A buffers (the family's
    // consume_item_e4m3 order: the next group decoded, wait_group 0, the retired group's accumulators
    // scaled into f0 / f1, the next group issued into them).
    constexpr int kG = 2;
    float d[kG][4], f0 = 0.f, f1 = 0.f;
    uint32_t a[2][kG][8], sc[2][kG];
    int ex[2][kG];
    const uint64_t desc0 = make_desc_sw128(smem_addr(xs));
#pragma unroll
    for (int g = 0; g < kGroups1 / kG; ++g) {
      const int b = g & 1;
#pragma unroll
      for (int c = 0; c < kG; ++c) {
        const int k = kG * g + c;
        mbar_wait(&bars[k], 0);
        if (t == 0) {
          if (k == 0) stamp(1);
          if (k == 5) stamp(2);
          if (k == kGroups1 - 1) stamp(3);
          if (k == fc2_after - 1) issue_fc2();
        }
        const uint8_t* blk = w1w + k * kGroup1 * kPackBlockBytes;
        e4m3_decode_chunk(blk, tid, a[b][c]);
        sc[b][c] = e4m3_quad_scales(blk, tid);
      }
      if (g == 0) {  // the token tile: lanes 2 bi, 2 bi + 1 of threads T < 384 split k16 block bi
        mbar_wait(xbar, 0);
        if (t < kHalfChunks * 8) e4m3_split_block(smem + kOffXst, xs, exps1, t);
        fence_proxy_async_smem();
        __syncthreads();
      }
#pragma unroll
      for (int c = 0; c < kG; ++c) ex[b][c] = exps1[4 * (kGroup1 * (kG * g + c) + wg) + q];
      wgmma_wait<0>();
      if (g > 0) {
#pragma unroll
        for (int c = 0; c < kG; ++c) e4m3_accumulate(d[c], sc[b ^ 1][c], ex[b ^ 1][c], f0, f1);
      }
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < kG; ++c)
        e4m3_issue_chunk(a[b][c], e4m3_chunk_desc(desc0, kGroup1 * (kG * g + c) + wg), zero, d[c]);
      wgmma_commit();
    }
    wgmma_wait<0>();
    constexpr int kLast = (kGroups1 / kG - 1) & 1;  // the last group's buffer
#pragma unroll
    for (int c = 0; c < kG; ++c) e4m3_accumulate(d[c], sc[kLast][c], ex[kLast][c], f0, f1);
    f0 = quad_sum(f0);
    f1 = quad_sum(f1);
    if (q == 0) {
      red[wg * 64 + 16 * w + gq] = f0;
      red[wg * 64 + 16 * w + gq + 8] = f1;
    }
  } else {
  uint32_t a[kBuf][kPerCommit][4][4];
  static_assert(kGroups1 % (kBuf * kPerCommit) == 0, "the buffers tile the blocks");
#pragma unroll  // straight-line code: a rolled loop has ptxas serialise the wgmmas (C7513)
  for (int k0 = 0; k0 < kGroups1; k0 += kPerCommit) {
    const int b = (k0 / kPerCommit) % kBuf;
#pragma unroll
    for (int d = 0; d < kPerCommit; ++d) {
      const int k = k0 + d;
      if constexpr (kMode != 3) mbar_wait(&bars[k], 0);
      if (t == 0) {
        if (k == 0) stamp(1);
        if (k == 5) stamp(2);
        if (k == kGroups1 - 1) stamp(3);
        if (lead != 0 && k + lead < kGroups1) issue_fc1(k + lead);
        if (k == fc2_after - 1) issue_fc2();  // FC1's group fc2_after - 1 has landed
      }
      if (d == 0) wgmma_wait<kBuf - 1>();
      if constexpr (kMode == 4) {
      } else if constexpr (kMode == 1) {
        const uint4 raw = *reinterpret_cast<const uint4*>(w1w + k * kGroup1 * kPackBlockBytes + 16 * tid);
#pragma unroll
        for (int s = 0; s < 4; ++s)
          a[b][d][s][0] = raw.x, a[b][d][s][1] = raw.y, a[b][d][s][2] = raw.z, a[b][d][s][3] = raw.w;
      } else {
        dequant_chunk(w1w + k * kGroup1 * kPackBlockBytes, tid, a[b][d]);
      }
    }
    if (k0 == 0) {
      if constexpr (kMode != 3) mbar_wait(xbar, 0);
      if (xstage != 0) {  // row 0 of sub-tile c = bytes 128c .. 128c + 127 of the staged half
        if (t < kXStageBytes / 16)
          reinterpret_cast<uint4*>(xs + (t / 8) * 1024)[t % 8] = reinterpret_cast<const uint4*>(smem + kOffXst)[t];
        fence_proxy_async_smem();
        __syncthreads();
      }
      if constexpr (kLL != 0) own_slot = ld_relaxed_gpu_u64(llpart + (j * kParts + p) * 64 + t % 64);
    }
    if constexpr (kMode == 4) {
    } else if constexpr (kMode == 2) {
#pragma unroll
      for (int d = 0; d < kPerCommit; ++d)
#pragma unroll
        for (int s = 0; s < 4; ++s)
          asm volatile("" ::"r"(a[b][d][s][0]), "r"(a[b][d][s][1]), "r"(a[b][d][s][2]), "r"(a[b][d][s][3]));
    } else {
      wgmma_fence();
#pragma unroll
      for (int d = 0; d < kPerCommit; ++d)
#pragma unroll
        for (int s = 0; s < 4; ++s)
          WgmmaRS<8>::mma(acc, a[b][d][s],
                          descx + static_cast<uint64_t>(((k0 + d) * kGroup1 * 1024 + s * 32) >> 4));
      wgmma_commit();
    }
  }
  wgmma_wait<0>();
  // Token 0's sums are acc[0] (packed row R0 = 16w + g) and acc[2] (R1 = R0 + 8) of the q = 0 lanes.
  if (q == 0) {
    red[wg * 64 + 16 * w + gq] = acc[0];
    red[wg * 64 + 16 * w + gq + 8] = acc[2];
  }
  }
  __syncthreads();
  stamp(4);
  // The tensor scales with the accumulators' 2^19 (FC1's gate and up, FC2's), read by each path after its
  // own publication or exchange is under way: a GPU-scope fence waits for the thread's loads, and these
  // come from a cold L2 (read at FC2's end, s2's round trip took 0.4 us).
  float sg = 0.f, su = 0.f, s2e = 0.f;
  auto read_scales = [&] {
    sg = s1[2 * e] * kAccumulatorScale;
    su = s1[2 * e + 1] * kAccumulatorScale;
    s2e = s2[e] * kAccumulatorScale;
  };
  // The unsplit FC2's end: the partial sums of each row (acc2[u][0] row R0, acc2[u][2] row R1 of tile u)
  // meet where FC1's blocks were (every warpgroup is past them), kQ sets a warpgroup (1: the q = 0 lanes
  // hold the rows' sums; 4: every lane holds its own K slice's, the e4m3 math's k16 block q, summed here
  // rather than by shuffles), then the CTA's 384 rows go out as bf16.
  auto store_fc2_rows = [&](auto kq, const float(&acc2)[kTilesPerPart][4]) {
    constexpr int kQ = decltype(kq)::value;
    constexpr int n = kTilesPerPart * 64;
    float* red2 = reinterpret_cast<float*>(w1);
    const int slot = kQ == 1 ? wg : kQ * wg + q;
    if (kQ == 4 || q == 0) {
#pragma unroll
      for (int u = 0; u < kTilesPerPart; ++u) {
        red2[slot * n + u * 64 + 16 * w + gq] = acc2[u][0];
        red2[slot * n + u * 64 + 16 * w + gq + 8] = acc2[u][2];
      }
    }
    __syncthreads();
    if (t < n) {
      float v = 0.f;
#pragma unroll
      for (int i = 0; i < kWgs * kQ; ++i) v += red2[i * n + t];
      y[j * kH + n * p + t] = f32_to_bf16_bits(v * s2e);
    }
    __syncthreads();
    stamp(8);
  };
  // The counter publication (the unsplit and e4m3 paths): the CTA's 64 sums to `partials`, then thread 0
  // raises the pair's counter (publish) and later spins until every CTA of the pair has (await_sums); a
  // column's SwiGLU value from the pair's published sums (column c: packed tile c / 32, warp slice
  // (c % 32) / 8, gate row 16 w' + c % 8, up row + 8, both K halves).
  auto publish = [&] {
    if (t < 64) partials[(j * kParts + p) * 64 + t] = red[t] + red[64 + t] + red[128 + t] + red[192 + t];
    __syncthreads();
    return t == 0 ? resident_publish(&counters[j], kParts) : 0u;
  };
  auto await_sums = [&](unsigned target) {
    if (t == 0) resident_wait(&counters[j], target);
    __syncthreads();
    stamp(5);
  };
  auto column_from_partials = [&](int c) {
    const int tt = c / 32, ww = (c % 32) / 8, ii = c % 8;
    const float* pa = partials + (j * kParts + 2 * tt) * 64;
    return swiglu_bf16(__ldcg(pa + 16 * ww + ii) + __ldcg(pa + 64 + 16 * ww + ii),
                       __ldcg(pa + 16 * ww + 8 + ii) + __ldcg(pa + 64 + 16 * ww + 8 + ii), sg, su);
  };
  if constexpr (kMode == 3) {  // the copies the math did not wait for must land before the CTA goes on
    mbar_wait(xbar, 0);
    for (int k = 0; k < kGroups1; ++k) mbar_wait(&bars[k], 0);
  }
  if constexpr (kE4m3) {
    const unsigned target = publish();
    read_scales();
    // FC2's A fragments while the other CTAs publish: chunk wg of the six tiles (48 registers).
    uint32_t a2[kTilesPerPart][8], sc2[kTilesPerPart];
#pragma unroll
    for (int v = 0; v < kTilesPerPart; ++v) {
      mbar_wait(&bars[kGroups1 + v], 0);
      const uint8_t* blk = w2 + (v * kChunks2 + wg) * kPackBlockBytes;
      e4m3_decode_chunk(blk, tid, a2[v]);
      sc2[v] = e4m3_quad_scales(blk, tid);
    }
    await_sums(target);
    if (t < kI) {  // column t into the bf16 row
      const uint16_t h = column_from_partials(t);
      act_row[t] = h;
      if (p == 0) act_out[j * kI + t] = h;
    }
    __syncthreads();
    if (t < kChunks2 * 8) e4m3_split_block(reinterpret_cast<const uint8_t*>(act_row), as, exps2, t);  // 16 blocks
    fence_proxy_async_smem();
    __syncthreads();
    stamp(6);
    float d2[kTilesPerPart][4], acc2[kTilesPerPart][4];
    const uint64_t desc2 = e4m3_chunk_desc(make_desc_sw128(smem_addr(as)), wg);
    wgmma_fence();
#pragma unroll
    for (int v = 0; v < kTilesPerPart; ++v) e4m3_issue_chunk(a2[v], desc2, zero, d2[v]);
    wgmma_commit();
    wgmma_wait<0>();
    __syncthreads();  // the timeline's stamp 7: every warpgroup's FC2 wgmmas retired
    stamp(7);
    const int e2 = exps2[4 * wg + q];
#pragma unroll
    for (int v = 0; v < kTilesPerPart; ++v) {  // block q's share of rows R0 and R1, summed over q by the store
      acc2[v][0] = acc2[v][2] = 0.f;
      e4m3_accumulate(d2[v], sc2[v], e2, acc2[v][0], acc2[v][2]);
    }
    store_fc2_rows(std::integral_constant<int, 4>{}, acc2);
    return;
  }
  if constexpr (kSplit) {
    // The CTA's 64 sums into slot `half` of both CTAs of the cluster, then one cluster barrier (release /
    // acquire); both CTAs have started (the arrive after the set-up, the wait here) before any remote store.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    float* xch = red + kWgs * 64;
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    if (t < 64 * kCluster) {
      const int i = t % 64;
      cluster.map_shared_rank(xch, static_cast<unsigned>(t / 64))[half * 64 + i] =
          red[i] + red[64 + i] + red[128 + i] + red[192 + i];
    }
    // FC2 by K: this CTA's rows are tiles 48 half + 4v + wg' (v < 12, wg' the warpgroup) over the tile's
    // 32 columns, half blocks of 1152 bytes (split_fc2_layout); half of them dequantised before the wait.
    constexpr int kV = kSplitTiles / kWgs, kPre2 = kV / 2;
    auto load = [&](int v, uint32_t(&a)[2][4]) {
      mbar_wait(&bars[kGroups1 + v], 0);
      dequant_half(w2 + (kWgs * v + wg) * kHalfBlockBytes, tid, a);
    };
    uint32_t a2[kPre2][2][4];
#pragma unroll
    for (int v = 0; v < kPre2; ++v) load(v, a2[v]);
    read_scales();
    cluster.sync();
    stamp(5);
    if (t < 32) {  // column 32 tile1 + t: warp slice t / 8, gate row 16 (t / 8) + t % 8, up row + 8
      const int ww = t / 8, ii = t % 8;
      const uint16_t h = swiglu_bf16(xch[16 * ww + ii] + xch[64 + 16 * ww + ii],
                                     xch[16 * ww + 8 + ii] + xch[64 + 16 * ww + 8 + ii], sg, su);
      reinterpret_cast<uint16_t*>(as)[t] = h;
      if (half == 0) act_out[j * kI + 32 * tile1 + t] = h;
    }
    fence_proxy_async_smem();
    __syncthreads();
    stamp(6);
    float acc2[kV][4];
    fc2_wgmmas(acc2, a2, make_desc_sw128(smem_addr(as)), load);
    stamp(7);
    // Rows 64 (4v + wg) + 16w + g (+ 8) of the CTA's 3072, where FC1's blocks were, then into yacc by
    // 16-byte reductions.
    float* out = reinterpret_cast<float*>(w1);
    if (q == 0) {
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        out[(kWgs * v + wg) * 64 + 16 * w + gq] = acc2[v][0];
        out[(kWgs * v + wg) * 64 + 16 * w + gq + 8] = acc2[v][2];
      }
    }
    __syncthreads();
    for (int u = t; u < kSplitTiles * 16; u += kThreads) {
      const float4 v = reinterpret_cast<const float4*>(out)[u];
      float* dst = yacc + j * kH + kSplitTiles * 64 * half + 4 * u;
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(v.x * s2e), "f"(v.y * s2e),
                   "f"(v.z * s2e), "f"(v.w * s2e)
                   : "memory");
    }
    __syncthreads();
    stamp(8);
    return;
  }
  if constexpr (kLL != 0) {
    const unsigned epoch = static_cast<unsigned>(own_slot >> 32) + 1;
    if (t < 64)
      st_relaxed_gpu_u64(llpart + (j * kParts + p) * 64 + t,
                         (static_cast<unsigned long long>(epoch) << 32) |
                             __float_as_uint(red[t] + red[64 + t] + red[128 + t] + red[192 + t]));
    read_scales();
    // Lane (c, q) of warpgroup wg polls word q of FC1 column c = 8 w + g of tiles 2 wg and 2 wg + 1 (gate /
    // up (q / 2) of K half q % 2). The first loads go out now: a load returns only after the CTA's FC2
    // copies issued before it have landed, and those are what FC2's A fragments below wait for.
    const unsigned long long* srca = llpart + (j * kParts + 4 * wg + q % 2) * 64 + 16 * w + gq + 8 * (q / 2);
    const unsigned long long* srcb = srca + 2 * 64;  // FC1 tile 2 wg + 1: CTAs 4 wg + 2, 4 wg + 3
    auto ready = [&](unsigned long long v) { return static_cast<unsigned>(v >> 32) == epoch; };
    unsigned long long va = ld_relaxed_gpu_u64(srca), vb = ld_relaxed_gpu_u64(srcb);
    // A fragments: steps 0-1 of the six tiles' block wg, steps 2-3 of tiles 0 and 1 (64 registers).
    uint32_t r01[kTilesPerPart][2][4], r23[2][2][4];
#pragma unroll
    for (int v = 0; v < kTilesPerPart; ++v) {
      mbar_wait(&bars[kGroups1 + v], 0);
      if (v == 3) {  // asked again, later (the FC1 sums of the slower CTAs), still ahead of FC2's last bytes
        va = ld_relaxed_gpu_u64(srca);
        vb = ld_relaxed_gpu_u64(srcb);
      }
      dequant_steps<0>(w2 + (v * kChunks2 + wg) * kPackBlockBytes, tid, r01[v]);
      if (v < 2) dequant_steps<1>(w2 + (v * kChunks2 + wg) * kPackBlockBytes, tid, r23[v]);
    }
    // FC1 tile tt's 32 SwiGLU values into row 0 of B sub-tile wg (columns 32 tt .. 32 tt + 31).
    stamp(5);
    while (!ready(va) || (kLL == 3 && !ready(vb))) {  // kLL 3: both tiles before any FC2 step
      if (!ready(va)) va = ld_relaxed_gpu_u64(srca);
      if (!ready(vb)) vb = ld_relaxed_gpu_u64(srcb);
    }
    auto take_tile = [&](int tt, unsigned long long v) {
      const int c = 8 * w + gq;
      const float f = __uint_as_float(static_cast<unsigned>(v));
      const float pair = f + __shfl_xor_sync(0xffffffffu, f, 1);       // q 0, 1: gate; q 2, 3: up
      const float other = __shfl_xor_sync(0xffffffffu, pair, 2);
      if (q == 0) {
        const uint16_t h = swiglu_bf16(pair, other, sg, su);
        reinterpret_cast<uint16_t*>(as + wg * 1024)[32 * (tt % 2) + c] = h;
        if (p == 0) act_out[j * kI + 32 * tt + c] = h;
      }
      fence_proxy_async_smem();
      named_barrier_sync(1 + wg, 128);
    };
    const uint64_t descb = make_desc_sw128(smem_addr(as)) + static_cast<uint64_t>(wg * (1024 >> 4));
    float acc2[kTilesPerPart][4];
#pragma unroll
    for (int v = 0; v < kTilesPerPart; ++v)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        acc2[v][r] = 0.f;
        reg_fence(acc2[v][r]);
      }
    // FC2's k16 steps 2h, 2h + 1 of the six tiles once FC1 tile 2 wg + h is in B: wgmmas (kLL 1), or (kLL 2)
    // fp32 FMAs on the CUDA cores with the same bf16 A registers (each lane sums its 16 of the block's 64
    // K columns, rows R0 and R1 into acc2[v][0] and acc2[v][2]; the quad's lanes are summed after).
    auto fc2_pair = [&](int h, auto&& regs) {
      if constexpr (kLL != 2) {
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
          for (int v = 0; v < kTilesPerPart; ++v)
            WgmmaRS<8>::mma(acc2[v], regs(v)[s], descb + static_cast<uint64_t>(((2 * h + s) * 32) >> 4));
        wgmma_commit();
        wgmma_wait<0>();
      } else {
        const uint8_t* brow = as + wg * 1024;  // row 0 of the sub-tile: plain bf16 columns
        float xs4[2][4];
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const uint32_t x0 = *reinterpret_cast<const uint32_t*>(brow + 2 * (16 * (2 * h + s) + 2 * q));
          const uint32_t x8 = *reinterpret_cast<const uint32_t*>(brow + 2 * (16 * (2 * h + s) + 2 * q + 8));
          xs4[s][0] = __uint_as_float(x0 << 16), xs4[s][1] = __uint_as_float(x0 & 0xFFFF0000u);
          xs4[s][2] = __uint_as_float(x8 << 16), xs4[s][3] = __uint_as_float(x8 & 0xFFFF0000u);
        }
        auto lo = [](uint32_t x) { return __uint_as_float(x << 16); };
        auto hi = [](uint32_t x) { return __uint_as_float(x & 0xFFFF0000u); };
#pragma unroll
        for (int v = 0; v < kTilesPerPart; ++v)
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            const uint32_t* a = regs(v)[s];
            acc2[v][0] = fmaf(lo(a[0]), xs4[s][0], acc2[v][0]);
            acc2[v][0] = fmaf(hi(a[0]), xs4[s][1], acc2[v][0]);
            acc2[v][0] = fmaf(lo(a[2]), xs4[s][2], acc2[v][0]);
            acc2[v][0] = fmaf(hi(a[2]), xs4[s][3], acc2[v][0]);
            acc2[v][2] = fmaf(lo(a[1]), xs4[s][0], acc2[v][2]);
            acc2[v][2] = fmaf(hi(a[1]), xs4[s][1], acc2[v][2]);
            acc2[v][2] = fmaf(lo(a[3]), xs4[s][2], acc2[v][2]);
            acc2[v][2] = fmaf(hi(a[3]), xs4[s][3], acc2[v][2]);
          }
      }
    };
    take_tile(2 * wg, va);
    stamp(6);
    fc2_pair(0, [&](int v) -> uint32_t(&)[2][4] { return r01[v]; });
#pragma unroll
    for (int v = 2; v < kTilesPerPart; ++v)  // steps 2-3 of tiles 2..5, where steps 0-1 were
      dequant_steps<1>(w2 + (v * kChunks2 + wg) * kPackBlockBytes, tid, r01[v - 2]);
    while (!ready(vb)) vb = ld_relaxed_gpu_u64(srcb);
    take_tile(2 * wg + 1, vb);
    stamp(7);
    fc2_pair(1, [&](int v) -> uint32_t(&)[2][4] { return v < 2 ? r23[v] : r01[v - 2]; });
    if constexpr (kLL == 2) {
#pragma unroll
      for (int v = 0; v < kTilesPerPart; ++v)
#pragma unroll
        for (int r = 0; r < 4; r += 2) {
          acc2[v][r] += __shfl_xor_sync(0xffffffffu, acc2[v][r], 1);
          acc2[v][r] += __shfl_xor_sync(0xffffffffu, acc2[v][r], 2);
        }
    }
    store_fc2_rows(std::integral_constant<int, 1>{}, acc2);
    return;
  }
  const unsigned target = publish();  // the wait comes after FC2's first dequantisation
  read_scales();
  // FC2's A fragments while the other CTAs publish: block wg of tiles 0 .. kPre - 1.
  auto load = [&](int v, uint32_t(&a)[4][4]) {
    mbar_wait(&bars[kGroups1 + v], 0);
    dequant_chunk(w2 + (v * kChunks2 + wg) * kPackBlockBytes, tid, a);
  };
  uint32_t a2[kPre][4][4];
#pragma unroll
  for (int v = 0; v < kPre; ++v) load(v, a2[v]);
  await_sums(target);
  if (t < kI) {  // column t into B sub-tile t / 64
    const uint16_t h = column_from_partials(t);
    reinterpret_cast<uint16_t*>(as + (t / 64) * 1024)[t % 64] = h;
    if (p == 0) act_out[j * kI + t] = h;
  }
  fence_proxy_async_smem();
  __syncthreads();
  stamp(6);
  // FC2: warpgroup wg multiplies block wg (K = 64 wg .. 64 wg + 63) of each of the six tiles.
  float acc2[kTilesPerPart][4];
  fc2_wgmmas(acc2, a2, make_desc_sw128(smem_addr(as)) + static_cast<uint64_t>(wg * (1024 >> 4)), load);
  stamp(7);
  store_fc2_rows(std::integral_constant<int, 1>{}, acc2);
#endif
}

}  // namespace

int resident_gemm_pairs() { return kPairs; }
int resident_gemm_hidden() { return kH; }
int resident_gemm_inter() { return kI; }
int resident_gemm_stamps() { return kStamps; }

// fc1 / fc2: kSm90Interleaved weights of E >= max(experts) + 1 experts (FC1 n = 256, k = 6144; FC2 n = 6144,
// k = 256); s1 [E][2], s2 [E]; experts [8] on the device; x: one bf16 row of 6144; partials: 8 * 16 * 64
// fp32; counters: 8, zero once before the first launch; act: 8 x 256 bf16 (FC1's output, for the check);
// y: 8 x 6144 bf16 (FC2's rows); yacc: 8 x 6144 fp32, zero before each split launch, which adds FC2's rows
// into it instead of writing y; stamps: null or kStamps x 128 globaltimer values (see the kernel);
// llpart: kLL's 8 * 16 * 64 words (value, epoch), zero once before the first launch; mode: kMode (0 the real
// math, 1 to 4 diagnostics); per_commit: kPerCommit (1 or 2, 2 with mode 0 only); fc2_after: 0 .. 12;
// lead: 0 .. 11; split: kSplit (mode 0, one block a commit group only; fc2 then in split_fc2_layout's
// half blocks); clustered: the unsplit kernel launched in clusters of two (placement only); xstage: the
// token's K half by one bulk copy and a spread in shared memory instead of 48 row copies; ll: kLL (0 to 3;
// mode 0, one block a commit group, not with split); e4m3: kE4m3 (fc1 / fc2 in the kSm90E4m3 layout; mode
// 0, one block a commit group, xstage, lead 0, not with split or ll).
cudaError_t launch_resident_gemm(const void* fc1, const void* fc2, const float* s1, const float* s2,
                                 const int* experts, const void* x, float* partials, unsigned* counters, void* act,
                                 void* y, float* yacc, unsigned long long* stamps, unsigned long long* llpart,
                                 int mode, int per_commit, int fc2_after, int lead, bool split, bool clustered,
                                 bool xstage, int ll, bool e4m3, cudaStream_t s) {
  if (mode < 0 || mode > 4 || (per_commit != 1 && per_commit != 2) || fc2_after < 0 || fc2_after > kGroups1 ||
      lead < 0 || lead >= kGroups1 || ll < 0 || ll > 3 || ((split || ll != 0) && (mode != 0 || per_commit != 1)) ||
      (split && ll != 0) || (per_commit == 2 && mode != 0) || (ll != 0 && llpart == nullptr) ||
      (e4m3 && (mode != 0 || per_commit != 1 || split || ll != 0 || !xstage || lead != 0)))
    return cudaErrorInvalidValue;
  using Kernel = void (*)(const uint8_t*, const uint8_t*, const float*, const float*, const int*, const uint16_t*,
                          float*, unsigned*, uint16_t*, uint16_t*, float*, unsigned long long*, unsigned long long*,
                          int, int, int, int);
  const Kernel kernels[5] = {resident_gemm_kernel<0, 1, false, 0, false>, resident_gemm_kernel<1, 1, false, 0, false>,
                             resident_gemm_kernel<2, 1, false, 0, false>, resident_gemm_kernel<3, 1, false, 0, false>,
                             resident_gemm_kernel<4, 1, false, 0, false>};
  const Kernel kernel = split             ? resident_gemm_kernel<0, 1, true, 0, false>
                        : ll == 1         ? resident_gemm_kernel<0, 1, false, 1, false>
                        : ll == 2         ? resident_gemm_kernel<0, 1, false, 2, false>
                        : ll == 3         ? resident_gemm_kernel<0, 1, false, 3, false>
                        : e4m3            ? resident_gemm_kernel<0, 1, false, 0, true>
                        : per_commit == 2 ? resident_gemm_kernel<0, 2, false, 0, false>
                                          : kernels[mode];
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kPairs * kParts);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = s;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  // A cluster's CTAs are consecutive: p = 2 tile1 + half. `clustered` launches the unsplit kernel the same
  // way (a diagnostic of the placement alone).
  attr.val.clusterDim.x = split || clustered ? kCluster : 1;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = split || clustered ? 1 : 0;
  if (split || clustered) {  // every cluster must be resident at once
    int clusters = 0;
    const cudaError_t occ = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (occ != cudaSuccess) return occ;
    if (clusters < kPairs * kParts / kCluster) return cudaErrorCooperativeLaunchTooLarge;
  }
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<const uint8_t*>(fc1), static_cast<const uint8_t*>(fc2), s1, s2,
                            experts, static_cast<const uint16_t*>(x), partials, counters, static_cast<uint16_t*>(act),
                            static_cast<uint16_t*>(y), yacc, stamps, llpart, fc2_after, lead, xstage ? 1 : 0, 0);
}

// FC2's kSm90Interleaved blocks (E experts x 96 tiles x 4 k64 chunks, 2304 bytes each) as the split
// launch reads them: each block (e, tile, chunk c) as two k32 half blocks of 1152 bytes, half h (K slice
// 32 (2c + h) .. + 31, the columns of FC1 tile 2c + h) at index (8e + 2c + h) * 96 + tile, so that the 48
// that one CTA reads are contiguous: thread T's code words 2h, 2h + 1 (bytes 16T + 8h .. + 7) at 8T, then
// quad g's scale word h (bytes 2048 + 8g + 4h .. + 3) at 1024 + 4g. Host code; `out` holds as many bytes
// as `packed`.
void split_fc2_layout(const uint8_t* packed, uint8_t* out, int experts) {
  for (int64_t b = 0; b < int64_t(experts) * kTiles2 * kChunks2; ++b)
    for (int h = 0; h < 2; ++h) {
      const int64_t e = b / (kTiles2 * kChunks2), tile = (b / kChunks2) % kTiles2, c = b % kChunks2;
      const uint8_t* src = packed + b * kPackBlockBytes;
      uint8_t* dst = out + ((kTiles1 * e + 2 * c + h) * kTiles2 + tile) * kHalfBlockBytes;
      for (int t = 0; t < 128; ++t)
        for (int i = 0; i < 8; ++i) dst[8 * t + i] = src[16 * t + 8 * h + i];
      for (int g = 0; g < 32; ++g)
        for (int i = 0; i < 4; ++i) dst[1024 + 4 * g + i] = src[sm90::kPackCodeBytes + 8 * g + 4 * h + i];
    }
}

// How many of the split launch's 2-CTA clusters the device holds at once (it needs 64), or -1.
int resident_gemm_max_clusters() {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kPairs * kParts);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = kCluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = -1;
  if (cudaFuncSetAttribute(resident_gemm_kernel<0, 1, true, 0, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           kSmem) != cudaSuccess)
    return -1;
  return cudaOccupancyMaxActiveClusters(&n, resident_gemm_kernel<0, 1, true, 0, false>, &cfg) == cudaSuccess ? n : -1;
}

}  // namespace sm90test
}  // namespace fp4moe
