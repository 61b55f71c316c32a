// Launcher of the LoRA merge kernel (merge_lora.cu).
// C-style launchers: raw device pointers, sizes, a dtype code (cuda_dtype.h) and the stream; each validates what it
// can, launches, and returns cudaGetLastError() (or an error code). Tensors contiguous row-major, "T" the tensor's
// dtype, math fp32. Included by the .cu files (nvcc, no torch) and the op's _bind.cpp (host compiler, torch).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_dtype.h"

namespace fastenc_cuda {

// out = weight + scale * lora_b @ lora_a: weight, out (n_out x n_in) in T; lora_a (rank x n_in) and
// lora_b (n_out x rank) in fp32. out may alias weight (in-place merge).
cudaError_t merge_lora_fwd(const void* weight, const float* lora_a, const float* lora_b, void* out, float scale,
                           int64_t n_out, int64_t n_in, int64_t rank, int dtype, cudaStream_t stream);

}  // namespace fastenc_cuda
