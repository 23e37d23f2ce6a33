// Device-side permutation: groups the P = T*topk (token, rank) pairs by expert, stably, with no host
// round trip and no order-dependent atomics, so two runs (or graph replays) give identical maps.
//
// 1. rank_kernel: one warp per chunk of 256 consecutive pairs, 4 warps per block. The warp walks its
//    chunk 32 pairs at a time; __match_any_sync groups lanes with the same expert, and a per-warp
//    counter array in shared memory ([E] ints per warp) gives each pair its rank among the chunk's
//    earlier pairs of the same expert. The final counters are the chunk's histogram -> chunk_base[c][e].
// 2. offsets_kernel: one block. Expert totals (sum over chunks), a block-wide exclusive scan -> offsets,
//    then per expert a running sum over chunks turns chunk_base[c][e] into the first grouped row of
//    chunk c's pairs of expert e. Also writes the shared expert's offsets {0, T}.
// 3. scatter_kernel: one thread per pair: row = chunk_base[c][e] + rank; gather[row] = token,
//    pair_pos[pair] = row.
// Small batches (at most 4096 pairs and 256 experts: decode) take permute_small_kernel instead: one
// block of 32 warps does the same three steps with the counters in shared memory and __syncthreads in
// place of kernel boundaries, so the permutation is one launch (three launches cost ~10 us of the T = 1
// forward on the H200). Warp w owns the contiguous pair range [w*C, (w+1)*C), C = ceil(P / 32) rounded
// up to 32, so warp order is pair order and the grouping is the same stable one.
// 4. gather_rows_kernel (launch_gather_rows): the token rows copied in grouped order for FC1 (engine.cpp).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "common/pdl_launch.h"
#include "common/warp_scan.cuh"
#include "engine/cuda_check.h"
#include "engine/engine_kernels.h"

