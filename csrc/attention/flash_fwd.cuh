// FlashAttention-2 forward (Dao, 2023) for non-causal varlen attention on tensor cores: mma.sync.m16n8k16
// (fp16/bf16 in, fp32 accumulate), ldmatrix fragments, K/V tiles double-buffered in shared memory with
// cp.async, online softmax in registers. Runs on sm_80 and sm_90 (a wgmma path for sm_90a can sit beside it).
#pragma once
#include <type_traits>

#include "cuda_utils.h"

namespace fastenc_cuda {
namespace attn {

constexpr int kBlockM = 64;   // query rows per block: 4 warps x 16 rows
constexpr int kBlockN = 64;   // keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  const int32_t* cu_seqlens;
  int batch, heads, m_blocks;   // m_blocks = ceil(max_seqlen / kBlockM)
  int window_left, window_right;  // -1 = unbounded
  float scale_log2;             // softmax scale * log2(e): scores live in the exp2 domain
  int total;                    // rows of q, k, v, out: a sequence reaching outside [0, total] is skipped
  float* lse;                   // (heads, total_tokens) fp32 natural log-sum-exp per row, or null
  const float* bias;            // distance bias lookup (heads, bias_len = 2L - 1) fp32, or null:
  int bias_len;                 //   s_ij += bias[head, i - j + L - 1] (an index outside the lookup adds nothing)
  // Relative terms (the kRel kernels; rel_len = 2L - 1, the length of bias and slot when both are given):
  const int32_t* positions;     // (total,) per-token positions, read clamped to [0, L), or null: i - j becomes
  int rel_len;                  //   positions[i] - positions[j]
  const void* c2p;              // DeBERTa's disentangled terms (total, heads, slots) in T, or null:
  const void* p2c;              //   s_ij += c2p[i, head, slot] + p2c[j, head, slot],
  const int32_t* slot;          //   slot = slot_lut[dist + L - 1] (2L - 1,) clamped to [0, slots); null: no c2p/p2c
  int slots;
};

// Shared memory: Q tile, then K[2], V[2] tiles; rows padded by 8 elements (16 bytes) so the 8 row addresses
// of an ldmatrix land in distinct bank groups for any head dim that is a multiple of 16.
template <int D>
struct Layout {
  static constexpr int kStride = D + 8;
  static constexpr int kTile = kBlockM * kStride;  // kBlockM == kBlockN
  static constexpr int kBytes = 5 * kTile * 2;
};

// ---------------------------------------------------------------- PTX wrappers
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; when !valid the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// c (16x8 fp32) += a (16x16, row) * b (16x8, col).
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __half>::value) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one 32-bit register of two T (lo in the low half: the lower column index).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __half>::value) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// Async copy of rows [row0, row0 + 64) of a (len x D) head slice with row stride `ld` elements into a padded
// shared tile; rows >= len are zero-filled (so masked keys carry V = 0, never stale NaNs).
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t ld, int row0, int len, int tid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert((kBlockM * kChunks) % kThreads == 0, "tile chunks must split evenly over the block");
#pragma unroll
  for (int it = 0; it < kBlockM * kChunks / kThreads; ++it) {
    const int i = tid + it * kThreads;
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool ok = row0 + r < len;
    const T* src = ok ? g + static_cast<int64_t>(row0 + r) * ld + c : g;
    cp_async16(smem_u32(s + r * Layout<D>::kStride + c), src, ok);
  }
}

