// The module definition of fastenc's C++ extension, and its cpu half's op bindings: torch-facing wrappers over the
// raw-pointer kernels in csrc/cpu (C++/OpenMP). Inputs were validated by fastenc.ops; the wrappers re-check what
// would corrupt memory (device, contiguity, sizes).
// Compiled into two modules that load and fail independently (fastenc/extension.py, setup.py):
//   cpu half  (fastenc_ext_cpu / fastenc._C):       this file without defines + csrc/cpu/*.cpp
//   cuda half (fastenc_ext_cuda / fastenc._C_cuda): this file with -DFASTENC_WITH_CUDA + bindings_cuda.cpp (the
//                                                   CUDA wrappers, bind_cuda) + csrc/<op>/*.cu
// so the cpu wrappers below sit under #ifndef FASTENC_WITH_CUDA, and the cuda half's module calls bind_cuda.
#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "cpu/attention.h"
#include "cpu/buffer_cache.h"
#include "cpu/cpu_kernels.h"
#include "cpu/gemm.h"
#include "cpu/lora.h"
#include "cpu/norm_bwd.h"

#include <torch/version.h>

#ifdef FASTENC_WITH_CUDA
#include "bindings_cuda.h"
#endif

using at::Tensor;
using OptTensor = std::optional<Tensor>;

