// int8 linear layer on CPU: the run-time choice of instruction set, the weight packing, the per-row activation
// quantization, and the GEMM driver with its dequantizing epilogue (the microkernels are in int8_linear_isa.cpp).
//
// Math: x[i][k] ~ sx[i] (q[i][k] - zx[i]) with u8 codes q; w[j][k] ~ sw[j] w_q[j][k] with s8 w_q. Then
//   y[i][j] = sum_k x w ~ sx[i] sw[j] (sum_k q[i][k] w_q[j][k] - zx[i] colsum[j]),   colsum[j] = sum_k w_q[j][k]
// where the integer sum is exact in int32 (|.| <= 255 * 127 * K < 2^31 for K <= 65536): the only rounding is the
// quantization of x and w, then the fp32 epilogue.
// Driver: the packed panels (32 columns each) are split over the threads in contiguous ranges (or, for a weight of
// few panels and many rows, the 32-row blocks are); each thread takes its rows of q a chunk at a time (a chunk fits
// in L2) and passes every 32-row block of the chunk over each of its panels in turn (a panel stays in L1/L2):
// the microkernel leaves a 32 x 32 int32 tile in a thread-local buffer (in L1), which the epilogue turns into y
// (scales, zero-point correction, bias, residual, GELU) while it is there. The first row block of a chunk requests
// the thread's next panel into L2 as it goes, so at a few rows (where the GEMM streams the weight) the next panel
// is on its way while this one is computed.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cpuid.h>
#include <cstring>
#include <type_traits>

#include <omp.h>

#include "fast_math.h"
#include "int8_linear.h"
#include "parallel.h"

#define FASTENC_INLINE_LAMBDA __attribute__((always_inline))

namespace fastenc_cpu {

namespace {

// Multiply-adds below which the int8 GEMM runs on one thread, per path (a path's rate sets how long a GEMM of that
// size takes: ~100 us of one core on AVX2 and VNNI at 2^22 and 2^23, on AMX at 2^26), unless the weight alone is
// kParallelMinInt8Weight bytes or more (a few-row GEMM then streams it from L3 or memory, ~40 us a 256 KiB on one
// core, and two cores read it faster: MiniLM's 384 x 384 and 384 x 1536 weights at 16 rows; its 1 x 16 forward with
// the caches cleared between calls took 1.52 ms from 128 KiB against 1.72 ms from 256 KiB).
constexpr int64_t kParallelMinInt8Macs[kInt8Isas] = {int64_t(1) << 22, int64_t(1) << 23, int64_t(1) << 26};
constexpr int64_t kParallelMinInt8Weight = int64_t(1) << 17;
// Rows of q (in 32-row blocks) whose panels pass runs before the next rows start: a thread's panels are read once per
// chunk of q, and the chunk (half of a 2 MiB L2, at most) is read from L2 by each panel instead of from L3.
constexpr int64_t kInt8ChunkBytes = int64_t(1) << 19;

bool cpu_has_amx_int8() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 24 & 1) && (d >> 25 & 1);  // AMX-TILE, AMX-INT8
}

bool amx_request() {
  // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): Linux enables the tile data state per process.
  return cpu_has_amx_int8() && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

using BlockFn = void (*)(const uint8_t*, int64_t, int, const int8_t*, int64_t, int32_t*, const int8_t*);

BlockFn block_fn(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::kAmx:
      return int8_block_amx;
    case Int8Isa::kAvx512Vnni:
      return int8_block_vnni;
    default:
      return int8_block_avx2;
  }
}

const int32_t* colsums(const uint8_t* packed, int64_t n, int64_t k) {
  return reinterpret_cast<const int32_t*>(packed + int8_panel_bytes(n, k));
}
const float* wscales(const uint8_t* packed, int64_t n, int64_t k) {
  return reinterpret_cast<const float*>(packed + int8_panel_bytes(n, k) + int8_npad(n) * 4);
}

