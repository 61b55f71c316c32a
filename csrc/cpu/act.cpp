// GELU (+bias) and GeGLU on the CPU, fp32, OpenMP over rows, vectorized inner loops (fast_math.h).
// exact: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2));  tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// GeGLU (ModernBERT order): out = gelu(x[:, :n]) * x[:, n:].
#include "cpu_kernels.h"
#include "fast_math.h"

namespace fastenc_cpu {

namespace {

template <bool TANH>
FASTENC_INLINE float act(float v) {
  return TANH ? fm_gelu_tanh(v) : fm_gelu_erf(v);
}

template <bool TANH, bool BIAS>
void gelu_rows(const float* __restrict x, const float* __restrict bias, float* __restrict out, int64_t rows,
               int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * n;
    float* __restrict yr = out + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) yr[i] = act<TANH>(BIAS ? xr[i] + bias[i] : xr[i]);
  }
}

template <bool TANH>
void geglu_rows(const float* __restrict x, float* __restrict out, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict in = x + r * 2 * n;
    const float* __restrict gate = in + n;
    float* __restrict yr = out + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) yr[i] = act<TANH>(in[i]) * gate[i];
  }
}

}  // namespace

void gelu_fwd(const float* x, const float* bias, float* out, int64_t rows, int64_t n, bool tanh_approx) {
  if (rows == 1 && n > 4096) {  // one long row: split it so every thread gets a share
    const int64_t chunk = 1024, parts = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t a = p * chunk, len = (n - a < chunk) ? n - a : chunk;
      gelu_fwd(x + a, bias != nullptr ? bias + a : nullptr, out + a, 1, len, tanh_approx);
    }
    return;
  }
  if (tanh_approx) {
    bias != nullptr ? gelu_rows<true, true>(x, bias, out, rows, n) : gelu_rows<true, false>(x, bias, out, rows, n);
  } else {
    bias != nullptr ? gelu_rows<false, true>(x, bias, out, rows, n) : gelu_rows<false, false>(x, bias, out, rows, n);
  }
}

void geglu_fwd(const float* x, float* out, int64_t rows, int64_t n, bool tanh_approx) {
  tanh_approx ? geglu_rows<true>(x, out, rows, n) : geglu_rows<false>(x, out, rows, n);
}

}  // namespace fastenc_cpu
