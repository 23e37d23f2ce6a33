// sm90_consumer_probe: what one k256 stage of the n8 decode tile costs its consumers on this GPU, with
// memory out of the way (docs/perf.md, sm90 step 42). Every case is a persistent kernel, one CTA per SM,
// over shared memory filled once with arbitrary codes; it reports SM clocks per stage (clock64, mean
// over the CTAs, per warpgroup where the roles differ) and the clock the SMs ran at (clocks over wall
// time). Not a test: it checks no result, it times instruction streams.
//
// Cases (a stage = 256 weight rows x k256 = 64 m64n8k16 wgmmas per SM, 16 per consumer warpgroup):
//   wgmma       W warpgroups (1, 2 or 4) each issue 16 RS wgmmas a stage (four commit groups of four,
//               wait_group 1), A registers constant: the tensor-core side alone; k16 step s into
//               accumulator set s % S, S = 4 (steps 1-41's rule for N <= 16) or 1.
//   mma.sync    16 warps each issue 16 mma.sync m16n8k16 a stage (B by ldmatrix): the same math on the
//               warp-level instruction.
//   consumer    the four-consumer tile's consumer loop as built (consume_pipelined, sm90_consumer.cuh;
//               FP4MOE_SM90_SPLIT_ACCUMULATORS picks its accumulator sets) with a producer thread that
//               only arrives on the full barriers, so every stage is ready at once.
//   e4m3 loop   the same stages and barriers, consumed by the e4m3 tile's loop as built (consume_item_e4m3,
//               sm90_consumer.cuh; sm90 steps 48-50): one token per item, B's eight columns the four k16
//               blocks of a k64 chunk times the (hi, lo) e4m3 halves of the token's activations, so a chunk
//               is two m64n8k32 e4m3 wgmmas into a fresh accumulator, and the block factors (scale and
//               activation exponent) four FFMAs a chunk once that accumulator has retired; two chunks per
//               commit group, two A buffers, the group's accumulators read after wait_group 0, the next
//               group decoded before that wait. (Step 48 timed this loop's first form, without the
//               exponents, with one or two chunks a group: 1143 / 1095 clocks a stage.)
//   e4m3 wgmma  that loop's m64n8k32 e4m3 wgmmas alone (A constant, one accumulator, 4 warpgroups).
// Usage: sm90_consumer_probe [--stages N]  (sm_90 GPUs only; exits 77 elsewhere)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/cuda_check.h"
#include "kernels/sm90_wgmma/sm90_consumer.cuh"
#include "kernels/sm90_wgmma/sm90_e4m3.cuh"
#include "kernels/sm90_wgmma/sm90_ptx.cuh"
#include "kernels/sm90_wgmma/sm90_wgmma_ops.cuh"
#include "kernels/sm90_wgmma/tile_config.h"

namespace {

using namespace fp4moe::sm90;
using Cfg = TileConfig<256, 8, 256, 5, 1, 4>;  // sm90.w4a16.m256n8k256.ws.s5.c4

__device__ void fill_smem(uint8_t* smem, int bytes) {
  for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ ((i * 2654435761u) & 0x77777777u);
}

// ---- wgmma alone: warpgroups 0 .. kActive-1 issue, the rest idle -----------------------------------
template <int kActive, int kSets>
__global__ void __launch_bounds__(512, 1) wgmma_kernel(int stages, float* out, long long* clocks) {
  extern __shared__ __align__(1024) uint8_t smem[];
  fill_smem(smem, 4096);
  __syncthreads();
  const int wg = threadIdx.x / 128;
  float acc[4][4] = {};
  uint32_t a[4][4];
  for (int s = 0; s < 4; ++s)
    for (int r = 0; r < 4; ++r) a[s][r] = 0x3c003c00u + threadIdx.x + s + r;
  const uint64_t desc0 = make_desc_sw128(smem_addr(smem));
  const long long c0 = clock64();
  if (wg < kActive) {
    for (int st = 0; st < stages; ++st) {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        wgmma_wait<1>();
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) WgmmaRS<8>::mma(acc[s % kSets], a[s], desc0 + ((kb * 1024 + s * 32) >> 4));
        wgmma_commit();
      }
    }
    wgmma_wait<0>();
  }
  const long long c1 = clock64();
  float sum = 0.f;
  for (int s = 0; s < 4; ++s)
    for (int r = 0; r < 4; ++r) sum += acc[s][r];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
  if (threadIdx.x % 128 == 0) clocks[blockIdx.x * 4 + wg] = c1 - c0;
}

