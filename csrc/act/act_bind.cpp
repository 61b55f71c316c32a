// torch-facing wrappers of the GELU / GeGLU launchers (act.h) and their registration: gelu_cuda, geglu_cuda,
// gelu_bwd_cuda, geglu_bwd_cuda.
// Each checks device, dtype and shapes, makes inputs contiguous, allocates outputs and launches on the current
// stream of the input's device.
#include <optional>
#include <string>
#include <tuple>

#include "act.h"
#include "cuda_bind.h"

namespace {

using namespace fastenc_cuda_torch;

// "none" (exact erf), "tanh" or "quick" (x * sigmoid(1.702 x)) -> act.h's form code.
int gelu_form(const std::string& approximate, const char* op) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh" || approximate == "quick", op,
              " (cuda): approximate must be 'none', 'tanh' or 'quick', got '", approximate, "'");
  return approximate == "tanh" ? fastenc_cuda::kGeluTanh
                               : (approximate == "quick" ? fastenc_cuda::kGeluQuick : fastenc_cuda::kGeluErf);
}

Tensor gelu_cuda(const Tensor& x, const OptTensor& bias, const std::string& approximate) {
  check_on(x, x, "gelu", "x");
  TORCH_CHECK(x.dim() == 2, "gelu (cuda): x must be (rows, n), got shape ", x.sizes());
  const int dt = cuda_dtype(x, "gelu", "x");
  const int form = gelu_form(approximate, "gelu");
  if (bias.has_value()) {
    check_on(*bias, x, "gelu", "bias");
    TORCH_CHECK(bias->numel() == x.size(1), "gelu (cuda): bias must have ", x.size(1), " elements, got ", bias->numel());
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous();
  const OptTensor bc = bias.has_value() ? OptTensor(bias->to(x.scalar_type()).contiguous()) : std::nullopt;
  Tensor y = at::empty_like(xc);
  check_launch(fastenc_cuda::gelu_fwd(xc.data_ptr(), ptr_or_null(bc), y.data_ptr(), x.size(0), x.size(1), form,
                                      dt, c10::cuda::getCurrentCUDAStream()),
               "gelu");
  return y;
}

Tensor geglu_cuda(const Tensor& x, const std::string& approximate) {
  check_on(x, x, "geglu", "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "geglu (cuda): x must be (rows, 2n), got shape ", x.sizes());
  const int dt = cuda_dtype(x, "geglu", "x");
  const int form = gelu_form(approximate, "geglu");
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous();
  const int64_t n = x.size(1) / 2;
  Tensor y = at::empty({x.size(0), n}, xc.options());
  check_launch(fastenc_cuda::geglu_fwd(xc.data_ptr(), y.data_ptr(), x.size(0), n, form, dt,
                                       c10::cuda::getCurrentCUDAStream()),
               "geglu");
  return y;
}

// gelu backward: (dx, dbias); dbias = dx summed over rows in fp32 (empty without bias, or when !need_dbias); dx
// empty when !need_dx (the kernel still writes it as the sum's input when dbias is needed).
std::tuple<Tensor, Tensor> gelu_bwd_cuda(const Tensor& grad, const Tensor& x, const OptTensor& bias,
                                         const std::string& approximate, bool need_dx, bool need_dbias) {
  check_on(x, x, "gelu", "x");
  check_on(grad, x, "gelu", "grad");
  const int dt = cuda_dtype(x, "gelu", "x");
  const int form = gelu_form(approximate, "gelu");
  TORCH_CHECK(x.dim() == 2 && grad.sizes() == x.sizes() && grad.scalar_type() == x.scalar_type(),
              "gelu backward (cuda): grad must match x (", x.sizes(), ", ", x.scalar_type(), "), got (", grad.sizes(),
              ", ", grad.scalar_type(), ")");
  if (bias.has_value()) {
    check_on(*bias, x, "gelu", "bias");
    TORCH_CHECK(bias->numel() == x.size(1), "gelu (cuda): bias must have ", x.size(1), " elements, got ", bias->numel());
  }
  if (!need_dx && !(need_dbias && bias.has_value())) return {at::empty({0}, x.options()), at::empty({0}, x.options())};
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous(), gc = grad.contiguous();
  const OptTensor bc = bias.has_value() ? OptTensor(bias->to(x.scalar_type()).contiguous()) : std::nullopt;
  Tensor dx = at::empty_like(xc);
  check_launch(fastenc_cuda::gelu_bwd(gc.data_ptr(), xc.data_ptr(), ptr_or_null(bc), dx.data_ptr(), x.size(0),
                                      x.size(1), form, dt, c10::cuda::getCurrentCUDAStream()),
               "gelu backward");
  Tensor db = bias.has_value() && need_dbias ? dx.sum(0, false, at::kFloat).to(x.scalar_type())
                                            : at::empty({0}, x.options());
  return {need_dx ? dx : at::empty({0}, x.options()), db};
}

Tensor geglu_bwd_cuda(const Tensor& grad, const Tensor& x, const std::string& approximate) {
  check_on(x, x, "geglu", "x");
  check_on(grad, x, "geglu", "grad");
  const int dt = cuda_dtype(x, "geglu", "x");
  const int form = gelu_form(approximate, "geglu");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0 && grad.dim() == 2 && grad.size(0) == x.size(0) &&
                  2 * grad.size(1) == x.size(1) && grad.scalar_type() == x.scalar_type(),
              "geglu backward (cuda): grad must be (rows, n) of x's dtype for x (rows, 2n), got ", grad.sizes(), " ",
              grad.scalar_type(), " for ", x.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous(), gc = grad.contiguous();
  Tensor dx = at::empty_like(xc);
  check_launch(fastenc_cuda::geglu_bwd(gc.data_ptr(), xc.data_ptr(), dx.data_ptr(), x.size(0), x.size(1) / 2,
                                       form, dt, c10::cuda::getCurrentCUDAStream()),
               "geglu backward");
  return dx;
}

}  // namespace

FASTENC_BINDINGS(act_cuda) {
  m.def("gelu_cuda", &gelu_cuda, "gelu(x + bias), CUDA kernel");
  m.def("geglu_cuda", &geglu_cuda, "gelu(x[:, :n]) * x[:, n:], CUDA kernel");
  m.def("gelu_bwd_cuda", &gelu_bwd_cuda, "gelu backward: (dx, dbias), CUDA kernel");
  m.def("geglu_bwd_cuda", &geglu_bwd_cuda, "geglu backward: [d input | d gate], CUDA kernel");
}
