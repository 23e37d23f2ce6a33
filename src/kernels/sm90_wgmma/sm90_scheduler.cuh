// Scheduler of the sm90 family: the device-built work list of a persistent grid.
//
// Work item = (op, expert e, CTA m-tile mt, token tile tt[, K part r]). Expert e has rows_e = offsets[e+1] -
// offsets[e] rows and tiles_e = ceil(rows_e / BN) token tiles (BN: the tile's token rows per item,
// TileConfig::kTileRows, 1 on the e4m3 tile); an op (FC1 or FC2) with `mtiles` m-tiles
// (BM packed rows each) has units_e = tiles_e * mtiles tiles (units) of expert e, one work item each
// unless the op splits K (below: S items per unit). At kernel start one warp reads
// the E+1 offsets (the host never sees them) and writes into shared memory
//   prefix[e] = sum of tiles_f for f < e   (prefix[E] = token tiles)   and   offsets[e] (a copy),
// so token tile tt of expert e has the launch-wide id prefix[e] + tt, and an op's units of expert e are
// [prefix[e] * mtiles, prefix[e+1] * mtiles). A launch runs one op, or two chained (FC1 then FC2 on
// FC1's output, sm90_nvfp4w4a16_grouped.cuh): items 0 .. n1-1 are FC1's, n1 .. n1+n2-1 FC2's.
// CTA b starts with item b; later items come in order from a global counter (fetch_work_item: one
// atomicAdd per item by the producer, which passes the item to its consumers through shared memory,
// sm90_producer.cuh), so a CTA that starts late because its SM is busy (the shared expert on the side
// stream, another stream's kernel) takes fewer items instead of delaying the whole grid, as a static b,
// b + gridDim.x, ... stride did (docs/perf.md, sm90 step 16). Within an op, unit w belongs to the
// expert e with prefix[e] <= w / mtiles < prefix[e+1] (find_work_item), local = w - prefix[e] * mtiles,
// mt = local / tiles_e, tt = local % tiles_e: consecutive items are the token tiles of one m-tile, so
// CTAs running at the same time read the same weight rows (one HBM read, the rest from L2).
//
// The counters in the tactic's workspace (next item, CTAs done, then for a chained launch FC1's
// signals: all of them, and one count per token tile and FC2 stage, Handover) are zero before a launch
// and zero again after it: the last CTA to finish resets them (finish_work_items), and the last part of
// a split tile resets that tile's arrival counter, so graph replays need no memset. (A chained launch with
// GroupedGemmArgs::caller_resets leaves the first chained_reset_bytes to the caller, which zeroes them in
// the next kernel on the stream: the engine's finalize.) Whoever allocates
// the workspace zeroes it once (GroupedGemmTactic::workspace_bytes). Without a workspace (or with
// FP4MOE_SM90_STATIC_SCHEDULE=1) CTA b takes items b, b + gridDim.x, ..., the same item ring and
// sentinel, no atomics.
#pragma once
#include <climits>
#include <cstdint>

#include "common/warp_scan.cuh"
#include "kernels/sm90_wgmma/tile_config.h"

