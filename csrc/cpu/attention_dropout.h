// Attention-probability dropout of the CPU attention kernels: the counter-based keep-mask of
// fastenc/reference/attention_dropout.py (the reference's docstring has the counter layout), bit for bit:
//   mix(x) = x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16     (uint32)
//   c = mix(s0 ^ mix(s1 ^ mix(o0 ^ mix(o1))))        call key from seed (s1:s0) and offset (o1:o0)
//   r = mix(c ^ mix(t ^ mix(h ^ G)))                 row key of head h, packed query token t; G = 0x9E3779B9
//   u = mix(r + j * G)                               key column j of the sequence
//   keep = (u >> 1) >= floor(p * 2^31);  kept probabilities are scaled by 1 / (1 - p).
// Vectorized along query rows (one register lane per query, as the kernels' S^T tiles): one hash per element.
#pragma once
#include <cstdint>

#include "attention_simd.h"

namespace fastenc_cpu {
namespace attn {

constexpr uint32_t kGolden = 0x9E3779B9u;

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

typedef uint32_t vu __attribute__((vector_size(FASTENC_VW * 4)));

inline vu vmix32(vu x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

struct Dropout {
  bool on = false;
  uint32_t key = 0;     // c
  int32_t thr = 0;      // floor(p * 2^31)
  float keep_scale = 1.f;  // 1 / (1 - p)

  Dropout() = default;
  Dropout(double p, int64_t seed, int64_t offset) {
    if (!(p > 0.0)) return;
    on = true;
    const uint64_t s = (uint64_t)seed, o = (uint64_t)offset;
    uint32_t x = mix32((uint32_t)(o >> 32));
    x = mix32((uint32_t)o ^ x);
    x = mix32((uint32_t)(s >> 32) ^ x);
    key = mix32((uint32_t)s ^ x);
    thr = (int32_t)(p * 2147483648.0);
    keep_scale = (float)(1.0 / (1.0 - p));
  }

  // Row keys of `n` consecutive tokens from t0 into dst[0:n] (lanes after n: anything).
  void rows(int64_t h, int64_t t0, int64_t n, uint32_t* dst) const {
    const uint32_t hk = mix32((uint32_t)h ^ kGolden);
    for (int64_t i = 0; i < n; ++i) dst[i] = mix32(key ^ mix32((uint32_t)(t0 + i) ^ hk));
  }

  // x where the elements (rows r, key column j) are kept, else 0 (no scaling).
  vf apply(vf x, vu r, int64_t j) const {
    const vu u = vmix32(r + (uint32_t)j * kGolden);
    const vi keep = (vi)(u >> 1) >= (vi{} + thr);
    return keep ? x : vf{};
  }
};

}  // namespace attn
}  // namespace fastenc_cpu
