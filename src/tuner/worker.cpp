// Isolated execution of tuning work: the parent re-executes its own binary (/proc/self/exe) as a worker,
// which re-creates the tuning backend and runs the units, telling the parent over a socket what it starts
// and what came out (JSON lines). A kernel that kills the worker (signal, abort, sticky CUDA error) or
// hangs it can only cost that worker: the parent names the unit that was running, excludes its tactic
// and starts a fresh worker for the rest.
//
// Protocol (one JSON object per line):
//   parent -> child  {"backend": name, "arg": str, "rank": r, "units": [{kind, tactic, problem, tokens}]}
//   child -> parent  {"start": i}  before unit i
//                    {"done": i, "ok": b, "code": c, "message": m, "ms": t, "sticky": b}  after it
//                    {"fatal": m}  the backend could not be created (the child then exits 2)
//                    {"finished": true}  all units done
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include "fp4moe/log.h"
#include "work.h"

extern char** environ;

namespace fp4moe::tuner_detail {

namespace {

constexpr const char* kWorkerFlag = "--fp4moe-tuner-worker";

bool send_line(int fd, const nlohmann::json& j) {
  const std::string s = j.dump() + "\n";
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

// Reads one line (blocking); false on EOF/error.
bool read_line_blocking(int fd, std::string* line) {
  line->clear();
  char c;
  while (true) {
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
}

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return fmt::format("killed by signal {} (SIG{}, {})", sig, name ? name : "?", strsignal(sig));
  }
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  return fmt::format("ended with wait status {}", status);
}

nlohmann::json unit_to_json(const WorkUnit& u) {
  return {{"kind", unit_kind_name(u.kind)}, {"tactic", u.tactic}, {"problem", problem_to_json(u.problem)},
          {"tokens", u.tokens}};
}

WorkUnit unit_from_json(const nlohmann::json& j) {
  WorkUnit u;
  const std::string kind = j.at("kind").get<std::string>();
  u.kind = kind == "init" ? UnitKind::kInit : kind == "verify" ? UnitKind::kVerify : UnitKind::kTime;
  u.tactic = j.at("tactic").get<std::string>();
  u.problem = problem_from_json(j.at("problem"));
  u.tokens = j.at("tokens").get<int64_t>();
  return u;
}

// The child's side.
int worker_main(int fd) {
  std::string line;
  if (!read_line_blocking(fd, &line)) return 2;
  std::unique_ptr<TuningBackend> backend;
  std::vector<WorkUnit> units;
  try {
    const auto job = nlohmann::json::parse(line);
    if (job.value("rank", -1) >= 0) log::set_rank(job.value("rank", -1));
    for (const auto& u : job.at("units")) units.push_back(unit_from_json(u));
    backend = make_tuning_backend(job.at("backend").get<std::string>(), job.at("arg").get<std::string>());
  } catch (const std::exception& e) {
    send_line(fd, {{"fatal", e.what()}});
    return 2;
  }
  std::vector<std::string> inited;
  for (size_t i = 0; i < units.size(); ++i) {
    if (!send_line(fd, {{"start", i}})) return 2;  // the parent is gone
    const UnitOutcome o = execute_unit(*backend, units[i], inited);
    const bool sticky = !backend->healthy();
    if (!send_line(fd, {{"done", i}, {"ok", o.status.is_ok()}, {"code", int(o.status.code())},
                        {"message", o.status.message()}, {"ms", o.ms}, {"sticky", sticky}}))
      return 2;
    if (sticky) return 3;  // this process can run no more kernels: a fresh worker carries on
  }
  send_line(fd, {{"finished", true}});
  return 0;
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
};

// Starts /proc/self/exe as a worker; the socket end it gets is passed by number.
Status spawn_worker(Child* child) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return Status(StatusCode::kIoError, fmt::format("socketpair for the tuner worker failed: {}", std::strerror(errno)));
  // Everything the child needs is built before fork: after it only async-signal-safe calls happen.
  const std::string fd_arg = std::to_string(sv[1]);
  std::string exe = "/proc/self/exe";
  std::vector<char*> argv = {exe.data(), const_cast<char*>(kWorkerFlag), const_cast<char*>(fd_arg.c_str()), nullptr};
  const std::string run_env = "FP4MOE_RUN_ID=" + log::run_id();
  std::vector<char*> envp;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "FP4MOE_RUN_ID=", 14) != 0) envp.push_back(*e);
  envp.push_back(const_cast<char*>(run_env.c_str()));
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    return Status(StatusCode::kIoError, fmt::format("fork for the tuner worker failed: {}", std::strerror(e)));
  }
  if (pid == 0) {
    ::fcntl(sv[1], F_SETFD, 0);  // keep this end across exec
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(sv[1]);
  child->pid = pid;
  child->fd = sv[0];
  return Status::ok();
}

