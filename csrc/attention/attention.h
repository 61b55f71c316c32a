// Launcher of the varlen FlashAttention-2 forward (attention.cu over flash_fwd_*.cu).
// C-style launchers: raw device pointers, sizes, a dtype code (cuda_dtype.h) and the stream; each validates what it
// can, launches, and returns cudaGetLastError() (or an error code). Tensors contiguous row-major, "T" the tensor's
// dtype, math fp32. Included by the .cu files (nvcc, no torch) and the op's _bind.cpp (host compiler, torch).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_dtype.h"

namespace fastenc_cuda {

// Non-causal varlen attention (FlashAttention-2 forward, tensor cores). q, k, v, out: total_tokens x heads
// x head_dim (fp16/bf16 only); cu_seqlens: int32 batch+1 on the device, checked where the kernel reads it (a
// sequence not within 0 <= start <= end <= total is skipped); max_seqlen >= every length (it sizes the grid).
// Query i of a sequence sees keys j of the same sequence with i-window_left <= j <= i+window_right
// (a negative window side is unbounded). head_dim in attention_head_dim_supported(). lse (or null): heads x
// total_tokens fp32, each row's natural log-sum-exp of scale * q.k (+inf for a row that sees no key).
// bias (or null): a distance bias lookup heads x bias_len fp32 on the device, bias_len = 2L - 1 with
// L >= max_seqlen (else cudaErrorInvalidValue): the score of query i and key j gets + bias[h, i - j + L - 1].
// Relative terms (each null when absent; else cudaErrorInvalidValue on inconsistent sizes):
// positions: total_tokens int32, each token's position (read clamped to [0, L)): i - j above becomes
// positions[i] - positions[j]; it needs a bias or a slot lookup. c2p, p2c: total_tokens x heads x slots in q's
// dtype (DeBERTa's disentangled terms), read through slot: int32 slot_len = 2L - 1 (bias_len too when both are
// given), L >= max_seqlen: the score gets + c2p[i, h, s] + p2c[j, h, s] with s = slot[dist + L - 1] clamped to
// [0, slots). Given exactly when c2p or p2c is.
cudaError_t attention_fwd(const void* q, const void* k, const void* v, void* out, const int32_t* cu_seqlens,
                          int64_t total, int64_t batch, int64_t heads, int64_t head_dim, int64_t max_seqlen,
                          int64_t window_left, int64_t window_right, float scale, int dtype, cudaStream_t stream,
                          float* lse = nullptr, const float* bias = nullptr, int64_t bias_len = 0,
                          const int32_t* positions = nullptr, const void* c2p = nullptr, const void* p2c = nullptr,
                          const int32_t* slot = nullptr, int64_t slot_len = 0, int64_t slots = 0);
bool attention_head_dim_supported(int64_t head_dim);

}  // namespace fastenc_cuda
