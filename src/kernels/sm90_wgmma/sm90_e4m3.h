// The e4m3 path's formats (docs/perf.md, sm90 steps 48-50; the e4m3 tile, tactics.def): a byte-wise packed
// weight layout whose codes decode to e4m3 wgmma A fragments in five integer operations a word, and the
// split of one token's bf16 activations into two e4m3 halves per 16-element block, so that one token's
// product with a weight tile runs on m64n8k32 e4m3 wgmmas with no loss against the bf16 activations.
// Host and device code share these definitions (the tests, sm90_e4m3.cuh).
//
// Weights, kSm90E4m3 layout. Same blocks as kSm90Interleaved (sm90_layout.h): one 2304-byte block per
// (expert, 64-row tile, k64 chunk), the same rows per tile (packed_row_source: FC1's gate and up of one
// output column in rows R0 and R1 of a quad), the same block order, so the weight producer's copies are
// the same; only the bytes inside a block differ.
//   codes: 16 bytes at 16*T for thread T of the consuming warpgroup (warp w = T/32, lane l, g = l/4,
//          q = l%4; rows R0 = 16w + g, R1 = R0 + 8). Word s (bytes 4s..4s+3) holds the chunk's k16 block s;
//          its byte i holds two codes of column k = 16s + 4q + i: row R0's at bits 7 (sign), 4, 3, 2
//          (e1, e0, m) and row R1's at bits 5 (sign), 6 (e1), 1 (e0), 0 (m).
//   scales: the quad (w, g)'s 8 bytes at 2048 + 8*(8w + g); byte 2s + r is the E5M3u scale
//          (sm90_layout.h: sign folded into the codes, zero scale -> zero codes) of row R_r, k16 block s,
//          so thread q reads the two scales of block q at 2048 + 8*(8w + g) + 2q.
// Decode of word s (decode_e4m3_word): r0 = w & 0x9C9C9C9C (row R0's four codes), r1 = ((w << 2) &
// 0x8C8C8C8C) | ((w >> 2) & 0x10101010) (row R1's): each byte then has the sign at bit 7 and e1 e0 m at
// bits 4..2, the e4m3 encoding of e2m1 * 2^-6 (e = 0 is e4m3's subnormal 2^-6 * m/2, E2M1's own rule).
// These are exactly the A fragments of wgmma m64nNk32 with 8-bit A in registers (PTX ISA: register j
// holds rows R0 (j even) / R1 (j odd), columns 4q + i (j < 2) / 16 + 4q + i (j >= 2), byte i = element
// i): words 0 and 1 feed the chunk's first k32 wgmma, words 2 and 3 its second.
//
// Tokens. One token x per 8 B columns (m64n8k32 e4m3): for k16 block j of a k64 chunk (j = 0..3), B's
// column 2j + p holds, at block j's 16 k, the half p of the split below, and zero at the chunk's other k.
// So the chunk's first wgmma (blocks 0, 1) writes D columns 0..3 and the second (blocks 2, 3) columns
// 4..7, and D[row][2j + p] is block j's partial product with half p: thread q holds block q's two
// columns, and applies the block's weight scale and activation exponent to their sum with one FFMA per
// row (e4m3_block_factor_bits), then the quad sums its four blocks at the item's end.
// Split of a block of 16 activations with largest magnitude M (e4m3_block_exponent): E = ilogb(M) - 7,
// clamped to [kE4m3MinExponent, kE4m3MaxExponent], xs = x * 2^-E (|xs| < 256 < 448), hi = e4m3(xs), lo =
// e4m3(xs - hi) (both rounded to nearest even). hi carries the top 4 significant bits and lo the next 4,
// so a bf16 x (8 bits) splits exactly unless lo falls below e4m3's subnormal step (2^-9), which loses
// at most 2^-10 * 2^E: under 2^-17 of the block's largest element.
// Stored bytes: sub-tile kb/2 (1 KB, 8 rows of 128 bytes, one row per column n, k contiguous) at byte
// 64 (kb % 2) + 16 j of row n = 2j + p, in 16-byte units swizzled like the bf16 token tiles (unit u of
// row n at u ^ (n % 8)): a block half is exactly one 16-byte unit. The wgmma descriptor of chunk kb's
// first k32 starts at sub-tile kb/2 + 64 (kb % 2) bytes, its second 32 bytes further.
// Scale of a block's contribution: D = sum (e2m1 * 2^-6) * (x * 2^-E); the epilogue expects
// sum e2m1 * scale * x * 2^-19 (kAccumulatorScale), so D is multiplied by scale * 2^(E - 13) =
// (scale * 2^107) * 2^(E - 120): the scale's E5M3u float with E - 120 added to its exponent field.
#pragma once
#include <cstdint>
#include <cstring>

