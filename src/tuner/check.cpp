// Tactic preflight: a tactic's declared requirements against a problem and a device, before anything
// touches the device. One rule per line; each message says what the tactic needs and what it found, in
// words with numbers (shared memory in KB with one decimal, compute capability as sm_XY).
#include <fmt/format.h>

#include <algorithm>

#include "fp4moe/tactic.h"
#include "fp4moe/tuner.h"

namespace fp4moe {

namespace {

std::string sm(int cc) { return fmt::format("sm_{}", cc); }
std::string kb(int64_t bytes) { return fmt::format("{:.1f} KB", bytes / 1024.0); }

std::string ops_list(const std::vector<GemmOp>& ops) {
  std::string s;
  for (GemmOp op : ops) s += (s.empty() ? "" : ", ") + std::string(gemm_op_name(op));
  return s.empty() ? "none" : s;
}

// Evaluates the rules in order. With stop_at_first, only the first failure is recorded.
std::vector<std::string> evaluate(const TacticDesc& d, const GemmProblem& p, const DeviceCaps& c, bool stop_at_first) {
  const TacticRequirements& r = d.req;
  std::vector<std::string> out;
  auto fail = [&](std::string why) {
    out.push_back(std::move(why));
    return stop_at_first;
  };
  const bool op_ok = std::find(r.ops.begin(), r.ops.end(), p.op) != r.ops.end();
  const int64_t regs = int64_t(r.regs_per_thread) * r.threads;

  if (!op_ok && fail(fmt::format("does not implement {} (implements: {})", gemm_op_name(p.op), ops_list(r.ops)))) return out;  // kernel variant absent
  if (c.cc() < r.min_cc && fail(fmt::format("needs {} or newer, device is {}", sm(r.min_cc), sm(c.cc())))) return out;  // instructions missing on older GPUs
  if (c.cc() > r.max_cc && fail(fmt::format("supports at most {}, device is {}", sm(r.max_cc), sm(c.cc())))) return out;  // not built/validated for newer GPUs
  if (r.exact_cc != 0 && c.cc() != r.exact_cc && fail(fmt::format("is built only for {}a, device is {}", sm(r.exact_cc), sm(c.cc())))) return out;  // 'a' binaries run on one cc only
  if (r.needs_arch_specific && !c.arch_specific && fail(fmt::format("needs arch-specific instructions (wgmma, setmaxnreg), device {} has none", sm(c.cc())))) return out;  // sm_90a/sm_100a features
  if (r.smem_bytes > c.smem_per_block_optin && fail(fmt::format("needs {} shared memory per block, device allows {}", kb(r.smem_bytes), kb(c.smem_per_block_optin)))) return out;  // cudaFuncSetAttribute would refuse
  if (r.threads > c.max_threads_per_block && fail(fmt::format("needs {} threads per block, device allows {}", r.threads, c.max_threads_per_block))) return out;  // launch would fail
  if (c.regs_per_block > 0 && regs > c.regs_per_block && fail(fmt::format("needs {} registers per thread x {} threads = {} registers per block, device allows {}", r.regs_per_thread, r.threads, regs, c.regs_per_block))) return out;  // too many resources requested for launch
  if (r.cluster > 1 && !c.cluster_launch && fail(fmt::format("needs thread-block clusters of {} CTAs, device has no cluster launch", r.cluster))) return out;  // clusters are sm_90+
  if (r.k_align > 0 && p.k % r.k_align != 0 && fail(fmt::format("needs K to be a multiple of {}, K is {}", r.k_align, p.k))) return out;  // tile/TMA alignment along the reduction
  if (r.n_align > 0 && p.n % r.n_align != 0 && fail(fmt::format("needs N to be a multiple of {}, N is {}", r.n_align, p.n))) return out;  // tile/TMA alignment of output columns
  if (r.max_rows_per_expert > 0 && p.max_rows_per_expert > r.max_rows_per_expert && fail(fmt::format("handles at most {} rows per expert, problem may have {}", r.max_rows_per_expert, p.max_rows_per_expert))) return out;  // fixed-size per-expert tiles
  return out;
}

}  // namespace

TacticCheck check_tactic(const TacticDesc& desc, const GemmProblem& problem, const DeviceCaps& caps) {
  std::vector<std::string> why = evaluate(desc, problem, caps, /*stop_at_first=*/true);
  return why.empty() ? TacticCheck::pass() : TacticCheck::fail(why.front());
}

std::vector<std::string> check_tactic_all(const TacticDesc& desc, const GemmProblem& problem, const DeviceCaps& caps) {
  return evaluate(desc, problem, caps, /*stop_at_first=*/false);
}

}  // namespace fp4moe
