// SafetensorsWriter -> SafetensorsFile round trips, the writer's byte layout, typed reads and their checks.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "fp4moe/safetensors.h"
#include "io_test_util.h"

using fp4moe::DType;
using fp4moe::Error;
using fp4moe::SafetensorsFile;
using fp4moe::SafetensorsWriter;
using fp4moe::StatusCode;
using fp4moe_test::expect_error;
using fp4moe_test::TempDir;

namespace {

struct Case {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

size_t bytes_of(const Case& c) {
  size_t n = fp4moe::dtype_size(c.dtype);
  for (int64_t d : c.shape) n *= static_cast<size_t>(d);
  return n;
}

// Every dtype, with a scalar, zero-size tensors and odd sizes that leave later tensors unaligned.
std::vector<Case> all_cases() {
  return {
      {"bf16.matrix", DType::kBF16, {3, 5}}, {"f16.vec", DType::kF16, {7}},
      {"f32.scalar", DType::kF32, {}},      {"u8.codes", DType::kU8, {3, 3}},
      {"f8.scales", DType::kF8E4M3, {5}},   {"i8.cube", DType::kI8, {2, 1, 3}},
      {"i32.vec", DType::kI32, {4}},        {"i64.scalar", DType::kI64, {}},
      {"f32.empty", DType::kF32, {0}},      {"bf16.empty2d", DType::kBF16, {3, 0}},
      {"u8.one", DType::kU8, {1}},          {"i64.vec", DType::kI64, {3}},
  };
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  std::mt19937 rng(1234);
  const std::vector<Case> cases = all_cases();
  std::vector<std::string> payloads;
  SafetensorsWriter w;
  for (const Case& c : cases) {
    std::string bytes(bytes_of(c), '\0');
    for (char& b : bytes) b = static_cast<char>(rng() & 0xff);
    w.add(c.name, c.dtype, c.shape, bytes.data(), bytes.size());
    payloads.push_back(bytes);
  }
  w.add_metadata("format", "pt");
  w.add_metadata("note", "quotes \" and \\ and unicode \xc3\xa9");
  const std::string path = dir.file("all.safetensors");
  w.write(path);

  SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), cases.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "quotes \" and \\ and unicode \xc3\xa9");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(f.has(c.name));
    const fp4moe::TensorInfo& t = f.info(c.name);
    EXPECT_EQ(t.dtype, c.dtype);
    EXPECT_EQ(t.shape, c.shape);
    EXPECT_EQ(t.end - t.begin, payloads[i].size());
    const std::vector<uint8_t> got = f.read_bytes(c.name, c.dtype, c.shape);
    EXPECT_EQ(std::string(got.begin(), got.end()), payloads[i]);
    EXPECT_EQ(std::memcmp(f.data(c.name), payloads[i].data(), payloads[i].size()), 0);
  }
  // Non-empty tensors keep insertion order in the data section (zero-size ones sort by offset too).
  std::vector<std::string> order;
  for (const auto& t : f.tensors())
    if (t.end > t.begin) order.push_back(t.name);
  std::vector<std::string> expect;
  for (const Case& c : cases)
    if (bytes_of(c) > 0) expect.push_back(c.name);
  EXPECT_EQ(order, expect);
  EXPECT_EQ(f.info("f32.scalar").numel(), 1);
  EXPECT_EQ(f.info("f32.scalar").shape_string(), "[]");
  EXPECT_EQ(f.info("bf16.empty2d").numel(), 0);
  EXPECT_EQ(f.info("bf16.matrix").shape_string(), "[3, 5]");
}

TEST(Safetensors, WriterByteLayoutIsTheReferenceLayout) {
  // Expected bytes written out by hand from the format description: compact JSON, tensors in
  // insertion order, contiguous offsets, header padded with spaces to a multiple of 8.
  TempDir dir;
  SafetensorsWriter w;
  const float a[2] = {1.0f, -2.0f};
  const uint8_t b[3] = {1, 2, 3};
  w.add("b_second", DType::kF32, {2}, a, sizeof(a));
  w.add("a_first", DType::kU8, {3}, b, sizeof(b));
  w.write(dir.file("x.safetensors"));
  const std::string header =
      "{\"b_second\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"a_first\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::string data(reinterpret_cast<const char*>(a), sizeof(a));
  data += std::string(reinterpret_cast<const char*>(b), sizeof(b));
  EXPECT_EQ(fp4moe_test::read_file(dir.file("x.safetensors")), fp4moe_test::raw_safetensors(padded, data));
}

TEST(Safetensors, EmptyFileIsValid) {
  TempDir dir;
  SafetensorsWriter().write(dir.file("empty.safetensors"));
  EXPECT_EQ(fp4moe_test::read_file(dir.file("empty.safetensors")), fp4moe_test::le64(8) + "{}      ");
  SafetensorsFile f(dir.file("empty.safetensors"));
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
  // The minimal hand-made form, a 2-byte header, is valid too.
  fp4moe_test::write_file(dir.file("min.safetensors"), fp4moe_test::raw_safetensors("{}", ""));
  EXPECT_TRUE(SafetensorsFile(dir.file("min.safetensors")).tensors().empty());
}

