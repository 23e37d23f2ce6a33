// Host side of the sm90 family: the runnable tactics (one per line of tactics.def), their launch, and
// the family hooks for the registry (families.h). Built for sm_90a only (fp4moe_cuda_sources(sm90a)).
//
// Why raw PTX rather than CuTe: the kernel needs exactly one unusual piece, the RS wgmma fed by a
// hand-placed FP4 bit layout, plus mbarriers and bulk copies. That is ~100 lines of PTX wrappers
// (sm90_ptx.cuh); CuTe would add a large dependency this project does not vendor, and its layout algebra
// would still have to be bent around the custom A-fragment packing.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled (the driver entry point is looked up at run time)
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/env.h"
#include "kernels/families.h"
#include "kernels/sm90_wgmma/sm90_cc.h"
#include "kernels/sm90_wgmma/sm90_chain_routing.cuh"
#include "kernels/sm90_wgmma/sm90_family.h"
#include "kernels/sm90_wgmma/sm90_names.h"
#include "kernels/sm90_wgmma/sm90_nvfp4w4a16_grouped.cuh"
#include "kernels/sm90_wgmma/sm90_pack.h"

namespace fp4moe {
namespace sm90 {

namespace {

// cuTensorMapEncodeTiled from the driver, found once through the runtime (no link against libcuda).
Status tensor_map_encoder(PFN_cuTensorMapEncodeTiled_v12000* out) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static cudaError_t err = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e == cudaSuccess && q == cudaDriverEntryPointSuccess) fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    return e == cudaSuccess && fn == nullptr ? cudaErrorSymbolNotFound : e;
  }();
  if (err != cudaSuccess)
    return Status(StatusCode::kCudaError,
                  fmt::format("cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled) failed: {}", cudaGetErrorString(err)));
  *out = fn;
  return Status::ok();
}

// The token tensor map of contiguous rows: a [rows, k] bf16, row stride a_ld elements; box 64 x box_rows,
// 128-byte swizzle (the layout the consumers' B descriptors read), out-of-bounds elements zero.
Status encode_token_map(const uint16_t* a, int64_t rows, int64_t k, int64_t a_ld, int box_rows, CUtensorMap* map,
                        const std::string& tactic) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  Status st = tensor_map_encoder(&encode);
  if (!st) return st;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a_ld) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(a), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status(StatusCode::kCudaError, fmt::format("{}: cuTensorMapEncodeTiled for the token rows ({} x {}, ld {}) "
                                                      "failed with CUresult {}",
                                                      tactic, rows, k, a_ld, static_cast<int>(r)));
  return Status::ok();
}

// FP4MOE_SM90_STATIC_SCHEDULE=1: the static stride instead of the work counter (sm90_scheduler.cuh).
bool static_schedule_requested() { return env_switch("FP4MOE_SM90_STATIC_SCHEDULE", false); }

// FP4MOE_SM90_SPLIT_K: unset or "auto" the automatic split reduction, "off" / "0" / "1" none, N > 1 up
// to N parts wherever the stages allow (LaunchParams::split_mode). Anything else is refused by init().
Status split_mode_requested(int* mode, const std::string& tactic) {
  const char* v = std::getenv("FP4MOE_SM90_SPLIT_K");
  *mode = 0;
  if (!v || !*v || std::string(v) == "auto") return Status::ok();
  const std::string s(v);
  if (s == "off" || s == "0" || s == "1") {
    *mode = 1;
    return Status::ok();
  }
  long n = 0;
  if (!env_integer_in(v, 2, kMaxSplit, &n) || (n & (n - 1)) != 0)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{}: FP4MOE_SM90_SPLIT_K='{}': expected auto, off, or a power of two in [2, {}]", tactic, s,
                              kMaxSplit));
  *mode = static_cast<int>(n);
  return Status::ok();
}

// The FC2 throttle's depth (LaunchParams::fc2_throttle): FP4MOE_SM90_FC2_THROTTLE, 0 (off) to 16, default
// kFc2Throttle (GLM-5 T=1: 3 stages measured faster than 1, 2, 4 and off; docs/perf.md, sm90 step 56).
constexpr int kFc2Throttle = 3;
Status fc2_throttle_requested(int* depth, const std::string& tactic) {
  const char* v = std::getenv("FP4MOE_SM90_FC2_THROTTLE");
  *depth = kFc2Throttle;
  if (!v || !*v) return Status::ok();
  long n = 0;
  if (!env_integer_in(v, 0, 16, &n))
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{}: FP4MOE_SM90_FC2_THROTTLE='{}': expected a stage count in [0, 16] (0: off)", tactic, v));
  *depth = static_cast<int>(n);
  return Status::ok();
}

