// GELU (+bias) and GeGLU forward: vectorized elementwise kernels (16-byte loads), fp32 math.
// Exact GELU: 0.5*x*(1 + erf(x/sqrt 2)); tanh form: 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))); quick GELU:
// x * sigmoid(1.702 x) (act_math.cuh).
#include "act.h"
#include "act_math.cuh"
#include "cuda_utils.h"

namespace fastenc_cuda {
namespace {

// The tanh form uses 0.5*(1 + tanh(u)) = 1/(1 + exp(-2u)): with --use_fast_math, tanhf becomes tanh.approx
// (about 11 bits), too coarse for fp32, while exp stays within a few ulp. Large |u| saturates to x or -0.
__device__ __forceinline__ float gelu_f(float v, int form) {
  if (form == kGeluQuick) return x_sigmoid_f(v, kQuickK);
  if (form == kGeluTanh) {
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return v / (1.f + expf(-2.f * u));
  }
  return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
}

// out[r, c] = gelu(x[r, c] + bias[c]) over `total` vectors of VEC elements; a row holds `row_vecs` vectors.
template <typename T, int VEC>
__global__ void gelu_fwd_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ out,
                                int64_t total, int64_t row_vecs, int form) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[VEC];
    load_f32<T, VEC>(x + i * VEC, v);
    if (bias != nullptr) {
      float b[VEC];
      load_f32<T, VEC>(bias + (i % row_vecs) * VEC, b);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] += b[j];
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = gelu_f(v[j], form);
    store_f32<T, VEC>(out + i * VEC, v);
  }
}

// out[r, c] = gelu(x[r, c]) * x[r, n + c] for c < n; `row_vecs` = n / VEC vectors per output row.
template <typename T, int VEC>
__global__ void geglu_fwd_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t total, int64_t row_vecs,
                                 int64_t n, int form) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs, c = (i - row * row_vecs) * VEC;
    float a[VEC], g[VEC];
    load_f32<T, VEC>(x + row * 2 * n + c, a);
    load_f32<T, VEC>(x + row * 2 * n + n + c, g);
#pragma unroll
    for (int j = 0; j < VEC; ++j) a[j] = gelu_f(a[j], form) * g[j];
    store_f32<T, VEC>(out + row * n + c, a);
  }
}

// gelu(v) and gelu'(v) together (the backward recomputes both from x; nothing is saved by the forward):
//   exact: gelu'(v) = Phi(v) + v phi(v),  Phi(v) = (1 + erf(v / sqrt 2)) / 2,  phi(v) = exp(-v^2 / 2) / sqrt(2 pi)
//   tanh:  s = 1 / (1 + exp(-2u)) = (1 + tanh u) / 2,  gelu(v) = v s,
//          gelu'(v) = s + 2 v s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 v^2)     (1 - tanh^2 u = 4 s (1 - s))
//   quick: s = sigmoid(1.702 v),  gelu(v) = v s,  gelu'(v) = s + 1.702 v s (1 - s)
// At +-inf both give NaN (inf * 0), as torch's gelu_backward.
__device__ __forceinline__ void gelu_and_grad_f(float v, int form, float& y, float& d) {
  if (form == kGeluQuick) {
    x_sigmoid_and_grad_f(v, kQuickK, y, d);
  } else if (form == kGeluTanh) {
    const float s = 1.f / (1.f + expf(-1.5957691216057308f * (v + 0.044715f * v * v * v)));
    y = v * s;
    d = s + v * s * (1.f - s) * 1.5957691216057308f * (1.f + 0.134145f * v * v);
  } else {
    const float cdf = 0.5f * (1.f + erff(v * 0.7071067811865476f));
    y = v * cdf;
    d = cdf + v * expf(-0.5f * v * v) * 0.3989422804014327f;
  }
}

// dx[r, c] = grad[r, c] * gelu'(x[r, c] + bias[c]) over `total` vectors of VEC elements (bias: row_vecs per row).
template <typename T, int VEC>
__global__ void gelu_bwd_kernel(const T* __restrict__ grad, const T* __restrict__ x, const T* __restrict__ bias,
                                T* __restrict__ dx, int64_t total, int64_t row_vecs, int form) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[VEC], g[VEC];
    load_f32<T, VEC>(x + i * VEC, v);
    load_f32<T, VEC>(grad + i * VEC, g);
    if (bias != nullptr) {
      float b[VEC];
      load_f32<T, VEC>(bias + (i % row_vecs) * VEC, b);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] += b[j];
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float y, d;
      gelu_and_grad_f(v[j], form, y, d);
      g[j] *= d;
    }
    store_f32<T, VEC>(dx + i * VEC, g);
  }
}

