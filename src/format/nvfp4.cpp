// NVFP4 encode/decode, packing and the reference quantiser (shared/DESIGN.md section 2).
//
// This file is the specification of the format for the rest of fp4moe: the math is written out
// plainly, in fp32, in a fixed order, so that an independent implementation (tests/format/
// check_format.py, NumPy + ml_dtypes) reproduces every code, scale and dequantised value bit for bit.
//
// Quantisation of w [n, k], all arithmetic in IEEE fp32 (round to nearest even, no fused ops):
//   amax          = max |w|
//   tensor_scale  = amax / 2688            (2688 = 6 * 448; 1 when that is 0, i.e. amax == 0 or
//                                           amax so small that the quotient underflows)
//   per block of 16 along k:
//     block_amax  = max |w| over the block
//     scale byte  = e4m3_encode((block_amax / 6) / tensor_scale); a byte decoding to 0 becomes 1.0
//     s           = e4m3_decode(scale byte)
//     code        = e2m1_encode(w / (s * tensor_scale))
// Dequantisation: (e2m1_decode(code) * s) * tensor_scale (the product in brackets is exact).
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fp4moe/nvfp4.h"
#include "fp4moe/status.h"

namespace fp4moe {

uint8_t e2m1_encode(float x) {
  if (std::isnan(x)) return 0x0;  // documented: NaN -> +0 (E2M1 has no NaN)
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);   // +Inf falls through to the saturating last branch
  // Representable magnitudes by code: 0:0 1:0.5 2:1 3:1.5 4:2 5:3 6:4 7:6. The thresholds are the
  // midpoints between neighbours; at a midpoint the even code wins (round half to even), hence
  // "<=" where the lower neighbour's code is even and "<" where it is odd.
  uint8_t mag;
  if (a <= 0.25f) mag = 0;        // tie 0.25 -> 0 (code 0)
  else if (a < 0.75f) mag = 1;    // tie 0.75 -> 1.0 (code 2)
  else if (a <= 1.25f) mag = 2;   // tie 1.25 -> 1.0 (code 2)
  else if (a < 1.75f) mag = 3;    // tie 1.75 -> 2.0 (code 4)
  else if (a <= 2.5f) mag = 4;    // tie 2.5  -> 2.0 (code 4)
  else if (a < 3.5f) mag = 5;     // tie 3.5  -> 4.0 (code 6)
  else if (a <= 5.0f) mag = 6;    // tie 5.0  -> 4.0 (code 6)
  else mag = 7;                   // above 5: 6.0, saturating (incl. +Inf)
  return sign | mag;
}

uint8_t e4m3_encode(float x) {
  if (std::isnan(x)) return 0x7F;  // documented: the e4m3fn NaN
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= kE4M3Max) return sign | 0x7E;  // saturate finite values and Inf at 448 (exp 15, man 6)

  // Subnormal range (a < 2^-6, the smallest normal): the value is man * 2^-9, man in 0..7.
  // a * 512 is exact; rounding it to the nearest integer, ties to even, gives man. man == 8 is
  // 2^-6, whose encoding (exp 1, man 0) is also the byte 0x08, so it needs no special case.
  if (a < 0x1p-6f) {
    const float man = std::nearbyint(a * 512.0f);  // default rounding mode: to nearest, ties to even
    return sign | static_cast<uint8_t>(man);
  }

  // Normal range: a = f * 2^e with f in [1, 2), e in [-6, 8]. The 3-bit mantissa is
  // round(f * 8) - 8; f * 8 is exact (a power-of-two scaling of a normal fp32).
  int e2 = 0;
  std::frexp(a, &e2);              // a = g * 2^e2, g in [0.5, 1)
  int e = e2 - 1;
  float m = std::nearbyint(std::ldexp(a, 3 - e));  // in [8, 16]
  if (m == 16.0f) {                // rounded up to the next power of two
    m = 8.0f;
    e += 1;
  }
  // a < 448 rounds to at most 448 (e = 8, m = 14), so the byte never reaches the NaN pattern.
  const int biased = e + 7;        // 1..15
  return sign | static_cast<uint8_t>((biased << 3) | (static_cast<int>(m) - 8));
}

