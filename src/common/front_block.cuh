// The decode front end inside one thread block: top-k routing of a few tokens and the stable permutation
// of their (token, expert) pairs into grouped rows, all in shared memory. Two callers: the fused
// small-batch front end (engine/front_small.cu), each of whose blocks does it before copying rows, and the
// sm90 chained launch (kernels/sm90_wgmma), each of whose CTAs does it in its prologue instead of reading
// offsets a separate launch wrote (RouteFront there). Every block of a launch computes the same bytes;
// block 0 alone stores the maps.
//
// Steps (every thread of the block calls front_route_permute): the routing into s.id / s.w, either one
// warp per token running the register routing (route_fast.cuh), or in two levels (route_two_level below:
// sigmoid scores without a group limit such as GLM-5's, at most one 32-expert slice per warp, a scratch
// for the candidates and 16-byte aligned logits and bias); thread i < P = T * topk maps pair i to its
// permutation expert (expert parallelism: local id, or the dropped bucket `count` for another rank's
// expert) and counts it with a shared atomic; a block-wide exclusive scan of the counts gives s.off; pair
// i takes row = off[e] + (pairs j < i of the same expert), the stable grouping of engine/permute.cu. With
// `append` every token is also a row of one more expert: rows P .. P + T - 1, off[pexperts + 1] = P + T.
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
constexpr int kFrontCandsPerToken = 64;                                        // route_two_level's candidates
constexpr int kFrontMaxCands = 8 * kFrontCandsPerToken;                        // its scratch (all tokens)
constexpr int kFrontMaxStagedExperts = 256;                                    // ... and its staged scores:
constexpr int kFrontMaxStaged = (kFrontMaxCands / kFrontCandsPerToken + 1) * kFrontMaxStagedExperts;  // + bias

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
  int32_t* gather = nullptr;      // [P (+ tokens with append)]: token of grouped row r
  int32_t* pair_pos = nullptr;    // [P]: grouped row of pair i
};

// Shared-memory arrays of the block (sizes: id, w, loc kFrontMaxPairs; src kFrontMaxRows; off
// pexperts + 2; warp_sums blockDim.x / 32). Loops over them are kept rolled (#pragma unroll 1): the
// code runs once per launch from a cold instruction cache, where its footprint is its cost.
struct FrontScratch {
  int32_t* id;
  float* w;
  int32_t* loc;
  int32_t* src;        // out: token of grouped row r (appended rows included)
  int32_t* off;        // out: exclusive row offsets per permutation expert
  int32_t* warp_sums;
  // route_two_level's candidates, kFrontMaxCands each, and its staged logits and biases
  // (kFrontMaxStaged floats, 16-byte aligned), or null (the one-warp-per-token routing only).
  uint32_t* cand_key = nullptr;
  int32_t* cand_idx = nullptr;
  float* cand_val = nullptr;
  float* staged = nullptr;
};

// The scratch laid out in `area`: shared memory of a caller that no copy fills before the routing ends (the
// chained sm90 launches' first stage or chunk bytes): id, w and loc (kFrontMaxPairs each) and the warp sums
// (at most 32) in its first 1,024 bytes, the caller's RouteFront copy at kFrontAreaRouteFront, then the
// two-level routing's candidates and staged scores, up to kFrontAreaEnd; src and off are the caller's.
constexpr int kFrontAreaRouteFront = 1024;
constexpr int kFrontAreaCand = 2048;
constexpr int kFrontAreaStaged = kFrontAreaCand + 12 * kFrontMaxCands;
constexpr int kFrontAreaEnd = kFrontAreaStaged + 4 * kFrontMaxStaged;
static_assert((3 * kFrontMaxPairs + 32) * 4 <= kFrontAreaRouteFront, "id, w, loc and the warp sums");
static_assert(kFrontAreaRouteFront + int(sizeof(RouteFront)) <= kFrontAreaCand, "the RouteFront copy");
__device__ inline FrontScratch front_scratch_in(uint8_t* area, int32_t* src, int32_t* off) {
  int32_t* scratch = reinterpret_cast<int32_t*>(area);
  int32_t* cand = reinterpret_cast<int32_t*>(area + kFrontAreaCand);
  return FrontScratch{scratch, reinterpret_cast<float*>(scratch + kFrontMaxPairs), scratch + 2 * kFrontMaxPairs,
                      src, off, scratch + 3 * kFrontMaxPairs, reinterpret_cast<uint32_t*>(cand),
                      cand + kFrontMaxCands, reinterpret_cast<float*>(cand + 2 * kFrontMaxCands),
                      reinterpret_cast<float*>(area + kFrontAreaStaged)};
}

