// Storage type <-> float, for kernels that store fp32, fp16 or bf16 and compute
// in float (GELU, softmax, LayerNorm). Widening first means no intermediate can
// overflow the 16-bit formats and every reduction accumulates in float.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

template <typename T> __device__ __forceinline__ float widen(T x);
template <> __device__ __forceinline__ float widen(float x) { return x; }
template <> __device__ __forceinline__ float widen(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T narrow(float x);
template <> __device__ __forceinline__ float narrow(float x) { return x; }
template <> __device__ __forceinline__ __half narrow(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 narrow(float x) { return __float2bfloat16_rn(x); }
