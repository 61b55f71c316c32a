// GEMM on a weight prepacked into panels (csrc/cpu/gemm.cpp): fastenc.layers.Linear's CPU inference GEMM.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// Columns per packed panel (the register tile's width: 16 with AVX2, 32 with AVX-512, 8 otherwise).
int64_t gemm_panel_width();
// w (n, k) row-major -> out (ceil(n / width), k, width): panel p holds w[p * width + j][kk] at [p][kk][j], zero past n.
void gemm_pack(const float* w, int64_t n, int64_t k, float* out);
// The panel GEMM's epilogue activation, applied after the bias and the accumulated y: none, exact (erf) GELU or
// tanh GELU (the math of act.cpp's gelu_fwd).
enum class GemmActivation { kNone, kGelu, kGeluTanh };

// y (m, n), row stride ldy = x (m, k), row stride ldx, times W^T (W packed by gemm_pack) (+ bias (n,)) (+ y when
// accumulate), then act. num_threads <= 0: OpenMP's default; one thread below kParallelMinGemmFmas multiply-adds.
void gemm_packed(const float* x, int64_t m, int64_t k, int64_t ldx, const float* wp, int64_t n, const float* bias,
                 float* y, int64_t ldy, bool accumulate, int num_threads, GemmActivation act);

}  // namespace fastenc_cpu
