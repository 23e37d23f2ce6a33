// The tuning cache: one JSON file holding entries keyed by everything that can change the binary or the
// timing (device name, compute capability, shared-memory limit, driver and CUDA runtime versions,
// fp4moe version, the hash of the tactic set) and the layer shape; each entry holds the choice per
// (op, bucket) and the report rows. Written to a temporary file and renamed over the path, so a reader
// never sees half a file. A corrupt, partial, foreign or other-version cache is reported in one line
// and ignored; it is never fatal.
//
//   {"format": "fp4moe-tuning-cache", "format_version": 1,
//    "entries": [{"key": {...}, "shape": {"experts", "hidden", "inter", "topk"}, "written", "run",
//                 "seconds", "buckets": [...], "choices": [...], "tactics": [...]}]}
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "fp4moe/log.h"
#include "work.h"

namespace fp4moe {

using nlohmann::json;

namespace {

constexpr const char* kFormat = "fp4moe-tuning-cache";
constexpr int kFormatVersion = 1;

json key_to_json(const TuningKey& k) {
  return {{"device", k.device_name}, {"cc", k.cc},           {"smem_per_block", k.smem_per_block},
          {"driver", k.driver_version}, {"runtime", k.runtime_version}, {"library", k.library_version},
          {"tactic_set", k.tactic_set}};
}

TuningKey key_from_json(const json& j) {
  TuningKey k;
  k.device_name = j.at("device").get<std::string>();
  k.cc = j.at("cc").get<int>();
  k.smem_per_block = j.at("smem_per_block").get<int64_t>();
  k.driver_version = j.at("driver").get<int>();
  k.runtime_version = j.at("runtime").get<int>();
  k.library_version = j.at("library").get<std::string>();
  k.tactic_set = j.at("tactic_set").get<std::string>();
  return k;
}

json shape_to_json(const MoeConfig& c) {
  return {{"experts", c.num_experts}, {"hidden", c.hidden}, {"inter", c.inter}, {"topk", c.topk}};
}

// Why a stored key is not ours, in words (the first difference that matters most).
std::string key_difference(const TuningKey& stored, const TuningKey& ours) {
  if (stored.device_name != ours.device_name || stored.cc != ours.cc || stored.smem_per_block != ours.smem_per_block)
    return fmt::format("was written for another device ({} sm_{} {:.1f} KB/block; this is {} sm_{} {:.1f} KB/block)",
                       stored.device_name, stored.cc, stored.smem_per_block / 1024.0, ours.device_name, ours.cc,
                       ours.smem_per_block / 1024.0);
  if (stored.library_version != ours.library_version)
    return fmt::format("was written by fp4moe {} (this is {})", stored.library_version, ours.library_version);
  if (stored.tactic_set != ours.tactic_set)
    return fmt::format("was written for another tactic set ({}; this build has {})", stored.tactic_set, ours.tactic_set);
  return fmt::format("was written with driver {} / CUDA runtime {} (this is {} / {})", stored.driver_version,
                     stored.runtime_version, ours.driver_version, ours.runtime_version);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void make_parent_dirs(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return;
  const std::string dir = path.substr(0, slash);
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') ::mkdir(dir.substr(0, i).c_str(), 0755);
}

// 0: read; ENOENT: absent; other errno: unreadable.
int read_text(const std::string& path, std::string* text) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  text->clear();
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return e;
    }
    if (n == 0) break;
    text->append(buf, size_t(n));
  }
  ::close(fd);
  return 0;
}