template <int BM, int BN, int BK, int STAGES, int CTAS, int CONS, int ACT>
class Sm90Tactic final : public GroupedGemmTactic {
 public:
  using Cfg = TileConfig<BM, BN, BK, STAGES, CTAS, CONS, ACT>;
  explicit Sm90Tactic(const TacticDesc& d) : desc_(d) {}
  const TacticDesc& desc() const override { return desc_; }

  TacticCheck check(const GemmProblem& p, const DeviceCaps& caps) const override {
    TacticCheck c = check_tactic(desc_, p, caps);
    if (!c.ok) return c;
    if (p.num_experts > kMaxExperts)
      return TacticCheck::fail(fmt::format("handles at most {} experts (work-list table in shared memory), problem has {}",
                                           kMaxExperts, p.num_experts));
    if (p.n > (int64_t(1) << 30) || p.k > (int64_t(1) << 30) || p.total_rows > (int64_t(1) << 30))
      return TacticCheck::fail(fmt::format("needs N, K and rows below 2^30 (32-bit indices), problem is {}", p.to_string()));
    return c;
  }

  Status init(const GemmProblem& p) override {
    (void)p;
    static_schedule_ = static_schedule_requested();
    prefetch_last_ = env_switch("FP4MOE_SM90_PREFETCH_LAST", true);
    fetch_ahead_ = env_switch("FP4MOE_SM90_FETCH_AHEAD", true);
    stage_wait_ = env_switch("FP4MOE_SM90_STAGE_WAIT", true);
    Status ts = fc2_throttle_requested(&fc2_throttle_, desc_.name);
    if (!ts) return ts;
    Status ms = split_mode_requested(&split_mode_, desc_.name);
    if (!ms) return ms;
    int dev = 0;
    Status s = cuda_status(cudaGetDevice(&dev), "cudaGetDevice", desc_.name);
    if (!s) return s;
    s = cuda_status(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev),
                    "cudaDeviceGetAttribute(MultiProcessorCount)", desc_.name);
    if (!s) return s;
    for (auto* fn : {kernel_fc1(), kernel_fc2(), kernel_chain()}) {
      s = cuda_status(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
                      "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", desc_.name);
      if (!s) return s;
      // setmaxnreg moves registers inside the CTA's pool; with another launch register count the
      // consumers' request could exceed what the producer returns and wait forever.
      cudaFuncAttributes attr{};
      s = cuda_status(cudaFuncGetAttributes(&attr, fn), "cudaFuncGetAttributes", desc_.name);
      if (!s) return s;
      if (attr.numRegs != Cfg::Regs::kLaunch)
        return Status(StatusCode::kInternal,
                      fmt::format("{}: kernel compiled to {} registers per thread, the setmaxnreg plan assumes {}",
                                  desc_.name, attr.numRegs, Cfg::Regs::kLaunch));
    }
    return Status::ok();
  }

  // The counters of the dynamic work schedule (sm90_scheduler.cuh): two ints, then for a chained launch
  // one for all of FC1's signals and one per token tile (at most rows / kTileRows + E tiles) and FC2 stage
  // (chain_stages: FC2's K, FC1's N, in BK stages after the padding to kPackKAlign); then (decode
  // tiles) the split reduction's arrival counters, one per unit and consumer warpgroup, and, 16-byte
  // aligned, its fp32 partial tiles (split_partial_bytes). Every region is zero again after a run (a
  // chained run with caller_resets: once the caller zeroed chained_reset_bytes). A null workspace runs the
  // static schedule (no chain, no split).
  size_t workspace_bytes(const GemmProblem& p) const override {
    return partials_offset(p) + static_cast<size_t>(split_partial_bytes(BM, BN));
  }

  // What a chained launch's finish_work_items would zero (the two schedule counters, all-FC1 and the
  // Handover counters: split_counters_offset), rounded up to 16 bytes into the split counters, which are
  // zero at rest.
  size_t chained_reset_bytes(const GemmProblem& p1) const override {
    return (split_counters_offset(p1) + 15) / 16 * 16;
  }

  // Known before init(): the engine picks tactics for a chained launch before it initialises them.
  bool can_chain() const override { return !static_schedule_requested(); }

  // The chained launch routes a decode batch itself (LaunchParams::route) on the n8 tiles
  // (TileConfig::kRoutes), for the register routing's shapes with E <= 256 (the prologue carries that one
  // instantiation) and up to kFrontMaxPairs pairs.
  bool can_route_in_chain(const MoeConfig& cfg, int64_t tokens) const override {
    const bool sigmoid = cfg.routing == RoutingKind::kSigmoidGrouped;
    return Cfg::kRoutes && can_chain() && cfg.num_experts <= 256 &&
           front_block_fits(route_detail::route_params(cfg), sigmoid, tokens, cfg.num_experts);
  }

  Status run(const GroupedGemmArgs& args, Stream stream) const override {
    const GemmProblem& p = args.problem;
    if (args.routing)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: routing inside the launch (GroupedGemmArgs::routing) needs run_chained", desc_.name));
    if (args.fp32_rows_to_caller) return refuse_fp32_rows();
    LaunchParams prm;
    prm.fetch_ahead = fetch_ahead_ ? 1 : 0;
    Status st = fill_op(args, &prm.op[0]);
    if (!st || p.total_rows == 0) return st;
    if (!aligned16(args.workspace))
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: the workspace (work counters, split partials) must be 16-byte aligned", desc_.name));
    // The dynamic schedule needs the workspace's counters; without a workspace, or with
    // FP4MOE_SM90_STATIC_SCHEDULE=1, the static stride (sm90_scheduler.cuh).
    prm.counters = static_schedule_ ? nullptr : static_cast<int*>(args.workspace);
    bind_split(args.workspace, p, &prm);
    const bool fc1 = p.op == GemmOp::kFc1SwiGlu;
    return launch(fc1 ? kernel_fc1() : kernel_fc2(), prm, max_items(p, prm.op[0].tiles64), stream);
  }

  Status run_chained(const GroupedGemmArgs& a1, const GroupedGemmArgs& a2, Stream stream) const override {
    const GemmProblem &p1 = a1.problem, &p2 = a2.problem;
    if (static_schedule_ || !can_chain())
      return Status(StatusCode::kUnsupported,
                    fmt::format("{}: no chained launch with the static schedule (FP4MOE_SM90_STATIC_SCHEDULE)", desc_.name));
    if (p1.op != GemmOp::kFc1SwiGlu || p2.op != GemmOp::kFc2 || p1.num_experts != p2.num_experts ||
        p1.total_rows != p2.total_rows || a1.expert_offsets != a2.expert_offsets || a2.a != a1.out ||
        a2.a_row_index != nullptr || p2.k != p1.n || a2.a_ld != p1.n)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: a chained launch needs FC1 {} then FC2 {} over the same experts, offsets and "
                                "rows, FC2 reading FC1's output contiguously (a = FC1's out, a_ld = K = FC1's N)",
                                desc_.name, p1.to_string(), p2.to_string()));
    if (!a1.workspace || !aligned16(a1.workspace))
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: a chained launch needs the 16-byte aligned workspace (its tile counters)", desc_.name));
    if (a1.fp32_rows_to_caller || a2.fp32_rows_to_caller) return refuse_fp32_rows();
    LaunchParams prm;
    prm.fetch_ahead = fetch_ahead_ ? 1 : 0;
    Status st = fill_op(a1, &prm.op[0]);
    if (st) st = fill_op(a2, &prm.op[1]);
    if (st && a1.routing) st = bind_routing(a1, &prm);
    if (!st || p1.total_rows == 0) return st;
    prm.counters = static_cast<int*>(a1.workspace);
    prm.stage_wait = stage_wait_ ? 1 : 0;
    prm.fc2_throttle = fc2_throttle_;
    prm.caller_resets = a1.caller_resets ? 1 : 0;
    bind_split(a1.workspace, p1, &prm);  // p2 has the same rows and experts (checked above)
    prm.fold_parts = fold_split_parts(prm.op[0].kchunks / Cfg::kChunksPerStage, prm.op[1].kchunks / Cfg::kChunksPerStage);
    return launch(kernel_chain(), prm, max_items(p1, prm.op[0].tiles64) + max_items(p2, prm.op[1].tiles64), stream);
  }

 private:
  // FC2's rows stay bf16 in `out` here (fp32_rows_offset() is negative): a caller that asked for fp32 rows
  // would read a workspace this launch never wrote.
  Status refuse_fp32_rows() const {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{}: does not leave FC2's fp32 rows to the caller (GroupedGemmArgs::"
                              "fp32_rows_to_caller; its fp32_rows_offset() is negative)",
                              desc_.name));
  }

  using KernelFn = void (*)(LaunchParams);
  static KernelFn kernel_fc1() { return &sm90_nvfp4w4a16_grouped_kernel<Cfg, LaunchMode::kFc1>; }
  static KernelFn kernel_fc2() { return &sm90_nvfp4w4a16_grouped_kernel<Cfg, LaunchMode::kFc2>; }
  static KernelFn kernel_chain() { return &sm90_nvfp4w4a16_grouped_kernel<Cfg, LaunchMode::kChain>; }

  static bool aligned16(const void* ws) { return (reinterpret_cast<uintptr_t>(ws) & 15) == 0; }

  // Workspace regions (workspace_bytes): schedule and chain counters, split counters, split partials.
  static size_t chain_stages(const GemmProblem& p) {
    const int64_t k2 = p.op == GemmOp::kFc1SwiGlu ? p.n : p.k;  // FC2's reduction either way
    return static_cast<size_t>((k2 + kPackKAlign - 1) / kPackKAlign * (kPackKAlign / BK));
  }
  static size_t split_counters_offset(const GemmProblem& p) {
    return sizeof(int) * (3 + static_cast<size_t>(p.total_rows / Cfg::kTileRows + p.num_experts + 1) * chain_stages(p));
  }
  static size_t partials_offset(const GemmProblem& p) {
    const size_t end = split_counters_offset(p) + (Cfg::kSplitCapable ? sizeof(int) * CONS * kMaxSplitItems : 0);
    return (end + 15) / 16 * 16;
  }
  // The split reduction's mode and workspace regions; none without the dynamic schedule's workspace.
  void bind_split(void* ws, const GemmProblem& p, LaunchParams* prm) const {
    if (!Cfg::kSplitCapable || ws == nullptr || static_schedule_) {
      prm->split_mode = 1;
      return;
    }
    prm->split_mode = split_mode_;
    prm->split_slots = sm_count_ * CTAS;
    prm->split_counters = reinterpret_cast<int*>(static_cast<uint8_t*>(ws) + split_counters_offset(p));
    prm->partials = reinterpret_cast<float4*>(static_cast<uint8_t*>(ws) + partials_offset(p));
  }

  // FC1's routing inside the launch (GroupedGemmArgs::routing): the batch's shape against the problem
  // and the prologue's limits, then the front end's parameters; FC1 reads its rows from a through the
  // CTA's own grouping.
  Status bind_routing(const GroupedGemmArgs& a1, LaunchParams* prm) const {
    const Status st = fill_chain_routing(*this, a1, &prm->front);
    if (!st) return st;
    const DecodeRouting& r = *a1.routing;
    const MoeConfig& cfg = *r.config;
    prm->route = 1;
    prm->op[0].tok_tma = 0;
    prm->op[0].rows_from_route = 1;
    // The folded last expert's weights prefetched into L2 behind the routing where every routed FC1 tile
    // fits the first wave even if each pair has its own expert (GLM-5 T=1: 8 x 16 m-tiles on 132 SMs):
    // its FC1 parts and FC2 items then run in the chain's tail, soon after. Measured: GLM-5 T=1 -2.5 us;
    // at T=2 (two waves) +1.5 us, so not there. FP4MOE_SM90_PREFETCH_LAST=0 is the control.
    const int64_t mtiles0 = (prm->op[0].tiles64 + Cfg::kM64PerCta - 1) / Cfg::kM64PerCta;
    prm->prefetch_last = prefetch_last_ && a1.last_expert_weights != nullptr &&
                                 r.tokens * cfg.topk * mtiles0 <= int64_t(sm_count_) * CTAS
                             ? 1
                             : 0;
    return Status::ok();
  }

  // Upper bound on the units of one GEMM: every expert may add a partial token tile.
  static int64_t max_items(const GemmProblem& p, int tiles64) {
    const int64_t mtiles = (tiles64 + Cfg::kM64PerCta - 1) / Cfg::kM64PerCta;
    return (p.total_rows / Cfg::kTileRows + p.num_experts) * mtiles;
  }

  // Checks one GEMM's arguments and fills its kernel parameters (the token tensor map for contiguous rows).
  Status fill_op(const GroupedGemmArgs& args, Params* out) const {
    const GemmProblem& p = args.problem;
    if (sm_count_ == 0)
      return Status(StatusCode::kInvalidArgument, fmt::format("{}: run() before init()", desc_.name));
    if (p.num_experts <= 0 || p.num_experts > kMaxExperts || p.k % 16 != 0 || p.k <= 0 || p.n <= 0)
      return Status(StatusCode::kInvalidArgument, fmt::format("{}: unsupported problem {}", desc_.name, p.to_string()));
    if (args.a_ld % 8 != 0 || args.a_ld < p.k || (reinterpret_cast<uintptr_t>(args.a) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(args.weights) & 15) != 0)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: needs 16-byte aligned activations and weights and a_ld a multiple of 8 "
                                "elements >= K (a_ld {}, K {})",
                                desc_.name, args.a_ld, p.k));
    if ((args.last_expert_weights == nullptr) != (args.last_expert_scales == nullptr) ||
        (reinterpret_cast<uintptr_t>(args.last_expert_weights) & 15) != 0)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: the last expert's own weights and tensor scales come both or neither, the "
                                "weights 16-byte aligned (weights {}, scales {})",
                                desc_.name, args.last_expert_weights, static_cast<const void*>(args.last_expert_scales)));
    const PackGeometry g = pack_geometry(p);
    Params& prm = *out;
    prm.expert_offsets = args.expert_offsets;
    prm.a = args.a;
    prm.a_row_index = args.a_row_index;
    prm.a_ld = args.a_ld;
    prm.weights = static_cast<const uint8_t*>(args.weights);
    prm.tensor_scales = args.tensor_scales;
    prm.last_weights = static_cast<const uint8_t*>(args.last_expert_weights);
    prm.last_scales = args.last_expert_scales;
    prm.out = args.out;
    prm.num_experts = static_cast<int>(p.num_experts);
    prm.n = static_cast<int>(p.n);
    prm.k = static_cast<int>(p.k);
    prm.tiles64 = static_cast<int>(g.tiles);
    prm.kchunks = static_cast<int>(g.kchunks);
    // Contiguous rows: the producer loads tokens with TMA (not rows a launch groups itself, bind_routing;
    // not the e4m3 tile, whose producer lanes load and split one token's activations).
    if (!Cfg::kE4m3 && args.a_row_index == nullptr && args.routing == nullptr && p.total_rows > 0) {
      Status st = encode_token_map(args.a, p.total_rows, p.k, args.a_ld, BN, &prm.tok_map, desc_.name);
      if (!st) return st;
      prm.tok_tma = 1;
    }
    return Status::ok();
  }

  // The grid: one CTA per SM slot, but no more than the launch can have items, so a small problem
  // launches no idle CTAs (their prologue would take SM slots from a concurrent kernel, the shared
  // expert's side stream and the routed GEMMs). The automatic split makes at most half the slots of
  // items (choose_split), so a splitting launch gets that many CTAs; a forced split may give a CTA
  // several items.
  Status launch(KernelFn fn, const LaunchParams& prm, int64_t max_items, Stream stream) const {
    const int64_t slots = int64_t(sm_count_) * CTAS;
    const int64_t items = prm.split_mode == 0 ? std::max(max_items, slots / 2) : max_items;
    const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(slots, items)));
    return cuda_status(launch_pdl(fn, dim3(grid), dim3(Cfg::kThreads), Cfg::kSmemBytes, reinterpret_cast<cudaStream_t>(stream), prm),
                       "kernel launch", desc_.name);
  }

  TacticDesc desc_;
  int sm_count_ = 0;
  bool static_schedule_ = false;  // FP4MOE_SM90_STATIC_SCHEDULE
  int split_mode_ = 0;            // FP4MOE_SM90_SPLIT_K (LaunchParams::split_mode)
  bool prefetch_last_ = true;     // FP4MOE_SM90_PREFETCH_LAST (LaunchParams::prefetch_last)
  bool fetch_ahead_ = true;       // FP4MOE_SM90_FETCH_AHEAD (LaunchParams::fetch_ahead)
  bool stage_wait_ = true;        // FP4MOE_SM90_STAGE_WAIT (LaunchParams::stage_wait)
  int fc2_throttle_ = kFc2Throttle;  // FP4MOE_SM90_FC2_THROTTLE (LaunchParams::fc2_throttle)
};