struct ChildEnd {
  bool finished = false;   // reported {"finished"}
  bool sticky = false;     // the last done unit left a sticky error
  bool hung = false;       // killed by us after the timeout
  std::string fatal;       // {"fatal"} message
  std::string wait_desc;   // how the process ended
  int64_t current = -1;    // unit started and not done (index into the job)
};

// Reads the child's messages until it ends; fills outcomes of the job's units.
ChildEnd supervise(Child& child, const std::vector<size_t>& job, const std::vector<WorkUnit>& units,
                   double timeout_s, const UnitCallback& on_start, std::vector<UnitOutcome>& outcomes) {
  ChildEnd end;
  std::string buf;
  auto last = std::chrono::steady_clock::now();
  bool eof = false;
  while (!eof) {
    pollfd p{child.fd, POLLIN, 0};
    const int r = ::poll(&p, 1, 200);
    if (r < 0 && errno != EINTR) break;
    if (r > 0) {
      char tmp[4096];
      const ssize_t n = ::read(child.fd, tmp, sizeof(tmp));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        eof = true;
      } else {
        buf.append(tmp, size_t(n));
        last = std::chrono::steady_clock::now();
      }
    }
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      const std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      nlohmann::json m = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (m.is_discarded() || !m.is_object()) continue;
      if (m.contains("start")) {
        end.current = m["start"].get<int64_t>();
        if (end.current >= 0 && size_t(end.current) < job.size() && on_start) on_start(units[job[end.current]]);
      } else if (m.contains("done")) {
        const int64_t i = m["done"].get<int64_t>();
        if (i < 0 || size_t(i) >= job.size()) continue;
        UnitOutcome& o = outcomes[job[i]];
        o.ran = true;
        o.ms = m.value("ms", 0.0);
        o.status = m.value("ok", false) ? Status::ok()
                                        : Status(StatusCode(m.value("code", int(StatusCode::kInternal))),
                                                 m.value("message", std::string("unknown error")));
        if (m.value("sticky", false)) {
          end.sticky = true;
          o.died = true;
          o.verdict = "crashed";
          o.cause = fmt::format("the worker lost its CUDA context (sticky error) while running {}: {}",
                                units[job[i]].describe(), o.status.message());
        }
        end.current = -1;
      } else if (m.contains("fatal")) {
        end.fatal = m["fatal"].get<std::string>();
      } else if (m.contains("finished")) {
        end.finished = true;
      }
    }
    const double quiet = std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
    if (!eof && quiet > timeout_s) {
      ::kill(child.pid, SIGKILL);
      end.hung = true;
      break;
    }
  }
  ::close(child.fd);
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  end.wait_desc = describe_wait_status(status);
  if (end.hung) end.wait_desc = fmt::format("made no progress for {:.0f} s and was killed", timeout_s);
  return end;
}

