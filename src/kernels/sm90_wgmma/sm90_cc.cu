// The sm90 resident tactic (docs/perf.md, sm90 steps 66-67 and 73): one token per expert, one CTA per (grouped
// row, 16 SwiGLU columns), every weight byte of the CTA in flight from its start, the math on the CUDA
// cores as f16x2, and no CTA waiting for another's result.
//
// Why: at one row per expert (the TP8 shard at T = 1: 8 rows of I = 256) the wgmma tiles put the token on
// one of wgmma's eight N columns and split FC1 by K across CTAs (M = 64 weight rows), so FC2 waited for a
// publication of FC1's sums: the chain measured 20.2 us against an 8.5 us target. Step 66's probe
// (tests/sm90/resident_cc.cu) gave each CTA whole SwiGLU columns over all of K and reached 10.7 us with
// its output's memset. This tactic is that design made general (any row count, hidden a multiple of 1024 up to 8192,
// inter a multiple of 16, up to 1024 experts, the folded last expert) with two changes:
//   - the grid is rows x parts: CTA (r, p) finds row r's expert in the offsets (one round trip: a warp's
//     lanes read all the bounds at once and count those at or below r) and leaves at once when r is past
//     offsets[E];
//   - FC2's partial rows are added into an fp32 row of the workspace (red.global.add.v4.f32) and the
//     last of the row's CTAs to arrive (a counter per row) converts it to bf16 and zeroes it and the
//     counter again, so the launch needs no memset and leaves the workspace zero. The fp32 sum's order
//     varies from launch to launch, so FC2's output may differ in the last bf16 bit between launches.
//     FC1's input rows may share a buffer with FC2's output rows (the engine's grouped copy in y) where FC1
//     reads them without an index: row r's output is written only once each of its CTAs has its copy of
//     row r; through an index, a row could still be due to another row's CTAs.
// Per CTA (16 math warps and a producer warp, step 73):
//   the producer: after the lookup, the token's copy, FC1's chunks, then (once two thirds of FC1's have landed,
//        so that FC1's bytes come first) FC2's, then it leaves. Issuing a bulk copy takes about 0.1 us, so the
//        math warps, which issued nothing, start on the token as it lands instead of 2 us later.
//   FC1: the token's bf16 row and hidden / 512 chunks of 9,216 bytes; warp w takes SwiGLU column 16p + w
//        (its gate and up rows), lane l the chunk's k16 block l; each k16 block of the token is scaled by its
//        own power of two into [2^13, 2^14) and stored as f16 (no CTA-wide maximum before the conversion); a
//        block's 16 products sum in f16x2 (at most 96 in magnitude), are multiplied by the block's e4m3 scale
//        in f16 (at most 43,008 < 65,504) and added in fp32 times the token block's 2^(14 - e).
//   FC2: hidden / 1024 chunks; thread t takes output rows 4v .. 4v + 3 (v = t mod 256) of chunks t / 256,
//        + 2, .. over the part's k16 block (the 16 SwiGLU values, likewise scaled into [2^13, 2^14) as f16).
//   The bytes of each chunk and the decode: sm90_cc_layout.h.
// The chained launch's spread form (docs/perf.md sm90 step 70), for one token with its shared expert folded
// in as the last expert (GLM-5's TP8 shard at T = 1: 8 routed rows and the shared expert's, 144 CTAs of which
// 12 made a second wave): the last expert's row has no CTAs of its own; CTA (r, p) of the 8 routed rows also
// computes its column pair q = parts r + p (SwiGLU columns 2q, 2q + 1: in FC1 chunk c, warps 4 (c mod 4) .. + 3
// take its gate and up rows beside their own, and in FC2 every thread its plane's four rows beside its own),
// so 128 CTAs hold both experts in one wave, with 26,112 more bytes of shared memory each at hidden 6144.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "common/env.h"
#include "common/front_block.cuh"
#include "common/pdl_launch.h"
#include "fp4moe/dtype.h"
#include "kernels/families.h"
#include "kernels/sm90_wgmma/sm90_cc.h"
#include "kernels/sm90_wgmma/sm90_chain_routing.cuh"
#include "kernels/sm90_wgmma/sm90_cc_layout.h"
#include "kernels/sm90_wgmma/sm90_cc_math.cuh"
#include "kernels/sm90_wgmma/sm90_e4m3.h"
#include "kernels/sm90_wgmma/sm90_family.h"
#include "kernels/sm90_wgmma/sm90_pack.h"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"
#include "kernels/sm90_wgmma/sm90_trace.cuh"

namespace fp4moe {
namespace sm90 {

namespace {

// What a launch runs: FC1 alone (SwiGLU rows out), FC2 alone (FC1's rows in), or both (the chain).
// The chain's forms are builds of their own, so that the plain chain carries neither's code: kCcSpread (the
// spread form's slices and math) and kCcRoute (the routing prologue's call).
// kCcNoMath, in a build with FP4MOE_SM90_TRACE only (the timeline's diagnostic builds): the plain chain waits for
// every chunk and does no math, so its output is wrong (FP4MOE_SM90_CC_NOMATH=1, timed only).
enum CcMode : int { kCcFc1 = 1, kCcFc2 = 2, kCcChain = 3, kCcSpread = 4, kCcRoute = 8, kCcNoMath = 16 };
constexpr int kCcMathWarps = kCcThreads / 32;
// The math warps' barrier once the producer warp has gone its own way (named barrier 1).
__device__ __forceinline__ void cc_math_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kCcThreads) : "memory"); }
constexpr int kCcModes[] = {kCcFc1, kCcFc2, kCcChain, kCcChain | kCcSpread, kCcChain | kCcRoute,
                            kCcChain | kCcSpread | kCcRoute
#ifdef FP4MOE_SM90_TRACE
                            ,
                            kCcChain | kCcNoMath
#endif
};

