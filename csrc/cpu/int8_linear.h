// int8 linear layer on CPU (csrc/cpu/int8_linear.cpp, int8_linear_isa.cpp): activations quantized per row at run
// time (u8 codes with a per-row scale and zero point), weights per output channel (s8 in [-127, 127], fp32 scales)
// packed once; u8 x s8 -> int32 products on AVX2, AVX-512 VNNI or AMX, chosen at run time; dequantization, bias,
// residual add and GELU in the epilogue. fastenc.ops.int8_linear and fastenc.quant call it.
#pragma once
#include <cstdint>

#include "gemm.h"  // GemmActivation

namespace fastenc_cpu {

// The u8 x s8 dot-product paths, slowest first.
enum class Int8Isa : int { kAvx2 = 0, kAvx512Vnni = 1, kAmx = 2 };
constexpr int kInt8Isas = 3;

constexpr int64_t kInt8Panel = 32;     // weight columns per packed panel
constexpr int64_t kInt8KBlock = 64;    // K is padded to a multiple of this (AMX's tile depth), with zero weights
constexpr int64_t kInt8RowBlock = 32;  // quantized rows are allocated in multiples of this (two AMX tiles)
// Largest K: |sum_k (q - zq) w| <= 255 * 127 * K must stay below 2^31.
constexpr int64_t kInt8MaxK = 65536;

inline int64_t int8_kpad(int64_t k) { return (k + kInt8KBlock - 1) / kInt8KBlock * kInt8KBlock; }
inline int64_t int8_mpad(int64_t m) { return (m + kInt8RowBlock - 1) / kInt8RowBlock * kInt8RowBlock; }
inline int64_t int8_npad(int64_t n) { return (n + kInt8Panel - 1) / kInt8Panel * kInt8Panel; }

// The packed weight, one byte buffer of int8_packed_bytes(n, k):
//   panels  (npad / 32, kpad / 4, 32, 4) int8: panel p, k-quad t, column j, byte b holds w[p*32 + j][4t + b]
//           (0 past n and past k): a 64-byte row of 16 columns x 4 k is one AMX B-tile row and one VNNI vector;
//   colsum  (npad,) int32: sum_k w[j][k] (the zero-point correction);
//   wscale  (npad,) fp32: the column's scale (w ~ wscale[j] * w_q[j][k]).
inline int64_t int8_panel_bytes(int64_t n, int64_t k) { return int8_npad(n) * int8_kpad(k); }
inline int64_t int8_packed_bytes(int64_t n, int64_t k) { return int8_panel_bytes(n, k) + int8_npad(n) * 8; }

// Why `isa` cannot run on this CPU / OS (nullptr: it can). Asking for AMX requests the tile-data permission from the
// kernel once per process.
const char* int8_isa_unavailable(Int8Isa isa);
const char* int8_isa_name(Int8Isa isa);
// The fastest path this machine runs (AMX, else AVX-512 VNNI, else AVX2); kAvx2 is returned even where AVX2 itself is
// missing: callers check int8_isa_unavailable.
Int8Isa int8_isa_best();

// w (n, k) int8 in [-127, 127] row-major, wscale (n,) -> out (int8_packed_bytes(n, k) bytes, layout above).
void int8_pack(const int8_t* w, const float* wscale, int64_t n, int64_t k, uint8_t* out);

// x (m, k) fp32 (row stride ldx) -> q (m, kpad) u8 codes (row stride ldq >= kpad), scale (m,), zero (m,) with
// x[i][k] ~ scale[i] * (q[i][k] - zero[i]). Symmetric: scale = max|x| / 127, zero = 128, codes in [1, 255].
// Asymmetric: the row's range [min(x, 0), max(x, 0)] onto codes [1, 255], zero in [1, 255]. Codes k..kpad are the
// zero point's code... of a zero weight: 128. A row of zeros gets scale 1. Codes: c = rint(x * (1 / scale)) (ties to
// even) + zero - 128 clamped to [-127, 127], stored + 128. Non-finite x is the caller's to refuse.
void int8_quantize_rows(const float* x, int64_t m, int64_t k, int64_t ldx, bool asym, uint8_t* q, int64_t ldq,
                        float* scale, int32_t* zero, int num_threads);

// acc (m, n) int32 (row stride ldacc) = sum_k q[i][k] * w[j][k] (u8 x s8, exact) over the packed weight.
// q: (int8_mpad(m), >= kpad) u8, row stride ldq (rows past m are read by AMX, never used).
void int8_gemm_raw(const uint8_t* q, int64_t m, int64_t ldq, const uint8_t* packed, int64_t n, int64_t k,
                   int32_t* acc, int64_t ldacc, Int8Isa isa, int num_threads);

// y (m, n) fp32 (row stride ldy) = act(xscale[i] * wscale[j] * (acc[i][j] - xzero[i] * colsum[j]) + bias[j]
// (+ y[i][j] when accumulate)), acc as int8_gemm_raw's. The product of the two scales is rounded once, then the
// integer sum's float times it, then the bias, then the old y.
struct Int8Epilogue {
  const float* xscale;
  const int32_t* xzero;
  const float* bias;  // nullptr: none
  float* y;
  int64_t ldy;
  bool accumulate;
  GemmActivation act;
};
void int8_gemm(const uint8_t* q, int64_t m, int64_t ldq, const uint8_t* packed, int64_t n, int64_t k,
               const Int8Epilogue& ep, Int8Isa isa, int num_threads);

// The microkernels (int8_linear_isa.cpp): acc (rows x 32, row stride 32) = sum over kpad of q rows x one panel
// (kq = kpad / 4 k-quads). rows <= kInt8RowBlock. AVX2 returns sum (q - 128) w (its sign trick works on signed
// codes: the caller adds 128 * colsum); the others sum q w.
// next: the panel to request into L2 meanwhile (nullptr: none).
void int8_block_avx2(const uint8_t* q, int64_t ldq, int rows, const int8_t* panel, int64_t kq, int32_t* acc,
                     const int8_t* next);
void int8_block_vnni(const uint8_t* q, int64_t ldq, int rows, const int8_t* panel, int64_t kq, int32_t* acc,
                     const int8_t* next);
void int8_block_amx(const uint8_t* q, int64_t ldq, int rows, const int8_t* panel, int64_t kq, int32_t* acc,
                    const int8_t* next);
// AMX tile state of the calling thread: configured before int8_block_amx, released after the last one.
void int8_amx_begin();
void int8_amx_end();
// Whether the AMX permission request succeeded (made once per process).
bool int8_amx_permitted();

}  // namespace fastenc_cpu
