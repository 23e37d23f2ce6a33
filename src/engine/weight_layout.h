// The canonical device weight layout (WeightLayout::kCanonical, include/fp4moe/tactic.h), which the engine
// uploads or generates once and from which every family packs its own layout:
//
//   one buffer per grouped GEMM, E experts, Nw weight rows (FC1: 2I = gate rows 0..I-1, then up rows
//   I..2I-1; FC2: H), K columns:
//     [0, E*Nw*K/2)                       codes  [E][Nw][K/2]  uint8, code 2i in the low nibble
//     [E*Nw*K/2, E*Nw*K/2 + E*Nw*K/16)    scales [E][Nw][K/16] e4m3fn, one per 16 codes along K
//   tensor scales live in separate fp32 arrays: FC1 [E][2] (gate, up), FC2 [E].
#pragma once
#include <cstdint>

#include "fp4moe/tactic.h"

namespace fp4moe {

inline int64_t canonical_code_bytes(int64_t experts, int64_t rows, int64_t k) { return experts * rows * (k / 2); }
inline int64_t canonical_scale_bytes(int64_t experts, int64_t rows, int64_t k) { return experts * rows * (k / 16); }
inline int64_t canonical_weight_bytes(int64_t experts, int64_t rows, int64_t k) {
  return canonical_code_bytes(experts, rows, k) + canonical_scale_bytes(experts, rows, k);
}
inline int64_t canonical_weight_bytes(const GemmProblem& p) {
  return canonical_weight_bytes(p.num_experts, weight_rows(p), p.k);
}
// Byte offset of expert e's codes / scales inside the buffer.
inline int64_t canonical_codes_offset(int64_t e, int64_t rows, int64_t k) { return e * rows * (k / 2); }
inline int64_t canonical_scales_offset(int64_t experts, int64_t e, int64_t rows, int64_t k) {
  return canonical_code_bytes(experts, rows, k) + e * rows * (k / 16);
}

}  // namespace fp4moe
