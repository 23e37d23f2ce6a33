// CPU description of the kSm90Interleaved and kSm90E4m3 packs (sm90_layout.h, sm90_e4m3.h) and their
// inverses, used by the tests to check the device packs byte for byte and to check that the layouts
// round-trip to the canonical values.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/sm90_wgmma/sm90_cc_layout.h"
#include "kernels/sm90_wgmma/sm90_e4m3.h"
#include "kernels/sm90_wgmma/sm90_pack.h"

namespace fp4moe {
namespace sm90 {

namespace {
// Zeroes block (e, t, c) at dst, then calls place(p, kk, code, scale) for every (packed row p, k-in-chunk
// kk) that holds a weight: the code as the kernel must see it (effective_code) and the canonical E4M3
// scale. Padding rows and columns stay zero.
template <class Place>
void fill_block(const PackGeometry& g, const CanonicalView& src, int64_t e, int64_t t, int64_t c, uint8_t* dst,
                Place place) {
  std::memset(dst, 0, kPackBlockBytes);
  for (int p = 0; p < kPackRows; ++p) {
    const int64_t r = packed_row_source(g.fc1, g.n, t, p);
    if (r < 0) continue;
    for (int kk = 0; kk < kPackK; ++kk) {
      const int64_t k = c * kPackK + kk;
      if (k >= g.k) break;
      const uint8_t sc = src.scale(e, r, k);
      place(p, kk, effective_code(src.code(e, r, k), sc), sc);
    }
  }
}

// Where (expert e, canonical row r, column k) sits in a packed buffer: its block, packed row p (the
// inverse of packed_row_source) and k-in-chunk kk. Both layouts share it.
struct PackedSite {
  const uint8_t* block;
  int p, kk;
};
PackedSite packed_site(const PackGeometry& g, const uint8_t* packed, int64_t e, int64_t r, int64_t k) {
  int64_t t = 0;
  int p = 0;
  if (g.fc1) {
    const int64_t j = r < g.n ? r : r - g.n;
    t = j / 32;
    const int64_t jj = j % 32;
    p = static_cast<int>(16 * (jj / 8) + (jj % 8) + (r < g.n ? 0 : 8));
  } else {
    t = r / 64;
    p = static_cast<int>(r % 64);
  }
  return {packed + g.block_index(e, t, k / kPackK) * kPackBlockBytes, p, static_cast<int>(k % kPackK)};
}

using BlockPacker = void (*)(const PackGeometry&, const CanonicalView&, int64_t, int64_t, int64_t, uint8_t*);
std::vector<uint8_t> pack_all_cpu(const GemmProblem& p, const void* canonical, BlockPacker pack_block) {
  const PackGeometry g = pack_geometry(p);
  const CanonicalView src = canonical_view(g, canonical);
  std::vector<uint8_t> out(static_cast<size_t>(g.bytes()));
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t t = 0; t < g.tiles; ++t)
      for (int64_t c = 0; c < g.kchunks; ++c) pack_block(g, src, e, t, c, out.data() + g.block_index(e, t, c) * kPackBlockBytes);
  return out;
}
}  // namespace

void pack_block_cpu(const PackGeometry& g, const CanonicalView& src, int64_t e, int64_t t, int64_t c, uint8_t* dst) {
  fill_block(g, src, e, t, c, dst, [dst](int p, int kk, uint32_t code, uint8_t sc) {
    const CodeSite site = code_site(p, kk);
    uint32_t word;
    std::memcpy(&word, dst + site.word_offset, 4);
    word = place_code(word, site.slot, site.half, code);
    std::memcpy(dst + site.word_offset, &word, 4);
    if (kk % 16 == 0) dst[scale_site(p, kk / 16)] = e4m3_to_e5m3u(sc);
  });
}

std::vector<uint8_t> pack_cpu(const GemmProblem& p, const void* canonical) { return pack_all_cpu(p, canonical, &pack_block_cpu); }

void pack_e4m3_block_cpu(const PackGeometry& g, const CanonicalView& src, int64_t e, int64_t t, int64_t c, uint8_t* dst) {
  fill_block(g, src, e, t, c, dst, [dst](int p, int kk, uint32_t code, uint8_t sc) {
    const E4m3CodeSite site = e4m3_code_site(p, kk);
    dst[site.byte_offset] = e4m3_place_code(dst[site.byte_offset], site.part, code);
    if (kk % 16 == 0) dst[e4m3_scale_site(p, kk / 16)] = e4m3_to_e5m3u(sc);
  });
}

std::vector<uint8_t> pack_e4m3_cpu(const GemmProblem& p, const void* canonical) {
  return pack_all_cpu(p, canonical, &pack_e4m3_block_cpu);
}

float packed_e4m3_weight_unscaled(const PackGeometry& g, const uint8_t* packed, int64_t e, int64_t r, int64_t k) {
  const auto [block, p, kk] = packed_site(g, packed, e, r, k);
  const E4m3CodeSite site = e4m3_code_site(p, kk);
  // The kernel's decode of the code's word, then the byte as e4m3 (e2m1 * 2^-6).
  uint32_t word;
  std::memcpy(&word, block + (site.byte_offset & ~3), 4);
  uint32_t r0, r1;
  decode_e4m3_word(word, r0, r1);
  const uint8_t byte = static_cast<uint8_t>(((site.part ? r1 : r0) >> (8 * (site.byte_offset & 3))) & 0xFFu);
  const double scale = std::ldexp(static_cast<double>(bf16_bits_to_f32(e5m3u_to_bf16_bits(block[e4m3_scale_site(p, kk / 16)]))), -107);
  return static_cast<float>(std::ldexp(static_cast<double>(e4m3_decode(byte)), 6) * scale);
}

float packed_weight_unscaled(const PackGeometry& g, const uint8_t* packed, int64_t e, int64_t r, int64_t k) {
  const auto [block, p, kk] = packed_site(g, packed, e, r, k);
  const CodeSite site = code_site(p, kk);
  uint32_t word;
  std::memcpy(&word, block + site.word_offset, 4);
  const uint32_t code = extract_code(word, site.slot, site.half);
  // The kernel's arithmetic: bf16(code * 2^-126) * bf16(scale * 2^107), then * 2^19 in the epilogue.
  const float code_val = bf16_bits_to_f32(static_cast<uint16_t>(
      (((code >> 2) & 1u) << 8) | (((code >> 1) & 1u) << 7) | ((code & 1u) << 6) | ((code & 8u) ? 0x8000u : 0u)));
  const float scale_val = bf16_bits_to_f32(e5m3u_to_bf16_bits(block[scale_site(p, kk / 16)]));
  return code_val * scale_val * kAccumulatorScale;
}

bool cc_layout_fits(const GemmProblem& p, std::string* why) {
  const bool fc1 = p.op == GemmOp::kFc1SwiGlu;
  const int64_t hidden = fc1 ? p.k : p.n, inter = fc1 ? p.n : p.k;
  const char* what = nullptr;
  if (p.num_experts <= 0 || hidden <= 0 || inter <= 0)
    what = "needs at least one expert and positive N and K";
  else if (inter % kCcCols != 0)
    what = fc1 ? "needs N (the SwiGLU width) to be a multiple of 16"
               : "needs K (the SwiGLU width) to be a multiple of 16";
  else if (hidden % kCcChunkRows != 0)
    what = fc1 ? "needs K (the hidden size) to be a multiple of 1024"
               : "needs N (the hidden size) to be a multiple of 1024";
  if (what && why) *why = fmt::format("{}, problem is {}", what, p.to_string());
  return what == nullptr;
}

std::vector<uint8_t> pack_cc_cpu(const GemmProblem& p, const void* canonical) {
  std::string why;
  if (!cc_layout_fits(p, &why)) throw std::invalid_argument("kSm90Cc pack: " + why);
  const bool fc1 = p.op == GemmOp::kFc1SwiGlu;
  const int64_t hidden = fc1 ? p.k : p.n, inter = fc1 ? p.n : p.k, E = p.num_experts;
  const int64_t chunks = fc1 ? cc_fc1_chunks(hidden) : cc_fc2_chunks(hidden);
  std::vector<uint8_t> out(static_cast<size_t>(cc_packed_bytes(fc1, E, hidden, inter)));
  const uint8_t* src = static_cast<const uint8_t*>(canonical);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t part = 0; part < inter / kCcCols; ++part)
      for (int64_t c = 0; c < chunks; ++c) {
        uint8_t* chunk = out.data() + cc_chunk_offset(fc1, hidden, inter, e, part, c);
        for (int u = 0; u < kCcUnits; ++u)
          cc_pack_unit(fc1, src, E, hidden, inter, e, part, c, u, chunk + 16 * u, chunk + kCcCodeBytes + 2 * u);
      }
  return out;
}

}  // namespace sm90
}  // namespace fp4moe
