// Rotate-half RoPE of q and k in one launch (RoFormer; transformers' apply_rotary_pos_emb convention),
// vectorized over the head dim (16-byte loads), fp32 math. With x1 = x[:half], x2 = x[half:2*half]:
//   out[:half] = x1*cos - x2*sin,   out[half:2*half] = x2*cos + x1*sin,   out[2*half:] = x[2*half:]
// The backward is the inverse rotation (sin -> -sin; `sign` = -1). Positions are checked where they are read: a
// token whose position is outside [0, npos) never indexes cos/sin (no host sync to check them first); its rows
// are written as NaN, so a bad position shows in the output instead of reading out of bounds.
#include "cuda_utils.h"
#include "rope.h"

namespace fastenc_cuda {
namespace {

// Work item = (row, chunk): rows are the T*hq heads of q followed by the T*hk heads of k; a row has
// `nrot` = half/VEC rotation chunks (each writes both halves) then `npass` = (d - 2*half)/VEC copy chunks.
template <typename T, int VEC>
__global__ void rope_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, T* __restrict__ qo,
                                T* __restrict__ ko, const float* __restrict__ cos, const float* __restrict__ sin,
                                const int32_t* __restrict__ pos, int64_t npos, float sign, int64_t rows_q,
                                int64_t total, int hq, int hk, int d, int half, int nrot, int chunks) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i / chunks;
    const int c = static_cast<int>(i - r * chunks);
    const T* src;
    T* dst;
    int64_t tok;
    if (r < rows_q) {
      src = q + r * d;
      dst = qo + r * d;
      tok = r / hq;
    } else {
      r -= rows_q;
      src = k + r * d;
      dst = ko + r * d;
      tok = r / hk;
    }
    const int64_t pt = pos[tok];
    if (pt < 0 || pt >= npos) {  // out of the table: NaN rows, the table is not read
      float v[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = __int_as_float(0x7fc00000);
      const int j = c < nrot ? c * VEC : 2 * half + (c - nrot) * VEC;
      store_f32<T, VEC>(dst + j, v);
      if (c < nrot) store_f32<T, VEC>(dst + half + j, v);
    } else if (c < nrot) {
      const int j = c * VEC;
      const int64_t p = pt * half + j;
      float x1[VEC], x2[VEC], cs[VEC], sn[VEC], o1[VEC], o2[VEC];
      load_f32<T, VEC>(src + j, x1);
      load_f32<T, VEC>(src + half + j, x2);
      load_f32<float, VEC>(cos + p, cs);
      load_f32<float, VEC>(sin + p, sn);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float se = sign * sn[e];
        o1[e] = x1[e] * cs[e] - x2[e] * se;
        o2[e] = x2[e] * cs[e] + x1[e] * se;
      }
      store_f32<T, VEC>(dst + j, o1);
      store_f32<T, VEC>(dst + half + j, o2);
    } else {
      const int j = 2 * half + (c - nrot) * VEC;
      float v[VEC];
      load_f32<T, VEC>(src + j, v);
      store_f32<T, VEC>(dst + j, v);
    }
  }
}

}  // namespace

cudaError_t rope_fwd(const void* q, const void* k, void* qo, void* ko, const float* cos, const float* sin,
                     const int32_t* pos, int64_t tokens, int64_t hq, int64_t hk, int64_t d, int64_t half,
                     int64_t npos, bool inverse, int dtype, cudaStream_t stream) {
  if (tokens == 0 || d == 0 || (hq == 0 && hk == 0)) return cudaSuccess;
  if (half <= 0 || 2 * half > d || d > (1 << 20) || hq > (1 << 20) || hk > (1 << 20)) return cudaErrorInvalidValue;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    constexpr int kThreads = 256;
    const T* qp = static_cast<const T*>(q);
    const T* kp = static_cast<const T*>(k);
    T* qop = static_cast<T*>(qo);
    T* kop = static_cast<T*>(ko);
    const int64_t rows_q = tokens * hq, rows = tokens * (hq + hk);
    const int di = static_cast<int>(d), hf = static_cast<int>(half);
    // hq/hk of 0 never divide: a row index only reaches the branch of a side that has rows.
    const int hqi = hq > 0 ? static_cast<int>(hq) : 1, hki = hk > 0 ? static_cast<int>(hk) : 1;
    const float sign = inverse ? -1.f : 1.f;
    // 16-byte vectors only when every pointer is aligned and both halves and the pass-through are whole vectors;
    // otherwise (storage-offset views, odd head dims) the element-wise path (VEC = 1) runs.
    const bool vec = half % V == 0 && (d - 2 * half) % V == 0 && aligned16(q) && aligned16(k) && aligned16(qo) &&
                     aligned16(ko) && aligned16(cos) && aligned16(sin);
    if (vec) {
      const int nrot = hf / V, chunks = nrot + (di - 2 * hf) / V;
      const int64_t total = rows * chunks;
      rope_fwd_kernel<T, V><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          qp, kp, qop, kop, cos, sin, pos, npos, sign, rows_q, total, hqi, hki, di, hf, nrot, chunks);
    } else {
      const int nrot = hf, chunks = di - hf;
      const int64_t total = rows * chunks;
      rope_fwd_kernel<T, 1><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          qp, kp, qop, kop, cos, sin, pos, npos, sign, rows_q, total, hqi, hki, di, hf, nrot, chunks);
    }
    return cudaGetLastError();
  });
}

}  // namespace fastenc_cuda
