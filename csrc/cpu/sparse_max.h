// SPLADE max-pooled sparse weights on the CPU (sparse_max.cpp): the vocabulary projection with a max epilogue.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// out (batch, V) = log1p(relu(max over rows t in [cu[s], cu[s+1]) of x[t] . w[v] + bias[v])), fp32; an empty
// sequence gives 0. x (tokens, H) row stride ldx; w (V, H) row-major contiguous; bias (V,) or nullptr; cu (batch+1,)
// already validated (non-decreasing, within [0, tokens]). num_threads <= 0: OpenMP's default.
// packed: w in sparse_max_pack's layout (read in place), or nullptr (each thread packs its blocks of w as it goes,
// every call).
void sparse_max_fwd(const float* x, int64_t ldx, int64_t H, const int32_t* cu, int64_t batch, const float* w,
                    int64_t V, const float* bias, float* out, int num_threads, const float* packed = nullptr);

// The columns of one panel (the kernel's register tile width).
int64_t sparse_max_panel_width();

// w (V, H) row-major -> out (ceil(V / NW), H, NW): panel p holds w[p * NW + j][k] at [p][k][j], zero past V.
void sparse_max_pack(const float* w, int64_t V, int64_t H, float* out, int num_threads);

}  // namespace fastenc_cpu
