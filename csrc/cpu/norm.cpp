// LayerNorm / RMSNorm (+ fused residual add) on the CPU, fp32, OpenMP over rows.
// Per row h = x (+ r):  mean = sum(h)/N,  var = sum((h-mean)^2)/N  (two passes over a row held in cache),
// y = (h - mean) * rsqrt(var + eps) * w + b;  RMSNorm: y = h * rsqrt(sum(h^2)/N + eps) * w.
#include <cmath>

#include "cpu_kernels.h"

namespace fastenc_cpu {

void norm_fwd(const float* x, const float* residual, const float* weight, const float* bias, float* out,
              float* residual_out, int64_t rows, int64_t hidden, float eps, bool rms) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * hidden;
    float* yr = out + r * hidden;
    const float* h = xr;
    if (residual != nullptr) {
      const float* rr = residual + r * hidden;
      float* hr = residual_out != nullptr ? residual_out + r * hidden : yr;
#pragma omp simd
      for (int64_t i = 0; i < hidden; ++i) hr[i] = xr[i] + rr[i];
      h = hr;
    }
    float mean = 0.f;
    if (!rms) {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < hidden; ++i) s += h[i];
      mean = s / (float)hidden;
    }
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < hidden; ++i) {
      const float d = h[i] - mean;
      ss += d * d;
    }
    const float rstd = 1.f / std::sqrt(ss / (float)hidden + eps);
    if (bias != nullptr) {
#pragma omp simd
      for (int64_t i = 0; i < hidden; ++i) yr[i] = (h[i] - mean) * rstd * weight[i] + bias[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < hidden; ++i) yr[i] = (h[i] - mean) * rstd * weight[i];
    }
  }
}

}  // namespace fastenc_cpu
