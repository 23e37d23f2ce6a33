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
//                to 56 (48 with two CTAs per SM, 40 with four consumers); in a chained launch warp 2 signals
//                what the consumers stored (run_signal_warp: the GPU-scope fences and counts off their
//                path); the other warps leave.
//   warpgroups 1 .. CONS  consumers: setmaxnreg.inc to 224 (96 with two CTAs per SM, 104 with four
//                consumers); dequantise the NVFP4 weights into wgmma A registers and run RS wgmma
//                against the token tile (sm90_consumer.cuh).
// A chained launch of a decode batch may route it itself (LaunchParams::route): every CTA routes and groups
// the few tokens in its prologue (route_prologue) instead of reading the offsets an earlier launch wrote.
// Shared memory: the stage ring, 2 x STAGES + 16 + 2 x kSignalRing mbarriers, the work-list table (byte
// offsets in tile_config.h). Barriers: full[s] expects 1 + 32 arrivals plus the stage's TMA bytes; empty[s]
// expects 128 CONS arrivals (every consumer thread).
// Packed weight and scale layout: sm90_layout.h (kSm90Interleaved).
// The e4m3 tile (TileConfig ACT = 8, sm90_e4m3.h) runs the same kernel with items of one token: warp 1's
// lanes load and split that token's activations into each stage's e4m3 token tile (e4m3_token_load,
// e4m3_token_store) instead of copying bf16 rows, the consumers run consume_item_e4m3 on the kSm90E4m3
// layout, and the epilogue stores the token's column from the quad sums. Where an item's row is known stored
// and fits, warp 1 first copies it into the row cache in shared memory (TileConfig::kRowCacheK).
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
  const uint8_t* weights = nullptr;         // packed blocks (kSm90Interleaved; kSm90E4m3 on the e4m3 tile)
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
// rows, the same experts and offsets). In a chained launch each stage of an FC2 item of token tile t waits until
// the FC1 items of t whose output columns are that stage's k range have stored their rows: after an FC1 item's
// stores (a split tile's last part only) every consumer thread arrives at the signal warp, which fences and adds
// the consumer warpgroups' count to the counter of each (t, FC2 stage) the item's m-tile overlaps and to the
// all-FC1 counter (run_signal_warp, Handover in sm90_scheduler.cuh); before a stage's copy the token producer
// (warp 1) of an FC2 item spins (acquire) until that stage's counter is complete, or sees every FC1 item done
// (after which it checks no more), and only then loads the token rows by TMA (after a proxy fence: the rows were
// written by the generic proxy, TMA reads by the async one). The weight producer (warp 0) does not wait for
// them (except the e4m3 tile's FC2 throttle, LaunchParams::fc2_throttle, which keeps its copies at most D
// stages ahead of the stored rows): FC2's weights stream while FC1's last items finish. Every item waits only
// for earlier items in the counter's order (an FC2 item for FC1 items, which all precede it; a split FC1
// tile's last part for its other parts), and each CTA runs its items in the order it took them, so every wait
// ends once the CTAs holding the earlier items run:
// the persistent grid is sized to be co-resident, and a CTA that is not yet resident (its SM busy with another
// stream's kernel) holds only its static first item, one of the lowest indices, and gets its SM when that kernel
// ends (a launch of one GEMM never waits: reduce_split_any_order). One launch instead of two removes
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
  // Workspace: [2] schedule counters, then (kChain) FC1 signals in all and one count per token tile and
  // FC2 stage (Handover, sm90_scheduler.cuh); null: the static schedule.
  int* counters = nullptr;
  // kChain: 1, an FC2 item's token producer waits for each stage's FC1 rows before that stage's copy; 0
  // (FP4MOE_SM90_STAGE_WAIT=0, the control of docs/perf.md's sm90 step 45), for all of its stages'
  // rows before the first.
  int stage_wait = 1;
  // Split reduction (sm90_scheduler.cuh, choose_split): 0 automatic, 1 never, N > 1 up to N parts.
  // Workspace regions: one arrival counter per (unit, consumer warpgroup) and the fp32 partial tiles
  // of the split items, [kMaxSplitItems][consumer][M64 tile][BN/8][128 threads] float4.
  int split_mode = 1;
  int split_slots = 0;     // SMs x CTAs per SM (the automatic split's budget of items)
  int fold_parts = 1;      // the folded last expert's parts where it splits (fold_split_parts, kChain)
  int fetch_ahead = 1;     // the weight producer fetches short items ahead (sm90_producer.cuh)
  // kChain on the e4m3 tile, D > 0: a chained FC2 item's weight copies of stage ks >= D wait until FC1 has
  // stored stage ks - D's rows (or every FC1 tile has signalled), so the CTAs that wait in the hand-over
  // hold at most D stages of FC2's weights and leave HBM to the slowest FC1 tiles, which every FC2 item
  // waits for (sm90_producer.cuh; docs/perf.md, sm90 step 56).
  int fc2_throttle = 0;
  // kChain, 1: the launch leaves its schedule counters and FC1 signals for the caller to zero after it
  // (GroupedGemmArgs::caller_resets): no CTA counts itself done, so none waits for that round trip and
  // the last one does not zero them before the launch can end.
  int caller_resets = 0;
  int* split_counters = nullptr;
  float4* partials = nullptr;
  // Zero, from the host: the e4m3 tile's wgmma scale_d operand for a chunk's fresh accumulator. A constant
  // there lets ptxas give the accumulator the A fragment's registers, which serialises the wgmmas
  // (docs/perf.md, sm90 step 48).
  int zero = 0;
};

