// The kSm90Interleaved layout on the CPU: packing random canonical NVFP4 weights and reading every
// element back gives exactly e2m1(code) * e4m3(scale) (the unscaled weight the kernel multiplies), for
// every code, subnormal / zero / negative / NaN scales, and shapes with row and K tails; padding stays
// zero; the bit placement decodes with the kernel's shift-and-mask formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp4moe/nvfp4.h"
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

void expect_round_trip(const Canonical& c) {
  const sm90::PackGeometry g = sm90::pack_geometry(c.p);
  const std::vector<uint8_t> packed = sm90::pack_cpu(c.p, c.bytes.data());
  ASSERT_EQ(static_cast<int64_t>(packed.size()), g.bytes());
  const sm90::CanonicalView v = sm90::canonical_view(g, c.bytes.data());
  int64_t checked = 0;
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t r = 0; r < g.rows; ++r)
      for (int64_t k = 0; k < g.k; ++k) {
        const float want = e2m1_decode(static_cast<uint8_t>(v.code(e, r, k))) * e4m3_decode(v.scale(e, r, k));
        const float got = sm90::packed_weight_unscaled(g, packed.data(), e, r, k);
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