struct CcParams {
  const int32_t* offsets = nullptr;      // [E + 1]
  const uint16_t* a = nullptr;           // FC1 (and the chain): token rows; FC2 alone: FC1's output rows
  const int32_t* a_row_index = nullptr;  // or null: grouped row r reads row a_row_index[r] of a
  int64_t a_ld = 0;
  const uint8_t* w1 = nullptr;           // FC1, kSm90Cc; the last expert's own buffer or null
  const float* s1 = nullptr;             // [E][2]
  const uint8_t* w1_last = nullptr;
  const float* s1_last = nullptr;        // [2]
  const uint8_t* w2 = nullptr;           // FC2, kSm90Cc
  const float* s2 = nullptr;             // [E]
  const uint8_t* w2_last = nullptr;
  const float* s2_last = nullptr;        // [1]
  uint16_t* h = nullptr;                 // FC1's output [rows, inter] (FC1, chain)
  uint16_t* y = nullptr;                 // FC2's output [rows, hidden] (FC2, chain)
  int* counters = nullptr;               // [rows], zero at rest (FC2, chain)
  float* acc = nullptr;                  // [rows, hidden] fp32, zero at rest (FC2, chain)
  int experts = 0, hidden = 0, inter = 0, parts = 0;
  int spread = 0;                        // the chain's spread form: kCcSpreadRows, else 0 (Sm90CcTactic::launch)
  int route = 0;                         // the chain routes and groups its batch itself (GroupedGemmArgs::routing)
  RouteFront front;                      // ... as the fused front end does (common/front_block.cuh); a = token rows
  int fp32_out = 0;                      // the chain leaves FC2's fp32 rows to the caller (fp32_rows_to_caller)
  // The next kernel of the stream scheduled at this one's start (griddepcontrol.launch_dependents: its CTAs take
  // SMs as this one's leave and wait for its end in their pdl_wait) instead of at its CTAs' exit; 0 with
  // FP4MOE_SM90_CC_EARLY_TRIGGER=0.
  int early_trigger = 1;
  int fc2_after = -1;                    // the chain: FC2's copies once FC1's chunk fc2_after - 1 has landed (0: at
                                         // the start with FC1's; -1: two thirds of FC1's chunks, 8 of 12 at hidden
                                         // 6144; FP4MOE_SM90_CC_FC2_AFTER)
};

// *p += v at GPU scope with acquire-release semantics; the old value.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// Row r's expert: e with offsets[e] <= r < offsets[e + 1] (offsets[0] = 0, non-decreasing), or -1 when r is
// past offsets[E]. Warp-wide (all 32 lanes), E <= 1024. The bounds are non-decreasing, so e is the number of
// experts whose upper bound offsets[e' + 1] is <= r (E when r is past offsets[E]): lane l counts experts
// 32j + l over j = 0..31, all 32 loads unconditional (the index clamped to offsets[E], counted only below E)
// and independent, so the lookup costs one round trip to L2; then the warp sums the counts.
__device__ __forceinline__ int cc_find_expert(const int32_t* __restrict__ off, int E, int r, int lane) {
  int below = 0;
#pragma unroll
  for (int j = 0; j < kCcMaxExperts / 32; ++j) {
    const int e = 32 * j + lane;
    const int bound = off[min(e + 1, E)];
    below += e < E && bound <= r ? 1 : 0;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) below += __shfl_xor_sync(0xFFFFFFFFu, below, o);
  return below < E ? below : -1;
}

// The chained launch's own routing (CcParams::route): every CTA routes and groups the batch in the chunk area
// of its shared memory (common/front_block.cuh; no copy is issued before the kernel's next barrier), block 0
// also storing ids, weights, offsets, gather and pair_pos; then row's expert and token and the spread form's
// condition (as the lookup below finds them) into out[0..2]. The scratch (front_scratch_in), then:
constexpr int kCcRouteOffOffset = kFrontAreaEnd;                                    // the row offsets
constexpr int kCcRouteSrcOffset = kCcRouteOffOffset + 4 * (kFrontMaxExperts + 2);  // each row's token
constexpr int kCcRouteEnd = kCcRouteSrcOffset + 4 * kFrontMaxRows;
static_assert(kCcRouteEnd <= 3 * kCcChunkBytes,
              "the routing's scratch fits the chained launch's chunk area (3 chunks at hidden 1024)");
// Not inlined: the routing's code (both rules) would sit in front of the kernel's own (sm90 step 31's
// lesson for the wgmma chain). `f` is the kernel's RouteFront copied into shared memory.
__device__ __noinline__ void cc_route_prologue(const RouteFront& f, uint8_t* area, int experts, int row, int R,
                                               int* out) {
  int32_t* s_off = reinterpret_cast<int32_t*>(area + kCcRouteOffOffset);
  int32_t* s_src = reinterpret_cast<int32_t*>(area + kCcRouteSrcOffset);
  const FrontScratch fs = front_scratch_in(area, s_src, s_off);
  if (f.sigmoid)
    front_route_permute<true, 8>(f, fs, blockIdx.x == 0);
  else
    front_route_permute<false, 8>(f, fs, blockIdx.x == 0);
  // (front_route_permute ends with a barrier: s_off and s_src complete.)
  const int tid = threadIdx.x, lane = tid & 31;
  if (tid < 32) {
    int below = 0;
    for (int e = lane; e < experts; e += 32) below += s_off[e + 1] <= row ? 1 : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) below += __shfl_xor_sync(0xFFFFFFFFu, below, o);
    const bool bounds = s_off[experts - 1] == R && s_off[experts] == R + 1;
    const bool same = lane > R || !bounds || s_src[lane] == s_src[0];  // rows 0 .. R exist where bounds holds
    const bool ok = __all_sync(0xFFFFFFFFu, same) && bounds && R > 0;
    if (lane == 0) {
      out[0] = below < experts ? below : -1;
      out[1] = row < s_off[experts] ? s_src[row] : 0;
      out[2] = ok ? 1 : 0;
    }
  }
  fence_proxy_async_smem();  // the scratch bytes before the copies (the async proxy) overwrite them
}

