// The GPU MoE engine: route -> permute -> FC1 (SwiGLU) -> FC2 -> finalize, asynchronous on the
// caller's stream, with one workspace sized at creation (no allocation in forward, CUDA-graph safe).
// Header is plain C++ (no CUDA headers); in builds without CUDA every entry point returns kUnsupported.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/status.h"
#include "fp4moe/tactic.h"
#include "fp4moe/weights.h"

namespace fp4moe {

struct EngineOptions {
  int device = 0;
  int64_t max_tokens = 8192;   // forward() accepts 0..max_tokens tokens; the workspace is sized for it
  // Force a tactic by stable name for FC1/FC2 (empty: the tuner's choice if a tuner is attached and
  // has one, else the built-in size heuristic). An unknown or unusable name is an error at create().
  std::string fc1_tactic, fc2_tactic;
  // Tactic names excluded from any choice (e.g. ones the tuner saw fail).
  std::vector<std::string> excluded_tactics;
  // Optional tuned choice per token bucket, filled by the tuner: bucket (power of two) -> name.
  std::vector<std::pair<int64_t, std::string>> fc1_by_bucket, fc2_by_bucket;
  // Expert parallelism: this engine is rank ep_rank of ep_size and holds only the routed experts
  // [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size) (E % ep_size == 0), plus the shared expert on
  // rank 0 only. Routing stays global (ForwardOutputs ids are global expert ids); pairs routed to other
  // ranks' experts are dropped, so out is this rank's partial: the sum of all ranks' outputs (the combine
  // all-reduce) is the whole layer, up to the bf16 rounding of each partial. With ep_size > 1 the tuned
  // buckets above are ignored (they were measured on the whole layer): forced tactic, else the heuristic.
  int ep_size = 1, ep_rank = 0;
  // A second packed copy of the weights. The sm90 e4m3 decode tile (sm90.w4e4m3.*, one token per work
  // item) reads a layout of its own, so an engine whose buckets choose it and other sm90 tiles holds the
  // routed and shared weights twice (the GLM-5 layer: 5.5 GB more). false: the engine chooses it only
  // where all its buckets would (max_tokens = 1, which then holds its layout alone) or when forced by
  // name; true: wherever the heuristic or the tuner picks it (GLM-5 and DeepSeek-V3 at T = 1, docs/perf.md
  // sm90 step 50).
  bool extra_weight_layouts = false;
};

// Pointers into the engine's workspace after a forward (device memory, valid until the next forward).
struct ForwardOutputs {
  const int32_t* topk_ids = nullptr;      // [T, topk]
  const float* topk_weights = nullptr;    // [T, topk]
};

class MoeEngine {
 public:
  virtual ~MoeEngine() = default;

  // From host weights (every expert must be materialised; shapes are validated). Repacks weights into
  // the device layouts of the tactics in use, once.
  static Status create(const MoeLayerWeights& weights, const EngineOptions& opts, std::unique_ptr<MoeEngine>* out);
  // Synthetic weights generated on the device (same bytes as synthetic_layer on the host).
  static Status create_synthetic(const MoeConfig& cfg, const SyntheticSpec& spec, const EngineOptions& opts,
                                 std::unique_ptr<MoeEngine>* out);

  // x: device bf16 [T, H]. logits: device fp32 [T, E], or null to compute them from the router weight
  // (an error if the engine has none). out: device bf16 [T, H]. Asynchronous on `stream`; no host sync,
  // no allocation. T may be 0.
  virtual Status forward(const uint16_t* x, int64_t tokens, const float* logits, uint16_t* out, Stream stream,
                         ForwardOutputs* outputs = nullptr) = 0;

  virtual const MoeConfig& config() const = 0;
  // Stable names of the tactics forward() would use for `tokens` tokens.
  virtual std::string fc1_tactic_for(int64_t tokens) const = 0;
  virtual std::string fc2_tactic_for(int64_t tokens) const = 0;
  virtual size_t workspace_bytes() const = 0;
  virtual size_t weight_bytes() const = 0;  // device bytes of packed weights
};

// True when this build has the CUDA backend and a usable device.
bool cuda_backend_available(std::string* why_not = nullptr);

}  // namespace fp4moe
