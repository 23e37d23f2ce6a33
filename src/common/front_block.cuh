// The decode front end inside one thread block: top-k routing of a few tokens and the stable permutation
// of their (token, expert) pairs into grouped rows, all in shared memory. Two callers: the fused
// small-batch front end (engine/front_small.cu), each of whose blocks does it before copying rows, and the
// sm90 chained launch (kernels/sm90_wgmma), each of whose CTAs does it in its prologue instead of reading
// offsets a separate launch wrote (RouteFront there). Every block of a launch computes the same bytes;
// block 0 alone stores the maps.
//
// Steps (every thread of the block calls front_route_permute): one warp per token runs the register
// routing (route_fast.cuh) into s.id / s.w; thread i < P = T * topk maps pair i to its permutation expert
// (expert parallelism: local id, or the dropped bucket `count` for another rank's expert) and counts it
// with a shared atomic; a block-wide exclusive scan of the counts gives s.off; pair i takes row =
// off[e] + (pairs j < i of the same expert), the stable grouping of engine/permute.cu. With `append`
// every token is also a row of one more expert: rows P .. P + T - 1, off[pexperts + 1] = P + T.
// CUDA header for .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/route_fast.cuh"
#include "common/warp_scan.cuh"

namespace fp4moe {

constexpr int kFrontMaxPairs = 64;                                             // T * topk
constexpr int kFrontMaxRows = 2 * kFrontMaxPairs;                              // with the appended rows
constexpr int kFrontMaxExperts = 32 * route_detail::kFastMaxPerLane + 1;       // + the dropped bucket

// What the front end computes and where block 0 stores it (device pointers; all but logits optional
// when `write` is false).
struct RouteFront {
  const float* logits = nullptr;  // [T, E] fp32
  const float* bias = nullptr;    // [E] or null (sigmoid routing's selection bias)
  route_detail::RouteParams rp;
  int sigmoid = 0;
  int tokens = 0;
  int local = 0;                  // expert parallelism: global ids mapped into [first, first + count) or `count`
  int first = 0, count = 0;
  int pexperts = 0;               // experts the permutation groups into (E, or count + 1)
  int append = 0;                 // every token also as a row of expert `pexperts` (no expert shard)
  int32_t* ids = nullptr;         // [T, topk] global ids
  float* weights = nullptr;       // [T, topk]
  int32_t* offsets = nullptr;     // [pexperts + 1] (+1 with append)
  int32_t* gather = nullptr;      // [P]: token of grouped row r
  int32_t* pair_pos = nullptr;    // [P]: grouped row of pair i
};

// Shared-memory arrays of the block (sizes: id, w, loc kFrontMaxPairs; src kFrontMaxRows; off
// pexperts + 2; warp_sums blockDim.x / 32).
struct FrontScratch {
  int32_t* id;
  float* w;
  int32_t* loc;
  int32_t* src;        // out: token of grouped row r (appended rows included)
  int32_t* off;        // out: exclusive row offsets per permutation expert
  int32_t* warp_sums;
};

// Whether the register routing and the block's arrays take this batch.
inline bool front_block_fits(const route_detail::RouteParams& rp, bool sigmoid, int64_t tokens,
                             int64_t pexperts) {
  return tokens >= 1 && route_detail::fast_route_ok(rp, sigmoid) && tokens * rp.topk <= kFrontMaxPairs &&
         pexperts >= 1 && pexperts <= kFrontMaxExperts;
}

// Every thread of the block calls it, after any wait for the kernels that wrote the logits; it returns
// after a __syncthreads with s.off and s.src complete. write: also store ids, weights, offsets, gather and
// pair_pos (one block of the launch).
template <bool kSigmoid, int PMAX>
__device__ void front_route_permute(const RouteFront& f, const FrontScratch& s, bool write) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nthreads = blockDim.x, nwarps = nthreads >> 5;
  const int K = f.rp.topk, P = f.tokens * K, E2 = f.pexperts;
  for (int e = tid; e <= E2 + 1; e += nthreads) s.off[e] = 0;
  for (int t = warp; t < f.tokens; t += nwarps)
    route_detail::route_token_fast<kSigmoid, PMAX>(f.logits + static_cast<int64_t>(t) * f.rp.experts, f.bias, f.rp,
                                                   lane, s.id + t * K, s.w + t * K);
  __syncthreads();
  // Permutation expert and histogram.
  int mine = 0;
  if (tid < P) {
    mine = s.id[tid];
    if (f.local) {
      const unsigned l = static_cast<unsigned>(mine - f.first);  // below `first` wraps to large
      mine = l < static_cast<unsigned>(f.count) ? static_cast<int>(l) : f.count;
    }
    s.loc[tid] = mine;
    atomicAdd(&s.off[mine], 1);
  }
  __syncthreads();
  // Exclusive scan of the counts: thread tid owns the entries [tid * per, tid * per + per).
  const int per = (E2 + nthreads - 1) / nthreads;
  int sum = 0;
  for (int j = 0; j < per; ++j) {
    const int e = tid * per + j;
    if (e < E2) sum += s.off[e];
  }
  const int incl = warp_inclusive_sum(sum, lane);
  if (lane == 31) s.warp_sums[warp] = incl;
  __syncthreads();
  int base = incl - sum;
  for (int w = 0; w < warp; ++w) base += s.warp_sums[w];
  for (int j = 0; j < per; ++j) {  // each entry is read and rewritten by its owner only
    const int e = tid * per + j;
    if (e < E2) {
      const int c = s.off[e];
      s.off[e] = base;
      base += c;
    }
  }
  if (tid == 0) {
    s.off[E2] = P;
    if (f.append) s.off[E2 + 1] = P + f.tokens;
  }
  __syncthreads();
  // Stable rows: pair i goes after the earlier pairs of its expert.
  if (tid < P) {
    int rank = 0;
#pragma unroll 8
    for (int j = 0; j < tid; ++j) rank += s.loc[j] == mine ? 1 : 0;
    const int row = s.off[mine] + rank;
    s.src[row] = tid / K;
    if (write) {
      f.gather[row] = tid / K;
      f.pair_pos[tid] = row;
      f.ids[tid] = s.id[tid];
      f.weights[tid] = s.w[tid];
    }
  }
  if (f.append)
    for (int t = tid; t < f.tokens; t += nthreads) s.src[P + t] = t;
  if (write) {
    for (int e = tid; e <= E2; e += nthreads) f.offsets[e] = s.off[e];
    if (f.append && tid == 0) f.offsets[E2 + 1] = P + f.tokens;
  }
  __syncthreads();
}

}  // namespace fp4moe
