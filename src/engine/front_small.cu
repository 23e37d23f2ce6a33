// The small-batch front end: routing, the permutation and the gathered copy of the token rows in one
// launch, for decode batches of at most 64 (token, expert) pairs. The separate kernels
// (route_fast_kernel, permute_small_kernel, gather_rows_kernel) are each one short, latency-bound launch
// (at GLM-5 T = 1 on the H200, under ncu, 6.0 + 3.8 + 3.4 us; docs/perf.md "Timeline of a T=1 forward").
// In the replayed forward the fused launch measured about 1 us faster on the TP8 shard at T = 1 and 2
// and at GLM-5 T = 1 with the two-CTA tile, but 1.3 us slower at GLM-5 T = 1 with the four-consumer tile
// (two calls), and the same at T = 8: the front is not what bounds the decode forward (docs/perf.md, sm90
// step 28). With up to 256 pairs it was slower at T = 32 (each block routes every token and ranks every
// pair), hence the limit.
//
// front_small_kernel: every block of the grid (256 threads) first does the whole routing and permutation
// itself, in shared memory: one warp per token runs the register routing (route_fast.cuh) into s_id /
// s_w; thread i < P = T*topk maps pair i to its local expert (expert parallelism: the dropped bucket
// `count` for another rank's expert, as launch_local_expert_ids), counts it with a shared atomic, and
// after a block-wide exclusive scan of the counts takes row = offsets[e] + (pairs j < i of the same
// expert), the stable grouping of launch_permute. Block 0 alone writes ids, weights, offsets, gather and
// pair_pos. Then all blocks copy the kept grouped rows y[r] = x[token of r], kCopyBatch 16-byte vectors
// per thread with their loads in flight together, which is what needs the grid (one block per 1024
// vectors: 6 blocks for one GLM-5 token's 8 rows). The redundant routing costs each block one read of
// the T x E logits (L2) and a few hundred cycles, less than a kernel boundary.
// The outputs are the same bytes as the separate launches' (routing_gpu_test compares them).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "common/pdl_launch.h"
#include "common/warp_scan.cuh"
#include "engine/cuda_check.h"
#include "engine/engine_kernels.h"
#include "engine/route_fast.cuh"