// x = [a | gate] (rows, 2n), grad (rows, n): dx[r, c] = grad * gate * gelu'(a), dx[r, n + c] = grad * gelu(a).
template <typename T, int VEC>
__global__ void geglu_bwd_kernel(const T* __restrict__ grad, const T* __restrict__ x, T* __restrict__ dx,
                                 int64_t total, int64_t row_vecs, int64_t n, int form) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs, c = (i - row * row_vecs) * VEC;
    float a[VEC], gt[VEC], g[VEC];
    load_f32<T, VEC>(x + row * 2 * n + c, a);
    load_f32<T, VEC>(x + row * 2 * n + n + c, gt);
    load_f32<T, VEC>(grad + row * n + c, g);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float y, d;
      gelu_and_grad_f(a[j], form, y, d);
      a[j] = g[j] * gt[j] * d;
      gt[j] = g[j] * y;
    }
    store_f32<T, VEC>(dx + row * 2 * n + c, a);
    store_f32<T, VEC>(dx + row * 2 * n + n + c, gt);
  }
}

constexpr int kThreads = 256;

}  // namespace

cudaError_t gelu_fwd(const void* x, const void* bias, void* out, int64_t rows, int64_t n, int form,
                     int dtype, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const T* xp = static_cast<const T*>(x);
    const T* bp = static_cast<const T*>(bias);
    T* op = static_cast<T*>(out);
    if (n % V == 0 && aligned16(x) && aligned16(out) && (bias == nullptr || aligned16(bias))) {
      const int64_t total = rows * n / V;
      gelu_fwd_kernel<T, V><<<grid_for(total, kThreads), kThreads, 0, stream>>>(xp, bp, op, total, n / V,
                                                                               form);
    } else {
      const int64_t total = rows * n;
      gelu_fwd_kernel<T, 1><<<grid_for(total, kThreads), kThreads, 0, stream>>>(xp, bp, op, total, n, form);
    }
    return cudaGetLastError();
  });
}

cudaError_t geglu_fwd(const void* x, void* out, int64_t rows, int64_t n, int form, int dtype,
                      cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const T* xp = static_cast<const T*>(x);
    T* op = static_cast<T*>(out);
    if (n % V == 0 && aligned16(x) && aligned16(out)) {
      const int64_t total = rows * n / V;
      geglu_fwd_kernel<T, V><<<grid_for(total, kThreads), kThreads, 0, stream>>>(xp, op, total, n / V, n,
                                                                                form);
    } else {
      const int64_t total = rows * n;
      geglu_fwd_kernel<T, 1><<<grid_for(total, kThreads), kThreads, 0, stream>>>(xp, op, total, n, n, form);
    }
    return cudaGetLastError();
  });
}

// The vector path needs every pointer 16-byte aligned and rows a whole number of vectors; any other input
// (a storage-offset view, a width like 1001) takes the element-wise path (VEC = 1: no vector access at all).
cudaError_t gelu_bwd(const void* grad, const void* x, const void* bias, void* dx, int64_t rows, int64_t n,
                     int form, int dtype, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const T* gp = static_cast<const T*>(grad);
    const T* xp = static_cast<const T*>(x);
    const T* bp = static_cast<const T*>(bias);
    T* dp = static_cast<T*>(dx);
    if (n % V == 0 && aligned16(grad) && aligned16(x) && aligned16(dx) && (bias == nullptr || aligned16(bias))) {
      const int64_t total = rows * n / V;
      gelu_bwd_kernel<T, V><<<grid_for(total, kThreads), kThreads, 0, stream>>>(gp, xp, bp, dp, total, n / V,
                                                                               form);
    } else {
      const int64_t total = rows * n;
      gelu_bwd_kernel<T, 1><<<grid_for(total, kThreads), kThreads, 0, stream>>>(gp, xp, bp, dp, total, n,
                                                                               form);
    }
    return cudaGetLastError();
  });
}

cudaError_t geglu_bwd(const void* grad, const void* x, void* dx, int64_t rows, int64_t n, int form,
                      int dtype, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const T* gp = static_cast<const T*>(grad);
    const T* xp = static_cast<const T*>(x);
    T* dp = static_cast<T*>(dx);
    if (n % V == 0 && aligned16(grad) && aligned16(x) && aligned16(dx)) {
      const int64_t total = rows * n / V;
      geglu_bwd_kernel<T, V><<<grid_for(total, kThreads), kThreads, 0, stream>>>(gp, xp, dp, total, n / V, n,
                                                                                form);
    } else {
      const int64_t total = rows * n;
      geglu_bwd_kernel<T, 1><<<grid_for(total, kThreads), kThreads, 0, stream>>>(gp, xp, dp, total, n, n,
                                                                                form);
    }
    return cudaGetLastError();
  });
}

}  // namespace fastenc_cuda
