// Expert parallelism (EngineOptions::ep_size / ep_rank): which routed experts one rank holds. Host code,
// built with and without CUDA so the option checks can be tested anywhere.
//
// Rank r of n holds the contiguous global experts [first, first + count) with count = E / n and
// first = r * count, and the shared expert only when r == 0. Routing stays global: the engine maps each
// routed pair's global id e to the local id e - first when the expert is local, else to `count` (the
// "dropped" bucket, never computed), so the rank's output is its partial of the layer and the sum over
// all ranks is the whole layer.
#pragma once
#include <cstdint>

#include "fp4moe/config.h"

namespace fp4moe::engine {

struct ExpertShard {
  int size = 1, rank = 0;      // ep_size, ep_rank
  int64_t first = 0;           // first global expert held
  int64_t count = 0;           // experts held (E / size)
  bool shared = true;          // holds the shared expert (rank 0), when the layer has one

  bool is_whole() const { return size == 1; }
  bool holds(int64_t global_expert) const { return global_expert >= first && global_expert < first + count; }
  // Local id of a global expert: e - first when held, else count (the dropped bucket).
  int64_t local_id(int64_t global_expert) const { return holds(global_expert) ? global_expert - first : count; }
};

// Validates (ep_size, ep_rank) against cfg.num_experts and returns the shard. Throws
// Error(kInvalidArgument) naming the values when ep_size < 1, ep_rank is outside [0, ep_size), or
// E % ep_size != 0.
ExpertShard expert_shard(const MoeConfig& cfg, int ep_size, int ep_rank);

}  // namespace fp4moe::engine
