// format_tool: the NVFP4 format functions over raw little-endian files, for check_format.py.
//
//   format_tool e2m1-encode IN.f32 OUT.u8        one code per byte (low nibble)
//   format_tool e4m3-encode IN.f32 OUT.u8
//   format_tool e2m1-decode IN.u8 OUT.f32        codes in the low nibble (high nibble must be 0)
//   format_tool e4m3-decode IN.u8 OUT.f32
//   format_tool pack IN.u8 OUT.u8                two codes per byte (pack_e2m1)
//   format_tool unpack COUNT IN.u8 OUT.u8        (unpack_e2m1)
//   format_tool quantize N K IN.f32 PREFIX       writes PREFIX.codes [N, K/2] u8, PREFIX.scales
//                                                [N, K/16] u8 (e4m3fn), PREFIX.tensor_scale (1 f32)
//   format_tool dequantize N K PREFIX OUT.f32    reads the three files above, writes [N, K] f32
//
// Exit status: 0 on success, 1 on an fp4moe::Error (message on stderr), 2 on bad usage or I/O.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fp4moe/nvfp4.h"
#include "fp4moe/status.h"

namespace {

struct UsageError {
  std::string message;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError{"cannot open " + path};
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw UsageError{"cannot create " + path};
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw UsageError{"write failed: " + path};
}

// Host byte order is little-endian on every platform fp4moe supports (x86-64, aarch64).
std::vector<float> read_f32(const std::string& path) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  if (bytes.size() % 4 != 0) throw UsageError{path + ": size is not a multiple of 4"};
  std::vector<float> v(bytes.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

int64_t parse_int(const char* s) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0') throw UsageError{std::string("not an integer: ") + s};
  return v;
}

int usage() {
  std::fprintf(stderr,
               "usage: format_tool e2m1-encode|e4m3-encode IN.f32 OUT.u8\n"
               "       format_tool e2m1-decode|e4m3-decode IN.u8 OUT.f32\n"
               "       format_tool pack IN.u8 OUT.u8 | unpack COUNT IN.u8 OUT.u8\n"
               "       format_tool quantize N K IN.f32 PREFIX | dequantize N K PREFIX OUT.f32\n");
  return 2;
}

int run(int argc, char** argv) {
  using namespace fp4moe;
  const std::string cmd = argv[1];
  if ((cmd == "e2m1-encode" || cmd == "e4m3-encode") && argc == 4) {
    const std::vector<float> in = read_f32(argv[2]);
    std::vector<uint8_t> out(in.size());
    for (size_t i = 0; i < in.size(); ++i) out[i] = cmd == "e2m1-encode" ? e2m1_encode(in[i]) : e4m3_encode(in[i]);
    write_bytes(argv[3], out.data(), out.size());
  } else if ((cmd == "e2m1-decode" || cmd == "e4m3-decode") && argc == 4) {
    const std::vector<uint8_t> in = read_bytes(argv[2]);
    std::vector<float> out(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      if (cmd == "e2m1-decode") {
        FP4MOE_CHECK(in[i] <= 0xF, StatusCode::kInvalidArgument, "byte {} = {} is not a 4-bit code", i, in[i]);
        out[i] = e2m1_decode(in[i]);
      } else {
        out[i] = e4m3_decode(in[i]);
      }
    }
    write_bytes(argv[3], out.data(), out.size() * 4);
  } else if (cmd == "pack" && argc == 4) {
    const std::vector<uint8_t> in = read_bytes(argv[2]);
    std::vector<uint8_t> out(in.size() / 2);
    pack_e2m1(in.data(), static_cast<int64_t>(in.size()), out.data());
    write_bytes(argv[3], out.data(), out.size());
  } else if (cmd == "unpack" && argc == 5) {
    const int64_t count = parse_int(argv[2]);
    const std::vector<uint8_t> in = read_bytes(argv[3]);
    if (count < 0 || static_cast<uint64_t>(count) > 2 * in.size())
      throw UsageError{"unpack: COUNT exceeds the input's codes"};
    std::vector<uint8_t> out(static_cast<size_t>(count));
    unpack_e2m1(in.data(), count, out.data());
    write_bytes(argv[4], out.data(), out.size());
  } else if (cmd == "quantize" && argc == 6) {
    const int64_t n = parse_int(argv[2]), k = parse_int(argv[3]);
    const std::vector<float> w = read_f32(argv[4]);
    if (n < 0 || k < 0 || static_cast<uint64_t>(n) * static_cast<uint64_t>(k) != w.size())
      throw UsageError{"quantize: input holds " + std::to_string(w.size()) + " floats, not N*K"};
    const PackedNvfp4Weights q = quantize_nvfp4(w.data(), n, k, argv[4]);
    const std::string prefix = argv[5];
    write_bytes(prefix + ".codes", q.codes.data(), q.codes.size());
    write_bytes(prefix + ".scales", q.scales.data(), q.scales.size());
    write_bytes(prefix + ".tensor_scale", &q.tensor_scale, 4);
  } else if (cmd == "dequantize" && argc == 6) {
    PackedNvfp4Weights q;
    q.n = parse_int(argv[2]);
    q.k = parse_int(argv[3]);
    const std::string prefix = argv[4];
    q.codes = read_bytes(prefix + ".codes");
    q.scales = read_bytes(prefix + ".scales");
    const std::vector<float> ts = read_f32(prefix + ".tensor_scale");
    if (ts.size() != 1) throw UsageError{prefix + ".tensor_scale must hold one float"};
    q.tensor_scale = ts[0];
    const std::vector<float> out = dequantize_nvfp4(q);
    write_bytes(argv[5], out.data(), out.size() * 4);
  } else {
    return usage();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  try {
    return run(argc, argv);
  } catch (const fp4moe::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "format_tool: %s\n", e.message.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "format_tool: %s\n", e.what());
    return 2;
  }
}
