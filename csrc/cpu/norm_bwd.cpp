// LayerNorm / RMSNorm backward on the CPU: OpenMP over rows, vectorized inner loops, fp32 math, per-thread dw/db
// partial rows reduced over threads after (no atomics, deterministic for a fixed thread count).
// From y = xhat * w + b, xhat = (h - mean) * rstd, and g = w * dy, per row of N elements:
//   d xhat = g;  dh = rstd * (g - mean(g) - xhat * mean(g * xhat))   (LayerNorm: the two projections remove the
//   gradient along the mean and along xhat);  RMSNorm (mean = 0, no centring): dh = rstd * (g - xhat * mean(g * xhat)).
//   dw = sum_rows dy * xhat,  db = sum_rows dy.
// Two passes over a row (sums, then dx and the partials); the row is in L1/L2 for the second.
#include "norm_bwd.h"

#include <omp.h>

#include <vector>

#include "parallel.h"
#include "storage.h"

namespace fastenc_cpu {

namespace {

template <class S, bool RMS>
void norm_bwd_rows(const typename S::T* dy, const typename S::T* dh, const typename S::T* h,
                   const typename S::T* w, const float* mean, const float* rstd, typename S::T* dx, float* dw,
                   float* db, int64_t rows, int64_t hidden) {
  using T = typename S::T;
  const float inv_n = 1.0f / (float)hidden;
  const bool partials = dw != nullptr || db != nullptr;
  // A small call runs on one thread (parallel.h): `used` is then 1 and its one partial row is dw / db.
  const bool parallel = worth_parallel(rows * hidden, kParallelMinElems);
  const int max_threads = parallel ? omp_get_max_threads() : 1;
  std::vector<float> part(partials ? (size_t)max_threads * 2 * hidden : 0, 0.f);
  int used = 1;
#pragma omp parallel if (parallel)
  {
    const int tid = omp_get_thread_num();
#pragma omp single
    used = omp_get_num_threads();
    float* __restrict pw = partials ? part.data() + (size_t)tid * 2 * hidden : nullptr;
    float* __restrict pb = partials ? pw + hidden : nullptr;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* __restrict dyr = dy + r * hidden;
      const T* __restrict hr = h + r * hidden;
      T* __restrict dxr = dx + r * hidden;
      const float mu = RMS ? 0.f : mean[r], rs = rstd[r];
      float s_g = 0.f, s_gx = 0.f;
#pragma omp simd reduction(+ : s_g, s_gx)
      for (int64_t i = 0; i < hidden; ++i) {
        const float xh = (S::load(hr[i]) - mu) * rs;
        const float g = S::load(dyr[i]) * S::load(w[i]);
        s_g += g;
        s_gx += g * xh;
      }
      const float c_g = RMS ? 0.f : s_g * inv_n, c_gx = s_gx * inv_n;
      if (dh != nullptr) {
        const T* __restrict dhr = dh + r * hidden;
#pragma omp simd
        for (int64_t i = 0; i < hidden; ++i) {
          const float xh = (S::load(hr[i]) - mu) * rs;
          const float d = S::load(dyr[i]);
          dxr[i] = S::store(rs * (d * S::load(w[i]) - c_g - xh * c_gx) + S::load(dhr[i]));
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < hidden; ++i) {
          const float xh = (S::load(hr[i]) - mu) * rs;
          dxr[i] = S::store(rs * (S::load(dyr[i]) * S::load(w[i]) - c_g - xh * c_gx));
        }
      }
      if (partials) {
#pragma omp simd
        for (int64_t i = 0; i < hidden; ++i) {
          const float d = S::load(dyr[i]);
          pw[i] += d * (S::load(hr[i]) - mu) * rs;
          pb[i] += d;
        }
      }
    }
  }
  if (!partials) return;
  // Second pass: dw[i] = sum over threads of their partial rows.
#pragma omp parallel for schedule(static) if (worth_parallel((int64_t)used * hidden, kParallelMinElems))
  for (int64_t i = 0; i < hidden; ++i) {
    float sw = 0.f, sb = 0.f;
    for (int t = 0; t < used; ++t) {
      sw += part[(size_t)t * 2 * hidden + i];
      sb += part[(size_t)t * 2 * hidden + hidden + i];
    }
    if (dw != nullptr) dw[i] = sw;
    if (db != nullptr) db[i] = sb;
  }
}

template <class S>
void norm_bwd_dispatch(const typename S::T* dy, const typename S::T* dh, const typename S::T* h,
                       const typename S::T* w, const float* mean, const float* rstd, typename S::T* dx, float* dw,
                       float* db, int64_t rows, int64_t hidden) {
  if (mean == nullptr)
    norm_bwd_rows<S, true>(dy, dh, h, w, mean, rstd, dx, dw, db, rows, hidden);
  else
    norm_bwd_rows<S, false>(dy, dh, h, w, mean, rstd, dx, dw, db, rows, hidden);
}

}  // namespace

void norm_bwd(const float* dy, const float* dh, const float* h, const float* w, const float* mean, const float* rstd,
              float* dx, float* dw, float* db, int64_t rows, int64_t hidden) {
  norm_bwd_dispatch<F32>(dy, dh, h, w, mean, rstd, dx, dw, db, rows, hidden);
}

void norm_bwd_bf16(const uint16_t* dy, const uint16_t* dh, const uint16_t* h, const uint16_t* w, const float* mean,
                   const float* rstd, uint16_t* dx, float* dw, float* db, int64_t rows, int64_t hidden) {
  norm_bwd_dispatch<BF16>(dy, dh, h, w, mean, rstd, dx, dw, db, rows, hidden);
}

}  // namespace fastenc_cpu
