// `fp4moe tune`: tunes the grouped-GEMM tactics of a layer shape (the embedded preset or --config) for
// token buckets 1..--max-bucket on this GPU and writes the tuning cache; with a valid cache entry it
// only loads it (--force retunes). Profiling runs in worker processes, so a tactic that faults is
// named, excluded and the tuning carries on. Progress goes to stderr: a bar with ETA on a terminal,
// plain lines otherwise. `--simulate PROFILE` runs the same path with modelled timings, no GPU.
//
// Exit codes: 0 tuned or loaded (a bad cache is a warning, not an error), 4 no device, 5 no tactic can
// run some (op, bucket) (every tactic is listed with its reason), 1 other failures.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "tuner_cli.h"

namespace fp4moe::cli {
namespace {

struct TuneCliOptions {
  TunerCliOptions common;
  bool force = false;
  bool no_isolate = false;
  double unit_timeout_s = 120;
  std::string simulate;
};

// Progress on stderr: a redrawn bar on a terminal, a plain line every 10% (or 10 s) otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter() : tty_(::isatty(STDERR_FILENO) == 1), t0_(std::chrono::steady_clock::now()) {}
  void operator()(const TuneProgress& p) {
    const double s = seconds();
    const double frac = p.total > 0 ? double(p.done) / double(p.total) : 0.0;
    const double eta = p.done > 0 ? s / double(p.done) * double(p.total - p.done) : 0.0;
    if (tty_) {
      const int width = 30, filled = int(frac * width);
      std::fprintf(stderr, "\r[%s%s] %3d%% %lld/%lld ETA %s  %-48.48s", std::string(size_t(filled), '#').c_str(),
                   std::string(size_t(width - filled), '.').c_str(), int(frac * 100), (long long)p.done,
                   (long long)p.total, clock(eta).c_str(), p.what.c_str());
      std::fflush(stderr);
      drawn_ = true;
    } else if (int(frac * 10) > last_decile_ || s - last_line_s_ >= 10) {
      last_decile_ = int(frac * 10);
      last_line_s_ = s;
      std::fprintf(stderr, "tune: %lld/%lld units (%d%%), elapsed %s, ETA %s: %s\n", (long long)p.done,
                   (long long)p.total, int(frac * 100), clock(s).c_str(), clock(eta).c_str(), p.what.c_str());
    }
  }
  void finish() {
    if (drawn_) std::fprintf(stderr, "\n");
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  static std::string clock(double s) {
    const long v = long(s + 0.5);
    return fmt::format("{}:{:02d}", v / 60, int(v % 60));
  }
  bool tty_;
  bool drawn_ = false;
  int last_decile_ = -1;
  double last_line_s_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

int run_tune(const TuneCliOptions& o) {
  ProgressPrinter progress;
  const std::string log_path = open_tuner_cli_log(o.common, "tune");
  const MoeConfig cfg = tuner_cli_config(o.common);
  TuneOptions opts;
  if (!o.simulate.empty()) {
    (void)device_profile(o.simulate);  // an unknown name is a usage error listing the known ones
    opts.backend = "sim";
    opts.backend_arg = o.simulate;
  } else {
    if (cuda_device_count() == 0) {
      log::error("tune", "no CUDA device found");
      throw Error(StatusCode::kUnsupported,
                  fmt::format("no CUDA device found: tuning measures kernels on a GPU. `fp4moe doctor --device-profile "
                              "NAME` shows what would run on one ({}); --simulate NAME runs the tuner with modelled "
                              "timings",
                              profile_list()));
    }
    opts.backend = "cuda";
    opts.backend_arg = std::to_string(o.common.device);
  }
  opts.max_bucket = o.common.max_bucket;
  opts.isolate = !o.no_isolate;
  opts.unit_timeout_s = o.unit_timeout_s;
  opts.rank = o.common.rank;
  opts.on_progress = [&progress](const TuneProgress& p) { progress(p); };

  const std::string cache = tuning_cache_path(o.common.cache);
  const std::vector<int64_t> buckets = tuning_buckets(opts.max_bucket);
  std::unique_ptr<TuningBackend> backend = make_tuning_backend(opts.backend, opts.backend_arg);
  const DeviceCaps caps = backend->caps();
  const TuningKey key = make_tuning_key(caps, backend->candidates());
  backend.reset();
  log::info("tune", "{}; layer {}; cache {}", caps.to_string(), cfg.to_string(), cache);

  TuningResult r;
  bool loaded = false;
  if (!o.force) loaded = load_tuning_cache(cache, key, cfg, buckets, &r);
  if (loaded) {
    r.caps = caps;
    log::info("tune", "loaded from the cache in {:.3f} s", progress.seconds());
  } else {
    const Status st = tune_layer(cfg, opts, &r);
    progress.finish();
    if (st.code() == StatusCode::kUnsupported && st.message().find("no tactic can run") != std::string::npos) {
      log::error("tune", "{}", st.message());
      std::fprintf(stderr, "fp4moe tune: error: %s\n", st.message().c_str());
      return kExitNoTactic;
    }
    st.throw_if_error();
    const Status stored = store_tuning_cache(cache, key, r);
    if (!stored.is_ok()) log::warn("tune", "the result was not cached: {}", stored.message());
  }
  const double total_s = progress.seconds();
  if (o.common.json) {
    nlohmann::json j = nlohmann::json::parse(tuning_result_json(r));
    j["cache"] = cache;
    j["log_file"] = log_path;
    j["ready_seconds"] = total_s;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_caps(r.caps);
    std::printf("layer: %s\n\n%s\n", cfg.to_string().c_str(), format_tuning_table(r).c_str());
    if (loaded)
      std::printf("loaded from cache %s (tuned in %.1f s); ready in %.3f s\n", cache.c_str(), r.seconds, total_s);
    else
      std::printf("tuned %zu buckets in %.1f s%s; cache %s\n", buckets.size(), r.seconds,
                  o.simulate.empty() ? "" : " (simulated timings, no kernels ran)", cache.c_str());
    std::printf("log: %s\n", log_path.c_str());
  }
  log::info("tune", "ready in {:.3f} s", total_s);
  return kExitOk;
}

std::function<int()> setup(CLI::App& sub) {
  auto o = std::make_shared<TuneCliOptions>();
  add_tuner_cli_options(sub, o->common);
  sub.add_flag("--force", o->force, "retune even when the cache holds a valid result");
  sub.add_option("--unit-timeout", o->unit_timeout_s, "seconds a worker may spend on one unit before it is killed")
      ->check(CLI::PositiveNumber);
  sub.add_flag("--no-isolate", o->no_isolate, "profile in this process (a faulting kernel then ends the run)");
  sub.add_option("--simulate", o->simulate,
                 "no GPU: run the tuner on a device profile with modelled timings (for testing; not measurements)");
  return [o] { return run_tune(*o); };
}

FP4MOE_COMMAND("tune", "measure the kernel tactics per token bucket on this GPU and write the tuning cache", setup);

}  // namespace
}  // namespace fp4moe::cli
