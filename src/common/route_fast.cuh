// The register fast path of top-k routing, shared by the routing kernel (engine/routing.cu), the fused
// small-batch front end (engine/front_small.cu) and the sm90 chained launch that routes for itself
// (front_block.cuh). Semantics (the reference's, src/reference/routing.cpp):
//
// Lane l of the token's warp holds the P = E / 32 contiguous experts l*P .. l*P + P-1 (E a multiple of 32
// up to 512, top-k <= 32 and, for sigmoid routing, n_group dividing 32, which covers DeepSeek-V3, GLM and
// Qwen3), so a group of G = E / n_group experts spans G / P = 32 / n_group whole lanes. Scores become
// order-preserving 32-bit keys (-0 folded into +0 first; 0 marks a masked or taken expert, below every
// real key), and one pick costs a redux.sync max, a ballot and a shuffle: the winner is the lowest lane
// holding the maximum key (lower lane = lower index; inside a lane the first slot wins), which is the
// reference's tie rule. Group scores (top1 + top2) merge per lane and then across the group's lanes with
// butterflies; a group is kept when fewer than topk_group groups beat it. Weights are normalised with the
// reference's operation order (a sequential sum in rank order, then divide, then the routed scaling
// factor). The per-lane loop of the generic kernel was latency-bound: ~22 us for one GLM-5 token on the
// H200 (ncu), a few us here.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "fp4moe/config.h"

namespace fp4moe::route_detail {

struct RouteParams {
  int experts = 0, topk = 0;
  int n_group = 1, topk_group = 1;
  int norm = 0;
  float scale = 1.0f;
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

constexpr int kFastMaxPerLane = 16;  // E <= 512

// Order-preserving key of a float: larger float -> larger unsigned; -0 and +0 map alike. Never 0 for a
// number (the smallest, -inf, maps to 0x007FFFFF), so 0 can mark "not a candidate".
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v + 0.0f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

template <int PMAX>
__device__ __forceinline__ void local_best(const uint32_t (&key)[PMAX], int P, uint32_t& best, int& slot) {
  best = 0;
  slot = 0;
#pragma unroll
  for (int j = 0; j < PMAX; ++j)
    if (j < P && key[j] > best) {
      best = key[j];
      slot = j;
    }
}

// Sigmoid routing's weight source (the unbiased score) and selection score of one expert; every path
// that routes with sigmoid scores computes them with these operations, so their choices and weights
// are the same bytes.
__device__ __forceinline__ float sigmoid_value(float logit) { return 1.0f / (1.0f + expf(-logit)); }

// Lane r < K holds the weight source of the token's rank-r pick in my_w: normalise exactly like the
// reference (a sequential sum in rank order, then divide, then the routed scaling factor) and store the K
// weights.
template <bool kSigmoid>
__device__ __forceinline__ void store_pick_weights(float my_w, const RouteParams& rp, int lane, float* weights) {
  const int K = rp.topk;
  float wsum = 0.0f;
#pragma unroll 8
  for (int j = 0; j < K; ++j) wsum = __fadd_rn(wsum, __shfl_sync(0xffffffffu, my_w, j));
  const float denom = kSigmoid ? __fadd_rn(wsum, 1e-20f) : wsum;
  if (lane < K) {
    float w = my_w;
    if (rp.norm) w = __fdiv_rn(w, denom);
    weights[lane] = __fmul_rn(w, rp.scale);
  }
}

// One token's routing on one warp (lane = threadIdx.x & 31), all of it in registers: row = the token's E
// logits; ids[0, topk) and weights[0, topk) receive its choice (global or shared memory).
template <bool kSigmoid, int PMAX>
__device__ __forceinline__ void route_token_fast(const float* __restrict__ row, const float* __restrict__ bias,
                                                 const RouteParams& rp, int lane, int32_t* ids, float* weights) {
  const int E = rp.experts, K = rp.topk, P = E / 32;
  const float* l = row + lane * P;
  float value[PMAX];   // the weight source: softmax p or unbiased sigmoid s
  uint32_t key[PMAX];  // the selection key
  if constexpr (!kSigmoid) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < PMAX; ++j)
      if (j < P) m = fmaxf(m, l[j]);
    m = warp_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < PMAX; ++j)
      if (j < P) {
        value[j] = expf(l[j] - m);
        sum += value[j];
      }
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < PMAX; ++j)
      if (j < P) {
        value[j] = value[j] / sum;
        key[j] = order_key(value[j]);
      }
  } else {
    const float* b = bias ? bias + lane * P : nullptr;
    // Every load first: the division below may call a slow-path subroutine, which the compiler does not
    // move loads across, so loads interleaved with it were P dependent round trips to memory.
    float lv[PMAX], bv[PMAX];
#pragma unroll
    for (int j = 0; j < PMAX; ++j)
      if (j < P) {
        lv[j] = l[j];
        bv[j] = b ? b[j] : 0.0f;
      }
    float choice[PMAX];
    float top1 = -INFINITY, top2 = -INFINITY;
#pragma unroll
    for (int j = 0; j < PMAX; ++j)
      if (j < P) {
        value[j] = sigmoid_value(lv[j]);
        choice[j] = value[j] + bv[j];
        if (choice[j] > top1) {
          top2 = top1;
          top1 = choice[j];
        } else if (choice[j] > top2) {
          top2 = choice[j];
        }
      }
    // Group selection; every group is kept when topk_group >= n_group (GLM-5: one group), so the merge and
    // the ranking below (six shuffle round trips) are skipped there.
    bool kept = true;
    if (rp.topk_group < rp.n_group) {
      // Merge the two largest across the group's lanes (32 / n_group lanes, aligned).
      const int group_lanes = 32 / rp.n_group;
      for (int o = 1; o < group_lanes; o <<= 1) {
        const float o1 = __shfl_xor_sync(0xffffffffu, top1, o), o2 = __shfl_xor_sync(0xffffffffu, top2, o);
        const float hi = fmaxf(top1, o1), lo = fminf(top1, o1);
        top2 = fmaxf(lo, fmaxf(top2, o2));
        top1 = hi;
      }
      const int G = E / rp.n_group;
      const float gscore = G == 1 ? top1 : top1 + top2;
      const int my_group = lane / group_lanes;
      // Rank of my group: groups with a larger score, or an equal score and a lower index.
      int beaten_by = 0;
      for (int g = 0; g < rp.n_group; ++g) {
        const float other = __shfl_sync(0xffffffffu, gscore, g * group_lanes);
        beaten_by += (other > gscore || (other == gscore && g < my_group)) ? 1 : 0;
      }
      kept = beaten_by < rp.topk_group;
    }
#pragma unroll
    for (int j = 0; j < PMAX; ++j)
      if (j < P) key[j] = kept ? order_key(choice[j]) : 0u;
  }
  // Slots past P (E < 32 * PMAX) are never candidates. The loop runs over every slot with a predicate:
  // starting it at the run-time P would index the array at run time and put it in local memory.
