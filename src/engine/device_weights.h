// A MoE layer's weights in device memory: the canonical NVFP4 layout (src/engine/weight_layout.h) of
// each grouped GEMM plus its tensor scales, the packed copies other tactic families want, the router
// weight and correction bias, and the shared expert (NVFP4 canonical with one expert, or bf16).
#pragma once
#include <map>

#include "fp4moe/device_buffer.h"
#include "engine/expert_shard.h"
#include "fp4moe/tactic.h"
#include "fp4moe/weights.h"

namespace fp4moe::engine {

struct DeviceGemmWeights {
  GemmProblem shape;                               // op, num_experts, n, k (total_rows unused)
  bool bf16 = false;                               // bf16 [E][Nw][K] instead of NVFP4 (shared expert only)
  DeviceBuffer canonical;                          // canonical NVFP4 buffer (or the bf16 weights)
  DeviceBuffer tensor_scales;                      // fp32: FC1 [E][2] (gate, up), FC2 [E]; empty for bf16
  std::map<WeightLayout, DeviceBuffer> packed;     // other layouts, packed once from `canonical`

  bool empty() const { return shape.num_experts == 0; }
  // Device pointer of the weights in `layout` (nullptr when not prepared).
  const void* weights(WeightLayout layout) const;
  size_t device_bytes() const;
  // Packs `layout` from the canonical buffer (no-op for kCanonical or when already present). Throws.
  void prepare(WeightLayout layout, Stream stream);
  // Frees the canonical buffer (after every layout in use has been packed from it).
  void drop_canonical() { canonical = DeviceBuffer(); }
};

struct DeviceLayerWeights {
  DeviceGemmWeights fc1, fc2;                 // routed experts held (all, or an expert-parallel shard's)
  DeviceGemmWeights shared_fc1, shared_fc2;   // empty when the layer has no shared expert
  DeviceBuffer router;                        // [E, H] fp32, empty when absent
  DeviceBuffer bias;                          // [E] fp32, empty when absent
  bool has_shared() const { return !shared_fc1.empty(); }
};

// Uploads host weights: the shard's routed experts (global [first, first + count) into local slots
// 0..count-1; each must be NVFP4 and materialised, the others may be empty), the whole router weight and
// bias, and the shared expert when shard.shared. Throws Error naming the expert/projection on a problem.
// Synchronous.
void upload_layer(const MoeLayerWeights& w, const ExpertShard& shard, DeviceLayerWeights* out);
// Generates the synthetic layer of (cfg, spec) in device memory: the shard's routed experts (the same
// bytes as synthetic_layer() gives those global experts on the host), the whole router and bias, and the
// shared expert when shard.shared. Asynchronous on `stream`; throws on launch errors.
void generate_synthetic_layer(const MoeConfig& cfg, const SyntheticSpec& spec, const ExpertShard& shard,
                              DeviceLayerWeights* out, Stream stream);

}  // namespace fp4moe::engine