// The split reduction of one consumer warpgroup's tile in a chained launch (split items only; a launch of
// one GEMM uses reduce_split_any_order below). Part r < S-1 stores its
// accumulators to the workspace (store_split_part) and hands its count to the signal warp, which
// releases it at the tile's counters (run_signal_warp): nothing on the consumers' path waits for a round
// trip. Part S-1, the tile's last item in the launch's order, waits until the other S-1 have counted in
// (acquire), loads their partials (L2, ld.global.cg, up to four at once) and sums them in part order with
// its own accumulators last (bit-identical whoever finishes first), zeroes them and the counter (a run
// leaves the whole workspace zero, as GroupedGemmArgs::workspace promises, so a later run of any shape or
// tactic on the same workspace finds its counters at zero), then runs the epilogue. Waiting cannot
// deadlock within the launch: every item waits only for earlier items (FC2's for FC1's, a last part for
// the other parts), every CTA runs its items in the order it took them, and a CTA that is not resident yet
// holds only its static first item and gets its SM when the kernels beside it end, which never wait.
// (Until step 33 the last part to arrive reduced, so every part's consumers waited for a fence, the
// atomic's return and S dependent loads.)
// The split partials' layout, [kMaxSplitItems][consumer][M64 tile][BN/8][128 threads] float4: a thread
// holds kSplitVecs float4 of an item, kSplitItemVecs apart from the next item's.
template <class Cfg>
constexpr int kSplitVecs = Cfg::kM64PerConsumer * Cfg::kBN / 8;
template <class Cfg>
constexpr int64_t kSplitItemVecs = int64_t(Cfg::kConsumers) * kSplitVecs<Cfg> * 128;
// This consumer thread's first float4 of split item `item`.
template <class Cfg>
__device__ __forceinline__ float4* split_slot(float4* partials, int item, int consumer, int tid) {
  return partials + item * kSplitItemVecs<Cfg> + consumer * kSplitVecs<Cfg> * 128 + tid;
}
// Zeroes this thread's float4 of `items` consecutive split items from `first` on (the reductions' reset
// for the next run, after the thread's own loads of the same addresses).
template <class Cfg>
__device__ __forceinline__ void zero_split_parts(float4* first, int items) {
#pragma unroll
  for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
    for (int v = 0; v < Cfg::kBN / 8; ++v)
#pragma unroll 1
      for (int r = 0; r < items; ++r)
        __stcg(first + (u * (Cfg::kBN / 8) + v) * 128 + r * kSplitItemVecs<Cfg>, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
}

template <class Cfg>
__device__ __forceinline__ void store_split_part(const float (&acc)[Cfg::kM64PerConsumer][Cfg::kBN / 2],
                                                 float4* __restrict__ partials, int first_item, int part, int consumer,
                                                 int tid) {
  float4* mine = split_slot<Cfg>(partials, first_item + part, consumer, tid);
#pragma unroll
  for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
    for (int v = 0; v < Cfg::kBN / 8; ++v)
      mine[(u * (Cfg::kBN / 8) + v) * 128] =
          make_float4(acc[u][4 * v], acc[u][4 * v + 1], acc[u][4 * v + 2], acc[u][4 * v + 3]);
}

template <class Cfg>
__device__ __forceinline__ void reduce_split(float (&acc)[Cfg::kM64PerConsumer][Cfg::kBN / 2],
                                             float4* __restrict__ partials, int* __restrict__ counter, int first_item,
                                             int parts, int consumer, int tid) {
  constexpr int kVecs = kSplitVecs<Cfg>;
  constexpr int64_t kItemVecs = kSplitItemVecs<Cfg>;
  float4* first = split_slot<Cfg>(partials, first_item, consumer, tid);
  if (tid == 0) {
    while (ld_acquire_gpu(counter) < parts - 1) {
    }
    *counter = 0;  // every other part has arrived: nothing else touches it in this launch
  }
  named_barrier_sync(1 + consumer, 128);
  // The other parts' partials: four float4 loads in flight per thread on the n8 tiles, one at a time on
  // the n16 ones (more made ptxas spill the two-CTA n16 tile's consumers). The sum starts at -0, the
  // exact identity of the addition, so it is the same left fold p0 + p1 + ... + own as one seeded with p0.
  constexpr int kBatch = kVecs == 1 ? 4 : 1;
  float4 sum[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) sum[i] = make_float4(-0.0f, -0.0f, -0.0f, -0.0f);
#pragma unroll 1
  for (int r0 = 0; r0 < parts - 1; r0 += kBatch) {
    float4 x[kBatch][kVecs];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int i = 0; i < kVecs; ++i)
        if (r0 + b < parts - 1) x[b][i] = __ldcg(first + i * 128 + (r0 + b) * kItemVecs);
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int i = 0; i < kVecs; ++i)
        if (r0 + b < parts - 1) {
          sum[i].x += x[b][i].x;
          sum[i].y += x[b][i].y;
          sum[i].z += x[b][i].z;
          sum[i].w += x[b][i].w;
        }
  }
