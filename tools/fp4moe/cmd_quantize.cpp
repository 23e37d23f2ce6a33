// `fp4moe quantize`: turns the linear weights of a bf16/f16/f32 safetensors file (or checkpoint
// directory) into ModelOpt NVFP4 tensors in one new safetensors file.
//
// Quantised: every 2-D BF16/F16/F32 tensor whose name ends in ".weight" and whose last dimension is a
// multiple of 16, except router weights ("*.mlp.gate.weight"). Each becomes
//   <stem>.weight          U8      [N, K/2]   two E2M1 codes per byte (element 2i in the low nibble)
//   <stem>.weight_scale    F8_E4M3 [N, K/16]  block scales
//   <stem>.weight_scale_2  F32     []         tensor scale
// (quantize_nvfp4 in include/fp4moe/nvfp4.h). Every other tensor is copied byte for byte, as is the
// input's metadata. The input is only read (memory-mapped); the output is written atomically.
#include <fmt/format.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "fp4moe/nvfp4.h"
#include "fp4moe/safetensors.h"
#include "fp4moe/status.h"

namespace fp4moe::cli {
namespace {

struct QuantizeOptions {
  std::string input;
  std::string output;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_float_dtype(DType t) { return t == DType::kBF16 || t == DType::kF16 || t == DType::kF32; }

bool should_quantize(const TensorInfo& t) {
  return ends_with(t.name, ".weight") && !ends_with(t.name, ".mlp.gate.weight") && is_float_dtype(t.dtype) &&
         t.shape.size() == 2 && t.shape[1] > 0 && t.shape[1] % kNvfp4BlockSize == 0;
}

int quantize_command(const QuantizeOptions& o) {
  require_existing(o.input, "--input", /*allow_dir=*/true);
  const TensorStore store(o.input);
  const std::vector<std::string> names = store.names();

  // Every file the store reads is protected from the output (a directory input has several).
  std::map<std::string, const SafetensorsFile*> files;
  for (const std::string& name : names) {
    const SafetensorsFile& f = store.file_of(name);
    files.emplace(f.path(), &f);
  }
  std::vector<std::string> protect{o.input};
  for (const auto& [path, f] : files) protect.push_back(path);
  for (const std::string& path : files_in_directory(o.input)) protect.push_back(path);  // a directory's config.json, ...
  check_output_path(o.output, protect);

  const StopWatch sw;
  SafetensorsWriter writer;
  std::map<std::string, std::string> metadata;  // the input's metadata (merged over its files)
  for (const auto& [path, f] : files) {
    for (const auto& [k, v] : f->metadata()) metadata.emplace(k, v);
  }

  int64_t quantized = 0, copied = 0;
  uint64_t in_bytes = 0, out_bytes = 0;
  std::set<std::string> produced;
  auto emit = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t bytes) {
    FP4MOE_CHECK(produced.insert(name).second, StatusCode::kFormatError,
                 "--input '{}': output tensor '{}' would be written twice (does the input already hold NVFP4 "
                 "scales for a bf16 weight?)",
                 o.input, name);
    writer.add(name, dtype, std::move(shape), data, bytes);
    out_bytes += bytes;
  };

  for (const std::string& name : names) {
    const SafetensorsFile& file = store.file_of(name);
    const TensorInfo& info = file.info(name);
    in_bytes += info.end - info.begin;
    if (!should_quantize(info)) {
      emit(name, info.dtype, info.shape, file.data(name), static_cast<size_t>(info.end - info.begin));
      ++copied;
      continue;
    }
    const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
    for (const char* suffix : {".weight_scale", ".weight_scale_2"}) {
      FP4MOE_CHECK(!store.has(stem + suffix), StatusCode::kFormatError,
                   "--input '{}': tensor '{}' is {} {} but '{}{}' already exists; is the input already quantised?",
                   o.input, name, dtype_name(info.dtype), info.shape_string(), stem, suffix);
    }
    const int64_t n = info.shape[0], k = info.shape[1];
    const std::vector<float> w = file.read_f32(name, info.shape);
    const PackedNvfp4Weights q = quantize_nvfp4(w.data(), n, k, name.c_str());
    emit(name, DType::kU8, {n, k / 2}, q.codes.data(), q.codes.size());
    emit(stem + ".weight_scale", DType::kF8E4M3, {n, k / kNvfp4BlockSize}, q.scales.data(), q.scales.size());
    const float ts = q.tensor_scale;
    emit(stem + ".weight_scale_2", DType::kF32, {}, &ts, sizeof(float));
    ++quantized;
  }
  for (const auto& [k, v] : metadata) writer.add_metadata(k, v);
  writer.write(o.output);

  fmt::print("input: {} ({} tensors, {:.1f} MB)\n", o.input, names.size(), in_bytes / 1e6);
  fmt::print("quantized: {} tensors to NVFP4 (weight U8, weight_scale F8_E4M3, weight_scale_2 F32)\n", quantized);
  fmt::print("copied: {} tensors unchanged\n", copied);
  fmt::print("output: {} ({} tensors, {:.1f} MB)\n", o.output, produced.size(), out_bytes / 1e6);
  fmt::print("time: {:.1f} ms\n", sw.elapsed_ms());
  return kExitOk;
}

std::function<int()> setup_quantize(CLI::App& sub) {
  auto o = std::make_shared<QuantizeOptions>();
  sub.add_option("--input", o->input, "a bf16/f16/f32 safetensors file or checkpoint directory")->required();
  sub.add_option("--output", o->output, "the NVFP4 safetensors file to write (never one of the inputs)")
      ->required();
  sub.footer(
      "Quantises every 2-D BF16/F16/F32 tensor named *.weight whose last dimension is a multiple of 16,\n"
      "except router weights (*.mlp.gate.weight), to ModelOpt NVFP4: .weight U8 [N, K/2],\n"
      ".weight_scale F8_E4M3 [N, K/16], .weight_scale_2 F32 []. Other tensors are copied unchanged.");
  return [o]() { return quantize_command(*o); };
}

FP4MOE_COMMAND("quantize", "Quantise a safetensors file's linear weights to ModelOpt NVFP4", setup_quantize);

}  // namespace
}  // namespace fp4moe::cli
