// The kSm90Interleaved layout on the CPU: packing random canonical NVFP4 weights and reading every
// element back gives exactly e2m1(code) * e4m3(scale) (the unscaled weight the kernel multiplies), for
// every code, subnormal / zero / negative / NaN scales, and shapes with row and K tails; padding stays
// zero; the bit placement decodes with the kernel's shift-and-mask formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp4moe/nvfp4.h"
#include "kernels/sm90_wgmma/sm90_e4m3.h"
#include "kernels/sm90_wgmma/sm90_pack.h"

namespace fp4moe {
namespace {

struct Canonical {
  GemmProblem p;
  std::vector<uint8_t> bytes;  // codes then scales
};

Canonical random_canonical(GemmOp op, int64_t e, int64_t n, int64_t k, uint32_t seed, bool with_nan) {
  Canonical c;
  c.p.op = op;
  c.p.num_experts = e;
  c.p.n = n;
  c.p.k = k;
  const int64_t rows = weight_rows(c.p);
  const int64_t code_bytes = e * rows * k / 2, scale_bytes = e * rows * k / 16;
  c.bytes.resize(static_cast<size_t>(code_bytes + scale_bytes));
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < code_bytes; ++i) c.bytes[i] = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < scale_bytes; ++i) {
    const uint32_t pick = rng() % 16;
    uint8_t s;
    if (pick == 0) s = static_cast<uint8_t>(rng() % 8);           // zero and subnormals
    else if (pick == 1) s = static_cast<uint8_t>(0x80 | (rng() % 0x7F));  // negative (incl. -0)
    else if (pick == 2 && with_nan) s = 0x7F;                     // NaN
    else s = static_cast<uint8_t>(rng() % 0x7F);                  // any finite positive
    c.bytes[code_bytes + i] = s;
  }
  return c;
}

enum class Layout { kInterleaved, kE4m3 };

void expect_round_trip(const Canonical& c, Layout layout = Layout::kInterleaved) {
  const sm90::PackGeometry g = sm90::pack_geometry(c.p);
  const bool e4m3 = layout == Layout::kE4m3;
  const std::vector<uint8_t> packed = e4m3 ? sm90::pack_e4m3_cpu(c.p, c.bytes.data()) : sm90::pack_cpu(c.p, c.bytes.data());
  ASSERT_EQ(static_cast<int64_t>(packed.size()), g.bytes());
  const sm90::CanonicalView v = sm90::canonical_view(g, c.bytes.data());
  int64_t checked = 0;
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t r = 0; r < g.rows; ++r)
      for (int64_t k = 0; k < g.k; ++k) {
        const float want = e2m1_decode(static_cast<uint8_t>(v.code(e, r, k))) * e4m3_decode(v.scale(e, r, k));
        const float got = e4m3 ? sm90::packed_e4m3_weight_unscaled(g, packed.data(), e, r, k)
                               : sm90::packed_weight_unscaled(g, packed.data(), e, r, k);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got) || got == 0.0f) << "e " << e << " r " << r << " k " << k;  // 0 * NaN scale-code 0
          continue;
        }
        ASSERT_EQ(got, want) << "expert " << e << " row " << r << " k " << k << " code " << v.code(e, r, k)
                             << " scale 0x" << std::hex << int(v.scale(e, r, k));
        ++checked;
      }
  EXPECT_GT(checked, 0);
}

TEST(Sm90Layout, RoundTripFc2WithTails) { expect_round_trip(random_canonical(GemmOp::kFc2, 3, 200, 208, 1, false)); }
TEST(Sm90Layout, RoundTripFc1WithTails) { expect_round_trip(random_canonical(GemmOp::kFc1SwiGlu, 2, 80, 144, 2, false)); }
TEST(Sm90Layout, RoundTripNanScales) { expect_round_trip(random_canonical(GemmOp::kFc2, 1, 64, 128, 3, true)); }

// The e4m3 path's byte-wise layout (sm90_e4m3.h): the same round trip through the kernel's decode.
TEST(Sm90E4m3Layout, RoundTripFc2WithTails) {
  expect_round_trip(random_canonical(GemmOp::kFc2, 3, 200, 208, 11, false), Layout::kE4m3);
}
TEST(Sm90E4m3Layout, RoundTripFc1WithTails) {
  expect_round_trip(random_canonical(GemmOp::kFc1SwiGlu, 2, 80, 144, 12, false), Layout::kE4m3);
}
TEST(Sm90E4m3Layout, RoundTripNanScales) {
  expect_round_trip(random_canonical(GemmOp::kFc2, 1, 64, 128, 13, true), Layout::kE4m3);
}

