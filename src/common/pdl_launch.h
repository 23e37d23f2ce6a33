// Programmatic dependent launch (PDL): kernels of one forward launched so that each may be scheduled
// while its predecessor on the stream is still finishing, which removes most of the launch gap between
// the short kernels of a decode step (routing, permutation, FC1, FC2). CUDA-runtime header for .cu files.
//
// Contract of a kernel launched through launch_pdl: it calls pdl_wait() (griddepcontrol.wait) before its
// first access to memory that an earlier kernel of the stream writes or reads; pdl_wait returns once every
// prerequisite grid has completed and its writes are visible. It may call pdl_launch_dependents()
// (griddepcontrol.launch_dependents) early so that the next kernel is scheduled while this one runs: that
// affects scheduling only, never visibility. On devices before sm_90 both are no-ops and the launch
// attribute is left off, so the launch is an ordinary stream-ordered one. Inside a CUDA graph capture the
// attribute becomes a programmatic edge of the graph.
// On by default; FP4MOE_PDL=0 turns the attribute off. On the H200 it made no difference to the
// CUDA-graph forward at first (within 1%, docs/perf.md step 6) and compute-sanitizer racecheck did not
// finish the engine forward with it on, so it stayed off; with the kernels of sm90 steps 22-24 it
// measured 1-2% faster at decode and the whole GPU check, racecheck included, passes with it on. The
// kernels call pdl_wait() either way (a no-op without the attribute) and trigger only at exit: with
// early triggers the next GEMM's CTAs took SM slots the shared expert's side stream needed (T = 8
// forward 489 -> 507 us). The exception is the sm90 resident tactic, which triggers at its start: 0.1-0.2 us a
// layer where the engine's heuristic takes it (one wave, the shared expert folded into its launch; docs/perf.md,
// sm90 step 73). Forced by name beside the side stream's shared expert, or with FP4MOE_FOLD_SHARED=0, the early
// trigger may cost the side stream SMs as before: FP4MOE_SM90_CC_EARLY_TRIGGER=0 turns it off.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "common/env.h"

namespace fp4moe {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device get the programmatic-serialization attribute (sm_90 or newer,
// unless FP4MOE_PDL=0). Cached per device ordinal.
inline bool pdl_enabled() {
  static const bool requested = env_switch("FP4MOE_PDL", true);
  if (!requested) return false;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0 unknown, 1 yes, 2 no (zero-initialised: static storage)
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess;
    v = ok && major >= 9 ? 1 : 2;
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute where enabled. Returns the launch
// error (cudaLaunchKernelEx's), like cudaGetLastError after a triple-chevron launch.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace fp4moe
