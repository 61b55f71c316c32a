// Launcher of the rotate-half RoPE kernel (rope.cu), forward and inverse (backward).
// C-style launchers: raw device pointers, sizes, a dtype code (cuda_dtype.h) and the stream; each validates what it
// can, launches, and returns cudaGetLastError() (or an error code). Tensors contiguous row-major, "T" the tensor's
// dtype, math fp32. Included by the .cu files (nvcc, no torch) and the op's _bind.cpp (host compiler, torch).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_dtype.h"

namespace fastenc_cuda {

// Rotate-half RoPE. q: tokens x hq x d, k: tokens x hk x d (T); cos/sin: fp32 npos x half (2*half <= d);
// pos: int32 tokens. Writes qo, ko (same shapes as q, k); dims past 2*half are copied. inverse: rotate by -angle
// (the backward). A token whose position is outside [0, npos) gets NaN rows (the table is never read out of bounds).
cudaError_t rope_fwd(const void* q, const void* k, void* qo, void* ko, const float* cos, const float* sin,
                     const int32_t* pos, int64_t tokens, int64_t hq, int64_t hk, int64_t d, int64_t half,
                     int64_t npos, bool inverse, int dtype, cudaStream_t stream);

}  // namespace fastenc_cuda
