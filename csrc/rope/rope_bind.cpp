// torch-facing wrappers of the RoPE launcher (rope.h) and their registration: rope_cuda, rope_bwd_cuda.
// Each checks device, dtype and shapes, makes inputs contiguous, allocates outputs and launches on the current
// stream of the input's device.
#include <optional>
#include <string>
#include <tuple>

#include "cuda_bind.h"
#include "rope.h"

namespace {

using namespace fastenc_cuda_torch;

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

}  // namespace

FASTENC_BINDINGS(rope_cuda) {
  m.def("rope_cuda", &rope_cuda, "rotate-half RoPE of q and k, CUDA kernel");
  m.def("rope_bwd_cuda", &rope_bwd_cuda, "rope backward (inverse rotation), CUDA kernel");
}
