// quantize_nvfp4 / dequantize_nvfp4: properties and errors. (Bit-exact agreement with an independent
// implementation is checked by check_format.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp4moe/nvfp4.h"
#include "fp4moe/status.h"

namespace fp4moe {
namespace {

// Runs f, which must throw Error(code); returns its message.
template <typename F>
std::string error_of(F&& f, StatusCode code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

uint8_t code_at(const PackedNvfp4Weights& q, int64_t r, int64_t c) {
  const uint8_t b = q.codes[static_cast<size_t>(r * (q.k / 2) + c / 2)];
  return (c & 1) ? b >> 4 : b & 0xF;
}

TEST(Quantize, AllZeroTensorGivesZerosNeverNaN) {
  for (float z : {0.0f, -0.0f}) {
    std::vector<float> w(4 * 32, z);
    const PackedNvfp4Weights q = quantize_nvfp4(w.data(), 4, 32);
    EXPECT_EQ(q.n, 4);
    EXPECT_EQ(q.k, 32);
    EXPECT_EQ(q.tensor_scale, 1.0f);
    ASSERT_EQ(q.scales.size(), 8u);
    for (uint8_t s : q.scales) EXPECT_EQ(e4m3_decode(s), 1.0f);
    ASSERT_EQ(q.codes.size(), 64u);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 32; ++c) EXPECT_EQ(e2m1_decode(code_at(q, r, c)), 0.0f);
    for (float v : dequantize_nvfp4(q)) EXPECT_EQ(v, 0.0f);
  }
}

TEST(Quantize, EmptyShapes) {
  const PackedNvfp4Weights a = quantize_nvfp4(nullptr, 0, 64);
  EXPECT_TRUE(a.empty());
  EXPECT_TRUE(a.codes.empty() && a.scales.empty());
  EXPECT_TRUE(dequantize_nvfp4(a).empty());
  const PackedNvfp4Weights b = quantize_nvfp4(nullptr, 3, 0);
  EXPECT_EQ(b.n, 3);
  EXPECT_TRUE(dequantize_nvfp4(b).empty());
}

TEST(Quantize, KNotMultipleOf16IsAnError) {
  std::vector<float> w(4 * 24, 1.0f);
  const std::string msg = error_of([&] { quantize_nvfp4(w.data(), 4, 24, "layers.3.experts.7.up_proj"); },
                                   StatusCode::kInvalidArgument);
  expect_contains(msg, "layers.3.experts.7.up_proj");
  expect_contains(msg, "[4, 24]");
  expect_contains(msg, "multiple of 16");
}

TEST(Quantize, BadShapesAndPointers) {
  std::vector<float> w(16, 1.0f);
  expect_contains(error_of([&] { quantize_nvfp4(w.data(), -1, 16, "wq"); }, StatusCode::kInvalidArgument), "wq");
  expect_contains(error_of([&] { quantize_nvfp4(nullptr, 1, 16, "wq"); }, StatusCode::kInvalidArgument), "null");
  expect_contains(
      error_of([&] { quantize_nvfp4(w.data(), std::numeric_limits<int64_t>::max() / 8, 16, "wq"); },
               StatusCode::kInvalidArgument),
      "too large");
}

TEST(Quantize, NonFiniteElementIsNamed) {
  std::vector<float> w(3 * 32, 0.5f);
  w[2 * 32 + 5] = std::numeric_limits<float>::quiet_NaN();
  std::string msg = error_of([&] { quantize_nvfp4(w.data(), 3, 32, "gate_proj"); }, StatusCode::kInvalidArgument);
  expect_contains(msg, "gate_proj");
  expect_contains(msg, "row 2");
  expect_contains(msg, "col 5");
  expect_contains(msg, "nan");
  expect_contains(msg, "[3, 32]");
  w[2 * 32 + 5] = 0.5f;
  w[1 * 32 + 31] = -std::numeric_limits<float>::infinity();
  msg = error_of([&] { quantize_nvfp4(w.data(), 3, 32, "down_proj"); }, StatusCode::kInvalidArgument);
  expect_contains(msg, "row 1, col 31");
  expect_contains(msg, "-inf");
}

// Every block holds each of the 16 E2M1 values once (so every block's amax is 6): the codes must come
// back exactly as constructed, at the packed positions the layout defines.
TEST(Quantize, ExactE2M1InputsKeepTheirCodes) {
  const int64_t n = 5, k = 64;
  std::mt19937 rng(3);
  std::vector<uint8_t> expect(static_cast<size_t>(n * k));
  std::vector<float> w(expect.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t b = 0; b < k / 16; ++b) {
      uint8_t perm[16];
      for (int i = 0; i < 16; ++i) perm[i] = static_cast<uint8_t>(i);
      std::shuffle(perm, perm + 16, rng);
      for (int i = 0; i < 16; ++i) {
        const size_t idx = static_cast<size_t>(r * k + b * 16 + i);
        expect[idx] = perm[i];
        w[idx] = e2m1_decode(perm[i]);
      }
    }
  }
  const PackedNvfp4Weights q = quantize_nvfp4(w.data(), n, k);
  EXPECT_EQ(q.tensor_scale, 6.0f / 2688.0f);
  for (uint8_t s : q.scales) EXPECT_EQ(s, 0x7E);  // 448
  const std::vector<float> deq = dequantize_nvfp4(q);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const size_t idx = static_cast<size_t>(r * k + c);
      const uint8_t byte = q.codes[static_cast<size_t>(r * (k / 2) + c / 2)];
      ASSERT_EQ((c % 2 == 0) ? (byte & 0xF) : (byte >> 4), expect[idx]) << r << "," << c;
      EXPECT_NEAR(deq[idx], w[idx], 1e-6f);
      EXPECT_EQ(deq[idx], q.at(r, c));
      EXPECT_EQ(q.at_unscaled(r, c), e2m1_decode(expect[idx]) * 448.0f);
    }
  }
}

