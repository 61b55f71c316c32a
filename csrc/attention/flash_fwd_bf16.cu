// FlashAttention-2 forward instances for bf16, head dims 32/64/96/128 (kernel in flash_fwd.cuh).
#include "flash_fwd.cuh"

namespace fastenc_cuda {
namespace attn {
template cudaError_t run_flash_fwd<__nv_bfloat16, 32>(const Params&, cudaStream_t);
template cudaError_t run_flash_fwd<__nv_bfloat16, 64>(const Params&, cudaStream_t);
template cudaError_t run_flash_fwd<__nv_bfloat16, 96>(const Params&, cudaStream_t);
template cudaError_t run_flash_fwd<__nv_bfloat16, 128>(const Params&, cudaStream_t);
}  // namespace attn
}  // namespace fastenc_cuda