namespace {

#ifndef FASTENC_WITH_CUDA  // ---- the cpu half: buffer cache and csrc/cpu wrappers
// ---------------------------------------------------------------- buffer cache (cpu)
// Outputs of the CPU kernels from fastenc's caching allocator (csrc/cpu/buffer_cache.h): large blocks are reused
// across layers and calls instead of being faulted in afresh. FASTENC_CPU_CACHE=0 (or set_buffer_cache(false))
// gives plain at::empty. Such tensors cannot be resized in place (like any tensor over external memory).
bool& cache_enabled() {
  static bool on = [] {
    const char* v = std::getenv("FASTENC_CPU_CACHE");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

Tensor cpu_empty(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  const size_t bytes = (size_t)n * c10::elementSize(c10::typeMetaToScalarType(opts.dtype()));
  if (!cache_enabled() || bytes < fastenc_cpu::kCacheMinBytes || !opts.device().is_cpu())
    return at::empty(sizes, opts);
  void* p = fastenc_cpu::cache_alloc(bytes);
  return at::from_blob(p, sizes, [](void* q) { fastenc_cpu::cache_free(q); }, opts);
}

Tensor cpu_empty_like(const Tensor& t) { return cpu_empty(t.sizes(), t.options()); }

// Python: an uninitialized CPU tensor of `sizes` with like's dtype, from the cache (fastenc.layers.Linear's output).
Tensor buffer_empty(std::vector<int64_t> sizes, const Tensor& like) {
  return cpu_empty(sizes, like.options().device(at::kCPU));
}

std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t> buffer_cache_stats() {
  const auto s = fastenc_cpu::cache_stats();
  return {s.in_use_bytes, s.cached_bytes, s.peak_bytes, s.hits, s.misses};
}

void set_buffer_cache(bool on) {
  cache_enabled() = on;
  if (!on) fastenc_cpu::cache_release();
}

// fp32 contiguous copy (or the tensor itself when already fp32 contiguous) for the fp32 CPU kernels.
Tensor f32(const Tensor& t) { return t.to(at::kFloat).contiguous(); }
const float* fptr(const OptTensor& t) { return t.has_value() ? t->data_ptr<float>() : nullptr; }

void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "fastenc cpu backend: ", name, " must be a CPU tensor, got ", t.device());
}

// ---------------------------------------------------------------- norm (cpu)
bool all_bf16(std::initializer_list<Tensor> ts) {
  for (const auto& t : ts)
    if (t.scalar_type() != at::kBFloat16) return false;
  return true;
}
// bf16 tensors as raw bits for the bf16-storage kernels (cpu_kernels.h); contiguous tensors only.
uint16_t* bptr(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }
uint16_t* bptr(const OptTensor& t) { return t.has_value() ? bptr(*t) : nullptr; }

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

// ---------------------------------------------------------------- norm backward (cpu)
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

// ---------------------------------------------------------------- activations (cpu)
// Into `out` when the kernel can write it directly (fp32, or bf16 throughout; unit column stride), else computed
// and copied. gelu's out may be x itself, geglu's out may be x[:, :n] (in place over the input halves).
Tensor gelu_into(const Tensor& x, const OptTensor& bias, const std::string& approximate, const OptTensor& out_opt) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2, "gelu: x must be (rows, n)");
  const bool tanh_approx = approximate == "tanh";
  const bool bf16 = all_bf16({x}) && (!bias || all_bf16({*bias}));
  const bool f32_in = x.scalar_type() == at::kFloat && (!bias || bias->scalar_type() == at::kFloat);
  const bool direct = (bf16 || f32_in) && (!out_opt || (out_opt->is_contiguous() && x.is_contiguous()));
  if (!direct) {  // fp16 (or a strided out): fp32 kernel, then one rounding into out
    Tensor xf = f32(x);
    OptTensor bf = bias.has_value() ? OptTensor(f32(*bias)) : std::nullopt;
    Tensor yf = cpu_empty_like(xf);
    fastenc_cpu::gelu_fwd(xf.data_ptr<float>(), fptr(bf), yf.data_ptr<float>(), x.size(0), x.size(1), tanh_approx);
    if (!out_opt) return yf.to(x.scalar_type());
    out_opt->copy_(yf);
    return *out_opt;
  }
  Tensor xc = x.contiguous();
  OptTensor bc = bias ? OptTensor(bias->contiguous()) : std::nullopt;
  Tensor out = out_opt ? *out_opt : cpu_empty_like(xc);
  if (bf16)
    fastenc_cpu::gelu_fwd_bf16(bptr(xc), bptr(bc), bptr(out), x.size(0), x.size(1), tanh_approx);
  else
    fastenc_cpu::gelu_fwd(xc.data_ptr<float>(), fptr(bc), out.data_ptr<float>(), x.size(0), x.size(1), tanh_approx);
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
  const bool tanh_approx = approximate == "tanh";
  const bool bf16 = all_bf16({x}), f32_in = x.scalar_type() == at::kFloat;
  const bool direct = (bf16 || f32_in) && x.is_contiguous() &&
                      (!out_opt || (out_opt->stride(1) == 1 && out_opt->stride(0) >= n));
  if (!direct) {
    Tensor xf = f32(x);
    Tensor yf = cpu_empty({rows, n}, xf.options());
    fastenc_cpu::geglu_fwd(xf.data_ptr<float>(), yf.data_ptr<float>(), rows, n, n, tanh_approx);
    if (!out_opt) return yf.to(x.scalar_type());
    out_opt->copy_(yf);
    return *out_opt;
  }
  Tensor out = out_opt ? *out_opt : cpu_empty({rows, n}, x.options());
  const int64_t ldo = rows > 1 ? out.stride(0) : n;
  if (bf16)
    fastenc_cpu::geglu_fwd_bf16(bptr(x), bptr(out), rows, n, ldo, tanh_approx);
  else
    fastenc_cpu::geglu_fwd(x.data_ptr<float>(), out.data_ptr<float>(), rows, n, ldo, tanh_approx);
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

