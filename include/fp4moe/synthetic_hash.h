// Counter-based generator behind the synthetic weights: the same function on host and device, so the
// GPU engine can generate a 5 GB layer in device memory while the CPU reference regenerates only the
// experts it needs. splitmix64 finaliser over a 64-bit key.
#pragma once
#include <cmath>
#include <cstdint>

#include "fp4moe/dtype.h"

namespace fp4moe {

FP4MOE_HD uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Projection ids inside the key.
enum SyntheticTensor : uint32_t {
  kSynGateCodes = 0, kSynGateScales, kSynUpCodes, kSynUpScales, kSynDownCodes, kSynDownScales,
  kSynRouter, kSynBias, kSynTensorScale,
};
constexpr int64_t kSyntheticSharedExpert = -1;  // expert index used for the shared expert

// 64 random bits for (seed, expert, tensor, word index).
FP4MOE_HD uint64_t synthetic_bits(uint64_t seed, int64_t expert, uint32_t tensor, uint64_t index) {
  uint64_t k = mix64(seed ^ (static_cast<uint64_t>(expert + 2) * 0x632be59bd9b4e019ull));
  k = mix64(k ^ (static_cast<uint64_t>(tensor) << 56) ^ index);
  return k;
}

// Byte i of a synthetic packed-code tensor: any byte is a valid pair of E2M1 codes.
FP4MOE_HD uint8_t synthetic_code_byte(uint64_t seed, int64_t expert, uint32_t tensor, uint64_t i) {
  return static_cast<uint8_t>(synthetic_bits(seed, expert, tensor, i >> 3) >> ((i & 7) * 8));
}

// Block scale byte i: an e4m3fn value in [2^-3, 2^0) * 2^(0..1) with random mantissa: exponent field
// 4..7 and mantissa 0..7 (values 0.125 .. 1.875), never zero or NaN. Together with the tensor scale
// chosen by the generator (1/sqrt(K) scaled) this keeps activations O(1).
FP4MOE_HD uint8_t synthetic_scale_byte(uint64_t seed, int64_t expert, uint32_t tensor, uint64_t i) {
  const uint8_t r = synthetic_code_byte(seed, expert, tensor, i);
  return static_cast<uint8_t>(((4 + (r & 3)) << 3) | ((r >> 2) & 7));
}

// Tensor scale (weight_scale_2) of a synthetic tensor with k input columns (host only: the engine
// passes tensor scales to kernels as parameters). `codes_tensor` is the tensor's codes id
// (kSynGateCodes, kSynUpCodes, kSynDownCodes), so gate and up get different scales.
// (0.30 + 0.10 u) / sqrt(k), u in [0, 1): with E2M1 rms ~3.2 and block scales ~0.9 the weights have
// rms ~1/sqrt(k), so every projection keeps its input's magnitude.
inline float synthetic_tensor_scale(uint64_t seed, int64_t expert, uint32_t codes_tensor, int64_t k) {
  const uint64_t r = synthetic_bits(seed, expert, kSynTensorScale, codes_tensor);
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
  return (0.30f + 0.10f * u) / std::sqrt(static_cast<float>(k));
}

}  // namespace fp4moe
