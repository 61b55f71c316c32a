// torch-facing wrappers of the int8 linear layer (int8_linear.cpp) and their registration: int8_pack,
// int8_quantize_rows, int8_gemm_raw, int8_gemm, int8_linear (quantize + GEMM in one call), int8_isas, int8_isa_best.
#include <ATen/Parallel.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "int8_linear.h"
#include "tensor_utils.h"

namespace {

using namespace fastenc_torch;
using fastenc_cpu::Int8Isa;

constexpr Int8Isa kIsas[] = {Int8Isa::kAvx2, Int8Isa::kAvx512Vnni, Int8Isa::kAmx};

// "" -> the best path of this machine; a name -> that path, refused with the reason when this machine lacks it.
Int8Isa isa_of(const std::string& name) {
  if (name.empty()) return fastenc_cpu::int8_isa_best();
  for (Int8Isa isa : kIsas)
    if (name == fastenc_cpu::int8_isa_name(isa)) {
      const char* why = fastenc_cpu::int8_isa_unavailable(isa);
      TORCH_CHECK(why == nullptr, "int8: isa '", name, "' cannot run here: ", why);
      return isa;
    }
  TORCH_CHECK(false, "int8: isa must be one of 'avx2', 'avx512_vnni', 'amx' (or '' for the best), got '", name, "'");
}

fastenc_cpu::GemmActivation act_of(const std::optional<std::string>& gelu) {
  TORCH_CHECK(!gelu || *gelu == "none" || *gelu == "tanh", "int8: gelu must be None, 'none' or 'tanh', got '",
              gelu ? *gelu : "", "'");
  if (!gelu) return fastenc_cpu::GemmActivation::kNone;
  return *gelu == "tanh" ? fastenc_cpu::GemmActivation::kGeluTanh : fastenc_cpu::GemmActivation::kGelu;
}

void check_packed(const Tensor& packed, int64_t n, int64_t k) {
  check_cpu(packed, "packed");
  TORCH_CHECK(n >= 1 && k >= 1 && k <= fastenc_cpu::kInt8MaxK, "int8: need n >= 1 and 1 <= k <= ",
              fastenc_cpu::kInt8MaxK, ", got n = ", n, ", k = ", k);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 1 && packed.is_contiguous() &&
                  packed.numel() == fastenc_cpu::int8_packed_bytes(n, k),
              "int8: packed must be int8_pack's contiguous uint8 (", fastenc_cpu::int8_packed_bytes(n, k),
              ",) for n = ", n, ", k = ", k, ", got ", packed.scalar_type(), " ", packed.sizes());
}

// q (rows >= int8_mpad(m), cols >= kpad) uint8 with unit column stride.
void check_q(const Tensor& q, int64_t m, int64_t k) {
  check_cpu(q, "q");
  TORCH_CHECK(q.scalar_type() == at::kByte && q.dim() == 2 && q.stride(1) == 1 &&
                  q.size(0) >= fastenc_cpu::int8_mpad(m) && q.size(1) >= fastenc_cpu::int8_kpad(k) &&
                  q.stride(0) >= q.size(1),
              "int8: q must be uint8 (>= ", fastenc_cpu::int8_mpad(m), ", >= ", fastenc_cpu::int8_kpad(k),
              ") with unit column stride (int8_quantize_rows' codes), got ", q.scalar_type(), " ", q.sizes());
}

Tensor int8_pack(const Tensor& wq, const Tensor& wscale) {
  check_cpu(wq, "weight");
  check_cpu(wscale, "scale");
  TORCH_CHECK(wq.dim() == 2 && wq.scalar_type() == at::kChar, "int8_pack: weight must be 2-D int8, got ",
              wq.scalar_type(), " ", wq.sizes());
  const int64_t n = wq.size(0), k = wq.size(1);
  TORCH_CHECK(n >= 1 && k >= 1 && k <= fastenc_cpu::kInt8MaxK, "int8_pack: weight must be (n >= 1, 1 <= k <= ",
              fastenc_cpu::kInt8MaxK, "), got ", wq.sizes());
  TORCH_CHECK(wscale.scalar_type() == at::kFloat && wscale.dim() == 1 && wscale.size(0) == n,
              "int8_pack: scale must be (", n, ",) float32, got ", wscale.scalar_type(), " ", wscale.sizes());
  const Tensor wc = wq.contiguous(), sc = wscale.contiguous();
  const int8_t* w = wc.data_ptr<int8_t>();
  for (int64_t i = 0; i < n * k; ++i)
    TORCH_CHECK(w[i] >= -127, "int8_pack: weight values must be in [-127, 127], got -128");
  Tensor out = at::empty({fastenc_cpu::int8_packed_bytes(n, k)}, wq.options().dtype(at::kByte));
  fastenc_cpu::int8_pack(w, sc.data_ptr<float>(), n, k, out.data_ptr<uint8_t>());
  return out;
}