// Every pair of codes in every byte of a word decodes (decode_e4m3_word) to e4m3 bytes worth e2m1 * 2^-6,
// whatever the word's other bytes hold.
TEST(Sm90E4m3Layout, DecodeFormula) {
  for (uint32_t c0 = 0; c0 < 16; ++c0)
    for (uint32_t c1 = 0; c1 < 16; ++c1)
      for (int byte = 0; byte < 4; ++byte) {
        const uint8_t b = sm90::e4m3_place_code(sm90::e4m3_place_code(0, 0, c0), 1, c1);
        EXPECT_EQ(sm90::e4m3_extract_code(b, 0), c0);
        EXPECT_EQ(sm90::e4m3_extract_code(b, 1), c1);
        const uint32_t word = (0xFFFFFFFFu & ~(0xFFu << (8 * byte))) | (uint32_t(b) << (8 * byte));
        uint32_t r0, r1;
        sm90::decode_e4m3_word(word, r0, r1);
        const uint8_t d0 = static_cast<uint8_t>(r0 >> (8 * byte)), d1 = static_cast<uint8_t>(r1 >> (8 * byte));
        EXPECT_EQ(static_cast<double>(e4m3_decode(d0)), std::ldexp(static_cast<double>(e2m1_decode(c0)), -6)) << c0;
        EXPECT_EQ(static_cast<double>(e4m3_decode(d1)), std::ldexp(static_cast<double>(e2m1_decode(c1)), -6)) << c1;
      }
}

// The sites: (packed row, k) covers the code area's 2048 bytes x 2 parts once, (row, k16 block) the
// scale area's 256 bytes once, and each thread's bytes are the wgmma m64nNk32 A fragment's elements.
TEST(Sm90E4m3Layout, SitesTileTheBlock) {
  std::vector<int> code_seen(2 * sm90::kPackCodeBytes, 0), scale_seen(sm90::kPackScaleBytes, 0);
  for (int p = 0; p < sm90::kPackRows; ++p)
    for (int kk = 0; kk < sm90::kPackK; ++kk) {
      const sm90::E4m3CodeSite s = sm90::e4m3_code_site(p, kk);
      ASSERT_GE(s.byte_offset, 0);
      ASSERT_LT(s.byte_offset, sm90::kPackCodeBytes);
      ++code_seen[2 * s.byte_offset + s.part];
      // Thread T = byte / 16 holds rows 16w + g (+8) and, in word s of the chunk, k = 16s + 4q + i.
      const int thread = s.byte_offset / 16, w = thread / 32, g = (thread % 32) / 4, q = thread % 4;
      const int word = (s.byte_offset % 16) / 4, i = s.byte_offset % 4;
      EXPECT_EQ(p, 16 * w + g + 8 * s.part);
      EXPECT_EQ(kk, 16 * word + 4 * q + i);
      if (kk % 16 == 0) {
        const int site = sm90::e4m3_scale_site(p, kk / 16) - sm90::kPackCodeBytes;
        ASSERT_GE(site, 0);
        ASSERT_LT(site, sm90::kPackScaleBytes);
        ++scale_seen[site];
      }
    }
  for (int v : code_seen) EXPECT_EQ(v, 1);
  for (int v : scale_seen) EXPECT_EQ(v, 1);
  for (int part = 0; part < 2; ++part) {
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b) bits |= 1u << sm90::e4m3_code_bit(part, b);
    EXPECT_EQ(bits, part == 0 ? 0x9Cu : 0x63u);
  }
}

// The host description of the activation split (the device does the same with cvt.rn.satfinite): the
// two halves of a block rebuild its bf16 values, exactly for every value within 2^8 of the block's
// largest (where lo stays on e4m3's grid) and within 2^-17 of the largest below that.
TEST(Sm90E4m3Split, RebuildsBf16Blocks) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> ex(-30, 20);
  int exact = 0;
  for (int blk = 0; blk < 4000; ++blk) {
    float x[16];
    const int e0 = ex(rng);
    for (float& v : x) v = round_bf16(std::ldexp(u(rng), e0 + static_cast<int>(rng() % 12) - 6));
    if (blk % 50 == 0) x[rng() % 16] = 0.f;
    if (blk == 7)
      for (float& v : x) v = 0.f;
    float m = 0.f;
    for (float v : x) m = std::max(m, std::fabs(v));
    const int e = sm90::e4m3_block_exponent(m);
    const float inv = sm90::e4m3_pow2(-e);
    for (float v : x) {
      const float xs = v * inv;
      ASSERT_LT(std::fabs(xs), 256.f);
      const uint8_t hi = e4m3_encode(xs);
      const uint8_t lo = e4m3_encode(xs - e4m3_decode(hi));
      const double rebuilt = std::ldexp(static_cast<double>(e4m3_decode(hi)) + e4m3_decode(lo), e);
      const double err = std::fabs(rebuilt - v);
      ASSERT_LE(err, std::ldexp(static_cast<double>(m), -17)) << "block " << blk << " x " << v << " max " << m;
      if (std::fabs(v) >= std::ldexp(m, -8)) {
        EXPECT_EQ(err, 0.0) << "x " << v << " max " << m;
        ++exact;
      }
    }
  }
  EXPECT_GT(exact, 30000);  // the distribution above puts about two thirds of the values there
}

