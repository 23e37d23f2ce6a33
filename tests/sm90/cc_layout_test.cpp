// The kSm90Cc weight layout (src/kernels/sm90_wgmma/sm90_cc_layout.h: the resident tactic's and the step 66
// probe's) on the CPU: the decode's integer formulas give every code's e2m1 value times 2^-14 exactly in its
// own half, whatever the other codes of the word are; the pack puts every code and scale of random canonical
// weights where the kernel reads them, for FC1 and FC2, and refuses shapes the layout cannot hold; the
// probe's combined layout is the two packs part by part. Also the resident tactic's preflight
// (check_cc_tactic) on device profiles: what it accepts and the reason it gives for what it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fp4moe/device_caps.h"
#include "fp4moe/dtype.h"
#include "fp4moe/nvfp4.h"
#include "kernels/families.h"
#include "kernels/sm90_wgmma/sm90_cc.h"
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

std::vector<uint8_t> random_bytes(int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}
uint8_t canonical_code(const std::vector<uint8_t>& w, int64_t row, int64_t k, int64_t cols) {
  const uint8_t b = w[row * (cols / 2) + k / 2];
  return static_cast<uint8_t>((k & 1) ? (b >> 4) : (b & 0xFu));
}

TEST(CcLayout, PackPutsEveryCodeAndScaleWhereTheKernelReadsThem) {
  const int64_t experts = 2, hidden = 2048, inter = 32, parts = inter / kCcCols;
  std::mt19937 rng(6);
  const std::vector<uint8_t> fc1 = random_bytes(experts * 2 * inter * hidden * 9 / 16, rng),
                             fc2 = random_bytes(experts * hidden * inter * 9 / 16, rng);
  const GemmProblem p1{GemmOp::kFc1SwiGlu, experts, inter, hidden, 0, 0},
      p2{GemmOp::kFc2, experts, hidden, inter, 0, 0};
  const std::vector<uint8_t> out1 = sm90::pack_cc_cpu(p1, fc1.data()), out2 = sm90::pack_cc_cpu(p2, fc2.data());
  ASSERT_EQ(out1.size(), fc1.size());  // the canonical size: codes and scales
  ASSERT_EQ(out2.size(), fc2.size());
  const uint8_t* scales1 = fc1.data() + experts * 2 * inter * hidden / 2;
  const uint8_t* scales2 = fc2.data() + experts * hidden * inter / 2;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t p = 0; p < parts; ++p) {
      // FC1: warp w's gate and up rows of column 16p + w, lane l's k16 block 32c + l.
      for (int64_t c = 0; c < cc_fc1_chunks(hidden); ++c)
        for (int w = 0; w < kCcCols; ++w)
          for (int l = 0; l < 32; ++l)
            for (int half = 0; half < 2; ++half) {
              const uint8_t* chunk = out1.data() + sm90::cc_chunk_offset(true, hidden, inter, e, p, c);
              const int unit = 32 * w + l;
              const int64_t row = e * 2 * inter + half * inter + kCcCols * p + w, kb = 32 * c + l;
              for (int k = 0; k < 16; ++k)
                ASSERT_EQ(decoded(word(chunk + 16 * unit + 8 * half, k), k),
                          std::ldexp(e2m1_decode(canonical_code(fc1, row, 16 * kb + k, hidden)), -14));
              ASSERT_EQ(chunk[kCcCodeBytes + 2 * unit + half], scales1[row * (hidden / 16) + kb]);
            }
      // FC2: plane j's word v of chunk f holds rows 4v .. 4v + 3 of the chunk, columns 16p + 2j and + 1 (code
      // 2i + c of the word: row 4v + i, column 2j + c); row i's scale at byte 8192 + i.
      for (int64_t f = 0; f < cc_fc2_chunks(hidden); ++f) {
        const uint8_t* chunk = out2.data() + sm90::cc_chunk_offset(false, hidden, inter, e, p, f);
        for (int j = 0; j < 8; ++j)
          for (int v = 0; v < kCcChunkRows / 4; ++v)
            for (int k = 0; k < 8; ++k) {
              const int64_t row = e * hidden + kCcChunkRows * f + 4 * v + k / 2;
              ASSERT_EQ(decoded(word(chunk + 1024 * j + 4 * v, 0), k),
                        std::ldexp(e2m1_decode(canonical_code(fc2, row, 16 * p + 2 * j + k % 2, inter)), -14))
                  << "e " << e << " p " << p << " f " << f << " plane " << j << " word " << v << " code " << k;
            }
        for (int i = 0; i < kCcChunkRows; ++i)
          ASSERT_EQ(chunk[kCcCodeBytes + i], scales2[(e * hidden + kCcChunkRows * f + i) * (inter / 16) + p]);
      }
    }
  // The probe's layout: each part's FC1 chunks as the library packs them, then its FC2 chunks in the probe's
  // own layout (thread t's rows 2t and 2t + 1 of chunk f over the part's k16 block p).
  const int64_t b1 = cc_fc1_chunks(hidden) * kCcChunkBytes, b2 = cc_fc2_chunks(hidden) * kCcChunkBytes;
  std::vector<uint8_t> both(static_cast<size_t>(experts * parts * (b1 + b2)));
  pack_cc_layout(fc1.data(), fc2.data(), experts, hidden, inter, both.data());
  for (int64_t i = 0; i < experts * parts; ++i) {
    ASSERT_TRUE(std::equal(out1.begin() + i * b1, out1.begin() + (i + 1) * b1, both.begin() + i * (b1 + b2)));
    const int64_t e = i / parts, p = i % parts;
    for (int64_t f = 0; f < cc_fc2_chunks(hidden); ++f)
      for (int t = 0; t < kCcChunkRows / 2; ++t)
        for (int h = 0; h < 2; ++h) {
          const uint8_t* chunk = both.data() + i * (b1 + b2) + b1 + f * kCcChunkBytes;
          const int64_t row = e * hidden + kCcChunkRows * f + 2 * t + h;
          for (int k = 0; k < 16; ++k)
            ASSERT_EQ(decoded(word(chunk + 16 * t + 8 * h, k), k),
                      std::ldexp(e2m1_decode(canonical_code(fc2, row, 16 * p + k, inter)), -14));
          ASSERT_EQ(chunk[kCcCodeBytes + 2 * t + h], scales2[row * (inter / 16) + p]);
        }
  }
}