template <int kMode>
__global__ void __launch_bounds__(kCcLaunchThreads, 1) sm90_cc_resident_kernel(const __grid_constant__ CcParams prm) {
  constexpr bool kFc1 = (kMode & kCcFc1) != 0, kFc2 = (kMode & kCcFc2) != 0;
  constexpr bool kSpread = (kMode & kCcSpread) != 0 && kFc1 && kFc2, kRoute = (kMode & kCcRoute) != 0 && kFc1 && kFc2;
  constexpr bool kNoMath = (kMode & kCcNoMath) != 0;
  constexpr int kSlot = kFc1 && kFc2 ? 2 : (kFc1 ? 0 : 1);  // the timeline's slot (sm90_trace.cuh): chained, FC1, FC2
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int H = prm.hidden, I = prm.inter, R = kSpread ? prm.spread : 0;
  const int n1 = kFc1 ? H / kCcChunkK : 0, n2 = kFc2 ? H / kCcChunkRows : 0, nch = n1 + n2;
  const int row = static_cast<int>(blockIdx.x / prm.parts), p = static_cast<int>(blockIdx.x % prm.parts);
  const int fc2_after = !(kFc1 && kFc2) ? 0 : prm.fc2_after < 0 ? 2 * n1 / 3 : min(prm.fc2_after, n1);
  // Shared memory: [the token bf16 (2H), its f16 copy (2H)] where FC1 runs, the chunks, [the spread form's
  // slices: n1 of FC1's, n2 of FC2's], nch + 1 barriers, the reduction floats (cc_smem_bytes,
  // cc_spread_smem_bytes).
  uint8_t* chunks = smem + (kFc1 ? 4 * H : 0);
  uint8_t* spread1 = chunks + nch * kCcChunkBytes;
  uint8_t* spread2 = spread1 + n1 * kCcSpread1Bytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(R > 0 ? spread2 + n2 * kCcSpread2Bytes : spread1);
  float* red = reinterpret_cast<float*>(bars + nch + 1);
  int* red_i = reinterpret_cast<int*>(red);
  // The lookup's results (expert, token row, spread form) in red[16..18]: free until FC1's sums, which every
  // math warp writes only after a barrier that each passes once it has read them.
  int* look = red_i + 16;

  if (prm.early_trigger) pdl_launch_dependents();
  const bool producer = warp == kCcMathWarps;
  if (producer && lane == 0) {  // nothing of an earlier kernel is read: the barriers' own shared memory
    for (int c = 0; c <= nch; ++c) mbar_init(&bars[c], 1);
    fence_barrier_init();
  }
  pdl_wait();  // the offsets (or logits), the rows and the workspace come from earlier kernels of the stream
  // The timeline (a build with FP4MOE_SM90_TRACE, sm90_trace.cuh, in the launch's slot): kCcTrace* words.
  if (tid == 0) {
    FP4MOE_TRACE_PUT(kSlot, 0, FP4MOE_TRACE_SMID());
    FP4MOE_TRACE_PUT(kSlot, 1, FP4MOE_TRACE_NOW());
    FP4MOE_TRACE_PUT(kSlot, 3, nch);
  }
  if (kRoute) {
    RouteFront* s_front = reinterpret_cast<RouteFront*>(chunks + kFrontAreaRouteFront);
    if (tid == 0) *s_front = prm.front;  // constant-bank loads here, shared-memory loads in the call
    __syncthreads();
    cc_route_prologue(*s_front, chunks, prm.experts, row, R, look);
  } else if (warp == 0) {
    const int e = cc_find_expert(prm.offsets, prm.experts, row, lane);
    if (lane == 0) look[0] = e;
  } else if (warp == 1) {  // beside the lookup (the index has total_rows entries, all readable)
    // Lane 0: this row's token row. The spread form (R > 0, the chain through an index): lanes 1 .. R + 1 read
    // rows 0 .. R's, lane 2 offsets[E - 1] and offsets[E]; every CTA takes the spread form only where all
    // R + 1 rows read the same token row and the last expert holds row R alone, and so all CTAs agree.
    const int32_t* idx = prm.a_row_index;
    const int v = idx == nullptr ? row : (lane == 0 ? idx[row] : (R > 0 ? idx[min(lane - 1, R)] : 0));
    int ok = 0;
    if (R > 0 && idx != nullptr) {
      const int first = __shfl_sync(0xFFFFFFFFu, v, 1);
      int bounds = 1;
      if (lane == 2) bounds = prm.offsets[prm.experts - 1] == R && prm.offsets[prm.experts] == R + 1;
      ok = __all_sync(0xFFFFFFFFu, (lane == 0 || lane > R + 1 || v == first) && bounds) ? 1 : 0;
    }
    if (lane == 0) {
      look[1] = v;
      look[2] = ok;
    }
  }
  __syncthreads();  // the lookup's results and the initialised barriers, for every thread (the last of the CTA's)
  if (tid == 0) FP4MOE_TRACE_PUT(kSlot, 4, FP4MOE_TRACE_NOW());
  const int e = look[0], src = look[1];
  const bool spread = kSpread && look[2] != 0;
  if (e < 0) return;  // a row past offsets[E]: nothing to do, nothing issued
  if (spread && row >= R) return;  // the last expert's row: spread over the other rows' CTAs
  const bool last = e == prm.experts - 1;
  // The weights and tensor scales of expert e (the last expert's from their own buffers where given).
  const bool own1 = last && prm.w1_last != nullptr, own2 = last && prm.w2_last != nullptr;
  const float sg = kFc1 ? (own1 ? prm.s1_last[0] : prm.s1[2 * e]) : 0.f;
  const float su = kFc1 ? (own1 ? prm.s1_last[1] : prm.s1[2 * e + 1]) : 0.f;
  const float s2e = kFc2 ? (own2 ? prm.s2_last[0] : prm.s2[e]) : 0.f;
  // The spread form: column pair q = parts r + p of the last expert (part q / 8, pair q % 8 of it).
  const int q = row * prm.parts + p;
  const float sg_l = spread ? prm.s1_last[0] : 0.f, su_l = spread ? prm.s1_last[1] : 0.f;
  const float s2_l = spread ? prm.s2_last[0] : 0.f;
  const uint8_t* src1 =
      kFc1 ? (own1 ? prm.w1_last : prm.w1) + cc_chunk_offset(true, H, I, own1 ? 0 : e, p, 0) : nullptr;
  const uint8_t* src2 =
      kFc2 ? (own2 ? prm.w2_last : prm.w2) + cc_chunk_offset(false, H, I, own2 ? 0 : e, p, 0) : nullptr;
  const uint16_t* arow = prm.a + static_cast<int64_t>(src) * prm.a_ld;
  // Copy c of the launch: c < n1 FC1's chunk c, c < nch FC2's chunk c - n1, c = nch the token (FC1), each
  // completing on bars[c] (the spread form's slices with their chunk).
  auto issue = [&](int c) {
    const uint64_t policy = policy_evict_first();  // each weight byte is read once
    const int j = q % 8;
    if (c == nch) {
      if (kFc1) {
        mbar_arrive_expect_tx(&bars[nch], 2 * H);
        bulk_copy_g2s(smem, arow, 2 * H, &bars[nch], policy_evict_normal());
      }
    } else if (c < n1) {
      const uint8_t* g = src1 + static_cast<int64_t>(c) * kCcChunkBytes;
      mbar_arrive_expect_tx(&bars[c], kCcChunkBytes + (spread ? kCcSpread1Bytes : 0));
      bulk_copy_g2s(chunks + c * kCcChunkBytes, g, kCcChunkBytes, &bars[c], policy);
      if (spread) {  // the pair's 64 units: their code bytes, then their scale bytes
        const uint8_t* gl = prm.w1_last + cc_chunk_offset(true, H, I, 0, q / 8, c);
        bulk_copy_g2s(spread1 + c * kCcSpread1Bytes, gl + 1024 * j, 1024, &bars[c], policy);
        bulk_copy_g2s(spread1 + c * kCcSpread1Bytes + 1024, gl + kCcCodeBytes + 128 * j, 128, &bars[c], policy);
      }
    } else {
      const int f = c - n1;
      mbar_arrive_expect_tx(&bars[c], kCcChunkBytes + (spread ? kCcSpread2Bytes : 0));
      bulk_copy_g2s(chunks + c * kCcChunkBytes, src2 + static_cast<int64_t>(f) * kCcChunkBytes, kCcChunkBytes,
                    &bars[c], policy);
      if (spread) {  // the pair's plane, then the chunk's row scales
        const uint8_t* gl = prm.w2_last + cc_chunk_offset(false, H, I, 0, q / 8, f);
        bulk_copy_g2s(spread2 + f * kCcSpread2Bytes, gl + 1024 * j, 1024, &bars[c], policy);
        bulk_copy_g2s(spread2 + f * kCcSpread2Bytes + 1024, gl + kCcCodeBytes, 1024, &bars[c],
                      policy_evict_normal());  // the 8 CTAs of the part read these scales
      }
    }
  };
  // The producer warp: the token first, FC1's chunks, then FC2's (at once, or once FC1's chunk fc2_after - 1
  // has landed, so that FC1's bytes come first), then it leaves; the math warps go on without it.
  if (producer) {
    if (lane == 0) {
      issue(nch);
      for (int c = 0; c < n1; ++c) issue(c);
      if (fc2_after > 0) mbar_wait(&bars[fc2_after - 1], 0);
      for (int c = n1; c < nch; ++c) issue(c);
      FP4MOE_TRACE_PUT(kSlot, 5, FP4MOE_TRACE_NOW());
    }
    return;
  }

  // FC1's sums come out unscaled (each block's own prescale undone as it is added): SwiGLU's 2^(14 - ex) is 1.
  constexpr int ex = 14;
  if constexpr (kFc1) {
    // The token: each k16 block b (thread b; check_cc_tactic and fill() bound hidden by kCcMaxHidden) times its own
    // power of two 2^e_b, which puts the block's largest magnitude into [2^13, 2^14), as f16 (block b's k 0..7 at
    // 16 b, its k 8..15 at H + 16 b, so that a warp's 32 lanes read 512 contiguous bytes); then, the bf16 copy
    // read, 2^(14 - e_b) as a float at 4 b of its area, by which the FC1 loop multiplies the block's sums (the
    // codes' 2^-14 and the block's 2^e_b undone). No CTA-wide maximum, so no barrier before the conversion.
    const uint32_t x_s = smem_addr(smem), xh_s = smem_addr(smem + 2 * H);
    float* unscale = reinterpret_cast<float*>(smem);
    mbar_wait(&bars[nch], 0);
    if (tid == 0) FP4MOE_TRACE_PUT(kSlot, kCcTraceToken, FP4MOE_TRACE_NOW());
    float us = 0.f;
    if (tid < H / 16) {
      const uint4 v0 = ld_shared_u4(x_s + 32 * tid), v1 = ld_shared_u4(x_s + 32 * tid + 16);
      const int eb = cc_prescale(cc_max_abs_bf16x16(v0, v1, 0.f));
      cc_token_block_to_f16(v0, v1, e4m3_pow2(eb), smem + 2 * H + 16 * tid, smem + 3 * H + 16 * tid);
      us = e4m3_pow2(14 - eb);
    }
    cc_math_sync();  // the bf16 copy read, the f16 one written
    if (tid < H / 16) unscale[tid] = us;
    cc_math_sync();  // the blocks' unscales
    if (tid == 0) FP4MOE_TRACE_PUT(kSlot, kCcTraceToken + 1, FP4MOE_TRACE_NOW());

    // Warp w's gate and up rows, lane l's k16 block of each chunk: (gate, up) sums in fp32. The spread form:
    // in chunk c, warps 4(c mod 4) .. + 3 also take the pair's column (w mod 4) / 2, its gate (w even) or up
    // row, for the same block: one warp on each scheduler, and each warp every fourth chunk, so that no warp
    // carries half as much again as the others.
    const uint32_t chunk_s = smem_addr(chunks), spread_s = smem_addr(spread1);
    const uint32_t pair_unit = 32 * ((warp & 3) >> 1) + lane, pair_half = warp & 1;
    float accg = 0.f, accu = 0.f, accp = 0.f;
    for (int c = 0; c < n1; ++c) {
      mbar_wait(&bars[c], 0);
      if (tid == 0) FP4MOE_TRACE_PUT(kSlot, kCcTraceChunks + c, FP4MOE_TRACE_NOW());
      if constexpr (kNoMath) continue;
      const float2 gu = cc_fc1_unit(chunk_s + c * kCcChunkBytes, 32 * warp + lane, xh_s, H, 32 * c + lane);
      const float ub = unscale[32 * c + lane];
      accg = fmaf(gu.x, ub, accg);
      accu = fmaf(gu.y, ub, accu);
      if (spread && (warp >> 2) == (c & 3)) {
        const uint32_t base = spread_s + c * kCcSpread1Bytes;
        accp = fmaf(cc_fc1_row(base + 16 * pair_unit + 8 * pair_half, base + 1024 + 2 * pair_unit + pair_half,
                               cc_token_block(xh_s, H, 32 * c + lane)),
                    ub, accp);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      accg += __shfl_xor_sync(0xFFFFFFFFu, accg, o);
      accu += __shfl_xor_sync(0xFFFFFFFFu, accu, o);
    }
    // Warp w's SwiGLU column (cc_swiglu_bf16): to h and to red[32 + w]; its share of the pair's sums to
    // red[16 + w] (the four warps of a row's share added in warp order after the barrier).
    if (lane == 0) {
      if (warp == 0) FP4MOE_TRACE_PUT(kSlot, kCcTraceFc1Done, FP4MOE_TRACE_NOW());
      const uint16_t rounded = cc_swiglu_bf16(accg, accu, ex, sg, su);
      prm.h[static_cast<int64_t>(row) * I + kCcCols * p + warp] = rounded;
      red[32 + warp] = bf16_bits_to_f32(rounded);
    }
    if (spread) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) accp += __shfl_xor_sync(0xFFFFFFFFu, accp, o);
      if (lane == 0) red[16 + warp] = accp;
    }
  } else {
    // FC2 alone: the part's 16 SwiGLU values from FC1's output row.
    if (tid < kCcCols) red[32 + tid] = bf16_bits_to_f32(arow[kCcCols * p + tid]);
  }

  if constexpr (kFc2) {
    cc_math_sync();  // the 16 SwiGLU values in red[32..47] (the spread form: the pair's sums in red[16..31])
    uint32_t hv[8];
    const int eh = cc_row_to_f16x2(red + 32, hv);
    const float unscale2 = e4m3_pow2(14 - eh) * s2e;
    // The spread form: the pair's two SwiGLU values (to h by thread 0), as f16x2 times 2^ehp.
    uint32_t hp = 0u;
    float unscale2p = 0.f;
    if (spread) {
      float pr[4];  // column 0 gate, up, column 1 gate, up: warps i, i + 4, i + 8, i + 12
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[i] = ((red[16 + i] + red[20 + i]) + red[24 + i]) + red[28 + i];
      const uint16_t v0 = cc_swiglu_bf16(pr[0], pr[1], ex, sg_l, su_l);
      const uint16_t v1 = cc_swiglu_bf16(pr[2], pr[3], ex, sg_l, su_l);
      if (tid == 0) {
        prm.h[static_cast<int64_t>(R) * I + 2 * q] = v0;
        prm.h[static_cast<int64_t>(R) * I + 2 * q + 1] = v1;
      }
      const float f0 = bf16_bits_to_f32(v0), f1 = bf16_bits_to_f32(v1);
      const int ehp = cc_prescale(fmaxf(fabsf(f0), fabsf(f1)));
      const float sp = e4m3_pow2(ehp);
      hp = f32x2_to_f16x2(f0 * sp, f1 * sp);
      unscale2p = e4m3_pow2(14 - ehp) * s2_l;
    }
    float* acc_row = prm.acc + static_cast<int64_t>(row) * H;
    float* acc_last = prm.acc + static_cast<int64_t>(R) * H;
    const uint32_t chunk_s = smem_addr(chunks), spread_s = smem_addr(spread2);
    // Thread t: rows 4v .. 4v + 3 (v = t mod 256) of the chunks f = t / 256, + 2, ...
    const int v = tid & 255;
    if (tid == 0) FP4MOE_TRACE_PUT(kSlot, kCcTraceFc1Done + 1, FP4MOE_TRACE_NOW());
    for (int f = tid >> 8; f < n2; f += 2) {
      mbar_wait(&bars[n1 + f], 0);
      if (v == 0) FP4MOE_TRACE_PUT(kSlot, kCcTraceChunks + n1 + f, FP4MOE_TRACE_NOW());
      if constexpr (kNoMath) continue;
      const float4 s = cc_fc2_quad(chunk_s + (n1 + f) * kCcChunkBytes, v, hv);
      float* dst = acc_row + kCcChunkRows * f + 4 * v;
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(s.x * unscale2),
                   "f"(s.y * unscale2), "f"(s.z * unscale2), "f"(s.w * unscale2)
                   : "memory");
      if (spread) {
        const uint32_t base = spread_s + f * kCcSpread2Bytes;
        const float4 t = cc_fc2_pair_quad(base, base + 1024, v, hp);
        float* dl = acc_last + kCcChunkRows * f + 4 * v;
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dl), "f"(t.x * unscale2p),
                     "f"(t.y * unscale2p), "f"(t.z * unscale2p), "f"(t.w * unscale2p)
                     : "memory");
      }
    }
    if (v == 0) FP4MOE_TRACE_PUT(kSlot, kCcTraceFc2Done + (tid >> 8), FP4MOE_TRACE_NOW());
    if (prm.fp32_out) return;  // the caller reads the fp32 rows, rounds them to bf16 and zeroes them
    // A row's last CTA to arrive converts the fp32 row to bf16 and zeroes it and the counter: every
    // thread's adds fenced at GPU scope (acq_rel, not the sequentially consistent fence __threadfence
    // compiles to), the CTA's barrier, then thread 0's count as an acquire-release atomic (its release
    // covers the CTA's adds through the barrier; its acquire, with the barrier after it, orders the last
    // CTA's reads after every other CTA's adds). The spread form counts the last expert's row R too, to
    // which all R x parts CTAs add.
    fence_acq_rel_gpu();
    cc_math_sync();
    if (tid == 0) {
      red_i[0] = atomic_add_acq_rel_gpu(prm.counters + row, 1) == prm.parts - 1;
      red_i[1] = spread && atomic_add_acq_rel_gpu(prm.counters + R, 1) == R * prm.parts - 1;
    }
    cc_math_sync();
    for (int k = 0; k < 2; ++k) {
      if (!red_i[k]) continue;
      const int rr = k == 0 ? row : R;
      fence_acq_rel_gpu();
      float* a_row = prm.acc + static_cast<int64_t>(rr) * H;
      uint16_t* y_row = prm.y + static_cast<int64_t>(rr) * H;
      // Four float4 a thread in flight at once (hidden 8192 in one round trip to L2), then their stores.
      constexpr int kLoads = 4, kStride = 4 * kCcThreads;
      for (int i0 = 4 * tid; i0 < H; i0 += kLoads * kStride) {
        float4 w[kLoads];
#pragma unroll
        for (int j = 0; j < kLoads; ++j)
          if (i0 + j * kStride < H) w[j] = __ldcg(reinterpret_cast<const float4*>(a_row + i0 + j * kStride));
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const int i = i0 + j * kStride;
          if (i >= H) break;
          const uint32_t lo = uint32_t(f32_to_bf16_bits(w[j].x)) | uint32_t(f32_to_bf16_bits(w[j].y)) << 16;
          const uint32_t hi = uint32_t(f32_to_bf16_bits(w[j].z)) | uint32_t(f32_to_bf16_bits(w[j].w)) << 16;
          *reinterpret_cast<uint2*>(y_row + i) = make_uint2(lo, hi);
          __stcg(reinterpret_cast<float4*>(a_row + i), make_float4(0.f, 0.f, 0.f, 0.f));
        }
      }
      if (tid == 0) prm.counters[rr] = 0;
    }
    if (tid == 0) FP4MOE_TRACE_PUT(kSlot, 2, FP4MOE_TRACE_NOW());
  }
}

