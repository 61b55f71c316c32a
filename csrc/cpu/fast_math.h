// Branch-free fp32 exp and normal CDF that compilers vectorize inside `#pragma omp simd` loops (std::exp and
// std::erf are scalar library calls). Coefficients fitted for this file by Lawson-weighted least squares
// (near-minimax) against mpmath; errors below are of the fitted polynomials, evaluation adds ~1-2 ulp.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__GNUC__)
#define FASTENC_INLINE inline __attribute__((always_inline))
#else
#define FASTENC_INLINE inline
#endif

namespace fastenc_cpu {

// exp(x), relative error ~2 ulp for x in [-87, 88]; clamped outside (no inf/NaN, tiny/huge finite).
// x = n ln2 + r, |r| <= ln2/2 (Cody-Waite split of ln2); exp(r) = 1 + r + r^2 E(r), E fitted to 3e-9;
// 2^n assembled in the exponent bits. Rounding to n uses the 1.5*2^23 trick (no rint call).
FASTENC_INLINE float fm_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
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

// exp(hi + lo) for a large exact `hi` and a moderate `lo` (|lo| <~ 4): the reduction r = (hi - n ln2_hi) + lo
// - n ln2_lo keeps hi's bits (hi - n*ln2_hi is exact when hi is a product of two 12-bit numbers, as below),
// so the result is accurate relative to exp(hi + lo) even when hi + lo itself is not representable.
// Arguments below -87 give 0.
FASTENC_INLINE float fm_exp_hl(float hi, float lo) {
  const float sum = hi + lo;
  const float x = sum < -87.0f ? -87.0f : (sum > 88.0f ? 88.0f : sum);
  const float shifter = 12582912.0f;
  const float nf = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = ((hi - nf * 0.693145751953125f) + lo) - nf * 1.42860682030941723e-6f;
  float e = 1.381459303e-03f;
  e = e * r + 8.368708362e-03f;
  e = e * r + 4.166838752e-02f;
  e = e * r + 1.666652070e-01f;
  e = e * r + 4.999999345e-01f;
  const float p = 1.0f + r + r * r * e;
  const int32_t bits = ((int32_t)nf + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return sum < -87.0f ? 0.0f : p * scale;
}

// v = v_hi + v_lo with v_hi holding the top 12 significant bits, so v_hi * v_hi is exact in fp32.
FASTENC_INLINE void fm_split12(float v, float& hi, float& lo) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof(b));
  b &= 0xFFFFF000u;
  std::memcpy(&hi, &b, sizeof(hi));
  lo = v - hi;
}

// Phi(x) = 0.5 * (1 + erf(x / sqrt 2)) = 1 - erfc(t)/2 (x > 0) or erfc(t)/2 (x <= 0), t = |x|/sqrt 2, with one
// branch-free formula on the whole line:  erfc(t) = exp(-t^2 + C(u)),  u = (t - 2.25) / 2.25, t clamped to 4.5
// inside C (C: degree 12 fit of log erfc(t) + t^2 on [0, 4.5], absolute error 8.8e-9, i.e. erfc to 8.8e-9
// relative). t^2 = x^2/2 is split exactly from x itself (not from the rounded x/sqrt 2), so the left tail keeps
// its relative accuracy (no 1 + erf cancellation) and Phi near 0.5 has no cancellation either.
FASTENC_INLINE float fm_normal_cdf(float x) {
  float ax = x < 0.f ? -x : x;
  ax = ax > 14.0f ? 14.0f : ax;
  float hi, lo;
  fm_split12(ax, hi, lo);
  float t = ax * 0.707106781186547524f;
  t = t > 4.5f ? 4.5f : t;
  const float u = (t - 2.25f) * 0.444444444444444444f;
  float c = -1.512296393e-04f;
  c = c * u + 3.718285380e-04f;
  c = c * u - 1.984209333e-04f;
  c = c * u - 3.011070952e-04f;
  c = c * u + 1.354242249e-03f;
  c = c * u - 4.739705881e-03f;
  c = c * u + 1.331052171e-02f;
  c = c * u - 3.202418391e-02f;
  c = c * u + 7.102779817e-02f;
  c = c * u - 1.516348021e-01f;
  c = c * u + 3.297328318e-01f;
  c = c * u - 8.615561901e-01f;
  c = c * u - 1.464959895e+00f;
  const float half_erfc = 0.5f * fm_exp_hl(-0.5f * (hi * hi), c - 0.5f * ((2.0f * hi + lo) * lo));
  return x > 0.f ? 1.0f - half_erfc : half_erfc;
}

// Exact GELU: x * Phi(x).
FASTENC_INLINE float fm_gelu_erf(float x) { return x * fm_normal_cdf(x); }

// tanh GELU: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); since 0.5 (1 + tanh u) = 1 / (1 + e^{-2u}),
// gelu = x / (1 + exp(-2u)) (fm_exp clamps, so very negative x gives x / 1.6e38 ~ -0).
FASTENC_INLINE float fm_gelu_tanh(float x) {
  const float u2 = 1.59576912160573071f * (x + 0.044715f * x * x * x);
  return x / (1.0f + fm_exp(-u2));
}

}  // namespace fastenc_cpu