// Runs `sink(acc, i0, rows, c0, ncols)` on every 32 x 32 tile of q x W^T (acc as the microkernel leaves it).
template <typename Sink>
void drive(const uint8_t* q, int64_t m, int64_t ldq, const uint8_t* packed, int64_t n, int64_t k, Int8Isa isa,
           int num_threads, const Sink& sink) {
  const int64_t kq = int8_kpad(k) / 4, panels = int8_npad(n) / kInt8Panel;
  const int64_t blocks = (m + kInt8RowBlock - 1) / kInt8RowBlock;
  const bool worth = worth_parallel(m * n * k, kParallelMinInt8Macs[static_cast<int>(isa)]) ||
                     n * k >= kParallelMinInt8Weight;
  const int nt = worth && (panels > 1 || blocks > 1) ? (num_threads > 0 ? num_threads : omp_get_max_threads()) : 1;
  const BlockFn block = block_fn(isa);
  const int8_t* wp = reinterpret_cast<const int8_t*>(packed);
  const int64_t panel_len = kq * 4 * kInt8Panel;
  const int64_t chunk = std::max<int64_t>(1, kInt8ChunkBytes / (kInt8RowBlock * ldq));
  auto work = [&](int64_t team, int64_t t) {
    // Few panels a thread and several row blocks each: split the row blocks instead (every thread all panels).
    const bool by_rows = panels < 2 * team && blocks >= team;
    const int64_t p0 = by_rows ? 0 : panels * t / team, p1 = by_rows ? panels : panels * (t + 1) / team;
    const int64_t b0 = by_rows ? blocks * t / team : 0, b1 = by_rows ? blocks * (t + 1) / team : blocks;
    alignas(64) int32_t acc[kInt8RowBlock * kInt8Panel];
    if (isa == Int8Isa::kAmx && p0 < p1 && b0 < b1) int8_amx_begin();
    for (int64_t bc = b0; bc < b1; bc += chunk)  // row blocks of about kInt8ChunkBytes of q at a time
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t c0 = p * kInt8Panel, ncols = std::min<int64_t>(kInt8Panel, n - c0);
        for (int64_t b = bc; b < std::min(b1, bc + chunk); ++b) {
          const int64_t i0 = b * kInt8RowBlock;
          const int rows = static_cast<int>(std::min<int64_t>(kInt8RowBlock, m - i0));
          // the chunk's first row block requests the thread's next panel (module comment)
          const int8_t* next = b == bc && p + 1 < p1 ? wp + (p + 1) * panel_len : nullptr;
          block(q + i0 * ldq, ldq, rows, wp + p * panel_len, kq, acc, next);
          sink(acc, i0, rows, c0, ncols);
        }
      }
    if (isa == Int8Isa::kAmx && p0 < p1 && b0 < b1) int8_amx_end();
  };
  if (nt == 1) return work(1, 0);  // (no OpenMP region: a few-row call costs a few microseconds less)
#pragma omp parallel num_threads(nt)
  work(omp_get_num_threads(), omp_get_thread_num());
}

// a - z * c in 32-bit two's complement: exact whenever the true result fits in int32 (the header's K bound), its
// intermediate products may not (a signed overflow would be undefined behaviour).
FASTENC_INLINE int32_t wrap_sub(int32_t a, int32_t z, int32_t c) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) - static_cast<uint32_t>(z) * static_cast<uint32_t>(c));
}

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float vfn __attribute__((vector_size(kLanes * 4)));

// Zeros standing in for a missing bias (one add per element instead of a branch per row).
alignas(64) const float kNoBias[kInt8Panel] = {};

// One tile's epilogue (the header's formula); zadj: -128 for the AVX2 kernel's sum (q - 128) w, else 0. ACT: 0 none,
// 1 exact GELU, 2 tanh GELU; ACCUM: add the old y. A full tile (32 columns) runs loops of constant length.
template <int ACT, bool ACCUM>
void epilogue(const int32_t* acc, int64_t i0, int rows, int64_t c0, int64_t ncols, const int32_t* colsum,
              const float* wscale, const Int8Epilogue& ep, int32_t zadj) {
  const float* bias = ep.bias != nullptr ? ep.bias + c0 : kNoBias;
  const int32_t* cs = colsum + c0;
  const float* ws = wscale + c0;
  for (int r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    const float s = ep.xscale[i];
    const int32_t z = ep.xzero[i] + zadj;
    const int32_t* ar = acc + r * kInt8Panel;
    float* yr = ep.y + i * ep.ldy + c0;
    auto one = [&](int64_t j) FASTENC_INLINE_LAMBDA {
      float v = static_cast<float>(wrap_sub(ar[j], z, cs[j])) * (s * ws[j]) + bias[j];
      if (ACCUM) v += yr[j];
      if (ACT == 1) v = fm_gelu_erf(v);
      if (ACT == 2) v = fm_gelu_tanh(v);
      yr[j] = v;
    };
    if (ncols == kInt8Panel) {
#pragma omp simd
      for (int64_t j = 0; j < kInt8Panel; ++j) one(j);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < ncols; ++j) one(j);
    }
  }
}

}  // namespace

