// sm90_nvfp4w4a16_grouped: the Hopper NVFP4 weight-only grouped GEMM (one kernel: FC1, FC2, or FC1
// chained into FC2).
//
// What a CTA computes: a persistent loop over work items (op, expert, m-tile of BM packed weight rows,
// token tile of BN rows) from the device-built list, handed out dynamically by a counter in the
// tactic's workspace (sm90_scheduler.cuh); the producer passes each item to the consumers through the
// item ring in shared memory, and -1 ends the loop. For each item
//   D[BM weight rows, BN tokens] = W_e[rows, K] . X[tokens, K]^T    (weights on wgmma's M side)
// and the epilogue writes out[token, column] (sm90_epilogue.cuh).
//
// Warp roles (128 (1 + CONS) threads, tile_config.h):
//   warpgroup 0  producers (sm90_producer.cuh): warp 0 takes the work items and fills the stage ring with
//                bulk (TMA) weight copies, warp 1 with the token rows (TMA or cp.async); setmaxnreg.dec
//                to 56 (48 with two CTAs per SM); warps 2-3 leave.
//   warpgroups 1 .. CONS  consumers: setmaxnreg.inc to 224 (96 with two CTAs per SM, 104 with four
//                consumers); dequantise the NVFP4 weights into wgmma A registers and run RS wgmma
//                against the token tile (sm90_consumer.cuh).
// A chained launch of a decode batch may route it itself (LaunchParams::route): every CTA routes and groups
// the few tokens in its prologue (route_prologue) instead of reading the offsets an earlier launch wrote.
// Shared memory: the stage ring, 2 x STAGES + 16 mbarriers, the work-list table (byte offsets in
// tile_config.h). Barriers: full[s] expects 1 + 32 arrivals plus the stage's TMA bytes; empty[s]
// expects 128 CONS arrivals (every consumer thread).
// Packed weight and scale layout: sm90_layout.h (kSm90Interleaved).
#pragma once
#include <cuda.h>  // CUtensorMap (a type only; nothing from the driver library is linked)
#include <cuda_bf16.h>

#include <cstdint>

#include "common/front_block.cuh"
#include "common/pdl_launch.h"
#include "kernels/sm90_wgmma/sm90_consumer.cuh"
#include "kernels/sm90_wgmma/sm90_epilogue.cuh"
#include "kernels/sm90_wgmma/sm90_producer.cuh"
#include "kernels/sm90_wgmma/sm90_scheduler.cuh"
#include "kernels/sm90_wgmma/sm90_trace.cuh"
#include "kernels/sm90_wgmma/tile_config.h"

