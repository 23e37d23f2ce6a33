// The kSm90Interleaved weight layout: NVFP4 weights shuffled once at engine creation so that one 16-byte
// shared-memory load gives a consumer thread exactly the E2M1 codes of its wgmma A fragments for four
// k16 steps, with every code's bits already where a shift and a mask turn it into a bf16 pair.
// Host and device code share these definitions (the pack kernel, the CPU pack/unpack, the tests).
//
// Blocks. The packed buffer is a sequence of 2304-byte blocks, one per (expert e, 64-row tile t, k64
// chunk c), in that order (c fastest):  offset = ((e * tiles + t) * kchunks + c) * 2304.
//   bytes [0, 2048):    codes, 128 x 16 bytes; the 16 bytes at 16*T belong to thread T of the consuming
//                       warpgroup (warp w = T/32, lane l; g = l/4, q = l%4).
//   bytes [2048, 2304): block scales, 32 x 8 bytes; the 8 bytes at 8*(8w + g) serve the quad (w, g).
// Rows are padded with zero codes to multiples of 64 and K to a multiple of 256 (kPackKAlign, so that a
// pipeline stage of any tactic is always whole); a tile's 64 packed rows are
//   FC2: weight rows 64t .. 64t+63.
//   FC1: packed row p = 16*w + i: output column j = 32t + 8w + (i % 8), gate row j when i < 8, up row
//        I + j when i >= 8. So a thread's accumulator rows R0 = 16w+g and R1 = R0+8 hold gate and up of
//        the same output column, and SwiGLU needs no data exchange.
//
// Codes of thread T, word s (bytes 4s..4s+3, little endian) = k16 step s of the chunk, k0 = 64c + 16s:
//   slot 0 -> A register a0: (R0, k0+2q) in the low half, (R0, k0+2q+1) in the high half
//   slot 1 -> a1: (R1, k0+2q | +1)   slot 2 -> a2: (R0, k0+2q+8 | +9)   slot 3 -> a3: (R1, k0+2q+8 | +9)
// Bit positions of a code's bits (m = mantissa, e0/e1 = exponent, s = sign) in the 32-bit word, low
// element (half 0) / high element (half 1); the pair of slot i comes out in bf16 bits m 6, e0 7, e1 8,
// s 15 of each half (22, 23, 24, 31 for the high element), M = 0x81C081C0:
//   slot 0: m 6 / 22,   e0 7 / 23,  e1 8 / 24,  s 15 / 31  -> w & M
//   slot 1: m 0 / 16,   e0 1 / 17,  e1 2 / 18,  s 9 / 25   -> (w << 6) & M
//   slot 2: m 28 / 12,  e0 29 / 13, e1 30 / 14, s 5 / 21   -> rotl(w, 10) & M
//   slot 3: m 10 / 26,  e0 3 / 19,  e1 4 / 20,  s 11 / 27  -> ((w >> 4) & 0x00400040) | ((w << 4) & 0x81808180)
// (decode_code_word below): 9 integer operations for 8 codes, five masks (LOP3, two for slot 3) and
// four shifts, one of them a rotation. The output pattern {6, 7, 8, 15, 22, 23, 24, 31} cannot tile 32
// bits (nor 64 or 128 across words) with four shifts or rotations, so one slot needs two pieces; and an
// exhaustive search over shifts, rotations and two-piece splits finds no placement without a rotation.
// The previous placement (the same in both halves, slot 3 from three pieces) took 11.
// With m at bf16 bit 6 and e1e0 at bits 8..7 the bf16 value is exactly e2m1 * 2^-126 (e = 0 gives the
// bf16 subnormal 0.m * 2^-126, which is E2M1's own subnormal rule), so no table and no add is needed.
//
// Scales of quad (w, g), 8 bytes = words u0 (k16 steps 0, 1) and u1 (steps 2, 3):
//   u0 bytes = [sc(R0, s0), sc(R0, s1), sc(R1, s0), sc(R1, s1)], u1 likewise for steps 2 and 3.
// Each byte is the block scale transcoded from E4M3 to "E5M3u": 5 exponent bits with bias -10, 3
// mantissa bits, no sign, no subnormals (0 means zero, 0xFF NaN), so that
//   ((u << 4) & 0x0FF00FF0) | 0x70007000   (u >> 4 for odd steps)
// is the bf16 pair (scale(R0) * 2^107, scale(R1) * 2^107), exact for every E4M3 value including
// subnormals. A negative scale is folded into the codes' sign bits; a zero scale zeroes its codes.
// Product: (e2m1 * 2^-126) * (scale * 2^107) = e2m1 * scale * 2^-19, exact and normal in bf16; the
// epilogue multiplies the fp32 accumulator by tensor_scale * 2^19 (kSm90AccumulatorScale).
#pragma once
#include <cstdint>

