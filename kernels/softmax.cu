// Chapter 4, "Softmax": y = exp(x - max(x)) / sum(exp(x - max(x))) over each row
// of a (rows, cols) matrix, safe (max-subtracted), fp32 / fp16 / bf16 storage with
// float arithmetic. A row is read once and written once when it fits on chip:
// 2 * rows * cols * sizeof(T) bytes, declared in helpers/softmax_kernels.py.
//
// A row of -inf only (fully masked) has max -inf, and -inf - (-inf) is NaN: its
// output is NaN, as in PyTorch. A row with some -inf entries gives them 0.
//
// Requires (checked by the host): cols a multiple of PackSize, and x, y aligned to
// a Pack; the host picks the widest pack that divides cols.
#include "convert.cuh"
#include "reduce.cuh"

// exp on the special-function unit: ex2.approx of x * log2(e). Its relative error
// (about 2^-21 for the arguments here, all <= 0) is below fp32's rounding of the
// sum it feeds; the accurate expf costs a dozen more instructions per element,
// which an fp16 row arrives too fast to pay for (chapter 2's lesson).
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }

// Block-wide reduction whose result every thread receives (block_reduce leaves
// it in warp 0 only): one shared word, written by thread 0, read after a barrier.
template <typename Op, int BlockSize>
__device__ __forceinline__ float block_all_reduce(float v) {
    __shared__ float result;
    v = block_reduce<Op, BlockSize>(v);
    if (threadIdx.x == 0) result = v;
    __syncthreads();
    v = result;
    __syncthreads();  // the next call may overwrite result
    return v;
}

// A group of GroupWidth lanes per row (a warp, or fewer for short rows), the row
// held in registers: each lane keeps ColsPerThread values, loaded as packs of
// PackSize, pack p of a lane at column (p * GroupWidth + lane) * PackSize so that
// the group's loads are contiguous. Columns past the row's end are -inf (they add
// 0 to the sum). RowsPerGroup rows per group: for short rows, more loads in flight
// per lane. No shared memory, no block barrier: shuffles reduce within the group.
template <typename T, int PackSize, int ColsPerThread, int GroupWidth, int RowsPerGroup, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
softmax_warp_per_row(const T* __restrict__ x, T* __restrict__ y, long long rows, long long cols) {
    static_assert(ColsPerThread % PackSize == 0 && BlockSize % GroupWidth == 0, "whole packs, whole groups");
    constexpr int kPacks = ColsPerThread / PackSize;
    using P = Pack<T, PackSize>;
    const int lane = threadIdx.x % GroupWidth;
    const long long first_row =
        (static_cast<long long>(blockIdx.x) * (BlockSize / GroupWidth) + threadIdx.x / GroupWidth) * RowsPerGroup;
    const float minus_inf = -__int_as_float(0x7f800000);
    float v[RowsPerGroup][ColsPerThread];
    float row_max[RowsPerGroup], row_sum[RowsPerGroup];
#pragma unroll
    for (int r = 0; r < RowsPerGroup; ++r) {  // every load of every row first
        const long long row = first_row + r;
        row_max[r] = minus_inf;
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
            const long long col = (static_cast<long long>(p) * GroupWidth + lane) * PackSize;
            if (row < rows && col < cols) {  // cols is a multiple of PackSize: the whole pack is in the row
                const P pack = *reinterpret_cast<const P*>(x + row * cols + col);
#pragma unroll
                for (int k = 0; k < PackSize; ++k) {
                    v[r][p * PackSize + k] = widen(pack.values[k]);
                    row_max[r] = fmaxf(row_max[r], v[r][p * PackSize + k]);
                }
            } else {
#pragma unroll
                for (int k = 0; k < PackSize; ++k) v[r][p * PackSize + k] = minus_inf;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RowsPerGroup; ++r) {
        row_max[r] = warp_reduce<Max, GroupWidth>(row_max[r]);  // every lane, valid row or not, shuffles
        row_sum[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < ColsPerThread; ++i) {
            v[r][i] = fast_exp(v[r][i] - row_max[r]);
            row_sum[r] += v[r][i];
        }
        row_sum[r] = warp_reduce<Sum, GroupWidth>(row_sum[r]);
    }
#pragma unroll
    for (int r = 0; r < RowsPerGroup; ++r) {
        const long long row = first_row + r;
        const float scale = 1.0f / row_sum[r];
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
            const long long col = (static_cast<long long>(p) * GroupWidth + lane) * PackSize;
            if (row < rows && col < cols) {
                P pack;
#pragma unroll
                for (int k = 0; k < PackSize; ++k) pack.values[k] = narrow<T>(v[r][p * PackSize + k] * scale);
                *reinterpret_cast<P*>(y + row * cols + col) = pack;
            }
        }
    }
}