namespace fp4moe::engine {

namespace {

constexpr int kChunk = 256;       // pairs per warp chunk
constexpr int kRankWarps = 4;     // warps (chunks) per block
constexpr int kOffsetThreads = 1024;

__global__ void __launch_bounds__(kRankWarps * 32)
    rank_kernel(const int32_t* __restrict__ ids, int pairs, int chunks, int experts, int32_t* __restrict__ rank,
                int32_t* __restrict__ chunk_base) {
  extern __shared__ int rank_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = blockIdx.x * kRankWarps + warp;
  if (c >= chunks) return;  // whole warp
  int* count = rank_smem + warp * experts;
  for (int e = lane; e < experts; e += 32) count[e] = 0;
  __syncwarp();
  const unsigned lower = (1u << lane) - 1u;
  for (int it = 0; it < kChunk / 32; ++it) {
    const int i = c * kChunk + it * 32 + lane;
    const int e = i < pairs ? ids[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int before = __popc(peers & lower);
    const int base = e >= 0 ? count[e] : 0;
    __syncwarp();
    if (e >= 0 && before == 0) count[e] = base + __popc(peers);  // the group's lowest lane updates
    __syncwarp();
    if (i < pairs) rank[i] = base + before;
  }
  for (int e = lane; e < experts; e += 32) chunk_base[static_cast<int64_t>(c) * experts + e] = count[e];
}

__global__ void __launch_bounds__(kOffsetThreads)
    offsets_kernel(int32_t* __restrict__ chunk_base, int chunks, int experts, int32_t* __restrict__ offsets,
                   int32_t* __restrict__ shared_offsets, int tokens) {
  __shared__ int warp_sums[kOffsetThreads / 32];
  __shared__ int carry_s;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    carry_s = 0;
    offsets[0] = 0;
    if (shared_offsets) {
      shared_offsets[0] = 0;
      shared_offsets[1] = tokens;
    }
  }
  __syncthreads();
  for (int base = 0; base < experts; base += kOffsetThreads) {
    const int e = base + tid;
    int total = 0;
    if (e < experts)
      for (int c = 0; c < chunks; ++c) total += chunk_base[static_cast<int64_t>(c) * experts + e];
    const int incl = warp_inclusive_sum(total, lane);
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    int before = carry_s, chunk_total = 0;
    for (int w = 0; w < kOffsetThreads / 32; ++w) {
      before += w < warp ? warp_sums[w] : 0;
      chunk_total += warp_sums[w];
    }
    if (e < experts) offsets[e + 1] = before + incl;
    __syncthreads();
    if (tid == 0) carry_s += chunk_total;
    __syncthreads();
  }
  // offsets[] written above by other threads: visible after the barrier.
  for (int e = tid; e < experts; e += kOffsetThreads) {
    int run = offsets[e];
    for (int c = 0; c < chunks; ++c) {
      const int64_t idx = static_cast<int64_t>(c) * experts + e;
      const int h = chunk_base[idx];
      chunk_base[idx] = run;
      run += h;
    }
  }
}

__global__ void scatter_kernel(const int32_t* __restrict__ ids, int pairs, int topk, int experts,
                               const int32_t* __restrict__ rank, const int32_t* __restrict__ chunk_base,
                               int32_t* __restrict__ gather, int32_t* __restrict__ pair_pos) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int e = ids[i];
  const int row = chunk_base[static_cast<int64_t>(i / kChunk) * experts + e] + rank[i];
  gather[row] = i / topk;
  pair_pos[i] = row;
}

constexpr int kSmallWarps = 32;
constexpr int kSmallMaxPairs = 4096;
constexpr int kSmallMaxExperts = 256;

__global__ void __launch_bounds__(kSmallWarps * 32)
    permute_small_kernel(const int32_t* __restrict__ ids, int pairs, int topk, int experts, int tokens,
                         int32_t* __restrict__ offsets, int32_t* __restrict__ gather, int32_t* __restrict__ pair_pos,
                         int32_t* __restrict__ shared_offsets) {
  pdl_wait();  // for programmatic dependent launch (common/pdl_launch.h); no early trigger
  __shared__ int count[kSmallWarps][kSmallMaxExperts];  // per warp: pairs per expert, then row bases
  __shared__ uint16_t rank_s[kSmallMaxPairs];            // 40 KB in all, under the 48 KB static limit
  __shared__ int warp_tot[kSmallWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < kSmallWarps * kSmallMaxExperts; i += blockDim.x) (&count[0][0])[i] = 0;
  if (tid == 0 && shared_offsets) {
    shared_offsets[0] = 0;
    shared_offsets[1] = tokens;
  }
  __syncthreads();
  // 1. Rank of each pair among its warp range's earlier pairs of the same expert.
  const int per_warp = ((pairs + kSmallWarps - 1) / kSmallWarps + 31) / 32 * 32;
  const unsigned lower = (1u << lane) - 1u;
  for (int b = warp * per_warp; b < min(pairs, (warp + 1) * per_warp); b += 32) {
    const int i = b + lane;
    const int e = i < pairs ? ids[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int before = __popc(peers & lower);
    const int base = e >= 0 ? count[warp][e] : 0;
    __syncwarp();
    if (e >= 0 && before == 0) count[warp][e] = base + __popc(peers);
    __syncwarp();
    if (i < pairs) rank_s[i] = static_cast<uint16_t>(base + before);
  }
  __syncthreads();
  // 2. Per expert: totals, then an exclusive scan over experts (one thread per expert, E <= 256 < 1024).
  int total = 0;
  if (tid < experts)
    for (int w = 0; w < kSmallWarps; ++w) total += count[w][tid];
  const int incl = warp_inclusive_sum(total, lane);
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  int before_warps = 0;
  for (int w = 0; w < warp; ++w) before_warps += warp_tot[w];
  if (tid < experts) {
    const int start = before_warps + incl - total;
    offsets[tid + 1] = start + total;
    int run = start;  // row base of each warp's pairs of this expert
    for (int w = 0; w < kSmallWarps; ++w) {
      const int c = count[w][tid];
      count[w][tid] = run;
      run += c;
    }
  }
  if (tid == 0) offsets[0] = 0;
  __syncthreads();
  // 3. Scatter.
  for (int b = warp * per_warp; b < min(pairs, (warp + 1) * per_warp); b += 32) {
    const int i = b + lane;
    if (i < pairs) {
      const int row = count[warp][ids[i]] + rank_s[i];
      gather[row] = i / topk;
      pair_pos[i] = row;
    }
  }
}

__global__ void write_offsets_kernel(int32_t* dst, int tokens) {
  dst[0] = 0;
  dst[1] = tokens;
}

}  // namespace

Status launch_write_offsets(int32_t* dst, int64_t tokens, Stream stream) {
  write_offsets_kernel<<<1, 1, 0, stream>>>(dst, static_cast<int>(tokens));
  return cuda_launch_status("write_offsets_kernel launch", __FILE__, __LINE__);
}

int64_t permute_chunks(int64_t pairs) { return (pairs + kChunk - 1) / kChunk; }

Status prepare_permute_kernels(int64_t experts) {
  const size_t smem = sizeof(int) * kRankWarps * static_cast<size_t>(experts);
  if (smem > 48 * 1024)
    FP4MOE_CUDA_RETURN(cudaFuncSetAttribute(rank_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  return Status::ok();
}

Status launch_permute(const int32_t* ids, int64_t tokens, int64_t topk, int64_t experts, const PermuteBuffers& b,
                      Stream stream) {
  const int64_t pairs = tokens * topk;
  const int64_t chunks = permute_chunks(pairs);
  if (pairs <= kSmallMaxPairs && experts <= kSmallMaxExperts) {
    const cudaError_t err = launch_pdl(permute_small_kernel, dim3(1), dim3(kSmallWarps * 32), 0, stream, ids,
                                       static_cast<int>(pairs), static_cast<int>(topk), static_cast<int>(experts),
                                       static_cast<int>(tokens), b.offsets, b.gather, b.pair_pos, b.shared_offsets);
    if (err != cudaSuccess) return cuda_status(err, "permute_small_kernel launch", __FILE__, __LINE__);
    return Status::ok();
  }
  if (pairs > 0) {
    const size_t smem = sizeof(int) * kRankWarps * static_cast<size_t>(experts);
    const unsigned blocks = static_cast<unsigned>((chunks + kRankWarps - 1) / kRankWarps);
    rank_kernel<<<blocks, kRankWarps * 32, smem, stream>>>(ids, static_cast<int>(pairs), static_cast<int>(chunks),
                                                           static_cast<int>(experts), b.rank, b.chunk_base);
    FP4MOE_CUDA_RETURN(cudaGetLastError());
  }
  offsets_kernel<<<1, kOffsetThreads, 0, stream>>>(b.chunk_base, static_cast<int>(chunks), static_cast<int>(experts),
                                                   b.offsets, b.shared_offsets, static_cast<int>(tokens));
  FP4MOE_CUDA_RETURN(cudaGetLastError());
  if (pairs > 0) {
    const unsigned blocks = static_cast<unsigned>((pairs + 255) / 256);
    scatter_kernel<<<blocks, 256, 0, stream>>>(ids, static_cast<int>(pairs), static_cast<int>(topk),
                                               static_cast<int>(experts), b.rank, b.chunk_base, b.gather, b.pair_pos);
    FP4MOE_CUDA_RETURN(cudaGetLastError());
  }
  return Status::ok();
}

// out[r] = x[gather[r]] for r < rows, 16 bytes per thread and step: the gathered copy of the token rows
// that lets FC1 read them contiguously (engine.cpp, routed()).
__global__ void gather_rows_kernel(const uint4* __restrict__ x, int64_t ld_vecs, const int32_t* __restrict__ gather,
                                   int rows, const int32_t* __restrict__ row_limit, int vecs,
                                   uint4* __restrict__ out) {
  if (row_limit) rows = min(rows, *row_limit);
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4* src = x + static_cast<int64_t>(gather[r]) * ld_vecs;
    uint4* dst = out + static_cast<int64_t>(r) * vecs;
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) dst[v] = __ldg(src + v);
  }
}

Status launch_gather_rows(const uint16_t* x, int64_t ld, const int32_t* gather, int64_t rows,
                          const int32_t* row_limit, int64_t cols, uint16_t* out, Stream stream) {
  if (cols % 8 != 0 || ld % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out) % 16 != 0)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("gather_rows: rows of {} bf16 (leading dimension {}) are not 16-byte vectors", cols, ld));
  if (rows <= 0) return Status::ok();
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, 2048));
  gather_rows_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const uint4*>(x), ld / 8, gather,
                                                 static_cast<int>(rows), row_limit, static_cast<int>(cols / 8),
                                                 reinterpret_cast<uint4*>(out));
  return cuda_launch_status("gather_rows_kernel launch", __FILE__, __LINE__);
}

}  // namespace fp4moe::engine