namespace fp4moe::engine {

namespace {

using namespace route_detail;

constexpr int kFrontThreads = 256;
constexpr int kFrontMaxPairs = 64;                                 // decode: T * topk
constexpr int kFrontMaxExperts = 32 * kFastMaxPerLane + 1;         // routed experts + the dropped bucket
constexpr int kFrontPerThread = (kFrontMaxExperts + kFrontThreads - 1) / kFrontThreads;  // scan entries
constexpr int kCopyBatch = 4;                                      // 16-byte loads in flight per thread

struct FrontParams {
  const float* logits = nullptr;  // [T, E]
  const float* bias = nullptr;    // [E] or null
  RouteParams rp;
  int tokens = 0;
  int local = 0;                  // expert parallelism: map global ids into [first, first + count) or `count`
  int first = 0, count = 0;
  int pexperts = 0;               // experts the permutation groups into (E, or count + 1)
  int32_t* ids = nullptr;         // [T, topk] global ids
  float* weights = nullptr;       // [T, topk]
  int32_t* offsets = nullptr;     // [pexperts + 1]
  int32_t* gather = nullptr;      // [P]
  int32_t* pair_pos = nullptr;    // [P]
  const uint4* x = nullptr;       // token rows, x_ld vectors apart
  int64_t x_ld = 0;
  uint4* y = nullptr;             // grouped rows, vecs vectors apart
  int vecs = 0;                   // 16-byte vectors per row (H / 8)
  int append = 0;                 // every token also as a row of one more expert (launch_front_small)
};

template <bool kSigmoid, int PMAX>
__global__ void __launch_bounds__(kFrontThreads) front_small_kernel(const __grid_constant__ FrontParams p) {
  __shared__ int32_t s_id[kFrontMaxPairs];     // global expert of pair i
  __shared__ float s_w[kFrontMaxPairs];        // its weight
  __shared__ int32_t s_loc[kFrontMaxPairs];    // its expert in the permutation
  __shared__ int32_t s_src[2 * kFrontMaxPairs];  // token of grouped row r (and of the appended rows)
  __shared__ int32_t s_off[kFrontMaxExperts + 1];
  __shared__ int32_t s_warp[kFrontThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int K = p.rp.topk, P = p.tokens * K, E2 = p.pexperts;
  for (int e = tid; e <= E2; e += kFrontThreads) s_off[e] = 0;
  pdl_wait();  // the logits (and x) may come from the previous kernel of the stream
  for (int t = warp; t < p.tokens; t += kFrontThreads / 32)
    route_token_fast<kSigmoid, PMAX>(p.logits + static_cast<int64_t>(t) * p.rp.experts, p.bias, p.rp, lane, s_id + t * K,
                                     s_w + t * K);
  __syncthreads();
  // Local expert and histogram.
  int mine = 0;
  if (tid < P) {
    mine = s_id[tid];
    if (p.local) {
      const unsigned l = static_cast<unsigned>(mine - p.first);  // below `first` wraps to large
      mine = l < static_cast<unsigned>(p.count) ? static_cast<int>(l) : p.count;
    }
    s_loc[tid] = mine;
    atomicAdd(&s_off[mine], 1);
  }
  __syncthreads();
  // Exclusive scan of the counts: thread tid owns entries tid * kFrontPerThread + j.
  int c[kFrontPerThread];
  int sum = 0;
#pragma unroll
  for (int j = 0; j < kFrontPerThread; ++j) {
    const int e = tid * kFrontPerThread + j;
    c[j] = e < E2 ? s_off[e] : 0;
    sum += c[j];
  }
  const int incl = warp_inclusive_sum(sum, lane);
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();  // also: every count is read before the bases overwrite them
  int base = incl - sum;
  for (int w = 0; w < warp; ++w) base += s_warp[w];
#pragma unroll
  for (int j = 0; j < kFrontPerThread; ++j) {
    const int e = tid * kFrontPerThread + j;
    if (e < E2) s_off[e] = base;
    base += c[j];
  }
  if (tid == 0) s_off[E2] = P;
  __syncthreads();
  // Stable rows: pair i goes after the earlier pairs of its expert.
  if (tid < P) {
    int rank = 0;
#pragma unroll 8
    for (int j = 0; j < tid; ++j) rank += s_loc[j] == mine ? 1 : 0;
    const int row = s_off[mine] + rank;
    s_src[row] = tid / K;
    if (blockIdx.x == 0) {
      p.gather[row] = tid / K;
      p.pair_pos[tid] = row;
      p.ids[tid] = s_id[tid];
      p.weights[tid] = s_w[tid];
    }
  }
  if (blockIdx.x == 0) {
    for (int e = tid; e <= E2; e += kFrontThreads) p.offsets[e] = s_off[e];
    if (p.append && tid == 0) p.offsets[E2 + 1] = P + p.tokens;
  }
  if (p.append)
    for (int t = tid; t < p.tokens; t += kFrontThreads) s_src[P + t] = t;
  __syncthreads();
  // The gathered copy of the kept rows (with expert parallelism the dropped bucket's rows are not copied)
  // and of the appended ones.
  const int kept = p.local ? s_off[p.count] : P + (p.append ? p.tokens : 0);
  const int total = kept * p.vecs, stride = gridDim.x * kFrontThreads;
  for (int i0 = blockIdx.x * kFrontThreads + tid; i0 < total; i0 += kCopyBatch * stride) {
    uint4 v[kCopyBatch];
#pragma unroll
    for (int b = 0; b < kCopyBatch; ++b) {
      const int i = i0 + b * stride;
      if (i < total) {
        const int r = i / p.vecs;
        v[b] = __ldg(p.x + s_src[r] * p.x_ld + (i - r * p.vecs));
      }
    }
#pragma unroll
    for (int b = 0; b < kCopyBatch; ++b) {
      const int i = i0 + b * stride;
      if (i < total) p.y[i] = v[b];  // row r at r * vecs: i itself
    }
  }
}

}  // namespace

bool front_small_supported(const MoeConfig& cfg, int64_t tokens, int64_t permute_experts) {
  const RouteParams rp = route_params(cfg);
  const bool sigmoid = cfg.routing == RoutingKind::kSigmoidGrouped;
  return tokens >= 1 && fast_route_ok(rp, sigmoid) && tokens * rp.topk <= kFrontMaxPairs && permute_experts >= 1 &&
         permute_experts <= kFrontMaxExperts;
}

Status launch_front_small(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg,
                          const FrontShard& shard, const uint16_t* x, int64_t ld, int32_t* ids, float* weights,
                          const PermuteBuffers& b, uint16_t* y, Stream stream, bool append_tokens) {
  const int64_t E = cfg.num_experts, H = cfg.hidden;
  const bool local = !(shard.first == 0 && shard.count == E);
  if (append_tokens && local)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("front_small: the appended token rows (one more expert) need the whole layer, not the "
                              "expert shard [{}, {})",
                              shard.first, shard.first + shard.count));
  if (shard.first < 0 || shard.count < 1 || shard.first + shard.count > E)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("front_small: expert shard [{}, {}) is not inside the {} experts", shard.first,
                              shard.first + shard.count, E));
  const int64_t pexperts = local ? shard.count + 1 : E;
  if (!front_small_supported(cfg, tokens, pexperts))
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("front_small: {} tokens x top-{} over {} experts ({} routing) is outside the fused "
                              "path (at most {} pairs, the register routing's shapes)",
                              tokens, cfg.topk, E, routing_kind_name(cfg.routing), kFrontMaxPairs));
  if (H % 8 != 0 || ld % 8 != 0 || ld < H || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(y) % 16 != 0)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("front_small: rows of {} bf16 (leading dimension {}) are not 16-byte vectors", H, ld));
  FrontParams p;
  p.logits = logits;
  p.bias = bias;
  p.rp = route_params(cfg);
  p.tokens = static_cast<int>(tokens);
  p.local = local ? 1 : 0;
  p.first = static_cast<int>(shard.first);
  p.count = static_cast<int>(shard.count);
  p.pexperts = static_cast<int>(pexperts);
  p.ids = ids;
  p.weights = weights;
  p.offsets = b.offsets;
  p.gather = b.gather;
  p.pair_pos = b.pair_pos;
  p.x = reinterpret_cast<const uint4*>(x);
  p.x_ld = ld / 8;
  p.y = reinterpret_cast<uint4*>(y);
  p.vecs = static_cast<int>(H / 8);
  p.append = append_tokens ? 1 : 0;
  // Each thread copies kCopyBatch vectors (its loads in flight together): few blocks, each a short stay.
  const int64_t vecs_total = (tokens * cfg.topk + (append_tokens ? tokens : 0)) * p.vecs;
  const unsigned blocks = static_cast<unsigned>(
      std::max<int64_t>(1, (vecs_total + kFrontThreads * kCopyBatch - 1) / (kFrontThreads * kCopyBatch)));
  const bool sigmoid = cfg.routing == RoutingKind::kSigmoidGrouped;
  const bool narrow = p.rp.experts <= 32 * 8;
  auto* fn = sigmoid ? (narrow ? &front_small_kernel<true, 8> : &front_small_kernel<true, 16>)
                     : (narrow ? &front_small_kernel<false, 8> : &front_small_kernel<false, 16>);
  if (!sigmoid) p.bias = nullptr;
  const cudaError_t err = launch_pdl(fn, dim3(blocks), dim3(kFrontThreads), 0, stream, p);
  if (err != cudaSuccess) return cuda_status(err, "front_small_kernel launch", __FILE__, __LINE__);
  return Status::ok();
}

}  // namespace fp4moe::engine
