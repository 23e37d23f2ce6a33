// FC1's routing inside a chained sm90 launch (GroupedGemmArgs::routing), the host side shared by the tactics
// that carry the routing prologue (the n8 wgmma tiles, sm90_nvfp4w4a16_grouped.cu; the resident tactic,
// sm90_cc.cu): the batch's shape against the problem and the tactic's limits, then the front end's parameters
// (common/front_block.cuh). FC1 reads its rows from `a` through each CTA's own grouping. Host code of .cu
// files.
#pragma once
#include <fmt/format.h>

#include <string>

#include "common/front_block.cuh"
#include "fp4moe/status.h"
#include "fp4moe/tactic.h"

namespace fp4moe {
namespace sm90 {

inline Status fill_chain_routing(const GroupedGemmTactic& t, const GroupedGemmArgs& a1, RouteFront* out) {
  const DecodeRouting& r = *a1.routing;
  const GemmProblem& p = a1.problem;
  auto bad = [&](const std::string& what) {
    return Status(StatusCode::kInvalidArgument, fmt::format("{}: routing inside the launch: {}", t.desc().name, what));
  };
  if (!r.config || !r.logits || !r.ids || !r.weights || !r.offsets || !r.gather || !r.pair_pos)
    return bad("config, logits and the ids, weights, offsets, gather and pair_pos outputs are all required");
  const MoeConfig& cfg = *r.config;
  if (!t.can_route_in_chain(cfg, r.tokens))
    return bad(fmt::format("{} tokens of {} are outside its shapes (E <= 256, at most {} pairs, the register "
                           "routing's group layout)",
                           r.tokens, cfg.to_string(), kFrontMaxPairs));
  const int64_t rows = r.tokens * cfg.topk + (r.append_tokens ? r.tokens : 0);
  if (p.num_experts != cfg.num_experts + (r.append_tokens ? 1 : 0) || p.total_rows < rows)
    return bad(fmt::format("FC1 {} does not hold {} tokens x top-{} over {} experts{}", p.to_string(), r.tokens,
                           cfg.topk, cfg.num_experts, r.append_tokens ? " plus the appended rows" : ""));
  if (a1.a_row_index != nullptr || a1.expert_offsets != r.offsets)
    return bad("FC1 must read the token rows directly (a_row_index null) and take routing->offsets as its "
               "expert_offsets");
  RouteFront& f = *out;
  f.logits = r.logits;
  f.rp = route_detail::route_params(cfg);
  f.sigmoid = cfg.routing == RoutingKind::kSigmoidGrouped ? 1 : 0;
  f.bias = f.sigmoid ? r.bias : nullptr;
  f.tokens = static_cast<int>(r.tokens);
  f.pexperts = static_cast<int>(cfg.num_experts);
  f.append = r.append_tokens ? 1 : 0;
  f.ids = r.ids;
  f.weights = r.weights;
  f.offsets = r.offsets;
  f.gather = r.gather;
  f.pair_pos = r.pair_pos;
  return Status::ok();
}

}  // namespace sm90
}  // namespace fp4moe