// ---------------------------------------------------------------- rope (cpu), forward and backward
// The kernel checks each position where it reads it; any outside [0, P) raises here (outputs are discarded).
std::tuple<Tensor, Tensor> rope_cpu(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                                    const Tensor& positions, bool inverse) {
  check_cpu(q, "q");
  check_cpu(k, "k");
  check_cpu(positions, "positions");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
              "rope: q, k must be (tokens, heads, dim)");
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && 2 * cos.size(1) <= q.size(2),
              "rope: cos, sin must both be (positions, half) with 2*half <= ", q.size(2), ", got ", cos.sizes(),
              " and ", sin.sizes());
  TORCH_CHECK(positions.numel() == q.size(0), "rope: positions must have one entry per token");
  // fp32 q, k whose every token's (heads, dim) block is contiguous are read in place at their token stride (q and
  // k sliced out of a fused QKV buffer, their gradients out of one); others are copied first. Outputs contiguous.
  auto token_rows = [](const Tensor& t) {
    return t.scalar_type() == at::kFloat && (t.size(1) <= 1 || t.stride(1) == t.size(2)) &&
                   (t.size(2) <= 1 || t.stride(2) == 1) && t.stride(0) >= t.size(1) * t.size(2)
               ? t
               : f32(t);
  };
  Tensor qf = token_rows(q), kf = token_rows(k), cf = f32(cos), sf = f32(sin);
  Tensor pos = positions.to(at::kInt).contiguous();
  Tensor qo = cpu_empty(qf.sizes(), qf.options()), ko = cpu_empty(kf.sizes(), kf.options());
  const int64_t bad = fastenc_cpu::rope_fwd(qf.data_ptr<float>(), kf.data_ptr<float>(), qo.data_ptr<float>(),
                                            ko.data_ptr<float>(), cf.data_ptr<float>(), sf.data_ptr<float>(),
                                            pos.data_ptr<int32_t>(), q.size(0), q.size(1), k.size(1), q.size(2),
                                            cos.size(1), cos.size(0), inverse, qf.stride(0), kf.stride(0));
  TORCH_CHECK_VALUE(bad == 0, "rope: positions (from position_ids or cu_seqlens) must be in [0, ", cos.size(0),
                    ") (the cos/sin table); ", bad, " of ", q.size(0), " tokens are outside");
  return {qo.to(q.scalar_type()), ko.to(k.scalar_type())};
}

std::tuple<Tensor, Tensor> rope(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                                const Tensor& positions) {
  return rope_cpu(q, k, cos, sin, positions, false);
}

// (dq, dk) from the output gradients: the inverse rotation.
std::tuple<Tensor, Tensor> rope_bwd(const Tensor& grad_q, const Tensor& grad_k, const Tensor& cos, const Tensor& sin,
                                    const Tensor& positions) {
  return rope_cpu(grad_q, grad_k, cos, sin, positions, true);
}

// ---------------------------------------------------------------- gelu / geglu backward (cpu)
// grad, x (rows, n) -> (dx (rows, n), dbias (n,) in x's dtype, or empty without bias); bf16 end to end or fp32 math
// over fp32 copies. dbias is summed in fp32 inside the kernel. need_dx / need_dbias false: that output is empty and
// the kernel neither writes nor sums it.
std::tuple<Tensor, Tensor> gelu_bwd(const Tensor& grad, const Tensor& x, const OptTensor& bias,
                                    const std::string& approximate, bool need_dx, bool need_dbias) {
  check_cpu(x, "x");
  check_cpu(grad, "grad");
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be 'none' or 'tanh'");
  TORCH_CHECK(x.dim() == 2 && grad.sizes() == x.sizes(), "gelu backward: grad must have x's shape ", x.sizes(),
              ", got ", grad.sizes());
  TORCH_CHECK(!bias || bias->numel() == x.size(1), "gelu backward: bias must have ", x.size(1), " elements");
  const bool tanh_approx = approximate == "tanh";
  const bool sum = bias && need_dbias;
  const int64_t rows = x.size(0), n = x.size(1);
  Tensor db = sum ? at::empty({n}, x.options().dtype(at::kFloat)) : at::empty({0}, x.options());
  float* dbp = sum ? db.data_ptr<float>() : nullptr;
  if (all_bf16({grad, x}) && (!bias || all_bf16({*bias}))) {
    Tensor gc = grad.contiguous(), xc = x.contiguous();
    OptTensor bc = bias ? OptTensor(bias->contiguous()) : std::nullopt;
    Tensor dx = need_dx ? cpu_empty_like(xc) : at::empty({0}, x.options());
    fastenc_cpu::gelu_bwd_bf16(bptr(gc), bptr(xc), bptr(bc), need_dx ? bptr(dx) : nullptr, dbp, rows, n, tanh_approx);
    return {dx, sum ? db.to(x.scalar_type()) : db};
  }
  Tensor gf = f32(grad), xf = f32(x);
  OptTensor bf = bias ? OptTensor(f32(*bias)) : std::nullopt;
  Tensor dx = need_dx ? cpu_empty_like(xf) : at::empty({0}, xf.options());
  fastenc_cpu::gelu_bwd(gf.data_ptr<float>(), xf.data_ptr<float>(), fptr(bf), need_dx ? dx.data_ptr<float>() : nullptr,
                        dbp, rows, n, tanh_approx);
  return {dx.to(x.scalar_type()), sum ? db.to(x.scalar_type()) : db};
}

