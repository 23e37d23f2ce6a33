// Producers of the sm90 family: two warps fill the stage ring (tile_config.h has the byte offsets).
//
// Warp 0 (run_weight_producer) takes the work items and copies the weights; warp 1
// (run_token_producer) copies the token rows. Both walk the same sequence of stages and wait on the
// same empty barriers, so neither waits for the other's copies: the weight stream, which bounds decode,
// never stops behind a token copy, a row lookup or (in a chained launch) a wait for FC1's rows, except
// the e4m3 tile's FC2 throttle (LaunchParams::fc2_throttle), which on purpose holds a chained FC2 item's
// copies a few stages behind its rows so that waiting CTAs leave HBM to the slowest FC1 tiles.
//
// Work items come from a global counter (dynamic persistent schedule): CTA b starts with item b, and
// warp 0's lane 0 takes every further item with one atomicAdd, issued after the current item's last
// copies so that its round trip overlaps the stages the ring holds (items of at most half the ring's
// stages, while enough remain, are fetched two ahead instead: run_weight_producer). Each item goes into
// the item ring in shared memory, and
// lane 0 then arrives on the ring slot's item barrier (warp 1 waits on it) and, after its first copies,
// on the item's first full barrier (the consumers read the item after waiting on that stage: the
// arrive releases, the wait acquires). When the items run out warp 0 writes -1, which sends warp 1
// home, and completes one more stage with no copies (33 plain arrivals): the consumers wake up, read
// -1 and leave. A CTA that starts late (its SM busy with another kernel) simply takes fewer items.
// Then the CTA counts itself done (a chained launch: the signal warp, after its last signal); the last CTA
// resets the counters to zero for the next launch (sm90_scheduler.cuh), or, in a chained launch with
// LaunchParams::caller_resets, the next kernel on the stream does. Without counters the items
// are b, b + gridDim.x, ..., through the same ring. Warp 0 runs at most STAGES items ahead of the
// consumers and warp 1 never behind them, so the 16-slot item ring is not overrun.
//
// Per work item and stage (k range [k0, k0 + BK); a split item covers its part of K only), after the
// stage's empty barrier has completed:
//   warp 0, lane 0  expect_tx(full, weight bytes + token bytes when they come by TMA), then one bulk copy
//            (TMA, cp.async.bulk) per valid 64-row tile: the tile's BK/64 packed blocks are contiguous
//            in global memory (expert, tile, chunk order), so one copy of BK/64 * 2304 bytes lands the
//            whole tile slice; then one arrive. L2 policy evict-first: each weight byte is used once
//            per token tile.
//   warp 1   16-byte cp.async of the token rows, chunk i = lane + 32j: row i / (BK/8), 16-byte column
//            i % (BK/8) (fixed per lane); row r reads x[a_row_index[r]] (FC1 gather) or x[r], looked up
//            once per item into a BN-entry table in shared memory and read from it in batches of 4 or
//            8 before the batch's copies are issued; stored swizzled (chunk c of a 128-byte row at
//            c ^ (row % 8)). Past K the copy zero-fills; rows past the expert's end are not copied
//            (their accumulator columns are never stored). Then every lane:
//            cp.async.mbarrier.arrive.noinc(full). The full barrier expects 1 + 32 arrivals and the
//            transaction bytes, so it completes when both the TMA bytes and every lane's copies landed.
// Contiguous token rows (no row index: FC2, and FC1 on the engine's gathered copy) come through a TMA
// tensor map instead: warp 1's lane 0 issues one 2D copy per 64-wide k sub-tile (box 64 x BN, 128-byte
// swizzle, rows past the tensor zero-filled; warp 0 counted their bytes); the lanes then only arrive.
// Gathered rows (a_row_index: Hopper TMA has no gather) keep the cp.async path, which measured 36% of
// the prefill time (docs/perf.md step 13); the engine avoids it with a gathered copy (step 15).
// In a chained launch (FC1 then FC2, sm90_nvfp4w4a16_grouped.cuh), before each token copy of an FC2 item
// warp 1 waits until FC1 has stored the rows that stage reads (Handover, sm90_scheduler.cuh).
#pragma once
#include <cstdint>

