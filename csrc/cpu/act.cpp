// GELU (+bias) and GeGLU on the CPU, fp32, OpenMP over rows, vectorized inner loops (fast_math.h).
// exact: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2));  tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
// quick: x * sigmoid(1.702 x) (CLIP's quick_gelu).
// GeGLU (ModernBERT order): out = gelu(x[:, :n]) * x[:, n:]. fp32 or bf16 storage (storage.h), fp32 math.
#include "act.h"
#include "fast_math.h"
#include "parallel.h"
#include "storage.h"

namespace fastenc_cpu {

namespace {

template <GeluForm F>
FASTENC_INLINE float act(float v) {
  return F == GeluForm::kTanh ? fm_gelu_tanh(v) : (F == GeluForm::kQuick ? fm_gelu_quick(v) : fm_gelu_erf(v));
}

// x and out may be the same rows (in place): element i is read before it is written, and `omp simd` asserts the
// loop has no dependence between elements (so no __restrict between them).
template <class S, GeluForm F, bool BIAS>
void gelu_rows(const typename S::T* x, const typename S::T* __restrict bias, typename S::T* out, int64_t rows,
               int64_t n) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows * n, kParallelMinElems))
  for (int64_t r = 0; r < rows; ++r) {
    const typename S::T* xr = x + r * n;
    typename S::T* yr = out + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) yr[i] = S::store(act<F>(BIAS ? S::load(xr[i]) + S::load(bias[i]) : S::load(xr[i])));
  }
}

// out rows are ldo apart; out may be x with ldo = 2n (each output over its input half, read first).
template <class S, GeluForm F>
void geglu_rows(const typename S::T* x, typename S::T* out, int64_t rows, int64_t n, int64_t ldo) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows * n, kParallelMinElems))
  for (int64_t r = 0; r < rows; ++r) {
    const typename S::T* in = x + r * 2 * n;
    const typename S::T* gate = in + n;
    typename S::T* yr = out + r * ldo;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) yr[i] = S::store(act<F>(S::load(in[i])) * S::load(gate[i]));
  }
}

template <class S, GeluForm F>
void gelu_bias(const typename S::T* x, const typename S::T* bias, typename S::T* out, int64_t rows, int64_t n) {
  bias != nullptr ? gelu_rows<S, F, true>(x, bias, out, rows, n) : gelu_rows<S, F, false>(x, bias, out, rows, n);
}

template <class S>
void gelu_dispatch(const typename S::T* x, const typename S::T* bias, typename S::T* out, int64_t rows, int64_t n,
                   GeluForm form) {
  if (rows == 1 && worth_parallel(n, kParallelMinElems)) {  // one long row: split it so every thread gets a share
    const int64_t chunk = 1024, parts = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t a = p * chunk, len = (n - a < chunk) ? n - a : chunk;
      gelu_dispatch<S>(x + a, bias != nullptr ? bias + a : nullptr, out + a, 1, len, form);
    }
    return;
  }
  switch (form) {
    case GeluForm::kTanh: gelu_bias<S, GeluForm::kTanh>(x, bias, out, rows, n); break;
    case GeluForm::kQuick: gelu_bias<S, GeluForm::kQuick>(x, bias, out, rows, n); break;
    default: gelu_bias<S, GeluForm::kErf>(x, bias, out, rows, n); break;
  }
}

template <class S>
void geglu_dispatch(const typename S::T* x, typename S::T* out, int64_t rows, int64_t n, int64_t ldo, GeluForm form) {
  switch (form) {
    case GeluForm::kTanh: geglu_rows<S, GeluForm::kTanh>(x, out, rows, n, ldo); break;
    case GeluForm::kQuick: geglu_rows<S, GeluForm::kQuick>(x, out, rows, n, ldo); break;
    default: geglu_rows<S, GeluForm::kErf>(x, out, rows, n, ldo); break;
  }
}

}  // namespace

void gelu_fwd(const float* x, const float* bias, float* out, int64_t rows, int64_t n, GeluForm form) {
  gelu_dispatch<F32>(x, bias, out, rows, n, form);
}

void gelu_fwd_bf16(const uint16_t* x, const uint16_t* bias, uint16_t* out, int64_t rows, int64_t n, GeluForm form) {
  gelu_dispatch<BF16>(x, bias, out, rows, n, form);
}

void geglu_fwd(const float* x, float* out, int64_t rows, int64_t n, int64_t ldo, GeluForm form) {
  geglu_dispatch<F32>(x, out, rows, n, ldo, form);
}

void geglu_fwd_bf16(const uint16_t* x, uint16_t* out, int64_t rows, int64_t n, int64_t ldo, GeluForm form) {
  geglu_dispatch<BF16>(x, out, rows, n, ldo, form);
}

}  // namespace fastenc_cpu
