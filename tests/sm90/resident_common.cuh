// Device pieces the two resident-weights probes share (resident_probe.cu, resident_gemm.cu): the timeline
// stamp and the publication through a per-pair counter that only grows.
#pragma once
#include <cstdint>

#include "kernels/sm90_wgmma/sm90_ptx.cuh"

namespace fp4moe {
namespace sm90test {

// %globaltimer (ns) into stamps[i] (thread 0 of the CTA; nothing when stamps is null).
__device__ __forceinline__ void resident_stamp(unsigned long long* stamps, int i) {
  if (stamps != nullptr && threadIdx.x == 0) {
    unsigned long long g;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
    stamps[i] = g;
  }
}

// One CTA of `parts` publishes (its stores before it made visible at GPU scope, then the counter raised)
// and returns the count at which every CTA of this launch's round has: counters only grow, so the target
// is the end of the round the CTA's own increment fell in. Thread 0 only.
__device__ __forceinline__ unsigned resident_publish(unsigned* counter, unsigned parts) {
  __threadfence();
  return (atomicAdd(counter, 1u) / parts + 1) * parts;
}

// Spins until the counter has reached `target` (thread 0 only).
__device__ __forceinline__ void resident_wait(const unsigned* counter, unsigned target) {
  while (static_cast<unsigned>(sm90::ld_acquire_gpu(reinterpret_cast<const int*>(counter))) < target) {
  }
}

}  // namespace sm90test
}  // namespace fp4moe
