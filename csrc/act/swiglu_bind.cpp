// torch-facing wrappers of the SwiGLU launchers (act.h, swiglu.cu) and their registration: swiglu_cuda and
// swiglu_bwd_cuda. Two input forms: x (rows, 2n) = [gate | up] with up absent, or gate x (rows, n) and up (rows, n).
// Each checks device, dtype and shapes, makes inputs contiguous, allocates outputs and launches on the current
// stream of the input's device.
#include <optional>
#include <tuple>

#include "act.h"
#include "cuda_bind.h"

namespace {

using namespace fastenc_cuda_torch;

// Checks x (and up) and returns n, the width of gate and of up.
int64_t checked_width(const Tensor& x, const OptTensor& up, const char* what) {
  check_on(x, x, "swiglu", "x");
  if (!up.has_value()) {
    TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "swiglu", what, " (cuda): x must be (rows, 2n), got shape ",
                x.sizes());
    return x.size(1) / 2;
  }
  check_on(*up, x, "swiglu", "up");
  TORCH_CHECK(x.dim() == 2 && up->sizes() == x.sizes() && up->scalar_type() == x.scalar_type(), "swiglu", what,
              " (cuda): up must match gate (", x.sizes(), ", ", x.scalar_type(), "), got (", up->sizes(), ", ",
              up->scalar_type(), ")");
  return x.size(1);
}

// -> silu(gate) * up, (rows, n) in x's dtype.
Tensor swiglu_cuda(const Tensor& x, const OptTensor& up) {
  const int64_t n = checked_width(x, up, "");
  const int dt = cuda_dtype(x, "swiglu", "x");
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous();
  const Tensor uc = up ? up->contiguous() : xc;
  const int64_t ld = xc.size(1);
  const char* up_ptr = static_cast<const char*>(uc.data_ptr()) + (up ? 0 : n * xc.element_size());
  Tensor y = at::empty({x.size(0), n}, xc.options());
  check_launch(fastenc_cuda::swiglu_fwd(xc.data_ptr(), up_ptr, y.data_ptr(), x.size(0), n, ld, ld, dt,
                                        c10::cuda::getCurrentCUDAStream()),
               "swiglu");
  return y;
}

// grad (rows, n) -> fused: (dx (rows, 2n) = [d gate | d up], empty); separate: (d gate, d up), each (rows, n).
std::tuple<Tensor, Tensor> swiglu_bwd_cuda(const Tensor& grad, const Tensor& x, const OptTensor& up) {
  const int64_t n = checked_width(x, up, " backward");
  check_on(grad, x, "swiglu", "grad");
  const int dt = cuda_dtype(x, "swiglu", "x");
  TORCH_CHECK(grad.dim() == 2 && grad.size(0) == x.size(0) && grad.size(1) == n && grad.scalar_type() == x.scalar_type(),
              "swiglu backward (cuda): grad must be (", x.size(0), ", ", n, ") of x's dtype, got ", grad.sizes(), " ",
              grad.scalar_type());
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous(), gc = grad.contiguous();
  const Tensor uc = up ? up->contiguous() : xc;
  const int64_t ld = xc.size(1), es = xc.element_size();
  const char* up_ptr = static_cast<const char*>(uc.data_ptr()) + (up ? 0 : n * es);
  Tensor dgate = at::empty_like(xc);  // fused: the whole (rows, 2n) gradient, d up its second half
  Tensor dup = up ? at::empty_like(uc) : at::empty({0}, x.options());
  void* dup_ptr = up ? dup.data_ptr() : static_cast<void*>(static_cast<char*>(dgate.data_ptr()) + n * es);
  check_launch(fastenc_cuda::swiglu_bwd(gc.data_ptr(), xc.data_ptr(), up_ptr, dgate.data_ptr(), dup_ptr, x.size(0), n,
                                        ld, ld, ld, dt, c10::cuda::getCurrentCUDAStream()),
               "swiglu backward");
  return {dgate, dup};
}

}  // namespace

FASTENC_BINDINGS(swiglu_cuda) {
  m.def("swiglu_cuda", &swiglu_cuda, "silu(gate) * up: x = [gate | up] (up None), or gate x and up; CUDA kernel");
  m.def("swiglu_bwd_cuda", &swiglu_bwd_cuda, "swiglu backward: ([d gate | d up], empty) or (d gate, d up); CUDA kernel");
}
