// One device allocation (cudaMalloc), freed on destruction; move-only. The one device buffer of the
// project: the engine's weights and workspace, the CLI's inputs and outputs, the GPU tests and
// microbenchmarks. The header needs no CUDA headers, so code that must compile without them (the CLI's
// commands) can hold one. Every CUDA call is checked: a failure throws Error(kCudaError) naming what
// the buffer is for, its size and the CUDA error. Without CUDA (a build where nvcc was not found) a
// non-empty buffer throws Error(kUnsupported). A buffer of 0 bytes holds no allocation (get() is null).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fp4moe {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, std::string what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

  void upload(const void* host, size_t bytes);    // host -> device (synchronous), bytes <= this->bytes()
  void download(void* host, size_t bytes) const;  // device -> host (synchronous), bytes <= this->bytes()
  void fill(uint8_t value);                       // every byte (e.g. 0xD5 poison)

 private:
  void copy(void* dst, const void* src, size_t bytes, bool to_device) const;  // cudaMemcpy, checked
  void release() noexcept;                                                     // cudaFree, if allocated
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  std::string what_;
};

}  // namespace fp4moe
