// Chapter 2, "GELU: an elementwise kernel at the speed of memory".
//
// GELU(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (the tanh form), or
// GELU(x) = 0.5 x (1 + erf(x / sqrt(2)))                         (the exact form).
// Each element is read once and written once: 2 * n * sizeof(T) bytes, declared
// in helpers/gelu_kernels.py. A few dozen flops per element are nothing next to
// that traffic on an H200, so every version here should run at copy speed once
// its memory access is right.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "pack.cuh"

// Which arithmetic computes GELU (a template parameter of every kernel).
enum GeluMath : int {
    kTanh = 0,        // the tanh form with tanhf (a few ulp of float)
    kErf = 1,         // the exact form with erff
    kTanhApprox = 2,  // the tanh form with the hardware's tanh.approx.f32 (one MUFU op)
    kHalf2 = 3,       // the tanh form in half2 arithmetic: __hmul2 / __hfma2 / tanh.approx.f16x2
};

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr float kRsqrt2 = 0.7071067811865476f;

__device__ __forceinline__ float tanh_approx(float y) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(y));
    return t;
}

// GELU in float, whatever the storage type: fp16 and bf16 are widened first, so
// x^3 cannot overflow (65504^3 is 2.8e14, far inside float's range). For |x|
// large enough that x^3 overflows even float, tanh(+-inf) = +-1 and the result
// is x or -0, never NaN.
template <int Math>
__device__ __forceinline__ float gelu(float x) {
    if (Math == kErf) return 0.5f * x * (1.0f + erff(x * kRsqrt2));
    const float inner = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float t = (Math == kTanhApprox) ? tanh_approx(inner) : tanhf(inner);
    return 0.5f * x * (1.0f + t);
}

// GELU of two halves at once, in half2 arithmetic. Factored as
// k0 * x * (1 + k1 * x^2) so that one __hfma2 and two __hmul2 form the inner
// term. x^2 overflows half for |x| > 256; the inner term then becomes +-inf,
// tanh.approx.f16x2 of it is +-1, and the result is x or 0: never NaN.
__device__ __forceinline__ __half2 gelu_half2(__half2 x) {
    const __half2 k0 = __float2half2_rn(kSqrt2OverPi), k1 = __float2half2_rn(kCubic);
    const __half2 one = __float2half2_rn(1.0f), half = __float2half2_rn(0.5f);
    const __half2 inner = __hmul2(__hmul2(k0, x), __hfma2(k1, __hmul2(x, x), one));
    return __hmul2(__hmul2(half, x), __hadd2(one, h2tanh_approx(inner)));
}

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float(float x) { return x; }
template <> __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float(float x) { return x; }
template <> __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

// Step 1 (and the scalar path): one element per access, in a grid-stride loop.
template <typename T, int Math>
__global__ void gelu_grid_stride(const T* __restrict__ x, T* __restrict__ y, long long n) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = from_float<T>(gelu<Math>(to_float(x[i])));
    }
}

// Steps 2-5: one generic kernel. Each thread loads one Pack of PackSize values
// (up to 16 bytes: LDG.E.128), computes GELU on each, and stores the Pack; the
// grid covers the array, the shape that reached the copy ceiling in chapter 1.
// With Math == kHalf2 the pack is processed as pairs in half2 arithmetic (T must
// be __half and PackSize even); otherwise each value is widened to float.
// Requires: x and y aligned to sizeof(Pack); the host falls back to the scalar
// path (PackSize 1) for pointers that are not.
template <typename T, int PackSize, int BlockSize, int Math>
__global__ void __launch_bounds__(BlockSize)
gelu_packed(const T* __restrict__ x, T* __restrict__ y, long long n) {
    using P = Pack<T, PackSize>;
    const long long num_packs = n / PackSize;
    const long long i = static_cast<long long>(blockIdx.x) * BlockSize + threadIdx.x;
    if (i < num_packs) {
        P pack = reinterpret_cast<const P*>(x)[i];
        if constexpr (Math == kHalf2) {
            static_assert(sizeof(T) == 2 && PackSize % 2 == 0, "half2 arithmetic needs pairs of halves");
            __half2* pairs = reinterpret_cast<__half2*>(pack.values);
#pragma unroll
            for (int k = 0; k < PackSize / 2; ++k) pairs[k] = gelu_half2(pairs[k]);
        } else {
#pragma unroll
            for (int k = 0; k < PackSize; ++k) pack.values[k] = from_float<T>(gelu<Math>(to_float(pack.values[k])));
        }
        reinterpret_cast<P*>(y)[i] = pack;
    }
    // The tail: fewer than PackSize elements past the last whole pack, one per
    // thread of the first block (computed in float whatever Math says).
    const long long tail = num_packs * PackSize + i;
    if (tail < n) y[tail] = from_float<T>(gelu<Math == kHalf2 ? kTanhApprox : Math>(to_float(x[tail])));
}
