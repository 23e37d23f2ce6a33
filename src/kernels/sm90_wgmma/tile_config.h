// Compile-time facts about one sm90 tile configuration, shared by the host descriptors (descs.cpp) and
// the kernel (sm90_nvfp4w4a16_grouped.cuh), so the shared memory the preflight sees is the one the
// kernel asks for. Host-only C++ (no CUDA headers).
//
// CTA shape: 1 + CONS warpgroups (CONS = 2: 384 threads, or 4: 640). Warpgroup 0 is the producer (warp 0
// issues the weight copies, warp 1 the token copies, warp 2 of a chained launch signals what the consumers
// stored, the others leave after setmaxnreg), warpgroups 1 .. CONS are consumers; consumer c owns the BM/64/CONS packed
// 64-row tiles c*BM/64/CONS .. of the CTA tile and all BN tokens. All consumers read every stage, and a
// stage is freed when all have released it, so they advance together.
//
// Dynamic shared memory, from a 1024-byte aligned base (the 128-byte swizzle needs it):
//   stage s at s * kStageBytes:
//     [0, kTokenBytes)              tokens: BK/64 sub-tiles, each BN rows x 128 bytes (64 bf16 of k),
//                                   16-byte chunk j of row r stored at chunk j ^ (r % 8)
//     [kTokenBytes, + kWeightBytes) weights: BM/64 tiles x BK/64 packed blocks of 2304 bytes, tile-major,
//                                   each block exactly as in global memory (sm90_layout.h)
//   then kStages full barriers, kStages empty barriers, kItemRing item barriers, kSignalRing signal
//   full and kSignalRing signal empty barriers (8 bytes each),
//   then the work-list table: item prefix [kMaxExperts + 1] and expert offsets [kMaxExperts + 1] (int32),
//   then the producer's source-row table of the current item [BN] (int32),
//   then the item ring [kItemRing][kItemInts] (int32): the work items the producer fetched and decoded,
//   in order, for the token producer and the consumers,
//   then the signal ring [kSignalRing][kSignalInts] (int32): the consumers' hand-overs to the signal warp,
//   then the launch's item space (sm90_scheduler.cuh, ItemSpace: kItemSpaceInts int32),
//   then the token of each grouped row when the launch routes a decode batch itself [kRoutedRows] (int32;
//   the routing's other scratch arrays use stage 0's token bytes before the producers start),
//   then one flag per consumer warpgroup (int32): "this split finished its tile" (the split reduction of a
//   launch that runs one GEMM).
#pragma once
#include <cstdint>

#include "kernels/sm90_wgmma/sm90_layout.h"

