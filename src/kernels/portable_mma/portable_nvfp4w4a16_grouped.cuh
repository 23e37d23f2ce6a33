// Portable NVFP4 grouped GEMM, weight-only W4A16: mma.sync.m16n8k16 (bf16 in, fp32 accumulate), sm_80+.
// The correct fallback on every supported GPU; FC1 (gate/up + SwiGLU) and FC2 share one kernel.
//
// What one CTA computes (swap A/B, shared/DESIGN.md section 5)
//   Weight rows take the MMA's M side and tokens its N side, so an expert holding a single token still
//   fills m16n8 tiles. blockIdx.y picks a weight tile, blockIdx.x an item of the work list of
//   (expert, token tile) pairs; every CTA derives the list from the device offsets with a block-wide
//   scan of ceil(count_e / BN) (no host round trip; CTAs past the list's end exit at once).
//     FC2: weight rows [c0, c0 + BM) of W2_e [N, K]           -> out[row, c0 .. c0 + BM)
//     FC1: gate rows [c0, c0 + BM/2) and up rows I + [c0, ..) -> out[row, c0 .. c0 + BM/2)
//          so each thread's accumulators hold gate and up of the same (column, token) and SwiGLU
//          (silu(gate * s_gate) * up * s_up, fp32, rounded once to bf16: R3) runs in registers.
//   FC2 output is acc * s_down rounded to bf16 (R4). Rows past the expert's count, columns past N and
//   K past the last multiple of 64 are zero-filled on load and masked on store: any N, any K = 16 j.
//
// Shared memory, one stage (STAGES stages, 64 K elements each), byte offsets from the stage start:
//   [0, BM*32)                packed codes, weight row r at r*32 (four 8-byte blocks of 16 codes)
//   [BM*32, BM*36)            E4M3 block scales, row r at BM*32 + r*4 (one byte per 16-element block)
//   [BM*36, BM*36 + BN*128)   tokens, bf16, row t at t*128 as eight 16-byte chunks; chunk c is stored
//                             at slot c ^ (t & 1) so the 128-bit fragment loads of rows t and t+1 hit
//                             disjoint banks.
//   The bf16-weight variant (a bf16 shared expert) stores weight rows like token rows (BM*128 bytes)
//   and has no scales.
//
// Warps: WARPS_M x WARPS_N, all of them load (cp.async) and compute; warp (wm, wn) owns MT = WM/16
// m16 tiles and NT = WN/8 n8 tiles. FC1 warps own MT/2 gate tiles and the MT/2 matching up tiles.
//
// Fragments and the K permutation. Lane = 4*g + tig. A reduction inside one mma may visit K in any
// order as long as A and B agree, so lane tig takes physical block tig (K elements 16 tig .. 16 tig+15
// of the stage) and feeds it over the stage's four k-steps s = 2h + p (h: which 8 elements, p: half):
//   A regs (row g: R0 R2, row g+8: R1 R3) = code pairs (8h + 0, 8h + 4), (8h + 1, 8h + 5)  when p = 0
//                                         = code pairs (8h + 2, 8h + 6), (8h + 3, 8h + 7)  when p = 1
//   B regs (token g: B0 B1)               = the bf16 pairs of the same elements, from one 128-bit load
//                                           of chunk 2 tig + h rebuilt with two byte permutes.
//   So a thread reads 8 code bytes and one scale byte per weight row per stage (64-bit loads).
//   Dequantisation (mma_ptx.cuh): shift/mask to code * 2^-126, one bf16x2 multiply by scale * 2^118.
//   Accumulators C[r][c]: c0 (row g, token 2 tig), c1 (g, 2 tig+1), c2 (g+8, 2 tig), c3 (g+8, 2 tig+1).
//
// Packed weight layout (kCanonical, see src/engine/weight_layout.h): codes [E][Nw][K/2] (code 2i in the
// low nibble), then scales [E][Nw][K/16]; FC1's Nw = 2I rows are gate rows then up rows. Codes are
// loaded 16 bytes at a time when K % 32 == 0 (row starts 16-byte aligned), else 8; scales 4 bytes when
// K % 64 == 0, else byte by byte.
#pragma once
#include <cstdint>