// Whether route_two_level takes the batch: sigmoid scores with every group kept (topk_group >= n_group),
// each token's slices x topk candidates within kFrontCandsPerToken, all tokens' within the scratch, and at
// most one (token, slice) task per warp. With more, a warp's picks for several slices in a row cost more than
// one warp per token: measured at T = 8 (8 tasks per warp in the fused front end's 8 warps) the EP8 forward
// took 102 us against 91.5, the TP8 one 68.8 against 65.9 (docs/perf.md, sm90 step 32).
__host__ __device__ inline bool front_two_level_ok(const route_detail::RouteParams& rp, bool sigmoid, int tokens,
                                                   int warps) {
  return sigmoid && rp.topk_group >= rp.n_group && rp.topk <= 32 && rp.experts >= 32 && rp.experts % 32 == 0 &&
         rp.experts <= kFrontMaxStagedExperts && (rp.experts / 32) * rp.topk <= kFrontCandsPerToken &&
         tokens * kFrontCandsPerToken <= kFrontMaxCands && tokens * (rp.experts / 32) <= warps;
}

// Two-level top-k of sigmoid scores: the E experts of a token are E / 32 slices of 32 (one per lane); any
// warp takes a (token, slice) task and picks its slice's top-k (k picks of a redux.sync max, a ballot and one
// lane's store), writing the candidates in rank order; after a barrier one warp per token picks its top-k
// among the slices' candidates (two per lane). Every expert of the global top-k is in its slice's top-k, and
// both levels break ties towards the lower lane, which is the lower expert index (slices in order, a slice's
// equal keys in index order), so the choice, its order and the weights are those of route_token_fast, the
// same bytes.
// Why (docs/perf.md, sm90 step 32): at GLM-5 T=1 the sm90 prologue's routing took 5 us on one warp; here the
// eight slices' picks run on eight warps at once, and only the candidates' eight picks follow (T=1 forward
// -1 us). ncu attributed most of the routing warps' stalls to instruction fetch (cold code, run once per
// launch), so the loops stay rolled and short; the logits and bias are first staged in shared memory by the
// whole block (two 16-byte loads in flight per thread).
__device__ inline void route_two_level(const RouteFront& f, const FrontScratch& s) {
  using namespace route_detail;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5, nthreads = blockDim.x;
  const int E = f.rp.experts, K = f.rp.topk, T = f.tokens, slices = E >> 5, used = slices * K;
  // Stage the T x E logits (then the E biases, or zeros) in shared memory: 16-byte vectors, two per step.
  {
    const int nl = T * E / 4, nb = E / 4, n = nl + nb;
    const float4* gl = reinterpret_cast<const float4*>(f.logits);
    const float4* gb = reinterpret_cast<const float4*>(f.bias);
    float4* st = reinterpret_cast<float4*>(s.staged);  // [T * E] logits, then [E] biases
#pragma unroll 1
    for (int i = tid; i < n; i += 2 * nthreads) {
      const int j = i + nthreads;
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 a = i < nl ? gl[i] : (gb ? gb[i - nl] : zero);
      const float4 b = j >= n ? zero : j < nl ? gl[j] : (gb ? gb[j - nl] : zero);
      st[i] = a;
      if (j < n) st[j] = b;
    }
  }
#pragma unroll 1
  for (int i = tid; i < T * kFrontCandsPerToken; i += nthreads)
    if ((i & (kFrontCandsPerToken - 1)) >= used) s.cand_key[i] = 0u;  // never a candidate
  __syncthreads();
  const float* s_bias = s.staged + T * E;
  int t = 0, sl = warp;  // task (t, sl) = warp, warp + nwarps, ... in token-major order
  while (sl >= slices) {
    sl -= slices;
    ++t;
  }
#pragma unroll 1
  for (; t < T;) {
    const int e = sl * 32 + lane;
    const float value = sigmoid_value(s.staged[t * E + e]);
    uint32_t key = order_key(value + s_bias[e]);
    const int base = t * kFrontCandsPerToken + sl * K;
#pragma unroll 1
    for (int r = 0; r < K; ++r) {
      const uint32_t top = __reduce_max_sync(0xffffffffu, key);
      if (lane == __ffs(__ballot_sync(0xffffffffu, key == top)) - 1) {
        s.cand_key[base + r] = top;
        s.cand_idx[base + r] = e;
        s.cand_val[base + r] = value;
        key = 0u;
      }
    }
    sl += nwarps;
    while (sl >= slices) {
      sl -= slices;
      ++t;
    }
  }
  __syncthreads();
  for (int t = warp; t < T; t += nwarps) {
    const int c = t * kFrontCandsPerToken + 2 * lane;
    uint32_t k0 = s.cand_key[c], k1 = s.cand_key[c + 1];
    const int i0 = s.cand_idx[c], i1 = s.cand_idx[c + 1];
    const float v0 = s.cand_val[c], v1 = s.cand_val[c + 1];
    float my_w = 0.0f;  // lane r keeps the weight source of rank r
#pragma unroll 1
    for (int r = 0; r < K; ++r) {
      const bool second = k1 > k0;  // equal keys: the first slot (the lower index)
      const uint32_t best = second ? k1 : k0;
      const uint32_t top = __reduce_max_sync(0xffffffffu, best);
      const int winner = __ffs(__ballot_sync(0xffffffffu, best == top)) - 1;
      const int idx = __shfl_sync(0xffffffffu, second ? i1 : i0, winner);
      const float v = __shfl_sync(0xffffffffu, second ? v1 : v0, winner);
      if (lane == r) my_w = v;
      if (lane == 0) s.id[t * K + r] = idx;
      if (lane == winner) {
        if (second)
          k1 = 0u;
        else
          k0 = 0u;
      }
    }
    store_pick_weights<true>(my_w, f.rp, lane, s.w + t * K);
  }
}

