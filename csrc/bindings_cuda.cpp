// The cuda half's op bindings: torch-facing wrappers of the raw-pointer launchers declared in
// common/cuda_launchers.h (csrc/<op>/*.cu). They check device, dtype and shapes (naming the argument), make inputs
// contiguous, allocate outputs, launch on the current stream of the input's device, and turn a launch error into a
// RuntimeError. Compiled by the host compiler into the cuda half only (fastenc/extension.py, setup.py), beside
// bindings.cpp (which holds the module definition and calls bind_cuda); never part of the cpu half.
// c10's stream/guard headers (what at::cuda::getCurrentCUDAStream forwards to) need no cuBLAS/cuSPARSE headers,
// so this file also syntax-checks against a CPU-only torch (tests/build/test_nvcc.py).
#ifndef FASTENC_WITH_CUDA
#error "bindings_cuda.cpp belongs to the cuda half: compile it with -DFASTENC_WITH_CUDA"
#endif

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#include <tuple>

#include "bindings_cuda.h"
#include "common/cuda_launchers.h"

using at::Tensor;
using OptTensor = std::optional<Tensor>;

namespace {

int cuda_dtype(const Tensor& t, const char* op, const char* name, bool half_only = false) {
  switch (t.scalar_type()) {
    case at::kFloat:
      if (!half_only) return fastenc_cuda::kF32;
      break;
    case at::kHalf: return fastenc_cuda::kF16;
    case at::kBFloat16: return fastenc_cuda::kBF16;
    default: break;
  }
  TORCH_CHECK(false, op, " (cuda): ", name, " must be ", half_only ? "float16 or bfloat16" : "float32, float16 or bfloat16",
              ", got ", t.scalar_type());
  return -1;
}

void check_on(const Tensor& t, const Tensor& like, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda(), op, " (cuda): ", name, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.device() == like.device(), op, " (cuda): ", name, " must be on ", like.device(), ", got ",
              t.device());
}

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " (cuda): kernel launch failed: ", cudaGetErrorString(err));
}

const void* ptr_or_null(const OptTensor& t) { return t.has_value() ? t->data_ptr() : nullptr; }

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

bool tanh_flag(const std::string& approximate, const char* op) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", op, " (cuda): approximate must be 'none' or 'tanh', got '",
              approximate, "'");
  return approximate == "tanh";
}

Tensor gelu_cuda(const Tensor& x, const OptTensor& bias, const std::string& approximate) {
  check_on(x, x, "gelu", "x");
  TORCH_CHECK(x.dim() == 2, "gelu (cuda): x must be (rows, n), got shape ", x.sizes());
  const int dt = cuda_dtype(x, "gelu", "x");
  const bool tanh_approx = tanh_flag(approximate, "gelu");
  if (bias.has_value()) {
    check_on(*bias, x, "gelu", "bias");
    TORCH_CHECK(bias->numel() == x.size(1), "gelu (cuda): bias must have ", x.size(1), " elements, got ", bias->numel());
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous();
  const OptTensor bc = bias.has_value() ? OptTensor(bias->to(x.scalar_type()).contiguous()) : std::nullopt;
  Tensor y = at::empty_like(xc);
  check_launch(fastenc_cuda::gelu_fwd(xc.data_ptr(), ptr_or_null(bc), y.data_ptr(), x.size(0), x.size(1), tanh_approx,
                                      dt, c10::cuda::getCurrentCUDAStream()),
               "gelu");
  return y;
}

Tensor geglu_cuda(const Tensor& x, const std::string& approximate) {
  check_on(x, x, "geglu", "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "geglu (cuda): x must be (rows, 2n), got shape ", x.sizes());
  const int dt = cuda_dtype(x, "geglu", "x");
  const bool tanh_approx = tanh_flag(approximate, "geglu");
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous();
  const int64_t n = x.size(1) / 2;
  Tensor y = at::empty({x.size(0), n}, xc.options());
  check_launch(fastenc_cuda::geglu_fwd(xc.data_ptr(), y.data_ptr(), x.size(0), n, tanh_approx, dt,
                                       c10::cuda::getCurrentCUDAStream()),
               "geglu");
  return y;
}

std::tuple<Tensor, Tensor> rope_cuda_impl(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                                          const Tensor& positions, bool inverse) {
  check_on(q, q, "rope", "q");
  check_on(k, q, "rope", "k");
  check_on(cos, q, "rope", "cos");
  check_on(sin, q, "rope", "sin");
  check_on(positions, q, "rope", "positions");
  const int dt = cuda_dtype(q, "rope", "q");
  TORCH_CHECK(k.scalar_type() == q.scalar_type(), "rope (cuda): k must have q's dtype ", q.scalar_type(), ", got ",
              k.scalar_type());
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.size(0) == q.size(0) && k.size(2) == q.size(2),
              "rope (cuda): q, k must be (tokens, heads, dim) with equal tokens and dim, got ", q.sizes(), " and ",
              k.sizes());
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(1) >= 1 && 2 * cos.size(1) <= q.size(2),
              "rope (cuda): cos, sin must both be (positions, half) with 2*half <= ", q.size(2), ", got ", cos.sizes(),
              " and ", sin.sizes());
  TORCH_CHECK(positions.numel() == q.size(0), "rope (cuda): positions must have ", q.size(0), " entries, got ",
              positions.numel());
  const c10::cuda::CUDAGuard guard(q.device());
  const Tensor qc = q.contiguous(), kc = k.contiguous();
  const Tensor cf = cos.to(at::kFloat).contiguous(), sf = sin.to(at::kFloat).contiguous();
  const Tensor pos = positions.to(at::kInt).contiguous();
  Tensor qo = at::empty_like(qc), ko = at::empty_like(kc);
  check_launch(fastenc_cuda::rope_fwd(qc.data_ptr(), kc.data_ptr(), qo.data_ptr(), ko.data_ptr(), cf.data_ptr<float>(),
                                      sf.data_ptr<float>(), pos.data_ptr<int32_t>(), q.size(0), q.size(1), k.size(1),
                                      q.size(2), cos.size(1), cos.size(0), inverse, dt,
                                      c10::cuda::getCurrentCUDAStream()),
               "rope");
  return {qo, ko};
}

