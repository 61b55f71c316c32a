// The one module definition of fastenc's C++ extension: torch-facing wrappers over the raw-pointer kernels
// in csrc/cpu (C++/OpenMP) and, when built with FASTENC_WITH_CUDA, csrc/<op>/*.cu. Inputs were validated
// by fastenc.ops; the wrappers re-check what would corrupt memory (device, contiguity, sizes).
#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "cpu/cpu_kernels.h"

#include <torch/version.h>

using at::Tensor;
using OptTensor = std::optional<Tensor>;

namespace {

// fp32 contiguous copy (or the tensor itself when already fp32 contiguous) for the fp32 CPU kernels.
Tensor f32(const Tensor& t) { return t.to(at::kFloat).contiguous(); }
const float* fptr(const OptTensor& t) { return t.has_value() ? t->data_ptr<float>() : nullptr; }

void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "fastenc cpu backend: ", name, " must be a CPU tensor, got ", t.device());
}

// ---------------------------------------------------------------- norm (cpu)
std::tuple<Tensor, OptTensor> norm_cpu(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                                       const OptTensor& residual, double eps, bool rms) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2, "norm: x must be (rows, hidden)");
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(weight.numel() == hidden, "norm: weight must have ", hidden, " elements, got ", weight.numel());
  Tensor xf = f32(x), wf = f32(weight);
  OptTensor bf = bias.has_value() ? OptTensor(f32(*bias)) : std::nullopt;
  OptTensor rf = residual.has_value() ? OptTensor(f32(*residual)) : std::nullopt;
  Tensor out = at::empty({rows, hidden}, xf.options());
  OptTensor hout = residual.has_value() ? OptTensor(at::empty({rows, hidden}, xf.options())) : std::nullopt;
  fastenc_cpu::norm_fwd(xf.data_ptr<float>(), fptr(rf), wf.data_ptr<float>(), fptr(bf), out.data_ptr<float>(),
                        hout.has_value() ? hout->data_ptr<float>() : nullptr, rows, hidden, (float)eps, rms);
  OptTensor h = hout.has_value() ? OptTensor(hout->to(x.scalar_type())) : std::nullopt;
  return {out.to(x.scalar_type()), h};
}

std::tuple<Tensor, OptTensor> layer_norm(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                                         const OptTensor& residual, double eps) {
  return norm_cpu(x, weight, bias, residual, eps, false);
}

std::tuple<Tensor, OptTensor> rms_norm(const Tensor& x, const Tensor& weight, const OptTensor& residual,
                                       double eps) {
  return norm_cpu(x, weight, std::nullopt, residual, eps, true);
}

// ---------------------------------------------------------------- activations (cpu)
Tensor gelu(const Tensor& x, const OptTensor& bias, const std::string& approximate) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2, "gelu: x must be (rows, n)");
  Tensor xf = f32(x);
  OptTensor bf = bias.has_value() ? OptTensor(f32(*bias)) : std::nullopt;
  Tensor out = at::empty_like(xf);
  fastenc_cpu::gelu_fwd(xf.data_ptr<float>(), fptr(bf), out.data_ptr<float>(), x.size(0), x.size(1),
                        approximate == "tanh");
  return out.to(x.scalar_type());
}

Tensor geglu(const Tensor& x, const std::string& approximate) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "geglu: x must be (rows, 2n)");
  Tensor xf = f32(x);
  const int64_t n = x.size(1) / 2;
  Tensor out = at::empty({x.size(0), n}, xf.options());
  fastenc_cpu::geglu_fwd(xf.data_ptr<float>(), out.data_ptr<float>(), x.size(0), n, approximate == "tanh");
  return out.to(x.scalar_type());
}

// ---------------------------------------------------------------- rope (cpu)
std::tuple<Tensor, Tensor> rope(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                                const Tensor& positions) {
  check_cpu(q, "q");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
              "rope: q, k must be (tokens, heads, dim)");
  TORCH_CHECK(positions.numel() == q.size(0), "rope: positions must have one entry per token");
  Tensor qf = f32(q), kf = f32(k), cf = f32(cos), sf = f32(sin);
  Tensor pos = positions.to(at::kInt).contiguous();
  Tensor qo = at::empty_like(qf), ko = at::empty_like(kf);
  fastenc_cpu::rope_fwd(qf.data_ptr<float>(), kf.data_ptr<float>(), qo.data_ptr<float>(), ko.data_ptr<float>(),
                        cf.data_ptr<float>(), sf.data_ptr<float>(), pos.data_ptr<int32_t>(), q.size(0), q.size(1),
                        k.size(1), q.size(2), cos.size(1));
  return {qo.to(q.scalar_type()), ko.to(k.scalar_type())};
}

// ---------------------------------------------------------------- attention (cpu)
// (section owned by the attention op)

// ---------------------------------------------------------------- lora (cpu)
// (section owned by the lora ops)

#ifdef FASTENC_WITH_CUDA
// ---------------------------------------------------------------- CUDA wrappers
// (section owned by the CUDA kernels: csrc/<op>/*.cu launchers)
#endif

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

bool has_cuda() {
#ifdef FASTENC_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastenc C++ extension: CPU (C++/OpenMP) and CUDA kernels";
  m.def("torch_version", &torch_version, "torch version the extension was built against");
  m.def("has_cuda", &has_cuda);
  m.def("layer_norm", &layer_norm, "LayerNorm (+residual), fp32 math");
  m.def("rms_norm", &rms_norm, "RMSNorm (+residual), fp32 math");
  m.def("gelu", &gelu, "gelu(x + bias)");
  m.def("geglu", &geglu, "gelu(x[:, :n]) * x[:, n:]");
  m.def("rope", &rope, "rotate-half RoPE of q and k");
  // attention (cpu) defs
  // lora (cpu) defs
#ifdef FASTENC_WITH_CUDA
  // cuda defs
#endif
}
