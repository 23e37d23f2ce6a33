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
// Warp roles (384 threads, tile_config.h):
//   warpgroup 0  producers (sm90_producer.cuh): warp 0 takes the work items and fills the stage ring with
//                bulk (TMA) weight copies, warp 1 with the token rows (TMA or cp.async); setmaxnreg.dec
//                to 56 (48 with two CTAs per SM); warps 2-3 leave.
//   warpgroups 1, 2  consumers: setmaxnreg.inc to 224 (96); dequantise the NVFP4 weights into wgmma A
//                registers and run RS wgmma against the token tile (sm90_consumer.cuh).
// Shared memory: the stage ring, 2 x STAGES + 16 mbarriers, the work-list table (byte offsets in
// tile_config.h). Barriers: full[s] expects 1 + 32 arrivals plus the stage's TMA bytes; empty[s]
// expects 256 arrivals (every consumer thread).
// Packed weight and scale layout: sm90_layout.h (kSm90Interleaved).
#pragma once
#include <cuda.h>  // CUtensorMap (a type only; nothing from the driver library is linked)
#include <cuda_bf16.h>

#include <cstdint>

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
  uint16_t* out = nullptr;                  // bf16 [total_rows, n]
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
  // Workspace: [2] schedule counters, then (kChain) FC1 signals in all and one count per token tile;
  // null: the static schedule.
  int* counters = nullptr;
  // Split reduction (sm90_scheduler.cuh, choose_split): 0 automatic, 1 never, N > 1 up to N parts.
  // Workspace regions: one arrival counter per (unit, consumer warpgroup) and the fp32 partial tiles
  // of the split items, [kMaxSplitItems][consumer][M64 tile][BN/8][128 threads] float4.
  int split_mode = 1;
  int split_slots = 0;     // SMs x CTAs per SM (the automatic split's budget of items)
  int* split_counters = nullptr;
  float4* partials = nullptr;
};

template <LaunchMode kMode>
__device__ __forceinline__ bool op_is_fc1(int o) {
  return kMode == LaunchMode::kFc1 || (kMode == LaunchMode::kChain && o == 0);
}

// Split reduction, consumer side. Before every item a consumer warpgroup waits until the reducer has
// taken the item posted kRedRing posts ago (wait_split_slot: usually long done; waiting again before the
// next post returns at once). Waiting only on a split item's path made ptxas serialise the chained
// kernel's wgmmas (C7520). post_split_part (split items only) stores this part's accumulators to the
// item's partial slot ([item][consumer][M64 tile][BN/8][128 threads] float4) and hands the launch-wide
// item index to the reducer warp through ring slot rj % kRedRing (every thread arrives after its own
// stores, so the reducer's wait orders them before its count), then returns: the consumer goes on with
// its next item while the reducer counts the part in (an L2 round trip, 2-3 us when the consumers did
// it, docs/perf.md sm90 step 27).
__device__ __forceinline__ void wait_split_slot(int consumer, int rj, uint64_t* red_empty) {
  mbar_wait(&red_empty[consumer * kRedRing + rj % kRedRing], ((rj / kRedRing) & 1) ^ 1u);
}
template <class Cfg>
__device__ __forceinline__ void post_split_part(const float (&res)[Cfg::kM64PerConsumer][Cfg::kBN / 2],
                                                float4* __restrict__ partials, int split_item, int item, int consumer,
                                                int tid, int rj, uint64_t* red_full, int32_t* s_red) {
  constexpr int kVecs = Cfg::kM64PerConsumer * Cfg::kBN / 8;  // float4 per thread
  constexpr int64_t kItemVecs = int64_t(kConsumerWarpgroups) * kVecs * 128;
  const int slot = consumer * kRedRing + rj % kRedRing;
  float4* mine = partials + split_item * kItemVecs + consumer * kVecs * 128 + tid;
#pragma unroll
  for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
    for (int v = 0; v < Cfg::kBN / 8; ++v)
      __stcg(mine + (u * (Cfg::kBN / 8) + v) * 128,
             make_float4(res[u][4 * v], res[u][4 * v + 1], res[u][4 * v + 2], res[u][4 * v + 3]));
  if (tid == 0) s_red[slot] = item;
  mbar_arrive(&red_full[slot]);
}

// The end of a consumer warpgroup's items: -1 sends its reducer warp home.
__device__ __forceinline__ void post_split_end(int consumer, int tid, int rj, uint64_t* red_full, uint64_t* red_empty,
                                               int32_t* s_red) {
  const int slot = consumer * kRedRing + rj % kRedRing;
  wait_split_slot(consumer, rj, red_empty);
  if (tid == 0) s_red[slot] = -1;
  mbar_arrive(&red_full[slot]);
}

