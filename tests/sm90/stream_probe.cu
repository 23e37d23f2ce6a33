// The read-streaming ceiling for the weight-streaming GEMMs: 16-byte loads over a large buffer, folded
// into one word per thread so nothing is optimised away. One launch over `bytes` bytes.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4moe {
namespace sm90test {

namespace {
__global__ void stream_read_kernel(const uint4* __restrict__ src, size_t n, uint32_t* __restrict__ sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // practically never true; keeps the loads alive
}
}  // namespace

cudaError_t launch_stream_read(const void* src, size_t bytes, uint32_t* sink, int sms, cudaStream_t s) {
  stream_read_kernel<<<sms * 4, 512, 0, s>>>(static_cast<const uint4*>(src), bytes / 16, sink);
  return cudaGetLastError();
}

}  // namespace sm90test
}  // namespace fp4moe
