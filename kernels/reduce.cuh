// Reductions every chapter reuses (introduced in chapter 3, "Parallel reduction";
// softmax and LayerNorm build on them): the operators, the warp and block
// reductions built from shuffles, and the strided, vectorized walk over an array
// or a row that the fast kernels share.
#pragma once
#include "pack.cuh"

struct Sum {
    __device__ static float identity() { return 0.0f; }
    __device__ static float apply(float a, float b) { return a + b; }
};
struct Max {
    __device__ static float identity() { return -__int_as_float(0x7f800000); }  // -inf
    __device__ static float apply(float a, float b) { return fmaxf(a, b); }
};

// Inside a warp, registers are exchanged directly (__shfl_xor_sync): no shared
// memory and no barrier. Width < 32 reduces each group of Width consecutive lanes
// on its own (the xor never crosses a group), so one warp can serve 32 / Width
// short rows at once. Every lane of the warp must take part.
template <typename Op, int Width = 32>
__device__ __forceinline__ float warp_reduce(float v) {
    static_assert(Width >= 1 && Width <= 32 && (Width & (Width - 1)) == 0, "a power of two up to 32 lanes");
#pragma unroll
    for (int lane_mask = Width / 2; lane_mask > 0; lane_mask /= 2)
        v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, lane_mask));
    return v;  // every lane of the group holds the group's result
}

// Each warp's result goes to one shared slot; the first warp reduces those.
template <typename Op, int BlockSize>
__device__ __forceinline__ float block_reduce(float v) {
    static_assert(BlockSize % 32 == 0 && BlockSize <= 1024, "whole warps, at most 1024 threads");
    __shared__ float warp_results[BlockSize / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_reduce<Op>(v);
    if (lane == 0) warp_results[warp] = v;
    __syncthreads();
    v = threadIdx.x < BlockSize / 32 ? warp_results[threadIdx.x] : Op::identity();
    if (warp == 0) v = warp_reduce<Op>(v);
    __syncthreads();  // warp_results may be reused by the caller's next block_reduce
    return v;  // valid in warp 0
}

// One 16-byte load. EvictFirst marks it read-once (ld.global.cs): L2 replaces such
// lines before others, which pays off when L2 is full of other kernels' dirty
// lines (chapter 3 measures when it helps and when it costs).
template <bool EvictFirst>
__device__ __forceinline__ Pack<float, 4> load_pack(const Pack<float, 4>* p) {
    if constexpr (EvictFirst) {
        const float4 v = __ldcs(reinterpret_cast<const float4*>(p));
        return {{v.x, v.y, v.z, v.w}};
    } else {
        return *p;
    }
}

// A pack's four values, as a tree of two levels (the adds of one level are
// independent of each other).
template <typename Op>
__device__ __forceinline__ float reduce_pack(const Pack<float, 4>& p) {
    return Op::apply(Op::apply(p.values[0], p.values[1]), Op::apply(p.values[2], p.values[3]));
}

// A thread's share of x[0, n) for the fast kernels: every stride-th 16-byte pack
// from pack `first`, Fold packs loaded before any is added. The loads of one
// iteration do not depend on each other, so all Fold are in flight at once: what
// keeps HBM busy is the number of bytes requested and not yet returned, and one
// 16-byte load per thread at a time is not enough to cover the latency.
// Any n and any 4-byte-aligned x: the (at most 3) elements before the first
// 16-byte boundary and the (at most 3) after the last whole pack are walked one
// by one (by threads 0-2, or fewer threads when the stride is narrower).
template <typename Op, int Fold, bool EvictFirst = false>
__device__ __forceinline__ float fold_strided(const float* __restrict__ x, long long n, long long first,
                                              long long stride) {
    using P = Pack<float, 4>;
    const long long head = min(n, static_cast<long long>((16 - reinterpret_cast<unsigned long long>(x) % 16) % 16 / 4));
    const long long num_packs = (n - head) / 4;
    const P* packs = reinterpret_cast<const P*>(x + head);
    float acc[Fold];  // Fold independent accumulators: no add waits on another's load
#pragma unroll
    for (int k = 0; k < Fold; ++k) acc[k] = Op::identity();
    for (long long i = first; i < num_packs; i += Fold * stride) {
        P p[Fold];
#pragma unroll
        for (int k = 0; k < Fold; ++k) {  // issue every load first...
            const long long at = i + k * stride;
            if (at < num_packs) p[k] = load_pack<EvictFirst>(packs + at);
            else p[k] = P{{Op::identity(), Op::identity(), Op::identity(), Op::identity()}};
        }
#pragma unroll
        for (int k = 0; k < Fold; ++k) acc[k] = Op::apply(acc[k], reduce_pack<Op>(p[k]));  // ...then add
    }
    const long long tail = head + num_packs * 4;
    float edges = Op::identity();
    for (long long i = first; i < head; i += stride) edges = Op::apply(edges, x[i]);
    for (long long i = tail + first; i < n; i += stride) edges = Op::apply(edges, x[i]);
    acc[0] = Op::apply(acc[0], edges);
#pragma unroll
    for (int width = Fold / 2; width > 0; width /= 2) {  // the accumulators, as a tree
#pragma unroll
        for (int k = 0; k < width; ++k) acc[k] = Op::apply(acc[k], acc[k + width]);
    }
    return acc[0];
}