namespace fp4moe {
namespace sm90 {

// One grouped GEMM (FC1 or FC2) of a launch.
struct Params {
  // Contiguous token rows (a_row_index null, FC2): a 2D tensor map over a [total_rows, k] bf16 with a
  // box of 64 k x BN rows and the 128-byte swizzle, so the producer loads a token sub-tile with one TMA
  // copy instead of BN*8 16-byte cp.async copies. tok_tma = 0: the cp.async path (gathered rows, FC1).
  CUtensorMap tok_map;
  int tok_tma = 0;
  const int32_t* expert_offsets = nullptr;  // [E + 1] device, rows grouped by expert
  const uint16_t* a = nullptr;              // bf16 activations, row stride a_ld elements
  const int32_t* a_row_index = nullptr;     // [total_rows] or null: problem row r reads a[a_row_index[r]]
  int64_t a_ld = 0;                         // elements, multiple of 8
  const uint8_t* weights = nullptr;         // kSm90Interleaved packed blocks
  const float* tensor_scales = nullptr;     // FC1 [E, 2] (gate, up), FC2 [E]
  // Or null: expert E-1's packed weights and tensor scales from their own buffers (both or neither;
  // the engine's shared expert folded into the routed launch, GroupedGemmArgs::last_expert_weights).
  const uint8_t* last_weights = nullptr;
  const float* last_scales = nullptr;       // FC1 [2], FC2 [1]
  uint16_t* out = nullptr;                  // bf16 [total_rows, n]
  // 1: FC1 of a launch that routes its batch itself (LaunchParams::route): problem row r reads
  // a[token of r], the token from the CTA's own grouping in shared memory (a_row_index null, tok_tma 0).
  int rows_from_route = 0;
  int num_experts = 0;                      // <= kMaxExperts
  int n = 0;                                // output columns
  int k = 0;                                // reduction length (multiple of 16)
  int tiles64 = 0;                          // packed 64-row tiles per expert
  int kchunks = 0;                          // packed k64 chunks per expert
};

// What a launch runs: FC1 alone, FC2 alone, or FC1 chained into FC2 (op[0] FC1, op[1] FC2 reading op[0]'s output
// rows, the same experts and offsets). In a chained launch the FC2 item of token tile t waits until every FC1 item
// of t has stored its rows: each FC1 consumer warpgroup, after its stores (a split tile's last part only),
// synchronises, and one thread fences and adds 1 to t's counter and to the all-FC1 counter; the token producer
// (warp 1) of an FC2 item spins (acquire) until t's counter reaches 2 x FC1's m-tiles, or sees every FC1 item done
// (after which it checks no more), and only then loads the token rows by TMA (after a proxy fence: the rows were
// written by the generic proxy, TMA reads by the async one). The weight producer (warp 0) never waits: FC2's
// weights stream while FC1's last items finish. All FC1 items precede every FC2 item in the counter's order and no
// FC1 item waits, so every wait ends once the CTAs holding FC1 items run: the persistent grid is sized to be
// co-resident, and a CTA that is not yet resident (its SM busy with another stream's kernel) holds only its static
// first item, one of the lowest indices, and gets its SM when that kernel ends. One launch instead of two removes
// a kernel boundary: the FC1 tail overlaps FC2's first weight copies (docs/perf.md, sm90 steps 18-21).
struct LaunchParams {
  Params op[2];            // op[1] only for kChain
  // A chained launch of a decode batch may route it itself (route != 0; GroupedGemmArgs::routing): every
  // CTA runs common/front_block.cuh in its prologue, which yields the expert offsets (instead of reading
  // op[0].expert_offsets, which CTA 0 also writes) and the token of each grouped row; E <= 256, and only
  // the tiles with TileConfig::kRoutes.
  int route = 0;
  RouteFront front;
  // 1: the folded last expert's weights (Params::last_weights, both ops) are prefetched into L2 in the
  // prologue, while HBM is idle behind the routing; the host sets it where the routed FC1 tiles fit one
  // wave of CTAs, so those weights are read in the chain's tail, soon after (sm90 step 31).
  int prefetch_last = 0;
  // Workspace: [2] schedule counters, then (kChain) FC1 signals in all and one count per token tile;
  // null: the static schedule.
  int* counters = nullptr;
  // Split reduction (sm90_scheduler.cuh, choose_split): 0 automatic, 1 never, N > 1 up to N parts.
  // Workspace regions: one arrival counter per (unit, consumer warpgroup) and the fp32 partial tiles
  // of the split items, [kMaxSplitItems][consumer][M64 tile][BN/8][128 threads] float4.
  int split_mode = 1;
  int split_slots = 0;     // SMs x CTAs per SM (the automatic split's budget of items)
  int fold_parts = 1;      // the folded last expert's parts where it splits (fold_split_parts, kChain)
  int* split_counters = nullptr;
  float4* partials = nullptr;
};

// The split reduction of one consumer warpgroup's tile (split items only): stores this part's
// accumulators, counts the part in; the last part to arrive sums the S partials in part order into
// acc (bit-identical whatever the arrival order), zeroes them and the tile's counter (a run leaves the
// whole workspace zero, as GroupedGemmArgs::workspace promises, so a later run of any shape or tactic
// on the same workspace finds its counters at zero) and returns true; the others return false and
// skip the epilogue. The barriers and fences around thread 0's atomic order every thread's partial
// stores before the count and the last part's loads (L2, ld.global.cg) after it.
template <class Cfg>
__device__ __forceinline__ bool reduce_split(float (&acc)[Cfg::kM64PerConsumer][Cfg::kBN / 2],
                                             float4* __restrict__ partials, int* __restrict__ counter, int first_item,
                                             int part, int parts, int consumer, int tid, int32_t* s_flag) {
  constexpr int kVecs = Cfg::kM64PerConsumer * Cfg::kBN / 8;  // float4 per thread
  constexpr int64_t kItemVecs = int64_t(Cfg::kConsumers) * kVecs * 128;
  float4* mine = partials + (first_item + part) * kItemVecs + consumer * kVecs * 128 + tid;
#pragma unroll
  for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
    for (int v = 0; v < Cfg::kBN / 8; ++v)
      mine[(u * (Cfg::kBN / 8) + v) * 128] =
          make_float4(acc[u][4 * v], acc[u][4 * v + 1], acc[u][4 * v + 2], acc[u][4 * v + 3]);
  named_barrier_sync(1 + consumer, 128);
  if (tid == 0) {
    __threadfence();
    const bool last = atomicAdd(counter, 1) == parts - 1;
    if (last) {
      *counter = 0;  // every part has arrived: nothing else touches it in this launch
      __threadfence();
    }
    s_flag[consumer] = last ? 1 : 0;
  }
  named_barrier_sync(1 + consumer, 128);
  // Every part loads and sums; only the last one's sums are used (the others may read partials still
  // in flight, or already zeroed, and discard them): the registers are then written on every path, and
  // a reduction on the last part's path only made ptxas serialise the chained kernel's wgmmas (C7520).
  const bool last = s_flag[consumer] != 0;
  float4* first = partials + first_item * kItemVecs + consumer * kVecs * 128 + tid;
#pragma unroll
  for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
    for (int v = 0; v < Cfg::kBN / 8; ++v) {
      const float4* slot = first + (u * (Cfg::kBN / 8) + v) * 128;
      float4 sum = __ldcg(slot);
#pragma unroll 1  // unrolled, the loads in flight cost the two-CTA tiles' consumers a spill
      for (int r = 1; r < parts; ++r) {
        const float4 x = __ldcg(slot + r * kItemVecs);
        sum.x += x.x;
        sum.y += x.y;
        sum.z += x.z;
        sum.w += x.w;
      }
      acc[u][4 * v] = sum.x;
      acc[u][4 * v + 1] = sum.y;
      acc[u][4 * v + 2] = sum.z;
      acc[u][4 * v + 3] = sum.w;
    }
  if (last)  // zero the partials for the next run (after this thread's loads of the same addresses)
    for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
      for (int v = 0; v < Cfg::kBN / 8; ++v)
#pragma unroll 1
        for (int r = 0; r < parts; ++r)
          __stcg(first + (u * (Cfg::kBN / 8) + v) * 128 + r * kItemVecs, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
  return last;
}

// Route and group the batch in the prologue (common/front_block.cuh): the offsets go straight into the
// work table's copy, the token of each row into s_rows_routed; the other arrays (the routing scratch, the
// RouteFront copy, the two-level routing's candidates and staged scores, at the offsets below) use the
// stage ring's first bytes, which no copy fills before the kernel's next __syncthreads. CTA 0 stores the
// maps for finalize.
// Not inlined: inlined, its ~4,600 instructions (both routing rules, unrolled) sat in front of the main
// loop and the chained kernel ran 3 us slower at GLM-5 T=1 even when it did not route (docs/perf.md, sm90
// step 31); called, the kernel's own code is laid out as before and the call needs no stack.
// `f` is the kernel's RouteFront copied into shared memory: a called function reaches a kernel parameter
// only through a generic pointer, and each field it read was a load through the memory pipeline.
// The routing's steps in the chained launch's timeline (sm90_trace.cuh words kTraceRouteMarks..; trace builds).
struct RouteMark {
  __device__ void operator()(int step) const {
    (void)step;  // no record outside trace builds
    if (threadIdx.x == 0)
      FP4MOE_TRACE_PUT(static_cast<int>(LaunchMode::kChain), kTraceRouteMarks + step, FP4MOE_TRACE_NOW());
  }
};
constexpr int kRouteFrontOffset = 1024;  // bytes into the ring, past the routing scratch
constexpr int kRouteCandOffset = 2048;
constexpr int kRouteStagedOffset = kRouteCandOffset + 12 * kFrontMaxCands;
constexpr int kRouteScratchEnd = kRouteStagedOffset + 4 * kFrontMaxStaged;
template <class Cfg>
__device__ __noinline__ void route_prologue(const RouteFront& f, uint8_t* smem, int32_t* s_rows_routed,
                                           int32_t* s_offsets) {
  int32_t* scratch = reinterpret_cast<int32_t*>(smem);
  static_assert((3 * kFrontMaxPairs + 32) * 4 <= kRouteFrontOffset, "the routing scratch ends before the RouteFront copy");
  static_assert(kRouteFrontOffset + int(sizeof(RouteFront)) <= kRouteCandOffset, "the RouteFront copy ends before the candidates");
  static_assert(Cfg::kStages * Cfg::kStageBytes >= kRouteScratchEnd, "the routing's shared memory fits the ring");
  int32_t* cand = reinterpret_cast<int32_t*>(smem + kRouteCandOffset);
  const FrontScratch fs{scratch, reinterpret_cast<float*>(scratch + kFrontMaxPairs), scratch + 2 * kFrontMaxPairs,
                        s_rows_routed, s_offsets, scratch + 3 * kFrontMaxPairs,
                        reinterpret_cast<uint32_t*>(cand), cand + kFrontMaxCands,
                        reinterpret_cast<float*>(cand + 2 * kFrontMaxCands),
                        reinterpret_cast<float*>(smem + kRouteStagedOffset)};
  const RouteMark mark;
  if (f.sigmoid)
    front_route_permute<true, 8>(f, fs, blockIdx.x == 0, mark);
  else
    front_route_permute<false, 8>(f, fs, blockIdx.x == 0, mark);
  fence_proxy_async_smem();  // the scratch bytes before the copies (TMA: the async proxy) overwrite them
}

template <LaunchMode kMode>
__device__ __forceinline__ bool op_is_fc1(int o) {
  return kMode == LaunchMode::kFc1 || (kMode == LaunchMode::kChain && o == 0);
}

template <class Cfg, LaunchMode kMode>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm) sm90_nvfp4w4a16_grouped_kernel(const __grid_constant__ LaunchParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // Shared memory
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
  uint64_t* empty = full + Cfg::kStages;
  uint64_t* item_bar = empty + Cfg::kStages;  // [kItemRing]: warp 0 -> warp 1, one arrive per item
  int32_t* s_prefix = reinterpret_cast<int32_t*>(smem + Cfg::kTableOffset);
  int32_t* s_offsets = s_prefix + kMaxExperts + 1;
  int32_t* s_rows = s_offsets + kMaxExperts + 1;
  int32_t* s_items = s_rows + Cfg::kBN;
  int32_t* s_flag = s_items + kItemRing * kItemInts;
  using Space = ItemSpace<Cfg, kMode, LaunchParams>;
  static_assert(sizeof(Space) <= sizeof(int32_t) * (kItemSpaceInts - 1), "tile_config.h reserves too little for ItemSpace");
  Space* s_space = reinterpret_cast<Space*>(s_flag + Cfg::kConsumers);
  int32_t* s_first_fetch = reinterpret_cast<int32_t*>(s_space) + kItemSpaceInts - 1;  // the item space's last int
  int32_t* s_rows_routed = reinterpret_cast<int32_t*>(s_space) + kItemSpaceInts;  // [kRoutedRows]
  static_assert(kRoutedRows >= kFrontMaxRows, "tile_config.h reserves too few routed rows");

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int num_experts = p.op[0].num_experts;
  // Barriers
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&full[s], 1 + 32);
      mbar_init(&empty[s], Cfg::kConsumers * 128);
    }
    for (int i = 0; i < kItemRing; ++i) mbar_init(&item_bar[i], 1);
    fence_barrier_init();
  }
  // With programmatic dependent launch (common/pdl_launch.h, on unless FP4MOE_PDL=0) everything above
  // overlaps the previous kernel's tail; nothing global is touched before this wait.
  // The folded last expert's weights (LaunchParams::prefetch_last): each CTA asks L2 for its share while
  // it waits and routes (the weights are constant, so before the wait is fine).
  if (kMode == LaunchMode::kChain && p.prefetch_last && threadIdx.x == 0) {
    for (int o = 0; o < 2; ++o) {
      const Params& q = p.op[o];
      if (q.last_weights == nullptr) continue;
      const int64_t bytes = int64_t(q.tiles64) * q.kchunks * kPackBlockBytes;
      const int64_t share = (bytes / gridDim.x + 15) / 16 * 16;
      const int64_t lo = share * blockIdx.x, hi = lo + share < bytes ? lo + share : bytes;
      for (int64_t a = lo; a < hi; a += 32768)
        bulk_prefetch_l2(q.last_weights + a, static_cast<uint32_t>(hi - a < 32768 ? hi - a : 32768));
    }
  }
  pdl_wait();
  if (threadIdx.x == 0) {
    FP4MOE_TRACE_PUT(static_cast<int>(kMode), 0, FP4MOE_TRACE_SMID());
    FP4MOE_TRACE_PUT(static_cast<int>(kMode), 1, FP4MOE_TRACE_NOW());
  }
  constexpr bool kCanRoute = kMode == LaunchMode::kChain && Cfg::kRoutes;
  RouteFront* s_front = reinterpret_cast<RouteFront*>(smem + kRouteFrontOffset);
  if constexpr (kCanRoute) {
    if (p.route) {
      if (threadIdx.x == 0) *s_front = p.front;  // constant-bank loads here, shared-memory loads in the call
      __syncthreads();
    }
  }
  // The weight producer's first fetch from the item counter (its second item), issued here by warp 3, which
  // is idle until the producers start: ptxas makes the atomic a warp-aggregated one whose result shuffle
  // waits for its round trip (about 1 us) at once, which here overlaps the routing warp's logit loads or
  // warp 1's loads of the offsets instead of delaying the first weight copy (docs/perf.md, sm90 step 32).
  if (warp == 3) {
    const int fetched = fetch_work_item(p.counters, lane);
    if (lane == 0) {
      *s_first_fetch = fetched;
      FP4MOE_TRACE_PUT(static_cast<int>(kMode), kTraceFirstFetch, FP4MOE_TRACE_NOW());
    }
  }
  if constexpr (kCanRoute) {
    if (p.route) {
      route_prologue<Cfg>(*s_front, smem, s_rows_routed, s_offsets);
      if (threadIdx.x == 0) FP4MOE_TRACE_PUT(static_cast<int>(kMode), 5, FP4MOE_TRACE_NOW());
    }
  }
  if (warp == 1) {
    if (kCanRoute && p.route)
      build_work_table<Cfg::kBN, false>(s_offsets, num_experts, s_prefix, s_offsets, lane);
    else
      build_work_table<Cfg::kBN>(p.op[0].expert_offsets, num_experts, s_prefix, s_offsets, lane);
    // The launch's item space (and split choice) once per CTA, in shared memory: every role reads the
    // few fields it needs per item there instead of holding them in registers.
    __syncwarp();
    if (lane == 0) *s_space = Space(p, s_prefix);
  }
  __syncthreads();
  if (threadIdx.x == 0) FP4MOE_TRACE_PUT(static_cast<int>(kMode), 4, FP4MOE_TRACE_NOW());
  const Space& space = *s_space;

  const int wg = threadIdx.x >> 7;
  if (wg == 0) {
    // Producer
    setmaxnreg_dec<Cfg::Regs::kProducer>();
    if (warp == 0)
      run_weight_producer<Cfg, kMode>(p, smem, full, empty, item_bar, s_prefix, space, *s_first_fetch, lane);
    if (warp == 1) run_token_producer<Cfg, kMode>(p, smem, full, empty, item_bar, s_prefix, space, lane);
    return;
  }
  // Consumer
  setmaxnreg_inc<Cfg::Regs::kConsumer>();
  const int consumer = wg - 1, tid = threadIdx.x & 127;
  int stage = 0;
  uint32_t phase = 0;
  float acc[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2];
  for (int j = 0;; ++j) {
    // The producer wrote item j, decoded, into the ring before filling its first stage (or -1: no more work).
    mbar_wait(&full[stage], phase);
    const RingItem ri = get_ring_item(s_items + (j % kItemRing) * kItemInts);
    if (ri.w < 0) break;
    if (consumer == 0 && tid == 0) {
      FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 0, ri.w);
      FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 3, FP4MOE_TRACE_NOW());
    }
    const int o = ri.op, part = ri.part, unit = ri.unit;
    const Params& q = p.op[o];
    const WorkItem& it = ri.it;
    const int cta_tile0 = it.mtile * Cfg::kM64PerCta;
    const int first_tile = consumer * Cfg::kM64PerConsumer;  // within the CTA tile
    const int ntiles_valid = min(Cfg::kM64PerConsumer, q.tiles64 - cta_tile0 - first_tile);
    const int parts = Cfg::kSplitCapable ? ri.parts : 1;
    consume_item<Cfg>(smem, full, empty, q.kchunks / Cfg::kChunksPerStage / parts, first_tile, tid, acc, stage, phase);
    if (consumer == 0 && tid == 0) FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 5, FP4MOE_TRACE_NOW());
    // The epilogue reads a copy of the summed accumulators, which a split item's reduction replaces by
    // the whole tile's sum (and which the wgmmas of the next item never touch).
    float res[Cfg::kM64PerConsumer][Cfg::kBN / 2];