namespace {

void check_packed_sizes(const PackedNvfp4Weights& q, const char* who) {
  FP4MOE_CHECK(q.n >= 0 && q.k >= 0 && q.k % kNvfp4BlockSize == 0, StatusCode::kInvalidArgument,
               "{}: NVFP4 weight has shape [{}, {}]; need n >= 0, k >= 0 and k a multiple of {}", who, q.n,
               q.k, kNvfp4BlockSize);
  const uint64_t codes = static_cast<uint64_t>(q.n) * static_cast<uint64_t>(q.k / 2);
  const uint64_t scales = static_cast<uint64_t>(q.n) * static_cast<uint64_t>(q.k / kNvfp4BlockSize);
  FP4MOE_CHECK(q.codes.size() == codes && q.scales.size() == scales, StatusCode::kInvalidArgument,
               "{}: NVFP4 weight [{}, {}] needs {} code bytes and {} scale bytes, found {} and {}", who, q.n,
               q.k, codes, scales, q.codes.size(), q.scales.size());
}

}  // namespace

float PackedNvfp4Weights::at_unscaled(int64_t r, int64_t c) const {
  FP4MOE_CHECK(r >= 0 && r < n && c >= 0 && c < k, StatusCode::kInvalidArgument,
               "PackedNvfp4Weights::at: element ({}, {}) is outside the weight [{}, {}]", r, c, n, k);
  FP4MOE_CHECK(codes.size() == static_cast<size_t>(n * (k / 2)) &&
                   scales.size() == static_cast<size_t>(n * (k / kNvfp4BlockSize)),
               StatusCode::kInvalidArgument,
               "PackedNvfp4Weights::at: weight [{}, {}] holds {} code bytes and {} scale bytes, expected {} and {}",
               n, k, codes.size(), scales.size(), n * (k / 2), n * (k / kNvfp4BlockSize));
  const uint8_t byte = codes[static_cast<size_t>(r * (k / 2) + c / 2)];
  const uint8_t code = (c & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xF);
  const uint8_t scale = scales[static_cast<size_t>(r * (k / kNvfp4BlockSize) + c / kNvfp4BlockSize)];
  return e2m1_decode(code) * e4m3_decode(scale);
}

float PackedNvfp4Weights::at(int64_t r, int64_t c) const { return at_unscaled(r, c) * tensor_scale; }