std::tuple<Tensor, Tensor, Tensor> int8_quantize_rows(const Tensor& x, bool asym) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && (x.stride(1) == 1 || x.size(1) <= 1),
              "int8_quantize_rows: x must be 2-D float32 with unit column stride, got ", x.scalar_type(), " ",
              x.sizes());
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k >= 1 && k <= fastenc_cpu::kInt8MaxK, "int8_quantize_rows: x must have 1 to ",
              fastenc_cpu::kInt8MaxK, " columns, got ", k);
  const int64_t kp = fastenc_cpu::int8_kpad(k);
  Tensor q = cpu_empty({fastenc_cpu::int8_mpad(m), kp}, x.options().dtype(at::kByte));
  Tensor scale = at::empty({m}, x.options());
  Tensor zero = at::empty({m}, x.options().dtype(at::kInt));
  if (m > 0)
    fastenc_cpu::int8_quantize_rows(x.data_ptr<float>(), m, k, std::max<int64_t>(x.stride(0), 1), asym,
                                    q.data_ptr<uint8_t>(), kp, scale.data_ptr<float>(), zero.data_ptr<int32_t>(),
                                    at::get_num_threads());
  return {q, scale, zero};
}

Tensor int8_gemm_raw(const Tensor& q, int64_t m, const Tensor& packed, int64_t n, int64_t k, const std::string& isa) {
  check_packed(packed, n, k);
  TORCH_CHECK(m >= 0, "int8_gemm_raw: m must be >= 0, got ", m);
  check_q(q, m, k);
  const Int8Isa path = isa_of(isa);
  Tensor acc = at::empty({m, n}, q.options().dtype(at::kInt));
  if (m > 0)
    fastenc_cpu::int8_gemm_raw(q.data_ptr<uint8_t>(), m, q.stride(0), packed.data_ptr<uint8_t>(), n, k,
                               acc.data_ptr<int32_t>(), n, path, at::get_num_threads());
  return acc;
}

// y = the dequantized product (+ bias) (+ out when accumulate), then gelu: into out when given. q, xscale, xzero:
// raw (checked by the caller), m rows.
Tensor gemm_into(const uint8_t* q, int64_t ldq, const float* xscale, const int32_t* xzero, int64_t m,
                 const Tensor& packed, int64_t n, int64_t k, const OptTensor& bias, const OptTensor& out,
                 bool accumulate, const std::optional<std::string>& gelu, const std::string& isa) {
  TORCH_CHECK(!bias || (bias->device().is_cpu() && bias->scalar_type() == at::kFloat && bias->dim() == 1 &&
                        bias->size(0) == n),
              "int8: bias must be (", n, ",) float32 on the CPU");
  TORCH_CHECK(!accumulate || out, "int8: accumulate needs out");
  if (out) {
    check_cpu(*out, "out");
    TORCH_CHECK(out->scalar_type() == at::kFloat && out->dim() == 2 && out->size(0) == m && out->size(1) == n &&
                    (out->stride(1) == 1 || n <= 1) && (out->stride(0) >= n || m <= 1),
                "int8: out must be (", m, ", ", n, ") float32 with unit column stride, got ", out->sizes());
  }
  const Int8Isa path = isa_of(isa);
  const auto act = act_of(gelu);
  Tensor y = out ? *out : cpu_empty({m, n}, packed.options().dtype(at::kFloat));
  const Tensor bc = bias ? bias->contiguous() : Tensor();
  if (m > 0) {
    const fastenc_cpu::Int8Epilogue ep{xscale, xzero, bias ? bc.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                                       std::max<int64_t>(y.stride(0), 1), accumulate, act};
    fastenc_cpu::int8_gemm(q, m, ldq, packed.data_ptr<uint8_t>(), n, k, ep, path, at::get_num_threads());
  }
  return y;
}