#pragma unroll
  for (int j = 0; j < PMAX; ++j)
    if (j >= P) key[j] = 0u;

  uint32_t best;
  int slot;
  local_best(key, P, best, slot);
  float my_w = 0.0f;  // lane r keeps the weight of rank r
  for (int r = 0; r < K; ++r) {
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    const unsigned holders = __ballot_sync(0xffffffffu, best == top);
    const int winner = __ffs(holders) - 1;
    const int idx = __shfl_sync(0xffffffffu, lane * P + slot, winner);
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < PMAX; ++j)
      if (j == slot) v = value[j];
    v = __shfl_sync(0xffffffffu, v, winner);
    if (lane == r) my_w = v;
    if (lane == 0) ids[r] = idx;
    if (lane == winner) {
#pragma unroll
      for (int j = 0; j < PMAX; ++j)
        if (j == slot) key[j] = 0u;
      local_best(key, P, best, slot);
    }
  }
  store_pick_weights<kSigmoid>(my_w, rp, lane, weights);
}

inline bool fast_route_ok(const RouteParams& rp, bool sigmoid) {
  if (rp.experts % 32 != 0 || rp.experts / 32 > kFastMaxPerLane || rp.topk > 32) return false;
  return !sigmoid || (rp.n_group >= 1 && rp.n_group <= 32 && 32 % rp.n_group == 0);
}

inline RouteParams route_params(const MoeConfig& cfg) {
  RouteParams rp;
  rp.experts = static_cast<int>(cfg.num_experts);
  rp.topk = static_cast<int>(cfg.topk);
  const bool sigmoid = cfg.routing == RoutingKind::kSigmoidGrouped;
  rp.n_group = sigmoid ? static_cast<int>(cfg.n_group) : 1;
  rp.topk_group = sigmoid ? static_cast<int>(cfg.topk_group) : 1;
  rp.norm = cfg.norm_topk_prob ? 1 : 0;
  rp.scale = cfg.routed_scaling_factor;
  return rp;
}

}  // namespace fp4moe::route_detail
