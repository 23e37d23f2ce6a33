// Workspace layout (see workspace.h).
#include "engine/workspace.h"

#include "engine/engine_kernels.h"

namespace fp4moe::engine {

WorkspacePlan plan_workspace(const WorkspaceShape& s) {
  WorkspacePlan p;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t off = at;
    at += (bytes + 255) / 256 * 256;
    return off;
  };
  const size_t T = static_cast<size_t>(s.max_tokens), P = T * static_cast<size_t>(s.topk);
  const size_t E = static_cast<size_t>(s.experts);
  const size_t Ep = static_cast<size_t>(s.permute_experts > 0 ? s.permute_experts : s.experts);
  p.has_logits = s.need_logits;
  p.has_local_ids = s.need_local_ids;
  p.has_shared = s.shared_inter > 0;
  p.logits = take(p.has_logits ? 4 * T * E : 0);
  p.topk_ids = take(4 * P);
  p.topk_weights = take(4 * P);
  p.local_ids = take(p.has_local_ids ? 4 * P : 0);
  p.rank = take(4 * P);
  p.chunk_base = take(4 * static_cast<size_t>(permute_chunks(static_cast<int64_t>(P))) * Ep);
  p.offsets = take(4 * (Ep + 2));  // one more: the folded shared expert's end (fold_rows)
  p.shared_offsets = take(4 * 2);
  p.gather = take(4 * (P + static_cast<size_t>(s.fold_rows)));  // the folded rows' tokens too
  p.pair_pos = take(4 * P);
  const size_t rows = P + static_cast<size_t>(s.fold_rows);
  p.h1 = take(2 * rows * static_cast<size_t>(s.inter));
  p.y = take(2 * rows * static_cast<size_t>(s.hidden));
  p.hs = take(p.has_shared ? 2 * T * static_cast<size_t>(s.shared_inter) : 0);
  p.ys = take(p.has_shared ? 2 * T * static_cast<size_t>(s.hidden) : 0);
  p.tactic = take(s.tactic_bytes);
  p.tactic_shared = take(p.has_shared ? s.tactic_bytes : 0);
  p.total = at;
  return p;
}

WorkspacePointers bind_workspace(const WorkspacePlan& p, void* base) {
  auto at = [&](size_t off) { return static_cast<char*>(base) + off; };
  WorkspacePointers w;
  w.logits = p.has_logits ? reinterpret_cast<float*>(at(p.logits)) : nullptr;
  w.topk_ids = reinterpret_cast<int32_t*>(at(p.topk_ids));
  w.topk_weights = reinterpret_cast<float*>(at(p.topk_weights));
  w.local_ids = p.has_local_ids ? reinterpret_cast<int32_t*>(at(p.local_ids)) : nullptr;
  w.rank = reinterpret_cast<int32_t*>(at(p.rank));
  w.chunk_base = reinterpret_cast<int32_t*>(at(p.chunk_base));
  w.offsets = reinterpret_cast<int32_t*>(at(p.offsets));
  w.shared_offsets = reinterpret_cast<int32_t*>(at(p.shared_offsets));
  w.gather = reinterpret_cast<int32_t*>(at(p.gather));
  w.pair_pos = reinterpret_cast<int32_t*>(at(p.pair_pos));
  w.h1 = reinterpret_cast<uint16_t*>(at(p.h1));
  w.y = reinterpret_cast<uint16_t*>(at(p.y));
  w.hs = p.has_shared ? reinterpret_cast<uint16_t*>(at(p.hs)) : nullptr;
  w.ys = p.has_shared ? reinterpret_cast<uint16_t*>(at(p.ys)) : nullptr;
  w.tactic = at(p.tactic);
  w.tactic_shared = at(p.tactic_shared);
  return w;
}

}  // namespace fp4moe::engine
