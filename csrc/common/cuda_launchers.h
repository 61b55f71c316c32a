// C-style launchers of the CUDA kernels in csrc/<op>/*.cu: raw device pointers, sizes, a dtype code and
// the stream. Included by bindings.cpp (host compiler, torch headers) and by the .cu files (nvcc, no torch).
// Every launcher validates what it can, launches, and returns cudaGetLastError() (or an error code).
// All tensors are contiguous row-major; "T" below is the tensor's dtype (dtype code), math is fp32.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fastenc_cuda {

enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// LayerNorm (rms=false) or RMSNorm (rms=true) of h = x (+ residual), rows x hidden, all T.
// residual, bias, residual_out may be null; residual_out receives h (rounded to T) when residual is given,
// and the statistics are taken over that rounded h. Any hidden up to 2^30 (rows wider than the register cache take
// a three-pass kernel); any alignment (16-byte vectors only when every row start is 16-byte aligned).
// mean_out (LayerNorm) and rstd_out, fp32 (rows), may be null: a training forward writes them for the backward.
cudaError_t norm_fwd(const void* x, const void* residual, const void* weight, const void* bias, void* out,
                     void* residual_out, int64_t rows, int64_t hidden, float eps, bool rms, int dtype,
                     cudaStream_t stream, float* mean_out = nullptr, float* rstd_out = nullptr);

// LayerNorm (mean given) / RMSNorm (mean null) backward from the forward's fp32 statistics; dy, dh, h, dx: rows x
// hidden in T, w: hidden in T; dh may be null. dw_part, db_part (may be null): fp32 partial rows, one per block
// of the grid, norm_bwd_parts(rows) x hidden; the caller sums them over the first dim.
//   xhat = (h - mean) * rstd, g = w * dy;  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dh  (RMSNorm: no mean(g))
cudaError_t norm_bwd(const void* dy, const void* dh, const void* h, const void* w, const float* mean,
                     const float* rstd, void* dx, float* dw_part, float* db_part, int64_t rows, int64_t hidden,
                     int dtype, cudaStream_t stream);
int64_t norm_bwd_parts(int64_t rows);

// out = gelu(x + bias): x, out rows x n; bias (n) may be null. tanh_approx selects the tanh form.
cudaError_t gelu_fwd(const void* x, const void* bias, void* out, int64_t rows, int64_t n, bool tanh_approx,
                     int dtype, cudaStream_t stream);

// out = gelu(x[:, :n]) * x[:, n:]: x rows x 2n, out rows x n.
cudaError_t geglu_fwd(const void* x, void* out, int64_t rows, int64_t n, bool tanh_approx, int dtype,
                      cudaStream_t stream);

// Rotate-half RoPE. q: tokens x hq x d, k: tokens x hk x d (T); cos/sin: fp32 npos x half (2*half <= d);
// pos: int32 tokens. Writes qo, ko (same shapes as q, k); dims past 2*half are copied. inverse: rotate by -angle
// (the backward). A token whose position is outside [0, npos) gets NaN rows (the table is never read out of bounds).
cudaError_t rope_fwd(const void* q, const void* k, void* qo, void* ko, const float* cos, const float* sin,
                     const int32_t* pos, int64_t tokens, int64_t hq, int64_t hk, int64_t d, int64_t half,
                     int64_t npos, bool inverse, int dtype, cudaStream_t stream);

// Backward of gelu_fwd: dx = grad * gelu'(x + bias) (grad, x, dx rows x n; bias may be null).
cudaError_t gelu_bwd(const void* grad, const void* x, const void* bias, void* dx, int64_t rows, int64_t n,
                     bool tanh_approx, int dtype, cudaStream_t stream);

// Backward of geglu_fwd: grad rows x n, x rows x 2n -> dx rows x 2n ([d input | d gate]).
cudaError_t geglu_bwd(const void* grad, const void* x, void* dx, int64_t rows, int64_t n, bool tanh_approx,
                      int dtype, cudaStream_t stream);

// out = weight + scale * lora_b @ lora_a: weight, out (n_out x n_in) in T; lora_a (rank x n_in) and
// lora_b (n_out x rank) in fp32. out may alias weight (in-place merge).
cudaError_t merge_lora_fwd(const void* weight, const float* lora_a, const float* lora_b, void* out, float scale,
                           int64_t n_out, int64_t n_in, int64_t rank, int dtype, cudaStream_t stream);

// Non-causal varlen attention (FlashAttention-2 forward, tensor cores). q, k, v, out: total_tokens x heads
// x head_dim (fp16/bf16 only); cu_seqlens: int32 batch+1 on the device, checked where the kernel reads it (a
// sequence not within 0 <= start <= end <= total is skipped); max_seqlen >= every length (it sizes the grid).
// Query i of a sequence sees keys j of the same sequence with i-window_left <= j <= i+window_right
// (a negative window side is unbounded). head_dim in attention_head_dim_supported(). lse (or null): heads x
// total_tokens fp32, each row's natural log-sum-exp of scale * q.k (+inf for a row that sees no key).
cudaError_t attention_fwd(const void* q, const void* k, const void* v, void* out, const int32_t* cu_seqlens,
                          int64_t total, int64_t batch, int64_t heads, int64_t head_dim, int64_t max_seqlen,
                          int64_t window_left, int64_t window_right, float scale, int dtype, cudaStream_t stream,
                          float* lse = nullptr);
bool attention_head_dim_supported(int64_t head_dim);

}  // namespace fastenc_cuda
