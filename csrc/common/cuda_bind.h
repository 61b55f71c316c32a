// What the cuda half's binding files (csrc/<op>/<op>_bind.cpp) share: the dtype code of a tensor, the device
// check (naming the argument), and a launch error turned into a RuntimeError. Host compiler, torch headers; the
// cuda half only (with -DFASTENC_WITH_CUDA). c10's stream/guard headers (what at::cuda::getCurrentCUDAStream
// forwards to) need no cuBLAS/cuSPARSE headers, so the binding files also syntax-check against a CPU-only torch
// (tests/build/test_nvcc.py).
#pragma once
#ifndef FASTENC_WITH_CUDA
#error "the csrc/<op>/*_bind.cpp files belong to the cuda half: compile them with -DFASTENC_WITH_CUDA"
#endif

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <optional>

#include "cuda_dtype.h"
#include "op_registry.h"

namespace fastenc_cuda_torch {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

inline int cuda_dtype(const Tensor& t, const char* op, const char* name, bool half_only = false) {
  switch (t.scalar_type()) {
    case at::kFloat:
      if (!half_only) return fastenc_cuda::kF32;
      break;
    case at::kHalf: return fastenc_cuda::kF16;
    case at::kBFloat16: return fastenc_cuda::kBF16;
    default: break;
  }
  TORCH_CHECK(false, op, " (cuda): ", name, " must be ", half_only ? "float16 or bfloat16" : "float32, float16 or bfloat16",
              ", got ", t.scalar_type());
  return -1;
}

inline void check_on(const Tensor& t, const Tensor& like, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda(), op, " (cuda): ", name, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.device() == like.device(), op, " (cuda): ", name, " must be on ", like.device(), ", got ",
              t.device());
}

inline void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " (cuda): kernel launch failed: ", cudaGetErrorString(err));
}

inline const void* ptr_or_null(const OptTensor& t) { return t.has_value() ? t->data_ptr() : nullptr; }

}  // namespace fastenc_cuda_torch