// Half the distance to the next E2M1 magnitude above |v| (the worst rounding error at |v| <= 6).
float e2m1_half_gap(float v) {
  const float a = std::fabs(v);
  return a < 2.0f ? 0.25f : a < 4.0f ? 0.5f : 1.0f;
}

void check_error_bounds(const std::vector<float>& w, int64_t n, int64_t k) {
  const PackedNvfp4Weights q = quantize_nvfp4(w.data(), n, k);
  float amax = 0.0f;
  for (float v : w) amax = std::max(amax, std::fabs(v));
  if (amax > 0.0f) {
    EXPECT_EQ(q.tensor_scale, amax / 2688.0f);
  }
  const std::vector<float> deq = dequantize_nvfp4(q);
  bool saw_amax_block = false;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t b = 0; b < k / 16; ++b) {
      float bamax = 0.0f;
      for (int i = 0; i < 16; ++i) bamax = std::max(bamax, std::fabs(w[static_cast<size_t>(r * k + b * 16 + i)]));
      const uint8_t sbyte = q.scales[static_cast<size_t>(r * (k / 16) + b)];
      const float s = e4m3_decode(sbyte);
      ASSERT_TRUE(std::isfinite(s) && s > 0.0f) << "block scale " << int(sbyte);
      if (bamax == amax && amax > 0.0f) {
        EXPECT_EQ(sbyte, 0x7E) << "the block holding amax gets the largest scale";
        saw_amax_block = true;
      }
      const float unit = s * q.tensor_scale;
      float block_err = 0.0f;
      for (int i = 0; i < 16; ++i) {
        const size_t idx = static_cast<size_t>(r * k + b * 16 + i);
        const float x = w[idx], d = deq[idx];
        ASSERT_TRUE(std::isfinite(d));
        const float v = x / unit;
        if (std::fabs(v) <= 6.0f) {
          EXPECT_LE(std::fabs(d - x), e2m1_half_gap(v) * unit * 1.00001f + 1e-37f)
              << "row " << r << " col " << b * 16 + i << " w=" << x << " deq=" << d;
        } else {
          // Saturated: the block scale was rounded down; the value is clamped to +-6 units.
          EXPECT_EQ(d, std::copysign(6.0f, x) * s * q.tensor_scale);
        }
        block_err = std::max(block_err, std::fabs(d - x));
      }
      // With a normal (not subnormal, not replaced) block scale the error stays within ~bamax/6.
      if (s >= std::ldexp(1.0f, -6) && bamax / 6.0f / q.tensor_scale >= std::ldexp(1.0f, -6)) {
        EXPECT_LE(block_err, 0.18f * bamax) << "row " << r << " block " << b;
      }
      EXPECT_LE(block_err, bamax * 1.0001f + 1e-37f);  // never worse than rounding everything to zero
    }
  }
  if (amax > 0.0f) {
    EXPECT_TRUE(saw_amax_block);
  }
}

