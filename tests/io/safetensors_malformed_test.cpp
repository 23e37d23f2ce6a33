// Malformed safetensors files, built byte by byte: each must throw fp4moe::Error naming the problem
// (never crash, never read past the file). Then a fixed-seed mutation test over a valid file.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "fp4moe/safetensors.h"
#include "io_test_util.h"

using fp4moe::DType;
using fp4moe::SafetensorsFile;
using fp4moe::StatusCode;
using fp4moe_test::expect_error;
using fp4moe_test::raw_safetensors;
using fp4moe_test::TempDir;

namespace {

struct Bad {
  const char* what;
  std::string bytes;
  std::vector<std::string> words;
};

std::string entry(const std::string& name, const std::string& body) { return "\"" + name + "\":{" + body + "}"; }

std::vector<Bad> bad_files() {
  const std::string d8(8, 'x'), d64(64, 'x');
  const std::string ok_x = entry("x", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]");
  std::string deep(5000, '[');
  return {
      {"empty file", "", {"0 bytes", "too short"}},
      {"truncated length field", std::string("\x08\x00\x00", 3), {"3 bytes", "too short"}},
      {"header length past the end", raw_safetensors("{}", "", 1000), {"header length 1000", "only 2 bytes"}},
      {"header length over the limit", raw_safetensors("{}", "", int64_t{1} << 40),
       {"header length 1099511627776", "exceeds the limit"}},
      {"header length 2^64-1", fp4moe_test::le64(~uint64_t{0}) + "{}", {"header length 18446744073709551615"}},
      {"empty header", raw_safetensors("", ""), {"not valid JSON"}},
      {"bad JSON", raw_safetensors("{\"x\":{\"dtype\":", ""), {"not valid JSON"}},
      {"trailing garbage", raw_safetensors("{} x", ""), {"not valid JSON"}},
      {"invalid UTF-8 key", raw_safetensors("{\"\xff\":{}}", ""), {"not valid JSON"}},
      {"array header", raw_safetensors("[1,2]", ""), {"must be a JSON object", "array"}},
      {"string header", raw_safetensors("\"hi\"", ""), {"must be a JSON object", "string"}},
      {"deep nesting", raw_safetensors(deep, ""), {"nested deeper"}},
      {"entry not an object", raw_safetensors("{\"x\":5}", d8), {"tensor 'x'", "must be an object"}},
      {"missing data_offsets", raw_safetensors("{" + entry("x", "\"dtype\":\"F32\",\"shape\":[2]") + "}", d8),
       {"tensor 'x'", "no 'data_offsets'"}},
      {"missing dtype", raw_safetensors("{" + entry("x", "\"shape\":[2],\"data_offsets\":[0,8]") + "}", d8),
       {"tensor 'x'", "no 'dtype'"}},
      {"unknown dtype", raw_safetensors("{" + entry("x", "\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]") + "}", d8),
       {"tensor 'x'", "unknown or unsupported dtype 'F64'", "F8_E4M3"}},
      {"numeric dtype", raw_safetensors("{" + entry("x", "\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]") + "}", d8),
       {"tensor 'x'", "dtype must be a string"}},
      {"negative shape", raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":[-8],\"data_offsets\":[0,8]") + "}", d8),
       {"tensor 'x'", "non-negative integer", "negative value -8"}},
      {"float shape", raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":[8.0],\"data_offsets\":[0,8]") + "}", d8),
       {"tensor 'x'", "non-negative integer", "floating-point"}},
      {"string shape", raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":\"8\",\"data_offsets\":[0,8]") + "}", d8),
       {"tensor 'x'", "shape must be an array"}},
      {"shape too big for int64",
       raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,8]") + "}", d8),
       {"tensor 'x'", "larger than the limit"}},
      {"shape product overflows",
       raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]") + "}", d8),
       {"tensor 'x'", "more elements than fit"}},
      {"dtype x shape overflows",
       raw_safetensors("{" + entry("x", "\"dtype\":\"I64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]") + "}", d8),
       {"tensor 'x'", "overflows 64 bits"}},
      {"offsets out of range", raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":[100],\"data_offsets\":[0,100]") + "}", d8),
       {"tensor 'x'", "[0, 100]", "past the data section", "8 bytes"}},
      {"begin after end", raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]") + "}", d8),
       {"tensor 'x'", "[8, 4]", "begin after end"}},
      {"one offset", raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0]") + "}", d8),
       {"tensor 'x'", "data_offsets must be an array [begin, end]"}},
      {"negative offset", raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-4,0]") + "}", d8),
       {"tensor 'x'", "begin", "negative"}},
      {"float offset", raw_safetensors("{" + entry("x", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4.0]") + "}", d8),
       {"tensor 'x'", "end", "floating-point"}},
      {"dtype x shape != bytes",
       raw_safetensors("{" + entry("x", "\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,60]") + "}", d64),
       {"tensor 'x'", "dtype BF16 x shape [4, 8] = 64 bytes", "give 60"}},
      {"overlapping tensors",
       raw_safetensors("{" + ok_x + "," + entry("y", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]") + "}",
                       std::string(12, 'x')),
       {"'x'", "'y'", "overlap"}},
      {"contained tensor",
       raw_safetensors("{" + entry("big", "\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]") + "," +
                           entry("in", "\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10]") + "}",
                       std::string(16, 'x')),
       {"'big'", "'in'", "overlap"}},
      {"duplicate names", raw_safetensors("{" + ok_x + "," + ok_x + "}", d8), {"duplicate key 'x'"}},
      {"duplicate field", raw_safetensors("{" + entry("x", "\"dtype\":\"F32\",\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,8]") + "}", d8),
       {"duplicate key 'dtype'"}},
      {"metadata with a number", raw_safetensors("{\"__metadata__\":{\"a\":\"b\",\"n\":3}," + ok_x + "}", d8),
       {"__metadata__", "'n'", "must be a string", "integer"}},
      {"metadata not an object", raw_safetensors("{\"__metadata__\":[\"a\"]," + ok_x + "}", d8),
       {"__metadata__", "must be an object", "array"}},
  };
}

}  // namespace

