// torch-facing wrappers of the GELU / GeGLU kernels (act.cpp, act_bwd.cpp) and their registration: gelu, gelu_out,
// geglu, geglu_out and their backwards gelu_bwd, geglu_bwd. fp32 or bf16 end to end; fp16 through fp32 copies.
#include <optional>
#include <string>
#include <tuple>

#include "act.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;
using fastenc_cpu::GeluForm;

// "none" (exact erf), "tanh" or "quick" (x * sigmoid(1.702 x)); anything else is refused naming the op.
GeluForm gelu_form(const std::string& approximate, const char* op) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh" || approximate == "quick", op,
              ": approximate must be 'none', 'tanh' or 'quick', got '", approximate, "'");
  return approximate == "tanh" ? GeluForm::kTanh : (approximate == "quick" ? GeluForm::kQuick : GeluForm::kErf);
}

// Into `out` when the kernel can write it directly (fp32, or bf16 throughout; unit column stride), else computed
// and copied. gelu's out may be x itself, geglu's out may be x[:, :n] (in place over the input halves).
Tensor gelu_into(const Tensor& x, const OptTensor& bias, const std::string& approximate, const OptTensor& out_opt) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2, "gelu: x must be (rows, n)");
  const GeluForm form = gelu_form(approximate, "gelu");
  const bool bf16 = all_bf16({x}) && (!bias || all_bf16({*bias}));
  const bool f32_in = x.scalar_type() == at::kFloat && (!bias || bias->scalar_type() == at::kFloat);
  const bool direct = (bf16 || f32_in) && (!out_opt || (out_opt->is_contiguous() && x.is_contiguous()));
  if (!direct) {  // fp16 (or a strided out): fp32 kernel, then one rounding into out
    Tensor xf = f32(x);
    OptTensor bf = bias.has_value() ? OptTensor(f32(*bias)) : std::nullopt;
    Tensor yf = cpu_empty_like(xf);
    fastenc_cpu::gelu_fwd(xf.data_ptr<float>(), fptr(bf), yf.data_ptr<float>(), x.size(0), x.size(1), form);
    if (!out_opt) return yf.to(x.scalar_type());
    out_opt->copy_(yf);
    return *out_opt;
  }
  Tensor xc = x.contiguous();
  OptTensor bc = bias ? OptTensor(bias->contiguous()) : std::nullopt;
  Tensor out = out_opt ? *out_opt : cpu_empty_like(xc);
  if (bf16)
    fastenc_cpu::gelu_fwd_bf16(bptr(xc), bptr(bc), bptr(out), x.size(0), x.size(1), form);
  else
    fastenc_cpu::gelu_fwd(xc.data_ptr<float>(), fptr(bc), out.data_ptr<float>(), x.size(0), x.size(1), form);
  return out;
}

Tensor gelu(const Tensor& x, const OptTensor& bias, const std::string& approximate) {
  return gelu_into(x, bias, approximate, std::nullopt);
}

void gelu_out(const Tensor& x, const OptTensor& bias, const std::string& approximate, const Tensor& out) {
  check_cpu(out, "out");
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type(), "gelu: out must match x (",
              x.sizes(), ", ", x.scalar_type(), "), got (", out.sizes(), ", ", out.scalar_type(), ")");
  gelu_into(x, bias, approximate, out);
}

Tensor geglu_into(const Tensor& x, const std::string& approximate, const OptTensor& out_opt) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "geglu: x must be (rows, 2n)");
  const int64_t rows = x.size(0), n = x.size(1) / 2;
  const GeluForm form = gelu_form(approximate, "geglu");
  const bool bf16 = all_bf16({x}), f32_in = x.scalar_type() == at::kFloat;
  const bool direct = (bf16 || f32_in) && x.is_contiguous() &&
                      (!out_opt || (out_opt->stride(1) == 1 && out_opt->stride(0) >= n));
  if (!direct) {
    Tensor xf = f32(x);
    Tensor yf = cpu_empty({rows, n}, xf.options());
    fastenc_cpu::geglu_fwd(xf.data_ptr<float>(), yf.data_ptr<float>(), rows, n, n, form);
    if (!out_opt) return yf.to(x.scalar_type());
    out_opt->copy_(yf);
    return *out_opt;
  }
  Tensor out = out_opt ? *out_opt : cpu_empty({rows, n}, x.options());
  const int64_t ldo = rows > 1 ? out.stride(0) : n;
  if (bf16)
    fastenc_cpu::geglu_fwd_bf16(bptr(x), bptr(out), rows, n, ldo, form);
  else
    fastenc_cpu::geglu_fwd(x.data_ptr<float>(), out.data_ptr<float>(), rows, n, ldo, form);
  return out;
}

Tensor geglu(const Tensor& x, const std::string& approximate) { return geglu_into(x, approximate, std::nullopt); }

