// Rotate-half RoPE on the CPU, fp32, OpenMP over tokens. With x1 = x[:half], x2 = x[half:2half]:
//   out[:half] = x1 cos - x2 sin,  out[half:2half] = x2 cos + x1 sin,  out[2half:] = x[2half:].
#include <cstring>

#include "cpu_kernels.h"

namespace fastenc_cpu {

static inline void rotate(const float* x, float* y, const float* c, const float* s, int64_t d, int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    y[i] = x1 * c[i] - x2 * s[i];
    y[i + half] = x2 * c[i] + x1 * s[i];
  }
  if (2 * half < d) std::memcpy(y + 2 * half, x + 2 * half, sizeof(float) * (d - 2 * half));
}

void rope_fwd(const float* q, const float* k, float* qo, float* ko, const float* cos, const float* sin,
              const int32_t* pos, int64_t tokens, int64_t hq, int64_t hk, int64_t d, int64_t half) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cos + (int64_t)pos[t] * half;
    const float* s = sin + (int64_t)pos[t] * half;
    for (int64_t h = 0; h < hq; ++h) rotate(q + (t * hq + h) * d, qo + (t * hq + h) * d, c, s, d, half);
    for (int64_t h = 0; h < hk; ++h) rotate(k + (t * hk + h) * d, ko + (t * hk + h) * d, c, s, d, half);
  }
}

}  // namespace fastenc_cpu
