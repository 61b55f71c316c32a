// torch-facing wrappers of the packed-panel GEMM (gemm.cpp) and their registration: gemm_pack, gemm_packed.
#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>

#include "gemm.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;

// gemm_pack: w (n, k) fp32 -> its panels (csrc/cpu/gemm.cpp). gemm_packed: x (m, k) fp32 (unit column stride) times
// the packed W^T (+ bias (n,)) -> out (m, n) (unit column stride; a new tensor when not given), out += when accumulate;
// gelu ("none": exact, "tanh") applied last when given (the MLP's first projection), None for no activation.
Tensor gemm_pack(const Tensor& w) {
  check_cpu(w, "weight");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "gemm_pack: weight must be 2-D float32, got ",
              w.scalar_type(), " ", w.sizes());
  const Tensor wc = w.contiguous();
  const int64_t n = w.size(0), k = w.size(1), nw = fastenc_cpu::gemm_panel_width();
  Tensor out = at::empty({(n + nw - 1) / nw, k, nw}, wc.options());
  fastenc_cpu::gemm_pack(wc.data_ptr<float>(), n, k, out.data_ptr<float>());
  return out;
}

Tensor gemm_packed(const Tensor& x, const Tensor& packed, int64_t n, const OptTensor& bias, const OptTensor& out,
                   bool accumulate, const std::optional<std::string>& gelu) {
  check_cpu(x, "x");
  check_cpu(packed, "packed");
  const int64_t nw = fastenc_cpu::gemm_panel_width();
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && (x.stride(1) == 1 || x.size(1) <= 1),
              "gemm_packed: x must be 2-D float32 with unit column stride, got ", x.scalar_type(), " ", x.sizes());
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(0) == (n + nw - 1) / nw && packed.size(1) == k && packed.size(2) == nw,
              "gemm_packed: packed must be gemm_pack's (", (n + nw - 1) / nw, ", ", k, ", ", nw, ") float32, got ",
              packed.sizes());
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n),
              "gemm_packed: bias must be (", n, ",) float32");
  TORCH_CHECK(!accumulate || out, "gemm_packed: accumulate needs out");
  TORCH_CHECK(!gelu || *gelu == "none" || *gelu == "tanh", "gemm_packed: gelu must be None, 'none' or 'tanh', got '",
              gelu ? *gelu : "", "'");
  const auto act = !gelu ? fastenc_cpu::GemmActivation::kNone
                         : (*gelu == "tanh" ? fastenc_cpu::GemmActivation::kGeluTanh : fastenc_cpu::GemmActivation::kGelu);
  if (out) {
    check_cpu(*out, "out");
    TORCH_CHECK(out->scalar_type() == at::kFloat && out->dim() == 2 && out->size(0) == m && out->size(1) == n &&
                    (out->stride(1) == 1 || n <= 1) && (out->stride(0) >= n || m <= 1),
                "gemm_packed: out must be (", m, ", ", n, ") float32 with unit column stride, got ", out->sizes());
  }
  Tensor y = out ? *out : cpu_empty({m, n}, x.options());
  const Tensor bc = bias ? bias->contiguous() : Tensor();
  if (m > 0 && n > 0)
    fastenc_cpu::gemm_packed(x.data_ptr<float>(), m, k, std::max<int64_t>(x.stride(0), 1), packed.data_ptr<float>(),
                             n, bias ? bc.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                             std::max<int64_t>(y.stride(0), 1), accumulate, at::get_num_threads(), act);
  return y;
}

}  // namespace

FASTENC_BINDINGS(gemm) {
  m.def("gemm_pack", &gemm_pack, "weight (n, k) fp32 -> the panel GEMM's packed panels");
  m.def("gemm_packed", &gemm_packed, "x @ W^T (+ bias) (+ out) (then gelu) with W packed by gemm_pack, fp32");
}