TEST(Safetensors, TypedReadsConvert) {
  TempDir dir;
  SafetensorsWriter w;
  const float f32[4] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -0.0f};
  // f16 bit patterns: 1, -2, 65504 (max), 2^-24 (smallest subnormal), +inf.
  const uint16_t f16[5] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00};
  const uint16_t bf16[3] = {0x3F80, 0xC040, 0x0001};  // 1, -3, 2^-133
  w.add("f32", DType::kF32, {2, 2}, f32, sizeof(f32));
  w.add("f16", DType::kF16, {5}, f16, sizeof(f16));
  w.add("bf16", DType::kBF16, {3}, bf16, sizeof(bf16));
  const int32_t i32[2] = {7, -7};
  w.add("i32", DType::kI32, {2}, i32, sizeof(i32));
  w.write(dir.file("t.safetensors"));
  SafetensorsFile f(dir.file("t.safetensors"));

  EXPECT_EQ(f.read_f32("f32", {2, 2}), std::vector<float>(f32, f32 + 4));
  const std::vector<float> h = f.read_f32("f16");
  ASSERT_EQ(h.size(), 5u);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h[4]) && h[4] > 0);
  const std::vector<float> b = f.read_f32("bf16", {3});
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -3.0f);
  EXPECT_EQ(b[2], std::ldexp(1.0f, -133));
  // read_bf16: bf16 passes through; f32 rounds to nearest even (1+2^-8 ties down to 1, 1+3*2^-8 up to 1+2^-6).
  EXPECT_EQ(f.read_bf16("bf16"), std::vector<uint16_t>(bf16, bf16 + 3));
  EXPECT_EQ(f.read_bf16("f32"), (std::vector<uint16_t>{0x3F80, 0x3F80, 0x3F82, 0x8000}));
  EXPECT_EQ(f.read_bf16("f16")[1], 0xC000);

  expect_error([&] { f.read_f32("i32"); }, StatusCode::kFormatError,
               {"t.safetensors", "'i32'", "BF16, F16 or F32", "found I32 [2]"});
  expect_error([&] { f.read_f32("f32", {4}); }, StatusCode::kFormatError,
               {"t.safetensors", "'f32'", "expected shape [4]", "found F32 [2, 2]"});
  expect_error([&] { f.read_bytes("f16", DType::kBF16); }, StatusCode::kFormatError,
               {"'f16'", "expected dtype BF16", "found F16 [5]"});
  expect_error([&] { f.read_bytes("nope", DType::kU8); }, StatusCode::kNotFound, {"t.safetensors", "'nope'"});
  expect_error([&] { f.info("nope"); }, StatusCode::kNotFound, {"'nope'", "not found"});
}

TEST(Safetensors, UnalignedAndGappedDataRead) {
  // A 3-byte U8 tensor first leaves the F32 tensor at an odd address; a 5-byte gap follows it.
  TempDir dir;
  const std::string header =
      "{\"u\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
      "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
  const float vals[2] = {3.5f, -0.25f};
  std::string data = "abc" + std::string(5, 'z') + std::string(reinterpret_cast<const char*>(vals), 8);
  fp4moe_test::write_file(dir.file("u.safetensors"), fp4moe_test::raw_safetensors(header + " ", data));
  SafetensorsFile f(dir.file("u.safetensors"));
  EXPECT_EQ(f.read_f32("f"), (std::vector<float>{3.5f, -0.25f}));
  EXPECT_EQ(f.read_bf16("f"), (std::vector<uint16_t>{0x4060, 0xBE80}));
  EXPECT_EQ(f.tensors()[0].name, "u");
  EXPECT_EQ(f.tensors()[1].name, "f");
}

TEST(Safetensors, WriterRejectsBadInput) {
  SafetensorsWriter w;
  const float x[2] = {1, 2};
  w.add("x", DType::kF32, {2}, x, sizeof(x));
  expect_error([&] { w.add("x", DType::kF32, {2}, x, sizeof(x)); }, StatusCode::kInvalidArgument,
               {"duplicate", "'x'"});
  expect_error([&] { w.add("y", DType::kF32, {3}, x, sizeof(x)); }, StatusCode::kInvalidArgument,
               {"'y'", "F32", "[3]", "12 bytes", "8 bytes"});
  expect_error([&] { w.add("z", DType::kF32, {-1}, x, 0); }, StatusCode::kInvalidArgument, {"'z'", "negative"});
  expect_error([&] { w.add("__metadata__", DType::kU8, {0}, nullptr, 0); }, StatusCode::kInvalidArgument,
               {"__metadata__", "reserved"});
  expect_error([&] { w.add("bad\xff", DType::kU8, {0}, nullptr, 0); }, StatusCode::kInvalidArgument, {"UTF-8"});
}

TEST(Safetensors, AtomicWriteLeavesNoTemporaryAndReplaces) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const float one = 1.0f, two = 2.0f;
  SafetensorsWriter w1;
  w1.add("v", DType::kF32, {}, &one, 4);
  w1.write(path);
  SafetensorsFile old_file(path);  // stays mapped across the replacement
  SafetensorsWriter w2;
  w2.add("v", DType::kF32, {1}, &two, 4);
  w2.write(path);
  EXPECT_EQ(old_file.read_f32("v")[0], 1.0f);
  EXPECT_EQ(SafetensorsFile(path).read_f32("v", {1})[0], 2.0f);
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++entries;
    EXPECT_EQ(e.path().filename().string(), "m.safetensors");
  }
  EXPECT_EQ(entries, 1u);
  expect_error([&] { w2.write(dir.file("no/such/dir/m.safetensors")); }, StatusCode::kIoError,
               {"no/such/dir/m.safetensors"});
}

TEST(Safetensors, OpenErrors) {
  TempDir dir;
  expect_error([&] { SafetensorsFile f(dir.file("missing.safetensors")); }, StatusCode::kNotFound,
               {"missing.safetensors", "not found"});
  expect_error([&] { SafetensorsFile f(dir.path()); }, StatusCode::kIoError, {dir.path(), "regular file"});
  // A FIFO with no writer: refused at once, not waited on.
  ASSERT_EQ(mkfifo(dir.file("fifo").c_str(), 0600), 0);
  expect_error([&] { SafetensorsFile f(dir.file("fifo")); }, StatusCode::kIoError, {"fifo", "regular file"});
}
