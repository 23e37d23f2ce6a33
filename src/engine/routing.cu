// Routing kernels: router logits (R2) and the two top-k families, one warp per token.
//
// route_kernel: a block of 4 warps handles 4 tokens. Shared memory per warp (floats):
//   [0, E)                 score used for selection (softmax p, or sigmoid s + bias); -inf once taken
//                          or masked out by group selection
//   [E, 2E)                value used for the weight (softmax p, or unbiased sigmoid s)
//   [2E, 2E + n_group)     group scores (sigmoid routing)
//   [2E + n_group, + topk) the selected raw weights, in rank order
// Selection is a warp arg-max repeated topk times; the comparison (larger score, then lower index) is a
// total order, so the butterfly reduction gives every lane the same winner and the result is exactly
// the reference's partial_sort order. Weights are normalised with the reference's operation order
// (a sequential sum in rank order, then divide, then the routed scaling factor).
//
// route_fast_kernel: the register fast path (route_fast.cuh, which says when it applies), one warp per
// token.
//
// router_logits_kernel: large batches (T > kRowsMaxTokens), and any batch whose H or pointers the rows
// kernel cannot take (below). A tile of 64 tokens x 64 experts per 256-thread block, 4 x 4 logits a
// thread, the reduction in double-buffered k16 slices through shared memory. Its grid is T/64 x E/64 blocks, so a decode batch would run on four SMs (the previous tiled
// kernel did, and took about half a millisecond at T = 1: docs/perf.md, "Router logits").
//
// router_logits_rows_kernel: small batches (T <= kRowsMaxTokens). A block of 128 threads takes two
// experts and NT <= 8 tokens of the batch (blockIdx.y: the token group); thread i reads float4 i, i + 128,
// ... of each expert's weight row (16-byte loads, four steps in flight) and the same four columns of its
// tokens (8-byte loads of bf16), keeping 2 x NT fp32 sums; the block then adds its threads' sums in a
// fixed order (warp butterfly, then the four warps in order), so the result does not depend on timing.
// The weight (E x H x 4 bytes: 6.3 MB for GLM-5) is read once per token group by E / 2 blocks (128 for
// E = 256), so the read is spread over the whole GPU instead of four SMs. Needs H % 4 == 0, x 8-byte and
// the router weight 16-byte aligned (else the tiled kernel).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>

#include "common/bf16x8.cuh"
#include "common/pdl_launch.h"
#include "engine/cuda_check.h"
#include "engine/engine_kernels.h"
#include "common/route_fast.cuh"
#include "fp4moe/dtype.h"

namespace fp4moe::engine {

namespace {

using namespace route_detail;

constexpr int kRouteWarps = 4;

// Better = larger value, then lower index.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// Picks the `count` best entries of score[0, n) (ties: lower index), setting each to -inf once taken;
// calls take(rank, index) on every lane for each pick.
template <typename Take>
__device__ void warp_topk(float* score, int n, int count, Take take) {
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < count; ++j) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = lane; e < n; e += 32)
      if (better(score[e], e, bv, bi)) {
        bv = score[e];
        bi = e;
      }
    warp_argmax(bv, bi);
    take(j, bi);
    __syncwarp();
    if (lane == (bi & 31)) score[bi] = -INFINITY;
    __syncwarp();
  }
}

