// Producer of the sm90 family: one warp fills the stage ring (tile_config.h has the byte offsets).
//
// Work items come from a global counter (dynamic persistent schedule): CTA b starts with item b, and
// lane 0 takes every further item with one atomicAdd, issued one item ahead so that its round trip
// overlaps the current item's copies. Each item goes into the item ring in shared memory before the
// arrive that fills the item's first stage, so the consumers read it after waiting on that stage (the
// arrive releases, the wait acquires). When the items run out the producer writes -1 and completes one
// more stage with no copies (33 plain arrivals): the consumers wake up, read -1 and leave. A CTA that
// starts late (its SM busy with another kernel) simply takes fewer items. The last CTA to finish
// resets the two counters (next item, CTAs done) to zero for the next launch (sm90_scheduler.cuh).
// Without counters the items are b, b + gridDim.x, ..., through the same ring.
//
// Per work item and stage (k range [k0, k0 + BK)), after the stage's empty barrier has completed:
//   lane 0   arrive.expect_tx(full, weight bytes), then one bulk copy (TMA, cp.async.bulk) per valid
//            64-row tile: the tile's BK/64 packed blocks are contiguous in global memory (expert, tile,
//            chunk order), so one copy of BK/64 * 2304 bytes lands the whole tile slice. L2 policy
//            evict-first: each weight byte is used once per token tile.
//   lanes    16-byte cp.async of the token rows, chunk i = lane + 32j: row i / (BK/8), 16-byte column
//            i % (BK/8) (fixed per lane); row r reads x[a_row_index[r]] (FC1 gather) or x[r], looked up
//            once per item into a BN-entry table in shared memory and read from it in batches of 4 or 8
//            before the batch's copies are issued; stored swizzled (chunk c of a 128-byte row at
//            c ^ (row % 8)). Past K the copy zero-fills; rows past the expert's
//            end are not copied (their accumulator columns are never stored).
//   all      cp.async.mbarrier.arrive.noinc(full): the full barrier expects 1 + 32 arrivals and the
//            transaction bytes, so it completes when both the TMA bytes and every lane's copies landed.
// Contiguous token rows (no row index: FC2, and FC1 on the engine's gathered copy) come through a TMA
// tensor map instead: lane 0 issues one 2D copy per 64-wide k sub-tile (box 64 x BN, 128-byte swizzle,
// rows past the tensor zero-filled) and adds its bytes to the expect_tx; the lanes then only arrive.
// Gathered rows (a_row_index: Hopper TMA has no gather) keep the cp.async path, which measured 36% of
// the prefill time (docs/perf.md step 13); the engine avoids it with a gathered copy (step 15).
#pragma once
#include <cstdint>

#include "kernels/sm90_wgmma/sm90_layout.h"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"
#include "kernels/sm90_wgmma/sm90_scheduler.cuh"
#include "kernels/sm90_wgmma/tile_config.h"