const WeightLayoutOps kSm90LayoutOps = {WeightLayout::kSm90Interleaved, &packed_bytes, &pack_device};
const WeightLayoutOps kSm90E4m3LayoutOps = {WeightLayout::kSm90E4m3, &packed_bytes, &pack_e4m3_device};

template <int BM, int BN, int BK, int STAGES, int CTAS, int CONS, int ACT>
bool resources_if_named(const std::string& name, cudaFuncAttributes* out, Status* st) {
  if (name != tactic_name(BM, BN, BK, STAGES, CTAS, CONS, ACT)) return false;
  using Cfg = TileConfig<BM, BN, BK, STAGES, CTAS, CONS, ACT>;
  cudaFuncAttributes a{}, b{}, c{};
  *st = cuda_status(cudaFuncGetAttributes(&a, &sm90_nvfp4w4a16_grouped_kernel<Cfg, LaunchMode::kFc1>),
                    "cudaFuncGetAttributes", name);
  if (st->is_ok())
    *st = cuda_status(cudaFuncGetAttributes(&b, &sm90_nvfp4w4a16_grouped_kernel<Cfg, LaunchMode::kFc2>),
                      "cudaFuncGetAttributes", name);
  if (st->is_ok())
    *st = cuda_status(cudaFuncGetAttributes(&c, &sm90_nvfp4w4a16_grouped_kernel<Cfg, LaunchMode::kChain>),
                      "cudaFuncGetAttributes", name);
  *out = a;
  out->numRegs = std::max({a.numRegs, b.numRegs, c.numRegs});
  out->localSizeBytes = std::max({a.localSizeBytes, b.localSizeBytes, c.localSizeBytes});
  return true;
}

}  // namespace

