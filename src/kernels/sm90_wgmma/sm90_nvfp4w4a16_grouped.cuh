// sm90_nvfp4w4a16_grouped: the Hopper NVFP4 weight-only grouped GEMM (one kernel, FC1 or FC2).
//
// What a CTA computes: a persistent loop over work items (expert, m-tile of BM packed weight rows,
// token tile of BN rows) from the device-built list, handed out dynamically by a counter in the
// tactic's workspace (sm90_scheduler.cuh); the producer passes each item to the consumers through the
// item ring in shared memory, and -1 ends the loop. For each item
//   D[BM weight rows, BN tokens] = W_e[rows, K] . X[tokens, K]^T    (weights on wgmma's M side)
// and the epilogue writes out[token, column] (sm90_epilogue.cuh).
//
// Warp roles (384 threads, tile_config.h):
//   warpgroup 0  producer: warp 0 fills the stage ring with bulk (TMA) weight copies and cp.async token
//                copies (sm90_producer.cuh); setmaxnreg.dec to 56 (40 with two CTAs per SM); warps 1-3 leave.
//   warpgroups 1, 2  consumers: setmaxnreg.inc to 224 (96); dequantise the NVFP4 weights into wgmma A
//                registers and run RS wgmma against the token tile (sm90_consumer.cuh).
// Shared memory: the stage ring, 2 x STAGES mbarriers, the work-list table (byte offsets in
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

struct Params {
  // Contiguous token rows (a_row_index null, FC2): a 2D tensor map over a [total_rows, k] bf16 with a
  // box of 64 k x BN rows and the 128-byte swizzle, so the producer loads a token sub-tile with one TMA
  // copy instead of BN*8 16-byte cp.async copies. tok_tma = 0: the cp.async path (gathered rows, FC1).
  CUtensorMap tok_map;
  int tok_tma = 0;
  const int32_t* expert_offsets = nullptr;  // [E + 1] device, rows grouped by expert
  int* counters = nullptr;                  // [2] device, zero: the dynamic schedule (sm90_scheduler.cuh)
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

template <class Cfg, bool kFc1>
__global__ void __launch_bounds__(kThreads, Cfg::kCtasPerSm) sm90_nvfp4w4a16_grouped_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // Shared memory
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
  uint64_t* empty = full + Cfg::kStages;
  int32_t* s_prefix = reinterpret_cast<int32_t*>(smem + Cfg::kTableOffset);
  int32_t* s_offsets = s_prefix + kMaxExperts + 1;
  int32_t* s_rows = s_offsets + kMaxExperts + 1;
  int32_t* s_items = s_rows + Cfg::kBN;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int mtiles = (p.tiles64 + Cfg::kM64PerCta - 1) / Cfg::kM64PerCta;
  // Barriers
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&full[s], 1 + 32);
      mbar_init(&empty[s], kConsumerWarpgroups * 4);
    }
    fence_barrier_init();
  }
  // With programmatic dependent launch (common/pdl_launch.h, FP4MOE_PDL=1) everything above overlaps the
  // previous kernel's tail; nothing global is touched before this wait.
  pdl_wait();
  if (warp == 1) build_work_table<Cfg::kBN>(p.expert_offsets, p.num_experts, mtiles, s_prefix, s_offsets, lane);
  __syncthreads();

  const int wg = threadIdx.x >> 7;
  if (wg == 0) {
    // Producer
    setmaxnreg_dec<Cfg::Regs::kProducer>();
    if (warp == 0) run_producer<Cfg>(p, smem, full, empty, s_prefix, s_offsets, s_rows, s_items, lane);
    return;
  }
  // Consumer
  setmaxnreg_inc<Cfg::Regs::kConsumer>();
  const int consumer = wg - 1, tid = threadIdx.x & 127;
  const int nstages = p.kchunks / Cfg::kChunksPerStage;
  int stage = 0;
  uint32_t phase = 0;
  float acc[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2];
  for (int j = 0;; ++j) {
    // The producer wrote item j into the ring before filling its first stage (or -1: no more work).
    mbar_wait(&full[stage], phase);
    const int w = s_items[j % kItemRing];
    if (w < 0) break;
    const WorkItem it = find_work_item(s_prefix, s_offsets, p.num_experts, Cfg::kBN, w);
    const int cta_tile0 = it.mtile * Cfg::kM64PerCta;
    const int first_tile = consumer * Cfg::kM64PerConsumer;  // within the CTA tile
    const int ntiles_valid = min(Cfg::kM64PerConsumer, p.tiles64 - cta_tile0 - first_tile);
    consume_item<Cfg>(smem, full, empty, nstages, first_tile, tid, acc, stage, phase);
    // Epilogue
    float s0, s1;
    if (kFc1) {
      s0 = p.tensor_scales[2 * it.expert] * kAccumulatorScale;
      s1 = p.tensor_scales[2 * it.expert + 1] * kAccumulatorScale;
    } else {
      s0 = s1 = p.tensor_scales[it.expert] * kAccumulatorScale;
    }
#pragma unroll
    for (int u = 0; u < Cfg::kM64PerConsumer; ++u)
      if (u < ntiles_valid)
        store_tile<Cfg::kBN, kFc1>(acc[u][0], p.out, p.n, cta_tile0 + first_tile + u, it.row_begin, it.row_end, s0, s1,
                                   tid);
  }
#endif
}

}  // namespace sm90
}  // namespace fp4moe
