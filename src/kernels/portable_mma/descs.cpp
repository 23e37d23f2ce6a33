// Host-only descriptors of the portable tactics, generated from tactics.def (always built, so the tuner
// preflight and `fp4moe doctor --device-profile X` work without CUDA).
#include <fmt/format.h>

#include "kernels/families.h"
#include "kernels/portable_mma/portable_family.h"
#include "kernels/portable_mma/tile_config.h"

namespace fp4moe {
namespace portable {

namespace {

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES>
TacticDesc make_desc(int regs, bool fallback) {
  using Cfg = TileConfig<BM, BN, WARPS_M, WARPS_N, STAGES, /*BF16W=*/false>;
  TacticDesc d;
  d.name = fmt::format("portable.mma.m{}n{}k{}.s{}", BM, BN, kBlockK, STAGES);
  d.family = "portable";
  d.tile_m = BM;
  d.tile_n = BN;
  d.tile_k = kBlockK;
  d.stages = STAGES;
  d.schedule = "grid";
  d.layout = WeightLayout::kCanonical;
  d.is_fallback = fallback;
  d.req.min_cc = 80;  // mma.sync bf16 and cp.async
  d.req.smem_bytes = Cfg::kSmemBytes;
  d.req.regs_per_thread = regs;
  d.req.threads = Cfg::kThreads;
  d.req.k_align = 16;  // one NVFP4 block; partial 64-element stages are zero-filled
  d.req.n_align = 1;   // columns past N are masked
  return d;
}

}  // namespace

const std::vector<TacticDesc>& portable_descs() {
  static const std::vector<TacticDesc> descs = [] {
    std::vector<TacticDesc> v;
#define FP4MOE_PORTABLE_TACTIC(BM, BN, WM, WN, S, REGS) v.push_back(make_desc<BM, BN, WM, WN, S>(REGS, v.empty()));
#include "kernels/portable_mma/tactics.def"
#undef FP4MOE_PORTABLE_TACTIC
    return v;
  }();
  return descs;
}

}  // namespace portable

void append_portable_tactic_descs(std::vector<TacticDesc>& out) {
  const auto& d = portable::portable_descs();
  out.insert(out.end(), d.begin(), d.end());
}

}  // namespace fp4moe
