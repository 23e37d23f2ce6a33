// The kSm90Cc weight layout of the sm90 resident tactic (sm90_cc.cu, docs/perf.md sm90 steps 66-67):
// weights whose CTA of 16 SwiGLU columns reads them whole with a few bulk copies and multiplies them on
// the CUDA cores as f16x2. Host and device code share these definitions (the CPU pack, the device pack,
// the kernel, the CPU test cc_layout_test.cpp).
//
// A part is 16 SwiGLU columns of one expert (FC1's N, FC2's K: inter / 16 parts an expert). Each GEMM
// is packed on its own, part after part ([E][inter / 16][chunks]), every chunk 9,216 bytes (one
// mbarrier's copy): 8,192 bytes of codes, then 1,024 of e4m3 scales as stored.
//   FC1 (K = hidden), chunk c covers K c*512 .. + 511: unit u = 32w + l (w: column 16p + w of part p,
//     l: k16 block 32c + l) holds 16 code bytes at 16u (the gate row's block, then the up row's) and two
//     scale bytes at 8192 + 2u (gate, up). hidden / 512 chunks a part.
//   FC2 (N = hidden), chunk f covers output rows f*1024 .. + 1023 over the part's k16 block p, its codes as
//     8 planes of 1,024 bytes, one a column pair: plane j (SwiGLU columns 16p + 2j and 16p + 2j + 1) holds
//     word v (rows 4v .. 4v + 3 of the chunk, both columns of each) at 1024j + 4v, and row i's e4m3 scale is
//     byte 8192 + i. So the two columns of a pair are 1,024 contiguous code bytes a chunk: the chained launch
//     that spreads the folded last expert's row over the other rows' CTAs (two of its columns a CTA) reads a
//     pair's plane. hidden / 1024 chunks a part.
// Codes are encoded 16 at a time (cc_encode_block: 8 bytes, word 0 codes 0..7, word 1 codes 8..15); a word
// decodes to four f16x2 values (codes 0 1, 2 3, 4 5, 6 7). FC1's blocks are a row's 16 k; FC2's are two words
// of a plane, code 2i + c of a word being row 4v + i, column 2j + c. In a word, byte 1 holds
// k0 and k4, byte 3 k1 and k5, byte 0 k2 and k6, byte 2 k3 and k7; the first of each at bits 7 (sign), 3, 2,
// 1 (e1, e0, m), the second at bits 6 (sign), 5, 4, 0. cc_decode_word turns a word into four f16x2 values
// (k0 k1, k2 k3, k4 k5, k6 k7) with 9 operations: each half is an e5m2 byte in the half's high byte, which is
// the e2m1 value times 2^-14 exactly (e = 0 is f16's subnormal 2^-14 * m/2, E2M1's own rule). The scales
// stay e4m3 (their sign and zero need no folding: the kernel converts them with cvt.f16x2.e4m3x2).
#pragma once
#include <cstdint>

#include "fp4moe/dtype.h"