// ---- mma.sync: every warp issues the m16n8k16 steps of its 16 rows ---------------------------------
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__global__ void __launch_bounds__(512, 1) mma_sync_kernel(int stages, float* out, long long* clocks) {
  extern __shared__ __align__(1024) uint8_t smem[];
  fill_smem(smem, 4096);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  float acc[4][4] = {};
  uint32_t a[4][4];
  for (int s = 0; s < 4; ++s)
    for (int r = 0; r < 4; ++r) a[s][r] = 0x3c003c00u + threadIdx.x + s + r;
  const uint32_t b_addr = smem_addr(smem) + (lane & 7) * 128 + (lane >> 3) * 16;
  const long long c0 = clock64();
  for (int st = 0; st < stages; ++st) {
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t b[2][4];
      ldmatrix_x4(b_addr + kb * 1024, b[0]);
      ldmatrix_x4(b_addr + kb * 1024 + 64, b[1]);
#pragma unroll
      for (int s = 0; s < 4; ++s) mma_m16n8k16(acc[s], a[s], b[s >> 1][(s & 1) * 2], b[s >> 1][(s & 1) * 2 + 1]);
    }
  }
  const long long c1 = clock64();
  float sum = 0.f;
  for (int s = 0; s < 4; ++s)
    for (int r = 0; r < 4; ++r) sum += acc[s][r];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
  if (threadIdx.x % 128 == 0) clocks[blockIdx.x * 4 + threadIdx.x / 128] = c1 - c0;
}

// The consumer cases' stage ring: the 1024-aligned base of the dynamic shared memory (still a shared-memory
// pointer, so the consumers' loads are LDS as in the kernel), filled with arbitrary codes, and its full and
// empty barriers, initialised.
struct StageRing {
  uint8_t* smem;
  uint64_t* full;
  uint64_t* empty;
};
__device__ StageRing init_stage_ring(uint8_t* smem_raw) {
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
  const StageRing ring{smem, full, full + Cfg::kStages};
  fill_smem(smem, Cfg::kBarrierOffset);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&ring.full[s], 1);
      mbar_init(&ring.empty[s], 128 * Cfg::kConsumers);
    }
    fence_barrier_init();
  }
  __syncthreads();
  return ring;
}

// Warpgroup 0's thread 0 plays the weight producer without copying: it waits for a stage to be empty and
// arrives on its full barrier, `stages` times.
__device__ void fake_weight_producer(uint64_t* full, uint64_t* empty, int stages) {
  if (threadIdx.x != 0) return;
  int s = 0;
  uint32_t phase = 0;
  for (int i = 0; i < stages; ++i) {
    mbar_wait(&empty[s], phase ^ 1u);
    mbar_arrive(&full[s]);
    if (++s == Cfg::kStages) {
      s = 0;
      phase ^= 1u;
    }
  }
}

// ---- the consumer loop of the four-consumer tile, every stage ready at once ------------------------
// Warpgroup 0 plays the weight producer (fake_weight_producer); warpgroups 1-4 run consume_pipelined over
// items of `item_stages`.
__global__ void __launch_bounds__(Cfg::kThreads, 1) consumer_kernel(int items, int item_stages, float* out,
                                                                    long long* clocks) {
  extern __shared__ uint8_t smem_raw[];
  const auto [smem, full, empty] = init_stage_ring(smem_raw);
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<Cfg::Regs::kProducer>();
    fake_weight_producer(full, empty, items * item_stages);
    return;
  }
  setmaxnreg_inc<Cfg::Regs::kConsumer>();
  const int tid = threadIdx.x % 128;
  int stage = 0;
  uint32_t phase = 0;
  float total = 0.f;
  const long long c0 = clock64();
  for (int it = 0; it < items; ++it) {
    float acc[Cfg::kM64PerConsumer][accumulator_sets<Cfg::kBN>()][Cfg::kBN / 2] = {};
    consume_pipelined<Cfg>(smem, full, empty, item_stages, wg - 1, tid, acc, stage, phase);
    for (int v = 0; v < accumulator_sets<Cfg::kBN>(); ++v)
      for (int i = 0; i < Cfg::kBN / 2; ++i) total += acc[0][v][i];
  }
  const long long c1 = clock64();
  out[blockIdx.x * blockDim.x + threadIdx.x] = total;
  if (tid == 0) clocks[blockIdx.x * 4 + wg - 1] = c1 - c0;
}

// ---- the e4m3 tile's consumer loop (see the header) --------------------------------------------------
using E4Cfg = TileConfig<256, 8, 256, 5, 1, 4, 8>;  // sm90.w4e4m3.m256n1k256.ws.s5.c4
static_assert(E4Cfg::kStageBytes == Cfg::kStageBytes && E4Cfg::kStages == Cfg::kStages &&
                  E4Cfg::kThreads == Cfg::kThreads,
              "the e4m3 tile consumes the n8 tile's stage ring");

