// Fused bidirectional attention on the CPU (raw pointers, no torch headers): tiled with the online softmax
// (FlashAttention-2's recurrence), packed variable-length sequences, optional sliding window.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// The relative-position terms of one call (fastenc/ops/attention.py): every pointer may be null.
//   bias (heads, bias_len) fp32, bias_len = 2 L - 1: score(i, j) += bias[h, pos_i - pos_j + L - 1];
//   positions (total_tokens,) int32, each in [0, L) (null: pos = the index within the sequence);
//   c2p, p2c (total_tokens, heads, slots) fp32 with slot (slot_len = 2 L - 1,) int32 in [0, slots), given iff c2p
//   or p2c is: score(i, j) += c2p[i, h, slot[pos_i - pos_j + L - 1]] + p2c[j, h, slot[...]].
// The kernels copy positions and slot privately and check every value before any row is touched
// (std::invalid_argument), as they do cu_seqlens.
struct Relative {
  const float* bias = nullptr;
  int64_t bias_len = 0;
  const int32_t* positions = nullptr;
  const float* c2p = nullptr;
  const float* p2c = nullptr;
  int64_t slots = 0;
  const int32_t* slot = nullptr;
  int64_t slot_len = 0;
};

// Gradients of the relative terms (each may be null; fp32, the shape of its input, every element written):
// dbias[h, d + L - 1] = sum of dS over the pairs at distance d; dc2p[i, h, s] = sum over keys j with slot s;
// dp2c[j, h, s] = sum over queries i with slot s.
struct RelativeGrads {
  float* dbias = nullptr;
  float* dc2p = nullptr;
  float* dp2c = nullptr;
};

// q, k, v, out: (total_tokens, heads, head_dim) contiguous fp32; cu_seqlens: int32 (batch + 1), read once into a
// private copy; values < 0 or decreasing throw std::invalid_argument before any row is touched, and the caller
// guarantees cu_seqlens[batch] <= total_tokens (on memory no one else writes). Query i of a sequence sees its keys j with
// i - window_left <= j <= i + window_right (-1 = unbounded). scale multiplies q.k. num_threads <= 0: OpenMP's
// default. Working memory is O(tile) per thread; no (seq x seq) buffer. lse (may be null): (heads, total_tokens)
// fp32, each query row's natural log-sum-exp of scale * q.k over its visible keys (+inf when it sees none).
// dropout_p > 0: the normalized probabilities are multiplied by the keep-mask of (seed, offset) / (1 - dropout_p)
// (attention_dropout.h); lse stays that of the undropped scores. ld_in > 0: the row stride (elements) of q, k and v,
// whose rows may lie inside a wider buffer (out's stride is heads * head_dim); 0: heads * head_dim.
// rel (may be null): the relative terms above added to the scaled scores (a sequence longer than L, without
// positions, throws std::invalid_argument before any row is touched); no (seq x seq) buffer either way.
void attention_fwd(const float* q, const float* k, const float* v, float* out, const int32_t* cu_seqlens,
                   int64_t batch, int64_t heads, int64_t head_dim, int64_t window_left, int64_t window_right,
                   float scale, int num_threads, float* lse = nullptr, double dropout_p = 0.0, int64_t seed = 0,
                   int64_t offset = 0, int64_t ld_in = 0, const Relative* rel = nullptr);

// Backward of attention_fwd (FlashAttention-2's): from grad = dL/dout, out and the forward's lse, writes dq, dk, dv
// (all (total_tokens, heads, head_dim) fp32; every element written). Same layout, window and threading as
// attention_fwd; working memory per thread is O(tile + sequence length), never (seq x seq). dropout_p, seed,
// offset: the forward's (the keep-mask is regenerated). dq null: dq is not computed (nor its product); dk and dv
// null together: neither is (nor the dK and dV products). Row strides (elements; 0: heads * head_dim): ld_in of q,
// k and v, ld_dout of dq, dk and dv (e.g. the column blocks of one (tokens, 3 * hidden) QKV buffer and of its
// gradient); grad and out are contiguous. rel: the forward's relative terms (null: none); grads (may be null): their
// gradients, accumulated per (sequence, head) item (dbias: into the item's own slice, reduced in sequence order;
// dc2p / dp2c rows: owned by the item), so the same bits for any thread count.
void attention_bwd(const float* grad, const float* q, const float* k, const float* v, const float* out,
                   const float* lse, float* dq, float* dk, float* dv, const int32_t* cu_seqlens, int64_t batch,
                   int64_t heads, int64_t head_dim, int64_t window_left, int64_t window_right, float scale,
                   int num_threads, double dropout_p = 0.0, int64_t seed = 0, int64_t offset = 0, int64_t ld_in = 0,
                   int64_t ld_dout = 0, const Relative* rel = nullptr, const RelativeGrads* grads = nullptr);

// The distance bias lookup's reach: L for a (heads, bias_len = 2 L - 1) lookup; throws std::invalid_argument when
// bias_len is not odd and positive or when `longest` > L (op names the caller).
int64_t bias_reach(int64_t bias_len, int64_t longest, const char* op);

}  // namespace fastenc_cpu