namespace fp4moe {
namespace sm90 {

// What one launch runs (sm90_nvfp4w4a16_grouped.cuh): one GEMM, or FC1 chained into FC2.
enum class LaunchMode { kFc1, kFc2, kChain };

struct WorkItem {
  int expert = 0;
  int tile = 0;        // launch-wide token tile id: prefix[expert] + tt
  int mtile = 0;       // CTA m-tile within the expert
  int row_begin = 0;   // first problem row of the token tile
  int row_end = 0;     // one past the last valid row (row_begin < row_end <= row_begin + BN)
};

// One warp builds the table. num_experts <= kMaxExperts (checked on the host). kCopy = false: offsets is
// s_offsets itself (a launch that routed its batch in shared memory), which then is not written. (A
// run-time flag instead of the template parameter changed how the copying loop compiled: every kernel's
// start measured about 1 us later.)
template <int BN, bool kCopy = true>
__device__ void build_work_table(const int32_t* offsets, int num_experts, int32_t* s_prefix, int32_t* s_offsets,
                                 int lane) {
  constexpr bool copy = kCopy;
  const int per_lane = (num_experts + 31) / 32;
  const int first = lane * per_lane;
  int local = 0;
  for (int i = 0; i < per_lane; ++i) {
    const int e = first + i;
    if (e < num_experts) {
      const int lo = offsets[e], hi = offsets[e + 1];
      if (copy) s_offsets[e] = lo;
      local += (hi - lo + BN - 1) / BN;
    }
  }
  const int incl = warp_inclusive_sum(local, lane);
  int run = incl - local;
  for (int i = 0; i < per_lane; ++i) {
    const int e = first + i;
    if (e < num_experts) {
      s_prefix[e] = run;
      run += (offsets[e + 1] - offsets[e] + BN - 1) / BN;
    }
  }
  if (lane == 31) {
    s_prefix[num_experts] = incl;
    if (copy) s_offsets[num_experts] = offsets[num_experts];
  }
}

// A slot of the item ring in shared memory: the weight producer decodes each item it takes (op, K part,
// unit, find_work_item's tile) once and writes it here; the token producer and the consumers read the
// fields instead of decoding the item again (each decode is a few dependent shared-memory loads, which
// queue behind the consumers' wgmma reads; docs/perf.md, sm90 step 29). w < 0 ends the loop.
struct RingItem {
  int w;      // launch-wide item index, or -1
  int op;     // 0, or 1 for a chained launch's FC2
  int part;   // K part of a split item (0 otherwise)
  int parts;  // K parts of its unit (1: not split)
  int unit;   // its unit's index in the split workspace (ItemSpace::part)
  WorkItem it;
};
__device__ __forceinline__ void put_ring_item(int32_t* slot, const RingItem& r) {
  slot[0] = r.w;
  slot[1] = r.op;
  slot[2] = r.part;
  slot[3] = r.parts;
  slot[4] = r.unit;
  slot[5] = r.it.expert;
  slot[6] = r.it.tile;
  slot[7] = r.it.mtile;
  slot[8] = r.it.row_begin;
  slot[9] = r.it.row_end;
}
__device__ __forceinline__ RingItem get_ring_item(const int32_t* slot) {
  RingItem r;
  r.w = slot[0];
  r.op = slot[1];
  r.part = slot[2];
  r.parts = slot[3];
  r.unit = slot[4];
  r.it.expert = slot[5];
  r.it.tile = slot[6];
  r.it.mtile = slot[7];
  r.it.row_begin = slot[8];
  r.it.row_end = slot[9];
  return r;
}
static_assert(sizeof(RingItem) == kItemInts * sizeof(int32_t), "tile_config.h sizes the ring slots");

// Items 0 .. gridDim.x - 1 go to the CTAs of the same index; later items are handed out by the counter.
// fetch_work_item issues the atomic on lane 0 (the weight producer's, after an item's last copies;
// fetch_work_item_early for short items, ahead of them); fetched_work_item turns the result into the
// item index on every lane.
// Without counters (null) the schedule is the static stride: item w is followed by w + gridDim.x.
// ptxas turns the atomic into a warp-aggregated one whose result shuffle waits for it at once: the warp
// stalls for the round trip right here (the weight producer fetches after issuing the current item's last
// copies, while the ring holds the stages the consumers have not reached).
__device__ __forceinline__ int fetch_work_item(int* counters, int lane) {
  return counters && lane == 0 ? atomicAdd(&counters[0], 1) : 0;
}
// A fetch whose result is read later (the producer's fetches ahead of short items): lane 0's atomic as
// one instruction, which the warp waits for only where the result is read. An add, even in inline PTX
// under a lane-0 branch, ptxas makes a warp-aggregated atomic whose result shuffle waits at once; an
// increment (wrapping at INT_MAX, far above any item count) it leaves alone.
__device__ __forceinline__ int fetch_work_item_early(int* counters, int lane) {
  unsigned r = 0;
  if (lane == 0)
    asm volatile("atom.global.inc.u32 %0, [%1], %2;" : "=r"(r) : "l"(counters), "r"(0x7fffffffu) : "memory");
  return static_cast<int>(r);
}
// Waits until fetches ahead have returned (their results unused: past the last item): the test reads
// both, and its store (to a slot rewritten right after) is never taken, since the counter stays far
// below INT_MIN's magnitude.
__device__ __forceinline__ void await_fetches(int a, int b, volatile int32_t* sink) {
  if (a == INT_MIN && b == INT_MIN) *sink = 0;
}
__device__ __forceinline__ int fetched_work_item(const int* counters, int fetched, int prev) {
  return counters ? static_cast<int>(gridDim.x) + __shfl_sync(0xffffffffu, fetched, 0)
                  : prev + static_cast<int>(gridDim.x);
}

// After every fetch of this CTA has returned and its consumers have signalled their last item: count
// the CTA done; the last CTA resets the counters and the `extra` counters after them (a chained
// launch's FC1 signals: 1 + token tiles x FC2 stages; 0 otherwise). The fence orders this CTA's
// fetches, signals and waits before its done increment, so when the last CTA sees every other CTA
// done, nothing of this launch still touches them.
__device__ __forceinline__ void finish_work_items(int* counters, int extra) {
  if (!counters) return;
  __threadfence();
  if (atomicAdd(&counters[1], 1) == static_cast<int>(gridDim.x) - 1) {
    atomicExch(&counters[0], 0);
    atomicExch(&counters[1], 0);
    int i = 0;  // 16-byte stores where aligned (the workspace is; a chained launch has a few hundred)
    for (; i < extra && ((2 + i) & 3) != 0; ++i) counters[2 + i] = 0;
    for (; i + 4 <= extra; i += 4) *reinterpret_cast<int4*>(counters + 2 + i) = make_int4(0, 0, 0, 0);
    for (; i < extra; ++i) counters[2 + i] = 0;
  }
}

// Split reduction (split-K). An op whose tiles are too few to fill the grid splits each tile's K range
// into S parts (a power of two, S <= kMaxSplit, dividing the op's stages): a tile (unit) u becomes the
// items u*S .. u*S + S-1, part r covering stages [r * nstages/S, (r+1) * nstages/S). Parts 0 .. S-2
// store their fp32 accumulators to the workspace and count themselves in at the tile's counter; part
// S-1 waits for that count, sums the partials in part order with its own last (so the result does not
// depend on the arrival order) and runs the epilogue (reduce_split, sm90_nvfp4w4a16_grouped.cuh).
// The choice is made on the device from the tile count (the host never sees the expert offsets), the
// same in every CTA:
//   mode 0 (automatic): double S while the op's items (units * 2S) still fit the machine's CTA slots
//                       (SMs x CTAs per SM: LaunchParams::split_slots) once, every part
//                       keeps at least kMinAutoSplitStages stages, and the splits fit kMaxSplitItems.
//                       An op with about as many units as CTAs does not split: at GLM-5 T=1 (256 FC1
//                       units, 264 CTAs) two half-length items per CTA measured 12% slower than one
//                       (docs/perf.md, sm90 step 22);
//   mode 1:             no split;
//   mode N > 1:         the largest S <= N that divides the stages and fits (tests and experiments).
__device__ __forceinline__ int choose_split(bool capable, int mode, int units, int nstages, int budget, int slots) {
  if (!capable || mode == 1 || units == 0) return 1;
  const int cap = mode == 0 ? kMaxSplit : min(mode, kMaxSplit);
  const int min_stages = mode == 0 ? kMinAutoSplitStages : 1;
  int s = 1;  // a power of two: the tests below are a mask and a product, not run-time divisions
  while (2 * s <= cap && (nstages & (2 * s - 1)) == 0 && nstages >= 2 * s * min_stages && units * 2 * s <= budget &&
         (mode != 0 || units * 2 * s <= slots))
    s *= 2;
  return s;
}

// The items of a launch: op 0's first, then (a chained launch) op 1's; split() turns a launch-wide item
// into its op (0, or 1 for a chained launch's FC2) and its item within the op; part() then turns that
// into the op's unit (the tile find_work_item locates), its K part, and the unit's index in the split
// workspace. Built once per CTA into shared memory (sm90_nvfp4w4a16_grouped.cuh).
//
// The folded last expert (a chained launch whose FC1 reads expert E-1's weights from their own buffer,
// Params::last_weights: the engine's shared expert, which holds every token). Where FC1 does not split
// (split0 == 1) and the other experts' units fit the machine's CTA slots once but the last expert's
// units would spill into a second wave of whole tiles (GLM-5 at T = 1: 128 + 16 FC1 tiles of 24 k256
// stages on 132 SMs), its units are split into parts no longer than an FC2 item (24 stages, FC2 8: three
// parts of 8; the rule is fold_split_parts in tile_config.h): op 0's items are the other units, one item
// each, then the xunits * xsplit parts, which the CTAs left over from the first wave and then the first to
// finish take. Measured at GLM-5 T = 1 (docs/perf.md, sm90 step 30): whole tiles 88.0 us against 75.9-76.4
// for 3 parts; with the parts first in the order 85.7-94.3, and again 72.3-72.8 against 67.9 in step 33
// (the routed FC1 tiles the parts' CTAs take second delay their experts' FC2).
template <class Cfg, LaunchMode kMode, class LaunchParams>
struct ItemSpace {
  int mtiles0, mtiles1;
  int units0, units1;    // tiles of each op: token tiles x m-tiles
  int split0, split1;    // K parts per unit (1: no split)
  int xunits, xsplit;    // the folded last expert's FC1 units and their parts (0, 1: none)
  int items0, total;
  int split_base1;       // op 1's first item and unit in the split workspace (after op 0's, if it split)
  __device__ ItemSpace(const LaunchParams& p, const int32_t* s_prefix) {
    const int tiles = s_prefix[p.op[0].num_experts];
    mtiles0 = (p.op[0].tiles64 + Cfg::kM64PerCta - 1) / Cfg::kM64PerCta;
    mtiles1 = (p.op[1].tiles64 + Cfg::kM64PerCta - 1) / Cfg::kM64PerCta;
    units0 = tiles * mtiles0;
    units1 = kMode == LaunchMode::kChain ? tiles * mtiles1 : 0;
    const int mode = p.split_mode;
    const int stages0 = p.op[0].kchunks / Cfg::kChunksPerStage;
    split0 = choose_split(Cfg::kSplitCapable, mode, units0, stages0, kMaxSplitItems, p.split_slots);
    xunits = 0;
    xsplit = 1;
    if (kMode == LaunchMode::kChain && Cfg::kSplitCapable && p.op[0].last_weights != nullptr && split0 == 1 &&
        mode != 1) {
      const int last = (tiles - s_prefix[p.op[0].num_experts - 1]) * mtiles0;
      const int s = p.fold_parts;  // fold_split_parts(FC1's stages, FC2's stages)
      if (last > 0 && units0 - last <= p.split_slots && units0 > p.split_slots && s > 1 && last * s <= kMaxSplitItems) {
        xunits = last;
        xsplit = s;
      }
    }
    items0 = units0 * split0 + xunits * (xsplit - 1);
    split_base1 = split0 > 1 ? items0 : xunits * xsplit;
    split1 = choose_split(Cfg::kSplitCapable, mode, units1, p.op[1].kchunks / Cfg::kChunksPerStage,
                          kMaxSplitItems - split_base1, p.split_slots);
    total = items0 + units1 * split1;
  }
  // Splits w into (op, item within the op); returns the op.
  __device__ int split(int& w) const {
    if (kMode == LaunchMode::kChain && w >= items0) {
      w -= items0;
      return 1;
    }
    return 0;
  }
  __device__ int mtiles(int o) const { return o ? mtiles1 : mtiles0; }
  // Item w of op o -> its unit (returned), its K part r of `parts`, and the unit's index in the split
  // workspace (`sunit`; its parts are that op's items sunit * parts .. + parts - 1 there).
  __device__ int part(int o, int w, int& r, int& parts, int& sunit) const {
    if (o == 0 && xunits > 0) {
      const int others = units0 - xunits;
      if (w >= others) {  // a part of the last expert's units
        const int x = w - others;
        r = x % xsplit;
        parts = xsplit;
        sunit = x / xsplit;
        return others + sunit;
      }
      r = 0;
      parts = 1;
      sunit = 0;
      return w;
    }
    parts = o ? split1 : split0;
    if (parts == 1) {  // most items: no run-time division on the producer's path
      r = 0;
      sunit = w;
      return w;
    }
    r = w % parts;
    sunit = w / parts;
    return sunit;
  }
  // Op o's first index in the split workspace (items and units alike: units <= items).
  __device__ int split_base(int o) const { return o ? split_base1 : 0; }
};

// The chained launch's hand-over from FC1 to FC2 by FC2 stage (docs/perf.md, sm90 step 45). FC1's CTA m-tile j
// stores output columns [j*C, (j+1)*C), C = BM/2, which are FC2's reduction columns; FC2's stage g (k range
// [g*BK, (g+1)*BK) of an unsplit item, the same for every FC2 item) reads the rows of the FC1 m-tiles that
// overlap it. The signal warp adds CONS to the counter of each (token tile, stage) pair an FC1 m-tile
// overlaps, once that tile's rows are stored; FC2's token producer copies stage g's rows once the pair's
// counter reaches `need(g)`. So an FC2 item starts as soon as the FC1 m-tiles of its first stage are
// stored, not all of its token tile's: at GLM-5 T=1 an expert's 16 FC1 tiles end 35 to 42 us into the
// launch and its FC2 items, which waited for the last of them, now start on the first two.
// Counters: the workspace's ints from 3 on, [token tile][stage]; `stages` = FC2's stages per unsplit item.
template <class Cfg>
struct Handover {
  static constexpr int kCols = Cfg::kBM / 2;  // FC1 output columns per CTA m-tile
  template <class LaunchParams>
  __device__ static int stages(const LaunchParams& p) { return p.op[1].kchunks / Cfg::kChunksPerStage; }
  // Token tile t's counters (stage g at [g]); the host sizes them (sm90_nvfp4w4a16_grouped.cu, chain_stages).
  __device__ static int* counters(int* base, int t, int stages) { return base + 3 + t * stages; }
  __device__ static int first_group(int mtile) { return mtile * kCols / Cfg::kBK; }
  __device__ static int last_group(int mtile, int stages) {
    const int g = ((mtile + 1) * kCols - 1) / Cfg::kBK;
    return g < stages - 1 ? g : stages - 1;
  }
  // The count at which stage g's rows are complete: CONS per overlapping FC1 m-tile (0 past FC1's columns).
  __device__ static int need(int g, int mtiles) {
    const int lo = g * Cfg::kBK / kCols;
    const int hi0 = ((g + 1) * Cfg::kBK - 1) / kCols;
    const int hi = hi0 < mtiles - 1 ? hi0 : mtiles - 1;
    return hi >= lo ? (hi - lo + 1) * Cfg::kConsumers : 0;
  }
};

// Unit w (0-based within its op) of an op with `mtiles` m-tiles. Called by whole warps (every lane
// with the same w). The expert is found by a two-level search across the warp's lanes, two dependent
// shared-memory loads instead of a binary search's log2(E) (eight for 256 experts): under the
// consumers' wgmma traffic each such load takes hundreds of cycles, and an item of one k256 stage
// (the TP8 shard's FC2, K = 256) decoded in every role paid them on each item (docs/perf.md, sm90 step 29).
__device__ __forceinline__ WorkItem find_work_item(const int32_t* s_prefix, const int32_t* s_offsets,
                                                   int num_experts, int bn, int mtiles, int w) {
  // Largest e < E with prefix[e] <= w / mtiles (prefix is non-decreasing, prefix[0] = 0 and prefix[E] >
  // w / mtiles); experts without rows occupy no range, so prefix[e+1] > w / mtiles. Level one: lane l
  // tests expert l * S (S = ceil(E / 32) <= 16); the highest passing lane names the block of S experts
  // that holds e. Level two: lane l tests expert block + l.
  const int t = w / mtiles;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int stride = (num_experts + 31) >> 5;
  const int e1 = lane * stride;
  const unsigned b1 = __ballot_sync(0xffffffffu, e1 < num_experts && s_prefix[e1] <= t);
  const int base = (31 - __clz(b1)) * stride;
  const int e2 = base + lane;
  const unsigned b2 = __ballot_sync(0xffffffffu, lane < stride && e2 < num_experts && s_prefix[e2] <= t);
  const int lo = base + (31 - __clz(b2));
  WorkItem it;
  it.expert = lo;
  const int row0 = s_offsets[lo], rows = s_offsets[lo + 1] - row0;
  const int tiles = (rows + bn - 1) / bn;
  const int local = w - s_prefix[lo] * mtiles;
  it.mtile = local / tiles;
  const int tt = local - it.mtile * tiles;
  it.tile = s_prefix[lo] + tt;
  it.row_begin = row0 + tt * bn;
  it.row_end = min(row0 + rows, it.row_begin + bn);
  return it;
}

}  // namespace sm90
}  // namespace fp4moe
