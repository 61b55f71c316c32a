// torch-facing wrappers of the rotate-half RoPE kernel (rope.cpp) and their registration: rope, rope_bwd.
#include <optional>
#include <string>
#include <tuple>

#include "rope.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;

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

}  // namespace

FASTENC_BINDINGS(rope) {
  m.def("rope", &rope, "rotate-half RoPE of q and k");
  m.def("rope_bwd", &rope_bwd, "rope backward: the inverse rotation of the output gradients");
}