Tensor int8_gemm(const Tensor& q, const Tensor& xscale, const Tensor& xzero, const Tensor& packed, int64_t n,
                 int64_t k, const OptTensor& bias, const OptTensor& out, bool accumulate,
                 const std::optional<std::string>& gelu, const std::string& isa) {
  check_packed(packed, n, k);
  check_cpu(xscale, "scale");
  check_cpu(xzero, "zero");
  TORCH_CHECK(xscale.scalar_type() == at::kFloat && xscale.dim() == 1 && xscale.is_contiguous(),
              "int8_gemm: scale must be contiguous (m,) float32, got ", xscale.scalar_type(), " ", xscale.sizes());
  const int64_t m = xscale.size(0);
  TORCH_CHECK(xzero.scalar_type() == at::kInt && xzero.dim() == 1 && xzero.size(0) == m && xzero.is_contiguous(),
              "int8_gemm: zero must be contiguous (", m, ",) int32, got ", xzero.scalar_type(), " ", xzero.sizes());
  check_q(q, m, k);
  return gemm_into(q.data_ptr<uint8_t>(), q.stride(0), xscale.data_ptr<float>(), xzero.data_ptr<int32_t>(), m, packed,
                   n, k, bias, out, accumulate, gelu, isa);
}

Tensor int8_linear(const Tensor& x, const Tensor& packed, int64_t n, const OptTensor& bias, const OptTensor& out,
                   bool accumulate, const std::optional<std::string>& gelu, bool asym, const std::string& isa) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && (x.stride(1) == 1 || x.size(1) <= 1),
              "int8_linear: x must be 2-D float32 (rows, k) with unit column stride, got ", x.scalar_type(), " ",
              x.sizes());
  const int64_t m = x.size(0), k = x.size(1);
  check_packed(packed, n, k);
  // One scratch block from the buffer cache: the codes (mpad, kpad), then the scales and zero points (m each).
  const int64_t kp = fastenc_cpu::int8_kpad(k), codes = fastenc_cpu::int8_mpad(m) * kp;
  Tensor scratch = cpu_empty({codes + 8 * m}, x.options().dtype(at::kByte));
  uint8_t* q = scratch.data_ptr<uint8_t>();
  float* scale = reinterpret_cast<float*>(q + codes);  // (codes: a multiple of 2048 bytes)
  int32_t* zero = reinterpret_cast<int32_t*>(q + codes + 4 * m);
  if (m > 0)
    fastenc_cpu::int8_quantize_rows(x.data_ptr<float>(), m, k, std::max<int64_t>(x.stride(0), 1), asym, q, kp, scale,
                                    zero, at::get_num_threads());
  return gemm_into(q, kp, scale, zero, m, packed, n, k, bias, out, accumulate, gelu, isa);
}

// (name, None when this machine runs it, else why not) for each path, slowest first.
std::vector<std::tuple<std::string, std::optional<std::string>>> int8_isas() {
  std::vector<std::tuple<std::string, std::optional<std::string>>> out;
  for (Int8Isa isa : kIsas) {
    const char* why = fastenc_cpu::int8_isa_unavailable(isa);
    out.emplace_back(fastenc_cpu::int8_isa_name(isa), why ? std::optional<std::string>(why) : std::nullopt);
  }
  return out;
}

std::string int8_isa_best() { return fastenc_cpu::int8_isa_name(fastenc_cpu::int8_isa_best()); }

}  // namespace

FASTENC_BINDINGS(int8_linear) {
  m.def("int8_pack", &int8_pack, "int8 weight (n, k) in [-127, 127] + fp32 scales (n,) -> the int8 GEMM's packed bytes");
  m.def("int8_quantize_rows", &int8_quantize_rows,
        "x (m, k) fp32 -> (u8 codes (mpad, kpad), scale (m,), zero (m,) int32), x ~ scale * (code - zero) per row");
  m.def("int8_gemm_raw", &int8_gemm_raw, "sum_k q[i][k] * w[j][k] (u8 x s8) as int32 (m, n), exact");
  m.def("int8_gemm", &int8_gemm, "dequantized q x W^T (+ bias) (+ out) (then gelu), fp32 (m, n)");
  m.def("int8_linear", &int8_linear, "x (m, k) fp32 quantized per row, times the packed int8 W^T: int8_gemm's y");
  m.def("int8_isas", &int8_isas, "[(path, why it cannot run here or None)] for avx2, avx512_vnni, amx");
  m.def("int8_isa_best", &int8_isa_best, "the fastest int8 path this machine runs");
}
