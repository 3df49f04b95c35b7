// Chapter 3, "Parallel reduction": summing an array, from interleaved addressing
// to the speed of memory, then row-wise (batched) sum and max.
//
// Whole-array steps 1-8 reduce each block's slice to one partial; the host
// launches again on the partials until one value is left. Step 9 finishes in one
// launch. Bytes that must move: n * sizeof(float) read (the output is 4 bytes),
// declared in helpers/reduce_kernels.py.
#include "pack.cuh"

// ---------------------------------------------------------------- whole array

// Steps 1-3 start the same way: one element per thread into shared memory, zeros
// past the end of the array (the identity of +), then a barrier so every thread
// sees every other thread's value.
template <int BlockSize>
__device__ __forceinline__ void load_one_per_thread(const float* __restrict__ x, long long n, float* s) {
    const long long i = static_cast<long long>(blockIdx.x) * BlockSize + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
}

// Steps 4-6: the first add during the load. Each block covers 2 * BlockSize
// elements, and each thread adds the two it loads, a block apart (coalesced).
template <int BlockSize>
__device__ __forceinline__ void load_two_per_thread(const float* __restrict__ x, long long n, float* s) {
    const long long i = static_cast<long long>(blockIdx.x) * (2 * BlockSize) + threadIdx.x;
    s[threadIdx.x] = (i < n ? x[i] : 0.0f) + (i + BlockSize < n ? x[i + BlockSize] : 0.0f);
    __syncthreads();
}

// Step 1: interleaved addressing, divergent branch. At stride s, only threads
// whose index is a multiple of 2s work: in every warp most threads idle, yet the
// warp runs the branch's instructions anyway.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
reduce_interleaved_divergent(const float* __restrict__ x, float* __restrict__ partial, long long n) {
    __shared__ float s[BlockSize];
    const int t = threadIdx.x;
    load_one_per_thread<BlockSize>(x, n, s);
    for (int stride = 1; stride < BlockSize; stride *= 2) {
        if (t % (2 * stride) == 0) s[t] += s[t + stride];
        __syncthreads();  // every thread must see this level before the next reads it
    }
    if (t == 0) partial[blockIdx.x] = s[0];
}

// Step 2: interleaved addressing, strided index. The working threads are now the
// first ones (no divergence inside full warps), but thread t touches s[2*stride*t]:
// at stride 16, the threads of a warp hit every 32nd word, all in the same bank.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
reduce_interleaved_strided(const float* __restrict__ x, float* __restrict__ partial, long long n) {
    __shared__ float s[BlockSize];
    const int t = threadIdx.x;
    load_one_per_thread<BlockSize>(x, n, s);
    for (int stride = 1; stride < BlockSize; stride *= 2) {
        const int index = 2 * stride * t;
        if (index < BlockSize) s[index] += s[index + stride];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = s[0];
}

// Step 3: sequential addressing. Thread t adds s[t + stride] into s[t], with the
// stride halving: consecutive threads touch consecutive words, no bank conflicts.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
reduce_sequential(const float* __restrict__ x, float* __restrict__ partial, long long n) {
    __shared__ float s[BlockSize];
    const int t = threadIdx.x;
    load_one_per_thread<BlockSize>(x, n, s);
    for (int stride = BlockSize / 2; stride > 0; stride /= 2) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = s[0];
}

// Step 4: first add during load (load_two_per_thread). Half the blocks, and no
// thread idles in the first level of the tree.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
reduce_first_add(const float* __restrict__ x, float* __restrict__ partial, long long n) {
    __shared__ float s[BlockSize];
    const int t = threadIdx.x;
    load_two_per_thread<BlockSize>(x, n, s);
    for (int stride = BlockSize / 2; stride > 0; stride /= 2) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = s[0];
}

// The last warp, correctly for Volta and later. Since Volta the threads of a warp
// are scheduled independently: the old "volatile" warp-synchronous code assumed
// they run in lock step, so a thread could read s[t + stride] before its
// neighbour wrote it. Here every level reads into a register, then __syncwarp()
// orders the reads before the writes, and the writes before the next level.
__device__ __forceinline__ void reduce_last_warp(float* s, int t) {
    float v = s[t];
#pragma unroll
    for (int stride = 32; stride > 0; stride /= 2) {
        v += s[t + stride];
        __syncwarp();
        s[t] = v;
        __syncwarp();
    }
}

// Step 5: unroll the last warp: no __syncthreads() once 32 threads are left.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
reduce_unroll_last_warp(const float* __restrict__ x, float* __restrict__ partial, long long n) {
    static_assert(BlockSize >= 64, "the last-warp step reads s[t + 32]");
    __shared__ float s[BlockSize];
    const int t = threadIdx.x;
    load_two_per_thread<BlockSize>(x, n, s);
    for (int stride = BlockSize / 2; stride > 32; stride /= 2) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t < 32) reduce_last_warp(s, t);
    if (t == 0) partial[blockIdx.x] = s[0];
}

