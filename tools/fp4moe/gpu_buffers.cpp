#include "gpu_buffers.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "fp4moe/status.h"

#ifdef FP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>

// Turns a failed CUDA runtime call into fp4moe::Error naming the call and the CUDA error.
#define CLI_CUDA_CHECK(call)                                                                      \
  do {                                                                                            \
    const cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess)                                                                      \
      throw ::fp4moe::Error(::fp4moe::StatusCode::kCudaError,                                     \
                            ::fmt::format("{} failed: {} ({})", #call, cudaGetErrorString(err_), \
                                          cudaGetErrorName(err_)));                               \
  } while (0)

namespace fp4moe::cli {

void gpu_set_device(int device) { CLI_CUDA_CHECK(cudaSetDevice(device)); }

void gpu_settle(double ms) {
  if (ms <= 0) return;
  CLI_CUDA_CHECK(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

void gpu_copy_to_host(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return;
  CLI_CUDA_CHECK(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
}

GpuStream::GpuStream() {
  cudaStream_t s = nullptr;
  CLI_CUDA_CHECK(cudaStreamCreate(&s));
  stream_ = s;
}

GpuStream::~GpuStream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void GpuStream::synchronize() const { CLI_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

GpuTimer::GpuTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  CLI_CUDA_CHECK(cudaEventCreate(&a));
  start_ = a;
  CLI_CUDA_CHECK(cudaEventCreate(&b));
  stop_ = b;
}

GpuTimer::~GpuTimer() {
  if (start_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void GpuTimer::start(Stream stream) { CLI_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_), stream)); }
void GpuTimer::stop(Stream stream) { CLI_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop_), stream)); }

float GpuTimer::elapsed_ms() const {
  CLI_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)));
  float ms = 0.0f;
  CLI_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)));
  return ms;
}

}  // namespace fp4moe::cli

#else  // !FP4MOE_HAVE_CUDA

namespace fp4moe::cli {
namespace {
[[noreturn]] void no_cuda() {
  throw Error(StatusCode::kUnsupported, "this build of fp4moe has no CUDA backend (nvcc was not found at build time)");
}
}  // namespace

void gpu_set_device(int) { no_cuda(); }
void gpu_settle(double) { no_cuda(); }
void gpu_copy_to_host(void*, const void*, size_t) { no_cuda(); }
GpuStream::GpuStream() { no_cuda(); }
GpuStream::~GpuStream() = default;
void GpuStream::synchronize() const { no_cuda(); }
GpuTimer::GpuTimer() { no_cuda(); }
GpuTimer::~GpuTimer() = default;
void GpuTimer::start(Stream) { no_cuda(); }
void GpuTimer::stop(Stream) { no_cuda(); }
float GpuTimer::elapsed_ms() const { no_cuda(); }

}  // namespace fp4moe::cli

#endif  // FP4MOE_HAVE_CUDA