using CcKernel = void (*)(CcParams);
CcKernel cc_kernel(int mode) {
  switch (mode) {
    case kCcFc1: return &sm90_cc_resident_kernel<kCcFc1>;
    case kCcFc2: return &sm90_cc_resident_kernel<kCcFc2>;
    case kCcChain | kCcSpread: return &sm90_cc_resident_kernel<kCcChain | kCcSpread>;
    case kCcChain | kCcRoute: return &sm90_cc_resident_kernel<kCcChain | kCcRoute>;
    case kCcChain | kCcSpread | kCcRoute: return &sm90_cc_resident_kernel<kCcChain | kCcSpread | kCcRoute>;
#ifdef FP4MOE_SM90_TRACE
    case kCcChain | kCcNoMath: return &sm90_cc_resident_kernel<kCcChain | kCcNoMath>;
#endif
    default: return &sm90_cc_resident_kernel<kCcChain>;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The kSm90Cc device pack: one thread per unit (16 code bytes, 2 scale bytes), through cc_pack_unit, the
// function the CPU pack calls too.
__global__ void cc_pack_kernel(bool fc1, const uint8_t* __restrict__ canonical, int64_t experts, int64_t hidden,
                               int64_t inter, uint8_t* __restrict__ dst, int64_t units) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= units) return;
  const int64_t chunks = fc1 ? cc_fc1_chunks(hidden) : cc_fc2_chunks(hidden), parts = inter / kCcCols;
  const int unit = static_cast<int>(i % kCcUnits);
  const int64_t chunk = (i / kCcUnits) % chunks, part = (i / kCcUnits / chunks) % parts,
                e = i / kCcUnits / chunks / parts;
  uint8_t* base = dst + cc_chunk_offset(fc1, hidden, inter, e, part, chunk);
  uint8_t codes[16], scales[2];
  cc_pack_unit(fc1, canonical, experts, hidden, inter, e, part, chunk, unit, codes, scales);
  uint4 v;
  memcpy(&v, codes, 16);
  *reinterpret_cast<uint4*>(base + 16 * unit) = v;
  base[kCcCodeBytes + 2 * unit] = scales[0];
  base[kCcCodeBytes + 2 * unit + 1] = scales[1];
}

