// The CUDA MoE engine (include/fp4moe/engine.h): route -> permute -> FC1 (SwiGLU) -> FC2 -> finalize,
// plus the shared expert, all asynchronous on the caller's stream with one workspace sized at creation.
//
// Creation: validate the config and options, read the device caps, choose a tactic per token bucket
// (powers of two up to max_tokens) for each of the four GEMMs (routed FC1/FC2, shared FC1/FC2), upload
// or generate the canonical weights, pack the layouts the chosen tactics want (once), init the tactics,
// and allocate the workspace. Forward: only kernel launches on `stream`; nothing is allocated, nothing
// is copied to the host, so a forward can be captured in a CUDA graph.
//
// Expert parallelism (EngineOptions::ep_size > 1, src/engine/expert_shard.h): the engine holds only its
// rank's experts (and the shared expert on rank 0). Routing stays global; a small kernel maps each pair's
// global id to its local id or to the dropped bucket `count`, the permutation groups over count + 1
// experts, FC1/FC2 run over the `count` local experts (never over the dropped rows past
// offsets[count]), and finalize skips the dropped pairs: the output is the rank's partial of the layer.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

#include "common/env.h"
#include "engine/cuda_check.h"
#include "engine/device_weights.h"
#include "engine/engine_kernels.h"
#include "engine/expert_shard.h"
#include "engine/tactic_choice.h"
#include "engine/workspace.h"
#include "fp4moe/engine.h"
#include "fp4moe/log.h"
#include "kernels/portable_mma/portable_family.h"