// Step 6: complete unrolling. BlockSize is a compile-time constant, so every
// "if (BlockSize >= ...)" disappears at compile time and the loop is gone.
template <int BlockSize>
__device__ __forceinline__ void reduce_block_unrolled(float* s, int t) {
    if (BlockSize >= 1024) { if (t < 512) s[t] += s[t + 512]; __syncthreads(); }
    if (BlockSize >= 512) { if (t < 256) s[t] += s[t + 256]; __syncthreads(); }
    if (BlockSize >= 256) { if (t < 128) s[t] += s[t + 128]; __syncthreads(); }
    if (BlockSize >= 128) { if (t < 64) s[t] += s[t + 64]; __syncthreads(); }
    if (t < 32) reduce_last_warp(s, t);
}

template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
reduce_complete_unroll(const float* __restrict__ x, float* __restrict__ partial, long long n) {
    static_assert(BlockSize >= 64 && (BlockSize & (BlockSize - 1)) == 0, "a power of two, at least 64");
    __shared__ float s[BlockSize];
    const int t = threadIdx.x;
    load_two_per_thread<BlockSize>(x, n, s);
    reduce_block_unrolled<BlockSize>(s, t);
    if (t == 0) partial[blockIdx.x] = s[0];
}

// Step 7: algorithm cascading. Each thread first sums many elements on its own
// (a grid-stride loop over the whole array), then the block runs the tree once.
// Brent: with n / log n threads each doing log n sequential adds, the work stays
// O(n) and the time O(log n); the tree's log-many barriers are paid once per block.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
reduce_cascaded(const float* __restrict__ x, float* __restrict__ partial, long long n) {
    static_assert(BlockSize >= 64 && (BlockSize & (BlockSize - 1)) == 0, "a power of two, at least 64");
    __shared__ float s[BlockSize];
    const int t = threadIdx.x;
    float sum = 0.0f;
    for (long long i = static_cast<long long>(blockIdx.x) * BlockSize + t; i < n;
         i += static_cast<long long>(gridDim.x) * BlockSize) {
        sum += x[i];
    }
    s[t] = sum;
    __syncthreads();
    reduce_block_unrolled<BlockSize>(s, t);
    if (t == 0) partial[blockIdx.x] = s[0];
}

// Step 8: warp shuffles. Inside a warp, registers are exchanged directly
// (__shfl_xor_sync): no shared memory and no barrier. Each warp's sum goes to
// one shared slot; the first warp reduces those. Reused by the row reductions.
struct Sum {
    __device__ static float identity() { return 0.0f; }
    __device__ static float apply(float a, float b) { return a + b; }
};
struct Max {
    __device__ static float identity() { return -__int_as_float(0x7f800000); }  // -inf
    __device__ static float apply(float a, float b) { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
    for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, lane_mask));
    return v;  // every lane holds the warp's result
}

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