TEST(CcLayout, PackRefusesShapesItCannotHold) {
  const std::vector<uint8_t> none(16);
  std::string why;
  const GemmProblem bad_hidden{GemmOp::kFc1SwiGlu, 2, 32, 1536, 0, 0}, bad_inter{GemmOp::kFc2, 2, 2048, 24, 0, 0};
  EXPECT_FALSE(sm90::cc_layout_fits(bad_hidden, &why));
  EXPECT_NE(why.find("multiple of 1024"), std::string::npos) << why;
  EXPECT_NE(why.find("k=1536"), std::string::npos) << why;
  EXPECT_FALSE(sm90::cc_layout_fits(bad_inter, &why));
  EXPECT_NE(why.find("multiple of 16"), std::string::npos) << why;
  EXPECT_THROW(sm90::pack_cc_cpu(bad_hidden, none.data()), std::invalid_argument);
  EXPECT_TRUE(sm90::cc_layout_fits(GemmProblem{GemmOp::kFc2, 256, 6144, 256, 8, 1}, &why));
}

// The preflight on the H200's profile: the TP8 shard at T = 1 (hidden 6144: 190,808 bytes of shared
// memory), DeepSeek-V3's hidden 7168 (222,576 bytes) pass; what they refuse names the requirement.
TEST(CcTactic, PreflightAcceptsTheDecodeShapesAndNamesWhatItRefuses) {
  std::vector<TacticDesc> descs;
  append_sm90_cc_tactic_descs(descs);
  ASSERT_EQ(descs.size(), 1u);
  const TacticDesc& d = descs[0];
  EXPECT_EQ(d.name, sm90::kCcTacticName);
  EXPECT_EQ(d.layout, WeightLayout::kSm90Cc);
  EXPECT_EQ(d.schedule, "resident");
  EXPECT_EQ(d.req.smem_bytes, 190808);
  const DeviceCaps h200 = device_profile("h200");
  auto check = [&](GemmOp op, int64_t experts, int64_t hidden, int64_t inter, int64_t rows, int64_t per_expert,
                   const DeviceCaps& caps) {
    const GemmProblem p = op == GemmOp::kFc1SwiGlu ? GemmProblem{op, experts, inter, hidden, rows, per_expert}
                                                   : GemmProblem{op, experts, hidden, inter, rows, per_expert};
    return sm90::check_cc_tactic(d, p, caps);
  };
  for (GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2}) {
    SCOPED_TRACE(gemm_op_name(op));
    EXPECT_TRUE(check(op, 256, 6144, 256, 8, 1, h200).ok) << check(op, 256, 6144, 256, 8, 1, h200).reason;
    EXPECT_TRUE(check(op, 256, 7168, 256, 8, 1, h200).ok) << check(op, 256, 7168, 256, 8, 1, h200).reason;
    const std::pair<TacticCheck, const char*> refused[] = {
        {check(op, 256, 8192, 256, 8, 1, h200), "shared memory"},
        {check(op, 256, 1536, 256, 8, 1, h200), "multiple of 1024"},
        {check(op, 256, 6144, 24, 8, 1, h200), "multiple of 16"},
        {check(op, 256, 6144, 256, 16, 2, h200), "rows per expert"},
        {check(op, 2000, 6144, 256, 8, 1, h200), "experts"},
        {check(op, 256, 6144, 256, 8, 1, device_profile("rtx-pro-6000")), "sm_90"},
        {check(op, 256, 6144, 256, 8, 1, device_profile("a100")), "sm_90"},
    };
    for (const auto& [c, what] : refused) {
      EXPECT_FALSE(c.ok) << what;
      EXPECT_NE(c.reason.find(what), std::string::npos) << c.reason;
    }
  }
  // A device of sm_90 with a 99 KB per-block limit: refused by the descriptor's shared memory alone.
  DeviceCaps small = h200;
  small.smem_per_block_optin = 99 * 1024;
  const TacticCheck c = check_tactic(d, GemmProblem{GemmOp::kFc2, 256, 6144, 256, 8, 1}, small);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.reason.find("shared memory"), std::string::npos) << c.reason;
}

}  // namespace
}  // namespace sm90test
}  // namespace fp4moe
