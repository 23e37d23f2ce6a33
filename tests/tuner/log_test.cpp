// Log lines carry a UTC timestamp and the run id; a log file is always new, never an old run's.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "fp4moe/log.h"
#include "fp4moe/status.h"

namespace fp4moe {
namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/fp4moe-log-test-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One test holds the process-wide log state from start to end (the file, the rank).
TEST(Log, LinesFilesAndRunId) {
  const std::string dir = temp_dir();
  log::set_stderr(false);
  const std::string id = log::run_id();
  EXPECT_EQ(id, log::run_id()) << "one run id per process";
  EXPECT_TRUE(std::regex_match(id, std::regex(R"(\d{8}T\d{6}-[0-9a-f]{4})"))) << id;

  // An explicit path: created, written, and refused the second time.
  const std::string path = dir + "/sub/run.log";
  EXPECT_EQ(log::open_file(path), path);
  EXPECT_EQ(log::file_path(), path);
  log::info("test", "hello {}", 42);
  log::set_rank(3);
  log::error("tuner", "tactic {} failed: {}", "x.y", "cause");
  log::set_rank(-1);
  log::debug("test", "dropped at the default level");
  const std::string text = slurp(path);
  const std::regex line(R"((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) run=(\S+)( rank=\d+)? ([DIWE]) (\w+): (.*))");
  std::istringstream lines(text);
  std::string l;
  int n = 0;
  while (std::getline(lines, l)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line)) << l;
    EXPECT_EQ(m[2].str(), id);
    ++n;
  }
  EXPECT_EQ(n, 2) << text;
  EXPECT_NE(text.find(" run=" + id + " I test: hello 42"), std::string::npos) << text;
  EXPECT_NE(text.find(" rank=3 E tuner: tactic x.y failed: cause"), std::string::npos) << text;
  try {
    log::open_file(path);
    FAIL() << "an existing log file was reused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kIoError);
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(path), text) << "the old file was touched";

  // The default path: under FP4MOE_LOG_DIR, named after the run id, and a second open in the same run
  // still gets a file of its own.
  ::setenv("FP4MOE_LOG_DIR", (dir + "/logs").c_str(), 1);
  const std::string a = log::open_file();
  const std::string b = log::open_file();
  ::unsetenv("FP4MOE_LOG_DIR");
  EXPECT_EQ(a, dir + "/logs/fp4moe-" + id + ".log");
  EXPECT_NE(a, b);
  struct stat st;
  EXPECT_EQ(::stat(a.c_str(), &st), 0);
  EXPECT_EQ(::stat(b.c_str(), &st), 0);
  log::info("test", "into b");
  EXPECT_EQ(slurp(a), "");
  EXPECT_NE(slurp(b).find("into b"), std::string::npos);
  log::set_stderr(true);
}

}  // namespace
}  // namespace fp4moe