#include "kernels/portable_mma/mma_ptx.cuh"
#include "kernels/portable_mma/tile_config.h"

namespace fp4moe::portable {

struct Params {
  const int32_t* expert_offsets = nullptr;  // [E + 1] problem rows per expert (device)
  const uint16_t* a = nullptr;               // bf16 activations, rows a_ld elements apart (16-byte aligned)
  const int32_t* a_row_index = nullptr;      // [total_rows] source row of each problem row, or null
  int64_t a_ld = 0;                          // elements, multiple of 8
  const uint8_t* codes = nullptr;            // [E][Nw][K/2] packed E2M1 (NVFP4 variant)
  const uint8_t* scales = nullptr;           // [E][Nw][K/16] E4M3 (NVFP4 variant)
  const uint16_t* w_bf16 = nullptr;          // [E][Nw][K] bf16 (bf16 variant)
  const float* tensor_scales = nullptr;      // FC1 [E][2] (gate, up), FC2 [E]; null means 1
  uint16_t* out = nullptr;                   // bf16 [rows][n]
  int num_experts = 0;
  int n = 0;            // output columns: FC1 I, FC2 H
  int k = 0;            // reduction length, multiple of 16
  int codes_vec16 = 0;  // 1 when K % 32 == 0
  int scales_vec4 = 0;  // 1 when K % 64 == 0
};

// Work-list lookup: the expert and token range of work item `item`. Returns false (uniformly) when the
// item lies past the list's end.
template <int BN, int THREADS>
__device__ __forceinline__ bool find_token_tile(const int32_t* __restrict__ offsets, int num_experts, int item,
                                                int* s_warp_sums, int* s_found, int& expert, int& row0,
                                                int& rows) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kWarps = THREADS / 32;
  if (tid == 0) s_found[0] = -1;
  int carry = 0;  // work items of the experts before this chunk
  for (int base = 0; base < num_experts; base += THREADS) {
    const int e = base + tid;
    int start = 0, count = 0;
    if (e < num_experts) {
      start = offsets[e];
      count = offsets[e + 1] - start;
    }
    const int tiles = (count + BN - 1) / BN;
    int incl = tiles;  // inclusive warp scan
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) s_warp_sums[warp] = incl;
    __syncthreads();
    int before = 0, chunk_total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int v = s_warp_sums[w];
      before += (w < warp) ? v : 0;
      chunk_total += v;
    }
    const int hi = carry + before + incl, lo = hi - tiles;
    if (tiles > 0 && item >= lo && item < hi) {
      s_found[0] = e;
      s_found[1] = start + (item - lo) * BN;
      s_found[2] = min(BN, count - (item - lo) * BN);
    }
    carry += chunk_total;
    __syncthreads();
    if (carry > item) break;  // uniform: every thread holds the same carry
  }
  expert = s_found[0];
  row0 = s_found[1];
  rows = s_found[2];
  return expert >= 0;
}

