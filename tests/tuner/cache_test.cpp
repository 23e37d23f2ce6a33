// The tuning cache: round trip, atomic write, and every kind of bad cache (corrupt, truncated, partial,
// another device profile, another fp4moe version, another tactic set): one warning, a retune, no failure.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>

#include "tuner_util.h"

namespace fp4moe::testing {
namespace {

struct CacheFixture : ::testing::Test {
  std::string dir = make_temp_dir();
  std::string path = dir + "/cache/tuning.json";
  MoeConfig cfg = fake_layer();
  TuneOptions opts = fake_options("profile=h200", /*isolate=*/false);

  TuningKey key_for(const std::string& spec) {
    FakeBackend b(spec);
    return make_tuning_key(b.caps(), b.candidates());
  }
  TuningResult tuned() {
    TuningResult r;
    EXPECT_TRUE(tune_layer(cfg, opts, &r).is_ok());
    return r;
  }
  int count_warnings(const std::string& log_text) {
    int n = 0;
    for (size_t p = 0; (p = log_text.find("W tuner: tuning cache", p)) != std::string::npos; ++p) ++n;
    return n;
  }
  // tuned_engine_options over whatever is at `path` now: it must succeed, warn `warnings` times and
  // leave a cache that the next call hits.
  void expect_retune_with_one_warning(const std::string& expected_words) {
    const std::string log_path = log::open_file(dir + "/retune-" + std::to_string(++runs) + ".log");
    EngineOptions eo;
    TuningResult r;
    const Status st = tuned_engine_options(cfg, opts, path, &eo, &r);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_FALSE(r.from_cache);
    EXPECT_EQ(eo.fc1_by_bucket.size(), r.buckets.size());
    const std::string text = read_file(log_path);
    EXPECT_EQ(count_warnings(text), 1) << text;
    EXPECT_NE(text.find(expected_words), std::string::npos) << text;
    // The rewritten cache is hit next time, silently.
    TuningResult again;
    std::string warning;
    EXPECT_TRUE(load_tuning_cache(path, key_for(opts.backend_arg), cfg, r.buckets, &again, &warning));
    EXPECT_EQ(warning, "");
    EXPECT_TRUE(again.from_cache);
  }
  int runs = 0;
  void SetUp() override { log::set_stderr(false); }
};

TEST_F(CacheFixture, RoundTripAndAtomicWrite) {
  const TuningResult r = tuned();
  const TuningKey key = key_for("profile=h200");
  ASSERT_TRUE(store_tuning_cache(path, key, r).is_ok());
  // A second shape and a second device are kept next to the first.
  MoeConfig other = cfg;
  other.hidden = 512;
  TuningResult r2 = r;
  r2.config = other;
  ASSERT_TRUE(store_tuning_cache(path, key, r2).is_ok());
  ASSERT_TRUE(store_tuning_cache(path, key_for("profile=b200"), r).is_ok());
  ASSERT_TRUE(store_tuning_cache(path, key, r).is_ok());  // replaces, does not duplicate
  const auto doc = nlohmann::json::parse(read_file(path));
  EXPECT_EQ(doc["entries"].size(), 3u);
  // No temporary files are left behind.
  DIR* d = ::opendir((dir + "/cache").c_str());
  ASSERT_NE(d, nullptr);
  int files = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++files;
  ::closedir(d);
  EXPECT_EQ(files, 1);

  TuningResult loaded;
  std::string warning;
  ASSERT_TRUE(load_tuning_cache(path, key, cfg, r.buckets, &loaded, &warning)) << warning;
  EXPECT_TRUE(loaded.from_cache);
  EXPECT_EQ(warning, "");
  ASSERT_EQ(loaded.choices.size(), r.choices.size());
  for (size_t i = 0; i < r.choices.size(); ++i) {
    EXPECT_EQ(loaded.choices[i].tactic, r.choices[i].tactic);
    EXPECT_EQ(loaded.choices[i].bucket, r.choices[i].bucket);
    EXPECT_DOUBLE_EQ(loaded.choices[i].ms, r.choices[i].ms);
  }
  ASSERT_EQ(loaded.tactics.size(), r.tactics.size());
  EXPECT_EQ(loaded.tactics[0].ms, r.tactics[0].ms);
  // A subset of the buckets is served; a bucket never tuned is a partial cache.
  EXPECT_TRUE(load_tuning_cache(path, key, cfg, {1, 64}, &loaded, &warning));
  EXPECT_EQ(loaded.choices.size(), 4u);
  EXPECT_FALSE(load_tuning_cache(path, key, cfg, {1, 512}, &loaded, &warning));
  EXPECT_NE(warning.find("is partial: it has no choice for fc1 at 512 tokens"), std::string::npos) << warning;
  // A later run that tuned fewer buckets keeps the earlier run's other buckets.
  TuneOptions small = opts;
  small.max_bucket = 4;
  TuningResult r4;
  ASSERT_TRUE(tune_layer(cfg, small, &r4).is_ok());
  ASSERT_EQ(r4.buckets.size(), 3u);
  ASSERT_TRUE(store_tuning_cache(path, key, r4).is_ok());
  EXPECT_TRUE(load_tuning_cache(path, key, cfg, r.buckets, &loaded, &warning)) << warning;
  EXPECT_EQ(loaded.choices.size(), r.choices.size());
  EXPECT_EQ(nlohmann::json::parse(read_file(path))["entries"].size(), 3u);
  // Missing file: a plain miss, no warning.
  EXPECT_FALSE(load_tuning_cache(dir + "/none.json", key, cfg, r.buckets, &loaded, &warning));
  EXPECT_EQ(warning, "");
}

TEST_F(CacheFixture, LocationFlagEnvironmentDefault) {
  EXPECT_EQ(tuning_cache_path("/x/flag.json"), "/x/flag.json");
  ::setenv("FP4MOE_CACHE", "/x/env.json", 1);
  EXPECT_EQ(tuning_cache_path(""), "/x/env.json");
  EXPECT_EQ(tuning_cache_path("/x/flag.json"), "/x/flag.json");
  ::unsetenv("FP4MOE_CACHE");
  ::setenv("XDG_CACHE_HOME", "/x/xdg", 1);
  EXPECT_EQ(tuning_cache_path(""), "/x/xdg/fp4moe/tuning.json");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/x/home", 1);
  EXPECT_EQ(tuning_cache_path(""), "/x/home/.cache/fp4moe/tuning.json");
}

TEST_F(CacheFixture, CorruptCache) {
  ::mkdir((dir + "/cache").c_str(), 0755);
  write_file(path, "\x01\x02 this is not json {{{");
  expect_retune_with_one_warning("is corrupt or truncated");
}

TEST_F(CacheFixture, TruncatedCache) {
  ASSERT_TRUE(store_tuning_cache(path, key_for("profile=h200"), tuned()).is_ok());
  const std::string full = read_file(path);
  write_file(path, full.substr(0, full.size() / 2));
  expect_retune_with_one_warning("is corrupt or truncated");
}

TEST_F(CacheFixture, MalformedEntry) {
  ASSERT_TRUE(store_tuning_cache(path, key_for("profile=h200"), tuned()).is_ok());
  auto doc = nlohmann::json::parse(read_file(path));
  doc["entries"][0]["choices"][0].erase("tactic");
  write_file(path, doc.dump());
  expect_retune_with_one_warning("is malformed");
}

TEST_F(CacheFixture, CacheFromAnotherDeviceProfile) {
  // Tuned for a B200, now on an H200.
  TuneOptions b200 = opts;
  b200.backend_arg = "profile=b200";
  TuningResult r;
  ASSERT_TRUE(tune_layer(cfg, b200, &r).is_ok());
  ASSERT_TRUE(store_tuning_cache(path, key_for("profile=b200"), r).is_ok());
  expect_retune_with_one_warning("was written for another device (NVIDIA B200 sm_100");
}

TEST_F(CacheFixture, CacheFromAnotherVersion) {
  TuningKey old = key_for("profile=h200");
  old.library_version = "0.0.1";
  ASSERT_TRUE(store_tuning_cache(path, old, tuned()).is_ok());
  expect_retune_with_one_warning("was written by fp4moe 0.0.1 (this is " FP4MOE_VERSION ")");
  // The superseded entry of the same device and shape is gone.
  EXPECT_EQ(nlohmann::json::parse(read_file(path))["entries"].size(), 1u);
}

TEST_F(CacheFixture, CacheFromAnotherTacticSet) {
  TuningKey old = key_for("profile=h200");
  old.tactic_set = "0123456789abcdef";
  ASSERT_TRUE(store_tuning_cache(path, old, tuned()).is_ok());
  expect_retune_with_one_warning("was written for another tactic set");
  // And the key changes when a requirement changes.
  FakeBackend b("profile=h200");
  auto descs = b.candidates();
  const std::string h = hash_tactic_descs(descs);
  descs[0].req.smem_bytes += 16;
  EXPECT_NE(hash_tactic_descs(descs), h);
}

TEST_F(CacheFixture, OtherFormatVersionAndForeignJson) {
  ::mkdir((dir + "/cache").c_str(), 0755);
  write_file(path, R"({"format": "fp4moe-tuning-cache", "format_version": 99, "entries": []})");
  expect_retune_with_one_warning("has format version 99");
  write_file(path, R"({"some": "other tool's file"})");
  expect_retune_with_one_warning("is not an fp4moe tuning cache");
}

}  // namespace
}  // namespace fp4moe::testing
