// torch-facing LoRA ops and their registration: merge_lora (the kernel in lora.cpp), lora_linear and
// lora_linear_bwd (torch's CPU GEMMs, with the merge kernel for many tokens).
#include <optional>
#include <string>
#include <tuple>

#include "lora.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;

// merge_lora: W + scale * B @ A by the fp32 kernel in csrc/cpu/lora.cpp, rounded once to weight's dtype.
Tensor merge_lora(const Tensor& weight, const Tensor& lora_a, const Tensor& lora_b, double scale) {
  check_cpu(weight, "weight");
  check_cpu(lora_a, "lora_a");
  check_cpu(lora_b, "lora_b");
  TORCH_CHECK(weight.dim() == 2 && lora_a.dim() == 2 && lora_b.dim() == 2,
              "merge_lora: weight, lora_a, lora_b must be 2-D");
  const int64_t rows = weight.size(0), cols = weight.size(1), r = lora_a.size(0);
  TORCH_CHECK(lora_a.size(1) == cols && lora_b.size(0) == rows && lora_b.size(1) == r,
              "merge_lora: expected lora_a (r, ", cols, ") and lora_b (", rows, ", r)");
  Tensor wf = f32(weight), af = f32(lora_a), bf = f32(lora_b);
  // wf is weight itself when weight is fp32 contiguous: never write into the caller's tensor.
  Tensor out = wf.is_same(weight) ? at::empty_like(wf) : wf;
  fastenc_cpu::merge_lora_fwd(wf.data_ptr<float>(), af.data_ptr<float>(), bf.data_ptr<float>(),
                              out.data_ptr<float>(), rows, cols, r, (float)scale);
  return out.to(weight.scalar_type());
}

// lora_linear: y = x W^T + b + scale (x A^T) B^T on torch's CPU GEMM (MKL or oneDNN via at::addmm), not a
// hand-written GEMM; fp16/bf16 inputs are computed in fp32 and rounded once. Two schedules, same math:
//  - few tokens (T (in + out) <= in out): y = addmm(b, x, W^T); xa = x A^T (T x r, fp32); y += scale xa B^T
//    (in place, beta = 1, scale in alpha): 2 T r (in + out) extra flops and one more pass over x and y;
//  - many tokens: W' = W + scale B A into a temporary by the merge kernel (2 out in r flops, independent of T),
//    then one GEMM y = addmm(b, x, W'^T): x and y are touched once, as in a plain linear. The stored weight
//    is never modified (the adapter stays switchable per call).
Tensor lora_linear(const Tensor& x, const Tensor& weight, const OptTensor& bias, const Tensor& lora_a,
                   const Tensor& lora_b, double scale) {
  check_cpu(x, "x");
  check_cpu(weight, "weight");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && lora_a.dim() == 2 && lora_b.dim() == 2,
              "lora_linear: x must be (tokens, in); weight, lora_a, lora_b 2-D");
  const int64_t tokens = x.size(0), in = x.size(1), out = weight.size(0), r = lora_a.size(0);
  TORCH_CHECK(weight.size(1) == in && lora_a.size(1) == in && lora_b.size(0) == out && lora_b.size(1) == r,
              "lora_linear: expected weight (out, ", in, "), lora_a (r, ", in, "), lora_b (out, r)");
  TORCH_CHECK(!bias.has_value() || bias->numel() == out, "lora_linear: bias must have ", out, " elements");
  Tensor xf = f32(x), wf = f32(weight), af = f32(lora_a), bf = f32(lora_b);
  Tensor y;
  if (tokens * (in + out) > in * out) {
    Tensor wm = cpu_empty({out, in}, wf.options());
    fastenc_cpu::merge_lora_fwd(wf.data_ptr<float>(), af.data_ptr<float>(), bf.data_ptr<float>(),
                                wm.data_ptr<float>(), out, in, r, (float)scale);
    y = bias.has_value() ? at::addmm(f32(*bias), xf, wm.t()) : at::mm(xf, wm.t());
  } else {
    y = bias.has_value() ? at::addmm(f32(*bias), xf, wf.t()) : at::mm(xf, wf.t());
    y.addmm_(at::mm(xf, af.t()), bf.t(), /*beta=*/1.0, /*alpha=*/scale);
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}
// lora_linear backward on torch's CPU GEMMs, fp32 (fp16/bf16 inputs upcast, each gradient rounded once). With
// u = x A^T and v = dy B (tokens x r): dx = dy W + s v A, dW = dy^T x, db = sum_tokens dy, dA = s v^T x,
// dB = s dy^T u; each only when asked for (a frozen base weight costs no GEMM).
std::tuple<OptTensor, OptTensor, OptTensor, OptTensor, OptTensor> lora_linear_bwd(
    const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& lora_a, const Tensor& lora_b, double scale,
    bool need_x, bool need_weight, bool need_bias, bool need_a, bool need_b) {
  check_cpu(dy, "dy");
  check_cpu(x, "x");
  TORCH_CHECK(dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0) && dy.size(1) == weight.size(0),
              "lora_linear_bwd: dy must be (tokens, out) = (", x.size(0), ", ", weight.size(0), "), got ", dy.sizes());
  const Tensor g = f32(dy), xf = f32(x), af = f32(lora_a), bf = f32(lora_b);
  const Tensor v = (need_x || need_a) ? at::mm(g, bf) : Tensor();
  OptTensor dx, dw, db, da, dbb;
  if (need_x) dx = at::addmm(at::mm(g, f32(weight)), v, af, /*beta=*/1.0, /*alpha=*/scale).to(x.scalar_type());
  if (need_weight) dw = at::mm(g.t(), xf).to(weight.scalar_type());
  if (need_bias) db = g.sum(0).to(weight.scalar_type());
  if (need_a) da = at::mm(v.t(), xf).mul_(scale).to(lora_a.scalar_type());
  if (need_b) dbb = at::mm(g.t(), at::mm(xf, af.t())).mul_(scale).to(lora_b.scalar_type());
  return {dx, dw, db, da, dbb};
}

}  // namespace

FASTENC_BINDINGS(lora) {
  m.def("merge_lora", &merge_lora, "W + scale * B @ A, fp32 accumulation, rounded once");
  m.def("lora_linear", &lora_linear, "x W^T + b + scale (x A^T) B^T via torch GEMMs, fp32");
  m.def("lora_linear_bwd", &lora_linear_bwd, "lora_linear gradients (x, weight, bias, A, B) via torch GEMMs, fp32");
}
