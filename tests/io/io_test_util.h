// Helpers shared by the checkpoint I/O tests: a self-removing temporary directory, raw file writing,
// hand-built safetensors bytes, and an assertion that a call throws fp4moe::Error with given words.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "fp4moe/status.h"

namespace fp4moe_test {

class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/fp4moe_io_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// 8-byte little-endian length.
inline std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file assembled by hand: length prefix (the header's real length unless given), header, data.
inline std::string raw_safetensors(const std::string& header, const std::string& data, int64_t length = -1) {
  return le64(length < 0 ? header.size() : static_cast<uint64_t>(length)) + header + data;
}

// Runs f, expecting fp4moe::Error with `code` whose message contains every one of `words`.
inline void expect_error(const std::function<void()>& f, fp4moe::StatusCode code,
                         const std::vector<std::string>& words, const std::string& context = "") {
  try {
    f();
  } catch (const fp4moe::Error& e) {
    EXPECT_EQ(e.code(), code) << context << ": got " << fp4moe::status_code_name(e.code()) << ": " << e.what();
    const std::string msg = e.what();
    for (const std::string& w : words)
      EXPECT_NE(msg.find(w), std::string::npos) << context << ": message lacks '" << w << "': " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << context << ": expected fp4moe::Error, got std::exception: " << e.what();
    return;
  }
  ADD_FAILURE() << context << ": expected fp4moe::Error(" << fp4moe::status_code_name(code)
                << "), but nothing was thrown";
}

}  // namespace fp4moe_test
