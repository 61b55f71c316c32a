// GELU (+bias) and GeGLU backward on the CPU: fp32 math, OpenMP over rows, vectorized inner loops (fast_math.h),
// fp32 or bf16 storage (storage.h). Nothing is saved by the forward: gelu(t) and gelu'(t) are recomputed from x.
//   exact: gelu'(t) = Phi(t) + t phi(t),  Phi(t) = (1 + erf(t / sqrt 2)) / 2,  phi(t) = exp(-t^2 / 2) / sqrt(2 pi)
//   tanh:  s = 1 / (1 + exp(-2u)) = (1 + tanh u) / 2,  u = sqrt(2/pi) (t + 0.044715 t^3),  1 - tanh^2 u = 4 s (1 - s)
//          gelu'(t) = s + 2 t s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 t^2)
//   quick: s = sigmoid(1.702 t),  gelu(t) = t s,  gelu'(t) = s + 1.702 t s (1 - s)   (fm_x_sigmoid_and_grad)
// gelu: dx = grad * gelu'(x + b), dbias = sum over rows of dx (fused: per-thread fp32 column sums); dx == nullptr:
// dx not written, dbias == nullptr: not summed (the gradients autograd does not need).
// geglu (out = gelu(a) * g, x = [a | g]): da = grad * g * gelu'(a), dg = grad * gelu(a).
// Limits as torch's gelu_backward: |t| > 13 gives gelu' = 1 (t > 0) or 0, and NaN at +-inf or NaN (quick: as
// torch's autograd of t * sigmoid(1.702 t), the same NaNs, its own tails).
#include <omp.h>

#include <vector>

#include "act.h"
#include "fast_math.h"
#include "parallel.h"
#include "storage.h"

namespace fastenc_cpu {

namespace {

// y = gelu(t) and d = gelu'(t) sharing one exp. exact: erfc by A&S 7.1.26 as fm_gelu_erf; exp(-z^2) with
// z = |t| / sqrt 2 is exp(-t^2 / 2), so phi(t) = exp(-z^2) / sqrt(2 pi) comes from the same exp.
template <GeluForm F>
FASTENC_INLINE void gelu_and_grad(float t, float& y, float& d) {
  if (F == GeluForm::kQuick) {
    fm_x_sigmoid_and_grad(t, 1.702f, y, d);
    return;
  }
  if (F == GeluForm::kTanh) {
    const float u2 = 1.59576912160573071f * (t + 0.044715f * t * t * t);
    const float s = fm_sigmoid(u2);
    y = t * s;
    d = s + t * s * (1.0f - s) * 1.59576912160573071f * (1.0f + 0.134145f * t * t);
  } else {
    float z = std::fabs(t) * 0.707106781186547524f;
    z = z < 9.0f ? z : 9.0f;
    const float q = 1.0f / (1.0f + 0.3275911f * z);
    float p = 1.061405429f;
    p = p * q - 1.453152027f;
    p = p * q + 1.421413741f;
    p = p * q - 0.284496736f;
    p = p * q + 0.254829592f;
    const float e = fm_exp_core(-z * z);
    const float half_erfc = 0.5f * q * p * e;
    const float cdf = t > 0.f ? 1.0f - half_erfc : half_erfc;
    y = t * cdf;
    d = cdf + t * e * 0.398942280401432678f;
  }
  // tails: y = t * 0 (-0 below -13, NaN at -inf), d = step + (t - t) (NaN at +-inf and for NaN)
  const bool tail = std::fabs(t) > 13.0f;
  y = t < -13.0f ? t * 0.0f : y;
  d = tail ? (t > 0.f ? 1.0f : 0.0f) + (t - t) : d;
}

// STORE: write dx (skipped when x needs no gradient); SUM: dbias = column sums of dx (skipped when bias needs none).
template <class S, GeluForm F, bool BIAS, bool STORE, bool SUM>
void gelu_bwd_rows(const typename S::T* __restrict g, const typename S::T* __restrict x,
                   const typename S::T* __restrict bias, typename S::T* __restrict dx, float* __restrict dbias,
                   int64_t rows, int64_t n) {
  // A small call runs on one thread (parallel.h): one partial row, summed into dbias as a larger team's are.
  const bool parallel = worth_parallel(rows * n, kParallelMinElems);
  const int nt = parallel ? omp_get_max_threads() : 1;
  std::vector<float> part(SUM ? (size_t)nt * n : 0, 0.0f);
#pragma omp parallel num_threads(nt) if (parallel)
  {
    float* acc = SUM ? part.data() + (size_t)omp_get_thread_num() * n : nullptr;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const typename S::T* gr = g + r * n;
      const typename S::T* xr = x + r * n;
      typename S::T* dr = STORE ? dx + r * n : nullptr;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        float y, d;
        gelu_and_grad<F>(BIAS ? S::load(xr[i]) + S::load(bias[i]) : S::load(xr[i]), y, d);
        const float v = S::load(gr[i]) * d;
        if (STORE) dr[i] = S::store(v);
        if (SUM) acc[i] += v;
      }
    }
  }
  if (SUM) {
    for (int64_t i = 0; i < n; ++i) dbias[i] = 0.0f;
    for (int t = 0; t < nt; ++t) {
      const float* a = part.data() + (size_t)t * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dbias[i] += a[i];
    }
  }
}

