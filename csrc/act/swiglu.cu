// SwiGLU forward and backward (Shazeer 2020, "GLU Variants Improve Transformer"): vectorized elementwise kernels
// (16-byte loads where rows and pointers allow), fp32 math. gate and up are row-strided, so one kernel serves the
// fused rows x 2n input [gate | up] (up = gate + n, both rows 2n apart) and two separate rows x n inputs.
//   out = silu(gate) * up,  silu(g) = g s,  s = sigmoid(g)
//   dgate = grad * up * (s + g s (1 - s)),  dup = grad * silu(g)       (recomputed from gate and up)
#include "act.h"
#include "act_math.cuh"
#include "cuda_utils.h"

namespace fastenc_cuda {
namespace {

// out[r, c] = silu(gate[r, c]) * up[r, c] over `total` vectors of VEC elements, `row_vecs` = n / VEC per row.
template <typename T, int VEC>
__global__ void swiglu_fwd_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                  int64_t total, int64_t row_vecs, int64_t n, int64_t ldg, int64_t ldu) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs, c = (i - row * row_vecs) * VEC;
    float g[VEC], u[VEC];
    load_f32<T, VEC>(gate + row * ldg + c, g);
    load_f32<T, VEC>(up + row * ldu + c, u);
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = x_sigmoid_f(g[j], 1.f) * u[j];
    store_f32<T, VEC>(out + row * n + c, g);
  }
}

// dgate[r, c] = grad * up * silu'(gate), dup[r, c] = grad * silu(gate); dgate and dup rows ldd apart.
template <typename T, int VEC>
__global__ void swiglu_bwd_kernel(const T* __restrict__ grad, const T* __restrict__ gate, const T* __restrict__ up,
                                  T* __restrict__ dgate, T* __restrict__ dup, int64_t total, int64_t row_vecs,
                                  int64_t n, int64_t ldg, int64_t ldu, int64_t ldd) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs, c = (i - row * row_vecs) * VEC;
    float g[VEC], u[VEC], dy[VEC];
    load_f32<T, VEC>(gate + row * ldg + c, g);
    load_f32<T, VEC>(up + row * ldu + c, u);
    load_f32<T, VEC>(grad + row * n + c, dy);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float y, d;
      x_sigmoid_and_grad_f(g[j], 1.f, y, d);
      g[j] = dy[j] * u[j] * d;
      u[j] = dy[j] * y;
    }
    store_f32<T, VEC>(dgate + row * ldd + c, g);
    store_f32<T, VEC>(dup + row * ldd + c, u);
  }
}

constexpr int kThreads = 256;

}  // namespace

// The vector path needs every pointer 16-byte aligned and n and every row stride a whole number of vectors; any
// other input (a width like 1001, a storage-offset view) takes the element-wise path (VEC = 1).
cudaError_t swiglu_fwd(const void* gate, const void* up, void* out, int64_t rows, int64_t n, int64_t ldg, int64_t ldu,
                       int dtype, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const T* gp = static_cast<const T*>(gate);
    const T* up_ = static_cast<const T*>(up);
    T* op = static_cast<T*>(out);
    if (n % V == 0 && ldg % V == 0 && ldu % V == 0 && aligned16(gate) && aligned16(up) && aligned16(out)) {
      const int64_t total = rows * n / V;
      swiglu_fwd_kernel<T, V><<<grid_for(total, kThreads), kThreads, 0, stream>>>(gp, up_, op, total, n / V, n, ldg,
                                                                                 ldu);
    } else {
      const int64_t total = rows * n;
      swiglu_fwd_kernel<T, 1><<<grid_for(total, kThreads), kThreads, 0, stream>>>(gp, up_, op, total, n, n, ldg, ldu);
    }
    return cudaGetLastError();
  });
}

cudaError_t swiglu_bwd(const void* grad, const void* gate, const void* up, void* dgate, void* dup, int64_t rows,
                       int64_t n, int64_t ldg, int64_t ldu, int64_t ldd, int dtype, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const T* dyp = static_cast<const T*>(grad);
    const T* gp = static_cast<const T*>(gate);
    const T* up_ = static_cast<const T*>(up);
    T* dgp = static_cast<T*>(dgate);
    T* dup_ = static_cast<T*>(dup);
    if (n % V == 0 && ldg % V == 0 && ldu % V == 0 && ldd % V == 0 && aligned16(grad) && aligned16(gate) &&
        aligned16(up) && aligned16(dgate) && aligned16(dup)) {
      const int64_t total = rows * n / V;
      swiglu_bwd_kernel<T, V><<<grid_for(total, kThreads), kThreads, 0, stream>>>(dyp, gp, up_, dgp, dup_, total,
                                                                                 n / V, n, ldg, ldu, ldd);
    } else {
      const int64_t total = rows * n;
      swiglu_bwd_kernel<T, 1><<<grid_for(total, kThreads), kThreads, 0, stream>>>(dyp, gp, up_, dgp, dup_, total, n,
                                                                                 n, ldg, ldu, ldd);
    }
    return cudaGetLastError();
  });
}

}  // namespace fastenc_cuda