// ---------------------------------------------------------------- dropout (cpu), fp32
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

// grad (rows, n), x (rows, 2n) -> dx (rows, 2n): [d input | d gate].
Tensor geglu_bwd(const Tensor& grad, const Tensor& x, const std::string& approximate) {
  check_cpu(x, "x");
  check_cpu(grad, "grad");
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "geglu: approximate must be 'none' or 'tanh'");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0 && grad.dim() == 2 && grad.size(0) == x.size(0) &&
                  grad.size(1) * 2 == x.size(1),
              "geglu backward: grad must be (rows, n) for x (rows, 2n), got ", grad.sizes(), " and ", x.sizes());
  const bool tanh_approx = approximate == "tanh";
  const int64_t rows = x.size(0), n = x.size(1) / 2;
  if (all_bf16({grad, x})) {
    Tensor gc = grad.contiguous(), xc = x.contiguous();
    Tensor dx = cpu_empty_like(xc);
    fastenc_cpu::geglu_bwd_bf16(bptr(gc), bptr(xc), bptr(dx), rows, n, tanh_approx);
    return dx;
  }
  Tensor gf = f32(grad), xf = f32(x);
  Tensor dx = cpu_empty_like(xf);
  fastenc_cpu::geglu_bwd(gf.data_ptr<float>(), xf.data_ptr<float>(), dx.data_ptr<float>(), rows, n, tanh_approx);
  return dx.to(x.scalar_type());
}

// ---------------------------------------------------------------- packed-panel GEMM (cpu)
// gemm_pack: w (n, k) fp32 -> its panels (csrc/cpu/gemm.cpp). gemm_packed: x (m, k) fp32 (unit column stride) times
// the packed W^T (+ bias (n,)) -> out (m, n) (unit column stride; a new tensor when not given), out += when accumulate;
// gelu ("none": exact, "tanh") applied last when given (the MLP's first projection), None for no activation.
Tensor gemm_pack(const Tensor& w) {
  check_cpu(w, "weight");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "gemm_pack: weight must be 2-D float32, got ",
              w.scalar_type(), " ", w.sizes());
  const Tensor wc = w.contiguous();
  const int64_t n = w.size(0), k = w.size(1), nw = fastenc_cpu::gemm_panel_width();
  Tensor out = at::empty({(n + nw - 1) / nw, k, nw}, wc.options());
  fastenc_cpu::gemm_pack(wc.data_ptr<float>(), n, k, out.data_ptr<float>());
  return out;
}

