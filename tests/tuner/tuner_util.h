// Helpers shared by the tuner tests.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>

#include "fake_backend.h"
#include <nlohmann/json.hpp>

#include "fp4moe/log.h"

namespace fp4moe::testing {

inline std::string make_temp_dir() {
  char tmpl[] = "/tmp/fp4moe-tuner-test-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d ? d : "/tmp";
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

inline TuneOptions fake_options(const std::string& spec, bool isolate) {
  TuneOptions o;
  o.backend = "fake";
  o.backend_arg = spec;
  o.max_bucket = 256;
  o.isolate = isolate;
  return o;
}

inline const TacticReport* report_of(const TuningResult& r, const std::string& tactic, GemmOp op) {
  for (const auto& t : r.tactics)
    if (t.tactic == tactic && t.op == op) return &t;
  return nullptr;
}

// Every (op, bucket) has a choice and none of them is `banned`.
inline void expect_choices_avoid(const TuningResult& r, const std::string& banned, const std::string& expected) {
  ASSERT_EQ(r.choices.size(), 2 * r.buckets.size());
  for (const auto& c : r.choices) {
    EXPECT_NE(c.tactic, banned);
    EXPECT_EQ(c.tactic, expected) << gemm_op_name(c.op) << " tokens=" << c.bucket;
    EXPECT_TRUE(c.verified);
  }
}

// Opens a fresh log file for this test and returns its path.
inline std::string open_test_log(const std::string& dir) {
  log::set_stderr(false);
  return log::open_file(dir + "/test.log");
}

}  // namespace fp4moe::testing