class Sm90CcTactic final : public GroupedGemmTactic {
 public:
  explicit Sm90CcTactic(const TacticDesc& d) : desc_(d) {}
  const TacticDesc& desc() const override { return desc_; }

  TacticCheck check(const GemmProblem& p, const DeviceCaps& caps) const override {
    return check_cc_tactic(desc_, p, caps);
  }

  Status init(const GemmProblem& p) override {
    (void)p;
    int dev = 0, optin = 0;
    Status s = cuda_status(cudaGetDevice(&dev), "cudaGetDevice", desc_.name);
    if (s) s = cuda_status(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                           "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)", desc_.name);
    // Every launch sizes its own shared memory (cc_smem_bytes of its hidden size): the limit is raised to
    // what the device allows beside the kernels' static shared memory, once, and run() refuses a problem
    // past it.
    int limit = optin;
    for (int mode : kCcModes) {
      cudaFuncAttributes attr{};
      if (s) s = cuda_status(cudaFuncGetAttributes(&attr, cc_kernel(mode)), "cudaFuncGetAttributes", desc_.name);
      if (s) limit = std::min(limit, optin - static_cast<int>(attr.sharedSizeBytes));
    }
    for (int mode : kCcModes)
      if (s)
        s = cuda_status(cudaFuncSetAttribute(cc_kernel(mode), cudaFuncAttributeMaxDynamicSharedMemorySize, limit),
                        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", desc_.name);
    smem_limit_ = s ? limit : 0;
    spread_on_ = env_switch("FP4MOE_SM90_CC_SPREAD", true);  // the chain's spread form; 0: the control
    early_trigger_ = env_switch("FP4MOE_SM90_CC_EARLY_TRIGGER", true);
#ifdef FP4MOE_SM90_TRACE
    variant_ = env_switch("FP4MOE_SM90_CC_NOMATH", false) ? kCcNoMath : 0;
#endif
    fc2_after_ = -1;
    if (s && env_is_set("FP4MOE_SM90_CC_FC2_AFTER")) {
      long v = 0;
      if (!env_integer_in(std::getenv("FP4MOE_SM90_CC_FC2_AFTER"), 0, 64, &v))
        return Status(StatusCode::kInvalidArgument,
                      fmt::format("{}: FP4MOE_SM90_CC_FC2_AFTER takes 0..64 (FC2's copies once FC1's chunk N - 1 "
                                  "has landed; 0 at the start with FC1's; unset, two thirds of FC1's), found '{}'",
                                  desc_.name, std::getenv("FP4MOE_SM90_CC_FC2_AFTER")));
      fc2_after_ = static_cast<int>(v);
    }
    return s;
  }

  // A counter per row (16-byte aligned), then an fp32 row of hidden floats per row: FC2's (and the chain's)
  // partial sums. Zero at rest: every launch leaves it zero.
  size_t workspace_bytes(const GemmProblem& p) const override {
    const int64_t hidden = p.op == GemmOp::kFc1SwiGlu ? p.k : p.n, rows = std::max<int64_t>(p.total_rows, 0);
    return static_cast<size_t>(counters_bytes(rows) + rows * hidden * 4);
  }

  bool can_chain() const override { return true; }

  // FC2's fp32 rows follow the row counters in the workspace (workspace_bytes).
  int64_t fp32_rows_offset(const GemmProblem& fc1) const override { return counters_bytes(fc1.total_rows); }

  // The chained launch routes a decode batch itself (CcParams::route) for the register routing's shapes with
  // E <= 256 and up to kFrontMaxPairs pairs, as the wgmma chain does.
  bool can_route_in_chain(const MoeConfig& cfg, int64_t tokens) const override {
    const bool sigmoid = cfg.routing == RoutingKind::kSigmoidGrouped;
    return cfg.num_experts <= 256 && front_block_fits(route_detail::route_params(cfg), sigmoid, tokens, cfg.num_experts);
  }

  Status run(const GroupedGemmArgs& args, Stream stream) const override {
    const bool fc1 = args.problem.op == GemmOp::kFc1SwiGlu;
    CcParams prm;
    Status st = fill(args, fc1, &prm);
    if (!st || args.problem.total_rows == 0) return st;
    if (!fc1 && !(st = bind_fc2_output(args, args.out, &prm))) return st;
    return launch(fc1 ? kCcFc1 : kCcFc2, prm, args.problem, stream);
  }

  Status run_chained(const GroupedGemmArgs& a1, const GroupedGemmArgs& a2, Stream stream) const override {
    const GemmProblem &p1 = a1.problem, &p2 = a2.problem;
    if (p1.op != GemmOp::kFc1SwiGlu || p2.op != GemmOp::kFc2 || p1.num_experts != p2.num_experts ||
        p1.total_rows != p2.total_rows || a1.expert_offsets != a2.expert_offsets || a2.a != a1.out ||
        a2.a_row_index != nullptr || p2.k != p1.n || p2.n != p1.k || a2.a_ld != p1.n)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: a chained launch needs FC1 {} then FC2 {} over the same experts, offsets and "
                                "rows, FC2 reading FC1's output contiguously (a = FC1's out, a_ld = K = FC1's N) "
                                "and writing FC1's K columns",
                                desc_.name, p1.to_string(), p2.to_string()));
    if ((a1.last_expert_weights == nullptr) != (a2.last_expert_weights == nullptr))
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: a chained launch takes the last expert's own buffers for both GEMMs or for "
                                "neither",
                                desc_.name));
    CcParams prm, prm2;
    Status st = fill(a1, true, &prm, true);
    if (st) st = fill(a2, false, &prm2);
    if (st && a1.routing) st = bind_routing(a1, &prm);
    prm.fp32_out = a1.fp32_rows_to_caller ? 1 : 0;
    if (!st || p1.total_rows == 0) return st;
    if ((st = bind_fc2_output(a1, a2.out, &prm)), !st) return st;
    prm.w2 = prm2.w2;
    prm.s2 = prm2.s2;
    prm.w2_last = prm2.w2_last;
    prm.s2_last = prm2.s2_last;
    // The spread form (the kernel's "spread"): kCcSpreadRows routed rows and the folded last expert's one
    // row, all through an index or the launch's own routing, where its larger shared memory fits. The
    // routed rows' kCcSpreadRows x parts CTAs (parts = inter / 16) are as many as the last expert's inter / 2
    // column pairs, since it has the others' inter. The kernel takes the form only where the offsets and
    // the index agree (every row the same token, the last expert's row alone and last); else each row has
    // its CTAs.
    static_assert(kCcSpreadRows * 2 == kCcCols, "8 routed rows of parts CTAs hold the inter / 2 column pairs");
    if (a1.last_expert_weights != nullptr && (a1.a_row_index != nullptr || prm.route) &&
        p1.total_rows == kCcSpreadRows + 1 && cc_spread_smem_bytes(prm.hidden) <= smem_limit_ && spread_on_)
      prm.spread = kCcSpreadRows;
    const int variant = prm.spread > 0 || prm.route ? 0 : variant_;
    return launch(kCcChain | (prm.spread > 0 ? kCcSpread : 0) | (prm.route ? kCcRoute : 0) | variant, prm, p1, stream);
  }

 private:
  static int64_t counters_bytes(int64_t rows) { return (rows * 4 + 15) / 16 * 16; }

  // FC2's output y and, in the workspace of `a` (a's problem sizes it), the row counters and fp32 rows.
  Status bind_fc2_output(const GroupedGemmArgs& a, uint16_t* y, CcParams* prm) const {
    if (!a.workspace || !aligned16(a.workspace))
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: FC2 needs the 16-byte aligned workspace (its fp32 rows and row counters, "
                                "{} bytes)",
                                desc_.name, workspace_bytes(a.problem)));
    prm->y = y;
    prm->counters = static_cast<int*>(a.workspace);
    prm->acc = reinterpret_cast<float*>(static_cast<uint8_t*>(a.workspace) + counters_bytes(a.problem.total_rows));
    return Status::ok();
  }

  // FC1's routing inside the chained launch (GroupedGemmArgs::routing): the batch's shape against the problem
  // and the routing's limits, then the front end's parameters; FC1 reads its rows from `a` through the CTA's
  // own grouping.
  Status bind_routing(const GroupedGemmArgs& a1, CcParams* prm) const {
    const Status st = fill_chain_routing(*this, a1, &prm->front);
    if (!st) return st;
    prm->route = 1;
    return Status::ok();
  }

  // One GEMM's arguments checked and its half of the kernel parameters filled (routed: FC1 of a chained
  // launch, which may route its batch itself).
  Status fill(const GroupedGemmArgs& args, bool fc1, CcParams* out, bool routed = false) const {
    const GemmProblem& p = args.problem;
    if (args.routing && !routed)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: routing inside the launch (GroupedGemmArgs::routing) needs FC1 of run_chained",
                                desc_.name));
    if (args.fp32_rows_to_caller && !routed)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: FC2's fp32 rows left to the caller (GroupedGemmArgs::fp32_rows_to_caller) need "
                                "FC1's arguments of run_chained",
                                desc_.name));
    if (smem_limit_ == 0)
      return Status(StatusCode::kInvalidArgument, fmt::format("{}: run() before init()", desc_.name));
    std::string why;
    if (!cc_layout_fits(p, &why) || p.num_experts > kCcMaxExperts || p.total_rows < 0 ||
        p.total_rows * (fc1 ? p.n : p.k) / kCcCols >= (int64_t(1) << 31))
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: unsupported problem {}{}", desc_.name, p.to_string(),
                                why.empty() ? "" : ": " + why));
    const int64_t hidden = fc1 ? p.k : p.n;
    if (!cc_hidden_fits(hidden, &why))
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: unsupported problem {}: {}", desc_.name, p.to_string(), why));
    if (args.a_ld % 8 != 0 || args.a_ld < p.k || !aligned16(args.a) || !aligned16(args.weights) ||
        !aligned16(args.last_expert_weights) || !aligned16(args.out))
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: needs 16-byte aligned activations, weights and output and a_ld a multiple of 8 "
                                "elements >= K (a_ld {}, K {})",
                                desc_.name, args.a_ld, p.k));
    if ((args.last_expert_weights == nullptr) != (args.last_expert_scales == nullptr))
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: the last expert's own weights and tensor scales come both or neither",
                                desc_.name));
    if (p.total_rows > 0 && (!args.expert_offsets || !args.a || !args.weights || !args.tensor_scales || !args.out))
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: offsets, activations, weights, tensor scales and output are all required",
                                desc_.name));
    CcParams& prm = *out;
    prm.offsets = args.expert_offsets;
    prm.a = args.a;
    prm.a_row_index = args.a_row_index;
    prm.a_ld = args.a_ld;
    if (fc1) {
      prm.w1 = static_cast<const uint8_t*>(args.weights);
      prm.s1 = args.tensor_scales;
      prm.w1_last = static_cast<const uint8_t*>(args.last_expert_weights);
      prm.s1_last = args.last_expert_scales;
      prm.h = args.out;
    } else {
      prm.w2 = static_cast<const uint8_t*>(args.weights);
      prm.s2 = args.tensor_scales;
      prm.w2_last = static_cast<const uint8_t*>(args.last_expert_weights);
      prm.s2_last = args.last_expert_scales;
    }
    prm.experts = static_cast<int>(p.num_experts);
    prm.hidden = static_cast<int>(hidden);
    prm.inter = static_cast<int>(fc1 ? p.n : p.k);
    prm.parts = prm.inter / kCcCols;
    return Status::ok();
  }

  // rows x parts CTAs of kCcLaunchThreads, with the launch's shared memory.
  Status launch(int mode, const CcParams& prm, const GemmProblem& p, Stream stream) const {
    const int64_t smem =
        prm.spread > 0 ? cc_spread_smem_bytes(prm.hidden) : cc_smem_bytes(mode & kCcFc1, mode & kCcFc2, prm.hidden);
    if (smem > smem_limit_)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: {} needs {} bytes of shared memory per block, the device allows {}", desc_.name,
                                p.to_string(), smem, smem_limit_));
    const dim3 grid(static_cast<unsigned>(p.total_rows * prm.parts));
    CcParams q = prm;
    q.early_trigger = early_trigger_ ? 1 : 0;
    q.fc2_after = fc2_after_;
    return cuda_status(launch_pdl(cc_kernel(mode), grid, dim3(kCcLaunchThreads), static_cast<size_t>(smem),
                                  reinterpret_cast<cudaStream_t>(stream), q),
                       "kernel launch", desc_.name);
  }

  TacticDesc desc_;
  int smem_limit_ = 0;
  bool spread_on_ = true;  // FP4MOE_SM90_CC_SPREAD, read at init()
  bool early_trigger_ = true;  // FP4MOE_SM90_CC_EARLY_TRIGGER, read at init()
  int fc2_after_ = -1;     // FP4MOE_SM90_CC_FC2_AFTER, read at init(); -1: CcParams::fc2_after's default
  int variant_ = 0;        // kCcNoMath in a build with FP4MOE_SM90_TRACE and FP4MOE_SM90_CC_NOMATH=1
};