Tensor gemm_packed(const Tensor& x, const Tensor& packed, int64_t n, const OptTensor& bias, const OptTensor& out,
                   bool accumulate, const std::optional<std::string>& gelu) {
  check_cpu(x, "x");
  check_cpu(packed, "packed");
  const int64_t nw = fastenc_cpu::gemm_panel_width();
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && (x.stride(1) == 1 || x.size(1) <= 1),
              "gemm_packed: x must be 2-D float32 with unit column stride, got ", x.scalar_type(), " ", x.sizes());
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(0) == (n + nw - 1) / nw && packed.size(1) == k && packed.size(2) == nw,
              "gemm_packed: packed must be gemm_pack's (", (n + nw - 1) / nw, ", ", k, ", ", nw, ") float32, got ",
              packed.sizes());
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n),
              "gemm_packed: bias must be (", n, ",) float32");
  TORCH_CHECK(!accumulate || out, "gemm_packed: accumulate needs out");
  TORCH_CHECK(!gelu || *gelu == "none" || *gelu == "tanh", "gemm_packed: gelu must be None, 'none' or 'tanh', got '",
              gelu ? *gelu : "", "'");
  const auto act = !gelu ? fastenc_cpu::GemmActivation::kNone
                         : (*gelu == "tanh" ? fastenc_cpu::GemmActivation::kGeluTanh : fastenc_cpu::GemmActivation::kGelu);
  if (out) {
    check_cpu(*out, "out");
    TORCH_CHECK(out->scalar_type() == at::kFloat && out->dim() == 2 && out->size(0) == m && out->size(1) == n &&
                    (out->stride(1) == 1 || n <= 1) && (out->stride(0) >= n || m <= 1),
                "gemm_packed: out must be (", m, ", ", n, ") float32 with unit column stride, got ", out->sizes());
  }
  Tensor y = out ? *out : cpu_empty({m, n}, x.options());
  const Tensor bc = bias ? bias->contiguous() : Tensor();
  if (m > 0 && n > 0)
    fastenc_cpu::gemm_packed(x.data_ptr<float>(), m, k, std::max<int64_t>(x.stride(0), 1), packed.data_ptr<float>(),
                             n, bias ? bc.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                             std::max<int64_t>(y.stride(0), 1), accumulate, at::get_num_threads(), act);
  return y;
}

// ---------------------------------------------------------------- attention (cpu)
// fp32 q, k, v with one row stride, heads head_dim apart and unit element stride (e.g. column blocks of one QKV
// GEMM's (tokens, 3 * hidden) output): the kernels read them in place with that row stride.
static bool qkv_in_place(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t H = q.size(1), D = q.size(2);
  return q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
         k.strides() == q.strides() && v.strides() == q.strides() && q.stride(2) == 1 && q.stride(1) == D &&
         q.stride(0) >= H * D;
}

