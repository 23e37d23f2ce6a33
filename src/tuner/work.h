// Units of tuning work (init / time / verify one tactic) and the runner that executes them, in this
// process or in a worker child that reports progress over a socket (src/tuner/worker.cpp).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fp4moe/tuner.h"

namespace fp4moe::tuner_detail {

enum class UnitKind { kInit, kTime, kVerify };
const char* unit_kind_name(UnitKind k);

struct WorkUnit {
  UnitKind kind = UnitKind::kTime;
  std::string tactic;
  GemmProblem problem;
  int64_t tokens = 0;  // kTime: tokens routed (problem.total_rows = tokens * topk)
  std::string describe() const;  // "time sm90.x fc1 tokens=64"
};

struct UnitOutcome {
  bool ran = false;      // a result came back (status/ms are valid)
  Status status;
  double ms = 0;
  bool died = false;     // the process died, hung or lost its CUDA context during this unit
  std::string verdict;   // when died: "crashed" or "hung"
  std::string cause;     // when died, or when skipped (ran == false): words
};

nlohmann::json problem_to_json(const GemmProblem& p);
GemmProblem problem_from_json(const nlohmann::json& j);  // throws Error(kFormatError)
bool gemm_op_from_name(const std::string& name, GemmOp* op);

// The choices and the per-tactic report rows of a result (shared by the cache and `--json` output).
nlohmann::json result_body_to_json(const TuningResult& r);
void result_body_from_json(const nlohmann::json& j, TuningResult* r);  // throws nlohmann::json errors / Error

// Runs one unit in this process; `inited` remembers (tactic, op) pairs initialised here, and time or
// verify units initialise first when needed.
UnitOutcome execute_unit(TuningBackend& backend, const WorkUnit& unit, std::vector<std::string>& inited);

using UnitCallback = std::function<void(const WorkUnit&)>;  // called as each unit starts

// Executes the units. isolate: in worker children (restarted after a death, the dead tactic's remaining
// units skipped); else in `backend` (this process). Returns a non-ok status only when the work could not
// be done at all (the worker cannot start); per-unit failures are in the outcomes.
Status run_units(const std::vector<WorkUnit>& units, const TuneOptions& opts, TuningBackend* backend,
                 const UnitCallback& on_start, std::vector<UnitOutcome>* outcomes);

}  // namespace fp4moe::tuner_detail
