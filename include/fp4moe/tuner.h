// The tuner (shared/DESIGN.md section 4): preflight every tactic against the device, initialise the
// survivors, time them per token bucket, verify the winner against the fallback on a small case and
// choose; profiling runs in a child process so that a kernel fault can never take the caller down.
//
//   TuningBackend      what the tuner drives: candidates, caps, init, time, verify (the CUDA backend over
//                      find_tactic(), or a fake one in CPU tests)
//   tune_layer()       the whole start-up procedure for one MoE layer's FC1/FC2 shapes
//   TuningCache        JSON, keyed by device, versions, tactic set, shape and bucket (src/tuner/cache.cpp)
//   apply_tuning()     a result -> EngineOptions::fc1_by_bucket / fc2_by_bucket
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/device_caps.h"
#include "fp4moe/engine.h"
#include "fp4moe/status.h"
#include "fp4moe/tactic.h"

namespace fp4moe {

// Every failing requirement of a tactic, in rule order (check_tactic returns the first).
std::vector<std::string> check_tactic_all(const TacticDesc& desc, const GemmProblem& problem, const DeviceCaps& caps);

// ---------------------------------------------------------------------------------------------------
// Backend

class TuningBackend {
 public:
  virtual ~TuningBackend() = default;
  virtual std::vector<TacticDesc> candidates() const = 0;  // at least one with is_fallback for a usable set
  virtual DeviceCaps caps() const = 0;
  // Prepares `tactic` for problems like `problem` (shared-memory opt-in, descriptors). A failure carries
  // the CUDA error in its message.
  virtual Status init(const std::string& tactic, const GemmProblem& problem) = 0;
  // Milliseconds per call for `problem` (its total_rows = tokens * topk), routing `tokens` tokens.
  virtual Status time(const std::string& tactic, const GemmProblem& problem, int64_t tokens, double* ms) = 0;
  // Runs `tactic` and the fallback on a small case of the same op/N/K; not ok when they differ
  // (relative L2 > 5e-3) or either fails.
  virtual Status verify(const std::string& tactic, const GemmProblem& problem) = 0;
  // False once the process can no longer run kernels (a sticky CUDA error such as an illegal address);
  // the worker then reports and exits so that a fresh process carries on.
  virtual bool healthy() const { return true; }
};

// Backends are re-created in the worker child by name, so each one is registered with a factory. The
// argument string is passed through to the child unchanged (e.g. a device index).
using TuningBackendFactory = std::function<std::unique_ptr<TuningBackend>(const std::string& arg)>;
void register_tuning_backend(const std::string& name, TuningBackendFactory factory);
// Creates a registered backend; throws Error(kInvalidArgument) naming the known ones.
std::unique_ptr<TuningBackend> make_tuning_backend(const std::string& name, const std::string& arg);

// The CUDA backend ("cuda", arg = device index) over find_tactic() and all_tactic_descs(), plus
// `extra` tactics (tests inject faulty ones). Throws kUnsupported without CUDA or device.
std::unique_ptr<TuningBackend> make_cuda_tuning_backend(int device, std::vector<GroupedGemmTactic*> extra = {});

// The simulated backend ("sim", arg = a device profile name): the registry's descriptors on the
// profile's caps with timings from a roofline model, no kernels. For exercising the tuner, the cache and
// the CLI on machines without a GPU; its timings are not measurements.
std::unique_ptr<TuningBackend> make_sim_tuning_backend(const std::string& profile);

// Call first in main() of every program that uses the tuner with isolation: when argv asks for a tuner
// worker, runs it and returns true with *exit_code set (main returns it); otherwise returns false.
bool tuner_worker_main_if_requested(int argc, char** argv, int* exit_code);

// ---------------------------------------------------------------------------------------------------
// Tuning

struct TuneProgress {
  int64_t done = 0, total = 0;  // units of work (init / time / verify)
  std::string what;             // "time sm90.x fc1 tokens=64"
};

struct TuneOptions {
  std::string backend = "cuda";   // registered backend name (re-created in the worker)
  std::string backend_arg = "0";
  int64_t max_bucket = 8192;      // buckets: powers of two 1, 2, 4, .. up to the first >= max_bucket
  std::vector<int64_t> buckets;   // explicit buckets instead (sorted, positive)
  bool isolate = true;            // run init/time/verify in a child process
  double unit_timeout_s = 60;     // a worker silent this long on one unit is killed (hung tactic)
  std::vector<std::string> excluded;  // never considered
  int rank = -1;                  // for log lines
  std::function<void(const TuneProgress&)> on_progress;
};

std::vector<int64_t> tuning_buckets(int64_t max_bucket);

// The layer's grouped-GEMM problems for `tokens` tokens (routed experts).
GemmProblem fc1_problem(const MoeConfig& cfg, int64_t tokens);
GemmProblem fc2_problem(const MoeConfig& cfg, int64_t tokens);

// One row of the report: a tactic for one op.
struct TacticReport {
  std::string tactic;
  GemmOp op = GemmOp::kFc2;
  bool is_fallback = false;
  // "ok", "rejected" (preflight), "init-failed", "wrong-result", "crashed" (the worker died),
  // "hung", "failed" (a run error), "excluded"
  std::string verdict = "ok";
  std::string reason;                                  // words; empty when ok
  std::vector<std::pair<int64_t, double>> ms;          // bucket -> ms, for the buckets it was timed on
  std::vector<std::pair<int64_t, std::string>> skipped;  // bucket -> preflight reason for that bucket only
};

struct BucketChoice {
  GemmOp op = GemmOp::kFc2;
  int64_t bucket = 0;
  std::string tactic;
  double ms = 0;          // 0 when not timed (fallback chosen without a timing)
  bool verified = false;  // checked against the fallback (the fallback itself counts as verified)
};

struct TuningResult {
  DeviceCaps caps;
  MoeConfig config;
  std::vector<int64_t> buckets;
  std::vector<TacticReport> tactics;
  std::vector<BucketChoice> choices;
  double seconds = 0;       // wall time of the tuning
  bool from_cache = false;
  std::string choice(GemmOp op, int64_t bucket) const;  // "" when none
};

// Preflight only (no device needed): the report rows with verdict "ok" or "rejected" per (tactic, op),
// checked at every bucket.
TuningResult preflight_layer(const MoeConfig& cfg, const std::vector<TacticDesc>& descs, const DeviceCaps& caps,
                             const std::vector<int64_t>& buckets);

// The full procedure. Never throws; the returned status is kUnsupported (listing every tactic with its
// reason) only when no tactic at all can run one of the layer's problems.
Status tune_layer(const MoeConfig& cfg, const TuneOptions& opts, TuningResult* out);

// ---------------------------------------------------------------------------------------------------
// Cache (src/tuner/cache.cpp)

// --cache flag, else $FP4MOE_CACHE, else $XDG_CACHE_HOME/fp4moe/tuning.json, else ~/.cache/fp4moe/tuning.json.
std::string default_tuning_cache_path();
std::string tuning_cache_path(const std::string& flag_value);

// The key of everything that can change the binary or the timing.
struct TuningKey {
  std::string device_name;
  int cc = 0;
  int64_t smem_per_block = 0;
  int driver_version = 0, runtime_version = 0;
  std::string library_version;  // FP4MOE_VERSION
  std::string tactic_set;       // tactic_set_hash() (or the backend's candidate hash)
  std::string to_string() const;
  bool operator==(const TuningKey& o) const;
};
TuningKey make_tuning_key(const DeviceCaps& caps, const std::vector<TacticDesc>& descs);
std::string hash_tactic_descs(const std::vector<TacticDesc>& descs);

// Loads the choices for (key, cfg shape, buckets). Returns true with *out filled when every bucket of both
// ops is present. Corrupt, partial, foreign (other device) or other-version content gives one warning
// line (returned in *warning, also logged) and false; a missing file gives false without a warning.
bool load_tuning_cache(const std::string& path, const TuningKey& key, const MoeConfig& cfg,
                       const std::vector<int64_t>& buckets, TuningResult* out, std::string* warning = nullptr);
// Merges `result` into the file (other shapes/devices are kept when the file is readable), written to
// a temporary file and renamed over the path.
Status store_tuning_cache(const std::string& path, const TuningKey& key, const TuningResult& result);

// ---------------------------------------------------------------------------------------------------
// Use

// Fills opts->fc1_by_bucket / fc2_by_bucket from the result's choices and adds tactics the tuner saw
// fail (crashed, wrong-result, init-failed, hung) to opts->excluded_tactics.
void apply_tuning(const TuningResult& result, EngineOptions* opts);

// Cache first, tune on a miss, store the result. The one call `fp4moe run` / `bench` need.
Status tuned_engine_options(const MoeConfig& cfg, const TuneOptions& opts, const std::string& cache_path,
                            EngineOptions* engine_opts, TuningResult* result = nullptr);

// Cache only, never tunes: fills *engine_opts from the tuning `fp4moe tune` stored for CUDA device
// `device` and this layer shape (buckets up to max_tokens). Returns false on a miss, without a device, or
// on a bad cache (one warning); never throws. The cheap call for `fp4moe run` / `bench` at start-up.
bool load_cached_engine_options(const MoeConfig& cfg, int device, const std::string& cache_path, int64_t max_tokens,
                                EngineOptions* engine_opts);

// Report rendering for `fp4moe doctor` / `tune`: the table (tactic, op, verdict, reason, per-bucket ms with
// the winner marked) and the JSON form.
std::string format_tuning_table(const TuningResult& result);
std::string tuning_result_json(const TuningResult& result);

}  // namespace fp4moe
