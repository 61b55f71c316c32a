// SwiGLU on the CPU (Shazeer 2020, "GLU Variants Improve Transformer"): out = silu(gate) * up, fp32 math, OpenMP over
// rows, vectorized inner loops (fast_math.h), fp32 or bf16 storage (storage.h). gate and up are row-strided views,
// so one kernel serves the fused (rows, 2n) input [gate | up] and two separate (rows, n) inputs.
//   silu(g) = g sigmoid(g) = g / (1 + exp(-g))
// Backward, recomputed from gate and up (the forward saves nothing else), s = sigmoid(g):
//   dgate = grad * up * silu'(g),  silu'(g) = s + g s (1 - s)
//   dup   = grad * silu(g)
// Limits as torch's autograd of F.silu: silu(-inf) = NaN, silu(+inf) = +inf, gradients NaN at +-inf; NaN stays NaN.
#include "act.h"
#include "fast_math.h"
#include "parallel.h"
#include "storage.h"

namespace fastenc_cpu {

namespace {

template <class S>
void swiglu_rows(const typename S::T* __restrict gate, const typename S::T* __restrict up,
                 typename S::T* __restrict out, int64_t rows, int64_t n, int64_t ldg, int64_t ldu, int64_t ldo) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows * n, kParallelMinElems))
  for (int64_t r = 0; r < rows; ++r) {
    const typename S::T* gr = gate + r * ldg;
    const typename S::T* ur = up + r * ldu;
    typename S::T* yr = out + r * ldo;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) yr[i] = S::store(fm_silu(S::load(gr[i])) * S::load(ur[i]));
  }
}

template <class S>
void swiglu_bwd_rows(const typename S::T* __restrict grad, const typename S::T* __restrict gate,
                     const typename S::T* __restrict up, typename S::T* __restrict dgate, typename S::T* __restrict dup,
                     int64_t rows, int64_t n, int64_t ldg, int64_t ldu, int64_t ldd) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows * n, kParallelMinElems))
  for (int64_t r = 0; r < rows; ++r) {
    const typename S::T* gr = grad + r * n;
    const typename S::T* g = gate + r * ldg;
    const typename S::T* u = up + r * ldu;
    typename S::T* dg = dgate + r * ldd;
    typename S::T* du = dup + r * ldd;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      float y, d;
      fm_x_sigmoid_and_grad(S::load(g[i]), 1.0f, y, d);
      const float gv = S::load(gr[i]);
      dg[i] = S::store(gv * S::load(u[i]) * d);
      du[i] = S::store(gv * y);
    }
  }
}

}  // namespace

void swiglu_fwd(const float* gate, const float* up, float* out, int64_t rows, int64_t n, int64_t ldg, int64_t ldu,
                int64_t ldo) {
  swiglu_rows<F32>(gate, up, out, rows, n, ldg, ldu, ldo);
}

void swiglu_fwd_bf16(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t rows, int64_t n, int64_t ldg,
                     int64_t ldu, int64_t ldo) {
  swiglu_rows<BF16>(gate, up, out, rows, n, ldg, ldu, ldo);
}

void swiglu_bwd(const float* grad, const float* gate, const float* up, float* dgate, float* dup, int64_t rows,
                int64_t n, int64_t ldg, int64_t ldu, int64_t ldd) {
  swiglu_bwd_rows<F32>(grad, gate, up, dgate, dup, rows, n, ldg, ldu, ldd);
}

void swiglu_bwd_bf16(const uint16_t* grad, const uint16_t* gate, const uint16_t* up, uint16_t* dgate, uint16_t* dup,
                     int64_t rows, int64_t n, int64_t ldg, int64_t ldu, int64_t ldd) {
  swiglu_bwd_rows<BF16>(grad, gate, up, dgate, dup, rows, n, ldg, ldu, ldd);
}

}  // namespace fastenc_cpu
