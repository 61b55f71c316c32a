// LayerNorm / RMSNorm (+ fused residual add) on the CPU, fp32, OpenMP over rows, vectorized inner loops.
// Per row h = x (+ xb) (+ r), xb the preceding linear's bias:  mean = sum(h)/N,  var = sum((h-mean)^2)/N  (two-pass variance over a row held in L1:
// no sum(h^2) - mean^2 cancellation), y = (h - mean) * rsqrt(var + eps) * w (+ b);
// RMSNorm: y = h * rsqrt(sum(h^2)/N + eps) * w. The residual sum is formed in the same pass as sum(h).
// fp32 or bf16 storage (storage.h), fp32 math. A training forward also writes mean and rstd per row (fp32).
#include <cmath>

#include "norm.h"
#include "parallel.h"
#include "storage.h"

namespace fastenc_cpu {

namespace {

// S: storage type (F32 or BF16). With a residual or xbias, h = x + xb + r is rounded to S, stored, and normalized
// from the rounded value (what a pre-norm block keeps in its residual stream); without residual_out (a post-norm
// block drops h) the output row y is the scratch row for h, read back before each element is overwritten.
template <class S, bool RMS, bool BIAS>
void norm_rows(const typename S::T* __restrict x, const typename S::T* __restrict residual,
               const typename S::T* __restrict xbias, const typename S::T* __restrict weight,
               const typename S::T* __restrict bias, typename S::T* out, typename S::T* residual_out,
               float* mean_out, float* rstd_out, int64_t rows, int64_t hidden, float eps) {
  using T = typename S::T;
  const float inv_n = 1.0f / (float)hidden;
#pragma omp parallel for schedule(static) if (worth_parallel(rows * hidden, kParallelMinElems))
  for (int64_t r = 0; r < rows; ++r) {
    const T* __restrict xr = x + r * hidden;
    T* yr = out + r * hidden;  // may double as the residual scratch that h points to
    const T* h = xr;
    float s = 0.f;
    if (residual != nullptr || xbias != nullptr) {
      T* hr = residual_out != nullptr ? residual_out + r * hidden : yr;
      if (residual != nullptr && xbias != nullptr) {
        const T* __restrict rr = residual + r * hidden;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < hidden; ++i) {
          const T v = S::store(S::load(xr[i]) + S::load(xbias[i]) + S::load(rr[i]));
          hr[i] = v;
          s += S::load(v);
        }
      } else {
        const T* __restrict rr = residual != nullptr ? residual + r * hidden : xbias;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < hidden; ++i) {
          const T v = S::store(S::load(xr[i]) + S::load(rr[i]));
          hr[i] = v;
          s += S::load(v);
        }
      }
      h = hr;
    } else if (!RMS) {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < hidden; ++i) s += S::load(xr[i]);
    }
    const float mean = RMS ? 0.f : s * inv_n;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < hidden; ++i) {
      const float d = S::load(h[i]) - mean;
      ss += d * d;
    }
    const float rstd = 1.f / std::sqrt(ss * inv_n + eps);
    if (rstd_out != nullptr) {  // a training forward keeps the statistics for the backward
      rstd_out[r] = rstd;
      if (mean_out != nullptr) mean_out[r] = mean;
    }
#pragma omp simd
    for (int64_t i = 0; i < hidden; ++i) {
      const float v = (S::load(h[i]) - mean) * rstd * S::load(weight[i]);
      yr[i] = S::store(BIAS ? v + S::load(bias[i]) : v);
    }
  }
}

template <class S>
void norm_dispatch(const typename S::T* x, const typename S::T* residual, const typename S::T* xbias,
                   const typename S::T* weight, const typename S::T* bias, typename S::T* out,
                   typename S::T* residual_out, float* mean_out, float* rstd_out, int64_t rows, int64_t hidden,
                   float eps, bool rms) {
  if (rms) {
    norm_rows<S, true, false>(x, residual, xbias, weight, nullptr, out, residual_out, nullptr, rstd_out, rows, hidden,
                              eps);
  } else if (bias != nullptr) {
    norm_rows<S, false, true>(x, residual, xbias, weight, bias, out, residual_out, mean_out, rstd_out, rows, hidden,
                              eps);
  } else {
    norm_rows<S, false, false>(x, residual, xbias, weight, nullptr, out, residual_out, mean_out, rstd_out, rows,
                               hidden, eps);
  }
}

}  // namespace

void norm_fwd(const float* x, const float* residual, const float* xbias, const float* weight, const float* bias,
              float* out, float* residual_out, int64_t rows, int64_t hidden, float eps, bool rms, float* mean_out,
              float* rstd_out) {
  norm_dispatch<F32>(x, residual, xbias, weight, bias, out, residual_out, mean_out, rstd_out, rows, hidden, eps, rms);
}

void norm_fwd_bf16(const uint16_t* x, const uint16_t* residual, const uint16_t* xbias, const uint16_t* weight,
                   const uint16_t* bias, uint16_t* out, uint16_t* residual_out, int64_t rows, int64_t hidden,
                   float eps, bool rms, float* mean_out, float* rstd_out) {
  norm_dispatch<BF16>(x, residual, xbias, weight, bias, out, residual_out, mean_out, rstd_out, rows, hidden, eps,
                      rms);
}

}  // namespace fastenc_cpu