template <bool kSigmoid>
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int tokens, RouteParams rp,
                 int32_t* __restrict__ ids, float* __restrict__ weights) {
  extern __shared__ float route_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= tokens) return;  // whole warp
  const int E = rp.experts, K = rp.topk;
  float* score = route_smem + warp * (2 * E + rp.n_group + K);
  float* value = score + E;
  float* gscore = value + E;
  float* wsel = gscore + rp.n_group;
  const float* l = logits + static_cast<int64_t>(t) * E;

  if constexpr (!kSigmoid) {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
      const float x = expf(l[e] - m);
      value[e] = x;
      sum += x;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) {
      const float p = value[e] / sum;
      value[e] = p;
      score[e] = p;
    }
    __syncwarp();
  } else {
    for (int e = lane; e < E; e += 32) {
      const float s = 1.0f / (1.0f + expf(-l[e]));
      value[e] = s;
      score[e] = s + (bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    // Group scores: top1 + top2 of the choice scores (top1 alone for groups of one).
    const int G = E / rp.n_group;
    for (int gi = lane; gi < rp.n_group; gi += 32) {
      const float* c = score + gi * G;
      float top1 = -INFINITY, top2 = -INFINITY;
      for (int j = 0; j < G; ++j) {
        if (c[j] > top1) {
          top2 = top1;
          top1 = c[j];
        } else if (c[j] > top2) {
          top2 = c[j];
        }
      }
      gscore[gi] = G == 1 ? top1 : top1 + top2;
    }
    __syncwarp();
    // Keep the topk_group best groups: taken groups are marked -inf, the rest masked out afterwards.
    warp_topk(gscore, rp.n_group, rp.topk_group, [](int, int) {});
    for (int e = lane; e < E; e += 32)
      if (gscore[e / G] != -INFINITY) score[e] = -INFINITY;
    __syncwarp();
  }

  warp_topk(score, E, K, [&](int j, int idx) {
    if (lane == 0) {
      ids[static_cast<int64_t>(t) * K + j] = idx;
      wsel[j] = value[idx];
    }
  });
  __syncwarp();
  // Normalise exactly like the reference: sequential sum in rank order (every lane computes it).
  float wsum = 0.0f;
  for (int j = 0; j < K; ++j) wsum = __fadd_rn(wsum, wsel[j]);
  const float denom = kSigmoid ? __fadd_rn(wsum, 1e-20f) : wsum;
  for (int j = lane; j < K; j += 32) {
    float w = wsel[j];
    if (rp.norm) w = __fdiv_rn(w, denom);
    weights[static_cast<int64_t>(t) * K + j] = __fmul_rn(w, rp.scale);
  }
}

template <bool kSigmoid, int PMAX>
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_fast_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int tokens, RouteParams rp,
                      int32_t* __restrict__ ids, float* __restrict__ weights) {
  pdl_wait();  // for programmatic dependent launch (common/pdl_launch.h); no early trigger
  const int t = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  if (t >= tokens) return;  // whole warp
  const int64_t first = static_cast<int64_t>(t) * rp.topk;
  route_token_fast<kSigmoid, PMAX>(logits + static_cast<int64_t>(t) * rp.experts, bias, rp, threadIdx.x & 31,
                                   ids + first, weights + first);
}

template <bool kSigmoid>
cudaError_t launch_route_fast(const float* logits, const float* bias, int tokens, const RouteParams& rp, int32_t* ids,
                              float* weights, unsigned blocks, cudaStream_t stream) {
  auto* fn = rp.experts <= 32 * 8 ? &route_fast_kernel<kSigmoid, 8> : &route_fast_kernel<kSigmoid, 16>;
  return launch_pdl(fn, dim3(blocks), dim3(kRouteWarps * 32), 0, stream, logits, bias, tokens, rp, ids, weights);
}

constexpr int kLogitTokens = 64, kLogitExperts = 64, kLogitK = 16, kLogitThreads = 256;

// One k16 slice of the tile's inputs, loaded into registers (the next slice's loads are in flight while
// the current one is multiplied): thread i takes four consecutive k of token i / 4 and of expert i / 4
// (k offset 4 (i % 4)). kVec: one 8-byte load of x and one 16-byte load of w (H % 4 == 0, x 8-byte and w
// 16-byte aligned); else element by element. Past the batch, the experts or H: zeros.
template <bool kVec>
__device__ __forceinline__ void logit_tile_load(const uint16_t* __restrict__ x, const float* __restrict__ w,
                                                int tokens, int hidden, int experts, int t0, int e0, int k0,
                                                float (&xr)[4], float (&wr)[4]) {
  const int r = threadIdx.x / 4, k = k0 + 4 * (threadIdx.x % 4);
  const int t = t0 + r, e = e0 + r;
  if (kVec && k + 3 < hidden) {
    if (t < tokens) {
      bf16x4_to_f32(__ldg(reinterpret_cast<const uint2*>(x + static_cast<int64_t>(t) * hidden + k)), xr);
    } else {
      xr[0] = xr[1] = xr[2] = xr[3] = 0.0f;
    }
    if (e < experts) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(w + static_cast<int64_t>(e) * hidden + k));
      wr[0] = v.x, wr[1] = v.y, wr[2] = v.z, wr[3] = v.w;
    } else {
      wr[0] = wr[1] = wr[2] = wr[3] = 0.0f;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bool in_k = k + j < hidden;
    xr[j] = t < tokens && in_k ? bf16_bits_to_f32(x[static_cast<int64_t>(t) * hidden + k + j]) : 0.0f;
    wr[j] = e < experts && in_k ? w[static_cast<int64_t>(e) * hidden + k + j] : 0.0f;
  }
}

