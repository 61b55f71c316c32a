// Rotate-half RoPE on the CPU, fp32, OpenMP over tokens. With x1 = x[:half], x2 = x[half:2half]:
//   out[:half] = x1 cos - x2 sin,  out[half:2half] = x2 cos + x1 sin,  out[2half:] = x[2half:].
// The backward is the inverse rotation (sin -> -sin: the rotation is orthogonal, its inverse is its transpose).
// Each token's position is checked where it is read: a position outside [0, P) never reads the table; that
// token's rows are written as NaN and counted, and the caller raises.
// Inputs are read in place at any token stride (sq, sk elements between tokens; each token's heads x d block
// contiguous): q and k sliced out of a fused QKV buffer, or their gradients out of one, need no copy first.
// Outputs are contiguous (tokens, heads, d).
#include <cstring>
#include <limits>

#include "rope.h"
#include "parallel.h"

namespace fastenc_cpu {

template <bool INV>
static inline void rotate(const float* x, float* y, const float* c, const float* s, int64_t d, int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half], sn = INV ? -s[i] : s[i];
    y[i] = x1 * c[i] - x2 * sn;
    y[i + half] = x2 * c[i] + x1 * sn;
  }
  if (2 * half < d) std::memcpy(y + 2 * half, x + 2 * half, sizeof(float) * (d - 2 * half));
}

template <bool INV>
static int64_t rope_apply(const float* q, const float* k, float* qo, float* ko, const float* cos, const float* sin,
                          const int32_t* pos, int64_t tokens, int64_t hq, int64_t hk, int64_t d, int64_t half,
                          int64_t npos, int64_t sq, int64_t sk) {
  int64_t bad = 0;
  const bool parallel = worth_parallel(tokens * (hq + hk) * d, kParallelMinElems);
#pragma omp parallel for schedule(static) reduction(+ : bad) if (parallel)
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = pos[t];  // read once, checked before it indexes the table
    if (p < 0 || p >= npos) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (int64_t i = 0; i < hq * d; ++i) qo[t * hq * d + i] = nan;
      for (int64_t i = 0; i < hk * d; ++i) ko[t * hk * d + i] = nan;
      ++bad;
      continue;
    }
    const float* c = cos + p * half;
    const float* s = sin + p * half;
    for (int64_t h = 0; h < hq; ++h) rotate<INV>(q + t * sq + h * d, qo + (t * hq + h) * d, c, s, d, half);
    for (int64_t h = 0; h < hk; ++h) rotate<INV>(k + t * sk + h * d, ko + (t * hk + h) * d, c, s, d, half);
  }
  return bad;
}

int64_t rope_fwd(const float* q, const float* k, float* qo, float* ko, const float* cos, const float* sin,
                 const int32_t* pos, int64_t tokens, int64_t hq, int64_t hk, int64_t d, int64_t half, int64_t npos,
                 bool inverse, int64_t sq, int64_t sk) {
  return inverse ? rope_apply<true>(q, k, qo, ko, cos, sin, pos, tokens, hq, hk, d, half, npos, sq, sk)
                 : rope_apply<false>(q, k, qo, ko, cos, sin, pos, tokens, hq, hk, d, half, npos, sq, sk);
}

}  // namespace fastenc_cpu
