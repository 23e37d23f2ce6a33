// The fp32 values of the synthetic router weight and correction bias, one element at a time, shared by
// the host generator (src/reference/synthetic.cpp) and device code that must produce identical values.
// Every formula is integer -> float conversion and fp32 multiplies only (each exactly rounded in IEEE
// arithmetic on host and device alike, with no fused multiply-add possible), so host and device agree
// bit for bit. The only non-trivial constant, the router scale 4 / sqrt(H), is computed once on the
// host by synthetic_router_scale() and passed to kernels as a parameter.
//
//   u(bits)          = (int32(bits >> 40) - 2^23) * 2^-23          uniform in [-1, 1), 24-bit grid, exact
//   router[e, h]     = bf16_round(u(synthetic_bits(seed, 0, kSynRouter, e * H + h)) * (4 / sqrt(H)))
//   bias[e]          = u(synthetic_bits(seed, 0, kSynBias, e)) * 0.05f    (fp32, only when the config
//                      has a correction bias; zeros otherwise)
// The expert tensors (codes, block scales, tensor scales) are defined in synthetic_hash.h:
//   codes byte i   = synthetic_code_byte(seed, e, kSyn{Gate,Up,Down}Codes, i)  over row-major [N, K/2]
//   scales byte i  = synthetic_scale_byte(seed, e, kSyn{Gate,Up,Down}Scales, i) over row-major [N, K/16]
//   tensor scale   = synthetic_tensor_scale(seed, e, kSyn{Gate,Up,Down}Codes, K)
// with e = kSyntheticSharedExpert and N = shared_inter for the shared expert.
#pragma once
#include <cmath>
#include <cstdint>

#include "fp4moe/dtype.h"
#include "fp4moe/synthetic_hash.h"

namespace fp4moe {

// Uniform in [-1, 1) from the top 24 bits of a 64-bit word; the int -> float conversion is exact.
FP4MOE_HD float synthetic_uniform_pm1(uint64_t bits) {
  const int32_t m = static_cast<int32_t>(bits >> 40) - (1 << 23);  // -2^23 .. 2^23 - 1
  return static_cast<float>(m) * (1.0f / 8388608.0f);
}

// 4 / sqrt(H) in fp32 (host only; IEEE sqrt and division are correctly rounded, so the value is well
// defined; device code receives it as a parameter).
inline float synthetic_router_scale(int64_t hidden) {
  return 4.0f / std::sqrt(static_cast<float>(hidden));
}

// Router weight element `index` = e * H + h of [E, H], already rounded to bf16 (returned as fp32).
// `scale` is synthetic_router_scale(H).
FP4MOE_HD float synthetic_router_value(uint64_t seed, uint64_t index, float scale) {
  return round_bf16(synthetic_uniform_pm1(synthetic_bits(seed, 0, kSynRouter, index)) * scale);
}

constexpr float kSyntheticBiasRange = 0.05f;  // correction bias uniform in [-0.05, 0.05)

// e_score_correction_bias[e] (fp32, not rounded).
FP4MOE_HD float synthetic_bias_value(uint64_t seed, int64_t expert) {
  return synthetic_uniform_pm1(synthetic_bits(seed, 0, kSynBias, static_cast<uint64_t>(expert))) *
         kSyntheticBiasRange;
}

}  // namespace fp4moe
