// Using a tuning result: the human table and JSON of `fp4moe doctor` / `tune`, the conversion into
// EngineOptions, and the cache-first entry point that `fp4moe run` / `bench` call.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "fp4moe/log.h"
#include "work.h"

namespace fp4moe {

namespace {

nlohmann::json caps_to_json(const DeviceCaps& c) {
  return {{"name", c.name},
          {"profile", c.profile},
          {"cc", fmt::format("{}.{}", c.cc_major, c.cc_minor)},
          {"arch_specific", c.arch_specific},
          {"sm_count", c.sm_count},
          {"smem_per_block_optin", c.smem_per_block_optin},
          {"smem_per_sm", c.smem_per_sm},
          {"regs_per_block", c.regs_per_block},
          {"regs_per_sm", c.regs_per_sm},
          {"max_threads_per_block", c.max_threads_per_block},
          {"cluster_launch", c.cluster_launch},
          {"l2_bytes", c.l2_bytes},
          {"global_mem_bytes", c.global_mem_bytes},
          {"driver_version", c.driver_version},
          {"runtime_version", c.runtime_version},
          {"mem_bandwidth_gbs", c.mem_bandwidth_gbs}};
}

// "1-16: a, 32-8192: b" from the per-bucket winners of one op.
std::string winner_ranges(const TuningResult& r, GemmOp op) {
  std::string s;
  std::string cur;
  int64_t first = 0, last = 0;
  auto flush = [&] {
    if (cur.empty()) return;
    s += fmt::format("{}{}: {}", s.empty() ? "" : ", ", first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last), cur);
  };
  for (int64_t b : r.buckets) {
    const std::string w = r.choice(op, b);
    if (w != cur) {
      flush();
      cur = w;
      first = b;
    }
    last = b;
  }
  flush();
  return s.empty() ? "none" : s;
}

}  // namespace

std::string format_tuning_table(const TuningResult& r) {
  std::string out;
  size_t name_w = 6;
  for (const auto& t : r.tactics) name_w = std::max(name_w, t.tactic.size());
  out += fmt::format("{:<{}}  {:<4}  {:<12}  {}\n", "tactic", name_w, "op", "verdict", "reason");
  auto same_verdict = [](const TacticReport& a, const TacticReport& b) {
    return a.tactic == b.tactic && a.verdict == b.verdict && a.reason == b.reason && a.skipped == b.skipped;
  };
  for (size_t i = 0; i < r.tactics.size(); ++i) {
    const TacticReport& t = r.tactics[i];
    // fc1 and fc2 rows with the same verdict print as one row ("both").
    const bool merged = i + 1 < r.tactics.size() && same_verdict(t, r.tactics[i + 1]);
    if (i > 0 && same_verdict(r.tactics[i - 1], t) && (i < 2 || !same_verdict(r.tactics[i - 2], r.tactics[i - 1])))
      continue;
    std::string reason = t.reason;
    if (reason.empty() && !t.skipped.empty()) {
      reason = fmt::format("skipped at tokens {}: {}", t.skipped.front().first, t.skipped.front().second);
      if (t.skipped.size() > 1) reason += fmt::format(" (and {} more buckets)", t.skipped.size() - 1);
    }
    out += fmt::format("{:<{}}  {:<4}  {:<12}  {}{}\n", t.tactic, name_w, merged ? "both" : gemm_op_name(t.op), t.verdict, reason,
                       t.is_fallback ? (reason.empty() ? "(fallback)" : " (fallback)") : "");
  }
  bool any_ms = false;
  for (const auto& t : r.tactics) any_ms = any_ms || !t.ms.empty();
  if (any_ms && !r.buckets.empty()) {
    out += "\nmilliseconds per call by tokens (* = chosen)\n";
    for (GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2}) {
      out += fmt::format("{:<{}}  {:<3}", "tactic", name_w, gemm_op_name(op));
      for (int64_t b : r.buckets) out += fmt::format(" {:>9}", b);
      out += "\n";
      for (const auto& t : r.tactics) {
        if (t.op != op || t.ms.empty()) continue;
        out += fmt::format("{:<{}}  {:<3}", t.tactic, name_w, "");
        for (int64_t b : r.buckets) {
          std::string cell = "-";
          for (const auto& [bb, ms] : t.ms)
            if (bb == b) cell = fmt::format("{:.4f}{}", ms, r.choice(op, b) == t.tactic ? "*" : " ");
          out += fmt::format(" {:>9}", cell);
        }
        out += "\n";
      }
    }
  }
  if (!r.choices.empty()) {
    out += "\nchosen:\n";
    for (GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2})
      out += fmt::format("  {}: {}\n", gemm_op_name(op), winner_ranges(r, op));
  }
  return out;
}

