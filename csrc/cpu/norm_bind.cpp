// torch-facing wrappers of the LayerNorm / RMSNorm kernels (norm.cpp, norm_bwd.cpp) and their registration:
// layer_norm, rms_norm (forward, optional fused residual / input bias, optional fp32 statistics) and norm_bwd.
// fp32 or bf16 end to end; fp16 through fp32 copies, rounded once.
#include <optional>
#include <string>
#include <tuple>

#include "norm.h"
#include "norm_bwd.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;

// h = x (+ xbias) (+ residual); y = norm(h). store_residual: also return h (a pre-norm block's residual stream);
// otherwise y doubles as h's scratch row and only y is written. stats: also return the per-row mean (LayerNorm)
// and rstd, fp32, that the backward reads.
using NormOut = std::tuple<Tensor, OptTensor, OptTensor, OptTensor>;
NormOut norm_cpu(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& residual,
                 const OptTensor& xbias, double eps, bool rms, bool store_residual, bool stats) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2, "norm: x must be (rows, hidden)");
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(weight.numel() == hidden, "norm: weight must have ", hidden, " elements, got ", weight.numel());
  TORCH_CHECK(!xbias || xbias->numel() == hidden, "norm: input_bias must have ", hidden, " elements");
  const bool keep_h = store_residual && (residual.has_value() || xbias.has_value());
  const auto f32opts = x.options().dtype(at::kFloat);
  OptTensor mean = stats && !rms ? OptTensor(at::empty({rows}, f32opts)) : std::nullopt;
  OptTensor rstd = stats ? OptTensor(at::empty({rows}, f32opts)) : std::nullopt;
  float* mp = mean.has_value() ? mean->data_ptr<float>() : nullptr;
  float* rp = rstd.has_value() ? rstd->data_ptr<float>() : nullptr;
  if (all_bf16({x, weight}) && (!bias || all_bf16({*bias})) && (!residual || all_bf16({*residual})) &&
      (!xbias || all_bf16({*xbias}))) {
    // bf16 end to end: no fp32 copies; h = x + xb + r is rounded to bf16 before it is normalized.
    Tensor xc = x.contiguous(), wc = weight.contiguous();
    OptTensor bc = bias ? OptTensor(bias->contiguous()) : std::nullopt;
    OptTensor rc = residual ? OptTensor(residual->contiguous()) : std::nullopt;
    OptTensor xbc = xbias ? OptTensor(xbias->contiguous()) : std::nullopt;
    Tensor out = cpu_empty({rows, hidden}, xc.options());
    OptTensor hout = keep_h ? OptTensor(cpu_empty({rows, hidden}, xc.options())) : std::nullopt;
    fastenc_cpu::norm_fwd_bf16(bptr(xc), bptr(rc), bptr(xbc), bptr(wc), bptr(bc), bptr(out), bptr(hout), rows,
                               hidden, (float)eps, rms, mp, rp);
    return {out, hout, mean, rstd};
  }
  Tensor xf = f32(x), wf = f32(weight);
  OptTensor bf = bias.has_value() ? OptTensor(f32(*bias)) : std::nullopt;
  OptTensor rf = residual.has_value() ? OptTensor(f32(*residual)) : std::nullopt;
  OptTensor xbf = xbias.has_value() ? OptTensor(f32(*xbias)) : std::nullopt;
  Tensor out = cpu_empty({rows, hidden}, xf.options());
  OptTensor hout = keep_h ? OptTensor(cpu_empty({rows, hidden}, xf.options())) : std::nullopt;
  if (stats && x.scalar_type() != at::kFloat && (residual.has_value() || xbias.has_value())) {
    // fp16 statistics must be those of h rounded to x's dtype (what the backward is given): round h first.
    Tensor hs = (xbf.has_value() ? xf + *xbf : xf.clone());
    if (rf.has_value()) hs.add_(*rf);
    hs = hs.to(x.scalar_type()).to(at::kFloat);
    fastenc_cpu::norm_fwd(hs.data_ptr<float>(), nullptr, nullptr, wf.data_ptr<float>(), fptr(bf),
                          out.data_ptr<float>(), nullptr, rows, hidden, (float)eps, rms, mp, rp);
    OptTensor h = keep_h ? OptTensor(hs.to(x.scalar_type())) : std::nullopt;
    return {out.to(x.scalar_type()), h, mean, rstd};
  }
  fastenc_cpu::norm_fwd(xf.data_ptr<float>(), fptr(rf), fptr(xbf), wf.data_ptr<float>(), fptr(bf),
                        out.data_ptr<float>(), hout.has_value() ? hout->data_ptr<float>() : nullptr, rows, hidden,
                        (float)eps, rms, mp, rp);
  OptTensor h = hout.has_value() ? OptTensor(hout->to(x.scalar_type())) : std::nullopt;
  return {out.to(x.scalar_type()), h, mean, rstd};
}