namespace fp4moe {
namespace sm90 {

constexpr int kMaxExperts = 512;            // the work-list table lives in shared memory
constexpr int kSmemAlignSlack = 1024;       // the dynamic base is only 16-byte aligned
constexpr int kItemRing = 16;               // fetched work items the consumers have not started yet, at most
constexpr int kItemInts = 10;               // int32 per item ring slot: the decoded item (sm90_scheduler.cuh, RingItem)
constexpr int kSignalRing = 4;              // consumer -> signal warp hand-overs in flight (grouped.cuh)
constexpr int kSignalInts = 3;              // int32 per signal ring slot: what to signal and its two arguments

// Split reduction (split-K, sm90_scheduler.cuh): a work item may cover 1/S of its tile's K range, S a power
// of two up to kMaxSplit (a folded last expert's parts: any divisor of the stages up to kMaxSplit); the
// splits of one launch are at most kMaxSplitItems items, whose fp32 partial
// tiles (BM x BN floats each) and per-tile arrival counters live in the tactic's workspace. Only the
// decode tiles (BN <= 16, a few floats per thread) split.
constexpr int kMaxSplit = 8;
constexpr int kItemSpaceInts = 12;          // shared-memory room for the launch's ItemSpace
constexpr int kRoutedRows = 128;            // grouped rows of a batch the launch routes itself (front_block.cuh)
constexpr int kMaxSplitItems = 1024;
constexpr int kMinAutoSplitStages = 4;      // the automatic choice leaves every split this many stages
constexpr bool split_capable(int bn) { return bn <= 16; }
// The folded last expert's parts (sm90_scheduler.cuh, ItemSpace) from FC1's and FC2's stage counts, launch constants
// the host computes once (LaunchParams::fold_parts): the smallest divisor of FC1's stages, up to
// kMaxSplit, that makes a part no longer than an FC2 item (target ceil(FC1 / FC2 stages), at least 2;
// GLM-5: 24 stages, FC2 8: 3 parts of 8 stages; DeepSeek-V3: 28 stages, FC2 8: 4 parts of 7), else the
// largest below the target; 1 (whole tiles) for a prime stage count above kMaxSplit. Parts as long as an
// FC2 item make every item of the tail a multiple of one FC2 item, which packs the CTAs' last items
// evenly now that FC2 starts stage by stage as FC1's tiles finish (GLM-5 T=1, docs/perf.md sm90 step 45:
// 3 / 4 parts 66.3-66.6 / 66.8-67.4 us; before the per-stage hand-over, step 33, 3 / 4 / 6 parts
// 67.9 / 67.3 / 70.8-73.0, and with the reduction on the consumers' path, step 30, 3 parts were best).
constexpr int fold_split_parts(int stages0, int stages1) {
  const int ceil_ratio = stages1 > 0 ? (stages0 + stages1 - 1) / stages1 : 2;
  const int target = ceil_ratio > 2 ? ceil_ratio : 2;
  for (int d = target; d <= kMaxSplit; ++d)
    if (stages0 % d == 0) return d;
  for (int d = (target - 1 < kMaxSplit ? target - 1 : kMaxSplit); d >= 2; --d)
    if (stages0 % d == 0) return d;
  return 1;
}

// Workspace bytes of the split partials (the workspace's last region).
constexpr int64_t split_partial_bytes(int bm, int bn) {
  return split_capable(bn) ? int64_t(kMaxSplitItems) * bm * bn * 4 : 0;
}

// Registers per thread: at launch (the compiler's limit from __launch_bounds__(threads, CTAS)), and the
// setmaxnreg targets of the producer and consumer warpgroups. The CTA's pool is launch * threads; what the
// producer gives back must cover what the consumers take: 128 (launch - producer) >= 128 CONS (consumer -
// launch). Two consumers: one CTA per SM 168 -> 56 / 224, two CTAs 80 -> 48 / 96. Four consumers (one CTA
// of 640 threads): 96 -> 40 / 104, about the two-CTA tile's consumer budget; the e4m3 tile (kWideProducer:
// its token producer splits activations, and with its loads ahead ptxas spilled in 40 registers) 96 ->
// 56 / 104 (128 x 40 >= 512 x 8; the pool allows 64, which with loads four stages ahead measured slower,
// docs/perf.md sm90 step 51).
template <int CTAS, int CONS, bool kWideProducer = false>
struct RegisterPlan {
  static constexpr int kLaunch = CONS == 4 ? 96 : (CTAS == 1 ? 168 : 80);
  static constexpr int kProducer =
      CONS == 4 ? (kWideProducer ? 56 : 40) : (CTAS == 1 ? 56 : 48);  // 48: all the two-CTA pool allows
  static constexpr int kConsumer = CONS == 4 ? 104 : (CTAS == 1 ? 224 : 96);
  static_assert(CTAS == 1 || CTAS == 2, "one or two CTAs per SM");
  static_assert(CONS == 2 || (CONS == 4 && CTAS == 1), "two consumer warpgroups, or four in a lone CTA");
  static_assert(128 * (kLaunch - kProducer) >= 128 * CONS * (kConsumer - kLaunch), "setmaxnreg would wait forever");
  static_assert(kLaunch * 128 * (1 + CONS) * CTAS <= 65536, "the register file holds CTAS CTAs");
};

// ACT: the token operand. 16: bf16 token rows (the w4a16 tiles). 8: the e4m3 tile (sm90_e4m3.h): items of
// one token, whose bf16 activations the token producer splits into two e4m3 halves per k16 block, and
// weights in the kSm90E4m3 layout, on m64n8k32 e4m3 wgmmas. Its stage's token region holds the e4m3 token
// tile (BK/128 sub-tiles of 1 KB, written by the producer warp's lanes) and, at kE4m3ExponentOffset, the
// stage's BK/16 block exponents (int32); units it never writes stay zero from the kernel's start.
template <int BM, int BN, int BK, int STAGES, int CTAS, int CONS, int ACT = 16>
struct TileConfig {
  static constexpr int kBM = BM;   // packed weight rows per CTA tile (wgmma M side); FC1: BM/2 output columns
  static constexpr int kBN = BN;   // tokens per CTA tile (wgmma N)
  static constexpr int kBK = BK;   // k per pipeline stage
  static constexpr int kStages = STAGES;
  static constexpr int kCtasPerSm = CTAS;  // resident CTAs per SM the tile is sized for (latency hiding)
  static constexpr int kConsumers = CONS;  // consumer warpgroups
  static constexpr bool kE4m3 = ACT == 8;  // the e4m3 tile (above)
  static constexpr int kTileRows = kE4m3 ? 1 : BN;  // token rows per work item (token tile)
  static constexpr int kThreads = 128 * (1 + CONS);
  using Regs = RegisterPlan<CTAS, CONS, ACT == 8>;
  static constexpr int kM64PerCta = BM / 64;
  static constexpr int kM64PerConsumer = BM / 64 / CONS;
  static constexpr int kChunksPerStage = BK / kPackK;   // packed k64 blocks per tile and stage
  static constexpr int kTokenSubTileBytes = BN * 128;
  static constexpr int kTokenBytes = kChunksPerStage * kTokenSubTileBytes;
  static constexpr int kWeightTileBytes = kChunksPerStage * kPackBlockBytes;  // one 64-row tile, one stage
  static constexpr int kWeightBytes = kM64PerCta * kWeightTileBytes;
  static constexpr int kStageBytes = (kTokenBytes + kWeightBytes + 1023) / 1024 * 1024;
  static constexpr int kBarrierOffset = STAGES * kStageBytes;
  // mbarriers: full and empty per stage, the item ring, the signal ring's two, and on the e4m3 tile the row
  // cache's (below).
  static constexpr int kBarriers = 2 * STAGES + kItemRing + 2 * kSignalRing + (kE4m3 ? 1 : 0);
  static constexpr int kTableOffset = kBarrierOffset + kBarriers * 8;
  static constexpr int kTableBytes =
      (2 * (kMaxExperts + 1) + BN + kItemRing * kItemInts + kSignalRing * kSignalInts + kItemSpaceInts + kRoutedRows +
       CONS) * 4;
  static constexpr bool kSplitCapable = split_capable(BN);
  // The chained kernel can route a decode batch in its prologue (LaunchParams::route): the n8 tiles,
  // which the heuristic gives the batches that routing serves (at most 64 pairs: a few rows per expert).
  // Inlined into the two-CTA n16 k128 kernel (80 registers), the routing code made ptxas spill there.
  static constexpr bool kRoutes = BN == 8;
  // The e4m3 tile's row cache: an item's K range of its token row in bf16, which the token producer copies
  // with one bulk copy at the item's start where every stage's rows are known stored (FC1's always, a chained
  // FC2 item's after one poll) and the range fits kRowCacheK; the item's stages then split from shared
  // memory instead of each loading its 512 bytes from L2 (docs/perf.md, sm90 step 51: DeepSeek-V3 T=1 3 us
  // faster). 16 KB of the 20 KB the tile's ring and table leave.
  static constexpr int kRowCacheK = kE4m3 ? 8192 : 0;
  static constexpr int kRowCacheOffset = (kTableOffset + kTableBytes + 127) / 128 * 128;
  static constexpr int kSmemBytes =
      kSmemAlignSlack + (kE4m3 ? kRowCacheOffset + 2 * kRowCacheK : kTableOffset + kTableBytes);
  static constexpr int kTokenChunks = BN * BK / 8;   // 16-byte token copies per stage
  static constexpr int kE4m3TileBytes = BK / 128 * 1024;  // the e4m3 token tile of a stage
  static constexpr int kE4m3ExponentOffset = kE4m3TileBytes;  // then BK/16 int32 block exponents