// Whether the register routing and the block's arrays take this batch.
inline bool front_block_fits(const route_detail::RouteParams& rp, bool sigmoid, int64_t tokens,
                             int64_t pexperts) {
  return tokens >= 1 && route_detail::fast_route_ok(rp, sigmoid) && tokens * rp.topk <= kFrontMaxPairs &&
         pexperts >= 1 && pexperts <= kFrontMaxExperts;
}

// Every thread of the block calls it, after any wait for the kernels that wrote the logits; it returns
// after a __syncthreads with s.off and s.src complete. write: also store ids, weights, offsets, gather and
// pair_pos (one block of the launch).
// Marks the steps of front_route_permute for a caller's timeline (every thread calls it with the step:
// 0 routed, 1 past the routing's barrier, 2 offsets complete); the default records nothing.
struct FrontNoMark {
  __device__ void operator()(int) const {}
};

template <bool kSigmoid, int PMAX, class Mark = FrontNoMark>
__device__ void front_route_permute(const RouteFront& f, const FrontScratch& s, bool write, Mark mark = Mark()) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nthreads = blockDim.x, nwarps = nthreads >> 5;
  const int K = f.rp.topk, P = f.tokens * K, E2 = f.pexperts;
#pragma unroll 1
  for (int e = tid; e <= E2 + 1; e += nthreads) s.off[e] = 0;
  if (kSigmoid && s.cand_key != nullptr && front_two_level_ok(f.rp, true, f.tokens, nwarps) &&
      (reinterpret_cast<uintptr_t>(f.logits) & 15) == 0 && (reinterpret_cast<uintptr_t>(f.bias) & 15) == 0)
    route_two_level(f, s);
  else
    for (int t = warp; t < f.tokens; t += nwarps)
      route_detail::route_token_fast<kSigmoid, PMAX>(f.logits + static_cast<int64_t>(t) * f.rp.experts, f.bias,
                                                     f.rp, lane, s.id + t * K, s.w + t * K);
  mark(0);
  __syncthreads();
  mark(1);
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
#pragma unroll 1
  for (int j = 0; j < per; ++j) {
    const int e = tid * per + j;
    if (e < E2) sum += s.off[e];
  }
  const int incl = warp_inclusive_sum(sum, lane);
  if (lane == 31) s.warp_sums[warp] = incl;
  __syncthreads();
  int base = incl - sum;
#pragma unroll 1
  for (int w = 0; w < warp; ++w) base += s.warp_sums[w];
#pragma unroll 1
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
  mark(2);
  // Stable rows: pair i goes after the earlier pairs of its expert.
  if (tid < P) {
    int rank = 0;
#pragma unroll 4
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
  if (f.append) {
#pragma unroll 1
    for (int t = tid; t < f.tokens; t += nthreads) {
      s.src[P + t] = t;
      if (write) f.gather[P + t] = t;
    }
  }
  if (write) {
#pragma unroll 1
    for (int e = tid; e <= E2; e += nthreads) f.offsets[e] = s.off[e];
    if (f.append && tid == 0) f.offsets[E2 + 1] = P + f.tokens;
  }
  __syncthreads();
}

}  // namespace fp4moe
