// Host side of the portable family: argument checks, launch, one GroupedGemmTactic per line of
// tactics.def (the X-macro below instantiates the FC1 and FC2 kernels of each line), and the bf16-weight
// variant used for a bf16 shared expert.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdint>
#include <memory>

#include "engine/cuda_check.h"
#include "kernels/families.h"
#include "kernels/portable_mma/portable_family.h"
#include "kernels/portable_mma/portable_nvfp4w4a16_grouped.cuh"

namespace fp4moe {
namespace portable {

namespace {

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

// Validates `args` for the kernel and fills the launch parameters. Returns ok with *empty = true when
// there is nothing to compute (no rows).
Status make_params(const std::string& who, const GroupedGemmArgs& args, bool bf16_weights, Params* out, bool* empty) {
  const GemmProblem& pr = args.problem;
  auto bad = [&](const std::string& what) {
    return Status(StatusCode::kInvalidArgument, fmt::format("{} ({}): {}", who, pr.to_string(), what));
  };
  if (pr.num_experts < 1 || pr.num_experts > (int64_t{1} << 30)) return bad("num_experts must be in [1, 2^30]");
  if (pr.n < 1 || pr.n > (int64_t{1} << 30)) return bad(fmt::format("n = {} must be in [1, 2^30]", pr.n));
  if (pr.k < 16 || pr.k % 16 != 0 || pr.k > (int64_t{1} << 30))
    return bad(fmt::format("k = {} must be a positive multiple of 16", pr.k));
  if (pr.total_rows < 0 || pr.total_rows > (int64_t{1} << 30))
    return bad(fmt::format("total_rows = {} must be in [0, 2^30]", pr.total_rows));
  if (args.last_expert_weights || args.last_expert_scales)
    return bad("the last expert's weights from their own buffer (last_expert_weights) are an sm90-family feature");
  if (args.routing)
    return bad("routing inside the launch (GroupedGemmArgs::routing) is a feature of the sm90 family's chained launch");
  if (args.fp32_rows_to_caller)
    return bad("FC2's fp32 rows left to the caller (GroupedGemmArgs::fp32_rows_to_caller) are a feature of the sm90 "
               "resident tactic's chained launch");
  *empty = pr.total_rows == 0;
  if (*empty) return Status::ok();
  if (!args.expert_offsets) return bad("expert_offsets is null");
  if (!args.a) return bad("activation pointer a is null");
  if (!args.weights) return bad("weights pointer is null");
  if (!args.out) return bad("out pointer is null");
  if (!bf16_weights && !args.tensor_scales) return bad("tensor_scales pointer is null");
  if (!aligned(args.a, 16)) return bad("activations a must be 16-byte aligned");
  if (!aligned(args.weights, 16)) return bad("weights must be 16-byte aligned");
  if (args.a_ld < pr.k || args.a_ld % 8 != 0)
    return bad(fmt::format("a_ld = {} must be >= k = {} and a multiple of 8", args.a_ld, pr.k));
  Params p;
  p.expert_offsets = args.expert_offsets;
  p.a = args.a;
  p.a_row_index = args.a_row_index;
  p.a_ld = args.a_ld;
  const int64_t nw = weight_rows(pr);
  if (bf16_weights) {
    p.w_bf16 = static_cast<const uint16_t*>(args.weights);
  } else {
    p.codes = static_cast<const uint8_t*>(args.weights);
    p.scales = p.codes + pr.num_experts * nw * (pr.k / 2);
  }
  p.tensor_scales = args.tensor_scales;
  p.out = args.out;
  p.num_experts = static_cast<int>(pr.num_experts);
  p.n = static_cast<int>(pr.n);
  p.k = static_cast<int>(pr.k);
  p.codes_vec16 = pr.k % 32 == 0;
  p.scales_vec4 = pr.k % 64 == 0;
  *out = p;
  return Status::ok();
}

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, bool BF16W>
struct Launcher {
  using Cfg = TileConfig<BM, BN, WARPS_M, WARPS_N, STAGES, BF16W>;