template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
reduce_shuffle(const float* __restrict__ x, float* __restrict__ partial, long long n) {
    float sum = 0.0f;
    for (long long i = static_cast<long long>(blockIdx.x) * BlockSize + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * BlockSize) {
        sum += x[i];
    }
    sum = block_reduce<Sum, BlockSize>(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Step 9: 128-bit loads and a single pass. Each block writes its partial; the
// last block to finish (found with an atomic counter after a fence) sums the
// partials in a fixed order, so the result is the same on every run, and resets
// the counter for the next launch. Works for any n: the float4 loop covers the
// aligned bulk, a scalar loop the few elements before and after it.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
reduce_single_pass(const float* __restrict__ x, float* __restrict__ partial, unsigned int* __restrict__ blocks_done,
                   float* __restrict__ result, long long n) {
    using P = Pack<float, 4>;
    // Elements before the first 16-byte boundary, then whole packs, then the rest.
    const long long head = min(n, static_cast<long long>((16 - (reinterpret_cast<unsigned long long>(x) % 16)) % 16 / 4));
    const long long num_packs = (n - head) / 4;
    const P* packs = reinterpret_cast<const P*>(x + head);
    const long long thread = static_cast<long long>(blockIdx.x) * BlockSize + threadIdx.x;
    const long long stride = static_cast<long long>(gridDim.x) * BlockSize;
    float sum = 0.0f;
    for (long long i = thread; i < num_packs; i += stride) {
        const P p = packs[i];
        sum += (p.values[0] + p.values[1]) + (p.values[2] + p.values[3]);
    }
    const long long tail = head + num_packs * 4;
    if (thread < head) sum += x[thread];
    if (tail + thread < n) sum += x[tail + thread];
    sum = block_reduce<Sum, BlockSize>(sum);

    __shared__ bool last;
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sum;
        __threadfence();  // the partial is visible to every block before the count says so
        last = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    float total = 0.0f;
    for (int b = threadIdx.x; b < gridDim.x; b += BlockSize) total += __ldcg(&partial[b]);  // from L2, not a stale L1
    total = block_reduce<Sum, BlockSize>(total);
    if (threadIdx.x == 0) {
        *result = total;
        *blocks_done = 0;  // ready for the next launch
    }
}

// ---------------------------------------------------------------- row-wise

// One block per row: each thread folds its share of the row (float4 when the row
// is 16-byte aligned, scalar otherwise), then one block_reduce. Any row length.
template <typename Op, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
row_reduce_block(const float* __restrict__ x, float* __restrict__ y, long long cols) {
    const float* row = x + static_cast<long long>(blockIdx.x) * cols;
    float v = Op::identity();
    if (reinterpret_cast<unsigned long long>(row) % 16 == 0) {
        using P = Pack<float, 4>;
        const P* packs = reinterpret_cast<const P*>(row);
        for (long long i = threadIdx.x; i < cols / 4; i += BlockSize) {
            const P p = packs[i];
            v = Op::apply(v, Op::apply(Op::apply(p.values[0], p.values[1]), Op::apply(p.values[2], p.values[3])));
        }
        for (long long i = cols / 4 * 4 + threadIdx.x; i < cols; i += BlockSize) v = Op::apply(v, row[i]);
    } else {
        for (long long i = threadIdx.x; i < cols; i += BlockSize) v = Op::apply(v, row[i]);
    }
    v = block_reduce<Op, BlockSize>(v);
    if (threadIdx.x == 0) y[blockIdx.x] = v;
}

// One warp per row, for short rows: no shared memory and no barrier at all.
// Each block holds BlockSize / 32 rows.
template <typename Op, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
row_reduce_warp(const float* __restrict__ x, float* __restrict__ y, long long rows, long long cols) {
    const long long r = static_cast<long long>(blockIdx.x) * (BlockSize / 32) + threadIdx.x / 32;
    if (r >= rows) return;  // a whole warp leaves together: the shuffles below stay full-warp
    const float* row = x + r * cols;
    const int lane = threadIdx.x % 32;
    float v = Op::identity();
    for (long long i = lane; i < cols; i += 32) v = Op::apply(v, row[i]);
    v = warp_reduce<Op>(v);
    if (lane == 0) y[r] = v;
}
