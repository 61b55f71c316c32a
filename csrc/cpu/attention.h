// Fused bidirectional attention on the CPU (raw pointers, no torch headers): tiled with the online softmax
// (FlashAttention-2's recurrence), packed variable-length sequences, optional sliding window.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// q, k, v, out: (total_tokens, heads, head_dim) contiguous fp32; cu_seqlens: int32 (batch + 1), read once into a
// private copy; values < 0 or decreasing throw std::invalid_argument before any row is touched, and the caller
// guarantees cu_seqlens[batch] <= total_tokens (on memory no one else writes). Query i of a sequence sees its keys j with
// i - window_left <= j <= i + window_right (-1 = unbounded). scale multiplies q.k. num_threads <= 0: OpenMP's
// default. Working memory is O(tile) per thread; no (seq x seq) buffer.
void attention_fwd(const float* q, const float* k, const float* v, float* out, const int32_t* cu_seqlens,
                   int64_t batch, int64_t heads, int64_t head_dim, int64_t window_left, int64_t window_right,
                   float scale, int num_threads);

}  // namespace fastenc_cpu
