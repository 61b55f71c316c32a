// SIMD helpers of the CPU attention kernels (forward csrc/cpu/attention.cpp, backward csrc/cpu/attention_bwd.cpp):
// the register type chosen for the ISA this file is compiled for (-march=native in the JIT build: AVX-512, AVX2 or
// SSE), 2^x, the scaled Q^T panel transpose and the one register-blocked micro-kernel both products use.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace fastenc_cpu {
namespace attn {

// One SIMD register of floats as a GCC vector type (zmm with AVX-512, ymm with AVX/AVX2, xmm otherwise).
// Micro-tile: NR rows x NC registers (24 accumulators of the 32 zmm; 12 of the 16 ymm, 8 of the 16 xmm).
#if defined(__AVX512F__)
#define FASTENC_VW 16
#define FASTENC_NR 6
#define FASTENC_NC 4
#elif defined(__AVX__)
#define FASTENC_VW 8
#define FASTENC_NR 6
#define FASTENC_NC 2
#else
#define FASTENC_VW 4
#define FASTENC_NR 4
#define FASTENC_NC 2
#endif
constexpr int NR = FASTENC_NR, NC = FASTENC_NC;
constexpr int VW = FASTENC_VW;
// Q^T is stored as panels of PW queries (one micro-tile's register columns), each D x PW contiguous: the panel a
// micro-tile streams is 4 KiB in a row (AVX2) rather than D rows 512 B apart that share 8 of the 64 L1 sets.
constexpr int64_t PW = NC * VW;
typedef float vf __attribute__((vector_size(FASTENC_VW * 4)));
typedef int32_t vi __attribute__((vector_size(FASTENC_VW * 4)));

inline vf vload(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(vf));
  return v;
}
inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof(vf)); }
inline vf vset(float x) {  // broadcast (vf{} + x would cost an add: 0 + x is not x for x = -0)
#if defined(__AVX512F__)
  return _mm512_set1_ps(x);
#elif defined(__AVX__)
  return _mm256_set1_ps(x);
#else
  return vf{x, x, x, x};
#endif
}
inline vf vfma(vf a, vf b, vf c) {  // a * b + c in one rounding where the ISA has FMA
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline float hmax(vf a) {
  float m = a[0];
  for (int i = 1; i < VW; ++i) m = std::max(m, a[i]);
  return m;
}
inline float hsum(vf a) {
  float s = 0.f;
  for (int i = 0; i < VW; ++i) s += a[i];
  return s;
}

// 2^x for the softmax's x <= 0 (S - m' and m - m' are never positive): x = n + f with n = round(x),
// |f| <= 1/2; 2^f = e^(f ln2) by its degree-6 Taylor polynomial (truncation < 2e-7 relative); 2^n is written
// into the exponent bits. x <= -127 (including -inf) gives exactly 0; NaN stays NaN.
inline vf vexp2(vf x) {
#if defined(__AVX512F__)
  x = _mm512_max_ps(vset(-127.f), x);  // max(lo, x) returns x when x is NaN
#elif defined(__AVX__)
  x = _mm256_max_ps(vset(-127.f), x);
#else
  x = x < vset(-127.f) ? vset(-127.f) : x;
#endif
  const vf magic = vset(12582912.f);  // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer
  const vf r = (x + magic) - magic;
  const vf f = x - r;
  vf p = vset(1.5403530393381606e-04f);
  p = vfma(p, f, vset(1.3333558146428443e-03f));
  p = vfma(p, f, vset(9.618129107628477e-03f));
  p = vfma(p, f, vset(5.550410866482158e-02f));
  p = vfma(p, f, vset(2.402265069591007e-01f));
  p = vfma(p, f, vset(6.931471805599453e-01f));
  p = vfma(p, f, vset(1.0f));
  const vi bits = (__builtin_convertvector(r, vi) + 127) << 23;  // n = -127 -> all-zero bits = 0.0f
  vf two_n;
  std::memcpy(&two_n, &bits, sizeof(vf));
  return p * two_n;
}

// Q^T block: qt[d * ldt + r] = src[r * ld + d] * s for r < rows, d < D (called once per panel). Strided scalar
// stores (or loads) keep hitting the same few L1 sets (rows 3 KiB apart): 15% of the kernel's time at 8 x 128 tokens
// before 8 x 8 blocks were transposed in registers (AVX), edges scalar.
inline void transpose_scaled(const float* src, int64_t ld, int64_t rows, int64_t D, float s, float* qt,
                             int64_t ldt) {
  int64_t r0 = 0;
#if defined(__AVX__)
  const __m256 sv = _mm256_set1_ps(s);
  for (; r0 + 8 <= rows; r0 += 8) {
    int64_t d0 = 0;
    for (; d0 + 8 <= D; d0 += 8) {
      __m256 a[8];
      for (int i = 0; i < 8; ++i) a[i] = _mm256_mul_ps(_mm256_loadu_ps(src + (r0 + i) * ld + d0), sv);
      __m256 t[8], u[8];
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]);
      }
      for (int i = 0; i < 2; ++i) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(qt + (d0 + i) * ldt + r0, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(qt + (d0 + i + 4) * ldt + r0, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
      }
    }
    for (; d0 < D; ++d0)
      for (int64_t r = r0; r < r0 + 8; ++r) qt[d0 * ldt + r] = src[r * ld + d0] * s;
  }
