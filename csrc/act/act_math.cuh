// x * sigmoid(k x) and its derivative in fp32, shared by act.cu (quick GELU, k = 1.702) and swiglu.cu (SiLU, k = 1).
//   y = x s,  s = sigmoid(k x) = 1 / (1 + exp(-k x)),  dy/dx = s + k x s (1 - s)
// exp overflows to inf below k x ~ -88: s = 0, y = -0 and dy/dx = -0 there; at -inf y = -inf * 0 = NaN and at +inf
// dy/dx = 1 + inf * 0 = NaN, as torch's x * sigmoid(k x) and its autograd; NaN stays NaN.
#pragma once

namespace fastenc_cuda {

constexpr float kQuickK = 1.702f;  // quick GELU: x * sigmoid(1.702 x)

__device__ __forceinline__ float x_sigmoid_f(float x, float k) { return x * (1.f / (1.f + expf(-k * x))); }

__device__ __forceinline__ void x_sigmoid_and_grad_f(float x, float k, float& y, float& d) {
  const float s = 1.f / (1.f + expf(-k * x));
  y = x * s;
  d = s + k * x * s * (1.f - s);
}

}  // namespace fastenc_cuda
