// The no-hand-over probe's weight layout (resident_cc_layout.h, docs/perf.md sm90 step 66) on the CPU: the
// decode's integer formulas give every code's e2m1 value times 2^-14 exactly in its own half, whatever the
// other codes of the word are; and the pack puts every code and scale of random canonical weights where the
// kernel reads them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fp4moe/dtype.h"
#include "fp4moe/nvfp4.h"
#include "resident_cc_layout.h"

namespace fp4moe {
namespace sm90test {
namespace {

// Half (0 low, 1 high) of decoded f16x2 word `q` of `w`: codes 2q and 2q + 1 of the word.
float decoded(uint32_t w, int k) {
  uint32_t h[4];
  cc_decode_word(w, h);
  const uint32_t pair = h[(k % 8) / 2];
  return f16_bits_to_f32(static_cast<uint16_t>((k & 1) ? (pair >> 16) : pair));
}

uint32_t word(const uint8_t* block, int k) {
  const uint8_t* b = block + 4 * (k / 8);
  return uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
}

TEST(CcLayout, DecodeIsExactForEveryCodeInEverySlot) {
  std::mt19937 rng(66);
  for (int slot = 0; slot < 16; ++slot)
    for (int code = 0; code < 16; ++code)
      for (int trial = 0; trial < 17; ++trial) {
        uint8_t codes[16], block[8];
        for (int k = 0; k < 16; ++k) codes[k] = static_cast<uint8_t>(trial < 16 ? trial : rng() % 16);
        codes[slot] = static_cast<uint8_t>(code);
        cc_encode_block(codes, block);
        for (int k = 0; k < 16; ++k)
          ASSERT_EQ(decoded(word(block, k), k), std::ldexp(e2m1_decode(codes[k]), -14))
              << "slot " << slot << " code " << code << " trial " << trial << " k " << k;
      }
}

TEST(CcLayout, PackPutsEveryCodeAndScaleWhereTheKernelReadsThem) {
  const int64_t experts = 2, hidden = 1024, inter = 32, parts = inter / kCcCols;
  std::mt19937 rng(6);
  auto random_bytes = [&](int64_t n) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  };
  const std::vector<uint8_t> fc1 = random_bytes(experts * 2 * inter * hidden * 9 / 16),
                             fc2 = random_bytes(experts * hidden * inter * 9 / 16);
  std::vector<uint8_t> out(static_cast<size_t>(experts * parts * cc_part_bytes(hidden)), 0xA5);
  pack_cc_layout(fc1.data(), fc2.data(), experts, hidden, inter, out.data());
  auto code = [](const std::vector<uint8_t>& w, int64_t row, int64_t k, int64_t cols) {
    const uint8_t b = w[row * (cols / 2) + k / 2];
    return static_cast<uint8_t>((k & 1) ? (b >> 4) : (b & 0xFu));
  };
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t p = 0; p < parts; ++p) {
      const uint8_t* part = out.data() + (e * parts + p) * cc_part_bytes(hidden);
      // FC1: warp w's gate and up rows of column 16p + w, lane l's k16 block 32c + l.
      const uint8_t* scales1 = fc1.data() + experts * 2 * inter * hidden / 2;
      for (int64_t c = 0; c < cc_fc1_chunks(hidden); ++c)
        for (int w = 0; w < kCcCols; ++w)
          for (int l = 0; l < 32; ++l)
            for (int half = 0; half < 2; ++half) {
              const uint8_t* chunk = part + c * kCcChunkBytes;
              const int unit = 32 * w + l;
              const int64_t row = e * 2 * inter + half * inter + kCcCols * p + w, kb = 32 * c + l;
              for (int k = 0; k < 16; ++k)
                ASSERT_EQ(decoded(word(chunk + 16 * unit + 8 * half, k), k),
                          std::ldexp(e2m1_decode(code(fc1, row, 16 * kb + k, hidden)), -14));
              ASSERT_EQ(chunk[kCcCodeBytes + 2 * unit + half], scales1[row * (hidden / 16) + kb]);
            }
      // FC2: thread t's rows 2t and 2t + 1 of chunk f over the part's k16 block p.
      const uint8_t* scales2 = fc2.data() + experts * hidden * inter / 2;
      for (int64_t f = 0; f < cc_fc2_chunks(hidden); ++f)
        for (int t = 0; t < kCcChunkRows / 2; ++t)
          for (int h = 0; h < 2; ++h) {
            const uint8_t* chunk = part + (cc_fc1_chunks(hidden) + f) * kCcChunkBytes;
            const int64_t row = e * hidden + kCcChunkRows * f + 2 * t + h;
            for (int k = 0; k < 16; ++k)
              ASSERT_EQ(decoded(word(chunk + 16 * t + 8 * h, k), k),
                        std::ldexp(e2m1_decode(code(fc2, row, 16 * p + k, inter)), -14));
            ASSERT_EQ(chunk[kCcCodeBytes + 2 * t + h], scales2[row * (inter / 16) + p]);
          }
    }
}

}  // namespace
}  // namespace sm90test
}  // namespace fp4moe
