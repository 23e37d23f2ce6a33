// Finalize: the top-k weighted combine of the FC2 rows (+ the shared expert) into bf16 `out` (R5).
//
// Grid (T, ceil(H / 8 / 256)); each thread owns 8 consecutive hidden columns of one token and reads
// them with 16-byte loads from each of the token's topk grouped rows (pair_pos; for topk <= 16 all
// loads, the shared expert's row included, are issued before the first add), accumulating in fp32 in
// rank order, then adds the shared expert's row. Multiplies and adds are separately rounded (__fmul_rn
// / __fadd_rn), the reference's exact operation order, so the combine adds no error of its own.
// Expert-parallel partials (kept_rows non-null): a pair whose grouped row is >= *kept_rows went to
// another rank's expert (the permutation's dropped bucket, whose rows FC2 never wrote) and is skipped;
// skipping equals adding w * 0 in the reference's order, so a partial is the reference with the other
// ranks' weights zeroed. Where the forward's chained GEMM launch leaves its counters to the next kernel
// (GroupedGemmArgs::caller_resets), every thread of the grid first zeroes its share of them (16-byte
// stores), after the programmatic-launch wait, when that launch has ended. Where the launch left FC2's rows
// as fp32 sums (GroupedGemmArgs::fp32_rows_to_caller: kF32, y32 and y32_shared), each thread reads its 8
// columns of each row as two float4, rounds them to bf16 (FC2's output; the same values the bf16 rows would
// hold) and stores zeros in their place: every element of a used row is read by one thread only.
#include <cuda_runtime.h>

#include <climits>

#include "common/bf16x8.cuh"
#include "common/pdl_launch.h"
#include "engine/cuda_check.h"
#include "engine/engine_kernels.h"
#include "fp4moe/dtype.h"

namespace fp4moe::engine {

namespace {

constexpr int kFinalizeThreads = 256;

// 8 fp32 values rounded to bf16 (as bf16x8).
__device__ __forceinline__ uint4 f32x8_to_bf16x8(const float4& a, const float4& b) {
  auto pack = [](float lo, float hi) {
    return static_cast<uint32_t>(f32_to_bf16_bits(lo)) | (static_cast<uint32_t>(f32_to_bf16_bits(hi)) << 16);
  };
  return make_uint4(pack(a.x, a.y), pack(a.z, a.w), pack(b.x, b.y), pack(b.z, b.w));
}
// An fp32 row's 8 columns at p (two float4) and their zeroing.
struct F32x8 {
  float4 a, b;
};
__device__ __forceinline__ F32x8 load_f32x8(const float* p) {
  const float4* q = reinterpret_cast<const float4*>(p);
  return {__ldcg(q), __ldcg(q + 1)};
}
__device__ __forceinline__ void zero_f32x8(float* p) {
  float4* q = reinterpret_cast<float4*>(p);
  __stcg(q, make_float4(0.f, 0.f, 0.f, 0.f));
  __stcg(q + 1, make_float4(0.f, 0.f, 0.f, 0.f));
}
// One at a time: the row's 8 columns rounded to bf16, then zeroed.
__device__ __forceinline__ uint4 take_f32x8(float* p) {
  const F32x8 v = load_f32x8(p);
  zero_f32x8(p);
  return f32x8_to_bf16x8(v.a, v.b);
}

// kBatch > 0: topk <= kBatch, and every row index, weight and 16-byte row load of the token is issued
// before the first add (decode: one token's 8 rows are 8 independent loads instead of a chain of 8
// index-then-row round trips); kBatch = 0: any topk, one pair at a time. Same adds in the same order.
template <int kBatch, bool kF32>
__global__ void __launch_bounds__(kFinalizeThreads)
    finalize_kernel(const uint16_t* __restrict__ y, const int32_t* __restrict__ pair_pos,
                    const float* __restrict__ weights, const int32_t* __restrict__ kept_rows,
                    const uint16_t* __restrict__ y_shared, int topk, int hidden, uint16_t* __restrict__ out,
                    uint4* __restrict__ reset, int reset_units, float* __restrict__ y32,
                    float* __restrict__ y32_shared) {
  pdl_wait();  // programmatic dependent launch (common/pdl_launch.h): FC2's rows come from the kernel before
  if (reset_units > 0) {
    const int threads = static_cast<int>(gridDim.x * gridDim.y) * kFinalizeThreads;
    for (int i = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x) * kFinalizeThreads + static_cast<int>(threadIdx.x);
         i < reset_units; i += threads)
      reset[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  const int t = blockIdx.x;
  const int c8 = blockIdx.y * kFinalizeThreads + threadIdx.x;  // group of 8 columns
  if (c8 * 8 >= hidden) return;
  const int kept = kept_rows ? *kept_rows : INT_MAX;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  auto add_row = [&](const uint4& v, float w) {
    float f[8];
    bf16x8_to_f32(v, f);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(w, f[i]));
  };
  const int64_t pair0 = static_cast<int64_t>(t) * topk;
  const uint4* shared_row = y_shared ? reinterpret_cast<const uint4*>(y_shared + static_cast<int64_t>(t) * hidden + c8 * 8)
                                     : nullptr;
  float* shared32 = kF32 && y32_shared ? y32_shared + static_cast<int64_t>(t) * hidden + c8 * 8 : nullptr;
  // Row r's 8 columns of this thread as bf16x8 (kF32: taken from the fp32 rows, which it zeroes).
  auto row_at = [&](int r) {
    if constexpr (kF32) return take_f32x8(y32 + static_cast<int64_t>(r) * hidden + c8 * 8);
    return *reinterpret_cast<const uint4*>(y + static_cast<int64_t>(r) * hidden + c8 * 8);
  };
  uint4 vs = make_uint4(0u, 0u, 0u, 0u);  // the shared expert's row (kBatch > 0: loaded with the routed rows)
  if constexpr (kBatch > 0) {
    int row[kBatch];
    float w[kBatch];
    uint4 v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      row[k] = k < topk ? pair_pos[pair0 + k] : INT_MAX;
      w[k] = k < topk ? weights[pair0 + k] : 0.f;
    }
    if (shared_row) vs = *shared_row;
    if constexpr (kF32) {
      // Every row's loads first, then their zeroing: a store issued between them would order the next
      // row's load after it (the same pointer), one round trip a row.
      F32x8 f[kBatch], fs{};
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (row[k] < kept) f[k] = load_f32x8(y32 + static_cast<int64_t>(row[k]) * hidden + c8 * 8);
      if (shared32) fs = load_f32x8(shared32);
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (row[k] < kept) {
          zero_f32x8(y32 + static_cast<int64_t>(row[k]) * hidden + c8 * 8);
          v[k] = f32x8_to_bf16x8(f[k].a, f[k].b);
        }
      if (shared32) {
        zero_f32x8(shared32);
        vs = f32x8_to_bf16x8(fs.a, fs.b);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (row[k] < kept) v[k] = row_at(row[k]);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (row[k] < kept) add_row(v[k], w[k]);  // a pair of another rank's expert (or past topk) is skipped
  } else {
    for (int k = 0; k < topk; ++k) {
      const int row = pair_pos[pair0 + k];
      if (row >= kept) continue;  // another rank's expert
      add_row(row_at(row), weights[pair0 + k]);
    }
  }
  if (shared_row || shared32) {
    if constexpr (kBatch == 0) vs = shared32 ? take_f32x8(shared32) : *shared_row;
    float f[8];
    bf16x8_to_f32(vs, f);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], f[i]);
  }
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    o[i] = static_cast<uint32_t>(f32_to_bf16_bits(acc[2 * i])) | (static_cast<uint32_t>(f32_to_bf16_bits(acc[2 * i + 1])) << 16);
  *reinterpret_cast<uint4*>(out + static_cast<int64_t>(t) * hidden + c8 * 8) = make_uint4(o[0], o[1], o[2], o[3]);
}

// The build for topk: the batched loads where topk fits 8 or 16, else one pair at a time.
template <bool kF32>
auto finalize_kernel_for(int64_t topk) {
  return topk <= 8 ? finalize_kernel<8, kF32> : (topk <= 16 ? finalize_kernel<16, kF32> : finalize_kernel<0, kF32>);
}

}  // namespace

