// The few CUDA runtime calls the CLI needs around MoeEngine::forward (a stream, event timing; device
// buffers are fp4moe::DeviceBuffer), behind a plain C++ interface so that the commands compile without
// CUDA headers. Every call
// is checked: a failure throws fp4moe::Error(kCudaError) naming the call. In builds without CUDA every
// constructor throws Error(kUnsupported).
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp4moe/device_buffer.h"
#include "fp4moe/tactic.h"  // fp4moe::Stream

namespace fp4moe::cli {

// Makes `device` current for this thread.
void gpu_set_device(int device);

// Waits for the device, then leaves it idle `ms` milliseconds (nothing when ms <= 0). Timing right after a
// large cudaFree measures the driver's work after it too: it slows the next ~10 ms of kernels (the
// engine's set-up frees its staging copy of the weights; docs/perf.md, sm90 step 60). kSettleMs is the
// pause `fp4moe run` and `fp4moe bench` take before they time anything.
constexpr double kSettleMs = 50;
void gpu_settle(double ms);

// Copies `bytes` from device memory to host memory (synchronous).
void gpu_copy_to_host(void* host, const void* device, size_t bytes);

// A blocking stream (cudaStreamCreate), destroyed on destruction.
class GpuStream {
 public:
  GpuStream();
  ~GpuStream();
  GpuStream(const GpuStream&) = delete;
  GpuStream& operator=(const GpuStream&) = delete;
  Stream get() const { return stream_; }
  void synchronize() const;

 private:
  Stream stream_ = nullptr;
};

// Two events around work on a stream; elapsed_ms() waits for the stop event.
class GpuTimer {
 public:
  GpuTimer();
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;
  void start(Stream stream);
  void stop(Stream stream);
  float elapsed_ms() const;

 private:
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

}  // namespace fp4moe::cli
