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
// fallback's when one passes; within the family pick the smallest token tile (tile_n) that covers the
// expected rows per expert (total_rows / num_experts under uniform routing), else the largest tile; among
// the tiles of that width, the first registered whose k per stage leaves the reduction at least 4
// pipeline stages (for problems of fewer than 512 work items, active experts x weight-row tiles, the
// deepest such stage), else the one with the most stages.
const TacticDesc* heuristic_choice(const std::vector<const TacticDesc*>& usable, const GemmProblem& problem);

}  // namespace fp4moe::engine
