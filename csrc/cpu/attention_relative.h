// The relative-position terms on the CPU attention kernels' S^T tiles (keys x queries): the distance bias read at
// pos_i - pos_j, DeBERTa's c2p / p2c read through the per-distance slot lookup (fastenc/reference/
// attention_relative.py), and their gradients. Only the gathered forms live here; the distance bias without
// positions keeps the kernels' contiguous add_row path.
//   S^T_ji += (bias[h, pos_i - pos_j + L - 1] + c2p[i, h, s] + p2c[j, h, s]) * log2 e,  s = slot[pos_i - pos_j + L - 1]
//   dbias[pos_i - pos_j] += dS_ij;  dc2p[i, h, s] += dS_ij;  dp2c[j, h, s] += dS_ij
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention.h"

namespace fastenc_cpu {
namespace attn {

// One call's relative terms, checked: private copies of positions and the slot lookup (every value checked before
// any row is touched), the bias lookup pre-multiplied by `unit` (log2 e: the kernels' base-2 scores).
struct RelTerms {
  int64_t reach = 0, lut_len = 0, H = 0, S = 0;
  std::vector<float> bias2;     // (H, lut_len) * unit; empty: no bias
  std::vector<int32_t> pos;     // (total,); empty: the index within the sequence
  std::vector<int32_t> slot;    // (lut_len,); empty: no c2p / p2c
  std::vector<int32_t> run;     // (lut_len,): run[e] = the k >= 1 with slot[e + t] = slot[e] + t for every t < k
  const float* c2p = nullptr;   // (total, H, S)
  const float* p2c = nullptr;
  float unit = 1.f;

  bool any() const { return lut_len > 0; }
  bool has_bias() const { return !bias2.empty(); }
  bool has_dis() const { return !slot.empty(); }
  // The gathered path: positions or c2p / p2c (the distance bias alone is added contiguously).
  bool gathered() const { return !pos.empty() || has_dis(); }
  int32_t position(int64_t start, int64_t local) const { return pos.empty() ? (int32_t)local : pos[start + local]; }
};

// rel -> RelTerms for `total` tokens and H heads whose longest sequence is `longest`; throws std::invalid_argument
// (prefixed with op) on a lookup of even length, bias and slot of different lengths, a sequence longer than L
// without positions, a position outside [0, L), a slot outside [0, slots), or c2p / p2c without slot.
inline RelTerms prepare_relative(const Relative* rel, int64_t H, int64_t total, int64_t longest, float unit,
                                 const char* op) {
  RelTerms t;
  if (rel == nullptr) return t;
  auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(op) + ": " + what); };
  const bool dis = rel->c2p != nullptr || rel->p2c != nullptr;
  if (dis != (rel->slot != nullptr)) fail("the slot lookup must be given exactly when c2p or p2c is");
  if (rel->bias == nullptr && !dis) {
    if (rel->positions != nullptr) fail("positions need a relative term (a bias, c2p or p2c)");
    return t;
  }
  const int64_t len = rel->bias != nullptr ? rel->bias_len : rel->slot_len;
  if (rel->bias != nullptr && dis && rel->slot_len != rel->bias_len)
    fail("the bias and slot lookups must cover one L, got " + std::to_string(rel->bias_len) + " and " +
         std::to_string(rel->slot_len) + " entries");
  t.reach = bias_reach(len, rel->positions != nullptr ? 0 : longest, op);
  t.lut_len = len;
  t.H = H;
  t.unit = unit;
  if (rel->bias != nullptr) {
    t.bias2.resize(H * len);
    for (int64_t e = 0; e < H * len; ++e) t.bias2[e] = rel->bias[e] * unit;
  }
  if (rel->positions != nullptr) {
    t.pos.assign(rel->positions, rel->positions + total);
    for (int64_t i = 0; i < total; ++i)
      if (t.pos[i] < 0 || t.pos[i] >= t.reach)
        fail("positions must lie in [0, " + std::to_string(t.reach) + ") (the lookups' L), got positions[" +
             std::to_string(i) + "] = " + std::to_string(t.pos[i]));
  }
  if (dis) {
    if (rel->slots <= 0) fail("c2p / p2c must have at least one slot");
    t.S = rel->slots;
    t.slot.assign(rel->slot, rel->slot + len);
    for (int64_t e = 0; e < len; ++e)
      if (t.slot[e] < 0 || t.slot[e] >= t.S)
        fail("the slot lookup must lie in [0, slots=" + std::to_string(t.S) + "), got slot[" + std::to_string(e) +
             "] = " + std::to_string(t.slot[e]));
    t.c2p = rel->c2p;
    t.p2c = rel->p2c;
    t.run.assign(len, 1);
    for (int64_t e = len - 2; e >= 0; --e)
      if (t.slot[e + 1] == t.slot[e] + 1) t.run[e] = t.run[e + 1] + 1;
  }
  return t;
}

