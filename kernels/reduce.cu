// Chapter 3, "Parallel reduction": summing an array, from interleaved addressing
// to the speed of memory, then row-wise (batched) sum and max.
//
// Whole-array steps 1-8 reduce each block's slice to one partial; the host
// launches again on the partials until one value is left. Step 9 finishes in one
// launch. Bytes that must move: n * sizeof(float) read (the output is 4 bytes),
// declared in helpers/reduce_kernels.py.
#include "reduce.cuh"

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

// Measuring what step 2's bank conflicts cost. Shared memory has 32 banks;
// 4-byte word i lives in bank i % 32, and a bank serves one word per cycle. One
// warp repeats a read-modify-write of s[lane * stride]: with stride 1 the 32 lanes
// hit 32 banks; with stride 2, pairs of lanes share a bank (a 2-way conflict, the
// access is replayed); with stride 32 all lanes hit bank 0 (32-way). Each access
// depends on the last (volatile), so the cycles per access are its latency, with
// the replays in it.
__global__ void bank_conflict_probe(int stride, int repeats, long long* __restrict__ cycles, float* __restrict__ sink) {
    __shared__ float words[32 * 32];
    volatile float* s = words;
    for (int i = threadIdx.x; i < 32 * 32; i += 32) s[i] = static_cast<float>(i);
    __syncwarp();
    const int index = threadIdx.x * stride % (32 * 32);  // distinct per lane for stride <= 32
    float v = 0.0f;
    const long long start = clock64();
    for (int r = 0; r < repeats; ++r) {
        v += s[index];
        s[index] = v;
    }
    const long long end = clock64();
    if (threadIdx.x == 0) *cycles = end - start;
    sink[threadIdx.x] = v;  // keeps the loop from being optimized away
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

// Step 8: warp shuffles (warp_reduce and block_reduce, in reduce.cuh, which the
// row reductions, softmax and LayerNorm reuse): registers move between the lanes
// of a warp directly, without shared memory or a barrier.
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

// Step 9: 128-bit loads, Fold of them in flight (fold_strided, in reduce.cuh), and
// a single pass; EvictFirst marks the loads read-once. One wave of blocks walks
// the array; each block writes its partial; the last block to finish (found with
// an atomic counter after a fence) sums the partials in a fixed order, so the
// result is the same on every run, and resets the counter for the next launch.
template <int BlockSize, int Fold, bool EvictFirst>
__global__ void __launch_bounds__(BlockSize)
reduce_single_pass(const float* __restrict__ x, float* __restrict__ partial, unsigned int* __restrict__ blocks_done,
                   float* __restrict__ result, long long n) {
    const long long thread = static_cast<long long>(blockIdx.x) * BlockSize + threadIdx.x;
    float sum = fold_strided<Sum, Fold, EvictFirst>(x, n, thread, static_cast<long long>(gridDim.x) * BlockSize);
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

// One block per row: the block walks its row Fold packs per thread at a time
// (fold_strided handles rows that start off a 16-byte boundary, as rows of a
// length that is not a multiple of 4 do), then one block_reduce. Any row length.
template <typename Op, int BlockSize, int Fold>
__global__ void __launch_bounds__(BlockSize)
row_reduce_block(const float* __restrict__ x, float* __restrict__ y, long long cols) {
    const float* row = x + static_cast<long long>(blockIdx.x) * cols;
    const float v = block_reduce<Op, BlockSize>(fold_strided<Op, Fold>(row, cols, threadIdx.x, BlockSize));
    if (threadIdx.x == 0) y[blockIdx.x] = v;
}

// A warp per row, for short rows: no shared memory and no barrier at all. For
// rows shorter still, a group of GroupWidth < 32 lanes per row, so that a warp
// serves 32 / GroupWidth rows and each lane still has several 16-byte loads to
// keep in flight. Each block holds BlockSize / GroupWidth rows.
template <typename Op, int BlockSize, int Fold, int GroupWidth>
__global__ void __launch_bounds__(BlockSize)
row_reduce_warp(const float* __restrict__ x, float* __restrict__ y, long long rows, long long cols) {
    const long long r = static_cast<long long>(blockIdx.x) * (BlockSize / GroupWidth) + threadIdx.x / GroupWidth;
    const int lane = threadIdx.x % GroupWidth;
    // A group past the last row walks an empty row instead of returning: every
    // lane of the warp must reach the shuffles of warp_reduce.
    const bool valid = r < rows;
    const float v = warp_reduce<Op, GroupWidth>(
        fold_strided<Op, Fold>(valid ? x + r * cols : x, valid ? cols : 0, lane, GroupWidth));
    if (valid && lane == 0) y[r] = v;
}