// q, k, v: (total_tokens, heads, head_dim) fp32/fp16/bf16 -> (out like q, lse (heads, total_tokens) fp32); the
// kernel computes in fp32.
// dropout_p > 0: attention-probability dropout with the keep-mask of (seed, offset) (csrc/cpu/attention_dropout.h).
std::tuple<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                                     int64_t max_seqlen, int64_t window_left, int64_t window_right, double scale,
                                     double dropout_p, int64_t seed, int64_t offset) {
  check_cpu(q, "q");
  check_cpu(k, "k");
  check_cpu(v, "v");
  check_cpu(cu_seqlens, "cu_seqlens");
  TORCH_CHECK(q.dim() == 3 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "attention: q, k, v must be (total_tokens, heads, head_dim) of one shape, got ", q.sizes(), ", ",
              k.sizes(), ", ", v.sizes());
  TORCH_CHECK(cu_seqlens.scalar_type() == at::kInt && cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 2,
              "attention: cu_seqlens must be 1-D int32 of length batch+1");
  TORCH_CHECK(window_left >= -1 && window_right >= -1, "attention: window sizes must be >= 0 or -1 (unbounded)");
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "attention: dropout_p must be in [0, 1), got ", dropout_p);
  // A private copy: the values checked here are the values the kernel reads (the caller's tensor can change).
  Tensor cu = cu_seqlens.clone(at::MemoryFormat::Contiguous);
  const int32_t* c = cu.data_ptr<int32_t>();
  const int64_t batch = cu.numel() - 1, total = q.size(0);
  TORCH_CHECK(c[0] == 0 && c[batch] == total, "attention: cu_seqlens must run from 0 to total_tokens=", total);
  for (int64_t b = 0; b < batch; ++b)
    TORCH_CHECK(c[b + 1] >= c[b], "attention: cu_seqlens must be non-decreasing");
  // q, k, v are read in place when qkv_in_place holds; anything else is copied to contiguous fp32 first.
  const int64_t H = q.size(1), D = q.size(2);
  const bool in_place = qkv_in_place(q, k, v);
  Tensor qf = in_place ? q : f32(q), kf = in_place ? k : f32(k), vf = in_place ? v : f32(v);
  Tensor out = cpu_empty({total, H, D}, qf.options());
  Tensor lse = at::empty({H, total}, qf.options());
  if (total > 0 && H > 0 && D > 0) {
    fastenc_cpu::attention_fwd(qf.data_ptr<float>(), kf.data_ptr<float>(), vf.data_ptr<float>(),
                               out.data_ptr<float>(), c, batch, H, D, window_left, window_right,
                               (float)scale, at::get_num_threads(), lse.data_ptr<float>(), dropout_p, seed, offset,
                               in_place ? q.stride(0) : 0);
  } else {
    out.zero_();
    lse.fill_(INFINITY);
  }
  (void)max_seqlen;  // the kernel reads lengths from cu_seqlens
  return {out.to(q.scalar_type()), lse};
}