// Occupancy floor: two 256-thread or four 128-thread CTAs per SM (at most 128 registers per thread), so
// one CTA's barrier wait overlaps another CTA's loads and MMAs.
template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, bool FC1, bool BF16W>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32, (WARPS_M * WARPS_N >= 8) ? 2 : 4)
    grouped_gemm_kernel(const __grid_constant__ Params p) {
  using Cfg = TileConfig<BM, BN, WARPS_M, WARPS_N, STAGES, BF16W>;
  constexpr int kThreads = Cfg::kThreads, MT = Cfg::kMT, NT = Cfg::kNT, WM = Cfg::kWM, WN = Cfg::kWN;
  constexpr int kOutCols = FC1 ? BM / 2 : BM;  // output columns per CTA

  // Shared memory
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_src_row[BN];  // source activation row of each token of the tile, -1 past the expert
  __shared__ int s_warp_sums[32];
  __shared__ int s_found[4];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

  int expert, row0, rows;
  if (!find_token_tile<BN, kThreads>(p.expert_offsets, p.num_experts, blockIdx.x, s_warp_sums, s_found, expert,
                                     row0, rows))
    return;
  const int col0 = blockIdx.y * kOutCols;
  const int K = p.k, N = p.n;
  const int64_t weight_rows = FC1 ? 2 * static_cast<int64_t>(N) : N;

  for (int t = tid; t < BN; t += kThreads) {
    int src = -1;
    if (t < rows) src = p.a_row_index ? p.a_row_index[row0 + t] : row0 + t;
    s_src_row[t] = src;
  }
  __syncthreads();

  // Weight row (within the expert) held by CTA-local row r, or -1 when past N.
  auto weight_row = [&](int r) -> int64_t {
    if constexpr (FC1) {
      const int j = col0 + (r < BM / 2 ? r : r - BM / 2);
      if (j >= N) return -1;
      return r < BM / 2 ? j : static_cast<int64_t>(N) + j;
    } else {
      const int j = col0 + r;
      return j < N ? j : -1;
    }
  };
  const int64_t expert_row0 = static_cast<int64_t>(expert) * weight_rows;

  // Producer: every thread issues its share of one stage's cp.async copies.
  auto load_stage = [&](int stage, int kt) {
    uint8_t* st = smem + stage * Cfg::kStageBytes;
    const int k0 = kt * kBlockK;
    if constexpr (BF16W) {
      for (int c = tid; c < BM * 8; c += kThreads) {
        const int r = c >> 3, ch = c & 7, kk = k0 + ch * 8;
        const int64_t wr = weight_row(r);
        const bool ok = wr >= 0 && kk < K;
        const uint16_t* src = ok ? p.w_bf16 + (expert_row0 + wr) * K + kk : p.w_bf16;
        cp_async_16(smem_addr(st + r * kBf16BytesPerRow + ((ch ^ (r & 1)) << 4)), src, ok);
      }
    } else {
      const int64_t code_ld = K / 2, scale_ld = K / 16;
      if (p.codes_vec16) {
        for (int c = tid; c < BM * 2; c += kThreads) {
          const int r = c >> 1, ch = c & 1, kk = k0 + ch * 32;
          const int64_t wr = weight_row(r);
          const bool ok = wr >= 0 && kk < K;
          const uint8_t* src = ok ? p.codes + (expert_row0 + wr) * code_ld + kk / 2 : p.codes;
          cp_async_16(smem_addr(st + r * kCodeBytesPerRow + ch * 16), src, ok);
        }
      } else {
        for (int c = tid; c < BM * 4; c += kThreads) {
          const int r = c >> 2, b = c & 3, kk = k0 + b * 16;
          const int64_t wr = weight_row(r);
          const bool ok = wr >= 0 && kk < K;
          const uint8_t* src = ok ? p.codes + (expert_row0 + wr) * code_ld + kk / 2 : p.codes;
          cp_async_8(smem_addr(st + r * kCodeBytesPerRow + b * 8), src, ok);
        }
      }
      uint8_t* ss = st + Cfg::kWeightBytes;
      if (p.scales_vec4) {
        for (int r = tid; r < BM; r += kThreads) {
          const int64_t wr = weight_row(r);
          const bool ok = wr >= 0;
          const uint8_t* src = ok ? p.scales + (expert_row0 + wr) * scale_ld + k0 / 16 : p.scales;
          cp_async_4(smem_addr(ss + r * kScaleBytesPerRow), src, ok);
        }
      } else {
        // Rows of K/16 bytes are not 4-byte aligned: plain loads, visible after the consumer's barrier.
        for (int c = tid; c < BM * 4; c += kThreads) {
          const int r = c >> 2, b = c & 3, kk = k0 + b * 16;
          const int64_t wr = weight_row(r);
          uint8_t v = 0;
          if (wr >= 0 && kk < K) v = __ldg(p.scales + (expert_row0 + wr) * scale_ld + kk / 16);
          ss[r * kScaleBytesPerRow + b] = v;
        }
      }
    }
    uint8_t* sa = st + Cfg::kWeightBytes + Cfg::kScaleBytes;
    for (int c = tid; c < BN * 8; c += kThreads) {
      const int t = c >> 3, ch = c & 7, kk = k0 + ch * 8;
      const int src_row = s_src_row[t];
      const bool ok = src_row >= 0 && kk < K;
      const uint16_t* src = ok ? p.a + static_cast<int64_t>(src_row) * p.a_ld + kk : p.a;
      cp_async_16(smem_addr(sa + t * kBf16BytesPerRow + ((ch ^ (t & 1)) << 4)), src, ok);
    }
  };

  // CTA-local first weight row of this warp's m16 tile mi (FC1: gate tiles, then the matching up tiles).
  auto tile_row = [&](int mi) -> int {
    if constexpr (FC1) {
      return mi < MT / 2 ? wm * (WM / 2) + mi * 16 : BM / 2 + wm * (WM / 2) + (mi - MT / 2) * 16;
    } else {
      return wm * WM + mi * 16;
    }
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int nj = 0; nj < NT; ++nj)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][nj][r] = 0.0f;

  // Consumer: the four k-steps of one stage.
  auto compute_stage = [&](int stage) {
    const uint8_t* st = smem + stage * Cfg::kStageBytes;
    const uint32_t sw = smem_addr(st);
    const uint32_t ss_off = Cfg::kWeightBytes;
    const uint32_t sa = smem_addr(st + Cfg::kWeightBytes + Cfg::kScaleBytes);
    uint32_t code[MT][2][2];  // [tile][row g, row g+8][word: codes 0..7, 8..15 of block tig]
    uint32_t scale[MT][2];    // bf16x2 scale * 2^118 of rows g, g+8
    if constexpr (!BF16W) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        const int r = tile_row(mi) + g;
        lds_64(sw + r * kCodeBytesPerRow + tig * 8, code[mi][0][0], code[mi][0][1]);
        lds_64(sw + (r + 8) * kCodeBytesPerRow + tig * 8, code[mi][1][0], code[mi][1][1]);
        scale[mi][0] = e4m3_to_bf16x2_scaled(st[ss_off + r * kScaleBytesPerRow + tig]);
        scale[mi][1] = e4m3_to_bf16x2_scaled(st[ss_off + (r + 8) * kScaleBytesPerRow + tig]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t tok[NT][4];  // bf16 elements 16 tig + 8h .. +7 of token g of each n8 tile
#pragma unroll
      for (int nj = 0; nj < NT; ++nj) {
        const int t = wn * WN + nj * 8 + g;
        lds_128(sa + t * kBf16BytesPerRow + (((2 * tig + h) ^ (t & 1)) << 4), tok[nj]);
      }
      uint32_t wrow[MT][2][4];  // bf16 variant: the same elements of weight rows g and g+8
      if constexpr (BF16W) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          const int r = tile_row(mi) + g;  // r and r + 8 have the same parity
          const uint32_t slot = ((2 * tig + h) ^ (r & 1)) << 4;
          lds_128(sw + r * kBf16BytesPerRow + slot, wrow[mi][0]);
          lds_128(sw + (r + 8) * kBf16BytesPerRow + slot, wrow[mi][1]);
        }
      }