namespace fp4moe {
namespace sm90 {

template <class Cfg, class Params>
__device__ void run_producer(const Params& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                             const int32_t* s_prefix, const int32_t* s_offsets, int32_t* s_rows, int32_t* s_items,
                             int lane) {
  const uint64_t policy = policy_evict_first();
  const int nstages = p.kchunks / Cfg::kChunksPerStage;  // kchunks is a multiple (kPackKAlign)
  const int total = s_prefix[p.num_experts];
  constexpr int kRowChunks = Cfg::kBK / 8;  // 16-byte chunks per token row per stage
  static_assert(kRowChunks <= 32 && 32 % kRowChunks == 0, "a lane keeps one 16-byte column of the stage");
  // Lane-constant part of the token copies: column chunk c of every row it copies.
  const int c = lane % kRowChunks, sub = c / 8, row0 = lane / kRowChunks;
  constexpr int kCopies = Cfg::kTokenChunks / 32;  // 16-byte copies per lane and stage
  constexpr int kRowStep = 32 / kRowChunks;       // rows between a lane's consecutive copies
  // Batches of 16 source-row lookups for k64 stages, 4 for k128/k256 (see the copy loop).
  constexpr int kMaxBatch = Cfg::kBK == 64 ? 16 : 4;
  constexpr int kBatch = kCopies < kMaxBatch ? kCopies : kMaxBatch;
  static_assert(kCopies % kBatch == 0, "the token copies split into whole batches");
  const uint32_t col_off = sub * Cfg::kTokenSubTileBytes;
  int stage = 0;
  uint32_t phase = 0;
  // Item j + 1 is fetched while item j is produced, so the atomic's round trip is off the critical path;
  // the first item is blockIdx.x, with no fetch at all.
  int w = blockIdx.x;
  int fetched = fetch_work_item(p.counters, lane);
  for (int j = 0;; ++j) {
    if (j > 0) {
      w = fetched_work_item(p.counters, fetched, w);
      fetched = fetch_work_item(p.counters, lane);
    }
    if (w >= total) {
      // No more work: one empty stage carries the sentinel to the consumers.
      mbar_wait(&empty[stage], phase ^ 1u);
      if (lane == 0) s_items[j % kItemRing] = -1;
      __syncwarp();
      mbar_arrive(&full[stage]);
      if (lane == 0) mbar_arrive(&full[stage]);
      break;
    }
    if (lane == 0) s_items[j % kItemRing] = w;
    const WorkItem it = find_work_item(s_prefix, s_offsets, p.num_experts, Cfg::kBN, w);
    const int tile0 = it.mtile * Cfg::kM64PerCta;
    const int ntiles = min(Cfg::kM64PerCta, p.tiles64 - tile0);
    const uint8_t* wsrc = p.weights + (static_cast<int64_t>(it.expert) * p.tiles64 + tile0) * p.kchunks * kPackBlockBytes;
    // Source row of each token of the tile (-1 past the expert's rows), read once per item.
    __syncwarp();
    for (int r = lane; r < Cfg::kBN; r += 32) {
      const int row = it.row_begin + r;
      s_rows[r] = row < it.row_end ? (p.a_row_index ? p.a_row_index[row] : row) : -1;
    }
    __syncwarp();
    for (int ks = 0; ks < nstages; ++ks) {
      const int chunk0 = ks * Cfg::kChunksPerStage;
      mbar_wait(&empty[stage], phase ^ 1u);
      uint8_t* st = smem + stage * Cfg::kStageBytes;
      if (lane == 0) {
        constexpr uint32_t tile_bytes = Cfg::kWeightTileBytes;
        mbar_arrive_expect_tx(&full[stage], tile_bytes * ntiles + (p.tok_tma ? Cfg::kTokenBytes : 0));
        for (int t = 0; t < ntiles; ++t)
          bulk_copy_g2s(st + Cfg::kTokenBytes + t * Cfg::kWeightTileBytes,
                        wsrc + (static_cast<int64_t>(t) * p.kchunks + chunk0) * kPackBlockBytes, tile_bytes,
                        &full[stage], policy);
        if (p.tok_tma)
#pragma unroll
          for (int sb = 0; sb < Cfg::kChunksPerStage; ++sb)
            tma_load_2d(st + sb * Cfg::kTokenSubTileBytes, &p.tok_map, chunk0 * kPackK + sb * 64, it.row_begin,
                        &full[stage]);
      }
      const uint32_t tok_base = smem_addr(st) + col_off;
      const int k = chunk0 * kPackK + c * 8;
      const uint32_t src_bytes = k < p.k ? 16u : 0u;
      const uint16_t* a_col = p.a + (k < p.k ? k : 0);
      // The source rows of a batch are read from the table before any of its copies is issued: each
      // cp.async is a memory-clobbering asm, so a lookup placed after one waits for it, and under the
      // consumers' wgmmas a shared-memory load takes hundreds of cycles (one lookup per copy made the
      // producer a bottleneck, docs/perf.md step 9). The batch loop is not unrolled (fully unrolled, an
      // m128n64k128 tile, since dropped, spilled in the producer's 56 registers).
#pragma unroll 1
      for (int j0 = 0; j0 < (p.tok_tma ? 0 : kCopies); j0 += kBatch) {
        int src_row[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) src_row[j] = s_rows[row0 + (j0 + j) * kRowStep];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int row = row0 + (j0 + j) * kRowStep;
          if (src_row[j] >= 0)
            cp_async_16(tok_base + row * 128 + (((c % 8) ^ (row % 8)) << 4),
                        a_col + static_cast<int64_t>(src_row[j]) * p.a_ld, src_bytes);
        }
      }
      cp_async_arrive_noinc(&full[stage]);
      if (++stage == Cfg::kStages) {
        stage = 0;
        phase ^= 1u;
      }
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  (void)fetched_work_item(p.counters, fetched, w);  // the last fetch returned before the CTA counts itself done
  finish_work_items(p.counters, lane);
}

}  // namespace sm90
}  // namespace fp4moe