#pragma unroll
    for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
      for (int i = 0; i < Cfg::kBN / 2; ++i) res[u][i] = acc[u][0][i];
    bool finish = true;  // a split tile's last part to finish runs its epilogue
    if constexpr (Cfg::kSplitCapable) {
      if (parts > 1) {
        const int base = space.split_base(o);
        finish = reduce_split<Cfg>(res, p.partials, p.split_counters + (base + unit) * Cfg::kConsumers + consumer,
                                   base + unit * parts, part, parts, consumer, tid, s_flag);
      }
    }
    // Epilogue
    const bool folded = q.last_scales != nullptr && it.expert == q.num_experts - 1;
    if (op_is_fc1<kMode>(o)) {
      const float* ts = folded ? q.last_scales : q.tensor_scales + 2 * it.expert;
      const float s0 = ts[0] * kAccumulatorScale;
      const float s1 = ts[1] * kAccumulatorScale;
#pragma unroll
      for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
        if (finish && u < ntiles_valid)
          store_tile<Cfg::kBN, true>(res[u], q.out, q.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0,
                                     s1, tid);
      if (kMode == LaunchMode::kChain) {
        // This warpgroup's rows of token tile it.tile are stored: publish them to FC2's token producers
        // (the barrier orders the warpgroup's stores before thread 0's release).
        named_barrier_sync(1 + consumer, 128);
        if (tid == 0 && finish) {
          __threadfence();
          atomicAdd(&p.counters[3 + it.tile], 1);
          atomicAdd(&p.counters[2], 1);
        }
      }
    } else {
      const float s0 = (folded ? q.last_scales[0] : q.tensor_scales[it.expert]) * kAccumulatorScale;
#pragma unroll
      for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
        if (finish && u < ntiles_valid)
          store_tile<Cfg::kBN, false>(res[u], q.out, q.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0,
                                      s0, tid);
    }
    if (consumer == 0 && tid == 0) {
      FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 4, FP4MOE_TRACE_NOW());
      FP4MOE_TRACE_PUT(static_cast<int>(kMode), 3, j + 1);
    }
  }
  if (consumer == 0 && tid == 0) FP4MOE_TRACE_PUT(static_cast<int>(kMode), 2, FP4MOE_TRACE_NOW());
  // A chained launch counts the CTA done once both consumer warpgroups are past their last item (their
  // FC1 signals must precede the last CTA's reset of the tile counters). One GEMM alone needs no such
  // wait: the weight producer counts the CTA done after its last fetch, while the consumers still run,
  // which keeps the done count's round trip off the kernel's end (1-2 us at T = 1 when the consumers did
  // it for every launch).
  if (kMode == LaunchMode::kChain) {
    named_barrier_sync(1 + Cfg::kConsumers, Cfg::kConsumers * 128);  // ids 1 .. kConsumers: one per consumer
    if (consumer == 0 && tid == 0) finish_work_items(p.counters, 1 + s_prefix[num_experts]);
  }
#endif
}

}  // namespace sm90
}  // namespace fp4moe
