// LoRA merge on the CPU (Hu et al. 2021): W' = W + scale * B @ A, fp32, OpenMP over blocks of output rows.
// For a block of RB rows and a chunk of CB columns the partial sums live in a small local tile (L1):
//   delta[o, i] = sum_k B[o, k] * A[k, i]   (k = 0..r-1; each A chunk row is loaded once per row block),
//   W'[o, i]    = W[o, i] + scale * delta[o, i].
// Small merges run on one thread (kParallelMinFmas, parallel.h): a parallel region costs more than it saves there,
// and on a busy machine one descheduled worker stalls the whole region.
// The unmerged LoRA linear is served by at::addmm in lora_bind.cpp (it calls this kernel for many tokens).
#include <algorithm>
#include <cstddef>

#include "lora.h"
#include "parallel.h"

namespace fastenc_cpu {

namespace {
constexpr int64_t RB = 4;    // output rows per block
constexpr int64_t CB = 128;  // columns per chunk
}  // namespace

void merge_lora_fwd(const float* w, const float* a, const float* b, float* out, int64_t rows, int64_t cols,
                    int64_t r, float scale) {
  const int64_t blocks = (rows + RB - 1) / RB;
  const bool parallel = worth_parallel(rows * cols * r, kParallelMinFmas);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t o0 = blk * RB, nr = std::min(RB, rows - o0);
    float acc[RB][CB];
    for (int64_t i0 = 0; i0 < cols; i0 += CB) {
      const int64_t nc = std::min(CB, cols - i0);
      for (int64_t rr = 0; rr < RB; ++rr)
#pragma omp simd
        for (int64_t i = 0; i < CB; ++i) acc[rr][i] = 0.f;
      for (int64_t k = 0; k < r; ++k) {
        const float* ak = a + k * cols + i0;
        for (int64_t rr = 0; rr < nr; ++rr) {
          const float bk = b[(o0 + rr) * r + k];
          float* ar = acc[rr];
#pragma omp simd
          for (int64_t i = 0; i < nc; ++i) ar[i] += bk * ak[i];
        }
      }
      for (int64_t rr = 0; rr < nr; ++rr) {
        const float* wo = w + (o0 + rr) * cols + i0;
        float* yo = out + (o0 + rr) * cols + i0;
        const float* ar = acc[rr];
#pragma omp simd
        for (int64_t i = 0; i < nc; ++i) yo[i] = wo[i] + scale * ar[i];
      }
    }
  }
}

}  // namespace fastenc_cpu
