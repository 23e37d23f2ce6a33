// E2M1 / E4M3 element encode and decode, and nibble packing.
//
// Expected values come from the formats' bit-field definitions (decode) and from a brute-force
// nearest-value search over the decoded tables (encode), never from the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fp4moe/nvfp4.h"
#include "fp4moe/status.h"

namespace fp4moe {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// E2M1 from its fields: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0.
double e2m1_from_fields(int code) {
  const int s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? m * 0.5 : (1.0 + m * 0.5) * std::ldexp(1.0, e - 1);
  return s ? -mag : mag;
}

// E4M3 (e4m3fn) from its fields: sign bit 7, exponent bits 6..3 (bias 7), mantissa bits 2..0;
// S.1111.111 is NaN, there is no infinity.
double e4m3_from_fields(int byte) {
  const int s = (byte >> 7) & 1, e = (byte >> 3) & 15, m = byte & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? (m / 8.0) * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return s ? -mag : mag;
}

// Nearest finite value by exhaustive search; at equal distance the code with mantissa LSB 0 (the
// even one) wins. Values beyond the largest finite value therefore land on it (saturation).
template <typename Decode>
int nearest_code(float x, int num_codes, Decode decode) {
  const double xd = x;
  // Beyond the largest finite value every distance is dominated by |x| (and may round to the same
  // double), so saturation is taken directly: the largest value of the same sign.
  double max_finite = 0;
  int max_code = -1;
  for (int c = 0; c < num_codes; ++c) {
    const double v = decode(c);
    if (!std::isnan(v) && v > max_finite) {
      max_finite = v;
      max_code = c;
    }
  }
  if (std::fabs(xd) >= max_finite) return max_code | (std::signbit(xd) ? num_codes / 2 : 0);
  int best = -1;
  double best_dist = 0;
  for (int c = 0; c < num_codes; ++c) {
    const double v = decode(c);
    if (std::isnan(v)) continue;
    if (std::signbit(v) != std::signbit(xd)) continue;  // keep the sign (gives -0 for small negatives)
    const double d = std::fabs(xd - v);
    if (best < 0 || d < best_dist || (d == best_dist && (c & 1) == 0)) {
      best = c;
      best_dist = d;
    }
  }
  return best;
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

TEST(E2M1, DecodeMatchesBitFieldsForEveryCode) {
  for (int c = 0; c < 16; ++c) {
    const float expect = static_cast<float>(e2m1_from_fields(c));
    EXPECT_TRUE(same_float(e2m1_decode(static_cast<uint8_t>(c)), expect)) << "code " << c;
    // Only the low nibble is the code.
    EXPECT_TRUE(same_float(e2m1_decode(static_cast<uint8_t>(c | 0xA0)), expect)) << "code " << c;
  }
  EXPECT_EQ(e2m1_decode(7), 6.0f);
  EXPECT_EQ(e2m1_decode(0xF), -6.0f);
  EXPECT_TRUE(std::signbit(e2m1_decode(8)));
}

TEST(E4M3, DecodeMatchesBitFieldsForEveryByte) {
  for (int b = 0; b < 256; ++b)
    EXPECT_TRUE(same_float(e4m3_decode(static_cast<uint8_t>(b)), static_cast<float>(e4m3_from_fields(b))))
        << "byte " << b;
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(e4m3_decode(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_decode(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(e4m3_decode(0x7F)) && std::isnan(e4m3_decode(0xFF)));
}

TEST(E2M1, EncodeRoundTripsEveryCode) {
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_encode(e2m1_decode(static_cast<uint8_t>(c))), c) << "code " << c;
}

TEST(E4M3, EncodeRoundTripsEveryValue) {
  for (int b = 0; b < 256; ++b) {
    if (b == 0x7F || b == 0xFF) continue;
    EXPECT_EQ(e4m3_encode(e4m3_decode(static_cast<uint8_t>(b))), b) << "byte " << b;
  }
}

// Midpoints between neighbouring values go to the even code; one fp32 step either side goes to the
// nearer neighbour.
template <typename Encode, typename Decode>
void check_ties(int positive_codes, Encode encode, Decode decode, const char* fmt_name) {
  for (int sign : {0, 1}) {
    for (int c = 0; c + 1 < positive_codes; ++c) {
      const float lo = static_cast<float>(decode(c)), hi = static_cast<float>(decode(c + 1));
      const float mid = (lo + hi) / 2;  // exact: both are short dyadic values
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + hi) / 2);
      const int even = (c & 1) == 0 ? c : c + 1;
      const int sbit = sign ? (positive_codes == 8 ? 0x8 : 0x80) : 0;
      const float s = sign ? -1.0f : 1.0f;
      EXPECT_EQ(encode(s * mid), sbit | even) << fmt_name << " tie between " << lo << " and " << hi;
      EXPECT_EQ(encode(s * std::nextafter(mid, 0.0f)), sbit | c) << fmt_name << " just below " << mid;
      EXPECT_EQ(encode(s * std::nextafter(mid, kInf)), sbit | (c + 1)) << fmt_name << " just above " << mid;
    }
  }
}

TEST(E2M1, TiesRoundToEven) {
  check_ties(8, e2m1_encode, e2m1_from_fields, "e2m1");
  // The cases spelled out: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
  EXPECT_EQ(e2m1_encode(0.25f), 0);
  EXPECT_EQ(e2m1_encode(0.75f), 2);
  EXPECT_EQ(e2m1_encode(1.25f), 2);
  EXPECT_EQ(e2m1_encode(1.75f), 4);
  EXPECT_EQ(e2m1_encode(2.5f), 4);
  EXPECT_EQ(e2m1_encode(3.5f), 6);
  EXPECT_EQ(e2m1_encode(5.0f), 6);
}

TEST(E4M3, TiesRoundToEven) {
  check_ties(127, e4m3_encode, e4m3_from_fields, "e4m3");  // 0x00..0x7E: zero, subnormals, normals
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -10)), 0x00);      // half the smallest subnormal -> 0
  EXPECT_EQ(e4m3_encode(std::ldexp(3.0f, -10)), 0x02);      // 1.5 * 2^-9 -> 2 * 2^-9
  EXPECT_EQ(e4m3_encode(432.0f), 0x7E);                      // between 416 and 448 -> 448 (even)
}