// Warpgroup 0 plays the weight producer; warpgroups 1-4 run consume_item_e4m3 (sm90_consumer.cuh) over
// items of `item_stages`. zero: a run-time 0 (LaunchParams::zero).
__global__ void __launch_bounds__(E4Cfg::kThreads, 1) e4m3_consumer_kernel(int items, int item_stages, float* out,
                                                                          long long* clocks, int zero) {
  extern __shared__ uint8_t smem_raw[];
  const auto [smem, full, empty] = init_stage_ring(smem_raw);
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<E4Cfg::Regs::kProducer>();
    fake_weight_producer(full, empty, items * item_stages);
    return;
  }
  setmaxnreg_inc<E4Cfg::Regs::kConsumer>();
  const int tid = threadIdx.x % 128;
  int stage = 0;
  uint32_t phase = 0;
  float total = 0.f;
  const long long c0 = clock64();
  for (int it = 0; it < items; ++it) {
    float f0, f1;
    consume_item_e4m3<E4Cfg>(smem, full, empty, item_stages, wg - 1, tid, zero, f0, f1, stage, phase);
    total += f0 + f1;
  }
  const long long c1 = clock64();
  out[blockIdx.x * blockDim.x + threadIdx.x] = total;
  if (tid == 0) clocks[blockIdx.x * 4 + wg - 1] = c1 - c0;
}

// The e4m3 wgmmas alone: four warpgroups, each 8 m64n8k32 a stage (two a k64 chunk) on one accumulator,
// A constant: the tensor pipe's cost of the e4m3 loop's math.
__global__ void __launch_bounds__(512, 1) e4m3_wgmma_kernel(int stages, float* out, long long* clocks) {
  extern __shared__ __align__(1024) uint8_t smem[];
  fill_smem(smem, 4096);
  __syncthreads();
  const int wg = threadIdx.x / 128;
  float acc[4] = {};
  uint32_t a[2][4];
  for (int i = 0; i < 2; ++i)
    for (int r = 0; r < 4; ++r) a[i][r] = 0x38383838u ^ (threadIdx.x + i + r);
  const uint64_t desc0 = make_desc_sw128(smem_addr(smem));
  const long long c0 = clock64();
  for (int st = 0; st < stages; ++st) {
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      wgmma_wait<1>();
      wgmma_fence();
      const uint64_t dk = e4m3_chunk_desc(desc0, kb);
      wgmma_e4m3_m64n8k32(acc, a[0], dk, 1);
      wgmma_e4m3_m64n8k32(acc, a[1], dk + 2, 1);
      wgmma_commit();
    }
  }
  wgmma_wait<0>();
  const long long c1 = clock64();
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc[0] + acc[1] + acc[2] + acc[3];
  if (threadIdx.x % 128 == 0) clocks[blockIdx.x * 4 + wg] = c1 - c0;
}

struct Timing {
  double clocks_per_stage[4];  // per warpgroup slot, mean over CTAs
  double mhz;                  // the slowest slot's clocks over the wall time
  double us_per_stage;
};

