// The weight layout of the no-hand-over probe (resident_cc.cu, docs/perf.md sm90 step 66): the library's
// kSm90Cc layout (src/kernels/sm90_wgmma/sm90_cc_layout.h, the resident tactic's), FC1's and FC2's parts of
// one (expert, 16 SwiGLU columns) back to back, so that one CTA reads its 18 chunks from one base.
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
// part's FC1 chunks, then its FC2 chunks, each as the library packs them.
inline void pack_cc_layout(const uint8_t* fc1, const uint8_t* fc2, int64_t experts, int64_t hidden, int64_t inter,
                           uint8_t* out) {
  const GemmProblem p1{GemmOp::kFc1SwiGlu, experts, inter, hidden, 0, 0},
      p2{GemmOp::kFc2, experts, hidden, inter, 0, 0};
  const std::vector<uint8_t> a = sm90::pack_cc_cpu(p1, fc1), b = sm90::pack_cc_cpu(p2, fc2);
  const int64_t parts = experts * (inter / kCcCols), bytes1 = cc_fc1_chunks(hidden) * kCcChunkBytes,
                bytes2 = cc_fc2_chunks(hidden) * kCcChunkBytes;
  for (int64_t i = 0; i < parts; ++i) {
    std::memcpy(out + i * (bytes1 + bytes2), a.data() + i * bytes1, static_cast<size_t>(bytes1));
    std::memcpy(out + i * (bytes1 + bytes2) + bytes1, b.data() + i * bytes2, static_cast<size_t>(bytes2));
  }
}

}  // namespace sm90test
}  // namespace fp4moe