#include "fp4moe/dtype.h"
#include "fp4moe/tactic.h"

namespace fp4moe {
namespace sm90 {

constexpr int kPackRows = 64;          // weight rows per packed tile (one wgmma M)
constexpr int kPackK = 64;             // k per packed chunk (four k16 steps)
constexpr int kPackKAlign = 256;       // K is zero-padded to this, so every tactic's BK divides it
constexpr int kPackCodeBytes = 2048;   // 64 x 64 codes
constexpr int kPackScaleBytes = 256;   // 64 rows x 4 block scales
constexpr int kPackBlockBytes = kPackCodeBytes + kPackScaleBytes;
constexpr float kAccumulatorScale = 524288.0f;  // 2^19, see the product above
static_assert(kPackBlockBytes % 16 == 0, "packed blocks must stay 16-byte aligned for bulk copies");

// Bit position (0..31) of code bit b (0 m, 1 e0, 2 e1, 3 s) of slot `slot`, element `half` of a word.
FP4MOE_HD int code_bit_position(int slot, int half, int b) {
  constexpr int pos[4][2][4] = {{{6, 7, 8, 15}, {22, 23, 24, 31}},
                                {{0, 1, 2, 9}, {16, 17, 18, 25}},
                                {{28, 29, 30, 5}, {12, 13, 14, 21}},
                                {{10, 3, 4, 11}, {26, 19, 20, 27}}};
  return pos[slot][half][b];
}

// Puts a 4-bit E2M1 code into slot `slot`, half `half` (0 low element, 1 high element) of a word.
FP4MOE_HD uint32_t place_code(uint32_t word, int slot, int half, uint32_t code) {
  for (int b = 0; b < 4; ++b)
    if ((code >> b) & 1u) word |= 1u << code_bit_position(slot, half, b);
  return word;
}
FP4MOE_HD uint32_t extract_code(uint32_t word, int slot, int half) {
  uint32_t code = 0;
  for (int b = 0; b < 4; ++b) code |= ((word >> code_bit_position(slot, half, b)) & 1u) << b;
  return code;
}

constexpr uint32_t kCodeMask = 0x81C081C0u;  // bf16 bits 15, 8, 7, 6 of both halves

// One word of codes -> the bf16 bits of its four pairs (value e2m1 * 2^-126 each), the kernel's own
// formulas (the tests run them on the host). On the device the rotation is one funnel shift (SHF.L.W).
FP4MOE_HD void decode_code_word(uint32_t w, uint32_t (&pair)[4]) {
#if defined(__CUDA_ARCH__)
  const uint32_t r10 = __funnelshift_l(w, w, 10);
#else
  const uint32_t r10 = (w << 10) | (w >> 22);
#endif
  pair[0] = w & kCodeMask;
  pair[1] = (w << 6) & kCodeMask;
  pair[2] = r10 & kCodeMask;
  pair[3] = ((w >> 4) & 0x00400040u) | ((w << 4) & 0x81808180u);
}

// E4M3 magnitude (sign ignored) -> E5M3u byte; see the layout comment.
FP4MOE_HD uint8_t e4m3_to_e5m3u(uint8_t e4m3) {
  const uint32_t mag = e4m3 & 0x7Fu;
  if (mag == 0x7Fu) return 0xFF;  // NaN stays NaN
  if (mag == 0) return 0;
  uint32_t e = mag >> 3, m = mag & 7u;
  if (e >= 1) return static_cast<uint8_t>(((e + 3u) << 3) | m);  // 2^(e-7) -> field (e-7)+10
  int shift = 0;                                                 // subnormal m * 2^-9: normalise
  while ((m & 8u) == 0) { m <<= 1; ++shift; }
  return static_cast<uint8_t>(((4u - shift) << 3) | (m & 7u));
}
// The bf16 bits of (scale * 2^107) that the kernel builds from an E5M3u byte.
FP4MOE_HD uint16_t e5m3u_to_bf16_bits(uint8_t u) { return static_cast<uint16_t>((uint32_t(u) << 4) | 0x7000u); }

// Geometry of a packed problem.
struct PackGeometry {
  bool fc1 = false;
  int64_t experts = 0;
  int64_t n = 0;          // output columns (FC1: I, FC2: H)
  int64_t k = 0;          // reduction
  int64_t rows = 0;       // canonical weight rows per expert (FC1 2I, FC2 H)
  int64_t tiles = 0;      // 64-row packed tiles per expert
  int64_t kchunks = 0;    // k64 chunks per expert
  int64_t block_index(int64_t e, int64_t t, int64_t c) const { return (e * tiles + t) * kchunks + c; }
  int64_t bytes() const { return experts * tiles * kchunks * kPackBlockBytes; }
};
inline PackGeometry pack_geometry(const GemmProblem& p) {
  PackGeometry g;
  g.fc1 = p.op == GemmOp::kFc1SwiGlu;
  g.experts = p.num_experts;
  g.n = p.n;
  g.k = p.k;
  g.rows = weight_rows(p);
  g.tiles = g.fc1 ? (p.n + 31) / 32 : (p.n + 63) / 64;
  g.kchunks = (p.k + kPackKAlign - 1) / kPackKAlign * (kPackKAlign / kPackK);
  return g;
}

// Canonical weight row of packed row p (0..63) in tile t, or -1 for padding.
FP4MOE_HD int64_t packed_row_source(bool fc1, int64_t n, int64_t t, int p) {
  if (fc1) {
    const int64_t j = 32 * t + 8 * (p / 16) + (p % 8);
    if (j >= n) return -1;
    return (p % 16) < 8 ? j : n + j;
  }
  const int64_t r = 64 * t + p;
  return r < n ? r : -1;
}

// Where the code of (packed row p, k-in-chunk kk) lives: byte offset of its word in the code area, slot
// and half. Inverse of the table in the header comment.
struct CodeSite {
  int word_offset;  // bytes from the block start, multiple of 4
  int slot, half;
};
FP4MOE_HD CodeSite code_site(int p, int kk) {
  const int w = p / 16, r = p % 16, g = r % 8, hi_row = r / 8;
  const int s = kk / 16, kr = kk % 16, hi_k = kr / 8, q = (kr % 8) / 2, half = kr % 2;
  const int thread = 32 * w + 4 * g + q;
  return {16 * thread + 4 * s, hi_row + 2 * hi_k, half};
}
// Byte offset (from the block start) of the scale of (packed row p, k16 step s).
FP4MOE_HD int scale_site(int p, int s) {
  const int w = p / 16, r = p % 16, g = r % 8, hi_row = r / 8;
  return kPackCodeBytes + 8 * (8 * w + g) + 4 * (s / 2) + 2 * hi_row + (s % 2);
}

}  // namespace sm90
}  // namespace fp4moe