// Split reduction, reducer side: warp 2 + c of the producer warpgroup serves consumer warpgroup c. Per
// handed item it frees the ring slot, then lane 0 counts the part in at the tile's counter with an
// acquire-release atomic (releasing the consumer's partial stores, which the ring's barrier ordered before
// this warp; acquiring the other parts'). The last part to arrive sums the S partials in part order
// (bit-identical whatever the arrival order; ld.global.cg), zeroes them and the counter (a run leaves the whole workspace zero, as
// GroupedGemmArgs::workspace promises, so a later run of any shape or tactic on the same workspace finds
// its counters at zero), runs the consumer warpgroup's epilogue for its 128 thread positions (four per
// lane) and, for a chained launch's FC1 tile, publishes the rows to FC2 like a consumer would. Nothing
// here waits on another CTA.
template <class Cfg, LaunchMode kMode, class Space>
__device__ void run_split_reducer(const LaunchParams& p, const Space& space, const int32_t* s_prefix,
                                  uint64_t* red_full, uint64_t* red_empty, const int32_t* s_red, int consumer,
                                  int lane) {
  constexpr int kVecs = Cfg::kM64PerConsumer * Cfg::kBN / 8;
  constexpr int64_t kItemVecs = int64_t(kConsumerWarpgroups) * kVecs * 128;
  const int32_t* s_offsets = s_prefix + kMaxExperts + 1;
  const int num_experts = p.op[0].num_experts;
  for (int rj = 0;; ++rj) {
    const int slot = consumer * kRedRing + rj % kRedRing;
    mbar_wait(&red_full[slot], (rj / kRedRing) & 1);
    int w = s_red[slot];
    __syncwarp();
    if (lane == 0) mbar_arrive(&red_empty[slot]);
    if (w < 0) break;
    int part = 0;
    const int o = space.split(w);
    const int unit = space.part(o, w, part);
    const int parts = space.parts(o), base = space.split_base(o);
    int* counter = p.split_counters + (base + unit) * kConsumerWarpgroups + consumer;
    int last = 0;
    if (lane == 0) {
      last = atom_add_acq_rel_gpu(counter, 1) == parts - 1;
      if (last) *counter = 0;  // every part has arrived: nothing else touches it in this launch
    }
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) continue;
    __syncwarp();
    const Params& q = p.op[o];
    const WorkItem it = find_work_item(s_prefix, s_offsets, num_experts, Cfg::kBN, space.mtiles(o), unit);
    const int cta_tile0 = it.mtile * Cfg::kM64PerCta;
    const int first_tile = consumer * Cfg::kM64PerConsumer;
    const int ntiles_valid = min(Cfg::kM64PerConsumer, q.tiles64 - cta_tile0 - first_tile);
    const bool fc1 = op_is_fc1<kMode>(o);
    const float s0 = (fc1 ? q.tensor_scales[2 * it.expert] : q.tensor_scales[it.expert]) * kAccumulatorScale;
    const float s1 = fc1 ? q.tensor_scales[2 * it.expert + 1] * kAccumulatorScale : s0;
    float4* first = p.partials + (base + unit * parts) * kItemVecs + consumer * kVecs * 128;
#pragma unroll 1
    for (int i = 0; i < 4; ++i) {
      const int t = lane + 32 * i;
      float res[Cfg::kM64PerConsumer][Cfg::kBN / 2];
#pragma unroll
      for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
        for (int v = 0; v < Cfg::kBN / 8; ++v) {
          float4* slot0 = first + (u * (Cfg::kBN / 8) + v) * 128 + t;
          float4 sum = __ldcg(slot0);
          __stcg(slot0, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
#pragma unroll 1
          for (int r = 1; r < parts; ++r) {
            const float4 x = __ldcg(slot0 + r * kItemVecs);
            __stcg(slot0 + r * kItemVecs, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
            sum.x += x.x;
            sum.y += x.y;
            sum.z += x.z;
            sum.w += x.w;
          }
          res[u][4 * v] = sum.x;
          res[u][4 * v + 1] = sum.y;
          res[u][4 * v + 2] = sum.z;
          res[u][4 * v + 3] = sum.w;
        }
#pragma unroll
      for (int u = 0; u < Cfg::kM64PerConsumer; ++u) {
        if (u >= ntiles_valid) continue;
        if (fc1)
          store_tile<Cfg::kBN, true>(res[u], q.out, q.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0, s1,
                                     t);
        else
          store_tile<Cfg::kBN, false>(res[u], q.out, q.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0,
                                      s1, t);
      }
    }
    if (kMode == LaunchMode::kChain && o == 0) {
      // This warpgroup's rows of token tile it.tile are stored: publish them to FC2's token producers.
      __syncwarp();
      if (lane == 0) {
        red_add_release_gpu(&p.counters[3 + it.tile], 1);
        red_add_release_gpu(&p.counters[2], 1);
      }
    }
  }
}

template <class Cfg, LaunchMode kMode>
__global__ void __launch_bounds__(kThreads, Cfg::kCtasPerSm) sm90_nvfp4w4a16_grouped_kernel(const __grid_constant__ LaunchParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // Shared memory
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
  uint64_t* empty = full + Cfg::kStages;
  uint64_t* item_bar = empty + Cfg::kStages;  // [kItemRing]: warp 0 -> warp 1, one arrive per item
  // [consumer][kRedRing]: split items handed to the reducer warps (run_split_reducer) and taken by them.
  uint64_t* red_full = item_bar + kItemRing;
  uint64_t* red_empty = red_full + kConsumerWarpgroups * kRedRing;
  int32_t* s_prefix = reinterpret_cast<int32_t*>(smem + Cfg::kTableOffset);
  int32_t* s_offsets = s_prefix + kMaxExperts + 1;
  int32_t* s_rows = s_offsets + kMaxExperts + 1;
  int32_t* s_items = s_rows + Cfg::kBN;
  int32_t* s_red = s_items + kItemRing;  // [consumer][kRedRing] launch-wide split items (-1: no more)
  using Space = ItemSpace<Cfg, kMode, LaunchParams>;
  static_assert(sizeof(Space) <= sizeof(int32_t) * kItemSpaceInts, "tile_config.h reserves too little for ItemSpace");
  Space* s_space = reinterpret_cast<Space*>(s_red + kConsumerWarpgroups * kRedRing);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int num_experts = p.op[0].num_experts;
  // Barriers
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&full[s], 1 + 32);
      mbar_init(&empty[s], kConsumerWarpgroups * 128);
    }
    for (int i = 0; i < kItemRing; ++i) mbar_init(&item_bar[i], 1);
    for (int i = 0; i < kConsumerWarpgroups * kRedRing; ++i) {
      mbar_init(&red_full[i], 128);
      mbar_init(&red_empty[i], 1);
    }
    fence_barrier_init();
  }
  // With programmatic dependent launch (common/pdl_launch.h, on unless FP4MOE_PDL=0) everything above
  // overlaps the previous kernel's tail; nothing global is touched before this wait.
  pdl_wait();
  if (threadIdx.x == 0) {
    unsigned smid = 0;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    FP4MOE_TRACE_PUT(static_cast<int>(kMode), 0, smid);
    FP4MOE_TRACE_PUT(static_cast<int>(kMode), 1, FP4MOE_TRACE_NOW());
  }
  if (warp == 1) {
    build_work_table<Cfg::kBN>(p.op[0].expert_offsets, num_experts, s_prefix, s_offsets, lane);
    // The launch's item space (and split choice) once per CTA, in shared memory: every role reads the
    // few fields it needs per item there instead of holding them in registers.
    __syncwarp();
    if (lane == 0) *s_space = Space(p, s_prefix);
  }
  __syncthreads();
  if (threadIdx.x == 0) FP4MOE_TRACE_PUT(static_cast<int>(kMode), 4, FP4MOE_TRACE_NOW());
  const Space& space = *s_space;
  // The reducer warps of split-capable tiles (they wait for split items or the end of the consumers'),
  // and a chained launch's final barrier: both consumer warpgroups and the reducer warps.
  constexpr bool kReducers = Cfg::kSplitCapable;
  constexpr int kEndThreads = kConsumerWarpgroups * 128 + (kReducers ? 64 : 0);

  const int wg = threadIdx.x >> 7;
  if (wg == 0) {
    // Producer
    setmaxnreg_dec<Cfg::Regs::kProducer>();
    if (warp == 0) run_weight_producer<Cfg, kMode>(p, smem, full, empty, item_bar, s_prefix, space, lane);
    if (warp == 1) run_token_producer<Cfg, kMode>(p, smem, full, empty, item_bar, s_prefix, space, lane);
    if constexpr (Cfg::kSplitCapable) {
      if (warp >= 2) {
        run_split_reducer<Cfg, kMode>(p, space, s_prefix, red_full, red_empty, s_red, warp - 2, lane);
        if (kMode == LaunchMode::kChain) named_barrier_sync(3, kEndThreads);
      }
    }
    return;
  }
  // Consumer
  setmaxnreg_inc<Cfg::Regs::kConsumer>();
  const int consumer = wg - 1, tid = threadIdx.x & 127;
  int stage = 0;
  uint32_t phase = 0;
  int rj = 0;  // split items handed to the reducer
  float acc[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2];
  for (int j = 0;; ++j) {
    // The producer wrote item j into the ring before filling its first stage (or -1: no more work).
    mbar_wait(&full[stage], phase);
    int w = s_items[j % kItemRing];
    if (w < 0) break;
    if (consumer == 0 && tid == 0) {
      FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 0, w);
      FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 3, FP4MOE_TRACE_NOW());
    }
    const int item = w;
    int part = 0;
    const int o = space.split(w);
    const int unit = space.part(o, w, part);
    const Params& q = p.op[o];
    const WorkItem it = find_work_item(s_prefix, s_offsets, num_experts, Cfg::kBN, space.mtiles(o), unit);
    const int cta_tile0 = it.mtile * Cfg::kM64PerCta;
    const int first_tile = consumer * Cfg::kM64PerConsumer;  // within the CTA tile
    const int ntiles_valid = min(Cfg::kM64PerConsumer, q.tiles64 - cta_tile0 - first_tile);
    const int parts = Cfg::kSplitCapable ? space.parts(o) : 1;
    if (kReducers) wait_split_slot(consumer, rj, red_empty);
    consume_item<Cfg>(smem, full, empty, q.kchunks / Cfg::kChunksPerStage / parts, first_tile, tid, acc, stage, phase);
    if (consumer == 0 && tid == 0) FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 5, FP4MOE_TRACE_NOW());
    // The epilogue (or a split item's partial store) reads a copy of the summed accumulators, which the
    // wgmmas of the next item never touch.
    float res[Cfg::kM64PerConsumer][Cfg::kBN / 2];