// A block per row, the row cached in shared memory (as float) for rows too long
// for registers: one read of the row from HBM, then max, sum and the output from
// shared memory. The cache's layout is [PackSize][num_packs]: value k of pack p
// sits at k * num_packs + p, so the 32 lanes of a warp, which hold consecutive
// packs, write consecutive words (32 banks, no conflict). The naive layout,
// p * PackSize + k, puts lane t's values PackSize words apart: a PackSize-way
// bank conflict on every scalar access. Grid: one wave of blocks looping over rows.
template <typename T, int PackSize, int BlockSize, bool PackMajorCache>
__global__ void __launch_bounds__(BlockSize)
softmax_block_cached(const T* __restrict__ x, T* __restrict__ y, long long rows, long long cols) {
    extern __shared__ float cache[];  // cols floats
    using P = Pack<T, PackSize>;
    const long long num_packs = cols / PackSize;
    auto slot = [num_packs](long long p, int k) { return PackMajorCache ? k * num_packs + p : p * PackSize + k; };
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const P* in = reinterpret_cast<const P*>(x + row * cols);
        float thread_max = -__int_as_float(0x7f800000);
        for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
            const P pack = in[p];
#pragma unroll
            for (int k = 0; k < PackSize; ++k) {
                const float value = widen(pack.values[k]);
                cache[slot(p, k)] = value;
                thread_max = fmaxf(thread_max, value);
            }
        }
        const float row_max = block_all_reduce<Max, BlockSize>(thread_max);  // its barrier also orders the cache
        float thread_sum = 0.0f;
        for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
#pragma unroll
            for (int k = 0; k < PackSize; ++k) {
                const float e = fast_exp(cache[slot(p, k)] - row_max);
                cache[slot(p, k)] = e;  // each thread rewrites only its own slots
                thread_sum += e;
            }
        }
        const float scale = 1.0f / block_all_reduce<Sum, BlockSize>(thread_sum);
        P* out = reinterpret_cast<P*>(y + row * cols);
        for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
            P pack;
#pragma unroll
            for (int k = 0; k < PackSize; ++k) pack.values[k] = narrow<T>(cache[slot(p, k)] * scale);
            out[p] = pack;
        }
        __syncthreads();  // the next row overwrites the cache
    }
}

// A block per row for any length, without a cache: the row is read three times
// (max, sum, output). When the row is small enough, the second and third reads
// come from L2; otherwise this moves 4 * cols * sizeof(T) bytes per row instead of 2.
template <typename T, int PackSize, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
softmax_block_uncached(const T* __restrict__ x, T* __restrict__ y, long long rows, long long cols) {
    using P = Pack<T, PackSize>;
    const long long num_packs = cols / PackSize;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const P* in = reinterpret_cast<const P*>(x + row * cols);
        float thread_max = -__int_as_float(0x7f800000);
        for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
            const P pack = in[p];
#pragma unroll
            for (int k = 0; k < PackSize; ++k) thread_max = fmaxf(thread_max, widen(pack.values[k]));
        }
        const float row_max = block_all_reduce<Max, BlockSize>(thread_max);
        float thread_sum = 0.0f;
        for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
            const P pack = in[p];
#pragma unroll
            for (int k = 0; k < PackSize; ++k) thread_sum += fast_exp(widen(pack.values[k]) - row_max);
        }
        const float scale = 1.0f / block_all_reduce<Sum, BlockSize>(thread_sum);
        P* out = reinterpret_cast<P*>(y + row * cols);
        for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
            P pack = in[p];
#pragma unroll
            for (int k = 0; k < PackSize; ++k) pack.values[k] = narrow<T>(fast_exp(widen(pack.values[k]) - row_max) * scale);
            out[p] = pack;
        }
    }
}
