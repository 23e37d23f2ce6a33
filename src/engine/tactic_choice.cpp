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

// E[ceil(min(r, max_rows) / width)] for r ~ Poisson(mean_rows): the token tiles an expert's rows take.
double expected_token_tiles(double mean_rows, int64_t max_rows, int64_t width) {
  if (mean_rows <= 0.0 || width <= 0) return 0.0;
  if (mean_rows > 1e6) {  // the sum below would take millions of terms: rows / width + 1/2 tiles
    const double rows = max_rows > 0 ? std::min(mean_rows, static_cast<double>(max_rows)) : mean_rows;
    return rows / static_cast<double>(width) + 0.5;
  }
  // Summed over r within 12 standard deviations of the mean (the probabilities from their logarithms:
  // exp(-mean) underflows past 745).
  const double sd = std::sqrt(mean_rows);
  const int64_t lo = std::max<int64_t>(0, static_cast<int64_t>(mean_rows - 12.0 * sd - 30.0));
  const int64_t hi = static_cast<int64_t>(mean_rows + 12.0 * sd + 30.0);
  const double log_mean = std::log(mean_rows);
  double tiles = 0.0;
  for (int64_t r = lo; r <= hi; ++r) {
    const int64_t rows = max_rows > 0 ? std::min(r, max_rows) : r;
    if (rows == 0) continue;
    const double pr = std::exp(static_cast<double>(r) * log_mean - mean_rows - std::lgamma(static_cast<double>(r) + 1.0));
    tiles += pr * static_cast<double>((rows + width - 1) / width);
  }
  return tiles;
}

// The cost of `tiles` token tiles of `width` columns (expected_token_tile_cost's model).
double token_tiles_cost(double tiles, int64_t width) {
  return tiles * (static_cast<double>(width) + kTokenTileOverheadColumns);
}

}  // namespace

double expected_token_tile_cost(double mean_rows, int64_t max_rows, int64_t width) {
  return token_tiles_cost(expected_token_tiles(mean_rows, max_rows, width), width);
}

