// torch-facing wrapper of the SPLADE max-pooled sparse kernel (sparse_max.cpp) and its registration: sparse_max.
// fp32 math; fp16 / bf16 inputs through fp32 copies. cu_seqlens is validated here, where it is read.
#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>

#include "sparse_max.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;

// weight (V, H) -> its panels (ceil(V / NW), H, NW) fp32 for sparse_max's `panels`.
Tensor sparse_max_pack(const Tensor& weight) {
  check_cpu(weight, "weight");
  TORCH_CHECK(weight.dim() == 2, "sparse_max_pack: weight must be (vocab, hidden), got ", weight.sizes());
  const int64_t V = weight.size(0), H = weight.size(1), nw = fastenc_cpu::sparse_max_panel_width();
  const Tensor wf = f32(weight);
  Tensor out = at::empty({(V + nw - 1) / nw, H, nw}, weight.options().dtype(at::kFloat));
  if (V > 0 && H > 0) fastenc_cpu::sparse_max_pack(wf.data_ptr<float>(), V, H, out.data_ptr<float>(), at::get_num_threads());
  return out;
}

// x (tokens, H), cu_seqlens int32 (batch+1,), weight (V, H), bias (V,) or None -> (batch, V) fp32. panels: weight
// packed by sparse_max_pack (read instead of packing weight in the call), or None.
Tensor sparse_max(const Tensor& x, const Tensor& cu_seqlens, const Tensor& weight, const OptTensor& bias,
                  const OptTensor& panels) {
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
  const int64_t nw = fastenc_cpu::sparse_max_panel_width();
  if (panels) {
    check_cpu(*panels, "panels");
    TORCH_CHECK(panels->scalar_type() == at::kFloat && panels->is_contiguous() && panels->dim() == 3 &&
                    panels->size(0) == (V + nw - 1) / nw && panels->size(1) == H && panels->size(2) == nw,
                "sparse_max: panels must be sparse_max_pack's (", (V + nw - 1) / nw, ", ", H, ", ", nw,
                ") float32 of the weight, got ", panels->sizes());
  }
  const Tensor xf = x.scalar_type() == at::kFloat && x.stride(1) == 1 ? x : f32(x);
  const Tensor wf = panels ? weight : f32(weight);  // (with panels the kernel never reads weight)
  const OptTensor bf = bias ? OptTensor(f32(*bias)) : std::nullopt;
  Tensor out = at::empty({batch, V}, x.options().dtype(at::kFloat));
  if (batch > 0 && V > 0)
    fastenc_cpu::sparse_max_fwd(xf.data_ptr<float>(), std::max<int64_t>(xf.stride(0), 1), H, c, batch,
                                panels ? nullptr : wf.data_ptr<float>(), V, fptr(bf), out.data_ptr<float>(),
                                at::get_num_threads(), panels ? panels->data_ptr<float>() : nullptr);
  return out;
}

}  // namespace

FASTENC_BINDINGS(sparse_max) {
  m.def("sparse_max", &sparse_max, "log1p(relu(max over each sequence's tokens of x W^T + b)): (batch, vocab) fp32",
        py::arg("x"), py::arg("cu_seqlens"), py::arg("weight"), py::arg("bias"), py::arg("panels") = py::none());
  m.def("sparse_max_pack", &sparse_max_pack, "weight (vocab, hidden) -> its panels for sparse_max(panels=)");
}