// True when qpos[r] = qpos[0] + r for every r < rows (a block of queries at consecutive positions).
inline bool consecutive(const int32_t* qpos, int64_t rows) {
  for (int64_t r = 1; r < rows; ++r)
    if (qpos[r] != qpos[0] + r) return false;
  return true;
}

// Row j of an S^T tile (key at position kpos, token row jtok), lanes r < rows (queries at positions qpos[r], token
// rows itok0 + r), head h: st[r] += the relative terms, in the kernels' units (every index is in range: positions
// lie in [0, L), so pos_i - pos_j + L - 1 in [0, 2 L - 1), and slots were checked). qrun: consecutive(qpos, rows).
// Where the rows' queries are consecutive and so are their slots (every pair of a block within DeBERTa's linear
// buckets), the lookups and p2c are read as contiguous runs and c2p at a stride of H * S + 1 (a diagonal), instead
// of three gathers per lane; the sums are the same, in the same order.
inline void add_relative_row(float* __restrict st, int64_t rows, const int32_t* qpos, bool qrun, int32_t kpos,
                             int64_t h, int64_t itok0, int64_t jtok, const RelTerms& t) {
  const int64_t base = t.reach - 1 - kpos;  // + qpos[r]: the lookups' index
  const float* b2 = t.has_bias() ? t.bias2.data() + h * t.lut_len + base : nullptr;
  if (!t.has_dis()) {
    if (qrun) {
      const float* bq = b2 + qpos[0];
      for (int64_t r = 0; r < rows; ++r) st[r] += bq[r];
    } else {
      for (int64_t r = 0; r < rows; ++r) st[r] += b2[qpos[r]];
    }
    return;
  }
  const int32_t* sl = t.slot.data() + base;
  const int64_t hs = t.H * t.S;
  const float* c = t.c2p != nullptr ? t.c2p + itok0 * hs + h * t.S : nullptr;  // row r: c + r * hs
  const float* p = t.p2c != nullptr ? t.p2c + jtok * hs + h * t.S : nullptr;
  const float u = t.unit;
  if (qrun && t.run[base + qpos[0]] >= rows) {  // lane r: slot sl[qpos[0]] + r
    const int32_t s0 = sl[qpos[0]];
    const float* bq = b2 != nullptr ? b2 + qpos[0] : nullptr;
    if (c != nullptr && p != nullptr && bq == nullptr) {
      const float* cd = c + s0;
      const float* pq = p + s0;
      for (int64_t r = 0; r < rows; ++r) {
        float a = 0.f;
        a += cd[r * (hs + 1)] * u;
        a += pq[r] * u;
        st[r] += a;
      }
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      float a = bq != nullptr ? bq[r] : 0.f;
      if (c != nullptr) a += c[r * (hs + 1) + s0] * u;
      if (p != nullptr) a += p[s0 + r] * u;
      st[r] += a;
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t qp = qpos[r];
    const int32_t s = sl[qp];
    float a = b2 != nullptr ? b2[qp] : 0.f;
    if (c != nullptr) a += c[r * hs + s] * u;
    if (p != nullptr) a += p[s] * u;
    st[r] += a;
  }
}

// The gradients of row j of a dS^T tile (natural units), lanes r < rows, as add_relative_row reads them: db (may be
// null) gets ds at index pos_i - pos_j + db_off; dc2p / dp2c (may be null; (total, H, S)) at the slot.
// qrun: consecutive(qpos, rows) (contiguous and diagonal runs as in add_relative_row; each entry gets one add).
inline void relative_grad_row(const float* __restrict ds, int64_t rows, const int32_t* qpos, bool qrun, int32_t kpos,
                              int64_t h, int64_t itok0, int64_t jtok, const RelTerms& t, float* db, int64_t db_off,
                              float* dc2p, float* dp2c) {
  // (dc2p: the caller passes nullptr where c2p_grad_tile takes it by query instead)
  if (db != nullptr) {
    if (qrun) {
      float* dq = db + qpos[0] - kpos + db_off;
      for (int64_t r = 0; r < rows; ++r) dq[r] += ds[r];
    } else {
      for (int64_t r = 0; r < rows; ++r) db[qpos[r] - kpos + db_off] += ds[r];
    }
  }
  if (dc2p == nullptr && dp2c == nullptr) return;
  const int64_t base = t.reach - 1 - kpos;
  const int32_t* sl = t.slot.data() + base;
  const int64_t hs = t.H * t.S;
  if (qrun && t.run[base + qpos[0]] >= rows) {
    const int32_t s0 = sl[qpos[0]];
    if (dc2p != nullptr) {
      float* cd = dc2p + itok0 * hs + h * t.S + s0;
      for (int64_t r = 0; r < rows; ++r) cd[r * (hs + 1)] += ds[r];
    }
    if (dp2c != nullptr) {
      float* pq = dp2c + jtok * hs + h * t.S + s0;
      for (int64_t r = 0; r < rows; ++r) pq[r] += ds[r];
    }
    return;
  }
  if (dc2p != nullptr) {
    float* c = dc2p + itok0 * hs + h * t.S;
    for (int64_t r = 0; r < rows; ++r) c[r * hs + sl[qpos[r]]] += ds[r];
  }
  if (dp2c != nullptr) {
    float* p = dp2c + jtok * hs + h * t.S;
    for (int64_t r = 0; r < rows; ++r) p[sl[qpos[r]]] += ds[r];
  }
}

// The most keys one tile holds (the kernels' BN).
constexpr int64_t kMaxTileKeys = 64;

// Visits c2p's entries of a tile by query: f(r, j, s) for lanes r < rows and key rows j < nk (query row
// itok0 + r at position qpos[r], key j0 + j of the sequence starting at `start`), s the pair's slot in query r's
// c2p row (itok0 + r, h). For one query the keys' slots run consecutively (decreasing with j) wherever the pairs
// sit in DeBERTa's linear buckets, so a row is written as one contiguous run, where per key row (as
// relative_grad_row goes) each entry is on a cache line of its own (a diagonal). The backward's dc2p (a
// read-modify-write per entry) goes this way; the reads of c2p stay per key row (add_relative_row), whose lanes
// vectorize (reading by query, with the tile's strided stores, was the slower of the two there).
template <typename F>
inline void for_c2p_tile(int64_t rows, int64_t nk, const int32_t* qpos, int64_t start, int64_t j0,
                         const RelTerms& t, F&& f) {
  int32_t kpos[kMaxTileKeys];
  bool krun = true;
  for (int64_t j = 0; j < nk; ++j) {
    kpos[j] = t.position(start, j0 + j);
    krun = krun && kpos[j] == kpos[0] + j;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t e0 = t.reach - 1 + qpos[r];  // - kpos[j]: the lookup index of key j
    const int64_t last = e0 - kpos[nk - 1];     // key nk - 1's (with krun the smallest of the tile)
    if (krun && t.run[last] >= nk) {
      const int64_t s_hi = t.slot[last] + nk - 1;  // key j: slot s_hi - j
      for (int64_t j = 0; j < nk; ++j) f(r, j, s_hi - j);
    } else {
      for (int64_t j = 0; j < nk; ++j) f(r, j, t.slot[e0 - kpos[j]]);
    }
  }
}

// dc2p[itok0 + r, h, slot(r, j)] += ds[j * ld + r] over a tile (relative_grad_row then gets dc2p = nullptr); the
// keys of each query in ascending order, as relative_grad_row's rows would add them.
inline void c2p_grad_tile(const float* __restrict ds, int64_t ld, int64_t rows, int64_t nk, const int32_t* qpos,
                          int64_t h, int64_t itok0, int64_t start, int64_t j0, const RelTerms& t, float* dc2p) {
  const int64_t hs = t.H * t.S;
  float* c = dc2p + itok0 * hs + h * t.S;
  for_c2p_tile(rows, nk, qpos, start, j0, t,
               [&](int64_t r, int64_t j, int64_t s) { c[r * hs + s] += ds[j * ld + r]; });
}

}  // namespace attn
}  // namespace fastenc_cpu