// Large batches: a tile of 64 tokens x 64 experts per 256-thread block, each thread 4 tokens x 4 experts
// in registers; the reduction in slices of 16 through shared memory, stored k-major so that each thread
// reads its 4 tokens and its 4 experts of a k as two 16-byte loads (16 fused multiply-adds per pair of
// loads), the next slice's global loads issued before the current slice's products. Each logit is one
// fp32 chain of fused multiply-adds in k order.
template <bool kVec>
__global__ void __launch_bounds__(kLogitThreads)
    router_logits_kernel(const uint16_t* __restrict__ x, const float* __restrict__ w, int tokens, int hidden,
                         int experts, float* __restrict__ logits) {
  __shared__ __align__(16) float xs[2][kLogitK][kLogitTokens];
  __shared__ __align__(16) float ws[2][kLogitK][kLogitExperts];
  const int tid = threadIdx.x;
  const int t0 = blockIdx.x * kLogitTokens, e0 = blockIdx.y * kLogitExperts;
  const int ty = tid / 16, tx = tid % 16;  // tokens 4 ty .. 4 ty + 3, experts 4 tx .. 4 tx + 3
  const int lr = tid / 4, lk = 4 * (tid % 4);  // where this thread's loads go
  float acc[4][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) acc[a][b] = 0.0f;
  float xr[4], wr[4];
  logit_tile_load<kVec>(x, w, tokens, hidden, experts, t0, e0, 0, xr, wr);
  int buf = 0;
  for (int k0 = 0; k0 < hidden; k0 += kLogitK) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      xs[buf][lk + j][lr] = xr[j];
      ws[buf][lk + j][lr] = wr[j];
    }
    __syncthreads();  // one barrier a slice: the other buffer's readers finished before this one's stores
    if (k0 + kLogitK < hidden) logit_tile_load<kVec>(x, w, tokens, hidden, experts, t0, e0, k0 + kLogitK, xr, wr);
#pragma unroll
    for (int k = 0; k < kLogitK; ++k) {
      const float4 xv = *reinterpret_cast<const float4*>(&xs[buf][k][4 * ty]);
      const float4 wv = *reinterpret_cast<const float4*>(&ws[buf][k][4 * tx]);
      const float xa[4] = {xv.x, xv.y, xv.z, xv.w}, wa[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(xa[a], wa[b], acc[a][b]);
    }
    buf ^= 1;
  }
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int t = t0 + 4 * ty + a;
    if (t >= tokens) continue;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int e = e0 + 4 * tx + b;
      if (e < experts) logits[static_cast<int64_t>(t) * experts + e] = acc[a][b];
    }
  }
}

constexpr int kRowsThreads = 128, kRowsExperts = 2, kRowsTokens = 8;
// T <= kRowsMaxTokens: the rows kernel; above it, the tiled one (measured on the H200: rows 0.16 ms faster
// at T = 1024, the two alike at 2048, the tiled one 1 ms faster at 8192; docs/perf.md, "Router logits").
// The two sum in different orders, so a token's logits are the same bits in every batch of up to
// kRowsMaxTokens tokens, not across that bound.
constexpr int64_t kRowsMaxTokens = 1024;

template <int NT>
__global__ void __launch_bounds__(kRowsThreads)
    router_logits_rows_kernel(const uint16_t* __restrict__ x, const float* __restrict__ w, int tokens, int hidden,
                              int experts, float* __restrict__ logits) {
  __shared__ float part[kRowsThreads / 32][kRowsExperts * NT];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int e0 = blockIdx.x * kRowsExperts, t0 = blockIdx.y * kRowsTokens;
  const int nt = min(NT, tokens - t0);
  const int quads = hidden / 4;
  const float4* wrow[kRowsExperts];
#pragma unroll
  for (int j = 0; j < kRowsExperts; ++j)
    wrow[j] = reinterpret_cast<const float4*>(w + static_cast<int64_t>(min(e0 + j, experts - 1)) * hidden);
  const uint2* xrow = reinterpret_cast<const uint2*>(x + static_cast<int64_t>(t0) * hidden);
  const int xstride = quads;  // uint2 (4 bf16) per token row
  float acc[kRowsExperts][NT];
#pragma unroll
  for (int j = 0; j < kRowsExperts; ++j)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[j][t] = 0.0f;
#pragma unroll 4
  for (int i = tid; i < quads; i += kRowsThreads) {
    float4 wv[kRowsExperts];
#pragma unroll
    for (int j = 0; j < kRowsExperts; ++j) wv[j] = __ldg(wrow[j] + i);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        float xf[4];
        bf16x4_to_f32(__ldg(xrow + static_cast<int64_t>(t) * xstride + i), xf);
#pragma unroll
        for (int j = 0; j < kRowsExperts; ++j)
          acc[j][t] = fmaf(xf[3], wv[j].w, fmaf(xf[2], wv[j].z, fmaf(xf[1], wv[j].y, fmaf(xf[0], wv[j].x, acc[j][t]))));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRowsExperts; ++j)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float v = acc[j][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][j * NT + t] = v;
    }
  __syncthreads();
  if (tid < kRowsExperts * NT) {
    const int j = tid / NT, t = tid % NT, e = e0 + j;
    float v = part[0][tid];
#pragma unroll
    for (int q = 1; q < kRowsThreads / 32; ++q) v += part[q][tid];
    if (t < nt && e < experts) logits[static_cast<int64_t>(t0 + t) * experts + e] = v;
  }
}

