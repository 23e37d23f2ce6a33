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
// itself, in shared memory (common/front_block.cuh; block 0 alone writes ids, weights, offsets, gather and
// pair_pos). Then all blocks copy the kept grouped rows y[r] = x[token of r], kCopyBatch 16-byte vectors
// per thread with their loads in flight together, which is what needs the grid (one block per 1024
// vectors: 6 blocks for one GLM-5 token's 8 rows). The redundant routing costs each block one read of
// the T x E logits (L2) and a few hundred cycles, less than a kernel boundary.
// The outputs are the same bytes as the separate launches' (routing_gpu_test compares them). With y null
// the launch is one block that routes and writes the maps, no copy (the resident tactic reads its token rows
// through gather with one bulk copy a row either way).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "common/front_block.cuh"
#include "common/pdl_launch.h"
#include "engine/cuda_check.h"
#include "engine/engine_kernels.h"

namespace fp4moe::engine {

namespace {

using route_detail::route_params;

constexpr int kFrontThreads = 256;
constexpr int kCopyBatch = 4;  // 16-byte loads in flight per thread

struct FrontParams {
  RouteFront f;                // routing, permutation, the maps block 0 writes
  const uint4* x = nullptr;    // token rows, x_ld vectors apart
  int64_t x_ld = 0;
  uint4* y = nullptr;          // grouped rows, vecs vectors apart
  int vecs = 0;                // 16-byte vectors per row (H / 8)
};

template <bool kSigmoid, int PMAX>
__global__ void __launch_bounds__(kFrontThreads) front_small_kernel(const __grid_constant__ FrontParams p) {
  __shared__ int32_t s_id[kFrontMaxPairs];
  __shared__ float s_w[kFrontMaxPairs];
  __shared__ int32_t s_loc[kFrontMaxPairs];
  __shared__ int32_t s_src[kFrontMaxRows];
  __shared__ int32_t s_off[kFrontMaxExperts + 2];
  __shared__ int32_t s_warp[kFrontThreads / 32];
  __shared__ __align__(16) uint32_t s_cand_key[kSigmoid ? kFrontMaxCands : 1];  // the two-level routing's candidates
  __shared__ int32_t s_cand_idx[kSigmoid ? kFrontMaxCands : 1];
  __shared__ float s_cand_val[kSigmoid ? kFrontMaxCands : 1];
  __shared__ float4 s_staged[kSigmoid ? kFrontMaxStaged / 4 : 1];
  const int tid = threadIdx.x;
  pdl_wait();  // the logits (and x) may come from the previous kernel of the stream
  front_route_permute<kSigmoid, PMAX>(
      p.f,
      FrontScratch{s_id, s_w, s_loc, s_src, s_off, s_warp, kSigmoid ? s_cand_key : nullptr, s_cand_idx, s_cand_val,
                   reinterpret_cast<float*>(s_staged)},
      blockIdx.x == 0);
  // The gathered copy of the kept rows (with expert parallelism the dropped bucket's rows are not copied)
  // and of the appended ones.
  if (p.y == nullptr) return;  // no copy: FC1 reads the rows through gather
  const int P = p.f.tokens * p.f.rp.topk;
  const int kept = p.f.local ? s_off[p.f.count] : P + (p.f.append ? p.f.tokens : 0);
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
  return front_block_fits(route_params(cfg), cfg.routing == RoutingKind::kSigmoidGrouped, tokens, permute_experts);
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
  if (y != nullptr && (H % 8 != 0 || ld % 8 != 0 || ld < H || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
                       reinterpret_cast<uintptr_t>(y) % 16 != 0))
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("front_small: rows of {} bf16 (leading dimension {}) are not 16-byte vectors", H, ld));
  FrontParams p;
  RouteFront& f = p.f;
  f.logits = logits;
  f.bias = cfg.routing == RoutingKind::kSigmoidGrouped ? bias : nullptr;
  f.rp = route_params(cfg);
  f.sigmoid = cfg.routing == RoutingKind::kSigmoidGrouped ? 1 : 0;
  f.tokens = static_cast<int>(tokens);
  f.local = local ? 1 : 0;
  f.first = static_cast<int>(shard.first);
  f.count = static_cast<int>(shard.count);
  f.pexperts = static_cast<int>(pexperts);
  f.append = append_tokens ? 1 : 0;
  f.ids = ids;
  f.weights = weights;
  f.offsets = b.offsets;
  f.gather = b.gather;
  f.pair_pos = b.pair_pos;
  p.x = reinterpret_cast<const uint4*>(x);
  p.x_ld = ld / 8;
  p.y = reinterpret_cast<uint4*>(y);
  p.vecs = static_cast<int>(H / 8);
  // Each thread copies kCopyBatch vectors (its loads in flight together): few blocks, each a short stay.
  const int64_t vecs_total = y == nullptr ? 0 : (tokens * cfg.topk + (append_tokens ? tokens : 0)) * p.vecs;
  const unsigned blocks = static_cast<unsigned>(
      std::max<int64_t>(1, (vecs_total + kFrontThreads * kCopyBatch - 1) / (kFrontThreads * kCopyBatch)));
  const bool narrow = f.rp.experts <= 32 * 8;
  auto* fn = f.sigmoid ? (narrow ? &front_small_kernel<true, 8> : &front_small_kernel<true, 16>)
                       : (narrow ? &front_small_kernel<false, 8> : &front_small_kernel<false, 16>);
  const cudaError_t err = launch_pdl(fn, dim3(blocks), dim3(kFrontThreads), 0, stream, p);
  if (err != cudaSuccess) return cuda_status(err, "front_small_kernel launch", __FILE__, __LINE__);
  return Status::ok();
}

}  // namespace fp4moe::engine
