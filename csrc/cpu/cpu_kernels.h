// Raw-pointer C++/OpenMP CPU kernels (no torch headers). All tensors are contiguous row-major fp32;
// bindings.cpp upcasts fp16/bf16 inputs and rounds outputs back. Nullable pointers are marked.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// LayerNorm (rms=false) or RMSNorm (rms=true) of h = x (+ xbias) (+ residual) over rows x hidden; xbias (hidden)
// is the preceding linear's bias. residual, xbias, bias, residual_out may be null; residual_out receives h.
// mean_out, rstd_out (rows, fp32; null when not wanted; mean_out unused for RMSNorm): the per-row statistics.
void norm_fwd(const float* x, const float* residual, const float* xbias, const float* weight, const float* bias,
              float* out, float* residual_out, int64_t rows, int64_t hidden, float eps, bool rms,
              float* mean_out = nullptr, float* rstd_out = nullptr);

// out = gelu(x + bias); x, out: rows x n (out may be x: in place); bias (n) may be null; tanh selects the tanh
// approximation.
void gelu_fwd(const float* x, const float* bias, float* out, int64_t rows, int64_t n, bool tanh_approx);

// out = gelu(x[:, :n]) * x[:, n:]; x: rows x 2n, out: rows x n with rows ldo apart (ldo >= n); out may be x
// itself with ldo = 2n (in place, over the input halves).
void geglu_fwd(const float* x, float* out, int64_t rows, int64_t n, int64_t ldo, bool tanh_approx);

// Rotate-half RoPE. q: tokens x hq x d, k: tokens x hk x d; cos/sin: npos x half (rotary dim 2*half <= d);
// pos: tokens (int32). Writes qo, ko (same shapes); dims past 2*half are copied. inverse rotates by -angle (the
// backward). Returns how many tokens have a position outside [0, npos) (their rows are NaN; the table is not read).
int64_t rope_fwd(const float* q, const float* k, float* qo, float* ko, const float* cos, const float* sin,
                 const int32_t* pos, int64_t tokens, int64_t hq, int64_t hk, int64_t d, int64_t half, int64_t npos,
                 bool inverse, int64_t sq, int64_t sk);  // sq, sk: q's and k's token strides (outputs contiguous)

// Backward of gelu_fwd: dx = grad * gelu'(x + bias); dbias (n, fp32, may be null when bias is) = sum of dx over
// rows. Backward of geglu_fwd: x rows x 2n, grad rows x n -> dx rows x 2n (input half, gate half).
// dx or dbias nullptr: that gradient is neither written nor computed (dbias needs a bias).
void gelu_bwd(const float* grad, const float* x, const float* bias, float* dx, float* dbias, int64_t rows, int64_t n,
              bool tanh_approx);
void gelu_bwd_bf16(const uint16_t* grad, const uint16_t* x, const uint16_t* bias, uint16_t* dx, float* dbias,
                   int64_t rows, int64_t n, bool tanh_approx);
void geglu_bwd(const float* grad, const float* x, float* dx, int64_t rows, int64_t n, bool tanh_approx);
void geglu_bwd_bf16(const uint16_t* grad, const uint16_t* x, uint16_t* dx, int64_t rows, int64_t n, bool tanh_approx);

// bf16 storage variants (raw bits) of the three above: fp32 math, one rounding per stored value; h = x + xb + r is
// rounded to bf16 and normalized from the rounded value.
void norm_fwd_bf16(const uint16_t* x, const uint16_t* residual, const uint16_t* xbias, const uint16_t* weight,
                   const uint16_t* bias, uint16_t* out, uint16_t* residual_out, int64_t rows, int64_t hidden,
                   float eps, bool rms, float* mean_out = nullptr, float* rstd_out = nullptr);
void gelu_fwd_bf16(const uint16_t* x, const uint16_t* bias, uint16_t* out, int64_t rows, int64_t n, bool tanh_approx);
void geglu_fwd_bf16(const uint16_t* x, uint16_t* out, int64_t rows, int64_t n, int64_t ldo, bool tanh_approx);

// Inverted dropout (csrc/cpu/dropout.cpp): out = (x + bias) * Z / (1 - p), Z the counter-based keep-mask of (seed,
// offset) (fastenc/reference/dropout.py); x, out: rows x n (out may be x); bias (n) may be null; 0 < p < 1.
void dropout_fwd(const float* x, const float* bias, float* out, int64_t rows, int64_t n, double p, int64_t seed,
                 int64_t offset);
// Its backward: dx = grad * Z / (1 - p) (dx may be grad).
void dropout_bwd(const float* grad, float* dx, int64_t rows, int64_t n, double p, int64_t seed, int64_t offset);

}  // namespace fastenc_cpu