// The block factor: every finite E5M3u scale, every clamped exponent -> scale * 2^(E - 13), exactly.
TEST(Sm90E4m3Split, BlockFactor) {
  for (int b = 1; b < 0x7F; ++b) {
    const uint8_t u = sm90::e4m3_to_e5m3u(static_cast<uint8_t>(b));
    for (int e = sm90::kE4m3MinExponent; e <= sm90::kE4m3MaxExponent; e += 7) {
      const uint32_t bits = sm90::e4m3_block_factor_bits(u, e);
      float f;
      std::memcpy(&f, &bits, 4);
      EXPECT_EQ(static_cast<double>(f), std::ldexp(static_cast<double>(e4m3_decode(static_cast<uint8_t>(b))), e - 13))
          << "scale 0x" << std::hex << b << std::dec << " E " << e;
    }
  }
}

// Every code in every slot decodes with the kernel's formulas (decode_code_word, host build) to bf16
// bits whose value is e2m1 * 2^-126; every E4M3 scale transcodes to bf16 bits of scale * 2^107.
TEST(Sm90Layout, KernelBitFormulas) {
  for (uint32_t lo = 0; lo < 16; ++lo)
    for (uint32_t hi = 0; hi < 16; ++hi)
      for (int slot = 0; slot < 4; ++slot) {
        uint32_t w = sm90::place_code(sm90::place_code(0, slot, 0, lo), slot, 1, hi);
        EXPECT_EQ(sm90::extract_code(w, slot, 0), lo);
        EXPECT_EQ(sm90::extract_code(w, slot, 1), hi);
        // Garbage in the other slots must not leak into this slot's pair.
        for (int other = 0; other < 4; ++other)
          if (other != slot) w = sm90::place_code(sm90::place_code(w, other, 0, 15), other, 1, 15);
        uint32_t pairs[4];
        sm90::decode_code_word(w, pairs);
        const uint32_t pair = pairs[slot];
        const float vlo = bf16_bits_to_f32(static_cast<uint16_t>(pair & 0xFFFF));
        const float vhi = bf16_bits_to_f32(static_cast<uint16_t>(pair >> 16));
        EXPECT_EQ(static_cast<double>(vlo), std::ldexp(static_cast<double>(e2m1_decode(lo)), -126)) << slot << " " << lo;
        EXPECT_EQ(static_cast<double>(vhi), std::ldexp(static_cast<double>(e2m1_decode(hi)), -126)) << slot << " " << hi;
      }
  for (int b = 1; b < 0x7F; ++b) {
    const uint8_t u = sm90::e4m3_to_e5m3u(static_cast<uint8_t>(b));
    const double s = bf16_bits_to_f32(sm90::e5m3u_to_bf16_bits(u));
    EXPECT_EQ(s, std::ldexp(static_cast<double>(e4m3_decode(static_cast<uint8_t>(b))), 107)) << "e4m3 0x" << std::hex << b;
    // The kernel builds the pair from a scale word with a shift by 4 and one mask.
    const uint32_t word = u | (uint32_t(u) << 16);
    const uint32_t pair = ((word << 4) & 0x0FF00FF0u) | 0x70007000u;
    EXPECT_EQ(pair & 0xFFFF, sm90::e5m3u_to_bf16_bits(u));
  }
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(sm90::e5m3u_to_bf16_bits(sm90::e4m3_to_e5m3u(0x7F)))));
}

// The placement uses each of a word's 32 bits exactly once (4 slots x 2 elements x 4 code bits).
TEST(Sm90Layout, CodeBitsTileTheWord) {
  uint32_t seen = 0;
  for (int slot = 0; slot < 4; ++slot)
    for (int half = 0; half < 2; ++half)
      for (int b = 0; b < 4; ++b) {
        const int pos = sm90::code_bit_position(slot, half, b);
        ASSERT_GE(pos, 0);
        ASSERT_LT(pos, 32);
        EXPECT_EQ(seen & (1u << pos), 0u) << "slot " << slot << " half " << half << " bit " << b;
        seen |= 1u << pos;
      }
  EXPECT_EQ(seen, 0xFFFFFFFFu);
}

TEST(Sm90Layout, PaddingIsZero) {
  // FC2 with N = 70 and K = 48: tile 1 holds rows 64..69 then 58 padding rows, K pads to 256.
  const Canonical c = random_canonical(GemmOp::kFc2, 1, 70, 48, 4, false);
  const sm90::PackGeometry g = sm90::pack_geometry(c.p);
  EXPECT_EQ(g.tiles, 2);
  EXPECT_EQ(g.kchunks, sm90::kPackKAlign / sm90::kPackK);
  const std::vector<uint8_t> packed = sm90::pack_cpu(c.p, c.bytes.data());
  // Every chunk past the first (k >= 64) of every tile is all padding.
  for (int64_t t = 0; t < g.tiles; ++t)
    for (int64_t ch = 1; ch < g.kchunks; ++ch) {
      const uint8_t* b = packed.data() + g.block_index(0, t, ch) * sm90::kPackBlockBytes;
      for (int i = 0; i < sm90::kPackBlockBytes; ++i) ASSERT_EQ(b[i], 0) << "tile " << t << " chunk " << ch << " byte " << i;
    }
}

}  // namespace
}  // namespace fp4moe
