// LayerNorm / RMSNorm (+ fused residual add) on the CPU, fp32, OpenMP over rows, vectorized inner loops.
// Per row h = x (+ r):  mean = sum(h)/N,  var = sum((h-mean)^2)/N  (two-pass variance over a row held in L1:
// no sum(h^2) - mean^2 cancellation), y = (h - mean) * rsqrt(var + eps) * w (+ b);
// RMSNorm: y = h * rsqrt(sum(h^2)/N + eps) * w. The residual sum is formed in the same pass as sum(h).
#include <cmath>

#include "cpu_kernels.h"

namespace fastenc_cpu {

namespace {

template <bool RMS, bool BIAS>
void norm_rows(const float* __restrict x, const float* __restrict residual, const float* __restrict weight,
               const float* __restrict bias, float* __restrict out, float* __restrict residual_out, int64_t rows,
               int64_t hidden, float eps) {
  const float inv_n = 1.0f / (float)hidden;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * hidden;
    float* yr = out + r * hidden;  // may double as the residual scratch that h points to
    const float* h = xr;
    float s = 0.f;
    if (residual != nullptr) {
      const float* __restrict rr = residual + r * hidden;
      float* hr = residual_out != nullptr ? residual_out + r * hidden : yr;  // y as scratch
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < hidden; ++i) {
        const float v = xr[i] + rr[i];
        hr[i] = v;
        s += v;
      }
      h = hr;
    } else if (!RMS) {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < hidden; ++i) s += xr[i];
    }
    const float mean = RMS ? 0.f : s * inv_n;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < hidden; ++i) {
      const float d = h[i] - mean;
      ss += d * d;
    }
    const float rstd = 1.f / std::sqrt(ss * inv_n + eps);
#pragma omp simd
    for (int64_t i = 0; i < hidden; ++i) {
      const float v = (h[i] - mean) * rstd * weight[i];
      yr[i] = BIAS ? v + bias[i] : v;
    }
  }
}

}  // namespace

void norm_fwd(const float* x, const float* residual, const float* weight, const float* bias, float* out,
              float* residual_out, int64_t rows, int64_t hidden, float eps, bool rms) {
  if (rms) {
    norm_rows<true, false>(x, residual, weight, nullptr, out, residual_out, rows, hidden, eps);
  } else if (bias != nullptr) {
    norm_rows<false, true>(x, residual, weight, bias, out, residual_out, rows, hidden, eps);
  } else {
    norm_rows<false, false>(x, residual, weight, nullptr, out, residual_out, rows, hidden, eps);
  }
}

}  // namespace fastenc_cpu
