// The sm90 family's tactic descriptors (host data, built with or without CUDA), one per line of
// tactics.def. Requirements come from the same constexpr layout the kernel uses (tile_config.h).
#include <fmt/format.h>

#include "kernels/families.h"
#include "kernels/sm90_wgmma/sm90_cc.h"
#include "kernels/sm90_wgmma/sm90_cc_layout.h"
#include "kernels/sm90_wgmma/sm90_pack.h"
#include "kernels/sm90_wgmma/sm90_names.h"
#include "kernels/sm90_wgmma/tile_config.h"

namespace fp4moe {

namespace {

template <int BM, int BN, int BK, int STAGES, int CTAS, int CONS, int ACT>
TacticDesc sm90_desc() {
  using Cfg = sm90::TileConfig<BM, BN, BK, STAGES, CTAS, CONS, ACT>;
  static_assert(sizeof(Cfg) > 0, "");
  TacticDesc d;
  d.name = sm90::tactic_name(BM, BN, BK, STAGES, CTAS, CONS, ACT);
  d.family = "sm90";
  d.tile_m = BM;
  d.tile_n = Cfg::kTileRows;  // tokens per work item (the e4m3 tile: 1)
  d.tile_k = BK;
  d.stages = STAGES;
  d.ctas_per_sm = CTAS;
  d.schedule = "warpspecialized";
  d.layout = Cfg::kE4m3 ? WeightLayout::kSm90E4m3 : WeightLayout::kSm90Interleaved;
  d.is_fallback = false;
  d.req.min_cc = 90;
  d.req.max_cc = 90;
  d.req.exact_cc = 90;
  d.req.needs_arch_specific = true;  // wgmma, setmaxnreg
  d.req.smem_bytes = Cfg::kSmemBytes;
  d.req.regs_per_thread = Cfg::Regs::kLaunch;
  d.req.threads = Cfg::kThreads;
  d.req.cluster = 1;
  d.req.k_align = 16;   // K is zero-padded to 64 in the packed layout; tokens are zero-filled past K
  d.req.n_align = 1;    // rows are zero-padded to 64 and the epilogue masks columns past N
  d.req.max_rows_per_expert = 0;
  d.req.ops = {GemmOp::kFc1SwiGlu, GemmOp::kFc2};
  return d;
}

}  // namespace

void append_sm90_tactic_descs(std::vector<TacticDesc>& out) {
#define FP4MOE_SM90_TACTIC(BM, BN, BK, STAGES, CTAS, CONS, ACT) \
  out.push_back(sm90_desc<BM, BN, BK, STAGES, CTAS, CONS, ACT>());
#include "kernels/sm90_wgmma/tactics.def"
#undef FP4MOE_SM90_TACTIC
}

// The resident tactic (sm90_cc.cu). Its shared memory grows with the hidden size: the descriptor
// declares GLM-5's (H = 6144, 190,808 bytes), which a 99 KB device refuses by the descriptor alone, and
// check_cc_tactic checks each problem's own. Its one row per expert is a speed rule, not a correctness
// one (every row reads its expert's weights again): two rows per expert run correctly but stream twice.
void append_sm90_cc_tactic_descs(std::vector<TacticDesc>& out) {
  TacticDesc d;
  d.name = sm90::kCcTacticName;
  d.family = "sm90";
  d.tile_m = 2 * sm90::kCcCols;  // FC1's 16 gate and 16 up rows of a CTA
  d.tile_n = 1;                   // one token per CTA
  d.tile_k = sm90::kCcChunkK;     // FC1's K per chunk (one mbarrier)
  d.stages = 0;                   // every chunk of the CTA in flight at once
  d.ctas_per_sm = 1;
  d.schedule = "resident";
  d.layout = WeightLayout::kSm90Cc;
  d.req.min_cc = 90;
  d.req.max_cc = 90;
  d.req.exact_cc = 90;             // built into the sm_90a binary (bulk copies, red.add.v2, cvt e4m3x2)
  d.req.needs_arch_specific = false;  // no wgmma, no setmaxnreg
  d.req.smem_bytes = sm90::cc_smem_bytes(true, true, 6144);
  // __launch_bounds__(544, 1) allows 96: the 17 warps put 5 on one of the SM's 4 schedulers, whose quarter of
  // the register file (16,384) over 160 threads is 102, in steps of 8; sm90_cc_tactic_test checks the build.
  d.req.regs_per_thread = 96;
  d.req.threads = sm90::kCcLaunchThreads;
  d.req.k_align = sm90::kCcCols;   // FC2's K; FC1's K (the hidden size) a multiple of 1024: check_cc_tactic
  d.req.n_align = sm90::kCcCols;   // FC1's N; FC2's N (the hidden size) a multiple of 1024: check_cc_tactic
  d.req.max_rows_per_expert = 1;
  d.req.ops = {GemmOp::kFc1SwiGlu, GemmOp::kFc2};
  out.push_back(d);
}

namespace sm90 {

TacticCheck check_cc_tactic(const TacticDesc& desc, const GemmProblem& p, const DeviceCaps& caps) {
  TacticCheck c = check_tactic(desc, p, caps);
  if (!c.ok) return c;
  std::string why;
  if (!cc_layout_fits(p, &why)) return TacticCheck::fail(why);
  if (p.num_experts > kCcMaxExperts)
    return TacticCheck::fail(fmt::format("handles at most {} experts (the expert lookup reads 32 bounds a lane "
                                         "of a warp), problem has {}",
                                         kCcMaxExperts, p.num_experts));
  const bool fc1 = p.op == GemmOp::kFc1SwiGlu;
  const int64_t hidden = fc1 ? p.k : p.n, parts = (fc1 ? p.n : p.k) / kCcCols;
  if (p.total_rows * parts >= (int64_t(1) << 31))
    return TacticCheck::fail(fmt::format("launches rows x SwiGLU width / 16 CTAs, below 2^31; problem is {}",
                                         p.to_string()));
  if (!cc_hidden_fits(hidden, &why)) return TacticCheck::fail(why);
  const int64_t smem = cc_smem_bytes(true, true, hidden);
  if (smem > caps.smem_per_block_optin)
    return TacticCheck::fail(fmt::format("needs {:.1f} KB shared memory per block at hidden size {}, device allows "
                                         "{:.1f} KB",
                                         smem / 1024.0, hidden, caps.smem_per_block_optin / 1024.0));
  return c;
}

}  // namespace sm90

}  // namespace fp4moe
