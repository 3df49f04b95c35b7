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
#include "convert.cuh"
#include "pack.cuh"

// Which arithmetic computes GELU (a template parameter of every kernel).
enum GeluMath : int {
    kTanh = 0,        // the tanh form with tanhf (a few ulp of float)
    kErf = 1,         // the exact form with erff
    kTanhApprox = 2,  // the tanh form with the hardware's tanh.approx.f32 (one MUFU op)
    kHalf2 = 3,       // the tanh form in half2 arithmetic: __hmul2 / __hfma2 / tanh.approx.f16x2
    kSigmoid = 4,     // the tanh form rewritten as x * sigmoid(2 u): one exponential, one reciprocal
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
//
// kSigmoid is the same tanh form, not a new approximation: 0.5 (1 + tanh(u)) is
// exactly 1 / (1 + exp(-2u)), so GELU(x) = x / (1 + exp(-2u)). That costs one
// MUFU.EX2 and one MUFU.RCP (__expf, __fdividef), a few multiplies, and no
// branch, where tanhf chooses between a polynomial and an exponential per
// element: about half of tanhf's instructions per element. __expf's error
// grows with its argument (2 + 1.16 |a| ulp), but it reaches the result only
// where exp(-2u) is large, that is where GELU(x) is tiny next to x: the error,
// measured as the chapter does, stays near tanhf's. Large |x|: exp(-2u) is 0
// or +inf, and x / inf is -0.
template <int Math>
__device__ __forceinline__ float gelu(float x) {
    if (Math == kErf) return 0.5f * x * (1.0f + erff(x * kRsqrt2));
    const float inner = kSqrt2OverPi * (x + kCubic * x * x * x);
    if (Math == kSigmoid) return __fdividef(x, 1.0f + __expf(-2.0f * inner));
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

// Step 1 (and the scalar path): one element per access, in a grid-stride loop.
template <typename T, int Math>
__global__ void gelu_grid_stride(const T* __restrict__ x, T* __restrict__ y, long long n) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = narrow<T>(gelu<Math>(widen(x[i])));
    }
}

// Step 7: a 16-byte pack loaded as read-once. Nothing reads x again, so the load
// asks L1 not to keep the line (L1::no_allocate) and L2 to replace it before any
// other line (an evict_first policy, made by createpolicy): L2's room goes to the
// lines that may be used again, the output and what earlier kernels left there.
// The chapter measures where that pays and where it costs.
template <typename P>
__device__ __forceinline__ P load_read_once(const P* p) {
    static_assert(sizeof(P) == 16, "read-once loads are 16-byte packs");
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    uint4 bits;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(bits.x), "=r"(bits.y), "=r"(bits.z), "=r"(bits.w) : "l"(p), "l"(policy));
    P pack;
    memcpy(&pack, &bits, sizeof pack);
    return pack;
}

// Steps 2-5 and 7: one generic kernel. Each thread loads PacksPerThread Packs of
// PackSize values (up to 16 bytes each: LDG.E.128), all before it uses any, so
// their latencies overlap; computes GELU on each value; and stores the Packs.
// The grid covers the array. A block's packs are BlockSize apart, so each load
// instruction of a warp still reads consecutive 16-byte chunks.
// With Math == kHalf2 the pack is processed as pairs in half2 arithmetic (T must
// be __half and PackSize even); otherwise each value is widened to float.
// With EvictFirst the packs are loaded read-once (load_read_once, step 7).
// Index is the type of the positions: long long for any n, int where the host
// knows that n and every index stay below 2^31 (fewer instructions before the
// first load; step 6 measures what that is worth).
// Requires: x and y aligned to sizeof(Pack); the host falls back to the scalar
// path (PackSize 1) for pointers that are not.
template <typename T, int PackSize, int BlockSize, int Math, int PacksPerThread, bool EvictFirst,
          typename Index = long long>
__global__ void __launch_bounds__(BlockSize)
gelu_packed(const T* __restrict__ x, T* __restrict__ y, long long n) {
    using P = Pack<T, PackSize>;
    const Index count = static_cast<Index>(n);
    const Index num_packs = count / PackSize;
    const Index first = static_cast<Index>(blockIdx.x) * (BlockSize * PacksPerThread) + static_cast<Index>(threadIdx.x);
    P packs[PacksPerThread];
#pragma unroll
    for (int j = 0; j < PacksPerThread; ++j) {
        const Index i = first + j * BlockSize;
        if (i < num_packs) {
            if constexpr (EvictFirst) packs[j] = load_read_once(reinterpret_cast<const P*>(x) + i);
            else packs[j] = reinterpret_cast<const P*>(x)[i];
        }
    }
#pragma unroll
    for (int j = 0; j < PacksPerThread; ++j) {
        const Index i = first + j * BlockSize;
        if (i < num_packs) {
            if constexpr (Math == kHalf2) {
                static_assert(sizeof(T) == 2 && PackSize % 2 == 0, "half2 arithmetic needs pairs of halves");
                __half2* pairs = reinterpret_cast<__half2*>(packs[j].values);
#pragma unroll
                for (int k = 0; k < PackSize / 2; ++k) pairs[k] = gelu_half2(pairs[k]);
            } else {
#pragma unroll
                for (int k = 0; k < PackSize; ++k)
                    packs[j].values[k] = narrow<T>(gelu<Math>(widen(packs[j].values[k])));
            }
            reinterpret_cast<P*>(y)[i] = packs[j];
        }
    }
    // The tail: fewer than PackSize elements past the last whole pack, one per
    // thread of the first block (computed in float whatever Math says).
    if (blockIdx.x == 0) {
        const Index tail = num_packs * PackSize + static_cast<Index>(threadIdx.x);
        if (tail < count) y[tail] = narrow<T>(gelu<Math == kHalf2 ? kTanhApprox : Math>(widen(x[tail])));
    }
}
