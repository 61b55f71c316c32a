// torch-facing wrapper of the varlen FlashAttention-2 launcher (attention.h) and its registration: attention_cuda.
// Each checks device, dtype and shapes, makes inputs contiguous, allocates outputs and launches on the current
// stream of the input's device.
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "attention.h"
#include "cuda_bind.h"

namespace {

using namespace fastenc_cuda_torch;

// The relative terms of the contract in fastenc/ops/attention.py: positions int32 (total,), c2p / p2c in q's dtype
// (total, heads, slots), slot int32 (2L - 1,) given exactly with c2p / p2c, as long as bias when both are given.
void check_relative(const Tensor& q, const OptTensor& bias, int64_t max_seqlen, const OptTensor& positions,
                    const OptTensor& c2p, const OptTensor& p2c, const OptTensor& slot) {
  TORCH_CHECK(slot.has_value() == (c2p.has_value() || p2c.has_value()),
              "attention (cuda): slot must be given exactly when c2p or p2c is");
  TORCH_CHECK(!positions || bias || slot, "attention (cuda): positions needs a relative term (bias, c2p or p2c)");
  if (positions) {
    check_on(*positions, q, "attention", "positions");
    TORCH_CHECK(positions->scalar_type() == at::kInt && positions->dim() == 1 && positions->size(0) == q.size(0),
                "attention (cuda): positions must be int32 (total_tokens=", q.size(0), ",), got ",
                positions->scalar_type(), " ", positions->sizes());
  }
  int64_t slots = -1;
  const std::pair<const char*, const OptTensor*> terms[] = {{"c2p", &c2p}, {"p2c", &p2c}};
  for (const auto& [name, t] : terms) {
    if (!*t) continue;
    const Tensor& x = **t;
    check_on(x, q, "attention", name);
    TORCH_CHECK(x.scalar_type() == q.scalar_type() && x.dim() == 3 && x.size(0) == q.size(0) &&
                    x.size(1) == q.size(1) && x.size(2) >= 1 && (slots < 0 || x.size(2) == slots),
                "attention (cuda): ", name, " must be ", q.scalar_type(), " (total_tokens=", q.size(0), ", heads=",
                q.size(1), ", slots) with one number of slots for c2p and p2c, got ", x.scalar_type(), " ", x.sizes());
    slots = x.size(2);
  }
  if (slot) {
    check_on(*slot, q, "attention", "slot");
    TORCH_CHECK(slot->scalar_type() == at::kInt && slot->dim() == 1 && slot->size(0) % 2 == 1 &&
                    (slot->size(0) + 1) / 2 >= max_seqlen && (!bias || bias->size(1) == slot->size(0)),
                "attention (cuda): slot must be int32 (2L - 1,) with L >= max_seqlen=", max_seqlen,
                " and bias's length when both are given, got ", slot->scalar_type(), " ", slot->sizes());
  }
}

// cu_seqlens is not read back here (that would synchronize the stream): fastenc.ops.attention validated it on
// the host (and max_seqlen from the values it read), and the kernel skips a sequence whose bounds it reads
// outside [0, total_tokens].
std::tuple<Tensor, Tensor> attention_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                                          int64_t max_seqlen,
                      int64_t window_left, int64_t window_right, double scale, double dropout_p,
                                          int64_t seed, int64_t offset, const OptTensor& bias,
                                          const OptTensor& positions, const OptTensor& c2p, const OptTensor& p2c,
                                          const OptTensor& slot) {
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
  TORCH_CHECK(dropout_p == 0.0, "attention (cuda): dropout_p > 0 is not supported, got ", dropout_p);
  (void)seed, (void)offset;
  if (bias) {
    check_on(*bias, q, "attention", "bias");
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 2 && bias->size(0) == q.size(1) &&
                    bias->size(1) % 2 == 1 && (bias->size(1) + 1) / 2 >= max_seqlen,
                "attention (cuda): bias must be float32 (heads=", q.size(1), ", 2L - 1) with L >= max_seqlen=",
                max_seqlen, ", got ", bias->scalar_type(), " ", bias->sizes());
  }
  check_relative(q, bias, max_seqlen, positions, c2p, p2c, slot);
  const c10::cuda::CUDAGuard guard(q.device());
  const Tensor bc = bias ? bias->contiguous() : Tensor();
  const auto contig = [](const OptTensor& t) { return t ? t->contiguous() : Tensor(); };
  const Tensor pc = contig(positions), c2c = contig(c2p), p2cc = contig(p2c), sc = contig(slot);
  const auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), cu = cu_seqlens.contiguous();
  Tensor out = at::empty_like(qc);
  Tensor lse = at::empty({q.size(1), q.size(0)}, qc.options().dtype(at::kFloat));
  if (q.numel() == 0) return {out, lse.fill_(INFINITY)};
  check_launch(fastenc_cuda::attention_fwd(qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), out.data_ptr(),
                                           cu.data_ptr<int32_t>(), q.size(0), cu.numel() - 1, q.size(1), q.size(2),
                                           max_seqlen, window_left, window_right, static_cast<float>(scale), dt,
                                           c10::cuda::getCurrentCUDAStream(), lse.data_ptr<float>(),
                                           bias ? bc.data_ptr<float>() : nullptr, bias ? bc.size(1) : 0,
                                           static_cast<const int32_t*>(ptr(pc)), ptr(c2c), ptr(p2cc),
                                           static_cast<const int32_t*>(ptr(sc)), slot ? sc.numel() : 0,
                                           c2p ? c2p->size(2) : (p2c ? p2c->size(2) : 0)),
               "attention");
  return {out, lse};
}

}  // namespace

FASTENC_BINDINGS(attention_cuda) {
  namespace py = pybind11;
  m.def("attention_cuda", &attention_cuda,
        "varlen bidirectional attention, FlashAttention-2 on tensor cores (optional distance bias lookup, per-token "
        "positions, DeBERTa's c2p / p2c terms)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("window_left"),
        py::arg("window_right"), py::arg("scale"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0,
        py::arg("offset") = 0, py::arg("bias") = py::none(), py::arg("positions") = py::none(),
        py::arg("c2p") = py::none(), py::arg("p2c") = py::none(), py::arg("slot") = py::none());
}
