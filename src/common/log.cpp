// Logging: one line per message, "<UTC time with ms> run=<run id> [rank=<r>] <level> <component>: <text>",
// to stderr and (once open_file is called) to a per-run file that is always newly created.
#include "fp4moe/log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>

#include "fp4moe/status.h"

namespace fp4moe::log {

namespace {

Level level_from_env() {
  const char* v = std::getenv("FP4MOE_LOG_LEVEL");
  if (!v) return Level::kInfo;
  const std::string s(v);
  if (s == "debug") return Level::kDebug;
  if (s == "warn" || s == "warning") return Level::kWarn;
  if (s == "error") return Level::kError;
  return Level::kInfo;
}

struct State {
  std::mutex mu;
  Level level = level_from_env();
  int rank = -1;
  bool to_stderr = true;
  int fd = -1;
  std::string path;
};

State& state() {
  static State* s = new State();  // never destroyed: logging from static destructors stays safe
  return *s;
}

char level_letter(Level l) {
  switch (l) {
    case Level::kDebug: return 'D';
    case Level::kInfo: return 'I';
    case Level::kWarn: return 'W';
    case Level::kError: return 'E';
  }
  return '?';
}

std::string utc_timestamp() {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t secs = system_clock::to_time_t(now);
  const int ms = int(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, ms);
}

std::string make_run_id() {
  const std::time_t secs = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%S", &tm);
  std::random_device rd;
  const unsigned r = rd() ^ unsigned(::getpid()) * 2654435761u;
  return fmt::format("{}-{:04x}", buf, r & 0xffffu);
}

// mkdir -p; errors other than "exists" are reported by the open that follows.
void make_dirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') ::mkdir(dir.substr(0, i).c_str(), 0755);
  }
}

std::string default_dir() {
  if (const char* d = std::getenv("FP4MOE_LOG_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/fp4moe/logs";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/fp4moe/logs";
  return "/tmp/fp4moe/logs";
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk must not take the program down with it
    done += size_t(n);
  }
}

}  // namespace

// FP4MOE_RUN_ID lets a launcher give all its processes one id (the tuner's worker child, the ranks of
// one job); it is used only when it is a short plain token.
std::string run_id_from_env() {
  const char* v = std::getenv("FP4MOE_RUN_ID");
  if (!v || !*v || std::strlen(v) > 64) return "";
  for (const char* c = v; *c; ++c)
    if (!(std::isalnum(static_cast<unsigned char>(*c)) || *c == '-' || *c == '_' || *c == '.')) return "";
  return v;
}

const std::string& run_id() {
  static const std::string id = [] {
    std::string env = run_id_from_env();
    return env.empty() ? make_run_id() : env;
  }();
  return id;
}

void set_rank(int rank) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().rank = rank;
}

void set_level(Level min_level) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().level = min_level;
}

void set_stderr(bool enabled) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().to_stderr = enabled;
}

std::string open_file(const std::string& path) {
  std::string target = path;
  int fd = -1;
  // O_EXCL: an existing file (an older run's log, or a name chosen twice) is never appended to or reused.
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  if (target.empty()) {
    const std::string dir = default_dir();
    make_dirs(dir);
    // A shared run id (FP4MOE_RUN_ID, several ranks) gives the same name: later openers take a suffix.
    for (int i = 0; i < 1000; ++i) {
      target = dir + "/fp4moe-" + run_id() + (i ? fmt::format(".{}", i) : "") + ".log";
      fd = ::open(target.c_str(), kFlags, 0644);
      if (fd >= 0 || errno != EEXIST) break;
    }
  } else {
    if (auto slash = target.rfind('/'); slash != std::string::npos && slash > 0) make_dirs(target.substr(0, slash));
    fd = ::open(target.c_str(), kFlags, 0644);
  }
  if (fd < 0) {
    const int e = errno;
    throw Error(StatusCode::kIoError,
                e == EEXIST ? fmt::format("log file {} already exists; a run never reuses an old log, choose a new path",
                                          target)
                            : fmt::format("cannot create log file {}: {}", target, std::strerror(e)));
  }
  std::lock_guard<std::mutex> lock(state().mu);
  if (state().fd >= 0) ::close(state().fd);
  state().fd = fd;
  state().path = target;
  return target;
}

const std::string& file_path() { return state().path; }

void write(Level level, const std::string& component, const std::string& message) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (level < s.level) return;
  std::string line = utc_timestamp() + " run=" + run_id();
  if (s.rank >= 0) line += fmt::format(" rank={}", s.rank);
  line += fmt::format(" {} {}: {}\n", level_letter(level), component, message);
  if (s.to_stderr) write_all(STDERR_FILENO, line);
  if (s.fd >= 0) write_all(s.fd, line);
}

}  // namespace fp4moe::log