TEST(SafetensorsMalformed, EachThrowsANamedError) {
  TempDir dir;
  int n = 0;
  for (const Bad& b : bad_files()) {
    const std::string path = dir.file("bad" + std::to_string(n++) + ".safetensors");
    fp4moe_test::write_file(path, b.bytes);
    std::vector<std::string> words = b.words;
    words.push_back(path);
    expect_error([&] { SafetensorsFile f(path); }, StatusCode::kFormatError, words, b.what);
  }
}

TEST(SafetensorsMalformed, ZeroSizeTensorsNeverOverlap) {
  // Zero-byte ranges touch nothing, even at the end of the data section or inside another tensor.
  TempDir dir;
  const std::string header = "{" + entry("x", "\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]") + "," +
                             entry("e1", "\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]") + "," +
                             entry("e2", "\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]") + "}";
  fp4moe_test::write_file(dir.file("z.safetensors"), raw_safetensors(header, std::string(8, 'q')));
  SafetensorsFile f(dir.file("z.safetensors"));
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_TRUE(f.read_f32("e2").empty());
  EXPECT_TRUE(f.read_bytes("e1", DType::kF32, {0, 3}).empty());
}

// Flips, overwrites, truncates and re-lengths a valid file a few thousand times (fixed seed): every
// result must either load (and then every tensor must be readable) or throw fp4moe::Error.
TEST(SafetensorsMalformed, RandomMutationsLoadOrThrow) {
  TempDir dir;
  fp4moe::SafetensorsWriter w;
  std::vector<uint8_t> payload(200);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 37 + 11);
  w.add("model.w", DType::kBF16, {4, 6}, payload.data(), 48);
  w.add("model.s", DType::kF32, {}, payload.data(), 4);
  w.add("model.q", DType::kU8, {3, 7}, payload.data(), 21);
  w.add("model.e", DType::kF8E4M3, {0}, nullptr, 0);
  w.add("model.i", DType::kI64, {2}, payload.data(), 16);
  w.add_metadata("format", "pt");
  const std::string good_path = dir.file("good.safetensors");
  w.write(good_path);
  const std::string good = fp4moe_test::read_file(good_path);
  const uint64_t header_end = 8 + (static_cast<uint8_t>(good[0]) | (static_cast<uint8_t>(good[1]) << 8));

  std::mt19937_64 rng(0xC0FFEE);
  const std::string interesting = "{}[]\",:-0123456789eE. \\";
  const std::string path = dir.file("mut.safetensors");
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string m = good;
    const int kind = static_cast<int>(rng() % 6);
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !m.empty(); ++e) {
      // Mostly inside the header, where the structure lives.
      const size_t pos = (rng() % 4 != 0) ? 8 + rng() % (header_end - 8) : rng() % m.size();
      if (pos >= m.size()) continue;
      switch (kind) {
        case 0: m[pos] = static_cast<char>(m[pos] ^ (1u << (rng() % 8))); break;
        case 1: m[pos] = interesting[rng() % interesting.size()]; break;
        case 2: m[pos] = static_cast<char>(rng() & 0xff); break;
        case 3: m.resize(rng() % m.size()); break;
        case 4: m.erase(pos, 1); break;
        default: {
          const uint64_t len = (rng() % 2) ? rng() : header_end - 8 + (rng() % 17) - 8;
          m.replace(0, 8, fp4moe_test::le64(len));
        }
      }
    }
    std::remove(path.c_str());  // a fresh file, not a truncated one (ext4 flushes on replace-by-truncate)
    fp4moe_test::write_file(path, m);
    try {
      SafetensorsFile f(path);
      for (const auto& t : f.tensors()) {
        const std::vector<uint8_t> bytes = f.read_bytes(t.name, t.dtype);
        ASSERT_EQ(bytes.size(), t.end - t.begin);
        if (t.dtype == DType::kBF16 || t.dtype == DType::kF16 || t.dtype == DType::kF32) {
          ASSERT_EQ(f.read_f32(t.name).size(), static_cast<size_t>(t.numel()));
        }
      }
      ++loaded;
    } catch (const fp4moe::Error& e) {
      ++rejected;
      ASSERT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": not an fp4moe::Error: " << e.what();
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(loaded, 10);  // harmless mutations (inside data bytes, header padding) still load
  std::printf("mutations: %d loaded, %d rejected\n", loaded, rejected);
}
