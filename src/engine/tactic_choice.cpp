// Tactic choice for the engine (see tactic_choice.h).
#include "engine/tactic_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace fp4moe::engine {

namespace {

bool supports(const TacticDesc& d, GemmOp op) {
  return std::find(d.req.ops.begin(), d.req.ops.end(), op) != d.req.ops.end();
}

bool is_excluded(const TacticRequest& req, const std::string& name) {
  return std::find(req.excluded.begin(), req.excluded.end(), name) != req.excluded.end();
}

std::string known_names() {
  std::string s;
  for (const TacticDesc& d : all_tactic_descs()) s += (s.empty() ? "" : ", ") + d.name;
  return s;
}

// Usable by name: known, runnable in this build, not excluded, implements the op, preflight passes.
Status usable(const std::string& name, const GemmProblem& p, const DeviceCaps& caps, const TacticRequest& req,
              GroupedGemmTactic** out) {
  GroupedGemmTactic* t = find_tactic(name);
  if (!t) {
    const bool described = std::any_of(all_tactic_descs().begin(), all_tactic_descs().end(),
                                       [&](const TacticDesc& d) { return d.name == name; });
    return Status(described ? StatusCode::kUnsupported : StatusCode::kInvalidArgument,
                  described ? fmt::format("tactic '{}' is not runnable in this build (no CUDA kernels)", name)
                            : fmt::format("unknown tactic '{}' (known: {})", name, known_names()));
  }
  if (is_excluded(req, name))
    return Status(StatusCode::kInvalidArgument, fmt::format("tactic '{}' is in the excluded list", name));
  if (!supports(t->desc(), p.op))
    return Status(StatusCode::kUnsupported, fmt::format("tactic '{}' does not implement {}", name, gemm_op_name(p.op)));
  const TacticCheck c = t->check(p, caps);
  if (!c.ok) return Status(StatusCode::kUnsupported, fmt::format("tactic '{}' cannot run {}: {}", name, p.to_string(), c.reason));
  *out = t;
  return Status::ok();
}

}  // namespace

const TacticDesc* heuristic_choice(const std::vector<const TacticDesc*>& usable_descs, const GemmProblem& p) {
  if (usable_descs.empty()) return nullptr;
  std::string fallback_family;
  for (const TacticDesc& d : all_tactic_descs())
    if (d.is_fallback) fallback_family = d.family;
  std::vector<const TacticDesc*> pool;
  for (const TacticDesc* d : usable_descs)
    if (d->family != fallback_family) pool.push_back(d);  // a specialised family that passes wins
  if (pool.empty()) pool = usable_descs;
  const int64_t experts = std::max<int64_t>(1, p.num_experts);
  int64_t rows = (p.total_rows + experts - 1) / experts;  // expected rows per expert, uniform routing
  if (p.max_rows_per_expert > 0) rows = std::min(rows, p.max_rows_per_expert);
  rows = std::max<int64_t>(rows, 1);
  const TacticDesc* best = nullptr;
  for (const TacticDesc* d : pool)  // smallest token tile that covers the rows
    if (d->tile_n >= rows && (!best || d->tile_n < best->tile_n)) best = d;
  if (!best)
    for (const TacticDesc* d : pool)  // else the largest tile
      if (!best || d->tile_n > best->tile_n) best = d;
  // Among the tiles of that token width, the first in registration order whose k per stage leaves the
  // reduction at least kMinStages pipeline stages (one for a two-CTA tile, below); with none, the one
  // with the most stages. A deep stage that a short reduction fills once or twice leaves the pipeline
  // empty at every work item (the TP8 shard's FC2, K = 256, measured 20% slower on the one-CTA k256
  // decode tile than on the k128 one).
  // Problems of few work items (active experts x weight-row tiles below kFewItems: one or two items per
  // CTA, where the first stages' latency is not hidden behind later items) take the deepest such stage
  // instead: the GLM-5 forward at T = 1 (routed FC1 256 items, FC2 384, the shared expert's 32 and 48)
  // measured 86 us with every GEMM on the one-CTA k256 tile against 93.5 us on the two-CTA k128 one
  // (docs/perf.md, sm90 step 17). Tiles sized for two CTAs per SM need only one stage: the other CTA's
  // stages keep the SM's copies going across an item boundary (the two-CTA k256 tile ran the TP8 FC2,
  // K = 256, in 77 us at T = 32 against 84 on the two-CTA k128 one, sm90 step 23).
  constexpr int64_t kMinStages = 4, kFewItems = 512;
  const int64_t tile_m = std::max(best->tile_m, 1);
  const int64_t items = std::min(p.num_experts, std::max<int64_t>(p.total_rows, 1)) *
                        ((weight_rows(p) + tile_m - 1) / tile_m);
  const bool sparse = items < kFewItems;
  auto stages = [&](const TacticDesc* d) { return d->tile_k > 0 ? p.k / d->tile_k : 0; };
  auto min_stages = [&](const TacticDesc* d) { return d->ctas_per_sm > 1 ? int64_t(1) : kMinStages; };
  const TacticDesc* first_ok = nullptr;
  const TacticDesc* deepest_ok = nullptr;
  const TacticDesc* most_stages = nullptr;
  for (const TacticDesc* d : pool) {
    if (d->tile_n != best->tile_n) continue;
    if (stages(d) >= min_stages(d)) {
      if (!first_ok) first_ok = d;
      if (!deepest_ok || d->tile_k > deepest_ok->tile_k) deepest_ok = d;
    }
    if (!most_stages || stages(d) > stages(most_stages)) most_stages = d;
  }
  if (first_ok) return sparse ? deepest_ok : first_ok;
  return most_stages ? most_stages : best;
}

