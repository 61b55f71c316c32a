// torch-facing wrappers of the LayerNorm / RMSNorm launchers (norm.h) and their registration: layer_norm_cuda,
// rms_norm_cuda (forward, optional fused residual, optional fp32 statistics) and norm_bwd_cuda.
// Each checks device, dtype and shapes, makes inputs contiguous, allocates outputs and launches on the current
// stream of the input's device.
#include <optional>
#include <string>
#include <tuple>

#include "cuda_bind.h"
#include "norm.h"

namespace {

using namespace fastenc_cuda_torch;

// Returns (y, h or None, mean or None, rstd or None); stats: write the per-row fp32 statistics (training).
std::tuple<Tensor, OptTensor, OptTensor, OptTensor> norm_cuda(const char* op, const Tensor& x, const Tensor& weight,
                                                              const OptTensor& bias, const OptTensor& residual,
                                                              double eps, bool rms, bool stats) {
  check_on(x, x, op, "x");
  TORCH_CHECK(x.dim() == 2, op, " (cuda): x must be (rows, hidden), got shape ", x.sizes());
  const int dt = cuda_dtype(x, op, "x");
  const int64_t rows = x.size(0), hidden = x.size(1);
  check_on(weight, x, op, "weight");
  TORCH_CHECK(weight.numel() == hidden, op, " (cuda): weight must have ", hidden, " elements, got ", weight.numel());
  if (bias.has_value()) {
    check_on(*bias, x, op, "bias");
    TORCH_CHECK(bias->numel() == hidden, op, " (cuda): bias must have ", hidden, " elements, got ", bias->numel());
  }
  if (residual.has_value()) {
    check_on(*residual, x, op, "residual");
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(), op,
                " (cuda): residual must match x (", x.sizes(), ", ", x.scalar_type(), "), got (", residual->sizes(),
                ", ", residual->scalar_type(), ")");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous(), wc = weight.to(x.scalar_type()).contiguous();
  const OptTensor bc = bias.has_value() ? OptTensor(bias->to(x.scalar_type()).contiguous()) : std::nullopt;
  const OptTensor rc = residual.has_value() ? OptTensor(residual->contiguous()) : std::nullopt;
  Tensor y = at::empty_like(xc);
  OptTensor h = residual.has_value() ? OptTensor(at::empty_like(xc)) : std::nullopt;
  const auto f32opts = x.options().dtype(at::kFloat);
  OptTensor mean = stats && !rms ? OptTensor(at::empty({rows}, f32opts)) : std::nullopt;
  OptTensor rstd = stats ? OptTensor(at::empty({rows}, f32opts)) : std::nullopt;
  check_launch(fastenc_cuda::norm_fwd(xc.data_ptr(), ptr_or_null(rc), wc.data_ptr(), ptr_or_null(bc), y.data_ptr(),
                                      h.has_value() ? h->data_ptr() : nullptr, rows, hidden, static_cast<float>(eps),
                                      rms, dt, c10::cuda::getCurrentCUDAStream(),
                                      mean.has_value() ? mean->data_ptr<float>() : nullptr,
                                      rstd.has_value() ? rstd->data_ptr<float>() : nullptr),
               op);
  return {y, h, mean, rstd};
}

std::tuple<Tensor, OptTensor, OptTensor, OptTensor> layer_norm_cuda(const Tensor& x, const Tensor& weight,
                                                                    const OptTensor& bias, const OptTensor& residual,
                                                                    double eps, bool stats) {
  return norm_cuda("layer_norm", x, weight, bias, residual, eps, false, stats);
}

std::tuple<Tensor, OptTensor, OptTensor, OptTensor> rms_norm_cuda(const Tensor& x, const Tensor& weight,
                                                                  const OptTensor& residual, double eps, bool stats) {
  return norm_cuda("rms_norm", x, weight, std::nullopt, residual, eps, true, stats);
}

// LayerNorm (mean given) / RMSNorm (mean None) backward: dx in h's dtype; dweight, dbias (when asked for) from the
// kernel's fp32 partial rows summed here, rounded once to weight's dtype.
std::tuple<Tensor, OptTensor, OptTensor> norm_bwd_cuda(const Tensor& dy, const OptTensor& dh, const Tensor& h,
                                                       const Tensor& weight, const OptTensor& mean, const Tensor& rstd,
                                                       bool need_weight, bool need_bias) {
  const char* op = "norm_bwd";
  check_on(h, h, op, "h");
  check_on(dy, h, op, "dy");
  check_on(weight, h, op, "weight");
  check_on(rstd, h, op, "rstd");
  const int dt = cuda_dtype(h, op, "h");
  TORCH_CHECK(h.dim() == 2 && dy.sizes() == h.sizes() && dy.scalar_type() == h.scalar_type(), op,
              " (cuda): dy must match h (", h.sizes(), ", ", h.scalar_type(), "), got (", dy.sizes(), ", ",
              dy.scalar_type(), ")");
  const int64_t rows = h.size(0), hidden = h.size(1);
  if (dh.has_value()) {
    check_on(*dh, h, op, "dh");
    TORCH_CHECK(dh->sizes() == h.sizes() && dh->scalar_type() == h.scalar_type(), op, " (cuda): dh must match h");
  }
  TORCH_CHECK(weight.numel() == hidden, op, " (cuda): weight must have ", hidden, " elements, got ", weight.numel());
  TORCH_CHECK(rstd.numel() == rows && rstd.scalar_type() == at::kFloat, op, " (cuda): rstd must be (", rows,
              ",) float32");
  TORCH_CHECK(!mean || (mean->numel() == rows && mean->scalar_type() == at::kFloat), op, " (cuda): mean must be (",
              rows, ",) float32");
  const c10::cuda::CUDAGuard guard(h.device());
  const Tensor dyc = dy.contiguous(), hc = h.contiguous(), wc = weight.to(h.scalar_type()).contiguous();
  const Tensor rs = rstd.contiguous();
  const OptTensor dhc = dh ? OptTensor(dh->contiguous()) : std::nullopt;
  const OptTensor mu = mean ? OptTensor(mean->contiguous()) : std::nullopt;
  Tensor dx = at::empty_like(hc);
  const int64_t parts = fastenc_cuda::norm_bwd_parts(rows);
  const auto f32opts = h.options().dtype(at::kFloat);
  OptTensor dwp = need_weight ? OptTensor(at::empty({parts, hidden}, f32opts)) : std::nullopt;
  OptTensor dbp = need_bias ? OptTensor(at::empty({parts, hidden}, f32opts)) : std::nullopt;
  check_launch(fastenc_cuda::norm_bwd(dyc.data_ptr(), ptr_or_null(dhc), hc.data_ptr(), wc.data_ptr(),
                                      mu ? mu->data_ptr<float>() : nullptr, rs.data_ptr<float>(), dx.data_ptr(),
                                      dwp ? dwp->data_ptr<float>() : nullptr, dbp ? dbp->data_ptr<float>() : nullptr,
                                      rows, hidden, dt, c10::cuda::getCurrentCUDAStream()),
               op);
  const auto wt = weight.scalar_type();
  return {dx, dwp ? OptTensor(dwp->sum(0).to(wt)) : std::nullopt, dbp ? OptTensor(dbp->sum(0).to(wt)) : std::nullopt};
}

}  // namespace

FASTENC_BINDINGS(norm_cuda) {
  m.def("layer_norm_cuda", &layer_norm_cuda, "LayerNorm (+residual), CUDA kernel, fp32 statistics");
  m.def("rms_norm_cuda", &rms_norm_cuda, "RMSNorm (+residual), CUDA kernel, fp32 statistics");
  m.def("norm_bwd_cuda", &norm_bwd_cuda, "LayerNorm / RMSNorm backward, CUDA kernel, fp32 partial sums");
}
