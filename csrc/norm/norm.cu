// LayerNorm / RMSNorm forward with fused residual add: one warp per row for hidden <= 1024, else a block per
// row; the row lives in registers (16-byte vector loads when every row start is 16-byte aligned, else element
// loads), statistics in fp32 with the two-pass formula; a training forward also writes mean and rstd per row.
#include "cuda_utils.h"
#include "norm.h"

namespace fastenc_cuda {
namespace {

// For one row (rounded h = x + residual when a residual is given, else h = x), over n = hidden:
//   LayerNorm: mean = sum(h)/n,  var = sum((h - mean)^2)/n   (biased; two passes over registers)
//              y = (h - mean) * rsqrt(var + eps) * w + b
//   RMSNorm:   y = h * rsqrt(sum(h^2)/n + eps) * w
// Row-group = blockDim.x threads (a warp with blockDim.y rows per block, or the whole block). Each thread
// caches NV vectors of VEC elements: vector i of thread t covers columns ((i * blockDim.x + t) * VEC ...).
template <typename T, int VEC, int NV>
__global__ void __launch_bounds__(512) norm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ res,
                                                        const T* __restrict__ w, const T* __restrict__ b,
                                                        T* __restrict__ out, T* __restrict__ res_out,
                                                        float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                                        int64_t rows, int hidden, float eps, bool rms) {
  __shared__ float scratch[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // block mode has blockDim.y == 1: the whole block leaves together
  const int64_t base = row * hidden;
  const int tid = threadIdx.x, nt = blockDim.x;
  float h[NV][VEC];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = (i * nt + tid) * VEC;
    if (col < hidden) {
      load_f32<T, VEC>(x + base + col, h[i]);
      if (res != nullptr) {
        float r[VEC];
        load_f32<T, VEC>(res + base + col, r);
#pragma unroll
        for (int j = 0; j < VEC; ++j) h[i][j] = round_to<T>(h[i][j] + r[j]);  // h is stored in T
        store_f32<T, VEC>(res_out + base + col, h[i]);
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) sum += h[i][j];
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) h[i][j] = 0.f;
    }
  }
  const float inv_n = 1.f / static_cast<float>(hidden);
  const float mean = rms ? 0.f : group_sum(sum, scratch) * inv_n;
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = (i * nt + tid) * VEC;
    if (col < hidden) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = h[i][j] - mean;
        sq += d * d;
      }
    }
  }
  const float rstd = rsqrtf(group_sum(sq, scratch) * inv_n + eps);
  if (rstd_out != nullptr && tid == 0) {  // training: the statistics the backward reads
    rstd_out[row] = rstd;
    if (mean_out != nullptr) mean_out[row] = mean;
  }
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = (i * nt + tid) * VEC;
    if (col < hidden) {
      float wv[VEC], y[VEC];
      load_f32<T, VEC>(w + col, wv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) y[j] = (h[i][j] - mean) * rstd * wv[j];
      if (b != nullptr) {
        float bv[VEC];
        load_f32<T, VEC>(b + col, bv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) y[j] += bv[j];
      }
      store_f32<T, VEC>(out + base + col, y);
    }
  }
}

// Rows too wide for the register cache: a block per row, three passes over memory (h is re-read from
// res_out, which this thread itself wrote, or from x).
template <typename T>
__global__ void __launch_bounds__(1024) norm_fwd_wide_kernel(const T* __restrict__ x, const T* __restrict__ res,
                                                             const T* __restrict__ w, const T* __restrict__ b,
                                                             T* __restrict__ out, T* res_out,
                                                             float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                                             int hidden, float eps, bool rms) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * hidden;
  const T* hsrc = res != nullptr ? res_out + base : x + base;
  float sum = 0.f;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float v = to_float(x[base + c]);
    if (res != nullptr) {
      v = round_to<T>(v + to_float(res[base + c]));
      res_out[base + c] = from_float<T>(v);
    }
    sum += v;
  }
  const float inv_n = 1.f / static_cast<float>(hidden);
  const float mean = rms ? 0.f : group_sum(sum, scratch) * inv_n;
  float sq = 0.f;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    const float d = to_float(hsrc[c]) - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(group_sum(sq, scratch) * inv_n + eps);
  if (rstd_out != nullptr && threadIdx.x == 0) {
    rstd_out[blockIdx.x] = rstd;
    if (mean_out != nullptr) mean_out[blockIdx.x] = mean;
  }
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float y = (to_float(hsrc[c]) - mean) * rstd * to_float(w[c]);
    if (b != nullptr) y += to_float(b[c]);
    out[base + c] = from_float<T>(y);
  }
}

