// The sm90 family's tactic descriptors (host data, built with or without CUDA), one per line of
// tactics.def. Requirements come from the same constexpr layout the kernel uses (tile_config.h).
#include <fmt/format.h>

#include "kernels/families.h"
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

}  // namespace fp4moe