template <class S, GeluForm F, bool BIAS>
void gelu_bwd_outputs(const typename S::T* g, const typename S::T* x, const typename S::T* bias, typename S::T* dx,
                      float* dbias, int64_t rows, int64_t n) {
  if (dx != nullptr) {
    dbias != nullptr ? gelu_bwd_rows<S, F, BIAS, true, true>(g, x, bias, dx, dbias, rows, n)
                     : gelu_bwd_rows<S, F, BIAS, true, false>(g, x, bias, dx, dbias, rows, n);
  } else if (dbias != nullptr) {
    gelu_bwd_rows<S, F, BIAS, false, true>(g, x, bias, dx, dbias, rows, n);
  }
}

template <class S, GeluForm F>
void geglu_bwd_rows(const typename S::T* __restrict g, const typename S::T* __restrict x,
                    typename S::T* __restrict dx, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows * n, kParallelMinElems))
  for (int64_t r = 0; r < rows; ++r) {
    const typename S::T* gr = g + r * n;
    const typename S::T* a = x + r * 2 * n;
    const typename S::T* gate = a + n;
    typename S::T* da = dx + r * 2 * n;
    typename S::T* dg = da + n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      float y, d;
      gelu_and_grad<F>(S::load(a[i]), y, d);
      const float gv = S::load(gr[i]);
      da[i] = S::store(gv * S::load(gate[i]) * d);
      dg[i] = S::store(gv * y);
    }
  }
}

template <class S, GeluForm F>
void gelu_bwd_bias(const typename S::T* g, const typename S::T* x, const typename S::T* bias, typename S::T* dx,
                   float* dbias, int64_t rows, int64_t n) {
  bias != nullptr ? gelu_bwd_outputs<S, F, true>(g, x, bias, dx, dbias, rows, n)
                  : gelu_bwd_outputs<S, F, false>(g, x, bias, dx, dbias, rows, n);
}

template <class S>
void gelu_bwd_dispatch(const typename S::T* g, const typename S::T* x, const typename S::T* bias, typename S::T* dx,
                       float* dbias, int64_t rows, int64_t n, GeluForm form) {
  switch (form) {
    case GeluForm::kTanh: gelu_bwd_bias<S, GeluForm::kTanh>(g, x, bias, dx, dbias, rows, n); break;
    case GeluForm::kQuick: gelu_bwd_bias<S, GeluForm::kQuick>(g, x, bias, dx, dbias, rows, n); break;
    default: gelu_bwd_bias<S, GeluForm::kErf>(g, x, bias, dx, dbias, rows, n); break;
  }
}

template <class S>
void geglu_bwd_dispatch(const typename S::T* g, const typename S::T* x, typename S::T* dx, int64_t rows, int64_t n,
                        GeluForm form) {
  switch (form) {
    case GeluForm::kTanh: geglu_bwd_rows<S, GeluForm::kTanh>(g, x, dx, rows, n); break;
    case GeluForm::kQuick: geglu_bwd_rows<S, GeluForm::kQuick>(g, x, dx, rows, n); break;
    default: geglu_bwd_rows<S, GeluForm::kErf>(g, x, dx, rows, n); break;
  }
}

}  // namespace

void gelu_bwd(const float* grad, const float* x, const float* bias, float* dx, float* dbias, int64_t rows, int64_t n,
              GeluForm form) {
  gelu_bwd_dispatch<F32>(grad, x, bias, dx, dbias, rows, n, form);
}

void gelu_bwd_bf16(const uint16_t* grad, const uint16_t* x, const uint16_t* bias, uint16_t* dx, float* dbias,
                   int64_t rows, int64_t n, GeluForm form) {
  gelu_bwd_dispatch<BF16>(grad, x, bias, dx, dbias, rows, n, form);
}

void geglu_bwd(const float* grad, const float* x, float* dx, int64_t rows, int64_t n, GeluForm form) {
  geglu_bwd_dispatch<F32>(grad, x, dx, rows, n, form);
}

void geglu_bwd_bf16(const uint16_t* grad, const uint16_t* x, uint16_t* dx, int64_t rows, int64_t n, GeluForm form) {
  geglu_bwd_dispatch<BF16>(grad, x, dx, rows, n, form);
}

}  // namespace fastenc_cpu
