// The NVFP4 format (shared/DESIGN.md section 2): FP4 E2M1 elements, two per byte along K (element 2i
// in the low nibble), one FP8 E4M3 (e4m3fn) block scale per 16 elements along K, one FP32 tensor
// scale. w = e2m1(code) * e4m3(block_scale) * tensor_scale.
//
// Special values (documented behaviour):
//  - e2m1_encode: round to nearest, ties to even, saturate at +-6. NaN encodes to +0 (code 0x0):
//    E2M1 has no NaN and a NaN weight is a broken checkpoint; quantize_nvfp4 rejects NaN/Inf input
//    with an error before encoding, so this path is reached only by direct calls. +-Inf saturates to +-6.
//  - e4m3_encode (e4m3fn: max 448, no Inf): round to nearest even, saturate finite values and +-Inf
//    to +-448; NaN encodes to 0x7F (the e4m3fn NaN). Values below half the smallest subnormal (2^-10)
//    round to signed zero.
//  - Decoding is total: every E2M1 code and every E4M3 byte has a value (0x7F/0xFF decode to NaN).
#pragma once
#include <cstdint>
#include <vector>

#include "fp4moe/dtype.h"

namespace fp4moe {

constexpr int kNvfp4BlockSize = 16;   // elements per E4M3 block scale
constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;

// E2M1 code (low 4 bits: sign bit 3, exponent bits 2..1, mantissa bit 0) <-> float.
FP4MOE_HD float e2m1_decode(uint8_t code) {
  // Magnitudes for codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float m = mag[code & 7u];
  return (code & 8u) ? -m : m;
}
uint8_t e2m1_encode(float x);

// E4M3 (e4m3fn, bias 7) byte <-> float.
FP4MOE_HD float e4m3_decode(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 0xF, man = b & 7;
  float v;
  if (exp == 0xF && man == 7) {
    const uint32_t qnan = 0x7fc00000u;
    memcpy(&v, &qnan, 4);
  } else if (exp == 0) {
    v = static_cast<float>(man) * (1.0f / 512.0f);  // subnormal: man * 2^-9
  } else {
    // (1 + man/8) * 2^(exp-7), built exactly.
    uint32_t u = (static_cast<uint32_t>(exp - 7 + 127) << 23) | (static_cast<uint32_t>(man) << 20);
    memcpy(&v, &u, 4);
  }
  return sign ? -v : v;
}
uint8_t e4m3_encode(float x);

// A weight [n, k] in NVFP4. k must be a multiple of 16.
struct PackedNvfp4Weights {
  int64_t n = 0;                 // output rows
  int64_t k = 0;                 // input columns (elements)
  std::vector<uint8_t> codes;    // [n, k/2]  element 2i low nibble, 2i+1 high nibble
  std::vector<uint8_t> scales;   // [n, k/16] e4m3fn block scales
  float tensor_scale = 1.0f;     // weight_scale_2

  bool empty() const { return n == 0; }
  // Dequantised element (r, c): e2m1 * e4m3 * tensor_scale, computed in fp32.
  float at(int64_t r, int64_t c) const;
  // e2m1 * e4m3 only (exact in bf16); the GPU path multiplies the tensor scale in the epilogue.
  float at_unscaled(int64_t r, int64_t c) const;
};

// Packs 4-bit codes (one per byte, low nibble) two per byte: out[i] = c[2i] | c[2i+1] << 4.
// count must be even.
void pack_e2m1(const uint8_t* codes, int64_t count, uint8_t* packed);
void unpack_e2m1(const uint8_t* packed, int64_t count, uint8_t* codes);

// Quantises w [n, k] (row-major fp32) as DESIGN.md section 2 says:
//   tensor_scale = amax / (6 * 448) (1.0 when amax == 0), block scale = e4m3(block_amax / 6 / tensor_scale)
//   (a zero block scale becomes 1.0), code = e2m1(w / (block_scale * tensor_scale)).
// Throws Error(kInvalidArgument) when k % 16 != 0 or n/k < 0 (naming `what`), or when w holds NaN/Inf
// (naming the element).
PackedNvfp4Weights quantize_nvfp4(const float* w, int64_t n, int64_t k, const char* what = "weight");
// Dequantises to fp32 [n, k] (tensor scale included).
std::vector<float> dequantize_nvfp4(const PackedNvfp4Weights& q);

}  // namespace fp4moe