Status launch_finalize(const uint16_t* y, const int32_t* pair_pos, const float* weights, const uint16_t* y_shared,
                       int64_t tokens, int64_t topk, int64_t hidden, uint16_t* out, Stream stream) {
  return launch_finalize_partial(y, pair_pos, weights, nullptr, y_shared, tokens, topk, hidden, out, stream);
}

Status launch_finalize_partial(const uint16_t* y, const int32_t* pair_pos, const float* weights,
                               const int32_t* kept_rows, const uint16_t* y_shared, int64_t tokens, int64_t topk,
                               int64_t hidden, uint16_t* out, Stream stream, void* reset, size_t reset_bytes,
                               float* y32, float* y32_shared) {
  if (tokens == 0) return Status::ok();
  if ((y32_shared != nullptr && (y32 == nullptr || y_shared != nullptr)) ||
      (reinterpret_cast<uintptr_t>(y32) & 15) != 0 || (reinterpret_cast<uintptr_t>(y32_shared) & 15) != 0)
    return Status(StatusCode::kInvalidArgument,
                  "finalize: fp32 rows (16-byte aligned) take the shared expert's row as fp32 too, or none");
  if (hidden % 8 != 0)
    return Status(StatusCode::kInvalidArgument, fmt::format("finalize: hidden = {} is not a multiple of 8", hidden));
  if (reset_bytes > 0 && (reset == nullptr || (reinterpret_cast<uintptr_t>(reset) & 15) != 0 || reset_bytes % 16 != 0 ||
                          reset_bytes / 16 > static_cast<size_t>(INT_MAX)))
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("finalize: the bytes to zero after the GEMM launch ({} at {}) must be a 16-byte aligned "
                              "multiple of 16 below 2^35", reset_bytes, fmt::ptr(reset)));
  const int64_t groups = hidden / 8;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((groups + kFinalizeThreads - 1) / kFinalizeThreads));
  auto kernel = y32 != nullptr ? finalize_kernel_for<true>(topk) : finalize_kernel_for<false>(topk);
  const cudaError_t err = launch_pdl(kernel, grid, dim3(kFinalizeThreads), 0, stream, y, pair_pos, weights, kept_rows,
                                     y_shared, static_cast<int>(topk), static_cast<int>(hidden), out,
                                     static_cast<uint4*>(reset), static_cast<int>(reset_bytes / 16), y32, y32_shared);
  if (err != cudaSuccess) return cuda_status(err, "finalize_kernel launch", __FILE__, __LINE__);
  return Status::ok();
}

}  // namespace fp4moe::engine