// The relative terms of query (position pos_i, c2p row c2p_i or null) and key `key` of the sequence starting at
// seq_start, in log2 units: bias[pos_i - pos_j + L - 1] + c2p_i[slot] + p2c[key, head, slot] (rel_len = 2L - 1).
template <typename T>
__device__ __forceinline__ float rel_score(const Params& p, const float* bias_h, int pos_i, const T* c2p_i,
                                           int seq_start, int key, int head) {
  const int mid = (p.rel_len - 1) / 2;
  const int pos_j = p.positions != nullptr ? min(max(__ldg(p.positions + seq_start + key), 0), mid) : key;
  const int dist = pos_i - pos_j;
  float x = 0.f;
  if (bias_h != nullptr) {
    const int bi = dist + mid;
    if (bi >= 0 && bi < p.bias_len) x += __ldg(bias_h + bi);
  }
  if (p.slot != nullptr) {
    const int si = min(max(dist + mid, 0), p.rel_len - 1);
    const int sl = min(max(__ldg(p.slot + si), 0), p.slots - 1);
    if (c2p_i != nullptr) x += to_float(c2p_i[sl]);
    if (p.p2c != nullptr)
      x += to_float(
          static_cast<const T*>(p.p2c)[(static_cast<int64_t>(seq_start + key) * p.heads + head) * p.slots + sl]);
  }
  return x * 1.4426950408889634f;
}