namespace fp4moe {
namespace sm90 {

constexpr int kCcCols = 16;          // SwiGLU columns a part (a CTA): FC1's N, FC2's K
constexpr int kCcChunkBytes = 9216;  // one mbarrier's bytes
constexpr int kCcCodeBytes = 8192;   // a chunk's codes; its scales follow
constexpr int kCcChunkK = 512;       // FC1: K a chunk (32 k16 blocks, one a lane)
constexpr int kCcChunkRows = 1024;   // FC2: output rows a chunk (four a thread of half of kCcThreads)
constexpr int kCcThreads = 512;      // 16 warps: FC1 one SwiGLU column a warp
// A CTA: the kCcThreads math threads and one producer warp that issues the bulk copies, so that no math warp
// waits for the copies' issue (about 0.1 us a copy: 2 us for a chained launch's 19 at hidden 6144).
constexpr int kCcLaunchThreads = kCcThreads + 32;
constexpr int kCcUnits = 512;        // units a chunk (16 code bytes and 2 scale bytes each)
constexpr int kCcMaxExperts = 1024;  // the expert lookup: 32 bounds a lane of a warp
constexpr int kCcRedFloats = 48;     // per-warp values, then the 16 SwiGLU values

// Chunks of a part of FC1 (K = hidden) or FC2 (N = hidden).
FP4MOE_HD constexpr int64_t cc_fc1_chunks(int64_t hidden) { return hidden / kCcChunkK; }
FP4MOE_HD constexpr int64_t cc_fc2_chunks(int64_t hidden) { return hidden / kCcChunkRows; }
// Bytes of an op's packed buffer: experts * parts * chunks * kCcChunkBytes (the canonical size, codes and
// scales). fc1: whether the op is FC1 (hidden = its K) or FC2 (hidden = its N); inter: FC1's N, FC2's K.
FP4MOE_HD constexpr int64_t cc_packed_bytes(bool fc1, int64_t experts, int64_t hidden, int64_t inter) {
  return experts * (inter / kCcCols) * (fc1 ? cc_fc1_chunks(hidden) : cc_fc2_chunks(hidden)) * kCcChunkBytes;
}
// Dynamic shared memory of a launch: the token (bf16, then its f16 copy) where FC1 runs, the chunks of the
// GEMMs it runs, one mbarrier per chunk and one for the token, and the CTA's reduction floats.
FP4MOE_HD constexpr int64_t cc_smem_bytes(bool run_fc1, bool run_fc2, int64_t hidden) {
  const int64_t chunks = (run_fc1 ? cc_fc1_chunks(hidden) : 0) + (run_fc2 ? cc_fc2_chunks(hidden) : 0);
  return (run_fc1 ? 4 * hidden : 0) + chunks * kCcChunkBytes + (chunks + 1) * 8 + kCcRedFloats * 4;
}

// The chained launch's spread form (sm90_cc.cu): besides its own part, CTA (r, p) of the R = 8 routed rows
// holds column pair q = parts r + p of the folded last expert's one row (its SwiGLU columns 2q, 2q + 1): per FC1
// chunk that pair's 64 units (1,024 code bytes, then their 128 scale bytes), per FC2 chunk its plane (1,024
// code bytes, then the chunk's 1,024 row scales).
constexpr int kCcSpreadRows = 8;             // routed rows: 8 x parts CTAs hold the inter / 2 column pairs
constexpr int kCcSpread1Bytes = 1024 + 128;  // a pair's FC1 slice of a chunk
constexpr int kCcSpread2Bytes = 1024 + 1024; // a pair's FC2 plane of a chunk and the chunk's row scales
FP4MOE_HD constexpr int64_t cc_spread_bytes(int64_t hidden) {
  return cc_fc1_chunks(hidden) * kCcSpread1Bytes + cc_fc2_chunks(hidden) * kCcSpread2Bytes;
}
// The chained launch's shared memory in the spread form.
FP4MOE_HD constexpr int64_t cc_spread_smem_bytes(int64_t hidden) {
  return cc_smem_bytes(true, true, hidden) + cc_spread_bytes(hidden);
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

// Byte (in its word) and bit positions (m, e0, e1, sign) of code k % 8 of a word: bytes 1, 3, 0, 2 for
// k % 4 = 0..3; bits 1, 2, 3, 7 for k % 8 < 4, else 0, 4, 5, 6 (nibble tables, no arrays in device code).
FP4MOE_HD int cc_code_byte(int k) { return (0x2031 >> (4 * (k % 4))) & 0xF; }
FP4MOE_HD int cc_code_bit(int k, int bit) { return (((k % 8) < 4 ? 0x7321 : 0x6540) >> (4 * bit)) & 0xF; }

// 16 e2m1 codes (k = 0..15) -> a block's 8 bytes.
FP4MOE_HD void cc_encode_block(const uint8_t codes[16], uint8_t out[8]) {
  for (int i = 0; i < 8; ++i) out[i] = 0;
  for (int k = 0; k < 16; ++k)
    for (int bit = 0; bit < 4; ++bit)
      if ((codes[k] >> bit) & 1u) out[4 * (k / 8) + cc_code_byte(k)] |= static_cast<uint8_t>(1u << cc_code_bit(k, bit));
}

// One unit of the packed buffer from canonical bytes: codes [E][R][K/2] then scales [E][R][K/16] (R: FC1
// 2 * inter gate-then-up rows, FC2 hidden), K: FC1 hidden, FC2 inter. Unit `unit` of chunk `chunk` of part
// `part` of expert e -> 16 code bytes at codes_dst, 2 scale bytes at scales_dst.
FP4MOE_HD void cc_pack_unit(bool fc1, const uint8_t* canonical, int64_t experts, int64_t hidden, int64_t inter,
                            int64_t e, int64_t part, int64_t chunk, int unit, uint8_t* codes_dst, uint8_t* scales_dst) {
  const int64_t rows = fc1 ? 2 * inter : hidden, k = fc1 ? hidden : inter;
  const uint8_t* codes = canonical;
  const uint8_t* scales = canonical + experts * rows * (k / 2);
  auto code = [&](int64_t r, int64_t col) {
    const uint8_t b = codes[(e * rows + r) * (k / 2) + col / 2];
    return static_cast<uint8_t>((col & 1) ? (b >> 4) : (b & 0xFu));
  };
  for (int h = 0; h < 2; ++h) {
    uint8_t c[16];
    int64_t srow, kb;
    if (fc1) {  // unit u = 32w + l: the gate (h = 0) or up row of column 16p + w over k16 block 32c + l
      srow = kCcCols * part + unit / 32 + (h ? inter : 0);
      kb = 32 * chunk + unit % 32;
      for (int i = 0; i < 16; ++i) c[i] = code(srow, 16 * kb + i);
    } else {  // unit u: words 4(u % 64) + 2h, + 1 of plane u / 64; the scales of rows 2u, 2u + 1
      const int j = unit / 64, v = 4 * (unit % 64) + 2 * h;
      for (int i = 0; i < 16; ++i)
        c[i] = code(kCcChunkRows * chunk + 4 * (v + i / 8) + (i % 8) / 2, kCcCols * part + 2 * j + (i & 1));
      srow = kCcChunkRows * chunk + 2 * unit + h;
      kb = part;
    }
    cc_encode_block(c, codes_dst + 8 * h);
    scales_dst[h] = scales[(e * rows + srow) * (k / 16) + kb];
  }
}

// The byte offset of (expert e, part, chunk) in an op's packed buffer.
FP4MOE_HD int64_t cc_chunk_offset(bool fc1, int64_t hidden, int64_t inter, int64_t e, int64_t part, int64_t chunk) {
  const int64_t chunks = fc1 ? cc_fc1_chunks(hidden) : cc_fc2_chunks(hidden);
  return ((e * (inter / kCcCols) + part) * chunks + chunk) * kCcChunkBytes;
}

}  // namespace sm90
}  // namespace fp4moe