#include "kernels/sm90_wgmma/sm90_e4m3.cuh"
#include "kernels/sm90_wgmma/sm90_layout.h"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"
#include "kernels/sm90_wgmma/sm90_scheduler.cuh"
#include "kernels/sm90_wgmma/sm90_trace.cuh"
#include "kernels/sm90_wgmma/tile_config.h"

namespace fp4moe {
namespace sm90 {

// Warp 0: the work items and the weight copies.
template <class Cfg, LaunchMode kMode, class LaunchParams>
__device__ void run_weight_producer(const LaunchParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                    uint64_t* item_bar, int32_t* s_prefix,
                                    const ItemSpace<Cfg, kMode, LaunchParams>& space, int lane) {
  const int32_t* s_offsets = s_prefix + kMaxExperts + 1;
  int32_t* s_items = s_prefix + 2 * (kMaxExperts + 1) + Cfg::kBN;
  const uint64_t policy = policy_evict_first();
  int stage = 0;
  uint32_t phase = 0;
  // The first item is blockIdx.x, with no fetch at all; item j + 1 is fetched once item j's last copies
  // are issued, while the ring holds STAGES stages for the consumers, so the atomic's round trip delays no
  // copy, and the item goes to a CTA that is about STAGES stages from needing it. (Fetched when item j
  // began, a CTA took its next item up to a whole item early: at GLM-5 T=1 every CTA's second item was
  // taken before any first one had run, so the CTAs that finished early found their next items already
  // held by CTAs 30 us from them; docs/perf.md, sm90 step 33.)
  // Short items (at most half the ring's stages: TP8's FC2 of one k256 stage) are fetched ahead instead
  // while more than four items per CTA remain: at such an item's start lane 0 keeps two fetches in
  // flight (fetch_work_item_early), so the next items' round trips overlap this one's copies and waits;
  // without it each one-stage item waited about 0.7 us for its own fetch (docs/perf.md, sm90 step 38e).
  // Near the end a CTA holding items ahead would keep them from CTAs that are free (TP8 T=1: 0.7 us
  // slower with the rule unbounded, step 39). ahead0 / ahead1: the results, oldest first.
  int w = blockIdx.x;
  bool fc1_seen_done = false;  // the FC2 throttle saw every FC1 tile signalled: no more waits
  int fetched = 0;
  int ahead0 = 0, ahead1 = 0, nahead = 0;
  for (int j = 0;; ++j) {
    if (j > 0) {
      int raw = fetched;
      if (nahead > 0) {
        raw = ahead0;
        ahead0 = ahead1;
        --nahead;
      }
      w = fetched_work_item(p.counters, raw, w);
      if (j == 1 && lane == 0 && p.counters)
        FP4MOE_TRACE_PUT(static_cast<int>(kMode), kTraceFirstFetch, FP4MOE_TRACE_NOW());
    }
    if (w >= space.total) {
      // No more work: the last fetch has returned (the CTA's done count follows the sentinel), and so
      // have the fetches ahead (past the end too), read here; warp 1 goes home, and one empty stage
      // carries the sentinel to the consumers.
      if (nahead > 0) await_fetches(ahead0, nahead > 1 ? ahead1 : 0, s_items + (j % kItemRing) * kItemInts);
      if (lane == 0) {
        put_ring_item(s_items + (j % kItemRing) * kItemInts, RingItem{-1, 0, 0, 1, 0, WorkItem{}});
        mbar_arrive(&item_bar[j % kItemRing]);
      }
      mbar_wait(&empty[stage], phase ^ 1u);
      __syncwarp();
      mbar_arrive(&full[stage]);
      if (lane == 0) mbar_arrive(&full[stage]);
      if (kMode != LaunchMode::kChain && lane == 0) finish_work_items(p.counters, 0);
      break;
    }
    int wl = w, part = 0, parts = 1, sunit = 0;
    const int o = space.split(wl);
    const int unit = space.part(o, wl, part, parts, sunit);
    const auto& q = p.op[o];
    // kchunks is a multiple of the stage (kPackKAlign); a split item covers 1/S of the stages.
    const int nstages = q.kchunks / Cfg::kChunksPerStage / parts;
    const WorkItem it = find_work_item(s_prefix, s_offsets, q.num_experts, Cfg::kTileRows, space.mtiles(o), unit);
    if (lane == 0) {  // the decoded item for warp 1 and the consumers (the arrives below release it)
      put_ring_item(s_items + (j % kItemRing) * kItemInts, RingItem{w, o, part, parts, sunit, it});
      mbar_arrive(&item_bar[j % kItemRing]);
    }
    const int tile0 = it.mtile * Cfg::kM64PerCta;
    const int ntiles = min(Cfg::kM64PerCta, q.tiles64 - tile0);
    // The folded last expert's weights come from their own buffer (Params::last_weights).
    const uint8_t* wexp = q.last_weights != nullptr && it.expert == q.num_experts - 1
                              ? q.last_weights
                              : q.weights + static_cast<int64_t>(it.expert) * q.tiles64 * q.kchunks * kPackBlockBytes;
    const uint8_t* wsrc = wexp + (static_cast<int64_t>(tile0) * q.kchunks + part * nstages * Cfg::kChunksPerStage) *
                                     kPackBlockBytes;
    const uint32_t tx = Cfg::kWeightTileBytes * ntiles + (q.tok_tma ? Cfg::kTokenBytes : 0);
    if (p.fetch_ahead && p.counters != nullptr && 2 * nstages <= Cfg::kStages &&
        space.total - w > 4 * static_cast<int>(gridDim.x)) {
      if (nahead == 0) ahead0 = fetch_work_item_early(p.counters, lane);
      if (nahead <= 1) ahead1 = fetch_work_item_early(p.counters, lane);
      nahead = 2;
    }
    for (int ks = 0; ks < nstages; ++ks) {
      mbar_wait(&empty[stage], phase ^ 1u);
      if (lane == 0) {
        // The FC2 throttle (LaunchParams::fc2_throttle; the e4m3 tile only: on the bf16 tiles these
        // registers spilled in the producer). Nothing here reads FC1's rows, so plain volatile loads do;
        // the wait ends like the token producer's, every FC1 tile being earlier in the item order.
        if constexpr (kMode == LaunchMode::kChain && Cfg::kE4m3) {
          if (o == 1 && ks >= p.fc2_throttle && p.fc2_throttle > 0 && !fc1_seen_done) {
            const int g = part * nstages + ks - p.fc2_throttle;
            const int need = Handover<Cfg>::need(g, space.mtiles0);
            const volatile int* ctr = Handover<Cfg>::counters(p.counters, it.tile, Handover<Cfg>::stages(p)) + g;
            const volatile int* all = p.counters + 2;
            for (;;) {
              if (*all >= Cfg::kConsumers * space.units0) {
                fc1_seen_done = true;
                break;
              }
              if (need == 0 || *ctr >= need) break;
              __nanosleep(100);
            }
          }
        }
        if (ks == 0) FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 1, FP4MOE_TRACE_NOW());
        // Expect the bytes, issue the copies, then arrive: the arrive follows the copies in this thread,
        // so compute-sanitizer's racecheck sees the copies ordered before the consumers' wait (with
        // arrive.expect_tx ahead of the copies it reported the copies racing the consumers' reads).
        uint8_t* st = smem + stage * Cfg::kStageBytes + Cfg::kTokenBytes;
        mbar_expect_tx(&full[stage], tx);
        const uint8_t* src = wsrc + static_cast<int64_t>(ks * Cfg::kChunksPerStage) * kPackBlockBytes;
        for (int t = 0; t < ntiles; ++t)
          bulk_copy_g2s(st + t * Cfg::kWeightTileBytes, src + static_cast<int64_t>(t) * q.kchunks * kPackBlockBytes,
                        Cfg::kWeightTileBytes, &full[stage], policy);
        mbar_arrive(&full[stage]);
      }
      if (++stage == Cfg::kStages) {
        stage = 0;
        phase ^= 1u;
      }
    }
    if (nahead == 0) fetched = fetch_work_item(p.counters, lane);
  }
}

// The e4m3 tile's token stages (warp 1, every lane): the item's one token (problem row src), split stage
// by stage into the stage's e4m3 token tile (sm90_e4m3.h). Lane l takes half l % 2 of k16 block l / 2 of
// the stage: one 16-byte load (e4m3_token_load), then, once the stage is free, the pair of lanes finds
// the block's exponent and each lane stores its 8 hi and 8 lo bytes, the even lane the exponent (int32 at
// kE4m3ExponentOffset + 4 * block) and every lane's arrive on the full barrier (its 32 producer
// arrivals, as on the cp.async path: e4m3_token_store). As for the cp.async path's generic-proxy writes,
// the consumers' fence.proxy.async after their wait orders these stores before their wgmmas; a fence here
// as well compiled to MEMBAR.ALL.CTA, which waited for this lane's loads of the next stages and made every
// stage cost an L2 round trip (docs/perf.md, sm90 step 50). The loads go to L2 (ld.global.cg): in a
// chained launch FC2's rows were stored by other CTAs and are read after the acquire of their hand-over
// counters. `cache` (non-zero): the shared address of the row's element 0 in the row cache
// (TileConfig::kRowCacheK), which holds the item's K range: the load reads shared memory instead.
template <class Op>
__device__ __forceinline__ uint4 e4m3_token_load(const Op& q, uint32_t cache, int src, int stage_k, int lane) {
  const int k = stage_k + 8 * lane;
  uint4 x = make_uint4(0u, 0u, 0u, 0u);
  if (k < q.k)
    x = cache != 0u ? ld_shared_u4(cache + 2u * static_cast<uint32_t>(k))
                    : __ldcg(reinterpret_cast<const uint4*>(q.a + static_cast<int64_t>(src) * q.a_ld + k));
  return x;
}
template <class Cfg>
__device__ __forceinline__ void e4m3_token_store(const uint4& x, uint8_t* st, uint64_t* empty, uint32_t phase,
                                                 uint64_t* full, int lane) {
  static_assert(Cfg::kBK / 16 == 16, "one k16 block per pair of lanes");
  mbar_wait(empty, phase ^ 1u);
  uint2 hi, lo;
  int e;
  e4m3_split_half(x, hi, lo, e);
  const int blk = lane >> 1, kb = blk >> 2, jb = blk & 3, h = lane & 1;
  uint8_t* sub = st + (kb >> 1) * 1024;
  const int kk = 64 * (kb & 1) + 16 * jb + 8 * h;
  *reinterpret_cast<uint2*>(sub + e4m3_token_offset(2 * jb, kk)) = hi;
  *reinterpret_cast<uint2*>(sub + e4m3_token_offset(2 * jb + 1, kk)) = lo;
  if (h == 0) reinterpret_cast<int*>(st + Cfg::kE4m3ExponentOffset)[blk] = e;
  mbar_arrive(full);
}

// Bits 0 .. n - 1 of a lane mask (all 32 for n >= 32): a poll window's stages.
__device__ __forceinline__ uint32_t low_bits(int n) { return n >= 32 ? 0xffffffffu : (1u << n) - 1u; }

// Warp 1: the token rows of every stage. row_bar (the e4m3 tile; unused by the others): the row cache's
// barrier, one phase per row copied (run by this warp only).
template <class Cfg, LaunchMode kMode, class LaunchParams>
__device__ void run_token_producer(const LaunchParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                   uint64_t* item_bar, int32_t* s_prefix,
                                   const ItemSpace<Cfg, kMode, LaunchParams>& space, uint64_t* row_bar, int lane) {
  int32_t* s_rows = s_prefix + 2 * (kMaxExperts + 1);
  const int32_t* s_items = s_rows + Cfg::kBN;
  // The token of each grouped row of a batch the launch routed itself (after the item space).
  const int32_t* s_rows_routed = s_items + kItemRing * kItemInts + kSignalRing * kSignalInts + kItemSpaceInts;
  // A chained FC2 stage's rows are ready when the consumer warpgroups of each FC1 m-tile they come from
  // signalled them (Handover). Only the part of a split FC1 tile that finishes it signals.
  const int fc1_all = Cfg::kConsumers * space.units0;  // every FC1 tile signalled
  const int fc2_stages = kMode == LaunchMode::kChain ? Handover<Cfg>::stages(p) : 0;
  bool fc1_done = false;
  uint32_t row_phase = 0;  // the row cache's barrier phase (the e4m3 tile)
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
  for (int j = 0;; ++j) {
    mbar_wait(&item_bar[j % kItemRing], static_cast<uint32_t>(j / kItemRing) & 1u);
    const RingItem ri = get_ring_item(s_items + (j % kItemRing) * kItemInts);
    if (ri.w < 0) break;
    const int o = ri.op;
    const WorkItem& it = ri.it;
    const auto& q = p.op[o];
    const int nstages = q.kchunks / Cfg::kChunksPerStage / ri.parts;
    const int stage0 = ri.part * nstages;  // a split item's first stage of the tile's K range
    // Source row of each token of the tile (-1 past the expert's rows), read once per item.
    __syncwarp();
    for (int r = lane; r < Cfg::kBN; r += 32) {
      const int row = it.row_begin + r;
      s_rows[r] = row < it.row_end ? (q.rows_from_route ? s_rows_routed[row] : q.a_row_index ? q.a_row_index[row] : row) : -1;
    }
    __syncwarp();
    // FC1's rows for this FC2 item: once every FC1 item is seen done no later item checks (each acquire is
    // a round trip to L2, which measured 2-3% at T = 128 when paid per item); until then each stage waits
    // for its own rows. `ready` bit i: stage rbase + i's rows are stored, from one poll in which lane i
    // loads that stage's counter (acquire; all lanes' loads in flight together); after the warp's barrier
    // lane 0 orders the async proxy's reads (TMA) after what the acquires made visible.
    bool wait_rows = false;
    uint32_t ready = 0;
    int rbase = 0;
    const int* stage_counters = Handover<Cfg>::counters(p.counters, it.tile, fc2_stages);
    const auto poll = [&](int from) {
      const int g = from + lane;
      const int need = g < fc2_stages ? Handover<Cfg>::need(g, space.mtiles0) : 0;
      ready = __ballot_sync(0xffffffffu, need == 0 || ld_acquire_gpu(&stage_counters[g]) >= need);
      rbase = from;
      __syncwarp();
      if (lane == 0) fence_proxy_async_global();
    };
    // Whether stage g's rows are known stored (always, where the item waits for none), and the wait for them.
    const auto rows_known = [&](int g) {
      return !(kMode == LaunchMode::kChain && wait_rows) ||
             (g >= rbase && g - rbase < 32 && ((ready >> (g - rbase)) & 1u));
    };
    const auto await_rows = [&](int g) {
      if (!rows_known(g)) {
        do poll(g);
        while ((ready & 1u) == 0u);
      }
    };
    if (kMode == LaunchMode::kChain && o == 1 && !fc1_done) {
      if (lane == 0 && ld_acquire_gpu(&p.counters[2]) >= fc1_all) {
        fc1_done = true;
        fence_proxy_async_global();
      }
      fc1_done = __shfl_sync(0xffffffffu, fc1_done, 0);
      wait_rows = !fc1_done;
      if (wait_rows && !p.stage_wait) {  // the control: every stage's rows before the first copy
        for (int g0 = stage0; g0 < stage0 + nstages; g0 += 32) {
          const uint32_t all = low_bits(stage0 + nstages - g0);
          do poll(g0);
          while ((ready & all) != all);
        }
        wait_rows = false;
      }
    }
    if constexpr (Cfg::kE4m3) {
      // Each lane keeps the loads of up to kAhead - 1 later stages in flight while it splits one (unrolled
      // by kAhead, so each load has its own registers): a load waited for at every stage would cost the
      // L2 round trip per stage wherever the weights arrive faster than that (the launch's tail). A
      // chained FC2 stage is loaded ahead only once the last poll showed its rows stored; else at its turn,
      // after the wait.
      constexpr int kAhead = 3;
      const int src = s_rows[0];
      // The item's K range of its row, copied into the row cache at once where every stage's rows are known
      // stored (always for FC1) and fit: then the stages split from shared memory.
      uint32_t cache = 0u;  // the shared address of the row's element 0 (k0 of it is the cache's first byte)
      const int k0 = stage0 * Cfg::kBK;
      const int kn = min(nstages * Cfg::kBK, q.k - k0);
      if (kMode == LaunchMode::kChain && wait_rows && kn <= Cfg::kRowCacheK) {
        poll(stage0);
        const uint32_t all = low_bits(nstages);
        if ((ready & all) == all) wait_rows = false;
      }
      if (!(kMode == LaunchMode::kChain && wait_rows) && kn <= Cfg::kRowCacheK) {
        uint8_t* buf = smem + Cfg::kRowCacheOffset;
        __syncwarp();
        if (lane == 0) {
          fence_proxy_async_smem();  // this warp's reads of the previous row before the copy's writes
          const uint32_t bytes = static_cast<uint32_t>(kn) * 2u;
          mbar_expect_tx(row_bar, bytes);
          bulk_copy_g2s(buf, q.a + static_cast<int64_t>(src) * q.a_ld + k0, bytes, row_bar, policy_evict_normal());
          mbar_arrive(row_bar);
        }
        mbar_wait(row_bar, row_phase);
        row_phase ^= 1u;
        cache = smem_addr(buf) - 2u * static_cast<uint32_t>(k0);
      }
      uint4 x[kAhead];
      int issued = 0;  // stages [0, issued) of the item have their loads issued
      for (int ks0 = 0; ks0 < nstages; ks0 += kAhead) {
#pragma unroll
        for (int r = 0; r < kAhead; ++r) {
          const int ks = ks0 + r;
          if (ks < nstages) {
            if (ks >= issued) {
              const int g = stage0 + ks;
              await_rows(g);
              x[r] = e4m3_token_load(q, cache, src, g * Cfg::kBK, lane);
              issued = ks + 1;
            }
#pragma unroll
            for (int d = 1; d < kAhead; ++d)
              if (ks + d == issued && issued < nstages && rows_known(stage0 + issued)) {
                x[(r + d) % kAhead] = e4m3_token_load(q, cache, src, (stage0 + issued) * Cfg::kBK, lane);
                ++issued;
              }
            if (ks == 0 && lane == 0) FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 2, FP4MOE_TRACE_NOW());
            e4m3_token_store<Cfg>(x[r], smem + stage * Cfg::kStageBytes, &empty[stage], phase, &full[stage], lane);
            if (++stage == Cfg::kStages) {
              stage = 0;
              phase ^= 1u;
            }
          }
        }
      }
    } else {
      for (int ks = 0; ks < nstages; ++ks) {
        const int chunk0 = (stage0 + ks) * Cfg::kChunksPerStage;
        await_rows(stage0 + ks);
        if (ks == 0 && lane == 0) FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 2, FP4MOE_TRACE_NOW());
        mbar_wait(&empty[stage], phase ^ 1u);
        uint8_t* st = smem + stage * Cfg::kStageBytes;
        if (q.tok_tma) {
          if (lane == 0)
  #pragma unroll
            for (int sb = 0; sb < Cfg::kChunksPerStage; ++sb)
              tma_load_2d(st + sb * Cfg::kTokenSubTileBytes, &q.tok_map, chunk0 * kPackK + sb * 64, it.row_begin,
                          &full[stage]);
        } else {
          const uint32_t tok_base = smem_addr(st) + col_off;
          const int k = chunk0 * kPackK + c * 8;
          const uint32_t src_bytes = k < q.k ? 16u : 0u;
          const uint16_t* a_col = q.a + (k < q.k ? k : 0);
          // The source rows of a batch are read from the table before any of its copies is issued: each
          // cp.async is a memory-clobbering asm, so a lookup placed after one waits for it, and under the
          // consumers' wgmmas a shared-memory load takes hundreds of cycles (one lookup per copy made the
          // producer a bottleneck, docs/perf.md step 9). The batch loop is not unrolled (fully unrolled, an
          // m128n64k128 tile, since dropped, spilled in the producer's 56 registers).
  #pragma unroll 1
          for (int j0 = 0; j0 < kCopies; j0 += kBatch) {
            int src_row[kBatch];
  #pragma unroll
            for (int jj = 0; jj < kBatch; ++jj) src_row[jj] = s_rows[row0 + (j0 + jj) * kRowStep];
  #pragma unroll
            for (int jj = 0; jj < kBatch; ++jj) {
              const int row = row0 + (j0 + jj) * kRowStep;
              if (src_row[jj] >= 0)
                cp_async_16(tok_base + row * 128 + (((c % 8) ^ (row % 8)) << 4),
                            a_col + static_cast<int64_t>(src_row[jj]) * q.a_ld, src_bytes);
            }
          }
        }
        cp_async_arrive_noinc(&full[stage]);
        if (++stage == Cfg::kStages) {
          stage = 0;
          phase ^= 1u;
        }
      }
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
}

}  // namespace sm90
}  // namespace fp4moe
