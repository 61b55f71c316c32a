// torch-facing wrappers of the varlen attention kernels (attention.cpp, attention_bwd.cpp) and their registration:
// attention (-> out, lse) and attention_bwd, fp32 math.
#include <ATen/Parallel.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;

// The distance bias lookup: (heads, 2 L - 1) fp32 on the CPU, made contiguous; the kernels check L against the
// lengths they read from cu_seqlens.
Tensor check_bias(const Tensor& bias, int64_t heads, const char* op) {
  check_cpu(bias, "bias");
  TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.dim() == 2 && bias.size(0) == heads && bias.size(1) % 2 == 1,
              op, ": bias must be float32 (heads=", heads, ", 2 L - 1), got ", bias.scalar_type(), " ", bias.sizes());
  return bias.contiguous();
}

// fp32 q, k, v with one row stride, heads head_dim apart and unit element stride (e.g. column blocks of one QKV
// GEMM's (tokens, 3 * hidden) output): the kernels read them in place with that row stride.
bool qkv_in_place(const Tensor& q, const Tensor& k, const Tensor& v) {
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
                                     double dropout_p, int64_t seed, int64_t offset, const OptTensor& bias) {
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
  const Tensor bc = bias ? check_bias(*bias, H, "attention") : Tensor();
  const bool in_place = qkv_in_place(q, k, v);
  Tensor qf = in_place ? q : f32(q), kf = in_place ? k : f32(k), vf = in_place ? v : f32(v);
  Tensor out = cpu_empty({total, H, D}, qf.options());
  Tensor lse = at::empty({H, total}, qf.options());
  if (total > 0 && H > 0 && D > 0) {
    fastenc_cpu::attention_fwd(qf.data_ptr<float>(), kf.data_ptr<float>(), vf.data_ptr<float>(),
                               out.data_ptr<float>(), c, batch, H, D, window_left, window_right,
                               (float)scale, at::get_num_threads(), lse.data_ptr<float>(), dropout_p, seed, offset,
                               in_place ? q.stride(0) : 0, bias ? bc.data_ptr<float>() : nullptr,
                               bias ? bc.size(1) : 0);
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
// needed: its block is zeroed) and come back as views of it; q must then be fp32. bias (the forward's distance
// lookup, (heads, 2 L - 1) fp32): a fourth result, its gradient dbias of the same shape (fp32).
std::vector<Tensor> attention_bwd(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens,
                                                 int64_t max_seqlen, int64_t window_left, int64_t window_right,
                                                 double scale, double dropout_p, int64_t seed, int64_t offset,
                                                 bool need_dq, bool need_dkdv, const OptTensor& grad_qkv,
                                                 const OptTensor& bias) {
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
  const Tensor bc = bias ? check_bias(*bias, heads, "attention_bwd") : Tensor();
  Tensor dbias = bias ? at::zeros(bc.sizes(), bc.options()) : Tensor();
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
    if (need_dq || need_dkdv || bias)
      fastenc_cpu::attention_bwd(gf.data_ptr<float>(), qf.data_ptr<float>(), kf.data_ptr<float>(),
                                 vf.data_ptr<float>(), of.data_ptr<float>(), lf.data_ptr<float>(),
                                 need_dq ? dq.data_ptr<float>() : nullptr, need_dkdv ? dk.data_ptr<float>() : nullptr,
                                 need_dkdv ? dv.data_ptr<float>() : nullptr, c, batch, heads, D, window_left,
                                 window_right, (float)scale, at::get_num_threads(), dropout_p, seed, offset,
                                 in_place ? q.stride(0) : 0, ldd, bias ? bc.data_ptr<float>() : nullptr,
                                 bias ? bc.size(1) : 0, bias ? dbias.data_ptr<float>() : nullptr);
  } else if (!grad_qkv) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
  } else {
    grad_qkv->zero_();
  }
  (void)max_seqlen;
  std::vector<Tensor> res = grad_qkv ? std::vector<Tensor>{dq, dk, dv}
                                     : std::vector<Tensor>{dq.to(q.scalar_type()), dk.to(q.scalar_type()),
                                                           dv.to(q.scalar_type())};
  if (bias) res.push_back(dbias);
  return res;
}

}  // namespace

FASTENC_BINDINGS(attention) {
  m.def("attention", &attention, "varlen bidirectional attention (online softmax, window, dropout), fp32 math -> (out, lse)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("window_left"),
        py::arg("window_right"), py::arg("scale"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0,
        py::arg("offset") = 0, py::arg("bias") = py::none());
  m.def("attention_bwd", &attention_bwd, "backward of attention from out and lse: (dq, dk, dv), fp32 math",
        py::arg("grad"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
        py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("window_left"), py::arg("window_right"),
        py::arg("scale"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0, py::arg("offset") = 0,
        py::arg("need_dq") = true, py::arg("need_dkdv") = true, py::arg("grad_qkv") = py::none(),
        py::arg("bias") = py::none());
}