template <class Launch>
Timing time_case(int sms, int stages, long long* d_clocks, Launch launch) {
  launch();  // warm-up
  FP4MOE_CUDA_THROW(cudaGetLastError());
  FP4MOE_CUDA_THROW(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  FP4MOE_CUDA_THROW(cudaEventCreate(&e0));
  FP4MOE_CUDA_THROW(cudaEventCreate(&e1));
  FP4MOE_CUDA_THROW(cudaEventRecord(e0));
  launch();
  FP4MOE_CUDA_THROW(cudaEventRecord(e1));
  FP4MOE_CUDA_THROW(cudaEventSynchronize(e1));
  float ms = 0.f;
  FP4MOE_CUDA_THROW(cudaEventElapsedTime(&ms, e0, e1));
  FP4MOE_CUDA_THROW(cudaEventDestroy(e0));
  FP4MOE_CUDA_THROW(cudaEventDestroy(e1));
  std::vector<long long> c(static_cast<size_t>(sms) * 4);
  FP4MOE_CUDA_THROW(cudaMemcpy(c.data(), d_clocks, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  Timing t{};
  double worst = 0;
  for (int j = 0; j < 4; ++j) {
    double sum = 0;
    for (int b = 0; b < sms; ++b) sum += static_cast<double>(c[b * 4 + j]);
    t.clocks_per_stage[j] = sum / sms / stages;
    if (sum / sms > worst) worst = sum / sms;
  }
  t.mhz = worst / (ms * 1000.0);
  t.us_per_stage = ms * 1000.0 / stages;
  return t;
}

void print(const char* name, const Timing& t, int slots) {
  std::printf("%-34s %7.1f MHz  %6.3f us/stage  clocks/stage:", name, t.mhz, t.us_per_stage);
  for (int j = 0; j < slots; ++j) std::printf(" %7.1f", t.clocks_per_stage[j]);
  std::printf("\n");
}

constexpr int kSmallSmem = 4096 + 1024;  // the wgmma and mma.sync cases' token tile

// One wgmma case: kActive warpgroups issue, k16 step s into accumulator set s % kSets.
template <int kActive, int kSets>
void wgmma_case(int sms, int stages, float* d_out, long long* d_clocks) {
  FP4MOE_CUDA_THROW(cudaFuncSetAttribute(wgmma_kernel<kActive, kSets>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   kSmallSmem));
  char name[64];
  std::snprintf(name, sizeof name, "wgmma, %d warpgroup%s, %d set%s", kActive, kActive > 1 ? "s" : "", kSets,
                kSets > 1 ? "s" : "");
  print(name, time_case(sms, stages, d_clocks, [&] {
          wgmma_kernel<kActive, kSets><<<sms, 512, kSmallSmem>>>(stages, d_out, d_clocks);
        }), kActive);
}

// Every case, two rounds; 77 where there is no sm_90 GPU. CUDA failures throw fp4moe::Error.
int probe_main(int stages) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  FP4MOE_CUDA_THROW(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("%s is sm_%d%d; the probe's kernels are sm_90a: skipped\n", prop.name, prop.major, prop.minor);
    return 77;
  }
  const int sms = prop.multiProcessorCount;
  float* d_out = nullptr;
  long long* d_clocks = nullptr;
  FP4MOE_CUDA_THROW(cudaMalloc(&d_out, static_cast<size_t>(sms) * Cfg::kThreads * sizeof(float)));
  FP4MOE_CUDA_THROW(cudaMalloc(&d_clocks, static_cast<size_t>(sms) * 4 * sizeof(long long)));
  FP4MOE_CUDA_THROW(cudaMemset(d_clocks, 0, static_cast<size_t>(sms) * 4 * sizeof(long long)));
  std::printf("%s, %d SMs; one CTA per SM, %d stages of k256 (64 m64n8k16 per SM)\n", prop.name, sms, stages);

  const int consumer_smem = Cfg::kBarrierOffset + 2 * Cfg::kStages * 8 + 1024;
  FP4MOE_CUDA_THROW(cudaFuncSetAttribute(mma_sync_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmallSmem));
  FP4MOE_CUDA_THROW(cudaFuncSetAttribute(consumer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, consumer_smem));
  FP4MOE_CUDA_THROW(
      cudaFuncSetAttribute(e4m3_consumer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, consumer_smem));
  FP4MOE_CUDA_THROW(cudaFuncSetAttribute(e4m3_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmallSmem));
  const int item_stages = 24, items = stages / item_stages, consumer_stages = items * item_stages;
  std::printf("consumer loop built with %d accumulator set(s) for N = 8\n", accumulator_sets<Cfg::kBN>());

  for (int round = 0; round < 2; ++round) {
    std::printf("round %d\n", round + 1);
    wgmma_case<1, 4>(sms, stages, d_out, d_clocks);
    wgmma_case<2, 4>(sms, stages, d_out, d_clocks);
    wgmma_case<4, 4>(sms, stages, d_out, d_clocks);
    wgmma_case<1, 1>(sms, stages, d_out, d_clocks);
    wgmma_case<4, 1>(sms, stages, d_out, d_clocks);
    print("mma.sync, 16 warps, 4 sets", time_case(sms, stages, d_clocks, [&] {
            mma_sync_kernel<<<sms, 512, kSmallSmem>>>(stages, d_out, d_clocks);
          }), 4);
    print("consumer loop", time_case(sms, consumer_stages, d_clocks, [&] {
            consumer_kernel<<<sms, Cfg::kThreads, consumer_smem>>>(items, item_stages, d_out, d_clocks);
          }), 4);
    print("e4m3 wgmma, 4 warpgroups (step 48)", time_case(sms, stages, d_clocks, [&] {
            e4m3_wgmma_kernel<<<sms, 512, kSmallSmem>>>(stages, d_out, d_clocks);
          }), 4);
    print("e4m3 tile's loop (consume_item_e4m3)", time_case(sms, consumer_stages, d_clocks, [&] {
            e4m3_consumer_kernel<<<sms, E4Cfg::kThreads, consumer_smem>>>(items, item_stages, d_out, d_clocks, 0);
          }), 4);
  }
  FP4MOE_CUDA_THROW(cudaFree(d_out));
  FP4MOE_CUDA_THROW(cudaFree(d_clocks));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int stages = 4000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--stages") == 0 && i + 1 < argc) {
      stages = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--stages N]\n", argv[0]);
      return 2;
    }
  }
  if (stages < 24) {
    std::fprintf(stderr, "--stages must be at least 24 (one item of the consumer case)\n");
    return 2;
  }
  try {
    return probe_main(stages);
  } catch (const fp4moe::Error& e) {
    std::fprintf(stderr, "sm90_consumer_probe: %s\n", e.what());
    return 1;
  }
}
