// Raw-pointer C++/OpenMP inverted dropout (csrc/cpu/dropout.cpp; no torch headers), fp32 row-major contiguous.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// out = (x + bias) * Z / (1 - p), Z the counter-based keep-mask of (seed, offset) (fastenc/reference/dropout.py);
// x, out: rows x n (out may be x); bias (n) may be null; 0 < p < 1.
void dropout_fwd(const float* x, const float* bias, float* out, int64_t rows, int64_t n, double p, int64_t seed,
                 int64_t offset);
// Its backward: dx = grad * Z / (1 - p) (dx may be grad).
void dropout_bwd(const float* grad, float* dx, int64_t rows, int64_t n, double p, int64_t seed, int64_t offset);

}  // namespace fastenc_cpu
