// Launcher of the fused attention forward: validates sizes, clamps the window, and dispatches on
// (dtype, head dim) to the FlashAttention-2 instances compiled in flash_fwd_fp16.cu / flash_fwd_bf16.cu.
#include <algorithm>

#include "attention.h"
#include "flash_fwd.cuh"

namespace fastenc_cuda {
namespace attn {
// Explicit instances live in the per-dtype files (kept apart so each compiles in parallel).
extern template cudaError_t run_flash_fwd<__half, 32>(const Params&, cudaStream_t);
extern template cudaError_t run_flash_fwd<__half, 64>(const Params&, cudaStream_t);
extern template cudaError_t run_flash_fwd<__half, 96>(const Params&, cudaStream_t);
extern template cudaError_t run_flash_fwd<__half, 128>(const Params&, cudaStream_t);
extern template cudaError_t run_flash_fwd<__nv_bfloat16, 32>(const Params&, cudaStream_t);
extern template cudaError_t run_flash_fwd<__nv_bfloat16, 64>(const Params&, cudaStream_t);
extern template cudaError_t run_flash_fwd<__nv_bfloat16, 96>(const Params&, cudaStream_t);
extern template cudaError_t run_flash_fwd<__nv_bfloat16, 128>(const Params&, cudaStream_t);

template <typename T>
cudaError_t run_for_head_dim(const Params& p, int64_t head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 32: return run_flash_fwd<T, 32>(p, stream);
    case 64: return run_flash_fwd<T, 64>(p, stream);
    case 96: return run_flash_fwd<T, 96>(p, stream);
    case 128: return run_flash_fwd<T, 128>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}
}  // namespace attn

bool attention_head_dim_supported(int64_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128;
}

cudaError_t attention_fwd(const void* q, const void* k, const void* v, void* out, const int32_t* cu_seqlens,
                          int64_t total, int64_t batch, int64_t heads, int64_t head_dim, int64_t max_seqlen,
                          int64_t window_left, int64_t window_right, float scale, int dtype, cudaStream_t stream,
                          float* lse, const float* bias, int64_t bias_len, const int32_t* positions,
                          const void* c2p, const void* p2c, const int32_t* slot, int64_t slot_len, int64_t slots) {
  if (batch == 0 || heads == 0 || total == 0) return cudaSuccess;
  if (!attention_head_dim_supported(head_dim) || (dtype != kF16 && dtype != kBF16)) return cudaErrorInvalidValue;
  // total <= 2**30 and windows < total keep the kernel's int sums (row + window) below 2**31.
  if (batch < 0 || heads <= 0 || heads > 65535 || max_seqlen < 0 || total < 0 || total > (int64_t{1} << 30))
    return cudaErrorInvalidValue;
  // The bias lookup must reach the longest sequence (the kernel also bounds every index it reads).
  if (bias != nullptr && (bias_len <= 0 || bias_len % 2 == 0 || bias_len > 0x7fffffff || (bias_len + 1) / 2 < max_seqlen))
    return cudaErrorInvalidValue;
  // Relative terms: a slot lookup exactly with c2p / p2c, as long as the bias when both are given and reaching the
  // longest sequence; positions only with a lookup to read them through.
  if ((slot != nullptr) != (c2p != nullptr || p2c != nullptr)) return cudaErrorInvalidValue;
  if (slot != nullptr && (slot_len <= 0 || slot_len % 2 == 0 || slot_len > 0x7fffffff ||
                          (slot_len + 1) / 2 < max_seqlen || (bias != nullptr && slot_len != bias_len) || slots <= 0 ||
                          slots > 0x7fffffff))
    return cudaErrorInvalidValue;
  if (positions != nullptr && bias == nullptr && slot == nullptr) return cudaErrorInvalidValue;
  // max_seqlen sizes the grid: no more than every row, at least one tile.
  max_seqlen = std::max<int64_t>(1, std::min(max_seqlen, total));
  const int64_t m_blocks = (max_seqlen + attn::kBlockM - 1) / attn::kBlockM;
  if (m_blocks * batch > 0x7fffffff) return cudaErrorInvalidValue;
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out)) return cudaErrorMisalignedAddress;
  attn::Params p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.cu_seqlens = cu_seqlens;
  p.batch = static_cast<int>(batch);
  p.heads = static_cast<int>(heads);
  p.m_blocks = static_cast<int>(m_blocks);
  p.total = static_cast<int>(total);
  // A window side at least as long as every row bounds nothing (and then fits in int).
  p.window_left = (window_left < 0 || window_left >= total) ? -1 : static_cast<int>(window_left);
  p.window_right = (window_right < 0 || window_right >= total) ? -1 : static_cast<int>(window_right);
  p.scale_log2 = scale * 1.4426950408889634f;
  p.lse = lse;
  p.bias = bias;
  p.bias_len = bias != nullptr ? static_cast<int>(bias_len) : 1;
  p.positions = positions;
  p.rel_len = slot != nullptr ? static_cast<int>(slot_len) : p.bias_len;
  p.c2p = c2p;
  p.p2c = p2c;
  p.slot = slot;
  p.slots = slot != nullptr ? static_cast<int>(slots) : 1;
  if (dtype == kF16) return attn::run_for_head_dim<__half>(p, head_dim, stream);
  return attn::run_for_head_dim<__nv_bfloat16>(p, head_dim, stream);
}

}  // namespace fastenc_cuda
