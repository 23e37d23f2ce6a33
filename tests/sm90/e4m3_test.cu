// sm90_e4m3_test: the e4m3 path's numerics on the GPU (sm90_e4m3.h / .cuh), before any tactic uses them.
// The device pack gives the CPU description's bytes; then one CTA per 64-row packed tile multiplies one token's
// bf16 activations, split on the device into e4m3 halves per k16 block, with two m64n8k32 e4m3 wgmmas a
// k64 chunk and the block scales and exponents applied by FFMA; every row is compared with the CPU
// reference (the canonical weights' e2m1 * e4m3 times the bf16 activations, in double), outputs poisoned
// first, relative L2 error <= 5e-3 as every GEMM of DESIGN.md section 8. Exits 77 without an sm_90 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/sm90_wgmma/sm90_e4m3.cuh"
#include "kernels/sm90_wgmma/sm90_pack.h"
#include "sm90_test_util.h"

namespace fp4moe {
namespace {

using namespace sm90;

// Shared memory: the token tile (kchunks / 2 sub-tiles of 1 KB, 1024-aligned for the swizzle), the block
// exponents (kchunks * 4 int32), the tile's packed blocks (kchunks * 2304 bytes).
size_t smem_bytes(int kchunks) { return 1024 + kchunks * 512 + kchunks * 16 + size_t(kchunks) * kPackBlockBytes; }

__global__ void __launch_bounds__(128) e4m3_tile_kernel(const uint8_t* packed, const uint16_t* x, int kchunks, float* out,
                                                        int zero) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* tok = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  int* exps = reinterpret_cast<int*>(tok + kchunks * 512);
  uint8_t* wts = tok + kchunks * 512 + kchunks * 16;
  const int tid = threadIdx.x;
  const uint8_t* src = packed + size_t(blockIdx.x) * kchunks * kPackBlockBytes;
  for (int i = tid; i < kchunks * 32; i += 128) reinterpret_cast<uint4*>(tok)[i] = make_uint4(0, 0, 0, 0);
  for (int i = tid; i < kchunks * kPackBlockBytes / 16; i += 128)
    reinterpret_cast<uint4*>(wts)[i] = reinterpret_cast<const uint4*>(src)[i];
  __syncthreads();
  // The token tile: unit (kb, j, p) = half p of k16 block j of chunk kb.
  for (int u = tid; u < kchunks * 8; u += 128) {
    const int kb = u / 8, j = (u / 2) % 4, p = u % 2, b = 4 * kb + j;
    const uint4 xx[2] = {reinterpret_cast<const uint4*>(x)[2 * b], reinterpret_cast<const uint4*>(x)[2 * b + 1]};
    int e = 0;
    const uint4 unit = e4m3_split_unit(xx, p, e);
    *reinterpret_cast<uint4*>(tok + (kb / 2) * 1024 + e4m3_token_offset(2 * j + p, 64 * (kb % 2) + 16 * j)) = unit;
    if (p == 0) exps[b] = e;
  }
  __syncthreads();
  fence_proxy_async_smem();
  const uint64_t desc0 = make_desc_sw128(smem_addr(tok));
  const int q = tid & 3;
  float f0 = 0.f, f1 = 0.f;
  for (int kb = 0; kb < kchunks; ++kb) {
    const uint8_t* blk = wts + kb * kPackBlockBytes;
    uint32_t a[8];
    e4m3_decode_chunk(blk, tid, a);
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    wgmma_fence();
    e4m3_issue_chunk(a, e4m3_chunk_desc(desc0, kb), zero, d);
    wgmma_commit();
    wgmma_wait<0>();
    e4m3_accumulate(d, e4m3_quad_scales(blk, tid), exps[4 * kb + q], f0, f1);
  }
  f0 = quad_sum(f0);
  f1 = quad_sum(f1);
  if (q == 0) {  // rows R0 = 16w + g and R1 = R0 + 8, in the unscaled units sum(e2m1 * scale * x)
    const int r0 = 16 * (tid >> 5) + ((tid & 31) >> 2);
    out[blockIdx.x * 64 + r0] = f0 * kAccumulatorScale;
    out[blockIdx.x * 64 + r0 + 8] = f1 * kAccumulatorScale;
  }
}

struct Case {
  GemmOp op;
  int64_t n, k;
  int spread;  // binades the blocks' magnitudes spread over (around 1)
  uint32_t seed;
};

void run_case(const Case& c) {
  GemmProblem p;
  p.op = c.op;
  p.num_experts = 1;
  p.n = c.n;
  p.k = c.k;
  std::mt19937 rng(c.seed);
  const sm90test::RandomWeights w = sm90test::random_weights(p, rng);
  const PackGeometry g = pack_geometry(p);
  const std::vector<uint8_t> packed = pack_e4m3_cpu(p, w.canonical.data());
  // Activations: bf16, each k16 block at its own magnitude, one block all zero; K padded with zeros.
  const int kchunks = static_cast<int>(g.kchunks);
  std::vector<uint16_t> xb(static_cast<size_t>(kchunks) * kPackK, 0);
  std::vector<float> xf(static_cast<size_t>(p.k), 0.f);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t b = 0; b * 16 < p.k; ++b) {
    const int e = c.spread ? static_cast<int>(rng() % (2 * c.spread + 1)) - c.spread : 0;
    for (int64_t kk = 16 * b; kk < std::min<int64_t>(16 * b + 16, p.k); ++kk) {
      const float v = (b == 3) ? 0.f : std::ldexp(u(rng), e);
      xb[kk] = f32_to_bf16_bits(v);
      xf[kk] = bf16_bits_to_f32(xb[kk]);
    }
  }
  // The device pack (poisoned first) must give the CPU description's bytes.
  sm90test::DeviceBuffer d_canon(w.canonical.size()), d_packed(packed.size()), d_x(xb.size() * 2),
      d_out(size_t(g.tiles) * 64 * 4);
  SM90_CUDA_OK(cudaMemcpy(d_canon.get(), w.canonical.data(), w.canonical.size(), cudaMemcpyHostToDevice));
  SM90_CUDA_OK(cudaMemset(d_packed.get(), 0xA5, packed.size()));
  const Status ps = pack_e4m3_device(p, d_canon.get(), d_packed.get(), Stream{});
  ASSERT_TRUE(ps.is_ok()) << ps.to_string();
  SM90_CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> packed_dev(packed.size());
  SM90_CUDA_OK(cudaMemcpy(packed_dev.data(), d_packed.get(), packed.size(), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < packed.size(); ++i)
    ASSERT_EQ(packed_dev[i], packed[i]) << "device pack differs from the CPU pack at byte " << i << " (block "
                                        << i / kPackBlockBytes << ", offset " << i % kPackBlockBytes << ")";
  SM90_CUDA_OK(cudaMemcpy(d_x.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
  SM90_CUDA_OK(cudaMemset(d_out.get(), 0xFF, d_out.size()));  // poison: NaN
  const size_t smem = smem_bytes(kchunks);
  SM90_CUDA_OK(cudaFuncSetAttribute(e4m3_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  e4m3_tile_kernel<<<static_cast<unsigned>(g.tiles), 128, smem>>>(static_cast<const uint8_t*>(d_packed.get()),
                                                                   static_cast<const uint16_t*>(d_x.get()), kchunks,
                                                                   static_cast<float*>(d_out.get()), 0);
  SM90_CUDA_OK(cudaGetLastError());
  SM90_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> out(size_t(g.tiles) * 64);
  SM90_CUDA_OK(cudaMemcpy(out.data(), d_out.get(), out.size() * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0, worst = 0;
  int64_t rows = 0;
  for (int64_t t = 0; t < g.tiles; ++t)
    for (int pr = 0; pr < kPackRows; ++pr) {
      const int64_t r = packed_row_source(g.fc1, g.n, t, pr);
      if (r < 0) continue;
      double ref = 0;
      for (int64_t k = 0; k < p.k; ++k) ref += static_cast<double>(xf[k]) * w.unscaled(0, r, k);
      const double got = out[t * 64 + pr];
      ASSERT_TRUE(std::isfinite(got)) << "row " << r << " (tile " << t << ", packed row " << pr << ") not written";
      num += (got - ref) * (got - ref);
      den += ref * ref;
      worst = std::max(worst, std::fabs(got - ref));
      ++rows;
    }
  const double rel = std::sqrt(num / std::max(den, 1e-300));
  std::printf("%s n=%lld k=%lld spread=%d: %lld rows, relative L2 %.3e, worst abs %.3e\n",
              c.op == GemmOp::kFc1SwiGlu ? "fc1" : "fc2", static_cast<long long>(c.n), static_cast<long long>(c.k), c.spread,
              static_cast<long long>(rows), rel, worst);
  EXPECT_EQ(rows, g.rows);
  EXPECT_LE(rel, 5e-3);
}

TEST(Sm90E4m3, Fc2TwoTilesKTail) { run_case({GemmOp::kFc2, 128, 1008, 3, 1}); }
TEST(Sm90E4m3, Fc1GateUpRows) { run_case({GemmOp::kFc1SwiGlu, 32, 2048, 3, 2}); }
TEST(Sm90E4m3, WideBlockMagnitudes) { run_case({GemmOp::kFc2, 64, 512, 40, 3}); }
TEST(Sm90E4m3, RowTail) { run_case({GemmOp::kFc2, 100, 256, 0, 4}); }

}  // namespace
}  // namespace fp4moe