size_t cc_bytes(const GemmProblem& p) { return cc_packed_bytes_of(p); }

const WeightLayoutOps kSm90CcLayoutOps = {WeightLayout::kSm90Cc, &cc_bytes, &pack_cc_device};

}  // namespace

size_t cc_packed_bytes_of(const GemmProblem& p) {
  const bool fc1 = p.op == GemmOp::kFc1SwiGlu;
  return static_cast<size_t>(cc_packed_bytes(fc1, p.num_experts, fc1 ? p.k : p.n, fc1 ? p.n : p.k));
}

Status pack_cc_device(const GemmProblem& p, const void* canonical, void* dst, Stream stream) {
  std::string why;
  if (!cc_layout_fits(p, &why)) return Status(StatusCode::kInvalidArgument, "kSm90Cc pack: " + why);
  if (!canonical || !dst)
    return Status(StatusCode::kInvalidArgument, fmt::format("kSm90Cc pack ({}): null pointer", p.to_string()));
  const bool fc1 = p.op == GemmOp::kFc1SwiGlu;
  const int64_t units = static_cast<int64_t>(cc_packed_bytes_of(p)) / kCcChunkBytes * kCcUnits;
  constexpr int kBlock = 256;
  const int64_t blocks = (units + kBlock - 1) / kBlock;
  if (blocks >= (int64_t(1) << 31))
    return Status(StatusCode::kInvalidArgument, fmt::format("kSm90Cc pack: {} is too large", p.to_string()));
  cc_pack_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      fc1, static_cast<const uint8_t*>(canonical), p.num_experts, fc1 ? p.k : p.n, fc1 ? p.n : p.k,
      static_cast<uint8_t*>(dst), units);
  return cuda_status(cudaGetLastError(), "cc_pack_kernel launch", "kSm90Cc pack");
}

