// The weight layout of the no-hand-over probe (resident_cc.cu, docs/perf.md sm90 step 66): FC1's and FC2's
// parts of one (expert, 16 SwiGLU columns) back to back, so that one CTA reads its 18 chunks from one base.
// FC1's chunks are the library's kSm90Cc ones (src/kernels/sm90_wgmma/sm90_cc_layout.h, the resident
// tactic's); FC2's keep the layout kSm90Cc had when the probe was measured (step 66): chunk f's rows 2t and
// 2t + 1 hold 16 code bytes at 16t (row 2t's k16 block, then row 2t + 1's, each cc_encode_block's 8 bytes)
// and two scale bytes at 8192 + 2t.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "fp4moe/tactic.h"
#include "kernels/sm90_wgmma/sm90_cc_layout.h"
#include "kernels/sm90_wgmma/sm90_pack.h"

namespace fp4moe {
namespace sm90test {

using sm90::cc_decode_word;
using sm90::cc_encode_block;
using sm90::cc_fc1_chunks;
using sm90::cc_fc2_chunks;
using sm90::kCcChunkBytes;
using sm90::kCcChunkK;
using sm90::kCcChunkRows;
using sm90::kCcCodeBytes;
using sm90::kCcCols;

inline int64_t cc_part_bytes(int64_t hidden) {
  return (cc_fc1_chunks(hidden) + cc_fc2_chunks(hidden)) * kCcChunkBytes;
}

// Canonical FC1 (experts x 2 inter rows, K = hidden) and FC2 (experts x hidden rows, K = inter), codes then
// scales (src/engine/weight_layout.h) -> out[e][p] for p < inter / 16, cc_part_bytes(hidden) bytes each: the
// part's FC1 chunks as the library packs them, then its FC2 chunks in the probe's layout.
inline void pack_cc_layout(const uint8_t* fc1, const uint8_t* fc2, int64_t experts, int64_t hidden, int64_t inter,
                           uint8_t* out) {
  const GemmProblem p1{GemmOp::kFc1SwiGlu, experts, inter, hidden, 0, 0};
  const std::vector<uint8_t> a = sm90::pack_cc_cpu(p1, fc1);
  const int64_t parts = inter / kCcCols, bytes1 = cc_fc1_chunks(hidden) * kCcChunkBytes,
                bytes2 = cc_fc2_chunks(hidden) * kCcChunkBytes;
  const uint8_t* scales2 = fc2 + experts * hidden * (inter / 2);
  for (int64_t i = 0; i < experts * parts; ++i) {
    uint8_t* part = out + i * (bytes1 + bytes2);
    std::memcpy(part, a.data() + i * bytes1, static_cast<size_t>(bytes1));
    const int64_t e = i / parts, p = i % parts;
    for (int64_t f = 0; f < cc_fc2_chunks(hidden); ++f)
      for (int t = 0; t < kCcChunkRows / 2; ++t)
        for (int h = 0; h < 2; ++h) {
          uint8_t* chunk = part + bytes1 + f * kCcChunkBytes;
          const int64_t row = e * hidden + kCcChunkRows * f + 2 * t + h;
          uint8_t c[16];
          for (int k = 0; k < 16; ++k) {
            const uint8_t b = fc2[row * (inter / 2) + (16 * p + k) / 2];
            c[k] = static_cast<uint8_t>((k & 1) ? (b >> 4) : (b & 0xFu));
          }
          cc_encode_block(c, chunk + 16 * t + 8 * h);
          chunk[kCcCodeBytes + 2 * t + h] = scales2[row * (inter / 16) + p];
        }
  }
}

}  // namespace sm90test
}  // namespace fp4moe