#pragma unroll
      for (int pp = 0; pp < 2; ++pp) {
        uint32_t bfrag[NT][2];
#pragma unroll
        for (int nj = 0; nj < NT; ++nj) {
          bfrag[nj][0] = pair_lo(tok[nj][pp], tok[nj][pp + 2]);
          bfrag[nj][1] = pair_hi(tok[nj][pp], tok[nj][pp + 2]);
        }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          uint32_t afrag[4];
          if constexpr (BF16W) {
            afrag[0] = pair_lo(wrow[mi][0][pp], wrow[mi][0][pp + 2]);
            afrag[1] = pair_lo(wrow[mi][1][pp], wrow[mi][1][pp + 2]);
            afrag[2] = pair_hi(wrow[mi][0][pp], wrow[mi][0][pp + 2]);
            afrag[3] = pair_hi(wrow[mi][1][pp], wrow[mi][1][pp + 2]);
          } else if (pp == 0) {
            afrag[0] = bf16x2_mul(e2m1x2_to_bf16x2_raw<12>(code[mi][0][h]), scale[mi][0]);
            afrag[1] = bf16x2_mul(e2m1x2_to_bf16x2_raw<12>(code[mi][1][h]), scale[mi][1]);
            afrag[2] = bf16x2_mul(e2m1x2_to_bf16x2_raw<8>(code[mi][0][h]), scale[mi][0]);
            afrag[3] = bf16x2_mul(e2m1x2_to_bf16x2_raw<8>(code[mi][1][h]), scale[mi][1]);
          } else {
            afrag[0] = bf16x2_mul(e2m1x2_to_bf16x2_raw<4>(code[mi][0][h]), scale[mi][0]);
            afrag[1] = bf16x2_mul(e2m1x2_to_bf16x2_raw<4>(code[mi][1][h]), scale[mi][1]);
            afrag[2] = bf16x2_mul(e2m1x2_to_bf16x2_raw<0>(code[mi][0][h]), scale[mi][0]);
            afrag[3] = bf16x2_mul(e2m1x2_to_bf16x2_raw<0>(code[mi][1][h]), scale[mi][1]);
          }
#pragma unroll
          for (int nj = 0; nj < NT; ++nj) mma_bf16_16816(acc[mi][nj], afrag, bfrag[nj]);
        }
      }
    }
  };

  // Main loop: STAGES-1 stages in flight ahead of the one being consumed.
  const int ktiles = (K + kBlockK - 1) / kBlockK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt visible to all; stage kt-1 consumed by all, so it may be refilled
    const int next = kt + STAGES - 1;
    if (next < ktiles) load_stage(next % STAGES, next);
    cp_async_commit();
    compute_stage(kt % STAGES);
  }
  cp_async_wait<0>();

  // Epilogue: tensor scales in fp32 (times 2^8 for the NVFP4 variant, see mma_ptx.cuh), bf16 stores.
  const float unbias = BF16W ? 1.0f : 256.0f;
  const int tok0 = wn * WN;
  if constexpr (FC1) {
    const float sg = (p.tensor_scales ? p.tensor_scales[2 * expert] : 1.0f) * unbias;
    const float su = (p.tensor_scales ? p.tensor_scales[2 * expert + 1] : 1.0f) * unbias;
#pragma unroll
    for (int mi = 0; mi < MT / 2; ++mi)
#pragma unroll
      for (int nj = 0; nj < NT; ++nj)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int j = col0 + tile_row(mi) + g + (r >> 1) * 8;
          const int t = tok0 + nj * 8 + 2 * tig + (r & 1);
          if (j < N && t < rows) {
            const float gate = acc[mi][nj][r] * sg;
            const float up = acc[mi + MT / 2][nj][r] * su;
            const float v = gate / (1.0f + expf(-gate)) * up;
            p.out[static_cast<int64_t>(row0 + t) * N + j] = f32_to_bf16_rn(v);
          }
        }
  } else {
    const float sd = (p.tensor_scales ? p.tensor_scales[expert] : 1.0f) * unbias;
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int nj = 0; nj < NT; ++nj)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int j = col0 + tile_row(mi) + g + (r >> 1) * 8;
          const int t = tok0 + nj * 8 + 2 * tig + (r & 1);
          if (j < N && t < rows) p.out[static_cast<int64_t>(row0 + t) * N + j] = f32_to_bf16_rn(acc[mi][nj][r] * sd);
        }
  }
}

// Upper bound of work-list items for `total_rows` rows over `num_experts` experts with BN-token tiles:
// sum_e ceil(c_e / BN) <= floor(total / BN) + (experts with rows).
inline int64_t token_tile_bound(int64_t total_rows, int64_t num_experts, int bn) {
  return total_rows / bn + (total_rows < num_experts ? total_rows : num_experts);
}

}  // namespace fp4moe::portable
