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
//                to 56 (40 with two CTAs per SM); warps 2-3 leave.
//   warpgroups 1, 2  consumers: setmaxnreg.inc to 224 (96); dequantise the NVFP4 weights into wgmma A
//                registers and run RS wgmma against the token tile (sm90_consumer.cuh).
// Shared memory: the stage ring, 2 x STAGES + 16 mbarriers, the work-list table (byte offsets in
// tile_config.h). Barriers: full[s] expects 1 + 32 arrivals plus the stage's TMA bytes; empty[s]
// expects 8 arrivals (one per consumer warp).
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

// What a launch runs: FC1 alone, FC2 alone, or FC1 chained into FC2 (op[0] FC1, op[1] FC2 reading op[0]'s
// output rows, the same experts and offsets). In a chained launch the FC2 item of token tile t waits
// until every FC1 item of t has stored its rows: each FC1 consumer warpgroup, after its stores,
// synchronises, and one thread fences and adds 1 to t's counter and to the all-FC1 counter; the token
// producer (warp 1) of an FC2 item spins (acquire) until t's counter reaches 2 x FC1's m-tiles, or
// sees every FC1 item done (after which it checks no more), and only then loads the token rows by TMA
// (after a proxy fence: the rows were written by the generic proxy, TMA reads by the async one). The
// weight producer (warp 0) never waits: FC2's weights stream while FC1's last items finish.
// All FC1 items precede every FC2 item in the counter's order and no FC1 item waits, so every wait ends
// once the CTAs holding FC1 items run: the persistent grid is sized to be co-resident, and a CTA that
// is not yet resident (its SM busy with another stream's kernel) holds only its static first item, one
// of the lowest indices, and gets its SM when that kernel ends. One launch instead of two removes a
// kernel boundary: the FC1 tail overlaps FC2's first weight copies (docs/perf.md, sm90 steps 18-21).
struct LaunchParams {
  Params op[2];            // op[1] only for kChain
  // Workspace: [2] schedule counters, then (kChain) FC1 signals in all and one count per token tile;
  // null: the static schedule.
  int* counters = nullptr;
};

template <LaunchMode kMode>
__device__ __forceinline__ bool op_is_fc1(int o) {
  return kMode == LaunchMode::kFc1 || (kMode == LaunchMode::kChain && o == 0);
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
  int32_t* s_prefix = reinterpret_cast<int32_t*>(smem + Cfg::kTableOffset);
  int32_t* s_offsets = s_prefix + kMaxExperts + 1;
  int32_t* s_rows = s_offsets + kMaxExperts + 1;
  int32_t* s_items = s_rows + Cfg::kBN;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int num_experts = p.op[0].num_experts;
  // Barriers
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&full[s], 1 + 32);
      mbar_init(&empty[s], kConsumerWarpgroups * 4);
    }
    for (int i = 0; i < kItemRing; ++i) mbar_init(&item_bar[i], 1);
    fence_barrier_init();
  }
  // With programmatic dependent launch (common/pdl_launch.h, FP4MOE_PDL=1) everything above overlaps the
  // previous kernel's tail; nothing global is touched before this wait.
  pdl_wait();
  if (warp == 1) build_work_table<Cfg::kBN>(p.op[0].expert_offsets, num_experts, s_prefix, s_offsets, lane);
  __syncthreads();

  const int wg = threadIdx.x >> 7;
  if (wg == 0) {
    // Producer
    setmaxnreg_dec<Cfg::Regs::kProducer>();
    if (warp == 0) run_weight_producer<Cfg, kMode>(p, smem, full, empty, item_bar, s_prefix, lane);
    if (warp == 1) run_token_producer<Cfg, kMode>(p, smem, full, empty, item_bar, s_prefix, lane);
    return;
  }
  // Consumer
  setmaxnreg_inc<Cfg::Regs::kConsumer>();
  const int consumer = wg - 1, tid = threadIdx.x & 127;
  const int mtiles0 = (p.op[0].tiles64 + Cfg::kM64PerCta - 1) / Cfg::kM64PerCta;
  const int mtiles1 = (p.op[1].tiles64 + Cfg::kM64PerCta - 1) / Cfg::kM64PerCta;
  const int items0 = s_prefix[num_experts] * mtiles0;
  int stage = 0;
  uint32_t phase = 0;
  float acc[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2];
  for (int j = 0;; ++j) {
    // The producer wrote item j into the ring before filling its first stage (or -1: no more work).
    mbar_wait(&full[stage], phase);
    int w = s_items[j % kItemRing];
    if (w < 0) break;
    int o = 0;
    if (kMode == LaunchMode::kChain && w >= items0) {
      o = 1;
      w -= items0;
    }
    const Params& q = p.op[o];
    const WorkItem it = find_work_item(s_prefix, s_offsets, num_experts, Cfg::kBN, o ? mtiles1 : mtiles0, w);
    const int cta_tile0 = it.mtile * Cfg::kM64PerCta;
    const int first_tile = consumer * Cfg::kM64PerConsumer;  // within the CTA tile
    const int ntiles_valid = min(Cfg::kM64PerConsumer, q.tiles64 - cta_tile0 - first_tile);
    consume_item<Cfg>(smem, full, empty, q.kchunks / Cfg::kChunksPerStage, first_tile, tid, acc, stage, phase);
    // Epilogue
    if (op_is_fc1<kMode>(o)) {
      const float s0 = q.tensor_scales[2 * it.expert] * kAccumulatorScale;
      const float s1 = q.tensor_scales[2 * it.expert + 1] * kAccumulatorScale;
#pragma unroll
      for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
        if (u < ntiles_valid)
          store_tile<Cfg::kBN, true>(acc[u][0], q.out, q.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0,
                                     s1, tid);
      if (kMode == LaunchMode::kChain) {
        // This warpgroup's rows of token tile it.tile are stored: publish them to FC2's token producers
        // (the barrier orders the warpgroup's stores before thread 0's release).
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
          store_tile<Cfg::kBN, false>(acc[u][0], q.out, q.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0,
                                      s0, tid);
    }
  }
  // A chained launch counts the CTA done once both consumer warpgroups are past their last item (their
  // FC1 signals must precede the last CTA's reset of the tile counters). One GEMM alone needs no such
  // wait: the weight producer counts the CTA done after its last fetch, while the consumers still run,
  // which keeps the done count's round trip off the kernel's end (1-2 us at T = 1 when the consumers did
  // it for every launch).
  if (kMode == LaunchMode::kChain) {
    named_barrier_sync(3, 256);
    if (consumer == 0 && tid == 0) finish_work_items(p.counters, 1 + s_prefix[num_experts]);
  }
#endif
}

}  // namespace sm90
}  // namespace fp4moe