Status cc_set_trace_buffer(void* buffer) {
#ifdef FP4MOE_SM90_TRACE
  auto* t = static_cast<unsigned long long*>(buffer);
  return cuda_status(cudaMemcpyToSymbol(g_trace, &t, sizeof(t)), "cudaMemcpyToSymbol(g_trace)", "sm90 cc trace");
#else
  (void)buffer;
  return Status::ok();
#endif
}

Status cc_kernel_resources(cudaFuncAttributes* out) {
  cudaFuncAttributes a{};
  *out = cudaFuncAttributes{};
  for (int mode : kCcModes) {
    const Status st = cuda_status(cudaFuncGetAttributes(&a, cc_kernel(mode)), "cudaFuncGetAttributes", "sm90 cc");
    if (!st) return st;
    if (mode == kCcFc1) *out = a;
    out->numRegs = std::max(out->numRegs, a.numRegs);
    out->localSizeBytes = std::max(out->localSizeBytes, a.localSizeBytes);
  }
  return Status::ok();
}

}  // namespace sm90

void append_sm90_cc_tactics(std::vector<std::unique_ptr<GroupedGemmTactic>>& out) {
  std::vector<TacticDesc> descs;
  append_sm90_cc_tactic_descs(descs);
  for (const TacticDesc& d : descs) out.push_back(std::make_unique<sm90::Sm90CcTactic>(d));
}

const WeightLayoutOps* sm90_cc_weight_layout_ops() { return &sm90::kSm90CcLayoutOps; }

}  // namespace fp4moe