void geglu_out(const Tensor& x, const std::string& approximate, const Tensor& out) {
  check_cpu(out, "out");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && 2 * out.size(1) == x.size(1) &&
                  out.scalar_type() == x.scalar_type(),
              "geglu: out must be (rows, n) of x's dtype for x (rows, 2n), got ", out.sizes(), " ", out.scalar_type());
  geglu_into(x, approximate, out);
}

// grad, x (rows, n) -> (dx (rows, n), dbias (n,) in x's dtype, or empty without bias); bf16 end to end or fp32 math
// over fp32 copies. dbias is summed in fp32 inside the kernel. need_dx / need_dbias false: that output is empty and
// the kernel neither writes nor sums it.
std::tuple<Tensor, Tensor> gelu_bwd(const Tensor& grad, const Tensor& x, const OptTensor& bias,
                                    const std::string& approximate, bool need_dx, bool need_dbias) {
  check_cpu(x, "x");
  check_cpu(grad, "grad");
  TORCH_CHECK(x.dim() == 2 && grad.sizes() == x.sizes(), "gelu backward: grad must have x's shape ", x.sizes(),
              ", got ", grad.sizes());
  TORCH_CHECK(!bias || bias->numel() == x.size(1), "gelu backward: bias must have ", x.size(1), " elements");
  const GeluForm form = gelu_form(approximate, "gelu");
  const bool sum = bias && need_dbias;
  const int64_t rows = x.size(0), n = x.size(1);
  Tensor db = sum ? at::empty({n}, x.options().dtype(at::kFloat)) : at::empty({0}, x.options());
  float* dbp = sum ? db.data_ptr<float>() : nullptr;
  if (all_bf16({grad, x}) && (!bias || all_bf16({*bias}))) {
    Tensor gc = grad.contiguous(), xc = x.contiguous();
    OptTensor bc = bias ? OptTensor(bias->contiguous()) : std::nullopt;
    Tensor dx = need_dx ? cpu_empty_like(xc) : at::empty({0}, x.options());
    fastenc_cpu::gelu_bwd_bf16(bptr(gc), bptr(xc), bptr(bc), need_dx ? bptr(dx) : nullptr, dbp, rows, n, form);
    return {dx, sum ? db.to(x.scalar_type()) : db};
  }
  Tensor gf = f32(grad), xf = f32(x);
  OptTensor bf = bias ? OptTensor(f32(*bias)) : std::nullopt;
  Tensor dx = need_dx ? cpu_empty_like(xf) : at::empty({0}, xf.options());
  fastenc_cpu::gelu_bwd(gf.data_ptr<float>(), xf.data_ptr<float>(), fptr(bf), need_dx ? dx.data_ptr<float>() : nullptr,
                        dbp, rows, n, form);
  return {dx.to(x.scalar_type()), sum ? db.to(x.scalar_type()) : db};
}

// grad (rows, n), x (rows, 2n) -> dx (rows, 2n): [d input | d gate].
Tensor geglu_bwd(const Tensor& grad, const Tensor& x, const std::string& approximate) {
  check_cpu(x, "x");
  check_cpu(grad, "grad");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0 && grad.dim() == 2 && grad.size(0) == x.size(0) &&
                  grad.size(1) * 2 == x.size(1),
              "geglu backward: grad must be (rows, n) for x (rows, 2n), got ", grad.sizes(), " and ", x.sizes());
  const GeluForm form = gelu_form(approximate, "geglu");
  const int64_t rows = x.size(0), n = x.size(1) / 2;
  if (all_bf16({grad, x})) {
    Tensor gc = grad.contiguous(), xc = x.contiguous();
    Tensor dx = cpu_empty_like(xc);
    fastenc_cpu::geglu_bwd_bf16(bptr(gc), bptr(xc), bptr(dx), rows, n, form);
    return dx;
  }
  Tensor gf = f32(grad), xf = f32(x);
  Tensor dx = cpu_empty_like(xf);
  fastenc_cpu::geglu_bwd(gf.data_ptr<float>(), xf.data_ptr<float>(), dx.data_ptr<float>(), rows, n, form);
  return dx.to(x.scalar_type());
}

}  // namespace

FASTENC_BINDINGS(act) {
  m.def("gelu", &gelu, "gelu(x + bias)");
  m.def("gelu_out", &gelu_out, "gelu(x + bias) into out (may be x)");
  m.def("geglu", &geglu, "gelu(x[:, :n]) * x[:, n:]");
  m.def("geglu_out", &geglu_out, "gelu(x[:, :n]) * x[:, n:] into out (may be x[:, :n])");
  m.def("gelu_bwd", &gelu_bwd, "gelu backward: (dx, dbias)");
  m.def("geglu_bwd", &geglu_bwd, "geglu backward: dx = [d input | d gate]");
}