Status kernel_resources(const std::string& tactic_name, cudaFuncAttributes* out) {
  Status st(StatusCode::kNotFound, fmt::format("no sm90 tactic named '{}'", tactic_name));
#define FP4MOE_SM90_TACTIC(BM, BN, BK, STAGES, CTAS, CONS, ACT) \
  if (resources_if_named<BM, BN, BK, STAGES, CTAS, CONS, ACT>(tactic_name, out, &st)) return st;
#include "kernels/sm90_wgmma/tactics.def"
#undef FP4MOE_SM90_TACTIC
  return st;
}

Status set_trace_buffer(void* buffer) {
#ifdef FP4MOE_SM90_TRACE
  auto* p = static_cast<unsigned long long*>(buffer);
  const Status st =
      cuda_status(cudaMemcpyToSymbol(g_trace, &p, sizeof(p)), "cudaMemcpyToSymbol(g_trace)", "sm90 trace");
  return st ? cc_set_trace_buffer(buffer) : st;
#else
  (void)buffer;
  return Status(StatusCode::kUnsupported, "the sm90 family was built without FP4MOE_SM90_TRACE (no timeline records)");
#endif
}

}  // namespace sm90

void append_sm90_tactics(std::vector<std::unique_ptr<GroupedGemmTactic>>& out) {
  std::vector<TacticDesc> descs;
  append_sm90_tactic_descs(descs);
  size_t i = 0;
#define FP4MOE_SM90_TACTIC(BM, BN, BK, STAGES, CTAS, CONS, ACT) \
  out.push_back(std::make_unique<sm90::Sm90Tactic<BM, BN, BK, STAGES, CTAS, CONS, ACT>>(descs.at(i++)));
#include "kernels/sm90_wgmma/tactics.def"
#undef FP4MOE_SM90_TACTIC
}

const WeightLayoutOps* sm90_weight_layout_ops(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::kSm90Interleaved: return &sm90::kSm90LayoutOps;
    case WeightLayout::kSm90E4m3: return &sm90::kSm90E4m3LayoutOps;
    default: return nullptr;
  }
}

}  // namespace fp4moe