int pow2_ceil(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

template <typename T, int VEC>
cudaError_t launch_cached(const T* x, const T* res, const T* w, const T* b, T* out, T* res_out, float* mean,
                          float* rstd, int64_t rows, int hidden, float eps, bool rms, int nv, dim3 block,
                          cudaStream_t stream) {
  const dim3 grid(ceil_div(rows, block.y));
  switch (nv) {
#define FASTENC_NORM_CASE(N)                                                                                 \
  case N:                                                                                                    \
    norm_fwd_kernel<T, VEC, N><<<grid, block, 0, stream>>>(x, res, w, b, out, res_out, mean, rstd, rows, hidden, \
                                                           eps, rms);                                          \
    break;
    FASTENC_NORM_CASE(1)
    FASTENC_NORM_CASE(2)
    FASTENC_NORM_CASE(4)
    FASTENC_NORM_CASE(8)
#undef FASTENC_NORM_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t norm_fwd(const void* x, const void* residual, const void* weight, const void* bias, void* out,
                     void* residual_out, int64_t rows, int64_t hidden, float eps, bool rms, int dtype,
                     cudaStream_t stream, float* mean_out, float* rstd_out) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  if (hidden > (1 << 30) || (residual != nullptr && residual_out == nullptr)) return cudaErrorInvalidValue;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const T* xp = static_cast<const T*>(x);
    const T* rp = static_cast<const T*>(residual);
    const T* wp = static_cast<const T*>(weight);
    const T* bp = static_cast<const T*>(bias);
    T* op = static_cast<T*>(out);
    T* hp = static_cast<T*>(residual_out);
    const bool vec = hidden % V == 0 && aligned16(x) && aligned16(weight) && aligned16(out) &&
                     (bias == nullptr || aligned16(bias)) && (residual == nullptr || (aligned16(residual) &&
                                                                                      aligned16(residual_out)));
    const int n = static_cast<int>(hidden);
    const int nvec = vec ? n / V : n;
    dim3 block;
    int nv;
    if (n <= 1024 && nvec <= 32 * 8) {  // one warp per row, 4 rows per block
      block = dim3(32, 4);
      nv = pow2_ceil((nvec + 31) / 32);
    } else {  // a block per row (<= 512 threads), about 4 vectors per thread
      int threads = ((nvec + 3) / 4 + 31) / 32 * 32;
      threads = threads < 64 ? 64 : (threads > 512 ? 512 : threads);
      block = dim3(threads, 1);
      nv = pow2_ceil((nvec + threads - 1) / threads);
    }
    if (nv > 8) {
      norm_fwd_wide_kernel<T><<<static_cast<unsigned>(rows), 1024, 0, stream>>>(xp, rp, wp, bp, op, hp, mean_out,
                                                                                 rstd_out, n, eps, rms);
      return cudaGetLastError();
    }
    if (vec) return launch_cached<T, V>(xp, rp, wp, bp, op, hp, mean_out, rstd_out, rows, n, eps, rms, nv, block,
                                        stream);
    // Misaligned (a view at an odd storage offset) or a width not a multiple of the vector: element accesses.
    return launch_cached<T, 1>(xp, rp, wp, bp, op, hp, mean_out, rstd_out, rows, n, eps, rms, nv, block, stream);
  });
}

}  // namespace fastenc_cuda