#pragma unroll
  for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
    for (int v = 0; v < Cfg::kBN / 8; ++v) {
      const float4& s = sum[u * (Cfg::kBN / 8) + v];
      acc[u][4 * v] = s.x + acc[u][4 * v];
      acc[u][4 * v + 1] = s.y + acc[u][4 * v + 1];
      acc[u][4 * v + 2] = s.z + acc[u][4 * v + 2];
      acc[u][4 * v + 3] = s.w + acc[u][4 * v + 3];
    }
  zero_split_parts<Cfg>(first, parts - 1);  // the other parts' partials
}

// The split reduction of a launch that runs one GEMM (FC1 or FC2 alone; a chained launch uses
// store_split_part / reduce_split above): stores this part's accumulators, counts the part in; the last
// part to arrive sums the S partials in part order into
// acc (bit-identical whatever the arrival order), zeroes them and the tile's counter (a run leaves the
// whole workspace zero, as GroupedGemmArgs::workspace promises, so a later run of any shape or tactic
// on the same workspace finds its counters at zero) and returns true; the others return false and
// skip the epilogue. The barriers and fences around thread 0's atomic order every thread's partial
// stores before the count and the last part's loads (L2, ld.global.cg) after it. No part waits for
// another, so such a launch always finishes even when its CTAs are not all resident at once: a chained
// launch may then wait for it (the engine's shared expert runs FC1 and FC2 this way on a side stream while
// the routed chain runs), and two launches that both wait could each hold SMs the other needs.
template <class Cfg>
__device__ __forceinline__ bool reduce_split_any_order(float (&acc)[Cfg::kM64PerConsumer][Cfg::kBN / 2],
                                                       float4* __restrict__ partials, int* __restrict__ counter,
                                                       int first_item, int part, int parts, int consumer, int tid,
                                                       int32_t* s_flag) {
  store_split_part<Cfg>(acc, partials, first_item, part, consumer, tid);
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
  float4* first = split_slot<Cfg>(partials, first_item, consumer, tid);
#pragma unroll
  for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
    for (int v = 0; v < Cfg::kBN / 8; ++v) {
      const float4* slot = first + (u * (Cfg::kBN / 8) + v) * 128;
      float4 sum = __ldcg(slot);
#pragma unroll 1  // unrolled, the loads in flight cost the two-CTA tiles' consumers a spill
      for (int r = 1; r < parts; ++r) {
        const float4 x = __ldcg(slot + r * kSplitItemVecs<Cfg>);
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
  if (last) zero_split_parts<Cfg>(first, parts);
  return last;
}

// What the consumers hand to the signal warp after an item (signal ring slot: kind, two arguments).
enum SignalKind : int32_t {
  kSignalEnd = 0,        // no more items: count the CTA done (a chained launch, unless caller_resets) and leave
  kSignalSplitPart = 1,  // a split part's partials are stored: argument = its tile's first counter
  kSignalFc1Tile = 2,    // a chained FC1 tile's rows are stored: arguments = its token tile and m-tile
};

// Warp 2 of a chained launch (the signal warp): the releases at GPU scope that publish what the consumers stored, off their
// path. Under the weight stream a fence at GPU scope takes about 3 us; the consumer warpgroups used to
// wait for it after every chained FC1 tile (the next item's first wgmma needs all four warps) and, with
// the atomic's return and the partials' loads, after every split part (docs/perf.md, sm90 step 33).
// Now every consumer thread arrives on the slot's full barrier after its stores (an arrive releases at
// CTA scope, the wait here acquires), and lane 0 fences at GPU scope and adds the counts: kConsumers to
// the counters of the (token tile, FC2 stage) pairs the FC1 m-tile overlaps (Handover) and to the
// all-FC1 counter (one per consumer warpgroup, as before), or 1
// to each consumer warpgroup's counter of a split tile. The ring's empty barriers hold the consumers back
// if this warp falls kSignalRing hand-overs behind. A chained launch's CTA counts itself done here, after
// its last signal (they must precede the last CTA's reset of the tile counters), unless the caller
// zeroes the counters after the launch (LaunchParams::caller_resets: the engine's finalize; the done
// count's fence and round trip, and the last CTA's reset, were about 1.5 us of GLM-5's T=1 forward at
// the launch's end, docs/perf.md, sm90 step 58).
template <class Cfg>
__device__ void run_signal_warp(const LaunchParams& p, uint64_t* sig_full, uint64_t* sig_empty, const int32_t* s_sig,
                                int extra_counters, int lane) {
  if (lane != 0) return;  // one thread does it all: no lane reads a slot the consumers may refill
  for (int s = 0;; ++s) {
    const int slot = s % kSignalRing;
    mbar_wait(&sig_full[slot], static_cast<uint32_t>(s / kSignalRing) & 1u);
    const int kind = s_sig[slot * kSignalInts], arg = s_sig[slot * kSignalInts + 1],
              arg2 = s_sig[slot * kSignalInts + 2];
    if (kind != kSignalEnd) fence_acq_rel_gpu();
    if (kind == kSignalSplitPart) {
#pragma unroll
      for (int c = 0; c < Cfg::kConsumers; ++c) atomicAdd(&p.split_counters[arg + c], 1);  // results unused: reductions
    } else if (kind == kSignalFc1Tile) {
      const int stages = Handover<Cfg>::stages(p);
      int* tile_counters = Handover<Cfg>::counters(p.counters, arg, stages);
      const int g1 = Handover<Cfg>::last_group(arg2, stages);
      for (int g = Handover<Cfg>::first_group(arg2); g <= g1; ++g) atomicAdd(&tile_counters[g], Cfg::kConsumers);
      atomicAdd(&p.counters[2], Cfg::kConsumers);
    }
    mbar_arrive(&sig_empty[slot]);
    if (kind == kSignalEnd) break;
  }
  if (!p.caller_resets) finish_work_items(p.counters, extra_counters);
}

// The consumers' side of a hand-over (every consumer thread, after its own stores of the item).
template <class Cfg>
__device__ __forceinline__ void signal_after_item(uint64_t* sig_full, uint64_t* sig_empty, int32_t* s_sig, int& sig,
                                                  int kind, int arg, int arg2, bool writer) {
  const int slot = sig % kSignalRing;
  mbar_wait(&sig_empty[slot], (static_cast<uint32_t>(sig / kSignalRing) & 1u) ^ 1u);
  if (writer) {
    s_sig[slot * kSignalInts] = kind;
    s_sig[slot * kSignalInts + 1] = arg;
    s_sig[slot * kSignalInts + 2] = arg2;
  }
  mbar_arrive(&sig_full[slot]);
  ++sig;
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
constexpr int kRouteFrontOffset = kFrontAreaRouteFront;  // bytes into the ring, past the routing scratch
template <class Cfg>
__device__ __noinline__ void route_prologue(const RouteFront& f, uint8_t* smem, int32_t* s_rows_routed,
                                           int32_t* s_offsets) {
  static_assert(Cfg::kStages * Cfg::kStageBytes >= kFrontAreaEnd, "the routing's shared memory fits the ring");
  const FrontScratch fs = front_scratch_in(smem, s_rows_routed, s_offsets);
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
  uint64_t* sig_full = item_bar + kItemRing;   // [kSignalRing]: consumers -> warp 2 (run_signal_warp)
  uint64_t* sig_empty = sig_full + kSignalRing;
  uint64_t* row_bar = sig_empty + kSignalRing;  // the e4m3 tile's row cache: its bulk copy landed (TileConfig)
  int32_t* s_prefix = reinterpret_cast<int32_t*>(smem + Cfg::kTableOffset);
  int32_t* s_offsets = s_prefix + kMaxExperts + 1;
  int32_t* s_rows = s_offsets + kMaxExperts + 1;
  int32_t* s_items = s_rows + Cfg::kBN;
  using Space = ItemSpace<Cfg, kMode, LaunchParams>;
  static_assert(sizeof(Space) <= sizeof(int32_t) * kItemSpaceInts, "tile_config.h reserves too little for ItemSpace");
  int32_t* s_sig = s_items + kItemRing * kItemInts;  // [kSignalRing][kSignalInts]
  Space* s_space = reinterpret_cast<Space*>(s_sig + kSignalRing * kSignalInts);
  int32_t* s_rows_routed = reinterpret_cast<int32_t*>(s_space) + kItemSpaceInts;  // [kRoutedRows]
  int32_t* s_flag = s_rows_routed + kRoutedRows;  // [kConsumers]: reduce_split_any_order's "last part" flags
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
    for (int i = 0; i < kSignalRing; ++i) {
      mbar_init(&sig_full[i], Cfg::kConsumers * 128);
      mbar_init(&sig_empty[i], 1);
    }
    if constexpr (Cfg::kE4m3) mbar_init(row_bar, 1);
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
  if constexpr (kCanRoute) {
    if (p.route) {
      route_prologue<Cfg>(*s_front, smem, s_rows_routed, s_offsets);
      if (threadIdx.x == 0) FP4MOE_TRACE_PUT(static_cast<int>(kMode), 5, FP4MOE_TRACE_NOW());
    }
  }
  if constexpr (Cfg::kE4m3) {
    // The e4m3 token tiles' units that no producer writes are zero for the whole launch (the token
    // producer writes only each k16 block's two halves, sm90_e4m3.h); after the routing's scratch in
    // stage 0 is done with. Generic stores that wgmma reads: the async proxy fence.
    __syncthreads();
    constexpr int kUnits = Cfg::kE4m3TileBytes / 16;
    for (int i = threadIdx.x; i < Cfg::kStages * kUnits; i += Cfg::kThreads)
      *reinterpret_cast<uint4*>(smem + (i / kUnits) * Cfg::kStageBytes + (i % kUnits) * 16) = make_uint4(0, 0, 0, 0);
    fence_proxy_async_smem();
  }
  if (warp == 1) {
    if (kCanRoute && p.route)
      build_work_table<Cfg::kTileRows, false>(s_offsets, num_experts, s_prefix, s_offsets, lane);
    else
      build_work_table<Cfg::kTileRows>(p.op[0].expert_offsets, num_experts, s_prefix, s_offsets, lane);
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
      run_weight_producer<Cfg, kMode>(p, smem, full, empty, item_bar, s_prefix, space, lane);
    if (warp == 1)
      run_token_producer<Cfg, kMode>(p, smem, full, empty, item_bar, s_prefix, space, row_bar, lane);
    if (kMode == LaunchMode::kChain && warp == 2)
      run_signal_warp<Cfg>(p, sig_full, sig_empty, s_sig,
                           1 + s_prefix[num_experts] * Handover<Cfg>::stages(p), lane);
    return;
  }
  // Consumer
  setmaxnreg_inc<Cfg::Regs::kConsumer>();
  const int consumer = wg - 1, tid = threadIdx.x & 127;
  int stage = 0;
  uint32_t phase = 0;
  int sig = 0;  // hand-overs to the signal warp so far
  const bool sig_writer = consumer == 0 && tid == 0;
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
    const int nstages = q.kchunks / Cfg::kChunksPerStage / parts;
    // The epilogue reads a copy of the summed accumulators, which a split item's reduction replaces by
    // the whole tile's sum (and which the wgmmas of the next item never touch). The e4m3 tile's item has
    // one token: its rows' sums are column 0 (res[0][0] row R0, res[0][2] row R1), the other columns zero.
    float res[Cfg::kM64PerConsumer][Cfg::kBN / 2];
    if constexpr (Cfg::kE4m3) {
      float f0, f1;
      consume_item_e4m3<Cfg>(smem, full, empty, nstages, first_tile, tid, p.zero, f0, f1, stage, phase);
#pragma unroll
      for (int i = 0; i < Cfg::kBN / 2; ++i) res[0][i] = 0.0f;
      res[0][0] = f0;
      res[0][2] = f1;
    } else {
      consume_item<Cfg>(smem, full, empty, nstages, first_tile, tid, acc, stage, phase);
#pragma unroll
      for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
        for (int i = 0; i < Cfg::kBN / 2; ++i) res[u][i] = acc[u][0][i];
    }
    if (consumer == 0 && tid == 0) FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 5, FP4MOE_TRACE_NOW());
    bool finish = true;  // a split tile's last part (part S-1) runs its epilogue
    int signal = -1, signal_arg = 0, signal_arg2 = 0;  // what to hand to the signal warp after the item's stores
    if constexpr (Cfg::kSplitCapable) {
      if (parts > 1) {
        const int base = space.split_base(o);
        const int counters0 = (base + unit) * Cfg::kConsumers;  // the tile's counters, one per consumer warpgroup
        int* counter = p.split_counters + counters0 + consumer;
        if constexpr (kMode != LaunchMode::kChain) {
          finish = reduce_split_any_order<Cfg>(res, p.partials, counter, base + unit * parts, part, parts, consumer,
                                               tid, s_flag);
        } else if (part != parts - 1) {
          store_split_part<Cfg>(res, p.partials, base + unit * parts, part, consumer, tid);
          finish = false;
          signal = kSignalSplitPart;
          signal_arg = counters0;
        } else {
          reduce_split<Cfg>(res, p.partials, counter, base + unit * parts, parts, consumer, tid);
        }
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
      if (kMode == LaunchMode::kChain && finish) {  // the rows of token tile it.tile, for FC2's token producers
        signal = kSignalFc1Tile;
        signal_arg = it.tile;
        signal_arg2 = it.mtile;
      }
    } else {
      const float s0 = (folded ? q.last_scales[0] : q.tensor_scales[it.expert]) * kAccumulatorScale;
#pragma unroll
      for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
        if (finish && u < ntiles_valid)
          store_tile<Cfg::kBN, false>(res[u], q.out, q.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0,
                                      s0, tid);
    }
    if (signal >= 0)
      signal_after_item<Cfg>(sig_full, sig_empty, s_sig, sig, signal, signal_arg, signal_arg2, sig_writer);
    if (consumer == 0 && tid == 0) {
      FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 4, FP4MOE_TRACE_NOW());
      FP4MOE_TRACE_PUT(static_cast<int>(kMode), 3, j + 1);
    }
  }
  if (consumer == 0 && tid == 0) FP4MOE_TRACE_PUT(static_cast<int>(kMode), 2, FP4MOE_TRACE_NOW());
  // A chained launch's signal warp leaves after this and counts the CTA done after its last signal (unless
  // the caller resets the counters: LaunchParams::caller_resets). One
  // GEMM alone has no signal warp (nothing to publish) and needs no such wait: the weight producer counts
  // the CTA done after its last fetch, while the consumers still run, which keeps the done count's round
  // trip off the kernel's end (1-2 us at T = 1 when the consumers did it for every launch).
  if constexpr (kMode == LaunchMode::kChain)
    signal_after_item<Cfg>(sig_full, sig_empty, s_sig, sig, kSignalEnd, 0, 0, sig_writer);
#endif
}

}  // namespace sm90
}  // namespace fp4moe
