// The device packs: canonical NVFP4 weights -> kSm90Interleaved (sm90_layout.h), once at engine creation,
// and -> kSm90E4m3 (sm90_e4m3.h; no tactic uses it yet).
//
// One CTA of 128 threads per packed block (expert, 64-row tile, k64 chunk): thread T writes its 16
// bytes of codes (4 words, one per k16 step, codes placed with place_code) and threads 0..31 write the
// 8 scale bytes of quad (T/8, T%8). Reads go through CanonicalView, the same accessor the CPU pack uses,
// so both follow one description; the tests compare the two byte for byte.
#include <cuda_runtime_api.h>

#include "kernels/sm90_wgmma/sm90_e4m3.h"
#include "kernels/sm90_wgmma/sm90_pack.h"

namespace fp4moe {
namespace sm90 {

namespace {

// This CTA's block (expert e, tile t, chunk c), its output, and thread T's warp w, quad g8 and lane q.
struct BlockThread {
  int64_t e, t, c;
  uint8_t* out;
  int T, w, g8, q;
};
__device__ __forceinline__ BlockThread block_thread(const PackGeometry& g, uint8_t* dst) {
  const int64_t block = blockIdx.x;
  const int T = threadIdx.x;
  return {block / (g.kchunks * g.tiles), (block / g.kchunks) % g.tiles, block % g.kchunks,
          dst + block * kPackBlockBytes, T, T / 32, (T % 32) / 4, T % 4};
}

__global__ void pack_kernel(PackGeometry g, CanonicalView src, uint8_t* __restrict__ dst) {
  const auto [e, t, c, out, T, w, g8, q] = block_thread(g, dst);
  uint32_t words[4] = {0, 0, 0, 0};
  for (int s = 0; s < 4; ++s) {
    for (int slot = 0; slot < 4; ++slot) {
      const int p = 16 * w + g8 + 8 * (slot & 1);
      const int64_t r = packed_row_source(g.fc1, g.n, t, p);
      if (r < 0) continue;
      for (int half = 0; half < 2; ++half) {
        const int64_t k = c * kPackK + 16 * s + 2 * q + 8 * (slot >> 1) + half;
        if (k >= g.k) continue;
        words[s] = place_code(words[s], slot, half, effective_code(src.code(e, r, k), src.scale(e, r, k)));
      }
    }
  }
  *reinterpret_cast<uint4*>(out + 16 * T) = make_uint4(words[0], words[1], words[2], words[3]);
  if (T < 32) {
    const int qw = T / 8, qg = T % 8;
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) {
      const int s = 2 * (i / 4) + (i % 2), hi_row = (i % 4) / 2;  // byte 4*(s/2) + 2*hi_row + s%2
      const int p = 16 * qw + qg + 8 * hi_row;
      const int64_t r = packed_row_source(g.fc1, g.n, t, p);
      const int64_t k = c * kPackK + 16 * s;
      b[i] = (r >= 0 && k < g.k) ? e4m3_to_e5m3u(src.scale(e, r, k)) : 0;
    }
    uint2 v;
    v.x = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
    v.y = b[4] | (b[5] << 8) | (b[6] << 16) | (uint32_t(b[7]) << 24);
    *reinterpret_cast<uint2*>(out + kPackCodeBytes + 8 * (8 * qw + qg)) = v;
  }
}

// The kSm90E4m3 layout (sm90_e4m3.h), same grid: thread T writes its 16 code bytes (byte 4s + i: rows R0
// and R1 at k = 16s + 4q + i), threads 0..31 the 8 scale bytes of quad (T/8, T%8) (byte 2s + r: row R_r,
// k16 block s).
__global__ void pack_e4m3_kernel(PackGeometry g, CanonicalView src, uint8_t* __restrict__ dst) {
  const auto [e, t, c, out, T, w, g8, q] = block_thread(g, dst);
  uint32_t words[4] = {0, 0, 0, 0};
  for (int part = 0; part < 2; ++part) {
    const int64_t r = packed_row_source(g.fc1, g.n, t, 16 * w + g8 + 8 * part);
    if (r < 0) continue;
    for (int b = 0; b < 16; ++b) {
      const int64_t k = c * kPackK + 16 * (b / 4) + 4 * q + b % 4;
      if (k >= g.k) continue;
      const uint32_t byte = e4m3_place_code(0, part, effective_code(src.code(e, r, k), src.scale(e, r, k)));
      words[b / 4] |= byte << (8 * (b % 4));
    }
  }
  *reinterpret_cast<uint4*>(out + 16 * T) = make_uint4(words[0], words[1], words[2], words[3]);
  if (T < 32) {
    const int qw = T / 8, qg = T % 8;
    uint32_t v[2] = {0, 0};
    for (int i = 0; i < 8; ++i) {
      const int s = i / 2, part = i % 2;
      const int64_t r = packed_row_source(g.fc1, g.n, t, 16 * qw + qg + 8 * part);
      const int64_t k = c * kPackK + 16 * s;
      const uint32_t b = (r >= 0 && k < g.k) ? e4m3_to_e5m3u(src.scale(e, r, k)) : 0;
      v[i / 4] |= b << (8 * (i % 4));
    }
    *reinterpret_cast<uint2*>(out + kPackCodeBytes + 8 * (8 * qw + qg)) = make_uint2(v[0], v[1]);
  }
}

template <class Kernel>
Status launch_pack(const char* what, Kernel kernel, const GemmProblem& p, const void* canonical, void* dst, Stream stream) {
  const PackGeometry g = pack_geometry(p);
  if (p.k % 16 != 0 || p.k <= 0 || p.n <= 0 || p.num_experts <= 0)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("sm90 pack: needs positive E, N and K with K a multiple of 16, got {}", p.to_string()));
  const int64_t blocks = g.experts * g.tiles * g.kchunks;
  if (blocks == 0) return Status::ok();
  kernel<<<static_cast<unsigned>(blocks), 128, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      g, canonical_view(g, canonical), static_cast<uint8_t*>(dst));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status(StatusCode::kCudaError,
                  fmt::format("sm90 pack: launch of {} ({} blocks) failed: {}", what, blocks, cudaGetErrorString(err)));
  return Status::ok();
}

}  // namespace

size_t packed_bytes(const GemmProblem& p) { return static_cast<size_t>(pack_geometry(p).bytes()); }

Status pack_device(const GemmProblem& p, const void* canonical, void* dst, Stream stream) {
  return launch_pack("pack_kernel", pack_kernel, p, canonical, dst, stream);
}

Status pack_e4m3_device(const GemmProblem& p, const void* canonical, void* dst, Stream stream) {
  return launch_pack("pack_e4m3_kernel", pack_e4m3_kernel, p, canonical, dst, stream);
}

}  // namespace sm90
}  // namespace fp4moe