// A position outside the table gives NaN rows (checked in the kernel where it is read; no host sync).
std::tuple<Tensor, Tensor> rope_cuda(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                                     const Tensor& positions) {
  return rope_cuda_impl(q, k, cos, sin, positions, false);
}

std::tuple<Tensor, Tensor> rope_bwd_cuda(const Tensor& grad_q, const Tensor& grad_k, const Tensor& cos,
                                         const Tensor& sin, const Tensor& positions) {
  return rope_cuda_impl(grad_q, grad_k, cos, sin, positions, true);
}

// gelu backward: (dx, dbias); dbias = dx summed over rows in fp32 (empty without bias, or when !need_dbias); dx
// empty when !need_dx (the kernel still writes it as the sum's input when dbias is needed).
std::tuple<Tensor, Tensor> gelu_bwd_cuda(const Tensor& grad, const Tensor& x, const OptTensor& bias,
                                         const std::string& approximate, bool need_dx, bool need_dbias) {
  check_on(x, x, "gelu", "x");
  check_on(grad, x, "gelu", "grad");
  const int dt = cuda_dtype(x, "gelu", "x");
  const bool tanh_approx = tanh_flag(approximate, "gelu");
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
                                      x.size(1), tanh_approx, dt, c10::cuda::getCurrentCUDAStream()),
               "gelu backward");
  Tensor db = bias.has_value() && need_dbias ? dx.sum(0, false, at::kFloat).to(x.scalar_type())
                                            : at::empty({0}, x.options());
  return {need_dx ? dx : at::empty({0}, x.options()), db};
}

Tensor geglu_bwd_cuda(const Tensor& grad, const Tensor& x, const std::string& approximate) {
  check_on(x, x, "geglu", "x");
  check_on(grad, x, "geglu", "grad");
  const int dt = cuda_dtype(x, "geglu", "x");
  const bool tanh_approx = tanh_flag(approximate, "geglu");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0 && grad.dim() == 2 && grad.size(0) == x.size(0) &&
                  2 * grad.size(1) == x.size(1) && grad.scalar_type() == x.scalar_type(),
              "geglu backward (cuda): grad must be (rows, n) of x's dtype for x (rows, 2n), got ", grad.sizes(), " ",
              grad.scalar_type(), " for ", x.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  const Tensor xc = x.contiguous(), gc = grad.contiguous();
  Tensor dx = at::empty_like(xc);
  check_launch(fastenc_cuda::geglu_bwd(gc.data_ptr(), xc.data_ptr(), dx.data_ptr(), x.size(0), x.size(1) / 2,
                                       tanh_approx, dt, c10::cuda::getCurrentCUDAStream()),
               "geglu backward");
  return dx;
}

Tensor merge_lora_cuda(const Tensor& weight, const Tensor& lora_a, const Tensor& lora_b, double scale) {
  check_on(weight, weight, "merge_lora", "weight");
  check_on(lora_a, weight, "merge_lora", "lora_a");
  check_on(lora_b, weight, "merge_lora", "lora_b");
  const int dt = cuda_dtype(weight, "merge_lora", "weight");
  TORCH_CHECK(weight.dim() == 2 && lora_a.dim() == 2 && lora_b.dim() == 2,
              "merge_lora (cuda): weight, lora_a, lora_b must be 2-D");
  const int64_t n_out = weight.size(0), n_in = weight.size(1), r = lora_a.size(0);
  TORCH_CHECK(lora_a.size(1) == n_in && lora_b.size(0) == n_out && lora_b.size(1) == r,
              "merge_lora (cuda): expected lora_a (r, ", n_in, ") and lora_b (", n_out, ", r), got ", lora_a.sizes(),
              " and ", lora_b.sizes());
  const c10::cuda::CUDAGuard guard(weight.device());
  const Tensor wc = weight.contiguous();
  const Tensor af = lora_a.to(at::kFloat).contiguous(), bf = lora_b.to(at::kFloat).contiguous();
  Tensor out = at::empty_like(wc);
  check_launch(fastenc_cuda::merge_lora_fwd(wc.data_ptr(), af.data_ptr<float>(), bf.data_ptr<float>(), out.data_ptr(),
                                            static_cast<float>(scale), n_out, n_in, r, dt,
                                            c10::cuda::getCurrentCUDAStream()),
               "merge_lora");
  return out;
}

