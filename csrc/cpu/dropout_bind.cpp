// torch-facing wrappers of the inverted-dropout kernels (dropout.cpp) and their registration: dropout, dropout_bwd.
#include <optional>
#include <string>
#include <tuple>

#include "dropout.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;

// x (rows, n) fp32, bias (n,) fp32 or None -> (x + bias) * Z / (1 - p); grad (rows, n) -> grad * Z / (1 - p).
Tensor dropout(const Tensor& x, const OptTensor& bias, double p, int64_t seed, int64_t offset) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "dropout: x must be (rows, n) float32, got ",
              x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(!bias || (bias->numel() == x.size(1) && bias->scalar_type() == at::kFloat),
              "dropout: bias must be float32 with ", x.size(1), " elements");
  TORCH_CHECK(p > 0 && p < 1, "dropout: dropout_p must be in (0, 1), got ", p);
  Tensor xc = x.contiguous();
  OptTensor bc = bias ? OptTensor(bias->contiguous()) : std::nullopt;
  Tensor out = cpu_empty_like(xc);
  fastenc_cpu::dropout_fwd(xc.data_ptr<float>(), fptr(bc), out.data_ptr<float>(), x.size(0), x.size(1), p, seed,
                           offset);
  return out;
}

Tensor dropout_bwd(const Tensor& grad, double p, int64_t seed, int64_t offset) {
  check_cpu(grad, "grad");
  TORCH_CHECK(grad.dim() == 2 && grad.scalar_type() == at::kFloat, "dropout backward: grad must be (rows, n) "
              "float32, got ", grad.scalar_type(), " ", grad.sizes());
  TORCH_CHECK(p > 0 && p < 1, "dropout backward: dropout_p must be in (0, 1), got ", p);
  Tensor gc = grad.contiguous();
  Tensor dx = cpu_empty_like(gc);
  fastenc_cpu::dropout_bwd(gc.data_ptr<float>(), dx.data_ptr<float>(), grad.size(0), grad.size(1), p, seed, offset);
  return dx;
}

}  // namespace

FASTENC_BINDINGS(dropout) {
  m.def("dropout", &dropout, "(x + bias) * keep / (1 - p), counter-based keep-mask, fp32");
  m.def("dropout_bwd", &dropout_bwd, "dropout backward: grad * keep / (1 - p)");
}
