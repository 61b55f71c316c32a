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

// The relative terms of one call (fastenc/ops/attention.py), checked for what the kernels rely on, with the tensors
// that own their memory (fp32 contiguous copies of c2p / p2c when needed): the kernels copy positions and slot
// privately and check their values.
struct RelArgs {
  Tensor bias, positions, c2p, p2c, slot;
  fastenc_cpu::Relative rel;
  bool any = false;
};

RelArgs check_relative(const OptTensor& bias, const OptTensor& positions, const OptTensor& c2p, const OptTensor& p2c,
                       const OptTensor& slot, int64_t total, int64_t heads, const char* op) {
  RelArgs a;
  auto& r = a.rel;
  if (bias) {
    a.bias = check_bias(*bias, heads, op);
    r.bias = a.bias.data_ptr<float>();
    r.bias_len = a.bias.size(1);
  }
  if (positions) {
    check_cpu(*positions, "positions");
    TORCH_CHECK(positions->scalar_type() == at::kInt && positions->dim() == 1 && positions->size(0) == total, op,
                ": positions must be int32 (total_tokens=", total, ",), got ", positions->scalar_type(), " ",
                positions->sizes());
    a.positions = positions->contiguous();
    r.positions = a.positions.data_ptr<int32_t>();
  }
  int64_t slots = -1;
  for (auto [t, name, dst, ptr] : {std::make_tuple(&c2p, "c2p", &a.c2p, &r.c2p), std::make_tuple(&p2c, "p2c", &a.p2c, &r.p2c)}) {
    if (!*t) continue;
    const Tensor& x = **t;
    check_cpu(x, name);
    TORCH_CHECK(x.dim() == 3 && x.size(0) == total && x.size(1) == heads && x.size(2) >= 1 &&
                    (slots < 0 || x.size(2) == slots) && at::isFloatingType(x.scalar_type()),
                op, ": ", name, " must be float (total_tokens=", total, ", heads=", heads,
                ", slots) with one slot count for c2p and p2c, got ", x.scalar_type(), " ", x.sizes());
    slots = x.size(2);
    *dst = f32(x);
    *ptr = dst->data_ptr<float>();
  }
  r.slots = slots < 0 ? 0 : slots;
  if (slot) {
    check_cpu(*slot, "slot");
    TORCH_CHECK(slot->scalar_type() == at::kInt && slot->dim() == 1 && slot->size(0) % 2 == 1, op,
                ": slot must be int32 (2 L - 1,), got ", slot->scalar_type(), " ", slot->sizes());
    a.slot = slot->contiguous();
    r.slot = a.slot.data_ptr<int32_t>();
    r.slot_len = a.slot.size(0);
  }
  TORCH_CHECK((c2p || p2c) == slot.has_value(), op, ": slot must be given exactly when c2p or p2c is");
  TORCH_CHECK(!positions || bias || slot, op, ": positions need a relative term (bias, c2p or p2c)");
  a.any = bias || positions || c2p || p2c || slot;
  return a;
}

