// Canonical NVFP4 weights -> the kSm90Interleaved layout (sm90_layout.h), on the CPU (the description the
// tests check the device pack against, and its inverse) and on the device (sm90_pack.cu, once at engine
// creation).
//
// Canonical bytes for E experts, R weight rows (FC1 2I gate-then-up, FC2 H), K columns:
//   codes [E][R][K/2] uint8 (element 2i low nibble), then block scales [E][R][K/16] e4m3fn.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fp4moe/nvfp4.h"
#include "fp4moe/tactic.h"
#include "kernels/sm90_wgmma/sm90_layout.h"

namespace fp4moe {
namespace sm90 {

// The code the kernel must see for canonical code `code` under block scale `scale` (E4M3 byte): the
// scale's sign moves into the code, a zero (or -0) scale makes the code zero.
FP4MOE_HD uint32_t effective_code(uint32_t code, uint8_t scale) {
  if ((scale & 0x7Fu) == 0) return 0;
  return (scale & 0x80u) ? (code ^ 8u) : code;
}

// Canonical code and scale of (expert e, canonical row r, column k); zero outside [0, K).
struct CanonicalView {
  const uint8_t* codes = nullptr;   // [E][R][K/2]
  const uint8_t* scales = nullptr;  // [E][R][K/16]
  int64_t rows = 0, k = 0;
  FP4MOE_HD uint32_t code(int64_t e, int64_t r, int64_t kk) const {
    const uint8_t b = codes[(e * rows + r) * (k / 2) + kk / 2];
    return (kk & 1) ? (b >> 4) : (b & 0xFu);
  }
  FP4MOE_HD uint8_t scale(int64_t e, int64_t r, int64_t kk) const { return scales[(e * rows + r) * (k / 16) + kk / 16]; }
};
inline CanonicalView canonical_view(const PackGeometry& g, const void* canonical) {
  const uint8_t* base = static_cast<const uint8_t*>(canonical);
  return {base, base + g.experts * g.rows * (g.k / 2), g.rows, g.k};
}

// One packed block (expert e, tile t, chunk c) from canonical bytes into dst[kPackBlockBytes].
void pack_block_cpu(const PackGeometry& g, const CanonicalView& src, int64_t e, int64_t t, int64_t c, uint8_t* dst);
// The whole packed buffer (g.bytes() bytes) from canonical bytes.
std::vector<uint8_t> pack_cpu(const GemmProblem& p, const void* canonical);
// The inverse view: the unscaled weight value (e2m1 * block scale, as the kernel multiplies it) of
// (expert e, canonical row r, column k) read back from a packed buffer.
float packed_weight_unscaled(const PackGeometry& g, const uint8_t* packed, int64_t e, int64_t r, int64_t k);

// The kSm90E4m3 layout (sm90_e4m3.h) on the CPU: one block, the whole buffer (same geometry and size as
// kSm90Interleaved), and the inverse view with the e4m3 path's arithmetic (e4m3(code) * 2^6 * scale).
void pack_e4m3_block_cpu(const PackGeometry& g, const CanonicalView& src, int64_t e, int64_t t, int64_t c, uint8_t* dst);
std::vector<uint8_t> pack_e4m3_cpu(const GemmProblem& p, const void* canonical);
float packed_e4m3_weight_unscaled(const PackGeometry& g, const uint8_t* packed, int64_t e, int64_t r, int64_t k);

// The kSm90Cc layout (sm90_cc_layout.h) of the resident tactic on the CPU: the whole buffer of one GEMM
// (FC1: hidden = K, inter = N; FC2: hidden = N, inter = K; hidden a multiple of 1024, inter a
// multiple of 16). std::invalid_argument naming the problem for any other shape.
std::vector<uint8_t> pack_cc_cpu(const GemmProblem& p, const void* canonical);
// Whether the kSm90Cc layout holds the problem's shape; the reason in *why when not.
bool cc_layout_fits(const GemmProblem& p, std::string* why);

#ifdef FP4MOE_HAVE_CUDA
size_t packed_bytes(const GemmProblem& p);
size_t cc_packed_bytes_of(const GemmProblem& p);                                         // kSm90Cc
Status pack_cc_device(const GemmProblem& p, const void* canonical, void* dst, Stream stream);  // kSm90Cc
Status pack_device(const GemmProblem& p, const void* canonical, void* dst, Stream stream);
Status pack_e4m3_device(const GemmProblem& p, const void* canonical, void* dst, Stream stream);  // kSm90E4m3
#endif

}  // namespace sm90
}  // namespace fp4moe