size_t route_smem_bytes(const RouteParams& rp) {
  return sizeof(float) * kRouteWarps * static_cast<size_t>(2 * rp.experts + rp.n_group + rp.topk);
}

}  // namespace

Status prepare_routing_kernels(const MoeConfig& cfg) {
  const size_t smem = route_smem_bytes(route_params(cfg));
  if (smem > 48 * 1024) {  // very wide routers: opt in once, outside any forward (graph capture)
    FP4MOE_CUDA_RETURN(cudaFuncSetAttribute(route_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
    FP4MOE_CUDA_RETURN(cudaFuncSetAttribute(route_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  }
  return Status::ok();
}

Status launch_router_logits(const uint16_t* x, const float* router_weight, int64_t tokens, int64_t hidden,
                            int64_t experts, float* logits, Stream stream) {
  if (tokens == 0) return Status::ok();
  if (tokens < 0 || hidden <= 0 || experts <= 0 || tokens > INT32_MAX || hidden > INT32_MAX || experts > INT32_MAX)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("router logits: T = {}, H = {}, E = {}: each must be positive and below 2^31", tokens,
                              hidden, experts));
  // Both kernels' vector loads: 8 bytes of x (4 bf16), 16 of the router weight (4 floats).
  const bool vec = hidden % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 7u) == 0 &&
                   (reinterpret_cast<uintptr_t>(router_weight) & 15u) == 0;
  if (tokens <= kRowsMaxTokens && vec) {
    const dim3 grid(static_cast<unsigned>((experts + kRowsExperts - 1) / kRowsExperts),
                    static_cast<unsigned>((tokens + kRowsTokens - 1) / kRowsTokens));
    // Tokens per group: the batch's own count below eight, so a decode step keeps no unused sums.
    auto* fn = tokens > 4   ? &router_logits_rows_kernel<8>
               : tokens > 2 ? &router_logits_rows_kernel<4>
                            : (tokens == 2 ? &router_logits_rows_kernel<2> : &router_logits_rows_kernel<1>);
    fn<<<grid, kRowsThreads, 0, stream>>>(x, router_weight, static_cast<int>(tokens), static_cast<int>(hidden),
                                          static_cast<int>(experts), logits);
    return cuda_launch_status("router_logits_rows_kernel launch", __FILE__, __LINE__);
  }
  const dim3 grid(static_cast<unsigned>((tokens + kLogitTokens - 1) / kLogitTokens),
                  static_cast<unsigned>((experts + kLogitExperts - 1) / kLogitExperts));
  (vec ? router_logits_kernel<true> : router_logits_kernel<false>)<<<grid, kLogitThreads, 0, stream>>>(
      x, router_weight, static_cast<int>(tokens), static_cast<int>(hidden), static_cast<int>(experts), logits);
  return cuda_launch_status("router_logits_kernel launch", __FILE__, __LINE__);
}

namespace {
Status launch_routing_impl(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg, int32_t* ids,
                           float* weights, cudaStream_t stream, bool allow_fast) {
  if (tokens == 0) return Status::ok();
  const RouteParams rp = route_params(cfg);
  const bool sigmoid = cfg.routing == RoutingKind::kSigmoidGrouped;
  const size_t smem = route_smem_bytes(rp);
  const unsigned blocks = static_cast<unsigned>((tokens + kRouteWarps - 1) / kRouteWarps);
  if (allow_fast && fast_route_ok(rp, sigmoid)) {
    const cudaError_t err =
        sigmoid ? launch_route_fast<true>(logits, bias, static_cast<int>(tokens), rp, ids, weights, blocks, stream)
                : launch_route_fast<false>(logits, nullptr, static_cast<int>(tokens), rp, ids, weights, blocks, stream);
    if (err != cudaSuccess) return cuda_status(err, "route_fast_kernel launch", __FILE__, __LINE__);
    return Status::ok();
  }
  if (sigmoid) {
    route_kernel<true><<<blocks, kRouteWarps * 32, smem, stream>>>(logits, bias, static_cast<int>(tokens), rp, ids,
                                                                   weights);
  } else {
    route_kernel<false><<<blocks, kRouteWarps * 32, smem, stream>>>(logits, nullptr, static_cast<int>(tokens), rp, ids,
                                                                    weights);
  }
  return cuda_launch_status("route_kernel launch", __FILE__, __LINE__);
}

}  // namespace

Status launch_routing(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg, int32_t* ids,
                      float* weights, Stream stream) {
  return launch_routing_impl(logits, bias, tokens, cfg, ids, weights, stream, /*allow_fast=*/true);
}

Status launch_routing_generic(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg,
                              int32_t* ids, float* weights, Stream stream) {
  return launch_routing_impl(logits, bias, tokens, cfg, ids, weights, stream, /*allow_fast=*/false);
}

}  // namespace fp4moe::engine