// Adds to *r what an older entry of the same key and shape has for buckets that r did not tune.
void merge_older(const json& older_entry, TuningResult* r) {
  TuningResult old;
  try {
    tuner_detail::result_body_from_json(older_entry, &old);
  } catch (const std::exception&) {
    return;  // unreadable: the new result replaces it
  }
  auto has_bucket = [&](int64_t b) { return std::find(r->buckets.begin(), r->buckets.end(), b) != r->buckets.end(); };
  std::vector<int64_t> added;
  for (int64_t b : old.buckets)
    if (!has_bucket(b)) added.push_back(b);
  if (added.empty()) return;
  auto is_added = [&](int64_t b) { return std::find(added.begin(), added.end(), b) != added.end(); };
  for (const auto& c : old.choices)
    if (is_added(c.bucket)) r->choices.push_back(c);
  for (auto& row : r->tactics)
    for (const auto& o : old.tactics)
      if (o.tactic == row.tactic && o.op == row.op)
        for (const auto& [b, ms] : o.ms)
          if (is_added(b)) row.ms.emplace_back(b, ms);
  r->buckets.insert(r->buckets.end(), added.begin(), added.end());
  std::sort(r->buckets.begin(), r->buckets.end());
  std::sort(r->choices.begin(), r->choices.end(), [](const BucketChoice& a, const BucketChoice& b) {
    return a.op != b.op ? a.op < b.op : a.bucket < b.bucket;
  });
  for (auto& row : r->tactics) std::sort(row.ms.begin(), row.ms.end());
}

}  // namespace

namespace tuner_detail {

json result_body_to_json(const TuningResult& r) {
  json j;
  j["buckets"] = r.buckets;
  j["seconds"] = r.seconds;
  j["choices"] = json::array();
  for (const auto& c : r.choices)
    j["choices"].push_back(
        {{"op", gemm_op_name(c.op)}, {"bucket", c.bucket}, {"tactic", c.tactic}, {"ms", c.ms}, {"verified", c.verified}});
  j["tactics"] = json::array();
  for (const auto& t : r.tactics) {
    json row = {{"tactic", t.tactic}, {"op", gemm_op_name(t.op)}, {"fallback", t.is_fallback},
                {"verdict", t.verdict}, {"reason", t.reason}};
    row["ms"] = json::array();
    for (const auto& [b, ms] : t.ms) row["ms"].push_back({b, ms});
    row["skipped"] = json::array();
    for (const auto& [b, why] : t.skipped) row["skipped"].push_back({b, why});
    j["tactics"].push_back(row);
  }
  return j;
}

void result_body_from_json(const json& j, TuningResult* r) {
  auto op_of = [](const json& v) {
    GemmOp op;
    FP4MOE_CHECK(gemm_op_from_name(v.get<std::string>(), &op), StatusCode::kFormatError, "unknown op '{}'",
                 v.get<std::string>());
    return op;
  };
  r->buckets = j.at("buckets").get<std::vector<int64_t>>();
  r->seconds = j.at("seconds").get<double>();
  r->choices.clear();
  for (const auto& c : j.at("choices")) {
    BucketChoice b;
    b.op = op_of(c.at("op"));
    b.bucket = c.at("bucket").get<int64_t>();
    b.tactic = c.at("tactic").get<std::string>();
    b.ms = c.at("ms").get<double>();
    b.verified = c.at("verified").get<bool>();
    FP4MOE_CHECK(!b.tactic.empty(), StatusCode::kFormatError, "empty tactic name for {} tokens={}",
                 gemm_op_name(b.op), b.bucket);
    r->choices.push_back(b);
  }
  r->tactics.clear();
  for (const auto& t : j.at("tactics")) {
    TacticReport row;
    row.tactic = t.at("tactic").get<std::string>();
    row.op = op_of(t.at("op"));
    row.is_fallback = t.at("fallback").get<bool>();
    row.verdict = t.at("verdict").get<std::string>();
    row.reason = t.at("reason").get<std::string>();
    for (const auto& m : t.at("ms")) row.ms.emplace_back(m.at(0).get<int64_t>(), m.at(1).get<double>());
    for (const auto& s : t.at("skipped")) row.skipped.emplace_back(s.at(0).get<int64_t>(), s.at(1).get<std::string>());
    r->tactics.push_back(std::move(row));
  }
}

}  // namespace tuner_detail