bool int8_amx_permitted() {
  static const bool ok = amx_request();
  return ok;
}

const char* int8_isa_name(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::kAmx:
      return "amx";
    case Int8Isa::kAvx512Vnni:
      return "avx512_vnni";
    default:
      return "avx2";
  }
}

namespace {

const char* isa_unavailable_now(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::kAmx:
      if (!cpu_has_amx_int8()) return "this CPU has no AMX-INT8 (amx_tile, amx_int8)";
      if (!int8_amx_permitted()) return "the OS refused the AMX tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM)";
      return nullptr;
    case Int8Isa::kAvx512Vnni:
      if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
          !__builtin_cpu_supports("avx512vnni"))
        return "this CPU has no AVX-512 VNNI (avx512f, avx512bw, avx512_vnni)";
      return nullptr;
    default:
      if (!__builtin_cpu_supports("avx2")) return "this CPU has no AVX2";
      return nullptr;
  }
}

}  // namespace

const char* int8_isa_unavailable(Int8Isa isa) {
  // Asked once per path and process: CPUID exits to the hypervisor in a VM (microseconds a call).
  static const char* const why[kInt8Isas] = {isa_unavailable_now(Int8Isa::kAvx2),
                                             isa_unavailable_now(Int8Isa::kAvx512Vnni),
                                             isa_unavailable_now(Int8Isa::kAmx)};
  return why[static_cast<int>(isa)];
}

Int8Isa int8_isa_best() {
  static const Int8Isa best = [] {
    for (Int8Isa isa : {Int8Isa::kAmx, Int8Isa::kAvx512Vnni})
      if (int8_isa_unavailable(isa) == nullptr) return isa;
    return Int8Isa::kAvx2;
  }();
  return best;
}

void int8_pack(const int8_t* w, const float* wscale, int64_t n, int64_t k, uint8_t* out) {
  const int64_t kp = int8_kpad(k), np = int8_npad(n), panels = np / kInt8Panel;
  int8_t* o = reinterpret_cast<int8_t*>(out);
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t t = 0; t < kp / 4; ++t)
      for (int64_t j = 0; j < kInt8Panel; ++j)
        for (int64_t b = 0; b < 4; ++b) {
          const int64_t row = p * kInt8Panel + j, col = 4 * t + b;
          o[((p * (kp / 4) + t) * kInt8Panel + j) * 4 + b] = row < n && col < k ? w[row * k + col] : 0;
        }
  int32_t* cs = reinterpret_cast<int32_t*>(out + int8_panel_bytes(n, k));
  float* sc = reinterpret_cast<float*>(out + int8_panel_bytes(n, k) + np * 4);
  for (int64_t j = 0; j < np; ++j) {
    int32_t s = 0;
    if (j < n)
      for (int64_t c = 0; c < k; ++c) s += w[j * k + c];
    cs[j] = s;
    sc[j] = j < n ? wscale[j] : 0.f;
  }
}

