// Compile-time facts about one portable tile configuration, shared by the host descriptors (descs.cpp)
// and the kernels (portable_nvfp4w4a16_grouped.cuh), so the shared-memory size the preflight sees is the
// one the kernel asks for.
#pragma once
#include <cstdint>

namespace fp4moe::portable {

constexpr int kBlockK = 64;            // K elements per pipeline stage: four NVFP4 scale blocks
constexpr int kCodeBytesPerRow = 32;   // packed E2M1 bytes of one weight row per stage
constexpr int kScaleBytesPerRow = 4;   // E4M3 block scales of one weight row per stage
constexpr int kBf16BytesPerRow = 128;  // bf16 bytes of one token row (or bf16 weight row) per stage

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, bool BF16W>
struct TileConfig {
  static constexpr int kBM = BM, kBN = BN, kStages = STAGES;
  static constexpr int kWarpsM = WARPS_M, kWarpsN = WARPS_N;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kWM = BM / WARPS_M;  // weight rows per warp
  static constexpr int kWN = BN / WARPS_N;  // tokens per warp
  static constexpr int kMT = kWM / 16;      // m16 tiles per warp
  static constexpr int kNT = kWN / 8;       // n8 tiles per warp
  // One stage: weights (packed codes, or bf16 rows), then block scales (NVFP4 only), then tokens.
  static constexpr int kWeightBytes = BF16W ? BM * kBf16BytesPerRow : BM * kCodeBytesPerRow;
  static constexpr int kScaleBytes = BF16W ? 0 : BM * kScaleBytesPerRow;
  static constexpr int kTokenBytes = BN * kBf16BytesPerRow;
  static constexpr int kStageBytes = kWeightBytes + kScaleBytes + kTokenBytes;
  static constexpr int kDynamicSmem = kStageBytes * STAGES;
  // Static shared memory: the token tile's source rows and the work-list scan scratch.
  static constexpr int kStaticSmem = BN * 4 + 32 * 4 + 16;
  static constexpr int kSmemBytes = kDynamicSmem + kStaticSmem;

  static_assert(BM % (16 * WARPS_M) == 0, "BM must split into whole m16 tiles per warp");
  static_assert(BN % (8 * WARPS_N) == 0, "BN must split into whole n8 tiles per warp");
  static_assert(kMT % 2 == 0, "each warp needs an even number of m16 tiles so FC1 pairs gate and up tiles");
  static_assert(STAGES >= 2, "the cp.async pipeline needs at least two stages");
  static_assert(kStageBytes % 16 == 0, "every stage must start 16-byte aligned for cp.async");
};

}  // namespace fp4moe::portable
