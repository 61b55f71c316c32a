// GELU (+bias) and GeGLU on the CPU, fp32, OpenMP over rows.
// exact: gelu(x) = 0.5 x (1 + erf(x / sqrt 2));  tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#include <cmath>

#include "cpu_kernels.h"

namespace fastenc_cpu {

static inline float gelu_exact(float x) { return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f)); }
static inline float gelu_tanh(float x) {
  const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + std::tanh(u));
}

void gelu_fwd(const float* x, const float* bias, float* out, int64_t rows, int64_t n, bool tanh_approx) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    for (int64_t i = 0; i < n; ++i) {
      const float v = xr[i] + (bias != nullptr ? bias[i] : 0.f);
      yr[i] = tanh_approx ? gelu_tanh(v) : gelu_exact(v);
    }
  }
}

void geglu_fwd(const float* x, float* out, int64_t rows, int64_t n, bool tanh_approx) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * 2 * n;
    const float* gate = in + n;
    float* yr = out + r * n;
    for (int64_t i = 0; i < n; ++i) yr[i] = (tanh_approx ? gelu_tanh(in[i]) : gelu_exact(in[i])) * gate[i];
  }
}

}  // namespace fastenc_cpu
