// Launchers of the GELU / GeGLU kernels (act.cu) and the SwiGLU kernels (swiglu.cu), forward and backward.
// C-style launchers: raw device pointers, sizes, a dtype code (cuda_dtype.h) and the stream; each validates what it
// can, launches, and returns cudaGetLastError() (or an error code). Tensors contiguous row-major, "T" the tensor's
// dtype, math fp32. Included by the .cu files (nvcc, no torch) and the op's _bind.cpp (host compiler, torch).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_dtype.h"

namespace fastenc_cuda {

// The GELU forms (the `form` argument): exact (erf), the tanh approximation, quick GELU x * sigmoid(1.702 x).
constexpr int kGeluErf = 0, kGeluTanh = 1, kGeluQuick = 2;

// out = gelu(x + bias): x, out rows x n; bias (n) may be null; form: kGeluErf | kGeluTanh | kGeluQuick.
cudaError_t gelu_fwd(const void* x, const void* bias, void* out, int64_t rows, int64_t n, int form,
                     int dtype, cudaStream_t stream);

// out = gelu(x[:, :n]) * x[:, n:]: x rows x 2n, out rows x n.
cudaError_t geglu_fwd(const void* x, void* out, int64_t rows, int64_t n, int form, int dtype,
                      cudaStream_t stream);

// Backward of gelu_fwd: dx = grad * gelu'(x + bias) (grad, x, dx rows x n; bias may be null).
cudaError_t gelu_bwd(const void* grad, const void* x, const void* bias, void* dx, int64_t rows, int64_t n,
                     int form, int dtype, cudaStream_t stream);

// Backward of geglu_fwd: grad rows x n, x rows x 2n -> dx rows x 2n ([d input | d gate]).
cudaError_t geglu_bwd(const void* grad, const void* x, void* dx, int64_t rows, int64_t n, int form,
                      int dtype, cudaStream_t stream);

// SwiGLU: out = silu(gate) * up; gate and up rows x n with rows ldg / ldu elements apart (the halves of one fused
// rows x 2n input: up = gate + n, ldg = ldu = 2n), out rows x n contiguous.
cudaError_t swiglu_fwd(const void* gate, const void* up, void* out, int64_t rows, int64_t n, int64_t ldg, int64_t ldu,
                       int dtype, cudaStream_t stream);

// Backward of swiglu_fwd: grad rows x n contiguous -> dgate = grad * up * silu'(gate), dup = grad * silu(gate), both
// rows ldd apart (the fused form: dup = dgate + n, ldd = 2n).
cudaError_t swiglu_bwd(const void* grad, const void* gate, const void* up, void* dgate, void* dup, int64_t rows,
                       int64_t n, int64_t ldg, int64_t ldu, int64_t ldd, int dtype, cudaStream_t stream);

}  // namespace fastenc_cuda
