// The start-up tuning procedure for one MoE layer (FC1 and FC2):
//   1. preflight every candidate against the device caps at every bucket (no device work);
//   2. initialise the survivors and time them per token bucket (isolated in a worker by default);
//   3. per (op, bucket) pick the fastest; verify each winner against the fallback on a small case, and
//      on a mismatch exclude it and pick again;
//   4. when some (op, bucket) has nothing at all, fail with every tactic's reason.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "fp4moe/log.h"
#include "work.h"

namespace fp4moe {

using tuner_detail::UnitKind;
using tuner_detail::UnitOutcome;
using tuner_detail::WorkUnit;

std::vector<int64_t> tuning_buckets(int64_t max_bucket) {
  // Powers of two up to the first one >= max_bucket: the engine serves T tokens with the smallest
  // bucket >= T, so the last bucket must cover max_bucket.
  std::vector<int64_t> b;
  for (int64_t t = 1; max_bucket >= 1; t *= 2) {
    b.push_back(t);
    if (t >= max_bucket) break;
  }
  return b;
}

GemmProblem fc1_problem(const MoeConfig& cfg, int64_t tokens) {
  GemmProblem p;
  p.op = GemmOp::kFc1SwiGlu;
  p.num_experts = cfg.num_experts;
  p.n = cfg.inter;
  p.k = cfg.hidden;
  p.total_rows = tokens * cfg.topk;
  p.max_rows_per_expert = tokens;  // a token picks an expert at most once
  return p;
}

GemmProblem fc2_problem(const MoeConfig& cfg, int64_t tokens) {
  GemmProblem p = fc1_problem(cfg, tokens);
  p.op = GemmOp::kFc2;
  p.n = cfg.hidden;
  p.k = cfg.inter;
  return p;
}

std::string TuningResult::choice(GemmOp op, int64_t bucket) const {
  for (const auto& c : choices)
    if (c.op == op && c.bucket == bucket) return c.tactic;
  return "";
}

namespace {

GemmProblem problem_for(GemmOp op, const MoeConfig& cfg, int64_t tokens) {
  return op == GemmOp::kFc1SwiGlu ? fc1_problem(cfg, tokens) : fc2_problem(cfg, tokens);
}

constexpr GemmOp kOps[] = {GemmOp::kFc1SwiGlu, GemmOp::kFc2};

TacticReport* find_report(TuningResult& r, const std::string& tactic, GemmOp op) {
  for (auto& t : r.tactics)
    if (t.tactic == tactic && t.op == op) return &t;
  return nullptr;
}

bool usable(const TacticReport& t) { return t.verdict == "ok"; }

// Marks a tactic failed for one op (or every op when the worker died with it).
void mark(TuningResult& r, const std::string& tactic, GemmOp op, bool all_ops, const std::string& verdict,
          const std::string& reason) {
  for (auto& t : r.tactics) {
    if (t.tactic != tactic || (!all_ops && t.op != op) || !usable(t)) continue;
    t.verdict = verdict;
    t.reason = reason;
  }
}

std::string list_all_reasons(const TuningResult& r, GemmOp op) {
  std::string s;
  for (const auto& t : r.tactics) {
    if (t.op != op) continue;
    s += fmt::format("\n  {}: {}{}", t.tactic, t.verdict, t.reason.empty() ? "" : " - " + t.reason);
    for (const auto& [bucket, why] : t.skipped) s += fmt::format("\n    tokens={}: {}", bucket, why);
  }
  return s.empty() ? "\n  (no tactics at all)" : s;
}

}  // namespace

TuningResult preflight_layer(const MoeConfig& cfg, const std::vector<TacticDesc>& descs, const DeviceCaps& caps,
                             const std::vector<int64_t>& buckets) {
  TuningResult r;
  r.caps = caps;
  r.config = cfg;
  r.buckets = buckets;
  for (const auto& d : descs) {
    for (GemmOp op : kOps) {
      TacticReport t;
      t.tactic = d.name;
      t.op = op;
      t.is_fallback = d.is_fallback;
      for (int64_t b : buckets) {
        std::vector<std::string> why = check_tactic_all(d, problem_for(op, cfg, b), caps);
        if (!why.empty()) t.skipped.emplace_back(b, fmt::format("{}", fmt::join(why, "; ")));
      }
      if (!buckets.empty() && t.skipped.size() == buckets.size()) {
        // Rejected everywhere: the reasons of the largest bucket (they include any per-bucket limit).
        t.verdict = "rejected";
        t.reason = t.skipped.back().second;
        t.skipped.clear();
      }
      r.tactics.push_back(std::move(t));
    }
  }
  return r;
}

Status tune_layer(const MoeConfig& cfg, const TuneOptions& opts, TuningResult* out) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opts.rank >= 0) log::set_rank(opts.rank);
  return status_from([&] {
    cfg.validate("tuned layer");
    std::vector<int64_t> buckets = opts.buckets.empty() ? tuning_buckets(opts.max_bucket) : opts.buckets;
    FP4MOE_CHECK(!buckets.empty() && buckets.front() >= 1, StatusCode::kInvalidArgument,
                 "tuning needs at least one positive token bucket (max bucket {})", opts.max_bucket);
    std::unique_ptr<TuningBackend> backend = make_tuning_backend(opts.backend, opts.backend_arg);
    const DeviceCaps caps = backend->caps();
    std::vector<TacticDesc> descs = backend->candidates();
    log::info("tuner", "tuning {} on {}; {} candidate tactics, {} buckets ({}..{})", cfg.to_string(), caps.to_string(),
              descs.size(), buckets.size(), buckets.front(), buckets.back());

    TuningResult r = preflight_layer(cfg, descs, caps, buckets);
    for (auto& t : r.tactics) {
      if (std::find(opts.excluded.begin(), opts.excluded.end(), t.tactic) != opts.excluded.end()) {
        t.verdict = "excluded";
        t.reason = "excluded by the caller";
      } else if (t.verdict == "rejected") {
        log::info("tuner", "preflight: {} ({}) rejected: {}", t.tactic, gemm_op_name(t.op), t.reason);
      }
    }
    std::string fallback;
    for (const auto& d : descs)
      if (d.is_fallback && fallback.empty()) fallback = d.name;
    if (fallback.empty()) log::warn("tuner", "no fallback tactic among the candidates; winners cannot be verified");

    // Work: per surviving (tactic, op), init at its largest bucket, then time each bucket.
    std::vector<WorkUnit> units;
    for (const auto& t : r.tactics) {
      if (!usable(t)) continue;
      std::vector<int64_t> ok_buckets;
      for (int64_t b : buckets) {
        bool skip = false;
        for (const auto& s : t.skipped) skip = skip || s.first == b;
        if (!skip) ok_buckets.push_back(b);
      }
      units.push_back({UnitKind::kInit, t.tactic, problem_for(t.op, cfg, ok_buckets.back()), ok_buckets.back()});
      for (int64_t b : ok_buckets) units.push_back({UnitKind::kTime, t.tactic, problem_for(t.op, cfg, b), b});
    }
    // Units are grouped by tactic so that a crash loses only that tactic's remaining work.
    std::stable_sort(units.begin(), units.end(), [](const WorkUnit& a, const WorkUnit& b) { return a.tactic < b.tactic; });

    TuneProgress progress;
    progress.total = int64_t(units.size());
    auto on_start = [&](const WorkUnit& u) {
      progress.what = u.describe();
      if (opts.on_progress) opts.on_progress(progress);
      ++progress.done;
    };
    auto record = [&](const std::vector<WorkUnit>& us, const std::vector<UnitOutcome>& os) {
      for (size_t i = 0; i < us.size(); ++i) {
        const WorkUnit& u = us[i];
        const UnitOutcome& o = os[i];
        TacticReport* t = find_report(r, u.tactic, u.problem.op);
        if (!t || !usable(*t)) continue;
        if (o.died) {
          mark(r, u.tactic, u.problem.op, /*all_ops=*/true, o.verdict, o.cause);
        } else if (!o.ran) {
          if (!o.cause.empty()) log::debug("tuner", "{}: {}", u.describe(), o.cause);
        } else if (!o.status.is_ok()) {
          const std::string verdict = u.kind == UnitKind::kInit     ? "init-failed"
                                      : u.kind == UnitKind::kVerify ? "wrong-result"
                                                                    : "failed";
          mark(r, u.tactic, u.problem.op, false, verdict, o.status.message());
          log::warn("tuner", "tactic {} ({}) {}: {}", u.tactic, gemm_op_name(u.problem.op), verdict,
                    o.status.message());
        } else if (u.kind == UnitKind::kTime) {
          t->ms.emplace_back(u.tokens, o.ms);
        }
      }
    };
    std::vector<UnitOutcome> outcomes;
    run_units(units, opts, opts.isolate ? nullptr : backend.get(), on_start, &outcomes).throw_if_error();
    record(units, outcomes);

    // Choose and verify until every winner is verified (each round excludes at least one tactic or ends).
    std::vector<std::string> verified;
    for (int round = 0;; ++round) {
      r.choices.clear();
      std::vector<WorkUnit> verify_units;
      for (GemmOp op : kOps) {
        TacticReport* fb = fallback.empty() ? nullptr : find_report(r, fallback, op);
        const bool fallback_ok = fb && usable(*fb);
        for (int64_t b : buckets) {
          BucketChoice c;
          c.op = op;
          c.bucket = b;
          c.ms = std::numeric_limits<double>::infinity();
          for (const auto& t : r.tactics) {
            if (t.op != op || !usable(t)) continue;
            for (const auto& [bb, ms] : t.ms)
              if (bb == b && ms < c.ms) {
                c.ms = ms;
                c.tactic = t.tactic;
              }
          }
          if (c.tactic.empty()) {
            throw Error(StatusCode::kUnsupported,
                        fmt::format("no tactic can run {} on {} ({}); every tactic and why:{}",
                                    problem_for(op, cfg, b).to_string(), caps.name, caps.profile,
                                    list_all_reasons(r, op)));
          }
          const std::string key = c.tactic + "/" + gemm_op_name(op);
          c.verified = c.tactic == fallback || std::find(verified.begin(), verified.end(), key) != verified.end();
          if (!c.verified && !fallback_ok) {
            log::warn("tuner", "{} ({}) wins tokens={} but the fallback cannot run here, so it is not verified",
                      c.tactic, gemm_op_name(op), b);
          } else if (!c.verified) {
            bool queued = false;
            for (const auto& v : verify_units) queued = queued || (v.tactic == c.tactic && v.problem.op == op);
            if (!queued) verify_units.push_back({UnitKind::kVerify, c.tactic, problem_for(op, cfg, buckets.front()), buckets.front()});
          }
          r.choices.push_back(c);
        }
      }
      if (verify_units.empty()) break;
      progress.total += int64_t(verify_units.size());
      run_units(verify_units, opts, opts.isolate ? nullptr : backend.get(), on_start, &outcomes).throw_if_error();
      record(verify_units, outcomes);
      for (size_t i = 0; i < verify_units.size(); ++i)
        if (outcomes[i].ran && outcomes[i].status.is_ok() && !outcomes[i].died)
          verified.push_back(verify_units[i].tactic + "/" + gemm_op_name(verify_units[i].problem.op));
      FP4MOE_CHECK(round < 1000, StatusCode::kInternal, "tuner: verification did not settle");
    }
    for (const auto& c : r.choices)
      log::debug("tuner", "choice {} tokens={}: {} ({:.4f} ms)", gemm_op_name(c.op), c.bucket, c.tactic, c.ms);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log::info("tuner", "tuning finished in {:.2f} s", r.seconds);
    *out = std::move(r);
  });
}

}  // namespace fp4moe
