// Chapter 1, "The memory-bandwidth ceiling": copy kernels, from naive to the
// speed of HBM. A copy does no arithmetic at all, so the time it takes is the
// price of moving bytes, and its bandwidth is the ceiling every later kernel is
// judged against. Bytes moved by every kernel here: n * sizeof(T) read plus
// n * sizeof(T) written (helpers/copy_kernels.py declares that once).
#include <cuda_fp16.h>
#include "pack.cuh"

// Step 1: one thread per element. The grid must cover n, so it grows with n
// (2^28 floats need 2^20 blocks of 256). Each thread issues one load and one
// store of sizeof(T) bytes: every access is coalesced across the warp, but a
// warp only keeps 32 * sizeof(T) bytes in flight per load instruction.
template <typename T>
__global__ void copy_one_per_thread(const T* __restrict__ src, T* __restrict__ dst,
                                    long long n) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// Step 2: a grid-stride loop. The grid is sized to the machine (a few waves of
// resident blocks), not to n, and each thread walks the array with a stride of
// the whole grid. Consecutive threads still touch consecutive addresses on every
// trip, so accesses stay coalesced, and block scheduling is paid once.
template <typename T>
__global__ void copy_grid_stride(const T* __restrict__ src, T* __restrict__ dst,
                                 long long n) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        dst[i] = src[i];
    }
}

// Steps 3 and 4: vector access in the grid-stride loop. Each thread moves Packs
// of PackSize elements (8 or 16 bytes), so one instruction moves 2x or 4x the
// bytes of step 2: the same bytes requested with a fraction of the instructions.
// BlockSize is a template parameter so that __launch_bounds__ tells the
// compiler the exact block size (it then budgets registers for it).
// Requires: src and dst aligned to sizeof(Pack) (checked on the host).
template <typename T, int PackSize, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
copy_packed_grid_stride(const T* __restrict__ src, T* __restrict__ dst, long long n) {
    using P = Pack<T, PackSize>;
    const P* __restrict__ src_packs = reinterpret_cast<const P*>(src);
    P* __restrict__ dst_packs = reinterpret_cast<P*>(dst);
    const long long num_packs = n / PackSize;
    const long long thread = static_cast<long long>(blockIdx.x) * BlockSize + threadIdx.x;
    const long long stride = static_cast<long long>(gridDim.x) * BlockSize;
    for (long long i = thread; i < num_packs; i += stride) dst_packs[i] = src_packs[i];

    // The tail: fewer than PackSize elements past the last whole pack. The grid
    // always has at least PackSize threads, so one element per thread suffices.
    const long long tail = num_packs * PackSize + thread;
    if (tail < n) dst[tail] = src[tail];
}

// Step 5: one chunk per thread, no loop. The grid covers the whole array:
// block b owns the BlockSize * Unroll packs starting at b * BlockSize * Unroll,
// and thread t of it moves packs t, t + BlockSize, ... (coalesced on every
// access). Measured on the H200 at 1 GiB this beats step 4's grid-stride loop by
// about 8%: a block that finishes is replaced at once by the block scheduler, so
// loads of new blocks overlap the stores of old ones, while warps of a one-wave
// grid-stride loop each wait out a full memory round trip per trip. Unroll > 1
// loads several packs before storing any: more bytes in flight per thread, fewer
// blocks.
template <typename T, int PackSize, int BlockSize, int Unroll>
__global__ void __launch_bounds__(BlockSize)
copy_packed(const T* __restrict__ src, T* __restrict__ dst, long long n) {
    using P = Pack<T, PackSize>;
    const P* __restrict__ src_packs = reinterpret_cast<const P*>(src);
    P* __restrict__ dst_packs = reinterpret_cast<P*>(dst);
    const long long num_packs = n / PackSize;
    const long long first = static_cast<long long>(blockIdx.x) * BlockSize * Unroll + threadIdx.x;

    P staged[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
        const long long i = first + u * BlockSize;
        if (i < num_packs) staged[u] = src_packs[i];
    }
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
        const long long i = first + u * BlockSize;
        if (i < num_packs) dst_packs[i] = staged[u];
    }

    // The tail, as above: the first few threads of the grid copy it element-wise.
    const long long tail = num_packs * PackSize
                         + static_cast<long long>(blockIdx.x) * BlockSize + threadIdx.x;
    if (tail < n) dst[tail] = src[tail];
}