// q, k, v: (total_tokens, heads, head_dim) fp32/fp16/bf16 -> (out like q, lse (heads, total_tokens) fp32); the
// kernel computes in fp32. bias, positions, c2p, p2c, slot: the relative terms (csrc/cpu/attention.h's Relative).
// dropout_p > 0: attention-probability dropout with the keep-mask of (seed, offset) (csrc/cpu/attention_dropout.h).
std::tuple<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                                     int64_t max_seqlen, int64_t window_left, int64_t window_right, double scale,
                                     double dropout_p, int64_t seed, int64_t offset, const OptTensor& bias,
                                     const OptTensor& positions, const OptTensor& c2p, const OptTensor& p2c,
                                     const OptTensor& slot) {
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
  const RelArgs ra = check_relative(bias, positions, c2p, p2c, slot, total, H, "attention");
  const bool in_place = qkv_in_place(q, k, v);
  Tensor qf = in_place ? q : f32(q), kf = in_place ? k : f32(k), vf = in_place ? v : f32(v);
  Tensor out = cpu_empty({total, H, D}, qf.options());
  Tensor lse = at::empty({H, total}, qf.options());
  if (total > 0 && H > 0 && D > 0) {
    fastenc_cpu::attention_fwd(qf.data_ptr<float>(), kf.data_ptr<float>(), vf.data_ptr<float>(),
                               out.data_ptr<float>(), c, batch, H, D, window_left, window_right,
                               (float)scale, at::get_num_threads(), lse.data_ptr<float>(), dropout_p, seed, offset,
                               in_place ? q.stride(0) : 0, ra.any ? &ra.rel : nullptr);
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
// needed: its block is zeroed) and come back as views of it; q must then be fp32. With any relative term (bias,
// positions, c2p, p2c, slot: the forward's) three more results, (dbias, dc2p, dp2c) fp32 of their inputs' shapes,
// each empty (numel 0) where its input is None.
std::vector<Tensor> attention_bwd(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens,
                                                 int64_t max_seqlen, int64_t window_left, int64_t window_right,
                                                 double scale, double dropout_p, int64_t seed, int64_t offset,
                                                 bool need_dq, bool need_dkdv, const OptTensor& bias,
                                                 const OptTensor& positions, const OptTensor& c2p,
                                                 const OptTensor& p2c, const OptTensor& slot,
                                                 const OptTensor& grad_qkv) {
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
  const RelArgs ra = check_relative(bias, positions, c2p, p2c, slot, total, heads, "attention_bwd");
  const auto f32opts = q.options().dtype(at::kFloat);
  auto grad_of = [&](const OptTensor& t) { return t ? at::zeros(t->sizes(), f32opts) : at::empty({0}, f32opts); };
  // (dc2p / dp2c: every element is written by the kernel, each item zeroing its own rows first)
  auto written = [&](const OptTensor& t) { return at::empty(t ? t->sizes() : at::IntArrayRef{0}, f32opts); };
  Tensor dbias = grad_of(bias), dc2p = written(c2p), dp2c = written(p2c);
  fastenc_cpu::RelativeGrads rg;
  rg.dbias = bias ? dbias.data_ptr<float>() : nullptr;
  rg.dc2p = c2p ? dc2p.data_ptr<float>() : nullptr;
  rg.dp2c = p2c ? dp2c.data_ptr<float>() : nullptr;
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
    if (need_dq || need_dkdv || bias || c2p || p2c)
      fastenc_cpu::attention_bwd(gf.data_ptr<float>(), qf.data_ptr<float>(), kf.data_ptr<float>(),
                                 vf.data_ptr<float>(), of.data_ptr<float>(), lf.data_ptr<float>(),
                                 need_dq ? dq.data_ptr<float>() : nullptr, need_dkdv ? dk.data_ptr<float>() : nullptr,
                                 need_dkdv ? dv.data_ptr<float>() : nullptr, c, batch, heads, D, window_left,
                                 window_right, (float)scale, at::get_num_threads(), dropout_p, seed, offset,
                                 in_place ? q.stride(0) : 0, ldd, ra.any ? &ra.rel : nullptr,
                                 ra.any ? &rg : nullptr);
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
  if (ra.any) res.insert(res.end(), {dbias, dc2p, dp2c});
  return res;
}

}  // namespace

FASTENC_BINDINGS(attention) {
  m.def("attention", &attention, "varlen bidirectional attention (online softmax, window, dropout), fp32 math -> (out, lse)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("window_left"),
        py::arg("window_right"), py::arg("scale"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0,
        py::arg("offset") = 0, py::arg("bias") = py::none(), py::arg("positions") = py::none(),
        py::arg("c2p") = py::none(), py::arg("p2c") = py::none(), py::arg("slot") = py::none());
  m.def("attention_bwd", &attention_bwd, "backward of attention from out and lse: (dq, dk, dv), fp32 math",
        py::arg("grad"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
        py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("window_left"), py::arg("window_right"),
        py::arg("scale"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0, py::arg("offset") = 0,
        py::arg("need_dq") = true, py::arg("need_dkdv") = true, py::arg("bias") = py::none(),
        py::arg("positions") = py::none(), py::arg("c2p") = py::none(), py::arg("p2c") = py::none(),
        py::arg("slot") = py::none(), py::arg("grad_qkv") = py::none());
}
