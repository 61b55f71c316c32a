// Raw-pointer C++/OpenMP GELU / GeGLU forward (csrc/cpu/act.cpp) and backward (csrc/cpu/act_bwd.cpp), SwiGLU both
// ways (csrc/cpu/swiglu.cpp); no torch headers. Row-major contiguous; fp32, or bf16 storage (raw bits) with fp32 math and one rounding per stored value.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// The GELU forms: exact (erf), the tanh approximation, and quick GELU x * sigmoid(1.702 x) (CLIP's quick_gelu).
enum class GeluForm : int { kErf = 0, kTanh = 1, kQuick = 2 };

// out = gelu(x + bias); x, out: rows x n (out may be x: in place); bias (n) may be null; form: which GELU.
void gelu_fwd(const float* x, const float* bias, float* out, int64_t rows, int64_t n, GeluForm form);
void gelu_fwd_bf16(const uint16_t* x, const uint16_t* bias, uint16_t* out, int64_t rows, int64_t n, GeluForm form);

// out = gelu(x[:, :n]) * x[:, n:]; x: rows x 2n, out: rows x n with rows ldo apart (ldo >= n); out may be x
// itself with ldo = 2n (in place, over the input halves).
void geglu_fwd(const float* x, float* out, int64_t rows, int64_t n, int64_t ldo, GeluForm form);
void geglu_fwd_bf16(const uint16_t* x, uint16_t* out, int64_t rows, int64_t n, int64_t ldo, GeluForm form);

// Backward of gelu_fwd: dx = grad * gelu'(x + bias); dbias (n, fp32, may be null when bias is) = sum of dx over
// rows. Backward of geglu_fwd: x rows x 2n, grad rows x n -> dx rows x 2n (input half, gate half).
// dx or dbias nullptr: that gradient is neither written nor computed (dbias needs a bias).
void gelu_bwd(const float* grad, const float* x, const float* bias, float* dx, float* dbias, int64_t rows, int64_t n,
              GeluForm form);
void gelu_bwd_bf16(const uint16_t* grad, const uint16_t* x, const uint16_t* bias, uint16_t* dx, float* dbias,
                   int64_t rows, int64_t n, GeluForm form);
void geglu_bwd(const float* grad, const float* x, float* dx, int64_t rows, int64_t n, GeluForm form);
void geglu_bwd_bf16(const uint16_t* grad, const uint16_t* x, uint16_t* dx, int64_t rows, int64_t n, GeluForm form);

// SwiGLU (csrc/cpu/swiglu.cpp): out = silu(gate) * up, gate and up rows x n with rows ldg / ldu apart (one fused
// (rows, 2n) input: gate = x, up = x + n, ldg = ldu = 2n), out rows ldo apart, overlapping neither.
void swiglu_fwd(const float* gate, const float* up, float* out, int64_t rows, int64_t n, int64_t ldg, int64_t ldu,
                int64_t ldo);
void swiglu_fwd_bf16(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t rows, int64_t n, int64_t ldg,
                     int64_t ldu, int64_t ldo);
// Backward: grad rows x n (contiguous) -> dgate = grad * up * silu'(gate), dup = grad * silu(gate), both rows ldd
// apart (the fused form: dgate = dx, dup = dx + n, ldd = 2n).
void swiglu_bwd(const float* grad, const float* gate, const float* up, float* dgate, float* dup, int64_t rows,
                int64_t n, int64_t ldg, int64_t ldu, int64_t ldd);
void swiglu_bwd_bf16(const uint16_t* grad, const uint16_t* gate, const uint16_t* up, uint16_t* dgate, uint16_t* dup,
                     int64_t rows, int64_t n, int64_t ldg, int64_t ldu, int64_t ldd);

}  // namespace fastenc_cpu
