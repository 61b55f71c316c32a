// torch-facing wrapper of the LoRA merge launcher (merge_lora.h) and its registration: merge_lora_cuda.
// Each checks device, dtype and shapes, makes inputs contiguous, allocates outputs and launches on the current
// stream of the input's device.
#include <optional>
#include <string>
#include <tuple>

#include "cuda_bind.h"
#include "merge_lora.h"

namespace {

using namespace fastenc_cuda_torch;

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

}  // namespace

FASTENC_BINDINGS(lora_cuda) {
  m.def("merge_lora_cuda", &merge_lora_cuda, "W + scale * B @ A, CUDA kernel, fp32 accumulation");
}