// Backward of attention (csrc/cpu/attention_bwd.cpp): grad, q, k, v, out (total_tokens, heads, head_dim) of one shape,
// lse (heads, total_tokens) fp32 from the forward -> (dq, dk, dv) in q's dtype; fp32 math. dropout_p, seed, offset:
// the forward's. need_dq / need_dkdv false: that gradient is not computed and comes back empty (numel 0).
// q, k, v are read in place when qkv_in_place holds (else copied to contiguous fp32). grad_qkv (fp32, (total_tokens,
// 3 * heads * head_dim), unit column stride): dq, dk, dv are written into its three column blocks (a gradient not
// needed: its block is zeroed) and come back as views of it; q must then be fp32.
std::tuple<Tensor, Tensor, Tensor> attention_bwd(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens,
                                                 int64_t max_seqlen, int64_t window_left, int64_t window_right,
                                                 double scale, double dropout_p, int64_t seed, int64_t offset,
                                                 bool need_dq, bool need_dkdv, const OptTensor& grad_qkv) {
  const std::pair<const Tensor*, const char*> args[] = {{&grad, "grad"}, {&q, "q"},     {&k, "k"},
                                                        {&v, "v"},       {&out, "out"}, {&lse, "lse"},
                                                        {&cu_seqlens, "cu_seqlens"}};
  for (const auto& [t, name] : args) check_cpu(*t, name);
  TORCH_CHECK(q.dim() == 3 && k.sizes() == q.sizes() && v.sizes() == q.sizes() && out.sizes() == q.sizes() &&
                  grad.sizes() == q.sizes(),
              "attention_bwd: grad, q, k, v, out must be (total_tokens, heads, head_dim) of one shape, got grad ",
              grad.sizes(), ", q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), ", out ", out.sizes());
  const int64_t total = q.size(0), heads = q.size(1), D = q.size(2);
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.dim() == 2 && lse.size(0) == heads && lse.size(1) == total,
              "attention_bwd: lse must be float32 (heads, total_tokens)=(", heads, ", ", total, "), got ",
              lse.scalar_type(), " ", lse.sizes());
  TORCH_CHECK(cu_seqlens.scalar_type() == at::kInt && cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 2,
              "attention_bwd: cu_seqlens must be 1-D int32 of length batch+1");
  TORCH_CHECK(window_left >= -1 && window_right >= -1, "attention_bwd: window sizes must be >= 0 or -1 (unbounded)");
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "attention_bwd: dropout_p must be in [0, 1), got ", dropout_p);
  if (grad_qkv) {
    check_cpu(*grad_qkv, "grad_qkv");
    TORCH_CHECK(grad_qkv->scalar_type() == at::kFloat && q.scalar_type() == at::kFloat && grad_qkv->dim() == 2 &&
                    grad_qkv->size(0) == total && grad_qkv->size(1) == 3 * heads * D &&
                    (grad_qkv->stride(1) == 1 || heads * D == 0) && grad_qkv->stride(0) >= 3 * heads * D,
                "attention_bwd: grad_qkv must be float32 (total_tokens, 3 * heads * head_dim)=(", total, ", ",
                3 * heads * D, ") with unit column stride and row stride >= ", 3 * heads * D, " for fp32 q, got ",
                grad_qkv->scalar_type(), " ", grad_qkv->sizes(), " strides ", grad_qkv->strides(), " (q ",
                q.scalar_type(), ")");
  }
  // A private copy: the values checked here are the values the kernel reads (the caller's tensor can change).
  Tensor cu = cu_seqlens.clone(at::MemoryFormat::Contiguous);
  const int32_t* c = cu.data_ptr<int32_t>();
  const int64_t batch = cu.numel() - 1;
  TORCH_CHECK(c[0] == 0 && c[batch] == total, "attention_bwd: cu_seqlens must run from 0 to total_tokens=", total);
  for (int64_t b = 0; b < batch; ++b)
    TORCH_CHECK(c[b + 1] >= c[b], "attention_bwd: cu_seqlens must be non-decreasing");
  const bool in_place = qkv_in_place(q, k, v);
  Tensor gf = f32(grad), of = f32(out), lf = lse.contiguous();
  Tensor qf = in_place ? q : f32(q), kf = in_place ? k : f32(k), vf = in_place ? v : f32(v);
  const int64_t hd = heads * D;
  auto none = [&] { return at::empty({0}, q.options()); };  // one tensor per output: outputs never alias
  Tensor dq, dk, dv;
  if (grad_qkv) {  // views of the caller's buffer; blocks not computed are zeroed
    const Tensor g3 = grad_qkv->view({total, 3, heads, D});
    dq = g3.select(1, 0), dk = g3.select(1, 1), dv = g3.select(1, 2);
    if (!need_dq) dq.zero_();
    if (!need_dkdv) dk.zero_(), dv.zero_();
  } else {
    dq = need_dq ? cpu_empty_like(gf) : none();
    dk = need_dkdv ? cpu_empty_like(gf) : none(), dv = need_dkdv ? cpu_empty_like(gf) : none();
  }
  const int64_t ldd = grad_qkv ? grad_qkv->stride(0) : 0;
  if (total > 0 && heads > 0 && D > 0) {
    if (need_dq || need_dkdv)
      fastenc_cpu::attention_bwd(gf.data_ptr<float>(), qf.data_ptr<float>(), kf.data_ptr<float>(),
                                 vf.data_ptr<float>(), of.data_ptr<float>(), lf.data_ptr<float>(),
                                 need_dq ? dq.data_ptr<float>() : nullptr, need_dkdv ? dk.data_ptr<float>() : nullptr,
                                 need_dkdv ? dv.data_ptr<float>() : nullptr, c, batch, heads, D, window_left,
                                 window_right, (float)scale, at::get_num_threads(), dropout_p, seed, offset,
                                 in_place ? q.stride(0) : 0, ldd);
  } else if (!grad_qkv) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
  } else {
    grad_qkv->zero_();
  }
  (void)max_seqlen;
  if (grad_qkv) return {dq, dk, dv};
  return {dq.to(q.scalar_type()), dk.to(q.scalar_type()), dv.to(q.scalar_type())};
}

