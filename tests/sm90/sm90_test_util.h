// Helpers shared by the sm90 GPU test and microbenchmark: device buffers, random canonical NVFP4
// weights, the per-row CPU reference (reference.h rounding points R3, R4), the device gate.
#pragma once
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include "fp4moe/device_buffer.h"
#include "fp4moe/dtype.h"
#include "fp4moe/nvfp4.h"
#include "fp4moe/tactic.h"
#include "kernels/sm90_wgmma/sm90_family.h"

#define SM90_CUDA_OK(call)                                                                          \
  do {                                                                                              \
    const cudaError_t err_ = (call);                                                                \
    if (err_ != cudaSuccess)                                                                        \
      throw std::runtime_error(fmt::format("{} failed: {}", #call, cudaGetErrorString(err_)));     \
  } while (0)

namespace fp4moe {
namespace sm90test {

// The project's device buffer (fp4moe/device_buffer.h) under the shorthand the sm90 test and
// microbenchmark use: sized at construction, size() for bytes().
class DeviceBuffer : public ::fp4moe::DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : ::fp4moe::DeviceBuffer(bytes, "an sm90 test buffer") {}
  size_t size() const { return bytes(); }
};

// The reference reads the canonical bytes with its own accessors (not sm90::CanonicalView, which the
// pack under test uses), so a mistake in the pack's view of the canonical layout cannot hide.
struct RandomWeights {
  std::vector<uint8_t> canonical;   // codes [E][R][K/2] then scales [E][R][K/16]
  std::vector<float> tensor_scales; // FC1 [E][2], FC2 [E]
  int64_t rows = 0, k = 0, experts = 0;
  uint32_t code(int64_t e, int64_t r, int64_t kk) const {
    const uint8_t b = canonical[(e * rows + r) * (k / 2) + kk / 2];
    return (kk & 1) ? (b >> 4) : (b & 0xFu);
  }
  uint8_t scale(int64_t e, int64_t r, int64_t kk) const {
    return canonical[experts * rows * (k / 2) + (e * rows + r) * (k / 16) + kk / 16];
  }
  // e2m1 * e4m3: the unscaled weight (exact in bf16).
  float unscaled(int64_t e, int64_t r, int64_t kk) const {
    return e2m1_decode(static_cast<uint8_t>(code(e, r, kk))) * e4m3_decode(scale(e, r, kk));
  }
  // Expert e's unscaled weights, [rows][k], decoded by unscaled() on first use and kept: the reference reads
  // every weight once per problem row, and decoding each time made it most of the sm90 tests' run time.
  // Per expert, so a problem of many experts decodes only those its rows use.
  const float* unscaled_rows(int64_t e) const {
    if (decoded.size() != static_cast<size_t>(experts)) decoded.assign(static_cast<size_t>(experts), {});
    std::vector<float>& d = decoded[static_cast<size_t>(e)];
    if (d.empty()) {
      d.resize(static_cast<size_t>(rows * k));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t kk = 0; kk < k; ++kk) d[static_cast<size_t>(r * k + kk)] = unscaled(e, r, kk);
    }
    return d.data();
  }

 private:
  mutable std::vector<std::vector<float>> decoded;  // unscaled_rows' cache: canonical must not change once read
};

// Random codes; block scales mostly around 1 (E4M3 0x30..0x47) with some subnormal, zero and negative
// ones; tensor scales in [0.01, 0.03].
inline RandomWeights random_weights(const GemmProblem& p, std::mt19937& rng) {
  RandomWeights w;
  w.rows = weight_rows(p);
  w.k = p.k;
  w.experts = p.num_experts;
  const int64_t code_bytes = w.experts * w.rows * w.k / 2, scale_bytes = w.experts * w.rows * w.k / 16;
  w.canonical.resize(static_cast<size_t>(code_bytes + scale_bytes));
  for (int64_t i = 0; i < code_bytes; ++i) w.canonical[i] = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < scale_bytes; ++i) {
    const uint32_t pick = rng() % 32;
    uint8_t s = static_cast<uint8_t>(0x30 + rng() % 0x18);
    if (pick == 0) s = static_cast<uint8_t>(rng() % 8);  // zero or subnormal
    if (pick == 1) s |= 0x80;                            // negative
    w.canonical[code_bytes + i] = s;
  }
  const int per = p.op == GemmOp::kFc1SwiGlu ? 2 : 1;
  std::uniform_real_distribution<float> us(0.01f, 0.03f);
  w.tensor_scales.resize(static_cast<size_t>(w.experts * per));
  for (auto& s : w.tensor_scales) s = us(rng);
  return w;
}

// One problem row of expert e: x [K] (bf16 values) -> out [N] (bf16-rounded values), as reference.h
// R3 (FC1: a = bf16(silu(acc_g * s_g) * (acc_u * s_u))) and R4 (FC2: y = bf16(acc * s)).
inline void reference_row(const GemmProblem& p, const RandomWeights& w, int64_t e, const float* x, float* out) {
  const float* we = w.unscaled_rows(e);
  auto dot = [&](int64_t r) {
    const float* row = we + r * w.k;
    double acc = 0;
    for (int64_t k = 0; k < p.k; ++k) acc += static_cast<double>(x[k]) * row[k];
    return static_cast<float>(acc);
  };
  for (int64_t j = 0; j < p.n; ++j) {
    if (p.op == GemmOp::kFc1SwiGlu) {
      const float g = dot(j) * w.tensor_scales[2 * e], u = dot(p.n + j) * w.tensor_scales[2 * e + 1];
      out[j] = round_bf16(g / (1.0f + std::exp(-g)) * u);
    } else {
      out[j] = round_bf16(dot(j) * w.tensor_scales[e]);
    }
  }
}

// 0 when device 0 is an sm_90 GPU; 77 (ctest skip) otherwise, with the reason on stderr.
inline int skip_unless_sm90() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "no CUDA device: skipping the sm90 GPU tests\n");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9 || prop.minor != 0) {
    std::fprintf(stderr, "device 0 is not sm_90 (%s): the sm_90a family cannot run, skipping\n", prop.name);
    return 77;
  }
  return 0;
}

inline cudaFuncAttributes kernel_attributes(const GroupedGemmTactic& t) {
  cudaFuncAttributes a{};
  const Status s = sm90::kernel_resources(t.desc().name, &a);
  if (!s.is_ok()) throw std::runtime_error(s.to_string());
  return a;
}

}  // namespace sm90test
}  // namespace fp4moe
