// GELU (+bias) and GeGLU on the CPU, fp32, OpenMP over rows, vectorized inner loops (fast_math.h).
// exact: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2));  tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// GeGLU (ModernBERT order): out = gelu(x[:, :n]) * x[:, n:]. fp32 or bf16 storage (storage.h), fp32 math.
#include "act.h"
#include "fast_math.h"
#include "parallel.h"
#include "storage.h"

namespace fastenc_cpu {

namespace {

template <bool TANH>
FASTENC_INLINE float act(float v) {
  return TANH ? fm_gelu_tanh(v) : fm_gelu_erf(v);
}

// x and out may be the same rows (in place): element i is read before it is written, and `omp simd` asserts the
// loop has no dependence between elements (so no __restrict between them).
template <class S, bool TANH, bool BIAS>
void gelu_rows(const typename S::T* x, const typename S::T* __restrict bias, typename S::T* out, int64_t rows,
               int64_t n) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows * n, kParallelMinElems))
  for (int64_t r = 0; r < rows; ++r) {
    const typename S::T* xr = x + r * n;
    typename S::T* yr = out + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) yr[i] = S::store(act<TANH>(BIAS ? S::load(xr[i]) + S::load(bias[i]) : S::load(xr[i])));
  }
}

// out rows are ldo apart; out may be x with ldo = 2n (each output over its input half, read first).
template <class S, bool TANH>
void geglu_rows(const typename S::T* x, typename S::T* out, int64_t rows, int64_t n, int64_t ldo) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows * n, kParallelMinElems))
  for (int64_t r = 0; r < rows; ++r) {
    const typename S::T* in = x + r * 2 * n;
    const typename S::T* gate = in + n;
    typename S::T* yr = out + r * ldo;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) yr[i] = S::store(act<TANH>(S::load(in[i])) * S::load(gate[i]));
  }
}

template <class S>
void gelu_dispatch(const typename S::T* x, const typename S::T* bias, typename S::T* out, int64_t rows, int64_t n,
                   bool tanh_approx) {
  if (rows == 1 && worth_parallel(n, kParallelMinElems)) {  // one long row: split it so every thread gets a share
    const int64_t chunk = 1024, parts = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t a = p * chunk, len = (n - a < chunk) ? n - a : chunk;
      gelu_dispatch<S>(x + a, bias != nullptr ? bias + a : nullptr, out + a, 1, len, tanh_approx);
    }
    return;
  }
  if (tanh_approx) {
    bias != nullptr ? gelu_rows<S, true, true>(x, bias, out, rows, n) : gelu_rows<S, true, false>(x, bias, out, rows, n);
  } else {
    bias != nullptr ? gelu_rows<S, false, true>(x, bias, out, rows, n) : gelu_rows<S, false, false>(x, bias, out, rows, n);
  }
}

}  // namespace

void gelu_fwd(const float* x, const float* bias, float* out, int64_t rows, int64_t n, bool tanh_approx) {
  gelu_dispatch<F32>(x, bias, out, rows, n, tanh_approx);
}

void gelu_fwd_bf16(const uint16_t* x, const uint16_t* bias, uint16_t* out, int64_t rows, int64_t n, bool tanh_approx) {
  gelu_dispatch<BF16>(x, bias, out, rows, n, tanh_approx);
}

void geglu_fwd(const float* x, float* out, int64_t rows, int64_t n, int64_t ldo, bool tanh_approx) {
  tanh_approx ? geglu_rows<F32, true>(x, out, rows, n, ldo) : geglu_rows<F32, false>(x, out, rows, n, ldo);
}

void geglu_fwd_bf16(const uint16_t* x, uint16_t* out, int64_t rows, int64_t n, int64_t ldo, bool tanh_approx) {
  tanh_approx ? geglu_rows<BF16, true>(x, out, rows, n, ldo) : geglu_rows<BF16, false>(x, out, rows, n, ldo);
}

}  // namespace fastenc_cpu
