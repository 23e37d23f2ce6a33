// Helpers for the GPU tests: device buffers, random inputs, host-side canonical weight buffers, and the
// relative L2 error on bf16 outputs. Every check compares against the CPU reference
// (include/fp4moe/reference.h) with the same dequantised weights.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/tactic.h"
#include "fp4moe/weights.h"

namespace fp4moe::test {

#define CUDA_OK(call)                                                                          \
  do {                                                                                         \
    const cudaError_t e_ = (call);                                                             \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);                      \
  } while (0)

constexpr uint8_t kPoison = 0xD5;  // outputs are filled with this byte before every run

// A device allocation freed on destruction.
class Dev {
 public:
  Dev() = default;
  explicit Dev(size_t bytes);
  ~Dev();
  Dev(Dev&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  Dev& operator=(Dev&& o) noexcept;
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  void* get() const { return p_; }
  size_t bytes() const { return n_; }
  void poison() const;  // every byte = kPoison
  template <typename T>
  static Dev from(const std::vector<T>& host) {
    Dev d(host.size() * sizeof(T));
    d.upload(host.data(), host.size() * sizeof(T));
    return d;
  }
  void upload(const void* host, size_t bytes) const;
  template <typename T>
  std::vector<T> download(size_t count) const {
    std::vector<T> v(count);
    download_raw(v.data(), count * sizeof(T));
    return v;
  }
  void download_raw(void* host, size_t bytes) const;

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// bf16 bits of N(0, sigma) values.
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float sigma = 1.0f);
std::vector<float> random_f32(size_t n, uint64_t seed, float sigma = 1.0f);
std::vector<float> bf16_to_f32(const std::vector<uint16_t>& v);

// A random NVFP4 weight [n, k]: uniform codes, block scales with exponent field 4..9 (0.125 .. 7.5)
// unless `scale_bytes` is given, tensor scale ts.
LinearWeights random_nvfp4(int64_t n, int64_t k, uint64_t seed, float ts);
// A random NVFP4 expert (gate/up [I, H], down [H, I]), tensor scales ~ 1/sqrt(k) so outputs stay O(1).
ExpertWeights random_expert(int64_t hidden, int64_t inter, uint64_t seed);
// The same expert with bf16 weights (for the bf16 shared-expert path).
ExpertWeights random_bf16_expert(int64_t hidden, int64_t inter, uint64_t seed);

// Canonical buffer bytes (codes [E][Nw][K/2] then scales [E][Nw][K/16]) and tensor scales of a GEMM
// over `experts`: FC1 stacks gate then up rows, FC2 uses down.
void canonical_host(const std::vector<ExpertWeights>& experts, GemmOp op, std::vector<uint8_t>* bytes,
                    std::vector<float>* tensor_scales);

// Relative L2 error of bf16 outputs against bf16 reference values.
double rel_l2_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& ref);
double rel_l2_bf16(const uint16_t* got, const uint16_t* ref, size_t n);

// Every tactic that this build can run on device 0 for `problem` (with the reason for the others in
// *skipped), in registry order.
std::vector<GroupedGemmTactic*> runnable_tactics(const GemmProblem& problem, std::vector<std::string>* skipped);

// Counts of NaN/Inf/poison words in bf16 data.
size_t count_poison(const std::vector<uint16_t>& v);

}  // namespace fp4moe::test
