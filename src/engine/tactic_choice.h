// Which grouped-GEMM tactic the engine runs for a problem: a forced name, else a tuned name, else the
// built-in size heuristic over the tactics whose preflight passes on the live device.
#pragma once
#include <string>
#include <vector>

#include "fp4moe/device_caps.h"
#include "fp4moe/status.h"
#include "fp4moe/tactic.h"

namespace fp4moe::engine {

struct TacticRequest {
  std::string forced;                 // EngineOptions::fc1_tactic / fc2_tactic; empty: none
  std::string tuned;                  // the tuner's choice for this bucket; empty: none
  std::vector<std::string> excluded;  // never chosen
};

// The chosen tactic in *out. A forced name that is unknown, excluded or fails the preflight is an error
// (kInvalidArgument / kUnsupported) saying so; an unusable tuned name falls back to the heuristic (with
// the reason in *note). kUnsupported, listing every tactic with its reason, when nothing can run.
Status choose_tactic(const GemmProblem& problem, const DeviceCaps& caps, const TacticRequest& req,
                     GroupedGemmTactic** out, std::string* note);

// The heuristic alone (also used by tools): among usable tactics, prefer a family other than the
// fallback's when one passes; a resident tactic (schedule "resident") where the problem's CTAs, rows x
// (SwiGLU width / 16), fit one wave on sm_count SMs (never with sm_count 0), else the others; within the
// family pick the token tile width (tile_n) of the lowest
// expected_token_tile_cost at the problem's mean rows per expert (total_rows / num_experts, uniform
// routing; with sm_count > 0, an op of fewer than two waves of work items on that many SMs pays for its
// last wave whole; a one-token tile, tile_n 1, only where its plain cost is below the width so chosen);
// among the tiles of that width, the first registered whose k per stage leaves the
// reduction at least 4 pipeline stages (1 for a tile of two CTAs per SM; for problems of fewer than 512
// work items, active experts x weight-row tiles, the deepest such stage), else the one with the most
// stages.
const TacticDesc* heuristic_choice(const std::vector<const TacticDesc*>& usable, const GemmProblem& problem,
                                   int sm_count = 0);

// The cost model of the token width: the expected number of token tiles an expert's rows take, with the
// rows of an expert Poisson-distributed around mean_rows (uniform routing) and capped at max_rows (> 0;
// 0: no cap), times (width + kTokenTileOverheadColumns). A token tile streams and dequantises its expert's
// weight tiles whatever its width and adds tensor-core work per column; on the H200 the GLM-5 FC1 + FC2
// pair on the sm90 four-consumer tiles took, per token tile of all 256 experts, 1.12-1.17 / 1.24-1.32 /
// 1.44-1.50 / 1.84-1.90 ms at widths 8 / 16 / 32 / 64 and 2.88-3.07 ms on the n128 tile, about
// proportional to width + 67 (docs/perf.md, sm90 step 46). So 8 rows per expert take n16 (n8 would
// split 41% of the experts in two), 16 n32, 32 and 64 n64, 128 and more n128.
constexpr double kTokenTileOverheadColumns = 67.0;
double expected_token_tile_cost(double mean_rows, int64_t max_rows, int64_t width);

// Weight bytes (NVFP4 codes + E4M3 block scales) that FC1 and FC2 are expected to read together under
// uniform routing: E * (1 - exp(-rows / E)) active experts of the FC1 problem's rows.
double expected_touched_bytes(const GemmProblem& fc1, const GemmProblem& fc2);

// Whether FC1 and FC2 should run as one chained launch (GroupedGemmTactic::run_chained): decode-sized
// problems, whose expected weight traffic is below kChainMaxBytes and whose active experts expect at
// most kChainMaxRowsPerExpert rows. The chained launch removes a kernel boundary (the FC1 tail overlaps
// FC2's first weight copies) but its per-item code measured 1.5-3% slower on long problems. Whole
// forwards on the H200 against FP4MOE_CHAIN=0 in the same call (docs/perf.md, sm90 steps 18-21): faster
// chained for GLM-5 at T = 1 (about 1 expected row per active expert) and the TP8 shard at T = 32 (1.6),
// no better for GLM-5 at T = 8 (1.1), slower for the TP8 shard at T = 128 (4), GLM-5 at T >= 32 (1.6
// rows but 3.4 GB) and prefill.
constexpr double kChainMaxBytes = 2e9;
constexpr double kChainMaxRowsPerExpert = 2;
bool prefer_chained(const GemmProblem& fc1, const GemmProblem& fc2);

}  // namespace fp4moe::engine