TEST(E2M1, SpecialValues) {
  EXPECT_EQ(e2m1_encode(0.0f), 0x0);
  EXPECT_EQ(e2m1_encode(-0.0f), 0x8);
  EXPECT_EQ(e2m1_encode(-0.1f), 0x8);   // rounds to -0
  EXPECT_EQ(e2m1_encode(6.0f), 0x7);
  EXPECT_EQ(e2m1_encode(6.5f), 0x7);    // saturation
  EXPECT_EQ(e2m1_encode(1e30f), 0x7);
  EXPECT_EQ(e2m1_encode(-1e30f), 0xF);
  EXPECT_EQ(e2m1_encode(kInf), 0x7);
  EXPECT_EQ(e2m1_encode(-kInf), 0xF);
  EXPECT_EQ(e2m1_encode(kNaN), 0x0);
  EXPECT_EQ(e2m1_encode(-kNaN), 0x0);
  EXPECT_EQ(e2m1_encode(std::numeric_limits<float>::denorm_min()), 0x0);
}

TEST(E4M3, SpecialValues) {
  EXPECT_EQ(e4m3_encode(0.0f), 0x00);
  EXPECT_EQ(e4m3_encode(-0.0f), 0x80);
  EXPECT_EQ(e4m3_encode(-1e-6f), 0x80);
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(e4m3_encode(-std::ldexp(7.0f, -9)), 0x87);
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -6)), 0x08);        // smallest normal
  EXPECT_EQ(e4m3_encode(std::ldexp(15.9f, -10)), 0x08);      // subnormal that rounds up to 2^-6
  EXPECT_EQ(e4m3_encode(448.0f), 0x7E);
  EXPECT_EQ(e4m3_encode(449.0f), 0x7E);                      // saturation
  EXPECT_EQ(e4m3_encode(464.0f), 0x7E);
  EXPECT_EQ(e4m3_encode(1e30f), 0x7E);
  EXPECT_EQ(e4m3_encode(-1e30f), 0xFE);
  EXPECT_EQ(e4m3_encode(kInf), 0x7E);
  EXPECT_EQ(e4m3_encode(-kInf), 0xFE);
  EXPECT_EQ(e4m3_encode(kNaN), 0x7F);
  EXPECT_EQ(e4m3_encode(-kNaN), 0x7F);
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(e4m3_encode(-std::numeric_limits<float>::denorm_min()), 0x80);
}