Status run_isolated(const std::vector<WorkUnit>& units, const TuneOptions& opts, const UnitCallback& on_start,
                    std::vector<UnitOutcome>& outcomes) {
  std::vector<std::string> dead;  // tactics whose worker died
  int silent_deaths = 0;
  while (true) {
    std::vector<size_t> job;
    for (size_t i = 0; i < units.size(); ++i) {
      if (outcomes[i].ran || outcomes[i].died || !outcomes[i].cause.empty()) continue;
      if (std::find(dead.begin(), dead.end(), units[i].tactic) != dead.end()) {
        outcomes[i].cause = fmt::format("skipped: tactic {} crashed earlier", units[i].tactic);
        continue;
      }
      job.push_back(i);
    }
    if (job.empty()) return Status::ok();
    nlohmann::json msg = {{"backend", opts.backend}, {"arg", opts.backend_arg}, {"rank", opts.rank}};
    msg["units"] = nlohmann::json::array();
    for (size_t i : job) msg["units"].push_back(unit_to_json(units[i]));
    Child child;
    Status st = spawn_worker(&child);
    if (!st.is_ok()) return st;
    log::debug("tuner", "worker pid {} started for {} units", child.pid, job.size());
    if (!send_line(child.fd, msg)) log::warn("tuner", "could not send the job to worker pid {}", child.pid);
    const ChildEnd end = supervise(child, job, units, opts.unit_timeout_s, on_start, outcomes);
    if (!end.fatal.empty())
      return Status(StatusCode::kUnsupported, fmt::format("the tuner worker could not start: {}", end.fatal));
    if (end.finished) continue;  // picks up nothing, returns ok
    if (end.current >= 0) {
      UnitOutcome& o = outcomes[job[size_t(end.current)]];
      const WorkUnit& u = units[job[size_t(end.current)]];
      o.died = true;
      o.verdict = end.hung ? "hung" : "crashed";
      o.cause = fmt::format("the worker process {} while running {}", end.wait_desc, u.describe());
      dead.push_back(u.tactic);
      log::error("tuner", "tactic {} ({}): worker pid {} {} during {}; excluding the tactic and continuing", u.tactic,
                 gemm_op_name(u.problem.op), child.pid, end.wait_desc, unit_kind_name(u.kind));
    } else if (end.sticky) {
      for (size_t i : job)
        if (outcomes[i].died && std::find(dead.begin(), dead.end(), units[i].tactic) == dead.end()) {
          dead.push_back(units[i].tactic);
          log::error("tuner", "tactic {} ({}): {}; excluding the tactic and continuing", units[i].tactic,
                     gemm_op_name(units[i].problem.op), outcomes[i].cause);
        }
    } else if (++silent_deaths >= 2) {
      return Status(StatusCode::kInternal,
                    fmt::format("the tuner worker {} outside any unit of work, twice; giving up (does this "
                                "program's main() call fp4moe::tuner_worker_main_if_requested first?)",
                                end.wait_desc));
    }
  }
}

}  // namespace

Status run_units(const std::vector<WorkUnit>& units, const TuneOptions& opts, TuningBackend* backend,
                 const UnitCallback& on_start, std::vector<UnitOutcome>* outcomes) {
  outcomes->assign(units.size(), UnitOutcome{});
  if (opts.isolate) return run_isolated(units, opts, on_start, *outcomes);
  FP4MOE_CHECK(backend != nullptr, StatusCode::kInternal, "run_units: no backend for in-process tuning");
  std::vector<std::string> inited;
  for (size_t i = 0; i < units.size(); ++i) {
    if (!backend->healthy()) {
      (*outcomes)[i].cause = "skipped: this process lost its CUDA context earlier";
      continue;
    }
    if (on_start) on_start(units[i]);
    (*outcomes)[i] = execute_unit(*backend, units[i], inited);
    if (!backend->healthy()) {
      (*outcomes)[i].died = true;
      (*outcomes)[i].verdict = "crashed";
      (*outcomes)[i].cause = fmt::format("lost the CUDA context (sticky error): {}", (*outcomes)[i].status.message());
    }
  }
  return Status::ok();
}

}  // namespace fp4moe::tuner_detail

namespace fp4moe {

bool tuner_worker_main_if_requested(int argc, char** argv, int* exit_code) {
  if (argc < 3 || std::strcmp(argv[1], tuner_detail::kWorkerFlag) != 0) return false;
  char* endp = nullptr;
  const long fd = std::strtol(argv[2], &endp, 10);
  if (!endp || *endp != '\0' || fd < 0) {
    *exit_code = 2;
    return true;
  }
  *exit_code = tuner_detail::worker_main(int(fd));
  return true;
}

}  // namespace fp4moe