#include "fp4moe/dtype.h"
#include "kernels/sm90_wgmma/sm90_layout.h"

namespace fp4moe {
namespace sm90 {

// Bit positions of a code's bits (0 m, 1 e0, 2 e1, 3 sign) in its byte, row part 0 (R0) and 1 (R1).
FP4MOE_HD int e4m3_code_bit(int part, int b) {
  constexpr int pos[2][4] = {{2, 3, 4, 7}, {0, 1, 6, 5}};
  return pos[part][b];
}
FP4MOE_HD uint8_t e4m3_place_code(uint8_t byte, int part, uint32_t code) {
  for (int b = 0; b < 4; ++b)
    if ((code >> b) & 1u) byte = static_cast<uint8_t>(byte | (1u << e4m3_code_bit(part, b)));
  return byte;
}
FP4MOE_HD uint32_t e4m3_extract_code(uint8_t byte, int part) {
  uint32_t code = 0;
  for (int b = 0; b < 4; ++b) code |= ((uint32_t(byte) >> e4m3_code_bit(part, b)) & 1u) << b;
  return code;
}

// Where the code of (packed row p, k-in-chunk kk) lives: its byte (from the block start) and row part.
struct E4m3CodeSite {
  int byte_offset;
  int part;
};
FP4MOE_HD E4m3CodeSite e4m3_code_site(int p, int kk) {
  const int w = p / 16, r = p % 16, g = r % 8, part = r / 8;
  const int s = kk / 16, q = (kk % 16) / 4, i = kk % 4;
  return {16 * (32 * w + 4 * g + q) + 4 * s + i, part};
}
// Byte (from the block start) of the E5M3u scale of (packed row p, k16 block s).
FP4MOE_HD int e4m3_scale_site(int p, int s) {
  const int w = p / 16, r = p % 16, g = r % 8, part = r / 8;
  return kPackCodeBytes + 8 * (8 * w + g) + 2 * s + part;
}

// A word of codes -> row R0's and row R1's four e4m3 bytes (see above).
FP4MOE_HD void decode_e4m3_word(uint32_t w, uint32_t& r0, uint32_t& r1) {
  r0 = w & 0x9C9C9C9Cu;
  r1 = ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u);
}

// Activation exponents of a block: E keeps |x| * 2^-E below 256 (e4m3 saturates at 448) and, with the
// clamp, the block factor's exponent field inside the normal range for every E5M3u scale.
constexpr int kE4m3MinExponent = -100;
constexpr int kE4m3MaxExponent = 120;
FP4MOE_HD int e4m3_block_exponent(float max_abs) {
  uint32_t u;
  memcpy(&u, &max_abs, 4);
  const int biased = static_cast<int>((u >> 23) & 0xFFu);  // 0 for zero and fp32 subnormals
  int e = biased - 127 - 7;
  if (e < kE4m3MinExponent) e = kE4m3MinExponent;
  if (e > kE4m3MaxExponent) e = kE4m3MaxExponent;
  return e;
}
// 2^e as an fp32 (e in [-126, 127]; the split uses 2^-E).
FP4MOE_HD float e4m3_pow2(int e) {
  const uint32_t u = static_cast<uint32_t>(127 + e) << 23;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// The fp32 bits of scale * 2^(E - 13) from an E5M3u scale byte u (the float of scale * 2^107 with E - 120
// added to its exponent field; u = 0, a zero scale whose codes are zero, gives a finite factor).
FP4MOE_HD uint32_t e4m3_block_factor_bits(uint32_t u, int e) {
  return ((((u << 20) & 0x0FF00000u) | 0x70000000u)) + (static_cast<uint32_t>(e - 120) << 23);
}

// Stored byte offset of column n (0..7), k-in-sub-tile kk (0..127) in a 1 KB e4m3 token sub-tile.
FP4MOE_HD int e4m3_token_offset(int n, int kk) { return n * 128 + (((kk / 16) ^ (n % 8)) * 16) + kk % 16; }

}  // namespace sm90
}  // namespace fp4moe
