// Grouped-GEMM tactics as data (shared/DESIGN.md section 4): each tactic declares what it needs, and
// check(problem, caps) says ok or why not in words, before anything touches the device.
//
// The descriptor side (TacticDesc, TacticRequirements, check) is host-only and always built, so the
// tuner and `fp4moe doctor --device-profile X` work in builds without CUDA. The kernel side
// (GroupedGemmTactic::run) exists only in CUDA builds.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/device_caps.h"
#include "fp4moe/status.h"

struct CUstream_st;
namespace fp4moe {
using Stream = CUstream_st*;  // == cudaStream_t, without including CUDA headers

enum class GemmOp : uint8_t {
  kFc1SwiGlu,  // h = a · W1ᵀ with W1 [2I, H] (gate rows then up rows); out = silu(gate*sg) * (up*su), [rows, I]
  kFc2,        // y = a · W2ᵀ with W2 [H, I]; out [rows, H]
};
const char* gemm_op_name(GemmOp op);  // "fc1" / "fc2"

// The problem, independent of the choice of tactic (DeepGEMM's GemmDesc).
struct GemmProblem {
  GemmOp op = GemmOp::kFc2;
  int64_t num_experts = 0;      // groups
  int64_t n = 0;                // output columns: FC1 I (weight rows 2I), FC2 H
  int64_t k = 0;                // reduction: FC1 H, FC2 I; multiple of 16
  int64_t total_rows = 0;       // capacity in rows across all experts (T * topk)
  int64_t max_rows_per_expert = 0;  // host-known upper bound (often total_rows)
  std::string to_string() const;    // "fc1 E=256 n=2048 k=6144 rows=64"
};

// Routing and the permutation of a decode batch done by a chained launch itself (GroupedGemmArgs::routing
// of FC1 in run_chained, where the family can: can_route_in_chain()). Every CTA routes the tokens from
// their logits and groups the tokens * topk (token, expert) pairs into rows in shared memory (the
// engine's fused small-batch front end does the same in its own launch), so no earlier launch has to
// write expert_offsets, and FC1 reads its rows from `a` (the token rows) through that grouping. One CTA
// also stores ids, weights, offsets, gather and pair_pos, the bytes the separate front end writes.
struct DecodeRouting {
  const MoeConfig* config = nullptr;  // the routing rule (topk, softmax or grouped sigmoid, scaling)
  const float* logits = nullptr;      // device [tokens, E] fp32
  const float* bias = nullptr;        // device [E] or null: sigmoid routing's selection bias
  int64_t tokens = 0;
  bool append_tokens = false;         // every token also a row of one more expert (index E, rows P .. P + T - 1)
  int32_t* ids = nullptr;             // device [tokens, topk] out
  float* weights = nullptr;           // device [tokens, topk] out
  int32_t* offsets = nullptr;         // device [E + 1] (+1 with append_tokens) out: FC1's and FC2's expert_offsets
  int32_t* gather = nullptr;          // device [tokens * topk (+ tokens with append_tokens)] out: token of row r
  int32_t* pair_pos = nullptr;        // device [tokens * topk] out: grouped row of pair t * topk + k
};

// Device pointers for one grouped GEMM. Rows are grouped by expert: expert e owns rows
// [expert_offsets[e], expert_offsets[e+1]) of the problem. The host never reads the offsets.
struct GroupedGemmArgs {
  GemmProblem problem;
  const int32_t* expert_offsets = nullptr;  // device [E + 1], offsets[0] = 0, offsets[E] <= total_rows
  const uint16_t* a = nullptr;              // device bf16 activations
  const int32_t* a_row_index = nullptr;     // device [total_rows] or null: problem row r reads a[a_row_index[r], :]
  int64_t a_ld = 0;                         // elements between rows of a (>= k)
  const void* weights = nullptr;            // device, in the layout of the tactic's family (see weight_layout)
  const float* tensor_scales = nullptr;     // device: FC1 [E, 2] (gate, up), FC2 [E]
  // Or null: the last expert's (E-1) weights, in the same layout, and tensor scales (FC1 [2], FC2 [1]) from
  // their own buffers, both or neither, so a separately stored expert (the engine's shared expert) runs
  // in the same launch as the others. The sm90 family only; other families refuse it.
  const void* last_expert_weights = nullptr;
  const float* last_expert_scales = nullptr;
  // Or null: FC1 of a chained launch routes and groups a decode batch itself (DecodeRouting); then `a`
  // holds the token rows, a_row_index is null and expert_offsets is routing->offsets.
  const DecodeRouting* routing = nullptr;
  uint16_t* out = nullptr;                  // device bf16 [total_rows, n]; rows past offsets[E] untouched
  void* workspace = nullptr;                // device, workspace_bytes(problem) bytes, zeroed before the
                                            // first run; every run leaves it zero again (but see caller_resets)
  // FC1's args of run_chained only: true, the launch leaves its first chained_reset_bytes(fc1 problem)
  // workspace bytes for the caller to zero, on the same stream after it and before the next run on that
  // workspace (the engine's finalize does), instead of zeroing them in its last CTA, whose extra round
  // trip then delays the launch's end. The rest of the workspace is zero after the launch as always.
  bool caller_resets = false;
  // FC1's args of run_chained only, for tactics whose fp32_rows_offset() is not negative: true, FC2 leaves
  // each row r as its fp32 sums in the workspace (hidden floats at fp32_rows_offset(fc1 problem) bytes + 4r
  // hidden) instead of bf16 in FC2's `out`, which it leaves untouched; the caller reads them there (rounding
  // each to bf16, FC2's output) and zeroes them, on the same stream after the launch and before the next run
  // on that workspace (the engine's finalize does). The launch then ends with its last adds, without the
  // round trips of a last CTA that converts each row.
  bool fp32_rows_to_caller = false;
};

// Device weight layouts. kCanonical: per expert, codes [N, K/2] uint8 then block scales [N, K/16] e4m3,
// experts back to back (codes of all experts first, then scales of all experts); see
// src/engine/weight_layout.h. Families that want a shuffled layout declare their own id.
enum class WeightLayout : uint8_t { kCanonical = 0, kSm90Interleaved = 1, kSm90E4m3 = 2, kSm90Cc = 3 };
const char* weight_layout_name(WeightLayout l);

struct TacticRequirements {
  int min_cc = 80;                  // inclusive, cc_major*10+cc_minor
  int max_cc = 1000;                // inclusive
  bool needs_arch_specific = false; // sm_90a-only instructions (wgmma, setmaxnreg)
  int exact_cc = 0;                 // if non-zero, the binary exists only for this cc (e.g. 90 for sm_90a code)
  int64_t smem_bytes = 0;           // dynamic + static shared memory per block
  int regs_per_thread = 0;          // from the compiler's report (upper bound)
  int threads = 0;                  // per block
  int cluster = 1;                  // CTAs per cluster (needs cluster_launch when > 1)
  int k_align = 16;                 // K must be a multiple of this
  int n_align = 1;                  // N must be a multiple of this
  int64_t max_rows_per_expert = 0;  // 0: unlimited
  std::vector<GemmOp> ops = {GemmOp::kFc1SwiGlu, GemmOp::kFc2};
};

struct TacticDesc {
  std::string name;     // stable, e.g. "portable.mma.m64n64k64.s3" or "sm90.w4a16.m64n128k128.ws.s4"
  std::string family;   // "portable", "sm90"
  int tile_m = 0, tile_n = 0, tile_k = 0, stages = 0;
  int ctas_per_sm = 1;  // resident CTAs per SM the tile is sized for (occupancy, not a requirement)
  std::string schedule; // "grid", "persistent", "warpspecialized", ...
  WeightLayout layout = WeightLayout::kCanonical;
  bool is_fallback = false;  // the guaranteed fallback (STYLE: tactic -1)
  TacticRequirements req;
};

// Result of a preflight check.
struct TacticCheck {
  bool ok = true;
  std::string reason;   // empty when ok, else one sentence: "needs 132 KB shared memory per block, device allows 99 KB"
  static TacticCheck pass() { return {}; }
  static TacticCheck fail(std::string why) { return {false, std::move(why)}; }
};

// Checks desc.req against the problem and device; the first failing requirement is the reason.
TacticCheck check_tactic(const TacticDesc& desc, const GemmProblem& problem, const DeviceCaps& caps);

// A runnable tactic (CUDA builds). init() may fail (e.g. cudaFuncSetAttribute refusing the shared
// memory); run() is asynchronous on `stream`, allocates nothing and is graph-capturable.
class GroupedGemmTactic {
 public:
  virtual ~GroupedGemmTactic() = default;
  virtual const TacticDesc& desc() const = 0;
  virtual TacticCheck check(const GemmProblem& p, const DeviceCaps& caps) const { return check_tactic(desc(), p, caps); }
  virtual Status init(const GemmProblem& p) = 0;
  virtual size_t workspace_bytes(const GemmProblem& p) const = 0;
  virtual Status run(const GroupedGemmArgs& args, Stream stream) const = 0;
  // FC1 (SwiGLU) and then FC2 on FC1's output rows in one launch, where the family can (can_chain(),
  // after init): the same experts and expert_offsets, fc2.a == fc1.out, FC2's rows contiguous. The
  // workspace is the one workspace_bytes() sized for the larger of the two problems. Otherwise
  // kUnsupported, and the caller runs the two GEMMs.
  virtual bool can_chain() const { return false; }
  // Whether run_chained takes FC1's GroupedGemmArgs::routing for this decode batch (after init).
  virtual bool can_route_in_chain(const MoeConfig& cfg, int64_t tokens) const {
    (void)cfg, (void)tokens;
    return false;
  }
  virtual Status run_chained(const GroupedGemmArgs& fc1, const GroupedGemmArgs& fc2, Stream stream) const {
    (void)fc1, (void)fc2, (void)stream;
    return Status(StatusCode::kUnsupported, desc().name + ": no chained FC1 -> FC2 launch");
  }
  // The leading workspace bytes a chained launch with GroupedGemmArgs::caller_resets leaves non-zero (a
  // multiple of 16, at most workspace_bytes(fc1)); 0: the tactic does not take caller_resets.
  virtual size_t chained_reset_bytes(const GemmProblem& fc1) const {
    (void)fc1;
    return 0;
  }
  // Where a chained launch with GroupedGemmArgs::fp32_rows_to_caller leaves FC2's fp32 rows (bytes into the
  // workspace, 16-byte aligned); negative: the tactic does not take fp32_rows_to_caller.
  virtual int64_t fp32_rows_offset(const GemmProblem& fc1) const {
    (void)fc1;
    return -1;
  }
};

// Converting canonical device weights into a family's layout, once at engine creation (CUDA builds).
// Canonical (kCanonical) device weights for a problem with E experts, N weight rows (FC1: 2I, gate
// rows then up rows; FC2: H) and K columns are one buffer: codes [E][N][K/2] uint8, immediately
// followed by block scales [E][N][K/16] e4m3fn. Each family with its own layout registers one of these.
struct WeightLayoutOps {
  WeightLayout layout = WeightLayout::kCanonical;
  size_t (*bytes)(const GemmProblem& p) = nullptr;  // device bytes of the packed layout
  Status (*pack)(const GemmProblem& p, const void* canonical, void* dst, Stream stream) = nullptr;
};
const WeightLayoutOps* find_weight_layout_ops(WeightLayout layout);  // nullptr when unknown / no CUDA
// Weight rows of a problem: FC1 2*n, FC2 n.
inline int64_t weight_rows(const GemmProblem& p) { return p.op == GemmOp::kFc1SwiGlu ? 2 * p.n : p.n; }

// Every tactic descriptor this build knows (host data, always available), fallback(s) first.
const std::vector<TacticDesc>& all_tactic_descs();
// A stable hash of the tactic table (names + requirements), for cache keys.
std::string tactic_set_hash();
// The runnable tactic by stable name (nullptr when unknown or when this build has no CUDA).
GroupedGemmTactic* find_tactic(const std::string& name);

}  // namespace fp4moe
