// Small helpers shared by the fp4moe commands: input checks, output-path protection, checksums,
// deterministic synthetic inputs and a wall-clock timer.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe::cli {

// Throws Error(kNotFound) "<what> '<path>' does not exist" unless `path` is an existing regular file
// (or, with allow_dir, a directory).
void require_existing(const std::string& path, const std::string& what, bool allow_dir = false);

// Refuses to write `output` when it is the same file as any of `inputs` (compared by identity, so
// symlinks and different spellings of one path are caught) and checks that its directory exists.
// Throws Error(kInvalidArgument) naming `option` (e.g. "--output") and the input it would overwrite.
void check_output_path(const std::string& output, const std::vector<std::string>& inputs,
                       const std::string& option = "--output");

// The regular files directly inside `dir` (its checkpoint files: *.safetensors, config.json, ...).
std::vector<std::string> files_in_directory(const std::string& dir);

// FNV-1a 64-bit hash of a byte range.
uint64_t fnv1a64(const void* data, size_t bytes);

// "<sum of the values as double> <fnv1a-64 of the bf16 bytes, 16 hex digits>".
std::string bf16_checksum(const std::vector<uint16_t>& bf16);

// Hidden states [tokens, hidden] as bf16 bits: normal-like values with unit variance (a sum of four
// uniforms, rescaled) from a counter-based generator, so the same seed always gives the same bytes.
std::vector<uint16_t> synthetic_hidden_states(uint64_t seed, int64_t tokens, int64_t hidden);

// Converts bf16 bits to fp32 values.
std::vector<float> bf16_to_f32(const std::vector<uint16_t>& bf16);

// Replaces line breaks with "; " so that an error message prints as one line.
std::string one_line(const std::string& message);

class StopWatch {
 public:
  StopWatch() : start_(std::chrono::steady_clock::now()) {}
  double elapsed_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fp4moe::cli