namespace {

// One row of int8_quantize_rows: xr (k,) -> qr (kpad,), *scale, *zero.
void quantize_row(const float* xr, int64_t k, int64_t kp, bool asym, uint8_t* qr, float* scale, int32_t* zero) {
  // min(x, 0), max(x, 0) and bad (NaN when the row holds a NaN or an infinity: x * 0) in GCC vectors of the
  // machine's width, two of each (an `omp simd` reduction of the three ran scalar).
  vfn mn0 = {}, mn1 = {}, mx0 = {}, mx1 = {}, bad0 = {}, bad1 = {};
  int64_t j0 = 0;
  for (; j0 + 2 * kLanes <= k; j0 += 2 * kLanes) {
    vfn a, b;
    std::memcpy(&a, xr + j0, sizeof a);
    std::memcpy(&b, xr + j0 + kLanes, sizeof b);
    mn0 = a < mn0 ? a : mn0;
    mn1 = b < mn1 ? b : mn1;
    mx0 = a > mx0 ? a : mx0;
    mx1 = b > mx1 ? b : mx1;
    bad0 += a * 0.f;
    bad1 += b * 0.f;
  }
  float mn = 0.f, mx = 0.f, bad = 0.f;
  for (int l = 0; l < kLanes; ++l) {
    mn = std::min(mn, std::min(mn0[l], mn1[l]));
    mx = std::max(mx, std::max(mx0[l], mx1[l]));
    bad += bad0[l] + bad1[l];
  }
  for (; j0 < k; ++j0) {
    mn = std::min(mn, xr[j0]);
    mx = std::max(mx, xr[j0]);
    bad += xr[j0] * 0.f;
  }
  float s = asym ? (mx - mn) / 254.f : std::max(mx, -mn) / 127.f;
  if (!(s > 0.f)) s = 1.f;  // a row of zeros
  const float inv = 1.f / s;
  const int32_t z = asym ? -127 - static_cast<int32_t>(std::nearbyint(mn * inv)) : 0;  // code of 0, minus 128
#pragma omp simd
  for (int64_t j = 0; j < k; ++j) {
    int32_t c = static_cast<int32_t>(std::nearbyint(xr[j] * inv)) + z;
    c = c < -127 ? -127 : (c > 127 ? 127 : c);
    qr[j] = static_cast<uint8_t>(c + 128);
  }
  for (int64_t j = k; j < kp; ++j) qr[j] = 128;
  *scale = bad == 0.f ? s : std::nanf("");  // a non-finite input makes its row's outputs NaN
  *zero = z + 128;
}

}  // namespace

void int8_quantize_rows(const float* x, int64_t m, int64_t k, int64_t ldx, bool asym, uint8_t* q, int64_t ldq,
                        float* scale, int32_t* zero, int num_threads) {
  const int64_t kp = int8_kpad(k);
  const int nt = worth_parallel(m * k, kParallelMinElems) ? (num_threads > 0 ? num_threads : omp_get_max_threads()) : 1;
  if (nt == 1) {  // (no OpenMP region at all: a few-row call costs a few microseconds less)
    for (int64_t i = 0; i < m; ++i) quantize_row(x + i * ldx, k, kp, asym, q + i * ldq, scale + i, zero + i);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < m; ++i) quantize_row(x + i * ldx, k, kp, asym, q + i * ldq, scale + i, zero + i);
}

void int8_gemm_raw(const uint8_t* q, int64_t m, int64_t ldq, const uint8_t* packed, int64_t n, int64_t k,
                   int32_t* out, int64_t ldacc, Int8Isa isa, int num_threads) {
  const int32_t* colsum = colsums(packed, n, k);
  const int32_t add = isa == Int8Isa::kAvx2 ? 128 : 0;  // AVX2's sum (q - 128) w + 128 colsum
  drive(q, m, ldq, packed, n, k, isa, num_threads,
        [&](const int32_t* acc, int64_t i0, int rows, int64_t c0, int64_t ncols) {
          for (int r = 0; r < rows; ++r)
            for (int64_t j = 0; j < ncols; ++j)
              out[(i0 + r) * ldacc + c0 + j] = wrap_sub(acc[r * kInt8Panel + j], -add, colsum[c0 + j]);
        });
}

void int8_gemm(const uint8_t* q, int64_t m, int64_t ldq, const uint8_t* packed, int64_t n, int64_t k,
               const Int8Epilogue& ep, Int8Isa isa, int num_threads) {
  const int32_t* colsum = colsums(packed, n, k);
  const float* wscale = wscales(packed, n, k);
  const int32_t zadj = isa == Int8Isa::kAvx2 ? -128 : 0;
  auto run = [&](auto act, auto accum) {
    drive(q, m, ldq, packed, n, k, isa, num_threads,
          [&](const int32_t* acc, int64_t i0, int rows, int64_t c0, int64_t ncols) {
            epilogue<decltype(act)::value, decltype(accum)::value>(acc, i0, rows, c0, ncols, colsum, wscale, ep, zadj);
          });
  };
  auto with_act = [&](auto accum) {
    switch (ep.act) {
      case GemmActivation::kGelu:
        return run(std::integral_constant<int, 1>{}, accum);
      case GemmActivation::kGeluTanh:
        return run(std::integral_constant<int, 2>{}, accum);
      default:
        return run(std::integral_constant<int, 0>{}, accum);
    }
  };
  if (ep.accumulate)
    with_act(std::true_type{});
  else
    with_act(std::false_type{});
}

}  // namespace fastenc_cpu
