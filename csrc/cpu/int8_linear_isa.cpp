// The u8 x s8 -> int32 microkernels of the int8 linear layer (int8_linear.h), one per instruction set, each compiled
// for its own target (function attributes) whatever -march the file is built with, and chosen at run time.
//
// Each computes acc[r][j] = sum_k q[r][k] * w[j][k] for up to 32 rows of quantized activations q (u8, row stride ldq)
// against one packed panel (32 columns; k-quad t of column j at panel[t * 128 + j * 4 .. + 4]) over the padded K.
//
// AVX2: vpmaddubsw multiplies u8 by s8 and adds adjacent pairs into int16 with saturation: two products of 255 x 127
// overflow it. So the codes are taken as signed c = q - 128 in [-127, 127] (q xor 0x80), and the product is formed
// as |c| * (w with c's sign) (vpabsb, vpsignb): both factors within 7 bits plus sign, |pair sum| <= 2 * 127 * 128 =
// 32512 < 32767, exact. vpmaddwd with ones adds the int16 pairs into int32 (4 products per lane). The kernel returns
// sum (q - 128) w; the caller adds 128 * colsum. Register tile: 2 rows x 32 columns (8 accumulators of 16:
// a row's broadcast, xor and abs serve four vectors).
// AVX-512 VNNI: vpdpbusd adds four u8 x s8 products into each int32 lane, no intermediate saturation. 8 rows x 32
// columns (16 accumulators of 32): per k-quad two 64-byte panel loads, one broadcast per row.
// AMX: TDPBUSD on 16 x 64 tiles: A = 16 rows x 64 codes, B = 16 k-quads x 16 columns (one 64-byte half of 16 packed
// rows, stride 128), C = 16 x 16 int32; 32 rows x 32 columns as four C tiles, 64 k per step.
#include <immintrin.h>

#include <cstring>

#include "int8_linear.h"

namespace fastenc_cpu {

namespace {

// Read prefetch into L2 of the next panel's line (the microkernels stream the weight: at a few rows the GEMM waits
// on memory, and a request a panel ahead keeps the next one coming while this one is computed).
inline void prefetch_l2(const int8_t* p) { __builtin_prefetch(p, 0, 2); }

inline int32_t load_quad(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---------------------------------------------------------------- AVX2
// R rows x the panel's 32 columns (4 vectors of 8 int32), acc row stride 32.
template <int R>
__attribute__((target("avx2"))) void avx2_rows(const uint8_t* q, int64_t ldq, const int8_t* panel, int64_t kq,
                                               int32_t* acc, const int8_t* pf) {
  __m256i a[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) a[r][v] = _mm256_setzero_si256();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < kq; ++t) {
    if (pf != nullptr) {
      prefetch_l2(pf + t * 128);
      prefetch_l2(pf + t * 128 + 64);
    }
    __m256i w[4];
    for (int v = 0; v < 4; ++v) w[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + t * 128 + 32 * v));
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      const __m256i c = _mm256_xor_si256(_mm256_set1_epi32(load_quad(q + r * ldq + 4 * t)), flip);  // q - 128
      const __m256i ac = _mm256_abs_epi8(c);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v)
        a[r][v] = _mm256_add_epi32(a[r][v], _mm256_madd_epi16(_mm256_maddubs_epi16(ac, _mm256_sign_epi8(w[v], c)), ones));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + r * 32 + 8 * v), a[r][v]);
}

