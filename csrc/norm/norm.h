// Launchers of the LayerNorm / RMSNorm kernels (norm.cu forward, norm_bwd.cu backward).
// C-style launchers: raw device pointers, sizes, a dtype code (cuda_dtype.h) and the stream; each validates what it
// can, launches, and returns cudaGetLastError() (or an error code). Tensors contiguous row-major, "T" the tensor's
// dtype, math fp32. Included by the .cu files (nvcc, no torch) and the op's _bind.cpp (host compiler, torch).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_dtype.h"

namespace fastenc_cuda {

// LayerNorm (rms=false) or RMSNorm (rms=true) of h = x (+ residual), rows x hidden, all T.
// residual, bias, residual_out may be null; residual_out receives h (rounded to T) when residual is given,
// and the statistics are taken over that rounded h. Any hidden up to 2^30 (rows wider than the register cache take
// a three-pass kernel); any alignment (16-byte vectors only when every row start is 16-byte aligned).
// mean_out (LayerNorm) and rstd_out, fp32 (rows), may be null: a training forward writes them for the backward.
cudaError_t norm_fwd(const void* x, const void* residual, const void* weight, const void* bias, void* out,
                     void* residual_out, int64_t rows, int64_t hidden, float eps, bool rms, int dtype,
                     cudaStream_t stream, float* mean_out = nullptr, float* rstd_out = nullptr);

// LayerNorm (mean given) / RMSNorm (mean null) backward from the forward's fp32 statistics; dy, dh, h, dx: rows x
// hidden in T, w: hidden in T; dh may be null. dw_part, db_part (may be null): fp32 partial rows, one per block
// of the grid, norm_bwd_parts(rows) x hidden; the caller sums them over the first dim.
//   xhat = (h - mean) * rstd, g = w * dy;  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dh  (RMSNorm: no mean(g))
cudaError_t norm_bwd(const void* dy, const void* dh, const void* h, const void* w, const float* mean,
                     const float* rstd, void* dx, float* dw_part, float* db_part, int64_t rows, int64_t hidden,
                     int dtype, cudaStream_t stream);
int64_t norm_bwd_parts(int64_t rows);

}  // namespace fastenc_cuda
