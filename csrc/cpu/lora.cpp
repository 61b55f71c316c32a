// LoRA merge on the CPU (Hu et al. 2021): W' = W + scale * B @ A, fp32, OpenMP over output rows.
// Per row o:  delta[i] = sum_k B[o,k] * A[k,i]  (k = 0..r-1, accumulated in a row buffer in fp32),
//             W'[o,i]  = W[o,i] + scale * delta[i].
// The unmerged LoRA linear needs two GEMMs and is served by at::addmm in bindings.cpp (see there).
#include <cstddef>
#include <vector>

#include "lora.h"

namespace fastenc_cpu {

void merge_lora_fwd(const float* w, const float* a, const float* b, float* out, int64_t rows, int64_t cols,
                    int64_t r, float scale) {
#pragma omp parallel
  {
    std::vector<float> delta(static_cast<size_t>(cols));
    float* d = delta.data();
#pragma omp for schedule(static)
    for (int64_t o = 0; o < rows; ++o) {
#pragma omp simd
      for (int64_t i = 0; i < cols; ++i) d[i] = 0.f;
      const float* bo = b + o * r;
      for (int64_t k = 0; k < r; ++k) {
        const float bk = bo[k];
        const float* ak = a + k * cols;
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) d[i] += bk * ak[i];
      }
      const float* wo = w + o * cols;
      float* yo = out + o * cols;
#pragma omp simd
      for (int64_t i = 0; i < cols; ++i) yo[i] = wo[i] + scale * d[i];
    }
  }
}

}  // namespace fastenc_cpu