double expected_touched_bytes(const GemmProblem& fc1, const GemmProblem& fc2) {
  const double experts = static_cast<double>(std::max<int64_t>(1, fc1.num_experts));
  const double rows = static_cast<double>(std::max<int64_t>(0, fc1.total_rows));
  const double active = experts * (1.0 - std::exp(-rows / experts));
  const double weights = static_cast<double>(weight_rows(fc1)) * static_cast<double>(fc1.k) +
                         static_cast<double>(weight_rows(fc2)) * static_cast<double>(fc2.k);
  return active * weights * (0.5 + 1.0 / 16.0);  // 4-bit codes + one E4M3 scale per 16
}

bool prefer_chained(const GemmProblem& fc1, const GemmProblem& fc2) {
  if (fc1.total_rows <= 0) return false;
  const double experts = static_cast<double>(std::max<int64_t>(1, fc1.num_experts));
  const double rows = static_cast<double>(fc1.total_rows);
  const double per_active = rows / (experts * (1.0 - std::exp(-rows / experts)));
  return expected_touched_bytes(fc1, fc2) < kChainMaxBytes && per_active <= kChainMaxRowsPerExpert;
}

Status choose_tactic(const GemmProblem& p, const DeviceCaps& caps, const TacticRequest& req, GroupedGemmTactic** out,
                     std::string* note) {
  *out = nullptr;
  if (!req.forced.empty()) {
    Status st = usable(req.forced, p, caps, req, out);
    if (!st.is_ok()) return Status(st.code(), "forced " + st.message());
    return st;
  }
  if (!req.tuned.empty()) {
    Status st = usable(req.tuned, p, caps, req, out);
    if (st.is_ok()) return st;
    if (note) *note = "tuned choice ignored: " + st.message();
  }
  std::vector<const TacticDesc*> ok;
  std::string reasons;
  for (const TacticDesc& d : all_tactic_descs()) {
    if (!supports(d, p.op)) continue;  // a variant for the other op only
    GroupedGemmTactic* t = nullptr;
    Status st = usable(d.name, p, caps, req, &t);
    if (st.is_ok())
      ok.push_back(&d);
    else
      reasons += "\n  " + st.message();
  }
  const TacticDesc* best = heuristic_choice(ok, p);
  if (!best)
    return Status(StatusCode::kUnsupported,
                  fmt::format("no tactic can run {} on {} (sm_{}):{}", p.to_string(), caps.name, caps.cc(),
                              reasons.empty() ? " no tactics registered" : reasons));
  *out = find_tactic(best->name);
  return Status::ok();
}

}  // namespace fp4moe::engine
