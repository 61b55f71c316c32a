// torch-facing wrapper of the varlen FlashAttention-2 launcher (attention.h) and its registration: attention_cuda.
// Each checks device, dtype and shapes, makes inputs contiguous, allocates outputs and launches on the current
// stream of the input's device.
#include <cmath>
#include <optional>
#include <string>
#include <tuple>

#include "attention.h"
#include "cuda_bind.h"

namespace {

using namespace fastenc_cuda_torch;

// cu_seqlens is not read back here (that would synchronize the stream): fastenc.ops.attention validated it on
// the host (and max_seqlen from the values it read), and the kernel skips a sequence whose bounds it reads
// outside [0, total_tokens].
std::tuple<Tensor, Tensor> attention_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                                          int64_t max_seqlen,
                      int64_t window_left, int64_t window_right, double scale, double dropout_p,
                                          int64_t seed, int64_t offset, const OptTensor& bias) {
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
  const c10::cuda::CUDAGuard guard(q.device());
  const Tensor bc = bias ? bias->contiguous() : Tensor();
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), cu = cu_seqlens.contiguous();
  Tensor out = at::empty_like(qc);
  Tensor lse = at::empty({q.size(1), q.size(0)}, qc.options().dtype(at::kFloat));
  if (q.numel() == 0) return {out, lse.fill_(INFINITY)};
  check_launch(fastenc_cuda::attention_fwd(qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), out.data_ptr(),
                                           cu.data_ptr<int32_t>(), q.size(0), cu.numel() - 1, q.size(1), q.size(2),
                                           max_seqlen, window_left, window_right, static_cast<float>(scale), dt,
                                           c10::cuda::getCurrentCUDAStream(), lse.data_ptr<float>(),
                                           bias ? bc.data_ptr<float>() : nullptr, bias ? bc.size(1) : 0),
               "attention");
  return {out, lse};
}

}  // namespace

FASTENC_BINDINGS(attention_cuda) {
  namespace py = pybind11;
  m.def("attention_cuda", &attention_cuda,
        "varlen bidirectional attention, FlashAttention-2 on tensor cores (optional distance bias lookup)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("window_left"),
        py::arg("window_right"), py::arg("scale"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0,
        py::arg("offset") = 0, py::arg("bias") = py::none());
}