std::string TuningKey::to_string() const {
  return fmt::format("{} sm_{} smem={} driver={} runtime={} fp4moe={} tactics={}", device_name, cc, smem_per_block,
                     driver_version, runtime_version, library_version, tactic_set);
}

bool TuningKey::operator==(const TuningKey& o) const {
  return device_name == o.device_name && cc == o.cc && smem_per_block == o.smem_per_block &&
         driver_version == o.driver_version && runtime_version == o.runtime_version &&
         library_version == o.library_version && tactic_set == o.tactic_set;
}

std::string hash_tactic_descs(const std::vector<TacticDesc>& descs) {
  // FNV-1a (64-bit) over a canonical text of every descriptor: a change to any name or requirement
  // changes the key, with no version to bump by hand.
  uint64_t h = 1469598103934665603ull;
  auto feed = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;
    h *= 1099511628211ull;
  };
  for (const auto& d : descs) {
    const TacticRequirements& q = d.req;
    feed(fmt::format("{}|{}|{}x{}x{}|s{}|{}|l{}|f{}", d.name, d.family, d.tile_m, d.tile_n, d.tile_k, d.stages,
                     d.schedule, int(d.layout), d.is_fallback));
    feed(fmt::format("cc{}-{}|a{}|x{}|smem{}|r{}|t{}|c{}|k{}|n{}|m{}", q.min_cc, q.max_cc, q.needs_arch_specific,
                     q.exact_cc, q.smem_bytes, q.regs_per_thread, q.threads, q.cluster, q.k_align, q.n_align,
                     q.max_rows_per_expert));
    for (GemmOp op : q.ops) feed(gemm_op_name(op));
  }
  return fmt::format("{:016x}", h);
}

TuningKey make_tuning_key(const DeviceCaps& caps, const std::vector<TacticDesc>& descs) {
  TuningKey k;
  k.device_name = caps.name;
  k.cc = caps.cc();
  k.smem_per_block = caps.smem_per_block_optin;
  k.driver_version = caps.driver_version;
  k.runtime_version = caps.runtime_version;
  k.library_version = FP4MOE_VERSION;
  k.tactic_set = hash_tactic_descs(descs);
  return k;
}

std::string default_tuning_cache_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/fp4moe/tuning.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/fp4moe/tuning.json";
  return "/tmp/fp4moe/tuning.json";
}

std::string tuning_cache_path(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* e = std::getenv("FP4MOE_CACHE"); e && *e) return e;
  return default_tuning_cache_path();
}

bool load_tuning_cache(const std::string& path, const TuningKey& key, const MoeConfig& cfg,
                       const std::vector<int64_t>& buckets, TuningResult* out, std::string* warning) {
  std::string warn;
  auto ignore = [&](const std::string& why) {
    warn = fmt::format("tuning cache {} {}; ignoring it and retuning", path, why);
    log::warn("tuner", "{}", warn);
    if (warning) *warning = warn;
    return false;
  };
  if (warning) warning->clear();
  std::string text;
  const int err = read_text(path, &text);
  if (err == ENOENT) return false;
  if (err != 0) return ignore(fmt::format("cannot be read ({})", std::strerror(err)));
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return ignore(fmt::format("is corrupt or truncated (not valid JSON, {} bytes)", text.size()));
  if (!doc.is_object() || doc.value("format", std::string()) != kFormat) return ignore("is not an fp4moe tuning cache");
  if (doc.value("format_version", 0) != kFormatVersion)
    return ignore(fmt::format("has format version {} (this build reads {})", doc.value("format_version", 0), kFormatVersion));
  const json want_shape = shape_to_json(cfg);
  std::string mismatch;
  bool mismatch_same_device = false;
  try {
    for (const auto& e : doc.at("entries")) {
      if (e.at("shape") != want_shape) continue;
      const TuningKey stored = key_from_json(e.at("key"));
      if (!(stored == key)) {
        // An entry of this very device explains more (another version) than one of another device.
        const bool same_device = stored.device_name == key.device_name && stored.cc == key.cc &&
                                 stored.smem_per_block == key.smem_per_block;
        if (mismatch.empty() || (same_device && !mismatch_same_device)) mismatch = key_difference(stored, key);
        mismatch_same_device = mismatch_same_device || same_device;
        continue;
      }
      TuningResult r;
      tuner_detail::result_body_from_json(e, &r);
      for (GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2})
        for (int64_t b : buckets)
          if (r.choice(op, b).empty())
            return ignore(fmt::format("is partial: it has no choice for {} at {} tokens", gemm_op_name(op), b));
      // Keep only the requested buckets' choices.
      std::vector<BucketChoice> kept;
      for (const auto& c : r.choices)
        if (std::find(buckets.begin(), buckets.end(), c.bucket) != buckets.end()) kept.push_back(c);
      r.choices = std::move(kept);
      r.buckets = buckets;
      r.config = cfg;
      r.from_cache = true;
      *out = std::move(r);
      return true;
    }
  } catch (const std::exception& e) {
    return ignore(fmt::format("is malformed ({})", e.what()));
  }
  if (!mismatch.empty()) return ignore(mismatch);
  return false;
}

