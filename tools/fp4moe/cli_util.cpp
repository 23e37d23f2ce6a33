#include "cli_util.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <system_error>

#include "fp4moe/dtype.h"
#include "fp4moe/status.h"
#include "fp4moe/synthetic_hash.h"

namespace fs = std::filesystem;

namespace fp4moe::cli {

void require_existing(const std::string& path, const std::string& what, bool allow_dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw Error(StatusCode::kNotFound, fmt::format("{} '{}' does not exist", what, path));
  if (fs::is_directory(st)) {
    if (allow_dir) return;
    throw Error(StatusCode::kInvalidArgument, fmt::format("{} '{}' is a directory, expected a file", what, path));
  }
  if (!fs::is_regular_file(st))
    throw Error(StatusCode::kInvalidArgument, fmt::format("{} '{}' is not a regular file", what, path));
}

void check_output_path(const std::string& output, const std::vector<std::string>& inputs, const std::string& option) {
  std::error_code ec;
  const bool exists = fs::exists(output, ec);
  if (exists && fs::is_directory(output, ec))
    throw Error(StatusCode::kInvalidArgument, fmt::format("{} '{}' is a directory, expected a file path", option, output));
  for (const std::string& in : inputs) {
    bool same = false;
    if (exists && fs::exists(in, ec)) {
      same = fs::equivalent(output, in, ec) && !ec;
    } else {
      same = fs::weakly_canonical(output, ec) == fs::weakly_canonical(in, ec);
    }
    if (same)
      throw Error(StatusCode::kInvalidArgument,
                  fmt::format("{} '{}' is the input file '{}'; refusing to overwrite an input", option, output, in));
  }
  fs::path parent = fs::path(output).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec))
    throw Error(StatusCode::kNotFound,
                fmt::format("{} '{}': directory '{}' does not exist", option, output, parent.string()));
}

std::vector<std::string> files_in_directory(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(it->path().string());
  }
  return files;
}

uint64_t fnv1a64(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string bf16_checksum(const std::vector<uint16_t>& bf16) {
  double sum = 0.0;
  for (uint16_t b : bf16) sum += static_cast<double>(bf16_bits_to_f32(b));
  // The hash is over the little-endian bytes, as they are stored in a safetensors file.
  std::vector<uint8_t> bytes(bf16.size() * 2);
  for (size_t i = 0; i < bf16.size(); ++i) {
    bytes[2 * i] = static_cast<uint8_t>(bf16[i] & 0xff);
    bytes[2 * i + 1] = static_cast<uint8_t>(bf16[i] >> 8);
  }
  return fmt::format("{:.9g} {:016x}", sum, fnv1a64(bytes.data(), bytes.size()));
}

std::vector<uint16_t> synthetic_hidden_states(uint64_t seed, int64_t tokens, int64_t hidden) {
  // A stream distinct from the weight streams: mix the seed with a fixed tag before use.
  const uint64_t key = mix64(seed ^ 0x68696464656e5f78ull);  // "hidden_x"
  std::vector<uint16_t> x(static_cast<size_t>(tokens * hidden));
  for (size_t i = 0; i < x.size(); ++i) {
    const uint64_t r = mix64(key + i);
    // Four 16-bit uniforms in [0, 1): their sum has mean 2 and variance 4/12.
    float s = 0.0f;
    for (int j = 0; j < 4; ++j) s += static_cast<float>((r >> (16 * j)) & 0xffff) * (1.0f / 65536.0f);
    x[i] = f32_to_bf16_bits((s - 2.0f) * std::sqrt(3.0f));
  }
  return x;
}

std::vector<float> bf16_to_f32(const std::vector<uint16_t>& bf16) {
  std::vector<float> out(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) out[i] = bf16_bits_to_f32(bf16[i]);
  return out;
}

std::string one_line(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  for (size_t i = 0; i < message.size(); ++i) {
    const char c = message[i];
    if (c == '\r') continue;
    if (c == '\n') {
      if (i + 1 < message.size()) out += "; ";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace fp4moe::cli