// Grid: x = m_blocks * batch (query tile, sequence), y = head. Block: 4 warps; warp w owns query rows
// m0 + 16w .. m0 + 16w + 15. Fragment coordinates of m16n8k16 (lane = 4g + t): accumulator element e of
// n-tile j sits at row g + 8*(e >> 1), column 8j + 2t + (e & 1).
//
// Online softmax per query row, over key tiles (scores s already scaled by scale*log2 e):
//   m' = max(m, max_j s_j);  p_j = 2^(s_j - m');  l' = l * 2^(m - m') + sum_j p_j;  O' = O * 2^(m - m') + P V
// and at the end out = O / l (a row with no visible key has l = 0 and gives 0).
//
// kRel (positions / c2p / p2c given): the distance is pos_i - pos_j and c2p / p2c are gathered through the slot lookup
// per score element; every position and slot read is clamped into its table, only pairs inside the sequence read.
template <typename T, int D, bool kRel>
__global__ void __launch_bounds__(kThreads) flash_fwd_kernel(const Params p) {
  using L = Layout<D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + L::kTile;
  T* sV = sK + 2 * L::kTile;

  const int b = blockIdx.x / p.m_blocks, m_block = blockIdx.x - b * p.m_blocks, head = blockIdx.y;
  // cu_seqlens bounds-checked where it is read: a sequence that is not 0 <= start <= end <= total is skipped.
  const int seq_start = p.cu_seqlens[b], seq_end = p.cu_seqlens[b + 1];
  if (!(static_cast<unsigned>(seq_start) <= static_cast<unsigned>(seq_end) &&
        static_cast<unsigned>(seq_end) <= static_cast<unsigned>(p.total)))
    return;
  const int len = seq_end - seq_start;
  const int m0 = m_block * kBlockM;
  if (m0 >= len) return;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;     // mma fragment row group / thread in group
  const int mi = lane >> 3, mr = lane & 7;   // ldmatrix: which 8x8 matrix this lane addresses, and its row
  const int64_t ld = static_cast<int64_t>(p.heads) * D;
  const int64_t off = static_cast<int64_t>(seq_start) * ld + static_cast<int64_t>(head) * D;
  const T* qg = static_cast<const T*>(p.q) + off;
  const T* kg = static_cast<const T*>(p.k) + off;
  const T* vg = static_cast<const T*>(p.v) + off;
  T* og = static_cast<T*>(p.out) + off;
  const int wl = p.window_left, wr = p.window_right;
  const float* bias_h = p.bias != nullptr ? p.bias + static_cast<int64_t>(head) * p.bias_len : nullptr;
  const int bias_mid = (p.bias_len - 1) / 2;
  // kRel: this thread's two query rows (g, g + 8 of its warp): positions and c2p rows (null past the sequence end).
  const int rel_mid = (p.rel_len - 1) / 2;
  int pos_r[2] = {0, 0};
  const T* c2p_r[2] = {nullptr, nullptr};
  if constexpr (kRel) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + warp * 16 + g + h * 8;
      if (row >= len) continue;
      pos_r[h] = p.positions != nullptr ? min(max(__ldg(p.positions + seq_start + row), 0), rel_mid) : row;
      if (p.c2p != nullptr)
        c2p_r[h] = static_cast<const T*>(p.c2p) + (static_cast<int64_t>(seq_start + row) * p.heads + head) * p.slots;
    }
  }

  // Keys any row of this tile can see: [n_lo, n_hi) (non-empty: it contains m0).
  const int m_last = min(m0 + kBlockM, len) - 1;
  const int n_lo = wl >= 0 ? max(0, m0 - wl) : 0;
  const int n_hi = wr >= 0 ? min(len, m_last + wr + 1) : len;
  const int nb_lo = n_lo / kBlockN, nb_hi = (n_hi + kBlockN - 1) / kBlockN;

  load_tile<T, D>(sQ, qg, ld, m0, len, tid);
  cp_async_commit();
  load_tile<T, D>(sK, kg, ld, nb_lo * kBlockN, len, tid);
  load_tile<T, D>(sV, vg, ld, nb_lo * kBlockN, len, tid);
  cp_async_commit();
  cp_async_wait<1>();  // Q has landed (K/V of the first tile may still be in flight)
  __syncthreads();

  // Q fragments of this warp's 16 rows for every 16-wide slice of the head dim (A operand, row-major):
  // matrices 0..3 = (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15).
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(qf[kk], smem_u32(sQ + (warp * 16 + mr + (mi & 1) * 8) * L::kStride + kk * 16 + (mi >> 1) * 8));

  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.f, 0.f};

  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int buf = (nb - nb_lo) & 1;
    if (nb + 1 < nb_hi) {  // prefetch the next K/V tile into the other buffer (freed by the last barrier)
      load_tile<T, D>(sK + (buf ^ 1) * L::kTile, kg, ld, (nb + 1) * kBlockN, len, tid);
      load_tile<T, D>(sV + (buf ^ 1) * L::kTile, vg, ld, (nb + 1) * kBlockN, len, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* sKb = sK + buf * L::kTile;
    const T* sVb = sV + buf * L::kTile;

    // S = Q K^T (16 x 64 per warp). B operand = K^T: K rows are keys, contiguous along d, i.e. "col" layout;
    // matrices 0..3 = (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15).
    float s[kBlockN / 8][4];
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        uint32_t kf[4];
        ldmatrix_x4(kf, smem_u32(sKb + (np * 16 + mr + (mi >> 1) * 8) * L::kStride + kk * 16 + (mi & 1) * 8));
        mma16816<T>(s[2 * np], qf[kk], kf[0], kf[1]);
        mma16816<T>(s[2 * np + 1], qf[kk], kf[2], kf[3]);
      }
    }

    // Scale into the exp2 domain; mask keys past the sequence end or outside the window band.
    const int n0 = nb * kBlockN;
    const bool need_mask = n0 + kBlockN > len || (wl >= 0 && n0 < m0 + kBlockM - 1 - wl) ||
                           (wr >= 0 && n0 + kBlockN - 1 > m0 + wr);
    // Distance bias (log2 units): bias[i - j + L - 1] read through the read-only cache, bounds-checked per element.
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * p.scale_log2;
        const int key = n0 + j * 8 + 2 * t + (e & 1);
        const int row = m0 + warp * 16 + g + (e >> 1) * 8;
        if constexpr (kRel) {
          if (row < len && key < len) x += rel_score<T>(p, bias_h, pos_r[e >> 1], c2p_r[e >> 1], seq_start, key, head);
        } else if (bias_h != nullptr) {
          const int bi = row - key + bias_mid;
          if (bi >= 0 && bi < p.bias_len) x += __ldg(bias_h + bi) * 1.4426950408889634f;
        }
        if (need_mask) {
          const bool ok = key < len && (wl < 0 || key >= row - wl) && (wr < 0 || key <= row + wr);
          if (!ok) x = -INFINITY;
        }
        s[j][e] = x;
      }
    }

    // Online softmax for rows g (h = 0) and g + 8 (h = 1); a row's 64 scores are spread over the 4 lanes
    // of its group (t = 0..3), hence the two xor-shuffles.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_m[h];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_use = mx == -INFINITY ? 0.f : mx;  // nothing visible yet: avoid (-inf) - (-inf)
      const float corr = exp2f(row_m[h] - m_use);
      row_m[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        s[j][2 * h] = exp2f(s[j][2 * h] - m_use);
        s[j][2 * h + 1] = exp2f(s[j][2 * h + 1] - m_use);
        sum += s[j][2 * h] + s[j][2 * h + 1];
      }
      row_l[h] = row_l[h] * corr + sum;  // this lane's partial row sum; the 4 lanes are added at the end
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[j][2 * h] *= corr;
        o[j][2 * h + 1] *= corr;
      }
    }

    // O += P V. P (A operand) comes straight from the S accumulators: the 16-key slice ks is n-tiles 2ks and
    // 2ks+1. B operand = V (keys x d, row-major) read transposed: matrices 0..3 = (keys 0-7, d 0-7),
    // (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15).
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      uint32_t pa[4];
      pa[0] = pack2<T>(s[2 * ks][0], s[2 * ks][1]);
      pa[1] = pack2<T>(s[2 * ks][2], s[2 * ks][3]);
      pa[2] = pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      pa[3] = pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, smem_u32(sVb + (ks * 16 + mr + (mi & 1) * 8) * L::kStride + dp * 16 + (mi >> 1) * 8));
        mma16816<T>(o[2 * dp], pa, vf[0], vf[1]);
        mma16816<T>(o[2 * dp + 1], pa, vf[2], vf[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

  // out = O / l. Stage the warp's 16 rows in its own rows of sQ (only this warp ever read them), then
  // write them out as 16-byte stores, skipping rows past the sequence end.
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[h] = l > 0.f ? 1.f / l : 0.f;
    // lse = (m + log2 l) ln 2 (scores are in log2 units; +inf for a row that saw no key), for the backward.
    const int row = m0 + warp * 16 + g + h * 8;
    if (p.lse != nullptr && t == 0 && row < len)
      p.lse[static_cast<int64_t>(head) * p.total + seq_start + row] =
          l > 0.f ? (row_m[h] + log2f(l)) * 0.6931471805599453f : INFINITY;
  }
  T* sO = sQ + warp * 16 * L::kStride;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    *reinterpret_cast<uint32_t*>(sO + g * L::kStride + j * 8 + 2 * t) = pack2<T>(o[j][0] * inv[0], o[j][1] * inv[0]);
    *reinterpret_cast<uint32_t*>(sO + (g + 8) * L::kStride + j * 8 + 2 * t) =
        pack2<T>(o[j][2] * inv[1], o[j][3] * inv[1]);
  }
  __syncwarp();
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int it = 0; it < kChunks / 2; ++it) {  // 16 rows x kChunks chunks over 32 lanes
    const int i = lane + it * 32;
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const int row = m0 + warp * 16 + r;
    if (row < len)
      *reinterpret_cast<uint4*>(og + static_cast<int64_t>(row) * ld + c) =
          *reinterpret_cast<const uint4*>(sO + r * L::kStride + c);
  }
}

// Launch for one (dtype, head dim); defined in flash_fwd_<dtype>.cu.
// (the kRel instance when positions or a slot lookup is given).
template <typename T, int D>
cudaError_t run_flash_fwd(const Params& p, cudaStream_t stream) {
  const int bytes = Layout<D>::kBytes;
  const bool rel = p.positions != nullptr || p.slot != nullptr;
  auto kernel = rel ? flash_fwd_kernel<T, D, true> : flash_fwd_kernel<T, D, false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p.m_blocks) * static_cast<unsigned>(p.batch), static_cast<unsigned>(p.heads));
  kernel<<<grid, kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace attn
}  // namespace fastenc_cuda
