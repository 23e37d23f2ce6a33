// Element types and the bf16 value type shared by host and device code.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__CUDACC__)
#define FP4MOE_HD __host__ __device__ __forceinline__
#else
#define FP4MOE_HD inline
#endif

namespace fp4moe {

// Tensor element types we read and write (safetensors names in comments).
enum class DType : uint8_t {
  kBF16,     // "BF16"
  kF16,      // "F16"
  kF32,      // "F32"
  kU8,       // "U8"  (packed NVFP4 codes)
  kF8E4M3,   // "F8_E4M3" (e4m3fn block scales)
  kI8,       // "I8"
  kI32,      // "I32"
  kI64,      // "I64"
};

size_t dtype_size(DType t);                 // bytes per element
const char* dtype_name(DType t);            // safetensors spelling, e.g. "F8_E4M3"
bool dtype_from_name(const std::string& name, DType* out);  // false if unknown

// bf16 <-> fp32 with round-to-nearest-even; NaN stays NaN (quiet). Bit-exact with __float2bfloat16_rn.
FP4MOE_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
FP4MOE_HD float bf16_bits_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// Rounds an fp32 value to the nearest bf16 value, returned as fp32. The reference uses this at
// every point where the GPU path stores a bf16.
FP4MOE_HD float round_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

// IEEE half -> fp32 (for F16 inputs) and fp32 -> half (RNE), host only.
float f16_bits_to_f32(uint16_t h);
uint16_t f32_to_f16_bits(float f);

}  // namespace fp4moe
