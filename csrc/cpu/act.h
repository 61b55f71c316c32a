// Raw-pointer C++/OpenMP GELU / GeGLU forward (csrc/cpu/act.cpp) and backward (csrc/cpu/act_bwd.cpp); no torch
// headers. Row-major contiguous; fp32, or bf16 storage (raw bits) with fp32 math and one rounding per stored value.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// out = gelu(x + bias); x, out: rows x n (out may be x: in place); bias (n) may be null; tanh selects the tanh
// approximation.
void gelu_fwd(const float* x, const float* bias, float* out, int64_t rows, int64_t n, bool tanh_approx);
void gelu_fwd_bf16(const uint16_t* x, const uint16_t* bias, uint16_t* out, int64_t rows, int64_t n, bool tanh_approx);

// out = gelu(x[:, :n]) * x[:, n:]; x: rows x 2n, out: rows x n with rows ldo apart (ldo >= n); out may be x
// itself with ldo = 2n (in place, over the input halves).
void geglu_fwd(const float* x, float* out, int64_t rows, int64_t n, int64_t ldo, bool tanh_approx);
void geglu_fwd_bf16(const uint16_t* x, uint16_t* out, int64_t rows, int64_t n, int64_t ldo, bool tanh_approx);

// Backward of gelu_fwd: dx = grad * gelu'(x + bias); dbias (n, fp32, may be null when bias is) = sum of dx over
// rows. Backward of geglu_fwd: x rows x 2n, grad rows x n -> dx rows x 2n (input half, gate half).
// dx or dbias nullptr: that gradient is neither written nor computed (dbias needs a bias).
void gelu_bwd(const float* grad, const float* x, const float* bias, float* dx, float* dbias, int64_t rows, int64_t n,
              bool tanh_approx);
void gelu_bwd_bf16(const uint16_t* grad, const uint16_t* x, const uint16_t* bias, uint16_t* dx, float* dbias,
                   int64_t rows, int64_t n, bool tanh_approx);
void geglu_bwd(const float* grad, const float* x, float* dx, int64_t rows, int64_t n, bool tanh_approx);
void geglu_bwd_bf16(const uint16_t* grad, const uint16_t* x, uint16_t* dx, int64_t rows, int64_t n, bool tanh_approx);

}  // namespace fastenc_cpu
