// Branch-free fp32 exp and GELU that compilers vectorize inside `#pragma omp simd` loops (std::exp and
// std::erf are scalar library calls). Coefficients fitted for this file by Lawson-weighted least squares
// (near-minimax) against mpmath; errors below are of the fitted polynomials, evaluation adds ~1-2 ulp.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__GNUC__)
#define FASTENC_INLINE inline __attribute__((always_inline))
#else
#define FASTENC_INLINE inline
#endif

namespace fastenc_cpu {

// exp(x), relative error ~2 ulp, for x in [-87, 88] (the caller guarantees the range: no clamp).
// x = n ln2 + r, |r| <= ln2/2 (Cody-Waite split of ln2); exp(r) = 1 + r + r^2 E(r), E fitted to 3e-9;
// 2^n assembled in the exponent bits. Rounding to n uses the 1.5*2^23 trick (no rint call).
FASTENC_INLINE float fm_exp_core(float x) {
  const float shifter = 12582912.0f;  // 1.5 * 2^23
  const float nf = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = (x - nf * 0.693145751953125f) - nf * 1.42860682030941723e-6f;
  float e = 1.381459303e-03f;
  e = e * r + 8.368708362e-03f;
  e = e * r + 4.166838752e-02f;
  e = e * r + 1.666652070e-01f;
  e = e * r + 4.999999345e-01f;
  const float p = 1.0f + r + r * r * e;
  const int32_t bits = ((int32_t)nf + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// exp(x) for any x: clamped to [-87, 88] first (no inf/NaN, tiny/huge finite).
FASTENC_INLINE float fm_exp(float x) {
  return fm_exp_core(x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x));
}

// Exact GELU: x * Phi(x), Phi(x) = 1 - erfc(z)/2 (x > 0) or erfc(z)/2 (x <= 0), z = |x| / sqrt 2, with
// Abramowitz & Stegun 7.1.26:  erfc(z) = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z^2),  t = 1 / (1 + p z),
// |erf error| <= 1.5e-7 (the same approximation family as PyTorch's and oneDNN's vectorized GELU). Computing
// erfc/2 directly avoids the 1 + erf cancellation for x < 0: GELU's absolute error stays below ~5e-7 on the
// whole line (relative 5e-5 for x >= -3), one division, five FMAs and one exp per element.
// z is capped at 9 (|x| > 12.7): erfc(9)/2 ~ 2e-37 is already below any float GELU difference, and the cap keeps
// exp's argument in range without the two-sided clamp, whose compares and blends cost a quarter of the time on
// AVX2 (GCC cannot turn them into min/max without -ffinite-math-only).
FASTENC_INLINE float fm_gelu_erf(float x) {
  float z = std::fabs(x) * 0.707106781186547524f;
  z = z < 9.0f ? z : 9.0f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float half_erfc = 0.5f * t * p * fm_exp_core(-z * z);
  // below -13 GELU is -0 to within 1e-37: x * 0 gives -0 there and NaN at -inf, as torch's F.gelu(-inf) (which
  // computes -inf * 0); NaN stays NaN
  return x < -13.0f ? x * 0.0f : x * (x > 0.f ? 1.0f - half_erfc : half_erfc);
}

// sigmoid(u) = 1 / (1 + e^-u) from e = exp(-|u|) in [e^-87, 1]: 1 / (1 + e) for u >= 0, e / (1 + e) below. Neither
// branch overflows or makes a denormal, so the vectorized select, which computes both, never pays the microcode
// assist a denormal costs (with exp(-u) clamped at 88, x / (1 + e^88) is a denormal for |x| < 1.9 and made the
// whole tanh / quick GELU loop ~6x slower than the exact one). Below u = -87 it gives ~e^-87 instead of a smaller
// value (callers that care return their own tail); NaN -> NaN.
FASTENC_INLINE float fm_sigmoid(float u) {
  float a = -std::fabs(u);
  a = a < -87.0f ? -87.0f : a;
  const float e = fm_exp_core(a);
  const float r = 1.0f / (1.0f + e);
  return u >= 0.0f ? r : e * r;
}

// tanh GELU: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); since 0.5 (1 + tanh u) = sigmoid(2u),
// gelu = x sigmoid(2u) (below x = -13 the result is -0; between -13 and -9.6, where sigmoid(2u) < e^-87, it is
// under 2e-37 in magnitude).
FASTENC_INLINE float fm_gelu_tanh(float x) {
  const float u2 = 1.59576912160573071f * (x + 0.044715f * x * x * x);
  return x < -13.0f ? x * 0.0f : x * fm_sigmoid(u2);  // -inf -> NaN, as torch's F.gelu
}

// x * sigmoid(k x): k = 1 is SiLU (swish), k = 1.702 quick GELU (CLIP's). Below k x = -87 the result is -0 to
// within 1e-36 (x * 0: NaN at -inf, as torch's x * sigmoid(k x)); +inf -> +inf, NaN -> NaN.
FASTENC_INLINE float fm_x_sigmoid(float x, float k) {
  const float u = k * x;
  return u < -87.0f ? x * 0.0f : x * fm_sigmoid(u);
}

FASTENC_INLINE float fm_silu(float x) { return fm_x_sigmoid(x, 1.0f); }
FASTENC_INLINE float fm_gelu_quick(float x) { return fm_x_sigmoid(x, 1.702f); }

// y = x sigmoid(k x) and its derivative d = s + k x s (1 - s), s = sigmoid(k x), from one exp. Tails: k x < -87
// gives y = x * 0, d = 0 + (x - x) (-0 and 0 there, NaN at -inf); +inf gives y = inf, d = 1 + inf * 0 = NaN, as
// torch's autograd of x * sigmoid(k x); NaN stays NaN.
FASTENC_INLINE void fm_x_sigmoid_and_grad(float x, float k, float& y, float& d) {
  const float u = k * x;
  const float s = fm_sigmoid(u);
  const bool tail = u < -87.0f;
  y = tail ? x * 0.0f : x * s;
  d = tail ? (x - x) : s + u * s * (1.0f - s);
}

}  // namespace fastenc_cpu
