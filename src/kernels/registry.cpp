// The tactic registry (include/fp4moe/tactic.h): every family's descriptors (portable first, it holds
// the fallback), the runnable tactics by stable name (built once, thread-safe), the tactic-set hash for
// cache keys, and the weight-layout conversions.
#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/weight_layout.h"
#include "fp4moe/tactic.h"
#include "kernels/families.h"

#ifdef FP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda_check.h"
#endif

namespace fp4moe {

const char* gemm_op_name(GemmOp op) {
  switch (op) {
    case GemmOp::kFc1SwiGlu: return "fc1";
    case GemmOp::kFc2: return "fc2";
  }
  return "unknown-op";
}

const char* weight_layout_name(WeightLayout l) {
  switch (l) {
    case WeightLayout::kCanonical: return "canonical";
    case WeightLayout::kSm90Interleaved: return "sm90-interleaved";
    case WeightLayout::kSm90E4m3: return "sm90-e4m3";
    case WeightLayout::kSm90Cc: return "sm90-cc";
  }
  return "unknown-layout";
}

std::string GemmProblem::to_string() const {
  return fmt::format("{} E={} n={} k={} rows={}", gemm_op_name(op), num_experts, n, k, total_rows);
}

const std::vector<TacticDesc>& all_tactic_descs() {
  static const std::vector<TacticDesc> descs = [] {
    std::vector<TacticDesc> v;
    append_portable_tactic_descs(v);
#ifdef FP4MOE_HAVE_SM90_FAMILY
    append_sm90_tactic_descs(v);
    append_sm90_cc_tactic_descs(v);
#endif
    return v;
  }();
  return descs;
}

std::string tactic_set_hash() {
  // FNV-1a 64 over every field that changes what a tactic is or where it may run.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
    h ^= 0xff;  // field separator
    h *= 0x100000001b3ull;
  };
  for (const TacticDesc& d : all_tactic_descs()) {
    const TacticRequirements& r = d.req;
    mix(d.name);
    mix(d.family);
    mix(fmt::format("{} {} {} {} {} {} {} {}", d.tile_m, d.tile_n, d.tile_k, d.stages, d.ctas_per_sm, d.schedule,
                    static_cast<int>(d.layout), d.is_fallback));
    std::string ops;
    for (GemmOp op : r.ops) ops += gemm_op_name(op);
    mix(fmt::format("{} {} {} {} {} {} {} {} {} {} {} {}", r.min_cc, r.max_cc, r.needs_arch_specific, r.exact_cc,
                    r.smem_bytes, r.regs_per_thread, r.threads, r.cluster, r.k_align, r.n_align,
                    r.max_rows_per_expert, ops));
  }
  return fmt::format("{:016x}", h);
}

#ifdef FP4MOE_HAVE_CUDA

namespace {

struct TacticTable {
  std::vector<std::unique_ptr<GroupedGemmTactic>> owned;
  std::map<std::string, GroupedGemmTactic*> by_name;
};

const TacticTable& tactic_table() {
  static const TacticTable table = [] {
    TacticTable t;
    append_portable_tactics(t.owned);
#ifdef FP4MOE_HAVE_SM90_FAMILY
    append_sm90_tactics(t.owned);
    append_sm90_cc_tactics(t.owned);
#endif
    for (auto& p : t.owned) t.by_name.emplace(p->desc().name, p.get());
    return t;
  }();  // C++11 guarantees a thread-safe one-time initialisation
  return table;
}

size_t canonical_bytes(const GemmProblem& p) { return static_cast<size_t>(canonical_weight_bytes(p)); }

// Canonical -> canonical: a device-to-device copy on the stream.
Status canonical_pack(const GemmProblem& p, const void* canonical, void* dst, Stream stream) {
  if (!canonical || !dst)
    return Status(StatusCode::kInvalidArgument, fmt::format("canonical weight pack ({}): null pointer", p.to_string()));
  FP4MOE_CUDA_RETURN(cudaMemcpyAsync(dst, canonical, canonical_bytes(p), cudaMemcpyDeviceToDevice, stream));
  return Status::ok();
}

const WeightLayoutOps kCanonicalOps{WeightLayout::kCanonical, &canonical_bytes, &canonical_pack};

}  // namespace

GroupedGemmTactic* find_tactic(const std::string& name) {
  const TacticTable& t = tactic_table();
  auto it = t.by_name.find(name);
  return it == t.by_name.end() ? nullptr : it->second;
}

const WeightLayoutOps* find_weight_layout_ops(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::kCanonical: return &kCanonicalOps;
    case WeightLayout::kSm90Interleaved:
    case WeightLayout::kSm90E4m3:
#ifdef FP4MOE_HAVE_SM90_FAMILY
      return sm90_weight_layout_ops(layout);
#else
      return nullptr;
#endif
    case WeightLayout::kSm90Cc:
#ifdef FP4MOE_HAVE_SM90_FAMILY
      return sm90_cc_weight_layout_ops();
#else
      return nullptr;
#endif
  }
  return nullptr;
}

#else  // no CUDA: descriptors only

GroupedGemmTactic* find_tactic(const std::string&) { return nullptr; }
const WeightLayoutOps* find_weight_layout_ops(WeightLayout) { return nullptr; }

#endif

}  // namespace fp4moe