// Random fp32 values across the whole finite range (random bit patterns) and concentrated on each
// format's range, against the exhaustive nearest-value search.
template <typename Encode, typename Decode>
void check_against_search(int num_codes, float range, Encode encode, Decode decode, const char* fmt_name) {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<float> in_range(-range * 1.2f, range * 1.2f);
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  std::uniform_real_distribution<float> log2mag(-14.0f, std::log2(range) + 1.0f);
  int checked = 0;
  for (int i = 0; i < 300000; ++i) {
    float x;
    if (i % 3 == 0) {
      x = in_range(rng);
    } else if (i % 3 == 1) {
      x = std::exp2(log2mag(rng)) * ((i & 4) ? -1.0f : 1.0f);
    } else {
      const uint32_t u = bits(rng);
      std::memcpy(&x, &u, 4);
      if (!std::isfinite(x)) continue;
    }
    const int expect = nearest_code(x, num_codes, decode);
    ASSERT_EQ(encode(x), expect) << fmt_name << " x = " << x;
    ++checked;
  }
  EXPECT_GT(checked, 250000);
}

TEST(E2M1, MatchesNearestValueSearch) { check_against_search(16, 6.0f, e2m1_encode, e2m1_from_fields, "e2m1"); }
TEST(E4M3, MatchesNearestValueSearch) {
  check_against_search(256, 448.0f, e4m3_encode, e4m3_from_fields, "e4m3");
}

TEST(Pack, LayoutIsLowNibbleFirst) {
  const uint8_t codes[6] = {0x1, 0x2, 0xF, 0x0, 0x8, 0x7};
  uint8_t packed[3] = {0, 0, 0};
  pack_e2m1(codes, 6, packed);
  EXPECT_EQ(packed[0], 0x21);
  EXPECT_EQ(packed[1], 0x0F);
  EXPECT_EQ(packed[2], 0x78);
  uint8_t back[6];
  unpack_e2m1(packed, 6, back);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back[i], codes[i]) << i;
}

TEST(Pack, RandomRoundTrip) {
  std::mt19937 rng(7);
  for (int count : {0, 2, 16, 1000, 4096}) {
    std::vector<uint8_t> codes(static_cast<size_t>(count)), back(static_cast<size_t>(count), 0xEE);
    for (auto& c : codes) c = static_cast<uint8_t>(rng() & 0xF);
    std::vector<uint8_t> packed(static_cast<size_t>(count / 2) + 1, 0xEE);
    pack_e2m1(codes.data(), count, packed.data());
    EXPECT_EQ(packed[static_cast<size_t>(count / 2)], 0xEE) << "wrote past count/2 bytes";
    for (int i = 0; i < count / 2; ++i)
      ASSERT_EQ(packed[i], codes[2 * i] | (codes[2 * i + 1] << 4));
    unpack_e2m1(packed.data(), count, back.data());
    EXPECT_EQ(back, codes);
  }
}

TEST(Pack, RejectsOddCountAndWideCodes) {
  uint8_t codes[3] = {1, 2, 3}, packed[2] = {};
  try {
    pack_e2m1(codes, 3, packed);
    FAIL() << "odd count accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("count = 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(unpack_e2m1(packed, 3, codes), Error);
  EXPECT_THROW(pack_e2m1(codes, -2, packed), Error);
  const uint8_t wide[2] = {1, 0x10};
  try {
    pack_e2m1(wide, 2, packed);
    FAIL() << "5-bit code accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("index 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe
