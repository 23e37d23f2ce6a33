// st_tool: a small driver over the safetensors reader and writer, for the interoperability check
// (check_interop.py) against the official `safetensors` Python package.
//
//   st_tool dump FILE   prints JSON: {"metadata": {..}, "tensors": [{"name", "dtype", "shape",
//                       "fnv1a64" (hex, of the raw bytes), "hex" (raw bytes), "values" (decoded, as
//                       strings: floats with 17 significant digits, exact; "nan"/"inf" spelled out)}]}
//   st_tool write FILE  writes the fixed tensor set below (every dtype, a scalar, a zero-size tensor)
//                       and two metadata entries.
// Exit status: 0 ok, 1 an fp4moe::Error (message on stderr), 2 usage.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fp4moe/nvfp4.h"
#include "fp4moe/safetensors.h"
#include "fp4moe/status.h"

using namespace fp4moe;

namespace {

uint64_t fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// 17 significant digits: the decimal parses back to exactly this value (every float is a double).
std::string exact(float v) { return fmt::format("{:.17g}", static_cast<double>(v)); }

std::string value_string(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kBF16: return exact(bf16_bits_to_f32(load<uint16_t>(p)));
    case DType::kF16: return exact(f16_bits_to_f32(load<uint16_t>(p)));
    case DType::kF32: return exact(load<float>(p));
    case DType::kF8E4M3: return exact(e4m3_decode(*p));
    case DType::kU8: return std::to_string(*p);
    case DType::kI8: return std::to_string(load<int8_t>(p));
    case DType::kI32: return std::to_string(load<int32_t>(p));
    case DType::kI64: return std::to_string(load<int64_t>(p));
  }
  return "?";
}

int dump(const std::string& path) {
  SafetensorsFile f(path);
  nlohmann::json out;
  out["metadata"] = nlohmann::json::object();
  for (const auto& kv : f.metadata()) out["metadata"][kv.first] = kv.second;
  out["tensors"] = nlohmann::json::array();
  for (const TensorInfo& t : f.tensors()) {
    const uint8_t* p = f.data(t.name);
    const size_t bytes = t.end - t.begin, esize = dtype_size(t.dtype);
    nlohmann::json j;
    j["name"] = t.name;
    j["dtype"] = dtype_name(t.dtype);
    j["shape"] = t.shape;
    j["fnv1a64"] = fmt::format("{:016x}", fnv1a64(p, bytes));
    std::string hex;
    for (size_t i = 0; i < bytes; ++i) hex += fmt::format("{:02x}", p[i]);
    j["hex"] = hex;
    std::vector<std::string> values;
    for (size_t i = 0; i < bytes; i += esize) values.push_back(value_string(t.dtype, p + i));
    j["values"] = values;
    out["tensors"].push_back(j);
  }
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

// The fixed set; check_interop.py holds the same values, written out independently.
int write(const std::string& path) {
  SafetensorsWriter w;
  std::vector<uint16_t> bf16;
  for (float v : {1.0f, -2.5f, 0.15625f, 3.140625f, -1024.0f, 0.0078125f}) bf16.push_back(f32_to_bf16_bits(v));
  w.add("bf16", DType::kBF16, {2, 3}, bf16.data(), bf16.size() * 2);
  std::vector<uint16_t> f16;
  for (float v : {1.0f, -0.5f, 65504.0f, 6.103515625e-05f}) f16.push_back(f32_to_f16_bits(v));
  w.add("f16", DType::kF16, {4}, f16.data(), f16.size() * 2);
  const float f32[4] = {1.5f, -3.25f, 1e-30f, 123456.75f};
  w.add("f32", DType::kF32, {2, 2}, f32, sizeof(f32));
  const uint8_t u8[5] = {0, 1, 127, 128, 255};
  w.add("u8", DType::kU8, {5}, u8, sizeof(u8));
  // e4m3fn bytes: 0, 1.0, -1.0, 448 (max), 2^-9 (smallest subnormal), NaN, 2.0, -3.0.
  const uint8_t f8[8] = {0x00, 0x38, 0xB8, 0x7E, 0x01, 0x7F, 0x40, 0xC4};
  w.add("f8_e4m3", DType::kF8E4M3, {2, 4}, f8, sizeof(f8));
  const int8_t i8[3] = {-128, 0, 127};
  w.add("i8", DType::kI8, {3}, i8, sizeof(i8));
  const int32_t i32[3] = {INT32_MIN, 7, INT32_MAX};
  w.add("i32", DType::kI32, {3, 1}, i32, sizeof(i32));
  const int64_t i64[2] = {INT64_MIN, INT64_MAX};
  w.add("i64", DType::kI64, {2}, i64, sizeof(i64));
  const float scalar = 2.5f;
  w.add("scalar_f32", DType::kF32, {}, &scalar, sizeof(scalar));
  w.add("empty_f32", DType::kF32, {0, 4}, nullptr, 0);
  w.add_metadata("format", "pt");
  w.add_metadata("writer", "st_tool");
  w.write(path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "dump") != 0 && std::strcmp(argv[1], "write") != 0)) {
    std::fprintf(stderr, "usage: st_tool dump FILE | st_tool write FILE\n");
    return 2;
  }
  try {
    return std::strcmp(argv[1], "dump") == 0 ? dump(argv[2]) : write(argv[2]);
  } catch (const Error& e) {
    std::fprintf(stderr, "st_tool: %s: %s\n", status_code_name(e.code()), e.what());
    return 1;
  }
}