const TacticDesc* heuristic_choice(const std::vector<const TacticDesc*>& usable_descs, const GemmProblem& p,
                                   int sm_count) {
  if (usable_descs.empty()) return nullptr;
  std::string fallback_family;
  for (const TacticDesc& d : all_tactic_descs())
    if (d.is_fallback) fallback_family = d.family;
  std::vector<const TacticDesc*> pool;
  for (const TacticDesc* d : usable_descs)
    if (d->family != fallback_family) pool.push_back(d);  // a specialised family that passes wins
  if (pool.empty()) pool = usable_descs;
  // A resident tactic (schedule "resident": one CTA per row and 16 SwiGLU columns with all its weight bytes
  // in flight at once, sm90_cc.cu) where its CTAs fill at most one wave of the SMs; never otherwise: a
  // second wave would start its whole weight stream only after the first wave's CTAs leave.
  const auto resident_end = std::stable_partition(pool.begin(), pool.end(),
                                                  [](const TacticDesc* d) { return d->schedule == "resident"; });
  if (resident_end != pool.begin()) {
    // Its CTAs each take tile_m / 2 SwiGLU columns (tile_m: FC1's gate and up rows of a CTA).
    const int64_t cols = std::max(pool.front()->tile_m / 2, 1);
    const int64_t parts = ((p.op == GemmOp::kFc1SwiGlu ? p.n : p.k) + cols - 1) / cols;
    if (sm_count > 0 && p.total_rows * parts <= sm_count) return pool.front();
    if (resident_end != pool.end()) pool.erase(pool.begin(), resident_end);
  }
  // The token width: the one whose expected cost over the experts is lowest (expected_token_tile_cost).
  std::vector<int> widths;
  for (const TacticDesc* d : pool)
    if (std::find(widths.begin(), widths.end(), d->tile_n) == widths.end()) widths.push_back(d->tile_n);
  auto first_of_width = [&](int n) {
    return *std::find_if(pool.begin(), pool.end(), [&](const TacticDesc* d) { return d->tile_n == n; });
  };
  const double mean_rows = static_cast<double>(std::max<int64_t>(p.total_rows, 0)) /
                           static_cast<double>(std::max<int64_t>(1, p.num_experts));
  int width = 0;
  double width_cost = 0.0;
  for (int n : widths) {
    if (n == 1 && widths.size() > 1) continue;  // one token per tile: decided below
    const double tiles = expected_token_tiles(mean_rows, p.max_rows_per_expert, n);
    double c = token_tiles_cost(tiles, n);  // = expected_token_tile_cost(mean_rows, max_rows, n)
    if (sm_count > 0 && tiles > 0.0) {
      // An op of fewer than kFewWaves waves of work items (experts x weight-row tiles x token tiles over
      // the persistent grid's CTAs) leaves the last wave's SMs idle: count that wave whole. Mixtral's FC2
      // at 64 rows per expert (8 experts, 16 m-tiles): 128 n128 items fill 132 SMs once, while n64's
      // ~190 need two rounds (sm90 step 46b: the forward 476 us on n128 against 526 on n64).
      const TacticDesc* first = first_of_width(n);
      const double tile_m = static_cast<double>(std::max(first->tile_m, 1));
      const double mtiles = std::ceil(static_cast<double>(weight_rows(p)) / tile_m);
      const double items = static_cast<double>(std::max<int64_t>(1, p.num_experts)) * mtiles * tiles;
      const double waves = items / (static_cast<double>(sm_count) * std::max(first->ctas_per_sm, 1));
      constexpr double kFewWaves = 2.0;
      if (waves > 0.0 && waves < kFewWaves) c *= std::ceil(waves) / waves;
    }
    if (width == 0 || c < width_cost || (c == width_cost && n < width)) {
      width = n;
      width_cost = c;
    }
  }
  // A tile of one token per item (the sm90 e4m3 tile) streams an expert's weights once per row: it
  // replaces the width chosen above only where its plain expected cost is lower than that width's, so
  // without the few-waves correction, whose premise (a small op's idle SMs) does not hold for a tile that
  // multiplies the weight bytes (an unfolded shared expert at T = 8, one expert x 16 m-tiles: n8's 16
  // items count 8x as a fraction of a wave, and the 128 one-token items, 8x the bytes, looked cheaper).
  // And only where it leaves the reduction at least four stages: its one CTA of four consumers per SM
  // runs short items slower than the two-CTA tiles (the TP8 shard's FC2, K = 256: +12% at T = 1, step 50).
  if (std::find(widths.begin(), widths.end(), 1) != widths.end() &&
      (width == 0 || (first_of_width(1)->tile_k > 0 && p.k / first_of_width(1)->tile_k >= 4 &&
                      expected_token_tile_cost(mean_rows, p.max_rows_per_expert, 1) <
                          expected_token_tile_cost(mean_rows, p.max_rows_per_expert, width))))
    width = 1;
  const TacticDesc* best = first_of_width(width);
  // Among the tiles of that token width, the first in registration order whose k per stage leaves the
  // reduction at least four pipeline stages (one for a two-CTA tile; stage_ok below); with none, the one
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
  constexpr int64_t kFewItems = 512;
  const int64_t tile_m = std::max(best->tile_m, 1);
  const int64_t items = std::min(p.num_experts, std::max<int64_t>(p.total_rows, 1)) *
                        ((weight_rows(p) + tile_m - 1) / tile_m);
  const bool sparse = items < kFewItems;
  auto stages = [&](const TacticDesc* d) { return d->tile_k > 0 ? p.k / d->tile_k : 0; };
  auto stage_ok = [&](const TacticDesc* d) { return stages(d) >= (d->ctas_per_sm > 1 ? int64_t(1) : int64_t(4)); };
  const TacticDesc* first_ok = nullptr;
  const TacticDesc* deepest_ok = nullptr;
  const TacticDesc* most_stages = nullptr;
  for (const TacticDesc* d : pool) {
    if (d->tile_n != best->tile_n) continue;
    if (stage_ok(d)) {
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
  const TacticDesc* best = heuristic_choice(ok, p, caps.sm_count);
  if (!best)
    return Status(StatusCode::kUnsupported,
                  fmt::format("no tactic can run {} on {} (sm_{}):{}", p.to_string(), caps.name, caps.cc(),
                              reasons.empty() ? " no tactics registered" : reasons));
  *out = find_tactic(best->name);
  return Status::ok();
}

}  // namespace fp4moe::engine