NormOut layer_norm(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& residual,
                   const OptTensor& input_bias, double eps, bool store_residual, bool stats) {
  return norm_cpu(x, weight, bias, residual, input_bias, eps, false, store_residual, stats);
}

// weight None: plain normalization (w = 1).
std::tuple<Tensor, OptTensor, OptTensor> rms_norm(const Tensor& x, const OptTensor& weight, const OptTensor& residual,
                                                  double eps, bool stats) {
  const Tensor w = weight.has_value() ? *weight : at::ones({x.size(-1)}, x.options());
  auto [y, h, mean, rstd] = norm_cpu(x, w, std::nullopt, residual, std::nullopt, eps, true, true, stats);
  return {y, h, rstd};
}

// dx (h's dtype), dweight and dbias (weight's dtype; null unless asked for) of LayerNorm (mean given) or RMSNorm
// (mean null) from the forward's fp32 statistics; dh (optional) is the gradient arriving on the residual stream.
std::tuple<Tensor, OptTensor, OptTensor> norm_bwd(const Tensor& dy, const OptTensor& dh, const Tensor& h,
                                                  const Tensor& weight, const OptTensor& mean, const Tensor& rstd,
                                                  bool need_weight, bool need_bias) {
  check_cpu(h, "h");
  check_cpu(dy, "dy");
  TORCH_CHECK(h.dim() == 2 && dy.sizes() == h.sizes(), "norm_bwd: dy must have h's shape ", h.sizes(), ", got ",
              dy.sizes());
  TORCH_CHECK(!dh || dh->sizes() == h.sizes(), "norm_bwd: dh must have h's shape ", h.sizes());
  const int64_t rows = h.size(0), hidden = h.size(1);
  TORCH_CHECK(weight.numel() == hidden, "norm_bwd: weight must have ", hidden, " elements, got ", weight.numel());
  TORCH_CHECK(rstd.numel() == rows && rstd.scalar_type() == at::kFloat, "norm_bwd: rstd must be (", rows,
              ",) float32");
  TORCH_CHECK(!mean || (mean->numel() == rows && mean->scalar_type() == at::kFloat), "norm_bwd: mean must be (",
              rows, ",) float32");
  const Tensor rs = rstd.contiguous();
  const OptTensor mu = mean ? OptTensor(mean->contiguous()) : std::nullopt;
  const auto f32opts = h.options().dtype(at::kFloat);
  OptTensor dw = need_weight ? OptTensor(at::empty({hidden}, f32opts)) : std::nullopt;
  OptTensor db = need_bias ? OptTensor(at::empty({hidden}, f32opts)) : std::nullopt;
  float* dwp = dw ? dw->data_ptr<float>() : nullptr;
  float* dbp = db ? db->data_ptr<float>() : nullptr;
  Tensor dx;
  if (all_bf16({dy, h, weight}) && (!dh || all_bf16({*dh}))) {
    const Tensor dyc = dy.contiguous(), hc = h.contiguous(), wc = weight.contiguous();
    const OptTensor dhc = dh ? OptTensor(dh->contiguous()) : std::nullopt;
    dx = cpu_empty({rows, hidden}, hc.options());
    fastenc_cpu::norm_bwd_bf16(bptr(dyc), bptr(dhc), bptr(hc), bptr(wc), fptr(mu), rs.data_ptr<float>(), bptr(dx),
                               dwp, dbp, rows, hidden);
  } else {
    const Tensor dyf = f32(dy), hf = f32(h), wf = f32(weight);
    const OptTensor dhf = dh ? OptTensor(f32(*dh)) : std::nullopt;
    Tensor dxf = cpu_empty({rows, hidden}, f32opts);
    fastenc_cpu::norm_bwd(dyf.data_ptr<float>(), fptr(dhf), hf.data_ptr<float>(), wf.data_ptr<float>(), fptr(mu),
                          rs.data_ptr<float>(), dxf.data_ptr<float>(), dwp, dbp, rows, hidden);
    dx = h.scalar_type() == at::kFloat ? dxf : dxf.to(h.scalar_type());
  }
  const auto wt = weight.scalar_type();
  return {dx, dw ? OptTensor(dw->to(wt)) : std::nullopt, db ? OptTensor(db->to(wt)) : std::nullopt};
}

}  // namespace

FASTENC_BINDINGS(norm) {
  m.def("layer_norm", &layer_norm, "LayerNorm (+residual), fp32 math");
  m.def("rms_norm", &rms_norm, "RMSNorm (+residual), optional weight, fp32 math");
  m.def("norm_bwd", &norm_bwd, "LayerNorm / RMSNorm backward from the saved statistics, fp32 math");
}
