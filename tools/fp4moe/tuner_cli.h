// Options and helpers shared by `fp4moe tune` and `fp4moe doctor` (header-only: the CLI's CMake builds
// the cmd_*.cpp files plus a fixed list of helpers).
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "cli_util.h"
#include "fp4moe/config.h"
#include "fp4moe/log.h"
#include "fp4moe/tuner.h"

namespace fp4moe::cli {

struct TunerCliOptions {
  std::string preset = "glm5";
  std::string config_path;
  int64_t max_bucket = 8192;
  std::string cache;      // empty: $FP4MOE_CACHE or the default under the user's cache directory
  std::string log_file;   // empty: a new file per run under $FP4MOE_LOG_DIR or the user's cache directory
  bool json = false;
  int device = 0;
  int rank = -1;
};

inline void add_tuner_cli_options(CLI::App& sub, TunerCliOptions& o) {
  sub.add_option("--preset", o.preset, "embedded model shape: glm5 (default), deepseek-v3, qwen3-235b, mixtral-8x7b");
  sub.add_option("--config", o.config_path, "Hugging Face config.json whose MoE shape to use (instead of --preset)");
  sub.add_option("--max-bucket", o.max_bucket, "largest token bucket (buckets: powers of two up to it, default 8192)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  sub.add_option("--cache", o.cache,
                 "tuning cache file (default: $FP4MOE_CACHE, else $XDG_CACHE_HOME/fp4moe/tuning.json or "
                 "~/.cache/fp4moe/tuning.json)");
  sub.add_option("--log-file", o.log_file,
                 "log file, created new (never an existing file); default: a new file per run under "
                 "$FP4MOE_LOG_DIR or ~/.cache/fp4moe/logs");
  sub.add_flag("--json", o.json, "machine-readable output on stdout");
  sub.add_option("--device", o.device, "CUDA device index (default 0)")->check(CLI::NonNegativeNumber);
  sub.add_option("--rank", o.rank, "rank to show in log lines (distributed launches)")->check(CLI::NonNegativeNumber);
}

inline MoeConfig tuner_cli_config(const TunerCliOptions& o) {
  MoeConfig cfg;
  if (!o.config_path.empty()) {
    require_existing(o.config_path, "--config file");
    cfg = read_hf_config(o.config_path);
  } else {
    cfg = moe_preset(o.preset);
  }
  cfg.validate(o.config_path.empty() ? "preset " + o.preset : o.config_path);
  return cfg;
}

// Opens this run's log file and says where it is (stderr, so that --json output stays clean).
inline std::string open_tuner_cli_log(const TunerCliOptions& o, const char* command) {
  if (o.rank >= 0) log::set_rank(o.rank);
  const std::string path = log::open_file(o.log_file);
  log::info(command, "fp4moe {} {} (run {})", command, FP4MOE_VERSION, log::run_id());
  return path;
}

inline std::string profile_list() {
  std::string s;
  for (const auto& n : device_profile_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

inline void print_caps(const DeviceCaps& c) {
  std::printf("device: %s (%s)\n", c.name.c_str(), c.profile.c_str());
  std::printf("  compute capability %d.%d%s, %d SMs\n", c.cc_major, c.cc_minor,
              c.arch_specific ? " (arch-specific features: yes)" : "", c.sm_count);
  std::printf("  shared memory: %.1f KB per block (opt-in), %.1f KB per SM\n", c.smem_per_block_optin / 1024.0,
              c.smem_per_sm / 1024.0);
  std::printf("  registers: %d per block, %d per SM; %d threads per block; clusters: %s\n", c.regs_per_block,
              c.regs_per_sm, c.max_threads_per_block, c.cluster_launch ? "yes" : "no");
  std::printf("  L2 %.0f MiB, memory %.1f GiB, %.0f GB/s", c.l2_bytes / 1048576.0, c.global_mem_bytes / 1073741824.0,
              c.mem_bandwidth_gbs);
  if (c.driver_version) std::printf(", driver %d, CUDA runtime %d", c.driver_version, c.runtime_version);
  std::printf("\n");
}

}  // namespace fp4moe::cli
