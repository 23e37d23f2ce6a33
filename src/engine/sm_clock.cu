// The SM clock probe of include/fp4moe/sm_clock.h: lane 0 of one warp reads %globaltimer and clock64
// together until the window has passed; (cycles, ns) go to the slot.
#include <cuda_runtime.h>

#include "fp4moe/sm_clock.h"

namespace fp4moe {

namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void sm_clock_probe_kernel(uint64_t window_ns, uint64_t* slot) {
  if (threadIdx.x != 0) return;
  const uint64_t t0 = global_ns();
  const long long c0 = clock64();
  uint64_t t1;
  long long c1;
  do {
    t1 = global_ns();
    c1 = clock64();
  } while (t1 - t0 < window_ns);
  slot[0] = static_cast<uint64_t>(c1 - c0);
  slot[1] = t1 - t0;
}

}  // namespace

Status enqueue_sm_clock_probe(Stream stream, int64_t window_ns, uint64_t* slot) {
  if (slot == nullptr) return Status(StatusCode::kInvalidArgument, "sm clock probe: null slot");
  if (window_ns < 1000 || window_ns > 10000000)
    return Status(StatusCode::kInvalidArgument,
                  "sm clock probe: window " + std::to_string(window_ns) + " ns is outside [1000, 10000000]");
  sm_clock_probe_kernel<<<1, 32, 0, stream>>>(static_cast<uint64_t>(window_ns), slot);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return Status(StatusCode::kCudaError, std::string("sm clock probe launch failed: ") + cudaGetErrorString(e));
  return Status::ok();
}

}  // namespace fp4moe