  static Status init() {
    FP4MOE_CUDA_RETURN(cudaFuncSetAttribute(grouped_gemm_kernel<BM, BN, WARPS_M, WARPS_N, STAGES, true, BF16W>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kDynamicSmem));
    FP4MOE_CUDA_RETURN(cudaFuncSetAttribute(grouped_gemm_kernel<BM, BN, WARPS_M, WARPS_N, STAGES, false, BF16W>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kDynamicSmem));
    return Status::ok();
  }

  static Status run(const std::string& who, const GroupedGemmArgs& args, Stream stream) {
    Params p;
    bool empty = false;
    Status st = make_params(who, args, BF16W, &p, &empty);
    if (!st.is_ok() || empty) return st;
    const GemmProblem& pr = args.problem;
    const bool fc1 = pr.op == GemmOp::kFc1SwiGlu;
    const int64_t out_cols = fc1 ? BM / 2 : BM;
    const int64_t items = token_tile_bound(pr.total_rows, pr.num_experts, BN);
    const int64_t col_tiles = (pr.n + out_cols - 1) / out_cols;
    if (col_tiles > 65535)
      return Status(StatusCode::kUnsupported,
                    fmt::format("{} ({}): {} column tiles exceed the grid's y limit 65535", who, pr.to_string(), col_tiles));
    const dim3 grid(static_cast<unsigned>(items), static_cast<unsigned>(col_tiles));
    const dim3 block(Cfg::kThreads);
    if (fc1) {
      grouped_gemm_kernel<BM, BN, WARPS_M, WARPS_N, STAGES, true, BF16W><<<grid, block, Cfg::kDynamicSmem, stream>>>(p);
    } else {
      grouped_gemm_kernel<BM, BN, WARPS_M, WARPS_N, STAGES, false, BF16W><<<grid, block, Cfg::kDynamicSmem, stream>>>(p);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
      return cuda_status(err, fmt::format("{} {} launch", who, gemm_op_name(pr.op)).c_str(), __FILE__, __LINE__);
    return Status::ok();
  }
};

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES>
class PortableTactic final : public GroupedGemmTactic {
 public:
  explicit PortableTactic(TacticDesc desc) : desc_(std::move(desc)) {}
  const TacticDesc& desc() const override { return desc_; }
  Status init(const GemmProblem& problem) override {
    if (problem.k % 16 != 0)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{}: k = {} is not a multiple of 16", desc_.name, problem.k));
    return Launcher<BM, BN, WARPS_M, WARPS_N, STAGES, false>::init();
  }
  size_t workspace_bytes(const GemmProblem&) const override { return 0; }
  Status run(const GroupedGemmArgs& args, Stream stream) const override {
    return Launcher<BM, BN, WARPS_M, WARPS_N, STAGES, false>::run(desc_.name, args, stream);
  }

 private:
  TacticDesc desc_;
};

// The bf16-weight variant: two tiles, decode-sized and prefill-sized.
using Bf16Small = Launcher<128, 8, 4, 1, 3, true>;
using Bf16Large = Launcher<128, 64, 4, 2, 3, true>;

}  // namespace

Status init_bf16_grouped() {
  Status st = Bf16Small::init();
  if (!st.is_ok()) return st;
  return Bf16Large::init();
}

Status run_bf16_grouped(const GroupedGemmArgs& args, Stream stream) {
  if (args.problem.max_rows_per_expert <= 16) return Bf16Small::run("portable.bf16.m128n8k64.s3", args, stream);
  return Bf16Large::run("portable.bf16.m128n64k64.s3", args, stream);
}

}  // namespace portable

void append_portable_tactics(std::vector<std::unique_ptr<GroupedGemmTactic>>& out) {
  const std::vector<TacticDesc>& descs = portable::portable_descs();
  size_t i = 0;
#define FP4MOE_PORTABLE_TACTIC(BM, BN, WM, WN, S, REGS) \
  out.push_back(std::make_unique<portable::PortableTactic<BM, BN, WM, WN, S>>(descs.at(i++)));
#include "kernels/portable_mma/tactics.def"
#undef FP4MOE_PORTABLE_TACTIC
}

}  // namespace fp4moe