std::string tuning_result_json(const TuningResult& r) {
  nlohmann::json j = tuner_detail::result_body_to_json(r);
  j["device"] = caps_to_json(r.caps);
  j["model"] = r.config.to_string();
  j["from_cache"] = r.from_cache;
  return j.dump(2);
}

void apply_tuning(const TuningResult& result, EngineOptions* opts) {
  opts->fc1_by_bucket.clear();
  opts->fc2_by_bucket.clear();
  for (const auto& c : result.choices) {
    auto& list = c.op == GemmOp::kFc1SwiGlu ? opts->fc1_by_bucket : opts->fc2_by_bucket;
    list.emplace_back(c.bucket, c.tactic);
  }
  for (auto* list : {&opts->fc1_by_bucket, &opts->fc2_by_bucket})
    std::sort(list->begin(), list->end());
  for (const auto& t : result.tactics) {
    const bool failed = t.verdict == "crashed" || t.verdict == "hung" || t.verdict == "wrong-result" ||
                        t.verdict == "init-failed" || t.verdict == "failed";
    if (failed && std::find(opts->excluded_tactics.begin(), opts->excluded_tactics.end(), t.tactic) ==
                      opts->excluded_tactics.end())
      opts->excluded_tactics.push_back(t.tactic);
  }
}

Status tuned_engine_options(const MoeConfig& cfg, const TuneOptions& opts, const std::string& cache_path,
                            EngineOptions* engine_opts, TuningResult* result) {
  TuningResult r;
  Status st = status_from([&] {
    std::unique_ptr<TuningBackend> backend = make_tuning_backend(opts.backend, opts.backend_arg);
    const DeviceCaps caps = backend->caps();
    const TuningKey key = make_tuning_key(caps, backend->candidates());
    const std::vector<int64_t> buckets = opts.buckets.empty() ? tuning_buckets(opts.max_bucket) : opts.buckets;
    if (load_tuning_cache(cache_path, key, cfg, buckets, &r)) {
      r.caps = caps;
      log::info("tuner", "tuned choices for {} loaded from {}", cfg.name, cache_path);
      return;
    }
    backend.reset();
    tune_layer(cfg, opts, &r).throw_if_error();
    Status stored = store_tuning_cache(cache_path, key, r);
    if (!stored.is_ok()) log::warn("tuner", "the tuning result was not cached: {}", stored.message());
  });
  if (!st.is_ok()) return st;
  apply_tuning(r, engine_opts);
  if (result) *result = std::move(r);
  return Status::ok();
}

bool load_cached_engine_options(const MoeConfig& cfg, int device, const std::string& cache_path, int64_t max_tokens,
                                EngineOptions* engine_opts) {
  TuningResult r;
  bool hit = false;
  const Status st = status_from([&] {
    if (cuda_device_count() == 0) return;
    std::unique_ptr<TuningBackend> backend = make_cuda_tuning_backend(device);
    const TuningKey key = make_tuning_key(backend->caps(), backend->candidates());
    hit = load_tuning_cache(cache_path, key, cfg, tuning_buckets(std::max<int64_t>(max_tokens, 1)), &r);
  });
  if (!st.is_ok()) {
    log::warn("tuner", "tuned tactics not loaded: {}", st.message());
    return false;
  }
  if (!hit) return false;
  apply_tuning(r, engine_opts);
  log::info("tuner", "tuned tactics for {} loaded from {}", cfg.name, cache_path);
  return true;
}

}  // namespace fp4moe
