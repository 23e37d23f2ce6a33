// Logging: every line carries a UTC timestamp, the run id and (when set) the rank, e.g.
//   2026-11-30T14:03:07.123Z run=20261130T140307-3f9a rank=0 W tuner: tactic sm90.x init failed: ...
// A run id is made once per process (time + random); the per-run log file is always a new file.
#pragma once
#include <fmt/format.h>

#include <string>

namespace fp4moe::log {

enum class Level { kDebug = 0, kInfo, kWarn, kError };

const std::string& run_id();
void set_rank(int rank);            // -1 (default): no rank field
void set_level(Level min_level);    // lines below are dropped (default kInfo; FP4MOE_LOG_LEVEL=debug|info|warn|error)
void set_stderr(bool enabled);      // echo to stderr (default true)
// Opens a new log file for this run. An empty path picks "<dir>/fp4moe-<run_id>.log" under
// $FP4MOE_LOG_DIR or the user's cache directory. Refuses an existing path (never appends to or reuses
// an old run's log). Returns the path opened; throws fp4moe::Error on failure.
std::string open_file(const std::string& path = "");
const std::string& file_path();     // empty when no file is open

void write(Level level, const std::string& component, const std::string& message);

template <typename... Args>
void info(const std::string& component, fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kInfo, component, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(const std::string& component, fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kWarn, component, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(const std::string& component, fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, component, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(const std::string& component, fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kDebug, component, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace fp4moe::log
