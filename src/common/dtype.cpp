#include "fp4moe/dtype.h"

#include <cmath>

namespace fp4moe {

namespace {
struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kBF16, "BF16", 2}, {DType::kF16, "F16", 2},     {DType::kF32, "F32", 4}, {DType::kU8, "U8", 1},
    {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kI8, "I8", 1}, {DType::kI32, "I32", 4}, {DType::kI64, "I64", 8},
};
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

bool dtype_from_name(const std::string& name, DType* out) {
  for (const auto& d : kDTypes) {
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    v = man ? std::nanf("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;              // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;             // rounds to Inf (>= 65520)
  if (abs < 0x38800000u) {                                   // below the smallest normal half (2^-14)
    // Subnormal: value / 2^-24 rounded to nearest even integer.
    float a;
    memcpy(&a, &abs, 4);
    const float q = std::nearbyint(a * 16777216.0f);         // default rounding mode is RNE
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t m = abs + 0xfffu + ((abs >> 13) & 1u);            // RNE on the 13 dropped bits
  return sign | static_cast<uint16_t>(((m >> 13) - (112u << 10)));
}

}  // namespace fp4moe