#endif
  for (; r0 < rows; ++r0)
    for (int64_t d = 0; d < D; ++d) qt[d * ldt + r0] = src[r0 * ld + d] * s;
}

// dst[0:n] = src[0:n] in whole registers and a scalar tail (inline: a libc memmove call per 256-byte row costs
// more than the copy).
inline void copy_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) vstore(dst + i, vload(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

// dst[0:n] += src[0:n] in whole registers and a scalar tail (the distance bias on a row of S^T, its gradient's
// accumulation).
inline void add_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) vstore(dst + i, vload(dst + i) + vload(src + i));
  for (; i < n; ++i) dst[i] += src[i];
}

// Prefetch `rows` rows of n floats, ld apart, into L2.
inline void prefetch_rows(const float* p, int64_t ld, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < n; d += 16) __builtin_prefetch(p + r * ld + d, 0, 2);
}

// The one micro-kernel, for both products:
//   Out[r][c0 + c regs] = (ACC ? alpha[r] Out[r] : 0) + sum_t A(r, t) * B[t][c regs],   r < R, c < C,
// A(r, t) = A[r * ars + t * ats] broadcast from memory; B (already at register column c0) rows ldb floats apart,
// Out rows ldo floats apart.
//   S^T = K Q^T:           A = K tile (ars = D, ats = 1),  B = a Q^T panel (ldb = PW), t = feature
//   O = alpha O + P V:     A = P^T   (ars = 1, ats = BM), B = V tile (ldb = Dp), t = key
template <int R, int C, bool ACC>
inline void micro(const float* A, int64_t ars, int64_t ats, const float* B, int64_t ldb, int64_t n, float* Out,
                  int64_t ldo, const float* alpha, int64_t c0) {
  vf acc[R][C];
  for (int r = 0; r < R; ++r) {
    if constexpr (ACC) {
      const vf a = vset(alpha[r]);
      for (int c = 0; c < C; ++c) acc[r][c] = vload(Out + r * ldo + (c0 + c) * VW) * a;
    } else {
      for (int c = 0; c < C; ++c) acc[r][c] = vf{};
    }
  }
  const float* bt = B;
  for (int64_t t = 0; t < n; ++t, bt += ldb, A += ats) {
    vf bv[C];
    for (int c = 0; c < C; ++c) bv[c] = vload(bt + c * VW);
    for (int r = 0; r < R; ++r) {
      const vf ab = vset(A[r * ars]);
      for (int c = 0; c < C; ++c) acc[r][c] = vfma(ab, bv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) vstore(Out + r * ldo + (c0 + c) * VW, acc[r][c]);
}

struct Operands {
  const float* A;
  int64_t ars, ats;
  const float* B;
  int64_t ldb, n;
  float* Out;
  int64_t ldo;
  const float* alpha;
  int64_t bpanel;  // 0: B is one matrix (register column c at B + c * VW); else floats between NC-register panels
};

// All `rows` rows of Out for register columns [c0, c0 + C): full NR-row tiles, then the remainder.
template <int C, bool ACC>
inline void micro_rows(const Operands& o, int64_t c0, int64_t rows) {
  const float* B = o.bpanel ? o.B + c0 / NC * o.bpanel : o.B + c0 * VW;
  int64_t r = 0;
  for (; r + NR <= rows; r += NR)
    micro<NR, C, ACC>(o.A + r * o.ars, o.ars, o.ats, B, o.ldb, o.n, o.Out + r * o.ldo, o.ldo,
                      ACC ? o.alpha + r : nullptr, c0);
  const float* a = o.A + r * o.ars;
  float* out = o.Out + r * o.ldo;
  const float* al = ACC ? o.alpha + r : nullptr;
  switch (rows - r) {
#if FASTENC_NR > 5
    case 5: micro<5, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
    case 4: micro<4, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
#endif
    case 3: micro<3, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
    case 2: micro<2, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
    case 1: micro<1, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
    default: break;
  }
}

// Out[rows x cols registers]: register columns in groups of NC, the last group narrower.
template <bool ACC>
inline void product(const Operands& o, int64_t rows, int64_t cols) {
  for (int64_t c0 = 0; c0 < cols; c0 += NC) {
    switch (std::min<int64_t>(NC, cols - c0)) {
#if FASTENC_NC > 2
      case 4: micro_rows<4, ACC>(o, c0, rows); break;
      case 3: micro_rows<3, ACC>(o, c0, rows); break;
#endif
      case 2: micro_rows<2, ACC>(o, c0, rows); break;
      default: micro_rows<1, ACC>(o, c0, rows); break;
    }
  }
}

}  // namespace attn
}  // namespace fastenc_cpu