void pack_e2m1(const uint8_t* codes, int64_t count, uint8_t* packed) {
  FP4MOE_CHECK(count >= 0 && count % 2 == 0, StatusCode::kInvalidArgument,
               "pack_e2m1: count = {} must be even and non-negative (two codes per byte)", count);
  if (count == 0) return;
  FP4MOE_CHECK(codes != nullptr && packed != nullptr, StatusCode::kInvalidArgument,
               "pack_e2m1: null pointer for {} codes", count);
  for (int64_t i = 0; i < count / 2; ++i) {
    const uint8_t lo = codes[2 * i], hi = codes[2 * i + 1];
    FP4MOE_CHECK(lo <= 0xF && hi <= 0xF, StatusCode::kInvalidArgument,
                 "pack_e2m1: code {} at index {} does not fit in 4 bits", lo > 0xF ? lo : hi,
                 lo > 0xF ? 2 * i : 2 * i + 1);
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void unpack_e2m1(const uint8_t* packed, int64_t count, uint8_t* codes) {
  FP4MOE_CHECK(count >= 0 && count % 2 == 0, StatusCode::kInvalidArgument,
               "unpack_e2m1: count = {} must be even and non-negative (two codes per byte)", count);
  if (count == 0) return;
  FP4MOE_CHECK(codes != nullptr && packed != nullptr, StatusCode::kInvalidArgument,
               "unpack_e2m1: null pointer for {} codes", count);
  for (int64_t i = 0; i < count / 2; ++i) {
    codes[2 * i] = packed[i] & 0xF;
    codes[2 * i + 1] = packed[i] >> 4;
  }
}

PackedNvfp4Weights quantize_nvfp4(const float* w, int64_t n, int64_t k, const char* what) {
  if (what == nullptr) what = "weight";
  FP4MOE_CHECK(n >= 0 && k >= 0, StatusCode::kInvalidArgument, "{}: shape [{}, {}] has a negative dimension",
               what, n, k);
  FP4MOE_CHECK(k % kNvfp4BlockSize == 0, StatusCode::kInvalidArgument,
               "{}: shape [{}, {}]: k = {} is not a multiple of {} (NVFP4 needs whole blocks of {} "
               "elements along k)",
               what, n, k, k, kNvfp4BlockSize, kNvfp4BlockSize);
  FP4MOE_CHECK(k == 0 || n <= std::numeric_limits<int64_t>::max() / k, StatusCode::kInvalidArgument,
               "{}: shape [{}, {}] is too large", what, n, k);
  FP4MOE_CHECK(w != nullptr || n * k == 0, StatusCode::kInvalidArgument, "{}: null data for shape [{}, {}]",
               what, n, k);

  PackedNvfp4Weights q;
  q.n = n;
  q.k = k;
  q.codes.assign(static_cast<size_t>(n * (k / 2)), 0);
  q.scales.assign(static_cast<size_t>(n * (k / kNvfp4BlockSize)), 0);
  q.tensor_scale = 1.0f;

  // Tensor amax, rejecting non-finite elements.
  float amax = 0.0f;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const float v = w[r * k + c];
      FP4MOE_CHECK(std::isfinite(v), StatusCode::kInvalidArgument,
                   "{}: element at row {}, col {} of shape [{}, {}] is {}; NVFP4 quantisation needs finite values",
                   what, r, c, n, k, v);
      amax = std::fmax(amax, std::fabs(v));
    }
  }

  float tensor_scale = amax / (kE2M1Max * kE4M3Max);  // 6 * 448 = 2688 exactly
  if (tensor_scale == 0.0f) tensor_scale = 1.0f;       // all-zero (or denormal-tiny) tensor
  q.tensor_scale = tensor_scale;

  const int64_t blocks = k / kNvfp4BlockSize;
  const uint8_t one = e4m3_encode(1.0f);
  std::vector<uint8_t> codes(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    const float* row = w + r * k;
    for (int64_t b = 0; b < blocks; ++b) {
      const float* blk = row + b * kNvfp4BlockSize;
      float block_amax = 0.0f;
      for (int i = 0; i < kNvfp4BlockSize; ++i) block_amax = std::fmax(block_amax, std::fabs(blk[i]));

      uint8_t scale = e4m3_encode(block_amax / kE2M1Max / tensor_scale);
      if (e4m3_decode(scale) == 0.0f) scale = one;  // a zero block scale becomes 1
      q.scales[static_cast<size_t>(r * blocks + b)] = scale;

      const float denom = e4m3_decode(scale) * tensor_scale;
      for (int i = 0; i < kNvfp4BlockSize; ++i)
        codes[static_cast<size_t>(b * kNvfp4BlockSize + i)] = e2m1_encode(blk[i] / denom);
    }
    pack_e2m1(codes.data(), k, q.codes.data() + r * (k / 2));
  }
  return q;
}

std::vector<float> dequantize_nvfp4(const PackedNvfp4Weights& q) {
  check_packed_sizes(q, "dequantize_nvfp4");
  std::vector<float> out(static_cast<size_t>(q.n * q.k));
  const int64_t blocks = q.k / kNvfp4BlockSize;
  for (int64_t r = 0; r < q.n; ++r) {
    for (int64_t c = 0; c < q.k; ++c) {
      const uint8_t byte = q.codes[static_cast<size_t>(r * (q.k / 2) + c / 2)];
      const uint8_t code = (c & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xF);
      const float s = e4m3_decode(q.scales[static_cast<size_t>(r * blocks + c / kNvfp4BlockSize)]);
      out[static_cast<size_t>(r * q.k + c)] = (e2m1_decode(code) * s) * q.tensor_scale;
    }
  }
  return out;
}

}  // namespace fp4moe