// ---------------------------------------------------------------- lora (cpu)
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

#endif  // !FASTENC_WITH_CUDA (cpu half)


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
  m.doc() = "fastenc C++ extension: CPU (C++/OpenMP) or, built with FASTENC_WITH_CUDA, CUDA kernels";
  m.def("torch_version", &torch_version, "torch version the extension was built against");
  m.def("has_cuda", &has_cuda);
#ifndef FASTENC_WITH_CUDA
  // cpu half defs
  m.def("buffer_empty", &buffer_empty, "uninitialized CPU tensor from the buffer cache");
  m.def("gemm_pack", &gemm_pack, "weight (n, k) fp32 -> the panel GEMM's packed panels");
  m.def("gemm_packed", &gemm_packed, "x @ W^T (+ bias) (+ out) (then gelu) with W packed by gemm_pack, fp32");
  m.def("buffer_cache_stats", &buffer_cache_stats, "(in use, cached, peak in use, hits, misses): bytes, counts");
  m.def("buffer_cache_release", &fastenc_cpu::cache_release, "free every cached block");
  m.def("set_buffer_cache", &set_buffer_cache, "turn the buffer cache on or off (off also frees it)");
  m.def("buffer_cache_enabled", [] { return cache_enabled(); });
  m.def("layer_norm", &layer_norm, "LayerNorm (+residual), fp32 math");
  m.def("rms_norm", &rms_norm, "RMSNorm (+residual), optional weight, fp32 math");
  m.def("norm_bwd", &norm_bwd, "LayerNorm / RMSNorm backward from the saved statistics, fp32 math");
  m.def("gelu", &gelu, "gelu(x + bias)");
  m.def("gelu_out", &gelu_out, "gelu(x + bias) into out (may be x)");
  m.def("geglu", &geglu, "gelu(x[:, :n]) * x[:, n:]");
  m.def("geglu_out", &geglu_out, "gelu(x[:, :n]) * x[:, n:] into out (may be x[:, :n])");
  m.def("rope", &rope, "rotate-half RoPE of q and k");
  m.def("rope_bwd", &rope_bwd, "rope backward: the inverse rotation of the output gradients");
  m.def("gelu_bwd", &gelu_bwd, "gelu backward: (dx, dbias)");
  m.def("geglu_bwd", &geglu_bwd, "geglu backward: dx = [d input | d gate]");
  m.def("dropout", &dropout, "(x + bias) * keep / (1 - p), counter-based keep-mask, fp32");
  m.def("dropout_bwd", &dropout_bwd, "dropout backward: grad * keep / (1 - p)");
  // attention (cpu) defs
  m.def("attention", &attention, "varlen bidirectional attention (online softmax, window, dropout), fp32 math -> (out, lse)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("window_left"),
        py::arg("window_right"), py::arg("scale"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0,
        py::arg("offset") = 0);
  m.def("attention_bwd", &attention_bwd, "backward of attention from out and lse: (dq, dk, dv), fp32 math",
        py::arg("grad"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
        py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("window_left"), py::arg("window_right"),
        py::arg("scale"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0, py::arg("offset") = 0,
        py::arg("need_dq") = true, py::arg("need_dkdv") = true, py::arg("grad_qkv") = py::none());
  // lora (cpu) defs
  m.def("merge_lora", &merge_lora, "W + scale * B @ A, fp32 accumulation, rounded once");
  m.def("lora_linear", &lora_linear, "x W^T + b + scale (x A^T) B^T via torch GEMMs, fp32");
  m.def("lora_linear_bwd", &lora_linear_bwd, "lora_linear gradients (x, weight, bias, A, B) via torch GEMMs, fp32");
#endif  // !FASTENC_WITH_CUDA (cpu half defs)
#ifdef FASTENC_WITH_CUDA
  fastenc_bindings::bind_cuda(m);  // bindings_cuda.cpp
#endif
}
