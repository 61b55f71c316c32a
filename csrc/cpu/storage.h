// Storage types of the CPU kernels: fp32, or bf16 held as raw uint16_t bits (no torch headers). Loads widen to
// fp32 (exact); stores round to nearest even (NaN kept quiet), so a bf16 kernel rounds once, like the reference.
#pragma once
#include <cstdint>
#include <cstring>

#include "fast_math.h"

namespace fastenc_cpu {

struct F32 {
  using T = float;
  static FASTENC_INLINE float load(float v) { return v; }
  static FASTENC_INLINE float store(float v) { return v; }
};

struct BF16 {
  using T = uint16_t;
  static FASTENC_INLINE float load(uint16_t v) {
    const uint32_t bits = (uint32_t)v << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
  static FASTENC_INLINE uint16_t store(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;  // round to nearest, ties to even
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    return (uint16_t)(nan ? ((bits >> 16) | 0x40u) : rounded);
  }
};

}  // namespace fastenc_cpu
