// torch-facing wrappers of the SwiGLU kernels (swiglu.cpp) and their registration: swiglu and swiglu_bwd. Two input
// forms: x (rows, 2n) = [gate | up] with up absent, or gate x (rows, n) and up (rows, n). fp32 or bf16 end to end;
// fp16 (or mixed) through fp32 copies.
#include <optional>
#include <tuple>

#include "act.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;

// Rows, width n and the row strides of gate and up: the halves of a fused x, or two separate (rows, n) tensors.
struct Halves {
  int64_t rows, n, ld;
  int64_t up_offset;  // elements from the start of gate's tensor to up's (fused), or 0 (separate)
};

Halves halves(const Tensor& x, const OptTensor& up, const char* what) {
  check_cpu(x, "x");
  if (!up.has_value()) {
    TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "swiglu", what, ": x must be (rows, 2n), got shape ", x.sizes());
    return {x.size(0), x.size(1) / 2, x.size(1), x.size(1) / 2};
  }
  check_cpu(*up, "up");
  TORCH_CHECK(x.dim() == 2 && up->sizes() == x.sizes() && up->scalar_type() == x.scalar_type(), "swiglu", what,
              ": up must match gate (", x.sizes(), ", ", x.scalar_type(), "), got (", up->sizes(), ", ",
              up->scalar_type(), ")");
  return {x.size(0), x.size(1), x.size(1), 0};
}

// (rows, 2n) [gate | up] or gate (rows, n) with up (rows, n) -> silu(gate) * up (rows, n) in x's dtype.
Tensor swiglu(const Tensor& x, const OptTensor& up) {
  const Halves h = halves(x, up, "");
  if (all_bf16({x}) && (!up || all_bf16({*up}))) {
    const Tensor xc = x.contiguous();
    const Tensor uc = up ? up->contiguous() : xc;
    Tensor out = cpu_empty({h.rows, h.n}, x.options());
    fastenc_cpu::swiglu_fwd_bf16(bptr(xc), bptr(uc) + h.up_offset, bptr(out), h.rows, h.n, h.ld, h.ld, h.n);
    return out;
  }
  const Tensor xf = f32(x);
  const Tensor uf = up ? f32(*up) : xf;
  Tensor out = cpu_empty({h.rows, h.n}, xf.options());
  fastenc_cpu::swiglu_fwd(xf.data_ptr<float>(), uf.data_ptr<float>() + h.up_offset, out.data_ptr<float>(), h.rows,
                          h.n, h.ld, h.ld, h.n);
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// grad (rows, n) -> fused: (dx (rows, 2n) = [d gate | d up], empty); separate: (d gate, d up), each (rows, n).
std::tuple<Tensor, Tensor> swiglu_bwd(const Tensor& grad, const Tensor& x, const OptTensor& up) {
  const Halves h = halves(x, up, " backward");
  check_cpu(grad, "grad");
  TORCH_CHECK(grad.dim() == 2 && grad.size(0) == h.rows && grad.size(1) == h.n, "swiglu backward: grad must be (",
              h.rows, ", ", h.n, "), got ", grad.sizes());
  const bool bf16 = all_bf16({grad, x}) && (!up || all_bf16({*up}));
  const at::ScalarType work = bf16 ? at::kBFloat16 : at::kFloat;
  const Tensor gc = grad.to(work).contiguous(), xc = x.to(work).contiguous();
  const Tensor uc = up ? up->to(work).contiguous() : xc;
  // fused: one (rows, 2n) gradient whose halves are d gate and d up; separate: two (rows, n) tensors
  Tensor dgate = cpu_empty({h.rows, up ? h.n : 2 * h.n}, xc.options());
  Tensor dup = up ? cpu_empty({h.rows, h.n}, xc.options()) : dgate;
  const int64_t ldd = up ? h.n : 2 * h.n, dup_offset = up ? 0 : h.n;
  if (bf16) {
    fastenc_cpu::swiglu_bwd_bf16(bptr(gc), bptr(xc), bptr(uc) + h.up_offset, bptr(dgate), bptr(dup) + dup_offset,
                                 h.rows, h.n, h.ld, h.ld, ldd);
  } else {
    fastenc_cpu::swiglu_bwd(gc.data_ptr<float>(), xc.data_ptr<float>(), uc.data_ptr<float>() + h.up_offset,
                            dgate.data_ptr<float>(), dup.data_ptr<float>() + dup_offset, h.rows, h.n, h.ld, h.ld, ldd);
  }
  const auto dt = x.scalar_type();
  if (!up) return {dgate.to(dt), at::empty({0}, x.options())};
  return {dgate.to(dt), dup.to(dt)};
}

}  // namespace

FASTENC_BINDINGS(swiglu) {
  m.def("swiglu", &swiglu, "silu(gate) * up: x = [gate | up] (up None), or gate x and up");
  m.def("swiglu_bwd", &swiglu_bwd, "swiglu backward: ([d gate | d up], empty) or (d gate, d up)");
}
