// `fp4moe doctor`: what this device (or a named device profile) can run. Prints the device's
// capabilities, then one row per tactic: the verdict of the preflight (which needs no GPU) and the
// reason for a rejection; on a live device whose tuning is cached, also the time per token bucket and
// the winner. `--device-profile NAME` answers for another GPU on any machine; `--json` for machines.
//
// Exit codes: 0 when at least one tactic can run every op at every bucket, 5 (kExitNoTactic) when some
// (op, bucket) has none, 4 (kExitUnsupported) without a device and without --device-profile.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "tuner_cli.h"

namespace fp4moe::cli {
namespace {

struct DoctorOptions {
  TunerCliOptions common;
  std::string profile;
};

// Some (op, bucket) where no tactic passes the preflight, in words; empty when every one has a tactic.
std::string uncovered(const TuningResult& r) {
  for (GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2})
    for (int64_t b : r.buckets) {
      bool any = false;
      for (const auto& t : r.tactics) {
        if (t.op != op || t.verdict != "ok") continue;
        bool skipped = false;
        for (const auto& s : t.skipped) skipped = skipped || s.first == b;
        any = any || !skipped;
      }
      if (!any) return fmt::format("no tactic can run {} at {} tokens on this device", gemm_op_name(op), b);
    }
  return "";
}

int run_doctor(const DoctorOptions& o) {
  const std::string log_path = open_tuner_cli_log(o.common, "doctor");
  DeviceCaps caps;
  const bool live = o.profile.empty();
  if (live) {
    if (cuda_device_count() == 0) {
      const std::string msg = fmt::format(
          "no CUDA device found ({}); to see what would run on another GPU use --device-profile NAME ({})",
#ifdef FP4MOE_HAVE_CUDA
          "the driver reports none",
#else
          "this build has no CUDA backend",
#endif
          profile_list());
      log::error("doctor", "{}", msg);
      if (o.common.json) std::printf("%s\n", nlohmann::json{{"device", nullptr}, {"error", msg}}.dump(2).c_str());
      else std::fprintf(stderr, "fp4moe doctor: %s\n", msg.c_str());
      return kExitUnsupported;
    }
    caps = query_device_caps(o.common.device);
  } else {
    caps = device_profile(o.profile);
  }
  const MoeConfig cfg = tuner_cli_config(o.common);
  const std::vector<int64_t> buckets = tuning_buckets(o.common.max_bucket);
  const auto& descs = all_tactic_descs();
  TuningResult r = preflight_layer(cfg, descs, caps, buckets);

  std::string timing_note;
  if (live) {
    // Timings come from the tuning cache, when `fp4moe tune` measured this device and shape.
    const std::string cache = tuning_cache_path(o.common.cache);
    TuningResult cached;
    if (load_tuning_cache(cache, make_tuning_key(caps, descs), cfg, buckets, &cached)) {
      cached.caps = caps;
      r = std::move(cached);
      timing_note = fmt::format("timings and choices from the tuning cache {}", cache);
    } else {
      timing_note = fmt::format("no tuning of this device and shape in {}; `fp4moe tune` measures it", cache);
    }
  } else {
    timing_note = fmt::format("preflight only: profile '{}' is a description, nothing was run", o.profile);
  }
  const std::string gap = uncovered(r);
  int ok = 0, rejected = 0;
  for (const auto& t : r.tactics) (t.verdict == "ok" ? ok : rejected)++;
  log::info("doctor", "{}: {} (tactic, op) pairs would run, {} would not; {}", caps.name, ok, rejected, timing_note);

  if (o.common.json) {
    nlohmann::json j = nlohmann::json::parse(tuning_result_json(r));
    j["note"] = timing_note;
    j["runnable"] = gap.empty();
    if (!gap.empty()) j["error"] = gap;
    j["log_file"] = log_path;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_caps(caps);
    std::printf("layer: %s, buckets %s\n\n", cfg.to_string().c_str(),
                fmt::format("{}", fmt::join(buckets, ",")).c_str());
    std::printf("%s\n", format_tuning_table(r).c_str());
    std::printf("%d (tactic, op) pairs would run, %d would not. %s\n", ok, rejected, timing_note.c_str());
    if (!gap.empty()) std::printf("error: %s\n", gap.c_str());
    std::printf("log: %s\n", log_path.c_str());
  }
  return gap.empty() ? kExitOk : kExitNoTactic;
}

std::function<int()> setup(CLI::App& sub) {
  auto o = std::make_shared<DoctorOptions>();
  add_tuner_cli_options(sub, o->common);
  sub.add_option("--device-profile", o->profile,
                 "answer for a named GPU instead of this machine's: h100, h200, b200, rtx-pro-6000 (sm120), l40s, a100");
  return [o] { return run_doctor(*o); };
}

FP4MOE_COMMAND("doctor", "device capabilities and which kernel tactics would run (or --device-profile NAME)", setup);

}  // namespace
}  // namespace fp4moe::cli