Status store_tuning_cache(const std::string& path, const TuningKey& key, const TuningResult& result) {
  return status_from([&] {
    json doc = {{"format", kFormat}, {"format_version", kFormatVersion}, {"entries", json::array()}};
    TuningResult merged = result;
    std::string text;
    if (read_text(path, &text) == 0) {
      const json old = json::parse(text, nullptr, false);
      // Entries of other shapes and devices survive; anything unreadable is replaced.
      if (!old.is_discarded() && old.is_object() && old.value("format", std::string()) == kFormat &&
          old.value("format_version", 0) == kFormatVersion && old.contains("entries") && old["entries"].is_array()) {
        for (const auto& e : old["entries"]) {
          if (!e.is_object() || !e.contains("key") || !e.contains("shape")) continue;
          // The same device and shape under an older key (version, driver, tactic set) is superseded.
          const json& k = e["key"];
          const bool same_device = k.is_object() && k.value("device", std::string()) == key.device_name &&
                                   k.value("cc", 0) == key.cc && k.value("smem_per_block", int64_t(0)) == key.smem_per_block;
          if (e["shape"] == shape_to_json(result.config) && same_device) {
            if (e["key"] == key_to_json(key)) merge_older(e, &merged);  // keeps buckets tuned by an earlier run
            continue;
          }
          doc["entries"].push_back(e);
        }
      }
    }
    json entry = tuner_detail::result_body_to_json(merged);
    entry["key"] = key_to_json(key);
    entry["shape"] = shape_to_json(result.config);
    entry["model"] = result.config.name;
    entry["written"] = utc_now();
    entry["run"] = log::run_id();
    doc["entries"].push_back(entry);
    const std::string body = doc.dump(1) + "\n";

    make_parent_dirs(path);
    const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), log::run_id());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    FP4MOE_CHECK(fd >= 0, StatusCode::kIoError, "cannot create {}: {}", tmp, std::strerror(errno));
    size_t done = 0;
    bool ok = true;
    while (ok && done < body.size()) {
      const ssize_t n = ::write(fd, body.data() + done, body.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) done += size_t(n);
    }
    const int write_errno = errno;
    ok = ok && ::fsync(fd) == 0;
    ::close(fd);
    if (!ok) {
      ::unlink(tmp.c_str());
      throw Error(StatusCode::kIoError, fmt::format("cannot write {}: {}", tmp, std::strerror(write_errno)));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      throw Error(StatusCode::kIoError, fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(e)));
    }
    log::info("tuner", "tuning cache written: {}", path);
  });
}

}  // namespace fp4moe