TEST(Quantize, ErrorBoundsGaussian) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int64_t n = 64, k = 512;
  std::vector<float> w(static_cast<size_t>(n * k));
  for (auto& v : w) v = normal(rng);
  check_error_bounds(w, n, k);
}

TEST(Quantize, ErrorBoundsWideDynamicRangeAndZeroBlocks) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-12.0f, 6.0f);
  const int64_t n = 32, k = 256;
  std::vector<float> w(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t b = 0; b < k / 16; ++b) {
      const float block_mag = std::pow(10.0f, exponent(rng));  // per-block magnitude 1e-12 .. 1e6
      const bool zero_block = (r * 7 + b) % 9 == 0;
      for (int i = 0; i < 16; ++i)
        w[static_cast<size_t>(r * k + b * 16 + i)] = zero_block ? 0.0f : normal(rng) * block_mag;
    }
  }
  check_error_bounds(w, n, k);
}

TEST(Quantize, TinyBlockScaleBecomesOne) {
  std::vector<float> w(32, 0.0f);
  w[0] = 1.0f;          // block 0: amax 1 -> tensor scale 1/2688
  w[16] = 1e-9f;        // block 1: 1e-9 / 6 * 2688 = 4.5e-7, below half the smallest E4M3 subnormal
  w[17] = -3e-10f;
  const PackedNvfp4Weights q = quantize_nvfp4(w.data(), 1, 32);
  EXPECT_EQ(q.scales[0], 0x7E);
  EXPECT_EQ(e4m3_decode(q.scales[1]), 1.0f);
  const std::vector<float> deq = dequantize_nvfp4(q);
  for (int i = 16; i < 32; ++i) EXPECT_EQ(deq[static_cast<size_t>(i)], 0.0f) << i;
  EXPECT_NEAR(deq[0], 1.0f, 1e-6f);  // 6 * 448 * fl(1/2688)
}

TEST(Quantize, ExtremeMagnitudesStayFinite) {
  // Denormal-tiny tensor: amax / 2688 underflows, tensor scale falls back to 1, everything rounds to 0.
  std::vector<float> tiny(16, 0.0f);
  tiny[3] = 1e-43f;
  tiny[4] = -std::numeric_limits<float>::denorm_min();
  const PackedNvfp4Weights qt = quantize_nvfp4(tiny.data(), 1, 16);
  EXPECT_EQ(qt.tensor_scale, 1.0f);
  for (float v : dequantize_nvfp4(qt)) EXPECT_EQ(v, 0.0f);
  // Small but not underflowing: tensor scale is a denormal; results finite and within amax.
  std::vector<float> small(32);
  for (int i = 0; i < 32; ++i) small[static_cast<size_t>(i)] = 1e-38f * (static_cast<float>(i - 16) / 16.0f);
  check_error_bounds(small, 1, 32);
  // Huge values.
  std::vector<float> huge(32);
  for (int i = 0; i < 32; ++i) huge[static_cast<size_t>(i)] = 3e38f * (static_cast<float>(i - 16) / 16.0f);
  check_error_bounds(huge, 1, 32);
}

TEST(Quantize, AtChecksBoundsAndSizes) {
  std::vector<float> w(2 * 16, 0.25f);
  PackedNvfp4Weights q = quantize_nvfp4(w.data(), 2, 16);
  EXPECT_FLOAT_EQ(q.at(1, 15), 0.25f);
  expect_contains(error_of([&] { q.at(2, 0); }, StatusCode::kInvalidArgument), "[2, 16]");
  error_of([&] { q.at(0, -1); }, StatusCode::kInvalidArgument);
  q.scales.pop_back();
  error_of([&] { q.at(0, 0); }, StatusCode::kInvalidArgument);
  expect_contains(error_of([&] { dequantize_nvfp4(q); }, StatusCode::kInvalidArgument), "scale bytes");
}

}  // namespace
}  // namespace fp4moe
