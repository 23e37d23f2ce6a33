// Expert-parallel shard of a layer (see expert_shard.h).
#include "engine/expert_shard.h"

#include "fp4moe/status.h"

namespace fp4moe::engine {

ExpertShard expert_shard(const MoeConfig& cfg, int ep_size, int ep_rank) {
  FP4MOE_CHECK(ep_size >= 1, StatusCode::kInvalidArgument, "EngineOptions::ep_size = {} must be >= 1", ep_size);
  FP4MOE_CHECK(ep_rank >= 0 && ep_rank < ep_size, StatusCode::kInvalidArgument,
               "EngineOptions::ep_rank = {} is outside [0, ep_size = {})", ep_rank, ep_size);
  const int64_t E = cfg.num_experts;
  FP4MOE_CHECK(E >= 1 && E % ep_size == 0, StatusCode::kInvalidArgument,
               "EngineOptions::ep_size = {} does not divide the {} routed experts of {} (E % ep_size = {})", ep_size,
               E, cfg.name, E >= 1 ? E % ep_size : E);
  ExpertShard s;
  s.size = ep_size;
  s.rank = ep_rank;
  s.count = E / ep_size;
  s.first = static_cast<int64_t>(ep_rank) * s.count;
  s.shared = ep_rank == 0;
  return s;
}

}  // namespace fp4moe::engine
