// The engine's single device workspace, sized once at creation for max_tokens (no allocation in a
// forward). Regions, each 256-byte aligned, with P = max_tokens * topk and Ep the experts the permutation
// groups into (E, or with expert parallelism the local experts + 1 dropped bucket):
//   logits [T, E] f32 (only with a router weight) | topk_ids [P] i32 | topk_weights [P] f32 |
//   local_ids [P] i32 (expert parallelism only) | rank [P] i32 |
//   chunk_base [chunks(P)][Ep] i32 | offsets [Ep+2] i32 | shared_offsets [2] i32 | gather [P] i32 |
//   pair_pos [P] i32 | h1 [P + F, I] bf16 | y [P + F, H] bf16 | hs [T, I_shared] bf16 | ys [T, H] bf16 |
//   tactic scratch (routed GEMMs) | tactic scratch (shared expert, which runs concurrently on a side stream)
#pragma once
#include <cstddef>
#include <cstdint>

namespace fp4moe::engine {

struct WorkspaceShape {
  int64_t max_tokens = 0, experts = 0, topk = 0, hidden = 0, inter = 0;
  int64_t shared_inter = 0;   // 0: no shared expert
  int64_t permute_experts = 0;  // experts of the permutation (0: `experts`); EP: local experts + 1
  int64_t fold_rows = 0;      // F: rows of the shared expert when it runs as expert Ep of the routed launch
  bool need_local_ids = false;  // expert parallelism: the global -> local id map [P]
  bool need_logits = false;   // a router weight is present
  size_t tactic_bytes = 0;    // the largest workspace any chosen tactic asks for
};

struct WorkspacePlan {  // byte offsets; total is the allocation size
  size_t logits = 0, topk_ids = 0, topk_weights = 0, local_ids = 0, rank = 0, chunk_base = 0, offsets = 0, shared_offsets = 0;
  size_t gather = 0, pair_pos = 0, h1 = 0, y = 0, hs = 0, ys = 0, tactic = 0, tactic_shared = 0, total = 0;
  bool has_logits = false, has_shared = false, has_local_ids = false;
};

struct WorkspacePointers {
  float* logits = nullptr;
  int32_t* topk_ids = nullptr;
  float* topk_weights = nullptr;
  int32_t* local_ids = nullptr;  // null without expert parallelism
  int32_t *rank = nullptr, *chunk_base = nullptr, *offsets = nullptr, *shared_offsets = nullptr;
  int32_t *gather = nullptr, *pair_pos = nullptr;
  uint16_t *h1 = nullptr, *y = nullptr, *hs = nullptr, *ys = nullptr;
  void* tactic = nullptr;
  void* tactic_shared = nullptr;
};

WorkspacePlan plan_workspace(const WorkspaceShape& s);
WorkspacePointers bind_workspace(const WorkspacePlan& plan, void* base);

}  // namespace fp4moe::engine