namespace fp4moe {

namespace engine {
namespace {

struct BucketTactics {
  GroupedGemmTactic* fc1 = nullptr;
  GroupedGemmTactic* fc2 = nullptr;
  GroupedGemmTactic* shared_fc1 = nullptr;  // null when the shared expert is absent or bf16
  GroupedGemmTactic* shared_fc2 = nullptr;
  bool chain = false;  // the routed FC1 and FC2 in one launch (GroupedGemmTactic::run_chained)
  bool fold = false;   // the shared expert as expert E of that launch, where the front end is fused (finish())
  bool route = false;  // that launch routes the batch itself where the front end is fused (routed())
};

GemmProblem sized(const GemmProblem& shape, int64_t rows, int64_t max_rows_per_expert) {
  GemmProblem p = shape;
  p.total_rows = rows;
  p.max_rows_per_expert = max_rows_per_expert;
  return p;
}

// A routed GEMM with the shared expert (T rows) folded in as one more expert.
GemmProblem folded(GemmProblem p, int64_t T) {
  p.total_rows += T;
  p.num_experts += 1;
  p.max_rows_per_expert = std::max(p.max_rows_per_expert, T);
  return p;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The tuned name for `bucket`: the entry with the smallest bucket >= it, else none.
std::string tuned_for(const std::vector<std::pair<int64_t, std::string>>& table, int64_t bucket) {
  const std::pair<int64_t, std::string>* best = nullptr;
  for (const auto& kv : table)
    if (kv.first >= bucket && (!best || kv.first < best->first)) best = &kv;
  return best ? best->second : std::string();
}

class CudaMoeEngine final : public MoeEngine {
 public:
  ~CudaMoeEngine() override {
    if (fork_) (void)cudaEventDestroy(fork_);
    if (join_) (void)cudaEventDestroy(join_);
    if (side_) (void)cudaStreamDestroy(side_);
  }

  // Everything but the weights; throws Error.
  void setup(const MoeConfig& cfg, const EngineOptions& opts) {
    cfg.validate("engine config");
    cfg_ = cfg;
    opts_ = opts;
    shard_ = expert_shard(cfg, opts.ep_size, opts.ep_rank);  // kInvalidArgument naming the values
    FP4MOE_CHECK(opts.max_tokens >= 1, StatusCode::kInvalidArgument, "EngineOptions::max_tokens = {} must be >= 1",
                 opts.max_tokens);
    FP4MOE_CHECK(opts.max_tokens * cfg.topk <= (int64_t{1} << 30), StatusCode::kInvalidArgument,
                 "EngineOptions::max_tokens = {} x topk = {} exceeds 2^30 grouped rows", opts.max_tokens, cfg.topk);
    FP4MOE_CHECK(cfg.hidden % 8 == 0 && cfg.inter % 8 == 0, StatusCode::kInvalidArgument,
                 "hidden ({}) and inter ({}) must be multiples of 8", cfg.hidden, cfg.inter);
    std::string why;
    if (!cuda_backend_available(&why)) throw Error(StatusCode::kUnsupported, why);
    caps_ = query_device_caps(opts.device);  // throws kInvalidArgument for a missing device
    FP4MOE_CHECK(caps_.cc() >= 80, StatusCode::kUnsupported,
                 "device {} ({}) is sm_{}; fp4moe's kernels need sm_80 or newer", opts.device, caps_.name, caps_.cc());
    FP4MOE_CUDA_THROW(cudaSetDevice(opts.device));
  }

  // After the weights are on the device: tactics, layouts, workspace. Throws Error.
  void finish() {
    const int64_t E = cfg_.num_experts;
    for (int64_t b = 1;; b *= 2) {
      buckets_.push_back(b);
      if (b >= opts_.max_tokens) break;
    }
    const bool shared_nvfp4 = w_.has_shared() && !w_.shared_fc1.bf16;
    std::set<std::pair<GroupedGemmTactic*, const DeviceGemmWeights*>> used;
    // `rows` is the capacity the GEMM runs with; the choice sees `expected` rows (the heuristic divides
    // them by the experts). With expert parallelism a routed GEMM's capacity stays b * topk (every pair
    // may be local) but a rank expects b * topk / ep_size of them under uniform routing, so the choice
    // sees those and the heuristic's rows per expert equal the whole layer's.
    // One-token tiles (tile_n 1: the sm90 e4m3 decode tile) read a packed layout of their own, so an
    // engine whose buckets also choose other tiles of the family holds the weights twice: the heuristic
    // and the tuner's choice take them only with EngineOptions::extra_weight_layouts or in an engine of
    // one token (max_tokens = 1, whose buckets all choose them where any does); a forced name is obeyed.
    // And not for a bucket of several tokens that folds a shared expert into the routed launch: one-token
    // items stream the shared expert's weights once per token (GLM-5 T = 2 / 4: +4% against the n8 tile,
    // docs/perf.md sm90 step 50).
    // The resident tactic (schedule "resident", sm90_cc.cu: one CTA per row and 16 SwiGLU columns, the
    // math on the CUDA cores) is one the heuristic may take for one-token buckets whose CTAs fit one wave
    // (its check): the TP8 shard's T = 1 forward 22.7 against the wgmma chain's 26.0 us on an H200, 23.0
    // against 26.4 on an H100 (docs/perf.md, sm90 steps 67-71). FP4MOE_SM90_CC=0 leaves it to a forced or
    // tuned choice (the tuner timed it on this device and checked its result against the fallback's).
    std::vector<std::string> one_token, resident;
    for (const TacticDesc& d : all_tactic_descs()) {
      if (d.tile_n == 1) one_token.push_back(d.name);
      if (d.schedule == "resident") resident.push_back(d.name);
    }
    const bool one_token_layout_ok = opts_.extra_weight_layouts || opts_.max_tokens == 1;
    const bool resident_ok = env_switch("FP4MOE_SM90_CC", true);
    // The largest bucket (max_rows) each tactic runs, which sizes its workspace: the resident tactic's
    // fp32 rows grow with the rows it may run, and it runs only one-token buckets.
    std::map<GroupedGemmTactic*, int64_t> largest_bucket;
    auto choose = [&](const DeviceGemmWeights& g, int64_t rows, int64_t expected, int64_t max_rows,
                      const std::string& forced, const std::string& tuned, bool one_token_ok = true,
                      bool resident_here = true) {
      GroupedGemmTactic* t = nullptr;
      std::string note;
      TacticRequest req{forced, tuned, opts_.excluded_tactics};
      if (forced.empty() && !(one_token_ok && one_token_layout_ok))
        req.excluded.insert(req.excluded.end(), one_token.begin(), one_token.end());
      const bool tuned_resident = std::find(resident.begin(), resident.end(), tuned) != resident.end();
      if (forced.empty() && !tuned_resident && !(resident_ok && resident_here))
        req.excluded.insert(req.excluded.end(), resident.begin(), resident.end());
      const GemmProblem p = sized(g.shape, expected, max_rows);
      Status st = choose_tactic(p, caps_, req, &t, &note);
      if (!st.is_ok()) throw Error(st.code(), st.message());
      if (!note.empty()) log::warn("engine", "{} bucket rows={}: {}", gemm_op_name(p.op), rows, note);
      if (expected != rows) {
        const TacticCheck c = t->check(sized(g.shape, rows, max_rows), caps_);
        if (!c.ok) throw Error(StatusCode::kUnsupported, fmt::format("tactic {} cannot run {}: {}", t->desc().name,
                                                                     sized(g.shape, rows, max_rows).to_string(), c.reason));
      }
      used.insert({t, &g});
      largest_bucket[t] = std::max(largest_bucket[t], max_rows);
      return t;
    };
    // The tuner's buckets were measured on the whole layer: with expert parallelism they are ignored (a
    // forced tactic, else the heuristic on the rank's expected rows).
    const bool use_tuned = shard_.is_whole();
    // The routed FC1 and FC2 as one launch (GroupedGemmTactic::run_chained) where the two use the same
    // tactic and the problem is decode-sized (prefer_chained; docs/perf.md, sm90 steps 18-21). Not the
    // shared expert: on its side stream a chained launch holds SM slots with CTAs waiting for FC1 while
    // the routed GEMMs need them (GLM-5 T = 32 forward 921 against 896 us). FP4MOE_CHAIN=0 keeps two
    // launches (the control).
    const bool chain_ok = env_switch("FP4MOE_CHAIN", true);
    // The shared expert folded into the routed chained launch as one more expert holding every token
    // (its weights from their own buffers, GroupedGemmArgs::last_expert_weights), instead of its own two
    // launches on the side stream, whose CTAs took whole SMs from the persistent chain: the TP8 shard
    // -9% / -5% / -5% at T = 1 / 2 / 8, GLM-5 -3% at T = 1 and 2 and the same at T = 8, DeepSeek-V3 +1.5%
    // at T = 1 and -3% at T = 8 (docs/perf.md, sm90 step 30). Where its shapes equal the routed
    // experts' (the same packed geometry), on the whole layer (an expert shard holds it on rank 0 only)
    // and for the decode batches the fused front end takes (it appends the token rows).
    // FP4MOE_FOLD_SHARED=0 is the control.
    const bool fold_ok = env_switch("FP4MOE_FOLD_SHARED", true) && shared_nvfp4 && shard_.is_whole() &&
                         w_.shared_fc1.shape.n == w_.fc1.shape.n && w_.shared_fc1.shape.k == w_.fc1.shape.k &&
                         w_.shared_fc2.shape.n == w_.fc2.shape.n && w_.shared_fc2.shape.k == w_.fc2.shape.k;
    // The chained launch routes and groups a decode batch itself (GroupedGemmArgs::routing) instead of
    // the fused front end's launch before it (left out, the forward measured 6 us shorter at GLM-5 T=1
    // and on the TP8 shard): every CTA routes the few tokens in its prologue and FC1 reads the token rows
    // through its own grouping. Net: GLM-5 T = 1 / 2 -2% / -1.5%, TP8 -7% / -3%, T=8 the same (docs/perf.md,
    // sm90 step 31). Whole layer or TP shard (the expert shard's dropped pairs stay with the front end).
    // Not by default on the resident tactic: there the fused front end before the launch measured faster
    // (TP8 T = 1: 22.7 against 23.3 us on an H200; docs/perf.md, sm90 steps 70-71). FP4MOE_ROUTE_IN_CHAIN
    // set applies to every tactic: 0 the control, 1 the resident tactic's routing prologue too.
    const bool route_ok = env_switch("FP4MOE_ROUTE_IN_CHAIN", true) && shard_.is_whole();
    const bool route_set = env_is_set("FP4MOE_ROUTE_IN_CHAIN");
    for (int64_t b : buckets_) {
      BucketTactics bt;
      const int64_t rows = b * cfg_.topk;
      const int64_t expected = std::max<int64_t>(1, (rows + shard_.size - 1) / shard_.size);
      const std::string tuned1 = use_tuned ? tuned_for(opts_.fc1_by_bucket, b) : std::string();
      const std::string tuned2 = use_tuned ? tuned_for(opts_.fc2_by_bucket, b) : std::string();
      const bool one_token_ok = !(fold_ok && b > 1);
      bt.fc1 = choose(w_.fc1, rows, expected, b, opts_.fc1_tactic, tuned1, one_token_ok);
      bt.fc2 = choose(w_.fc2, rows, expected, b, opts_.fc2_tactic, tuned2, one_token_ok);
      const bool chain_wanted =
          chain_ok && prefer_chained(sized(w_.fc1.shape, expected, b), sized(w_.fc2.shape, expected, b));
      // A chained launch runs one tactic. Where the heuristic chose two (none forced or tuned), FC1 takes
      // FC2's when that one can run it: FC2's choice is the one a short reduction constrains (the TP8
      // shard, K = 256, takes the two-CTA k256 tile, FC1 the four-consumer one), and the chain saved more
      // than FC1's own tile gained (docs/perf.md, sm90 step 28).
      if (chain_wanted && bt.fc1 != bt.fc2 && bt.fc2->can_chain() && opts_.fc1_tactic.empty() &&
          opts_.fc2_tactic.empty() && tuned1.empty() && tuned2.empty() &&
          bt.fc2->check(sized(w_.fc1.shape, rows, b), caps_).ok) {
        bt.fc1 = bt.fc2;  // the first choice stays in `used` (another bucket may run it; an extra init is harmless)
        used.insert({bt.fc1, &w_.fc1});
        largest_bucket[bt.fc1] = std::max(largest_bucket[bt.fc1], b);
      }
      bt.chain = chain_wanted && bt.fc1 == bt.fc2 && bt.fc1->can_chain();
      if (shared_nvfp4) {
        // Not the resident tactic on the side stream: sized to fill the SMs once, its grid would take
        // them from the routed GEMMs it runs beside.
        bt.shared_fc1 = choose(w_.shared_fc1, b, b, b, opts_.fc1_tactic, "", true, false);
        bt.shared_fc2 = choose(w_.shared_fc2, b, b, b, opts_.fc2_tactic, "", true, false);
      }
      bt.fold = fold_ok && bt.chain && front_small_supported(cfg_, b, permute_experts()) &&
                bt.fc1->check(folded(sized(w_.fc1.shape, rows, b), b), caps_).ok &&
                bt.fc1->check(folded(sized(w_.fc2.shape, rows, b), b), caps_).ok;
      bt.route = route_ok && (route_set || bt.fc1->desc().schedule != "resident") && bt.chain &&
                 bt.fc1->can_route_in_chain(cfg_, b);
      if (bt.fold) {  // the shared expert's weights in the chained tactic's layout too
        used.insert({bt.fc1, &w_.shared_fc1});
        used.insert({bt.fc1, &w_.shared_fc2});
      }
      tactics_.push_back(bt);
      if (env_switch("FP4MOE_PRINT_TACTICS", false))
        log::info("engine", "tokens<={}: fc1 {} fc2 {}{}{}{}", b, bt.fc1->desc().name, bt.fc2->desc().name,
                  bt.chain ? (bt.fold ? " (chained, shared expert folded in)" : " (chained)") : "",
                  bt.route ? " (routing in the launch at fused-front sizes)" : "",
                  shared_nvfp4 ? fmt::format(" shared {} / {}", bt.shared_fc1->desc().name, bt.shared_fc2->desc().name)
                               : std::string());
    }
    // Layouts and init, once per (tactic, GEMM), at the largest problem the tactic runs.
    size_t tactic_ws = 0;
    for (const auto& tw : used) {
      GroupedGemmTactic* t = tw.first;
      DeviceGemmWeights& g = const_cast<DeviceGemmWeights&>(*tw.second);
      const bool shared = &g == &w_.shared_fc1 || &g == &w_.shared_fc2;
      const int64_t maxb = largest_bucket.at(t);
      const GemmProblem p = sized(g.shape, shared ? maxb : maxb * cfg_.topk, maxb);
      g.prepare(t->desc().layout, nullptr);
      Status st = t->init(p);
      if (!st.is_ok()) throw Error(st.code(), fmt::format("init of tactic {} failed: {}", t->desc().name, st.message()));
      tactic_ws = std::max(tactic_ws, t->workspace_bytes(p));
    }
    int64_t fold_rows = 0;
    for (size_t i = 0; i < buckets_.size(); ++i) {
      if (!tactics_[i].fold) continue;
      const int64_t b = buckets_[i];
      fold_rows = std::max(fold_rows, b);
      // A chained launch takes the workspace of the larger of its two problems (run_chained's contract).
      for (const DeviceGemmWeights* g : {&w_.fc1, &w_.fc2})
        tactic_ws = std::max(tactic_ws, tactics_[i].fc1->workspace_bytes(folded(sized(g->shape, b * cfg_.topk, b), b)));
    }
    // The canonical buffer is kept only when a chosen tactic reads it.
    for (DeviceGemmWeights* g : {&w_.fc1, &w_.fc2, &w_.shared_fc1, &w_.shared_fc2}) {
      if (g->empty() || g->bf16) continue;
      bool canonical_used = false;
      for (const auto& tw : used)
        if (tw.second == g && tw.first->desc().layout == WeightLayout::kCanonical) canonical_used = true;
      if (!canonical_used) g->drop_canonical();
    }
    for (const Status& st : {prepare_routing_kernels(cfg_), prepare_permute_kernels(permute_experts())})
      if (!st.is_ok()) throw Error(st.code(), st.message());
    if (w_.has_shared() && w_.shared_fc1.bf16) {
      Status st = portable::init_bf16_grouped();
      if (!st.is_ok()) throw Error(st.code(), st.message());
    }
    WorkspaceShape ws;
    ws.max_tokens = opts_.max_tokens;
    ws.experts = E;
    ws.permute_experts = permute_experts();
    ws.need_local_ids = !shard_.is_whole();
    ws.topk = cfg_.topk;
    ws.hidden = cfg_.hidden;
    ws.inter = cfg_.inter;
    ws.shared_inter = w_.has_shared() ? w_.shared_fc1.shape.n : 0;
    ws.fold_rows = fold_rows;
    ws.need_logits = static_cast<bool>(w_.router);
    ws.tactic_bytes = tactic_ws;
    // FP4MOE_SERIAL_STREAM=1 keeps the shared expert on the caller's stream (no side stream), e.g. for
    // compute-sanitizer racecheck, which did not finish the two-stream forward within minutes.
    serial_ = env_switch("FP4MOE_SERIAL_STREAM", false);
    if (w_.has_shared() && !serial_) {
      FP4MOE_CUDA_THROW(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
      FP4MOE_CUDA_THROW(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
      FP4MOE_CUDA_THROW(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    }
    // FP4MOE_FC1_GATHER=index: FC1 reads its token rows through the row index instead of the gathered
    // copy (routed()).
    const char* gather = std::getenv("FP4MOE_FC1_GATHER");
    if (gather && std::string(gather) == "index") fc1_gather_ = Fc1Gather::kIndex;
    // FP4MOE_FRONT_SMALL=0: routing, permutation and the row copy as separate launches at every T (the
    // control for the fused small-batch front end, routed()).
    front_small_ = env_switch("FP4MOE_FRONT_SMALL", true);
    // FP4MOE_CHAIN_FP32_ROWS=0: a chained launch that could leave FC2's fp32 rows to finalize converts them
    // itself (the control, routed()).
    fp32_rows_ = env_switch("FP4MOE_CHAIN_FP32_ROWS", true);
    plan_ = plan_workspace(ws);
    workspace_ = DeviceBuffer(plan_.total, "engine workspace");
    ptrs_ = bind_workspace(plan_, workspace_.get());
    // The tactics' scratch starts zeroed (the sm90 work counters; GroupedGemmArgs::workspace).
    FP4MOE_CUDA_THROW(cudaMemset(ptrs_.tactic, 0, plan_.total - plan_.tactic));  // both regions, the last ones
    FP4MOE_CUDA_THROW(cudaDeviceSynchronize());  // weights ready before any forward on any stream
  }

  DeviceLayerWeights& weights() { return w_; }
  const ExpertShard& shard() const { return shard_; }

  Status forward(const uint16_t* x, int64_t tokens, const float* logits, uint16_t* out, Stream stream,
                 ForwardOutputs* outputs) override {
    const int64_t T = tokens, K = cfg_.topk, H = cfg_.hidden;
    if (T < 0 || T > opts_.max_tokens)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("forward: tokens = {} outside [0, max_tokens = {}]", T, opts_.max_tokens));
    if (outputs) {
      outputs->topk_ids = ptrs_.topk_ids;
      outputs->topk_weights = ptrs_.topk_weights;
    }
    if (T == 0) return Status::ok();
    if (!x) return Status(StatusCode::kInvalidArgument, fmt::format("forward: x is null for {} tokens", T));
    if (!out) return Status(StatusCode::kInvalidArgument, fmt::format("forward: out is null for {} tokens", T));
    if (!aligned16(x) || !aligned16(out))
      return Status(StatusCode::kInvalidArgument, "forward: x and out must be 16-byte aligned device pointers");
    if (!logits && !w_.router)
      return Status(StatusCode::kInvalidArgument,
                    "forward: no router logits given and the engine has no router weight to compute them");
    int current = -1;
    FP4MOE_CUDA_RETURN(cudaGetDevice(&current));
    if (current != opts_.device) FP4MOE_CUDA_RETURN(cudaSetDevice(opts_.device));

    const BucketTactics& bt = tactics_[bucket_index(T)];
    size_t reset = 0;  // workspace bytes the routed launch leaves to finalize (GroupedGemmArgs::caller_resets)
    float* rows32 = nullptr;  // or FC2's fp32 rows, left to finalize (GroupedGemmArgs::fp32_rows_to_caller)
    if (bt.fold && fused_front(T)) {  // the shared expert runs as expert E of the routed launch, rows P..P+T
      const Status st = routed(x, T, logits, bt, true, stream, &reset, &rows32);
      if (!st.is_ok()) return st;
      if (rows32) return finalize(nullptr, T, out, stream, reset, rows32, rows32 + T * K * H);
      return finalize(ptrs_.y + T * K * H, T, out, stream, reset);
    }
    Status st;
    const uint16_t* y_shared = nullptr;
    if (w_.has_shared() && serial_) {
      st = shared_expert(x, T, bt, stream);
      if (!st.is_ok()) return st;
      return finish_forward(x, T, logits, bt, ptrs_.ys, out, stream);
    }
    if (w_.has_shared()) {
      FP4MOE_CUDA_RETURN(cudaEventRecord(fork_, stream));
      FP4MOE_CUDA_RETURN(cudaStreamWaitEvent(side_, fork_, 0));
      st = shared_expert(x, T, bt, side_);
      if (!st.is_ok()) return st;
      FP4MOE_CUDA_RETURN(cudaEventRecord(join_, side_));
      y_shared = ptrs_.ys;
    }
    st = routed(x, T, logits, bt, false, stream, &reset, &rows32);
    // Join the side stream even after an error, so a capture in progress stays well formed.
    if (y_shared) {
      const cudaError_t err = cudaStreamWaitEvent(stream, join_, 0);
      if (st.is_ok() && err != cudaSuccess) {
        // No finalize: what the routed launch left in the tactics' workspace is zeroed here instead.
        zero_left_by_routed(stream, reset, rows32);
        return cuda_status(err, "cudaStreamWaitEvent(join)", __FILE__, __LINE__);
      }
    }
    if (!st.is_ok()) return st;
    return finalize(y_shared, T, out, stream, reset, rows32);
  }

  // Serial variant: routed experts and finalize on `stream` after the shared expert.
  Status finish_forward(const uint16_t* x, int64_t T, const float* logits, const BucketTactics& bt,
                        const uint16_t* y_shared, uint16_t* out, cudaStream_t stream) {
    size_t reset = 0;
    float* rows32 = nullptr;
    const Status st = routed(x, T, logits, bt, false, stream, &reset, &rows32);
    if (!st.is_ok()) return st;
    return finalize(y_shared, T, out, stream, reset, rows32);
  }

  // Where no finalize will run (a failed launch after the routed GEMMs), a memset zeroes what it would have:
  // all of the routed tactics' workspace where FC2's fp32 rows are in it, else the first `reset` bytes.
  void zero_left_by_routed(cudaStream_t stream, size_t reset, const float* rows32) {
    const size_t bytes = rows32 ? plan_.tactic_shared - plan_.tactic : reset;
    if (bytes > 0) (void)cudaMemsetAsync(ptrs_.tactic, 0, bytes, stream);
  }

  // The combine into `out`, which also zeroes the first `reset` bytes of the tactics' workspace where the
  // routed launch left them (GroupedGemmArgs::caller_resets), and, given rows32 (and rows32_shared, the
  // folded shared expert's: FC2's rows as fp32 sums in the tactics' workspace), reads those instead of y and
  // zeroes them. Should the launch fail, zero_left_by_routed does that instead, so that the next forward
  // does not start on this one's counters and sums.
  Status finalize(const uint16_t* y_shared, int64_t T, uint16_t* out, cudaStream_t stream, size_t reset,
                  float* rows32 = nullptr, float* rows32_shared = nullptr) {
    const Status st =
        launch_finalize_partial(ptrs_.y, ptrs_.pair_pos, ptrs_.topk_weights, kept_rows(), y_shared, T, cfg_.topk,
                                cfg_.hidden, out, stream, reset ? ptrs_.tactic : nullptr, reset, rows32, rows32_shared);
    if (!st.is_ok()) zero_left_by_routed(stream, reset, rows32);
    return st;
  }

  // Routing, permutation and the routed experts' FC1 / FC2 on `stream`; with `fold` (bt.fold and
  // fused_front(T)) the shared expert too, as expert E holding grouped rows P .. P + T - 1.
  Status routed(const uint16_t* x, int64_t T, const float* logits, const BucketTactics& bt, bool fold,
                cudaStream_t stream, size_t* reset, float** rows32) {
    *reset = 0;
    *rows32 = nullptr;
    const int64_t K = cfg_.topk, E = cfg_.num_experts, H = cfg_.hidden, I = cfg_.inter;
    Status st;
    // Routing is global (all E experts) on every rank.
    if (!logits) {
      st = engine::launch_router_logits(x, w_.router.as<float>(), T, H, E, ptrs_.logits, stream);
      if (!st.is_ok()) return st;
      logits = ptrs_.logits;
    }
    PermuteBuffers pb;
    pb.rank = ptrs_.rank;
    pb.chunk_base = ptrs_.chunk_base;
    pb.offsets = ptrs_.offsets;
    pb.gather = ptrs_.gather;
    pb.pair_pos = ptrs_.pair_pos;
    pb.shared_offsets = nullptr;  // written on the side stream by shared_expert()

    // FC1 reads token gather[r] for grouped row r from a copy of the rows in grouped order (in y, which
    // FC2 overwrites later; with expert parallelism only the kept rows), so the kernel loads contiguous
    // rows (the sm90 family by TMA) instead of one 16-byte cp.async per row and k64 block. The copy costs
    // one write and one read of the kept rows (2.7 us at T = 1, 377 us at T = 8192 on the H200) and
    // measured faster at every T (docs/perf.md, sm90 step 15). FP4MOE_FC1_GATHER=index keeps the row
    // index (the comparison in the same run); H not a multiple of 8 does too.
    const bool copy_rows = H % 8 == 0 && fc1_gather_ == Fc1Gather::kCopy;
    GroupedGemmArgs a1;
    a1.problem = sized(w_.fc1.shape, T * K, T);
    if (fold) a1.problem = folded(a1.problem, T);
    a1.expert_offsets = ptrs_.offsets;
    a1.a = x;
    a1.a_row_index = ptrs_.gather;
    a1.a_ld = H;
    DecodeRouting dr;  // routing inside the chained launch (bt.route)
    if (fused_front(T) && bt.route) {
      dr.config = &cfg_;
      dr.logits = logits;
      dr.bias = w_.bias.as<float>();
      dr.tokens = T;
      dr.append_tokens = fold;
      dr.ids = ptrs_.topk_ids;
      dr.weights = ptrs_.topk_weights;
      dr.offsets = ptrs_.offsets;
      dr.gather = ptrs_.gather;
      dr.pair_pos = ptrs_.pair_pos;
      a1.routing = &dr;
      a1.a_row_index = nullptr;  // a1.a = x: the launch reads token rows through its own grouping
    } else if (fused_front(T)) {
      // Decode: routing, permutation and the copy in one launch (front_small.cu). The resident tactic reads
      // each row with one bulk copy, through the index as fast as from a copy, and its chained launch spreads
      // the folded shared expert over the routed rows' CTAs only where every row's index names the same
      // token (sm90_cc.cu): it takes the index, and the launch copies nothing.
      const bool resident = bt.fc1->desc().schedule == "resident";
      st = launch_front_small(logits, w_.bias.as<float>(), T, cfg_, FrontShard{shard_.first, shard_.count}, x, H,
                              ptrs_.topk_ids, ptrs_.topk_weights, pb, resident ? nullptr : ptrs_.y, stream, fold);
      if (!st.is_ok()) return st;
      a1.a = resident ? x : ptrs_.y;
      a1.a_row_index = resident ? ptrs_.gather : nullptr;
    } else {
      st = launch_routing(logits, w_.bias.as<float>(), T, cfg_, ptrs_.topk_ids, ptrs_.topk_weights, stream);
      if (!st.is_ok()) return st;
      const int32_t* ids = ptrs_.topk_ids;  // global ids stay in topk_ids (ForwardOutputs)
      if (!shard_.is_whole()) {
        st = launch_local_expert_ids(ptrs_.topk_ids, T * K, shard_.first, shard_.count, ptrs_.local_ids, stream);
        if (!st.is_ok()) return st;
        ids = ptrs_.local_ids;
      }
      st = launch_permute(ids, T, K, permute_experts(), pb, stream);
      if (!st.is_ok()) return st;
      if (copy_rows) {
        if ((st = launch_gather_rows(x, H, ptrs_.gather, T * K, kept_rows(), H, ptrs_.y, stream)), !st.is_ok())
          return st;
        a1.a = ptrs_.y;
        a1.a_row_index = nullptr;
      }
    }
    a1.weights = w_.fc1.weights(bt.fc1->desc().layout);
    a1.tensor_scales = w_.fc1.tensor_scales.as<float>();
    a1.out = ptrs_.h1;
    a1.workspace = ptrs_.tactic;
    GroupedGemmArgs a2;
    a2.problem = sized(w_.fc2.shape, T * K, T);
    a2.expert_offsets = ptrs_.offsets;
    a2.a = ptrs_.h1;
    a2.a_ld = I;
    a2.weights = w_.fc2.weights(bt.fc2->desc().layout);
    a2.tensor_scales = w_.fc2.tensor_scales.as<float>();
    a2.out = ptrs_.y;
    a2.workspace = ptrs_.tactic;
    if (fold) {  // bt.fold: a chained launch
      a2.problem = folded(a2.problem, T);
      a1.last_expert_weights = w_.shared_fc1.weights(bt.fc1->desc().layout);
      a1.last_expert_scales = w_.shared_fc1.tensor_scales.as<float>();
      a2.last_expert_weights = w_.shared_fc2.weights(bt.fc2->desc().layout);
      a2.last_expert_scales = w_.shared_fc2.tensor_scales.as<float>();
    }
    if (bt.chain) {
      // The chained launch leaves its counters to finalize, the next kernel on this stream; and, where the
      // tactic can (the resident one) at decode sizes, FC2's rows as fp32 sums, which finalize rounds to bf16
      // and zeroes (GroupedGemmArgs::fp32_rows_to_caller; FP4MOE_CHAIN_FP32_ROWS=0 is the control).
      const size_t bytes = bt.fc1->chained_reset_bytes(a1.problem);
      a1.caller_resets = bytes > 0;
      const int64_t rows_at = bt.fc1->fp32_rows_offset(a1.problem);
      a1.fp32_rows_to_caller = fp32_rows_ && fused_front(T) && rows_at >= 0;
      st = bt.fc1->run_chained(a1, a2, stream);
      if (st.is_ok()) *reset = bytes;
      if (st.is_ok() && a1.fp32_rows_to_caller) *rows32 = reinterpret_cast<float*>(static_cast<uint8_t*>(ptrs_.tactic) + rows_at);
      return st;
    }
    if ((st = bt.fc1->run(a1, stream)), !st.is_ok()) return st;
    return bt.fc2->run(a2, stream);

  }

  // The shared expert: one expert holding all T rows, FC1 then FC2 into ptrs_.ys, on `stream`.
  Status shared_expert(const uint16_t* x, int64_t T, const BucketTactics& bt, cudaStream_t stream) {
    Status st = launch_write_offsets(ptrs_.shared_offsets, T, stream);
    if (!st.is_ok()) return st;
    const int64_t H = cfg_.hidden, Is = w_.shared_fc1.shape.n;
    GroupedGemmArgs s1;
    s1.problem = sized(w_.shared_fc1.shape, T, T);
    s1.expert_offsets = ptrs_.shared_offsets;
    s1.a = x;
    s1.a_ld = H;
    s1.out = ptrs_.hs;
    s1.workspace = ptrs_.tactic_shared;
    GroupedGemmArgs s2;
    s2.problem = sized(w_.shared_fc2.shape, T, T);
    s2.expert_offsets = ptrs_.shared_offsets;
    s2.a = ptrs_.hs;
    s2.a_ld = Is;
    s2.out = ptrs_.ys;
    s2.workspace = ptrs_.tactic_shared;
    if (w_.shared_fc1.bf16) {
      s1.weights = w_.shared_fc1.canonical.get();
      s2.weights = w_.shared_fc2.canonical.get();
      if ((st = portable::run_bf16_grouped(s1, stream)), !st.is_ok()) return st;
      return portable::run_bf16_grouped(s2, stream);
    }
    s1.weights = w_.shared_fc1.weights(bt.shared_fc1->desc().layout);
    s1.tensor_scales = w_.shared_fc1.tensor_scales.as<float>();
    s2.weights = w_.shared_fc2.weights(bt.shared_fc2->desc().layout);
    s2.tensor_scales = w_.shared_fc2.tensor_scales.as<float>();
    if ((st = bt.shared_fc1->run(s1, stream)), !st.is_ok()) return st;
    return bt.shared_fc2->run(s2, stream);
  }

  const MoeConfig& config() const override { return cfg_; }
  std::string fc1_tactic_for(int64_t tokens) const override {
    return tactics_[bucket_index(std::max<int64_t>(tokens, 1))].fc1->desc().name;
  }
  std::string fc2_tactic_for(int64_t tokens) const override {
    return tactics_[bucket_index(std::max<int64_t>(tokens, 1))].fc2->desc().name;
  }
  size_t workspace_bytes() const override { return plan_.total; }
  size_t weight_bytes() const override {
    return w_.fc1.device_bytes() + w_.fc2.device_bytes() + w_.shared_fc1.device_bytes() + w_.shared_fc2.device_bytes() +
           w_.router.bytes() + w_.bias.bytes();
  }

 private:
  // Whether routing, permutation and the row copy take the fused small-batch launch at T tokens.
  bool fused_front(int64_t T) const {
    return cfg_.hidden % 8 == 0 && fc1_gather_ == Fc1Gather::kCopy && front_small_ &&
           front_small_supported(cfg_, T, permute_experts());
  }
  // Experts the permutation groups into: E, or the local experts plus the dropped bucket.
  int64_t permute_experts() const { return shard_.is_whole() ? shard_.count : shard_.count + 1; }
  // Device int: the first grouped row of the dropped bucket (finalize skips rows from there), or null.
  const int32_t* kept_rows() const { return shard_.is_whole() ? nullptr : ptrs_.offsets + shard_.count; }

  size_t bucket_index(int64_t tokens) const {
    size_t i = 0;
    while (i + 1 < buckets_.size() && buckets_[i] < tokens) ++i;
    return i;
  }

  MoeConfig cfg_;
  EngineOptions opts_;
  ExpertShard shard_;  // the experts held (all of them unless ep_size > 1)
  DeviceCaps caps_;
  DeviceLayerWeights w_;
  std::vector<int64_t> buckets_;
  std::vector<BucketTactics> tactics_;
  WorkspacePlan plan_;
  DeviceBuffer workspace_;
  WorkspacePointers ptrs_;
  // The shared expert runs on side_ between fork_ (recorded on the caller's stream) and join_ (waited on
  // by the caller's stream before finalize): it overlaps routing, permutation and the routed GEMMs.
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  bool serial_ = false;  // FP4MOE_SERIAL_STREAM: everything on the caller's stream
  enum class Fc1Gather { kCopy, kIndex };
  Fc1Gather fc1_gather_ = Fc1Gather::kCopy;  // FP4MOE_FC1_GATHER
  bool front_small_ = true;                   // FP4MOE_FRONT_SMALL
  bool fp32_rows_ = true;                     // FP4MOE_CHAIN_FP32_ROWS
};

Status create_engine(const MoeConfig& cfg, const EngineOptions& opts, std::unique_ptr<MoeEngine>* out,
                     const std::function<void(DeviceLayerWeights&, const ExpertShard&)>& load) {
  if (!out) return Status(StatusCode::kInvalidArgument, "MoeEngine::create: output pointer is null");
  out->reset();
  auto engine = std::make_unique<CudaMoeEngine>();
  Status st = status_from([&] {
    engine->setup(cfg, opts);
    load(engine->weights(), engine->shard());
    engine->finish();
  });
  if (!st.is_ok()) {
    (void)cudaGetLastError();  // leave no non-sticky error behind for the caller's next call
    return st;
  }
  *out = std::move(engine);
  return Status::ok();
}

}  // namespace
}  // namespace engine

Status MoeEngine::create(const MoeLayerWeights& weights, const EngineOptions& opts, std::unique_ptr<MoeEngine>* out) {
  return engine::create_engine(weights.config, opts, out,
                               [&](engine::DeviceLayerWeights& w, const engine::ExpertShard& shard) {
                                 engine::upload_layer(weights, shard, &w);
                               });
}

Status MoeEngine::create_synthetic(const MoeConfig& cfg, const SyntheticSpec& spec, const EngineOptions& opts,
                                   std::unique_ptr<MoeEngine>* out) {
  return engine::create_engine(cfg, opts, out, [&](engine::DeviceLayerWeights& w, const engine::ExpertShard& shard) {
    engine::generate_synthetic_layer(cfg, spec, shard, &w, nullptr);
  });
}

bool cuda_backend_available(std::string* why_not) {
  const int n = cuda_device_count();
  if (n <= 0) {
    if (why_not) *why_not = "no CUDA device is present (or no driver)";
    return false;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    if (why_not) *why_not = "cannot read the compute capability of CUDA device 0";
    return false;
  }
  if (major < 8) {
    if (why_not) *why_not = fmt::format("CUDA device 0 is sm_{}{}; fp4moe needs sm_80 or newer", major, minor);
    return false;
  }
  return true;
}

}  // namespace fp4moe
