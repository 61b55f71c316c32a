// What the cpu half's binding files (csrc/cpu/*_bind.cpp) share: outputs from the CPU buffer cache (cpu_empty,
// defined with the cache in bindings.cpp), the device check, and the fp32 / bf16 views the raw-pointer kernels
// take (namespace fastenc_torch, apart from the kernels' fastenc_cpu). Inputs were validated by fastenc.ops; the
// wrappers re-check what would corrupt memory.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>

#include "op_registry.h"

namespace fastenc_torch {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// An uninitialized CPU tensor from the buffer cache (plain at::empty when the cache is off or the block small).
Tensor cpu_empty(at::IntArrayRef sizes, const at::TensorOptions& opts);
inline Tensor cpu_empty_like(const Tensor& t) { return cpu_empty(t.sizes(), t.options()); }

// fp32 contiguous copy (or the tensor itself when already fp32 contiguous) for the fp32 CPU kernels.
inline Tensor f32(const Tensor& t) { return t.to(at::kFloat).contiguous(); }
inline const float* fptr(const OptTensor& t) { return t.has_value() ? t->data_ptr<float>() : nullptr; }

inline void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "fastenc cpu backend: ", name, " must be a CPU tensor, got ", t.device());
}

inline bool all_bf16(std::initializer_list<Tensor> ts) {
  for (const auto& t : ts)
    if (t.scalar_type() != at::kBFloat16) return false;
  return true;
}
// bf16 tensors as raw bits for the bf16-storage kernels; contiguous tensors only.
inline uint16_t* bptr(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }
inline uint16_t* bptr(const OptTensor& t) { return t.has_value() ? bptr(*t) : nullptr; }

}  // namespace fastenc_torch
