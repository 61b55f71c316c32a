// torch-facing wrapper of the SPLADE max-pooled sparse kernel (sparse_max.cpp) and its registration: sparse_max.
// fp32 math; fp16 / bf16 inputs through fp32 copies. cu_seqlens is validated here, where it is read.
#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>

#include "sparse_max.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;

// x (tokens, H), cu_seqlens int32 (batch+1,), weight (V, H), bias (V,) or None -> (batch, V) fp32.
Tensor sparse_max(const Tensor& x, const Tensor& cu_seqlens, const Tensor& weight, const OptTensor& bias) {
  check_cpu(x, "x");
  check_cpu(weight, "weight");
  check_cpu(cu_seqlens, "cu_seqlens");
  TORCH_CHECK(x.dim() == 2, "sparse_max: x must be (tokens, hidden), got ", x.sizes());
  const int64_t tokens = x.size(0), H = x.size(1);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == H, "sparse_max: weight must be (vocab, ", H, "), got ",
              weight.sizes());
  const int64_t V = weight.size(0);
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == V), "sparse_max: bias must be (", V, ",)");
  if (bias) check_cpu(*bias, "bias");
  TORCH_CHECK(cu_seqlens.scalar_type() == at::kInt, "sparse_max: cu_seqlens must be int32, got ",
              cu_seqlens.scalar_type());
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 2, "sparse_max: cu_seqlens must be 1-D of length batch+1 "
              ">= 2, got ", cu_seqlens.sizes());
  const Tensor cu = cu_seqlens.contiguous();
  const int32_t* c = cu.data_ptr<int32_t>();
  const int64_t batch = cu.size(0) - 1;
  // Memory safety first: every row the kernel reads lies in x.
  TORCH_CHECK(c[0] >= 0, "sparse_max: cu_seqlens must start at >= 0, got ", c[0]);
  for (int64_t s = 0; s < batch; ++s)
    TORCH_CHECK(c[s + 1] >= c[s], "sparse_max: cu_seqlens must be non-decreasing, got ", c[s], " then ", c[s + 1],
                " at ", s);
  TORCH_CHECK(c[batch] <= tokens, "sparse_max: cu_seqlens must end within x's ", tokens, " rows, got ", c[batch]);
  const Tensor xf = x.scalar_type() == at::kFloat && x.stride(1) == 1 ? x : f32(x);
  const Tensor wf = f32(weight);
  const OptTensor bf = bias ? OptTensor(f32(*bias)) : std::nullopt;
  Tensor out = at::empty({batch, V}, x.options().dtype(at::kFloat));
  if (batch > 0 && V > 0)
    fastenc_cpu::sparse_max_fwd(xf.data_ptr<float>(), std::max<int64_t>(xf.stride(0), 1), H, c, batch,
                                wf.data_ptr<float>(), V, fptr(bf), out.data_ptr<float>(), at::get_num_threads());
  return out;
}

}  // namespace

FASTENC_BINDINGS(sparse_max) {
  m.def("sparse_max", &sparse_max, "log1p(relu(max over each sequence's tokens of x W^T + b)): (batch, vocab) fp32");
}