  static_assert(BM % (64 * CONS) == 0 && BM <= 256, "BM must be 128 or 256: each consumer warpgroup owns whole 64-row tiles");
  static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256, "BN is wgmma's N: a multiple of 8 in [8, 256]");
  static_assert(BK % kPackK == 0, "BK must be a whole number of packed k64 chunks");
  static_assert(kPackKAlign % BK == 0, "BK must divide the packed K padding so every stage is full");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
  static_assert(STAGES < kItemRing, "the producer runs at most STAGES items ahead of the consumers");
  static_assert(CTAS * kSmemBytes <= 227 * 1024,
                "CTAS CTAs must fit an H100/H200 SM's 227 KB of shared memory");
  static_assert(kTokenSubTileBytes % 1024 == 0, "token sub-tiles must keep the 1024-byte swizzle alignment");
  static_assert(kTokenChunks % 32 == 0, "the token producer warp's lanes share the token copies evenly");
  static_assert(ACT == 16 || ACT == 8, "tokens are bf16 (16) or split into e4m3 halves (8)");
  static_assert(!kE4m3 || (BN == 8 && BK == 256 && BM == 64 * CONS),
                "the e4m3 tile: N = 8 (one token's four k16 blocks x two halves), k256 stages (one block per "
                "lane of the token producer), one 64-row tile per consumer warpgroup");
  static_assert(!kE4m3 || kE4m3ExponentOffset + BK / 16 * 4 <= kTokenBytes, "the e4m3 token tile and exponents fit the token region");
};

}  // namespace sm90
}  // namespace fp4moe