// ---------------------------------------------------------------- AVX-512 VNNI
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni_rows(const uint8_t* q, int64_t ldq,
                                                                      const int8_t* panel, int64_t kq,
                                                                      int32_t* acc, const int8_t* pf) {
  __m512i a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm512_setzero_si512();
  for (int64_t t = 0; t < kq; ++t) {
    if (pf != nullptr) {
      prefetch_l2(pf + t * 128);
      prefetch_l2(pf + t * 128 + 64);
    }
    const __m512i b0 = _mm512_loadu_si512(panel + t * 128);
    const __m512i b1 = _mm512_loadu_si512(panel + t * 128 + 64);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i x = _mm512_set1_epi32(load_quad(q + r * ldq + 4 * t));
      a[r][0] = _mm512_dpbusd_epi32(a[r][0], x, b0);
      a[r][1] = _mm512_dpbusd_epi32(a[r][1], x, b1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_si512(acc + r * 32, a[r][0]);
    _mm512_storeu_si512(acc + r * 32 + 16, a[r][1]);
  }
}

template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni_tail(int rows, const uint8_t* q, int64_t ldq,
                                                                      const int8_t* panel, int64_t kq,
                                                                      int32_t* acc, const int8_t* pf) {
  if constexpr (R > 1) {
    if (rows < R) return vnni_tail<R - 1>(rows, q, ldq, panel, kq, acc, pf);
  }
  vnni_rows<R>(q, ldq, panel, kq, acc, pf);
}

// ---------------------------------------------------------------- AMX
struct TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

}  // namespace

void int8_block_avx2(const uint8_t* q, int64_t ldq, int rows, const int8_t* panel, int64_t kq, int32_t* acc,
                     const int8_t* next) {
  // two rows at a time (the first pair requests the next panel): 8 accumulators, 4 panel vectors and the row's
  // codes fill AVX2's 16 registers
  int r0 = 0;
  for (; r0 + 2 <= rows; r0 += 2)
    avx2_rows<2>(q + r0 * ldq, ldq, panel, kq, acc + r0 * 32, r0 == 0 ? next : nullptr);
  if (r0 < rows) avx2_rows<1>(q + r0 * ldq, ldq, panel, kq, acc + r0 * 32, r0 == 0 ? next : nullptr);
}

void int8_block_vnni(const uint8_t* q, int64_t ldq, int rows, const int8_t* panel, int64_t kq, int32_t* acc,
                     const int8_t* next) {
  constexpr int MR = 8;
  for (int r0 = 0; r0 < rows; r0 += MR)
    vnni_tail<MR>(rows - r0 < MR ? rows - r0 : MR, q + r0 * ldq, ldq, panel, kq, acc + r0 * 32,
                  r0 == 0 ? next : nullptr);
}

// Tiles 0-3: C (rows 0-15 / 16-31 x columns 0-15 / 16-31); 4, 5: A (rows 0-15, 16-31); 6, 7: B (columns 0-15,
// 16-31). Every tile 16 rows x 64 bytes.
__attribute__((target("amx-tile"))) void int8_amx_begin() {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  // GCC 12 does not see ldtilecfg read all 64 bytes and drops part of the zeroing above without this barrier.
  __asm__ __volatile__("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

__attribute__((target("amx-tile"))) void int8_amx_end() { _tile_release(); }

__attribute__((target("amx-tile,amx-int8"))) void int8_block_amx(const uint8_t* q, int64_t ldq, int rows,
                                                                 const int8_t* panel, int64_t kq, int32_t* acc,
                                                                 const int8_t* next) {
  const int64_t steps = kq / 16;  // 64 k (16 k-quads: 16 rows of 128 panel bytes) per step
  _tile_zero(0);
  _tile_zero(1);
  if (rows > 16) {
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t s = 0; s < steps; ++s) {
      if (next != nullptr)
        for (int l = 0; l < 32; ++l) prefetch_l2(next + s * 2048 + l * 64);
      _tile_loadd(4, q + s * 64, ldq);
      _tile_loadd(5, q + 16 * ldq + s * 64, ldq);
      _tile_loadd(6, panel + s * 2048, 128);
      _tile_loadd(7, panel + s * 2048 + 64, 128);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(2, acc + 16 * 32, 128);
    _tile_stored(3, acc + 16 * 32 + 16, 128);
  } else {
    for (int64_t s = 0; s < steps; ++s) {
      if (next != nullptr)
        for (int l = 0; l < 32; ++l) prefetch_l2(next + s * 2048 + l * 64);
      _tile_loadd(4, q + s * 64, ldq);
      _tile_loadd(6, panel + s * 2048, 128);
      _tile_loadd(7, panel + s * 2048 + 64, 128);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
    }
  }
  _tile_stored(0, acc, 128);
  _tile_stored(1, acc + 16, 128);
}

}  // namespace fastenc_cpu