// cu_seqlens is not read back here (that would synchronize the stream): fastenc.ops.attention validated it on
// the host (and max_seqlen from the values it read), and the kernel skips a sequence whose bounds it reads
// outside [0, total_tokens].
std::tuple<Tensor, Tensor> attention_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                                          int64_t max_seqlen,
                      int64_t window_left, int64_t window_right, double scale) {
  check_on(q, q, "attention", "q");
  check_on(k, q, "attention", "k");
  check_on(v, q, "attention", "v");
  check_on(cu_seqlens, q, "attention", "cu_seqlens");
  const int dt = cuda_dtype(q, "attention", "q", /*half_only=*/true);
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "attention (cuda): k, v must have q's dtype ", q.scalar_type(), ", got ", k.scalar_type(), ", ",
              v.scalar_type());
  TORCH_CHECK(q.dim() == 3 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "attention (cuda): q, k, v must be (total_tokens, heads, head_dim) of one shape, got ", q.sizes(), ", ",
              k.sizes(), ", ", v.sizes());
  TORCH_CHECK(fastenc_cuda::attention_head_dim_supported(q.size(2)),
              "attention (cuda): head_dim must be 32, 64, 96 or 128, got ", q.size(2));
  TORCH_CHECK(cu_seqlens.scalar_type() == at::kInt && cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 2,
              "attention (cuda): cu_seqlens must be 1-D int32 of length batch+1, got ", cu_seqlens.scalar_type(), " ",
              cu_seqlens.sizes());
  TORCH_CHECK(max_seqlen >= 0, "attention (cuda): max_seqlen must be >= 0, got ", max_seqlen);
  TORCH_CHECK(window_left >= -1 && window_right >= -1,
              "attention (cuda): window sizes must be >= 0 or -1 (unbounded), got (", window_left, ", ", window_right, ")");
  const c10::cuda::CUDAGuard guard(q.device());
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), cu = cu_seqlens.contiguous();
  Tensor out = at::empty_like(qc);
  Tensor lse = at::empty({q.size(1), q.size(0)}, qc.options().dtype(at::kFloat));
  if (q.numel() == 0) return {out, lse.fill_(INFINITY)};
  check_launch(fastenc_cuda::attention_fwd(qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), out.data_ptr(),
                                           cu.data_ptr<int32_t>(), q.size(0), cu.numel() - 1, q.size(1), q.size(2),
                                           max_seqlen, window_left, window_right, static_cast<float>(scale), dt,
                                           c10::cuda::getCurrentCUDAStream(), lse.data_ptr<float>()),
               "attention");
  return {out, lse};
}

}  // namespace

void fastenc_bindings::bind_cuda(pybind11::module_& m) {
  m.def("layer_norm_cuda", &layer_norm_cuda, "LayerNorm (+residual), CUDA kernel, fp32 statistics");
  m.def("rms_norm_cuda", &rms_norm_cuda, "RMSNorm (+residual), CUDA kernel, fp32 statistics");
  m.def("norm_bwd_cuda", &norm_bwd_cuda, "LayerNorm / RMSNorm backward, CUDA kernel, fp32 partial sums");
  m.def("gelu_cuda", &gelu_cuda, "gelu(x + bias), CUDA kernel");
  m.def("geglu_cuda", &geglu_cuda, "gelu(x[:, :n]) * x[:, n:], CUDA kernel");
  m.def("rope_cuda", &rope_cuda, "rotate-half RoPE of q and k, CUDA kernel");
  m.def("rope_bwd_cuda", &rope_bwd_cuda, "rope backward (inverse rotation), CUDA kernel");
  m.def("gelu_bwd_cuda", &gelu_bwd_cuda, "gelu backward: (dx, dbias), CUDA kernel");
  m.def("geglu_bwd_cuda", &geglu_bwd_cuda, "geglu backward: [d input | d gate], CUDA kernel");
  m.def("merge_lora_cuda", &merge_lora_cuda, "W + scale * B @ A, CUDA kernel, fp32 accumulation");
  m.def("attention_cuda", &attention_cuda, "varlen bidirectional attention, FlashAttention-2 on tensor cores");
}
