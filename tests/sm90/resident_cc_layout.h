// The weight layout of the no-hand-over probe (resident_cc.cu, docs/perf.md sm90 step 66), shared by its
// kernel, its host pack and the CPU test (cc_layout_test.cpp).
//
// A part is 16 SwiGLU columns of one expert: out[e][p] holds FC1's hidden / 512 chunks, then FC2's
// hidden / 1024 chunks, each 9,216 bytes (8,192 of codes, then 1,024 of e4m3 scales as stored):
//   FC1 chunk c (K c*512 .. + 511): unit u = 32w + l (w: column 16p + w of the part, l: k16 block 32c + l)
//     holds 16 code bytes at 16u (the gate row's block, then the up row's) and two scale bytes at 8192 + 2u
//     (gate, up).
//   FC2 chunk f (output rows f*1024 .. + 1023, over the part's k16 block p): rows 2t and 2t + 1 hold 16 code
//     bytes at 16t (row 2t's block, then row 2t + 1's) and two scale bytes at 8192 + 2t.
// A block's 8 bytes hold its 16 codes k = 0..15, word 0 k 0..7 and word 1 k 8..15. In a word, byte 1 holds
// k0 and k4, byte 3 k1 and k5, byte 0 k2 and k6, byte 2 k3 and k7; the first of each at bits 7 (sign), 3, 2,
// 1 (e1, e0, m), the second at bits 6 (sign), 5, 4, 0. cc_decode_word turns a word into four f16x2 values
// (k0 k1, k2 k3, k4 k5, k6 k7) with 9 operations: each half is an e5m2 byte in the half's high byte, which is
// the e2m1 value times 2^-14 exactly (e = 0 is f16's subnormal 2^-14 * m/2, E2M1's own rule).
#pragma once
#include <cstdint>
#include <cstring>

#include "fp4moe/dtype.h"

namespace fp4moe {
namespace sm90test {

constexpr int kCcCols = 16;          // SwiGLU columns a part (a CTA)
constexpr int kCcChunkBytes = 9216;  // one mbarrier's bytes
constexpr int kCcCodeBytes = 8192;   // a chunk's codes; its scales follow
constexpr int kCcChunkK = 512;       // FC1: K a chunk (32 k16 blocks, one a lane)
constexpr int kCcChunkRows = 1024;   // FC2: output rows a chunk (two a thread of 512)

inline int64_t cc_fc1_chunks(int64_t hidden) { return hidden / kCcChunkK; }
inline int64_t cc_fc2_chunks(int64_t hidden) { return hidden / kCcChunkRows; }
inline int64_t cc_part_bytes(int64_t hidden) {
  return (cc_fc1_chunks(hidden) + cc_fc2_chunks(hidden)) * kCcChunkBytes;
}

// A word of 8 codes -> (k0 k1), (k2 k3), (k4 k5), (k6 k7) as f16x2, each half e2m1 * 2^-14.
FP4MOE_HD void cc_decode_word(uint32_t w, uint32_t out[4]) {
  out[0] = w & 0x8E008E00u;
  out[1] = (w << 8) & 0x8E008E00u;
  const uint32_t r = ((w << 1) & 0x82828282u) | ((w >> 2) & 0x0C0C0C0Cu);  // second codes to the first's bits
  out[2] = r & 0xFF00FF00u;
#if defined(__CUDA_ARCH__)
  out[3] = __byte_perm(r, 0u, 0x2404);  // one PRMT
#else
  out[3] = (r << 8) & 0xFF00FF00u;
#endif
}

// Byte (in its word) and bit positions (m, e0, e1, sign) of code k % 8 of a word.
inline int cc_code_byte(int k) {
  constexpr int kByte[8] = {1, 3, 0, 2, 1, 3, 0, 2};
  return kByte[k % 8];
}
inline int cc_code_bit(int k, int bit) {
  constexpr int kBit[2][4] = {{1, 2, 3, 7}, {0, 4, 5, 6}};
  return kBit[(k % 8) / 4][bit];
}

// 16 e2m1 codes (k = 0..15) -> a block's 8 bytes.
inline void cc_encode_block(const uint8_t codes[16], uint8_t out[8]) {
  std::memset(out, 0, 8);
  for (int k = 0; k < 16; ++k)
    for (int bit = 0; bit < 4; ++bit)
      if ((codes[k] >> bit) & 1u) out[4 * (k / 8) + cc_code_byte(k)] |= static_cast<uint8_t>(1u << cc_code_bit(k, bit));
}

// Canonical FC1 (experts x 2 inter rows, K = hidden) and FC2 (experts x hidden rows, K = inter), codes then
// scales (src/engine/weight_layout.h) -> out[e][p] for p < inter / 16, cc_part_bytes(hidden) bytes each.
// hidden: a multiple of 1024; inter: a multiple of 16.
inline void pack_cc_layout(const uint8_t* fc1, const uint8_t* fc2, int64_t experts, int64_t hidden, int64_t inter,
                           uint8_t* out) {
  const int64_t rows1 = 2 * inter, rows2 = hidden, parts = inter / kCcCols;
  const uint8_t* scales1 = fc1 + experts * rows1 * hidden / 2;
  const uint8_t* scales2 = fc2 + experts * rows2 * inter / 2;
  // Block (row, k16 block kb) of a canonical code array with `k` columns -> 8 bytes at dst.
  auto block = [](const uint8_t* codes, int64_t k, int64_t row, int64_t kb, uint8_t* dst) {
    uint8_t c[16];
    for (int i = 0; i < 16; ++i) {
      const uint8_t b = codes[row * (k / 2) + (16 * kb + i) / 2];
      c[i] = static_cast<uint8_t>((i & 1) ? (b >> 4) : (b & 0xFu));
    }
    cc_encode_block(c, dst);
  };
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t p = 0; p < parts; ++p) {
      uint8_t* part = out + (e * parts + p) * cc_part_bytes(hidden);
      for (int64_t c = 0; c < cc_fc1_chunks(hidden); ++c)
        for (int w = 0; w < kCcCols; ++w)
          for (int l = 0; l < 32; ++l) {
            uint8_t* chunk = part + c * kCcChunkBytes;
            const int unit = 32 * w + l;
            const int64_t kb = 32 * c + l, gate = e * rows1 + kCcCols * p + w, up = gate + inter;
            block(fc1, hidden, gate, kb, chunk + 16 * unit);
            block(fc1, hidden, up, kb, chunk + 16 * unit + 8);
            chunk[kCcCodeBytes + 2 * unit] = scales1[gate * (hidden / 16) + kb];
            chunk[kCcCodeBytes + 2 * unit + 1] = scales1[up * (hidden / 16) + kb];
          }
      for (int64_t f = 0; f < cc_fc2_chunks(hidden); ++f)
        for (int t = 0; t < kCcChunkRows / 2; ++t)
          for (int h = 0; h < 2; ++h) {
            uint8_t* chunk = part + (cc_fc1_chunks(hidden) + f) * kCcChunkBytes;
            const int64_t row = e * rows2 + kCcChunkRows * f + 2 * t + h;
            block(fc2, inter, row, p, chunk + 16 * t + 8 * h);
            chunk[kCcCodeBytes + 2 * t + h] = scales2[row * (inter / 16) + p];
          }
    }
}

}  // namespace sm90test
}  // namespace fp4moe
