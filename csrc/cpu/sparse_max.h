// SPLADE max-pooled sparse weights on the CPU (sparse_max.cpp): the vocabulary projection with a max epilogue.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// out (batch, V) = log1p(relu(max over rows t in [cu[s], cu[s+1]) of x[t] . w[v] + bias[v])), fp32; an empty
// sequence gives 0. x (tokens, H) row stride ldx; w (V, H) row-major contiguous; bias (V,) or nullptr; cu (batch+1,)
// already validated (non-decreasing, within [0, tokens]). num_threads <= 0: OpenMP's default.
void sparse_max_fwd(const float* x, int64_t ldx, int64_t H, const int32_t* cu, int64_t batch, const float* w,
                    int64_t V, const float* bias, float* out, int num_threads);

}  // namespace fastenc_cpu