#pragma unroll
    for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
#pragma unroll
      for (int i = 0; i < Cfg::kBN / 2; ++i) res[u][i] = acc[u][0][i];
    // A split item's partial goes to the reducer warp; a whole tile runs the epilogue here.
    const bool split = Cfg::kSplitCapable && parts > 1;
    if (split) {
      post_split_part<Cfg>(res, p.partials, space.split_base(o) + unit * parts + part, item, consumer, tid, rj++,
                           red_full, s_red);
    } else if (op_is_fc1<kMode>(o)) {
      const float s0 = q.tensor_scales[2 * it.expert] * kAccumulatorScale;
      const float s1 = q.tensor_scales[2 * it.expert + 1] * kAccumulatorScale;
#pragma unroll
      for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
        if (u < ntiles_valid)
          store_tile<Cfg::kBN, true>(res[u], q.out, q.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0,
                                     s1, tid);
      if (kMode == LaunchMode::kChain) {
        // This warpgroup's rows of token tile it.tile are stored: publish them to FC2's token producers (the
        // barrier orders the warpgroup's stores before thread 0's release). A split tile's reducer does it.
        named_barrier_sync(1 + consumer, 128);
        if (tid == 0) {
          __threadfence();
          atomicAdd(&p.counters[3 + it.tile], 1);
          atomicAdd(&p.counters[2], 1);
        }
      }
    } else {
      const float s0 = q.tensor_scales[it.expert] * kAccumulatorScale;
#pragma unroll
      for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
        if (u < ntiles_valid)
          store_tile<Cfg::kBN, false>(res[u], q.out, q.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0,
                                      s0, tid);
    }
    if (consumer == 0 && tid == 0) {
      FP4MOE_TRACE_ITEM(static_cast<int>(kMode), j, 4, FP4MOE_TRACE_NOW());
      FP4MOE_TRACE_PUT(static_cast<int>(kMode), 3, j + 1);
    }
  }
  if (consumer == 0 && tid == 0) FP4MOE_TRACE_PUT(static_cast<int>(kMode), 2, FP4MOE_TRACE_NOW());
  if (kReducers) post_split_end(consumer, tid, rj, red_full, red_empty, s_red);
  // A chained launch counts the CTA done once both consumer warpgroups and the reducer warps are past
  // their last item (their FC1 signals must precede the last CTA's reset of the tile counters). One GEMM alone needs no such
  // wait: the weight producer counts the CTA done after its last fetch, while the consumers still run,
  // which keeps the done count's round trip off the kernel's end (1-2 us at T = 1 when the consumers did
  // it for every launch).
  if (kMode == LaunchMode::kChain) {
    named_barrier_sync(3, kEndThreads);
    if (consumer == 0 && tid == 0) finish_work_items(p.counters, 1 + s_prefix[num_experts]);
  }
#endif
}

}  // namespace sm90
}  // namespace fp4moe
