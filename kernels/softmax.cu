// Chapter 4, "Softmax": y = exp(x - max(x)) / sum(exp(x - max(x))) over each row
// of a (rows, cols) matrix, safe (max-subtracted), fp32 / fp16 / bf16 storage with
// float arithmetic. A row is read once and written once when it fits on chip:
// 2 * rows * cols * sizeof(T) bytes, declared in helpers/softmax_kernels.py.
//
// A row of -inf only (fully masked) has max -inf, and -inf - (-inf) is NaN: its
// output is NaN, as in PyTorch. A row with some -inf entries gives them 0.
//
// Requires (checked by the host): x, y aligned to a Pack, and cols a multiple of
// PackSize, except on the cluster path with Edges (RowEdges, edges.cuh); the host picks the
// widest pack the arrays are aligned to, and for short rows one that divides cols.
#include "convert.cuh"
#include "edges.cuh"
#include "reduce.cuh"
#include "rows.cuh"

// exp on the special-function unit: ex2.approx of x * log2(e). Its relative error
// (about 2^-21 for the arguments here, all <= 0) is below fp32's rounding of the
// sum it feeds; the accurate expf costs a dozen more instructions per element,
// which an fp16 row arrives too fast to pay for (chapter 2's lesson).
// The .ftz form: __expf's ex2.approx.f32 keeps results below 2^-126 as denormals,
// at three more instructions per exp (FSETP and two FMUL around the MUFU, in SASS).
// Here such a result is exp(x - max) < 1e-38, and flushing it to 0 changes no output
// by more than that. On the H200 (2026-11-22) this alone took fp16 rows of 262144
// from 3,100 to 3,590 GB/s, with the SM's instructions, not HBM, the limit there.
__device__ __forceinline__ float fast_exp(float x) {
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * 1.4426950408889634f));
    return e;
}

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

// The output rule of the paths that recompute exp at the end: softmax,
// exp(x - max) * norm with norm = 1 / sum, or log-softmax, x - max - norm with
// norm = log(sum) (from x, not the log of a rounded quotient, so tiny
// probabilities keep their digits). norm is computed once per row.
template <bool Log>
__device__ __forceinline__ float row_norm(float row_sum) { return Log ? __logf(row_sum) : 1.0f / row_sum; }
template <bool Log>
__device__ __forceinline__ float finish(float x, float row_max, float norm) {
    if constexpr (Log) return x - row_max - norm;
    else return fast_exp(x - row_max) * norm;
}

// Online softmax's state: a running max and the sum of exp(x - max) so far.
// Two states merge by rescaling each sum to the larger max, which is what lets a
// row's max and sum come out of ONE pass (or one reduction) instead of two; the
// warp, block and cluster merges of any such state are in rows.cuh.
// A state that has seen no finite value is (-inf, 0); its rescale factor would be
// exp(-inf - -inf) = NaN, so a sum of 0 is never rescaled.
__device__ __forceinline__ float rescaled(float sum, float from_max, float to_max) {
    return sum > 0.0f ? sum * fast_exp(from_max - to_max) : sum;  // 0 stays 0, NaN stays NaN
}
struct MaxSum {
    float max, sum;
    __device__ static MaxSum identity() { return {-__int_as_float(0x7f800000), 0.0f}; }
    __device__ static MaxSum merge(MaxSum a, MaxSum b) {
        const float m = fmaxf(a.max, b.max);
        return {m, rescaled(a.sum, a.max, m) + rescaled(b.sum, b.max, m)};
    }
};

// A group of GroupWidth lanes per row (a warp, or fewer for short rows), the row
// held in registers: each lane keeps ColsPerThread values, loaded as packs of
// PackSize, pack p of a lane at column (p * GroupWidth + lane) * PackSize so that
// the group's loads are contiguous. Columns past the row's end are -inf (they add
// 0 to the sum). RowsPerGroup rows per group: for short rows, more loads in flight
// per lane. No shared memory, no block barrier: shuffles reduce within the group.
// Log: log-softmax (the row keeps x - max; exp feeds the sum only).
template <typename T, int PackSize, int ColsPerThread, int GroupWidth, int RowsPerGroup, int BlockSize,
          bool Log = false>
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
            const float e = fast_exp(v[r][i] - row_max[r]);
            if constexpr (!Log) v[r][i] = e;
            row_sum[r] += e;
        }
        row_sum[r] = warp_reduce<Sum, GroupWidth>(row_sum[r]);
    }
#pragma unroll
    for (int r = 0; r < RowsPerGroup; ++r) {
        const long long row = first_row + r;
        const float scale = 1.0f / row_sum[r], log_sum = __logf(row_sum[r]);
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
            const long long col = (static_cast<long long>(p) * GroupWidth + lane) * PackSize;
            if (row < rows && col < cols) {
                P pack;
#pragma unroll
                for (int k = 0; k < PackSize; ++k) {
                    const float value = v[r][p * PackSize + k];
                    pack.values[k] = narrow<T>(Log ? value - row_max[r] - log_sum : value * scale);
                }
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
// (max, sum, output), or twice when Online merges max and sum in one pass (each
// thread keeps a running MaxSum). When the rows in flight fit in L2, the re-reads
// come from L2; otherwise this moves 4 (Online: 3) * cols * sizeof(T) bytes per
// row instead of 2.
template <typename T, int PackSize, int BlockSize, bool Online = false, bool Log = false>
__global__ void __launch_bounds__(BlockSize)
softmax_block_uncached(const T* __restrict__ x, T* __restrict__ y, long long rows, long long cols) {
    using P = Pack<T, PackSize>;
    const long long num_packs = cols / PackSize;
    const float minus_inf = -__int_as_float(0x7f800000);
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const P* in = reinterpret_cast<const P*>(x + row * cols);
        float row_max, row_sum;
        if constexpr (Online) {
            MaxSum state{minus_inf, 0.0f};
            for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
                const P pack = in[p];
                float pack_max = state.max;
#pragma unroll
                for (int k = 0; k < PackSize; ++k) pack_max = fmaxf(pack_max, widen(pack.values[k]));
                const float shift = pack_max == minus_inf ? 0.0f : pack_max;  // -inf entries give exp(-inf) = 0
                float sum = rescaled(state.sum, state.max, pack_max);
#pragma unroll
                for (int k = 0; k < PackSize; ++k) sum += fast_exp(widen(pack.values[k]) - shift);
                state = {pack_max, sum};
            }
            state = block_merge<MaxSum, BlockSize>(state);
            row_max = state.max;
            row_sum = state.sum;
        } else {
            float thread_max = minus_inf;
            for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
                const P pack = in[p];
#pragma unroll
                for (int k = 0; k < PackSize; ++k) thread_max = fmaxf(thread_max, widen(pack.values[k]));
            }
            row_max = block_all_reduce<Max, BlockSize>(thread_max);
            float thread_sum = 0.0f;
            for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
                const P pack = in[p];
#pragma unroll
                for (int k = 0; k < PackSize; ++k) thread_sum += fast_exp(widen(pack.values[k]) - row_max);
            }
            row_sum = block_all_reduce<Sum, BlockSize>(thread_sum);
        }
        const float norm = row_norm<Log>(row_sum);
        P* out = reinterpret_cast<P*>(y + row * cols);
        for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
            P pack = in[p];
#pragma unroll
            for (int k = 0; k < PackSize; ++k)
                pack.values[k] = narrow<T>(finish<Log>(widen(pack.values[k]), row_max, norm));
            out[p] = pack;
        }
        if constexpr (Online) __syncthreads();  // block_merge's slots are rewritten for the next row
    }
}

// Copies packs Q..Count-1 of a thread from global to shared memory without passing
// through registers (cp.async, sm_80+): pack q sits q * Stride bytes past the thread's
// first pack on both sides, and is copied when q < in_range. Each copy is in flight
// until cp_async_wait_all(); the thread that issued it may then read it, with no
// barrier when no other thread does. One base register per side and the offsets as
// immediates: a pointer per pack would cost two registers each, enough to spill.
// cp.async moves 4, 8 or 16 bytes; a 2-byte pack (a 16-bit row of odd length) goes
// through a register instead.
template <int Q, int Count, int Stride, typename P>
__device__ __forceinline__ void cp_async_packs(P* shared_first, const P* global_first, int in_range) {
    if constexpr (Q < Count) {
        constexpr int kOffset = Q * Stride;
        const unsigned dst = shared_address(shared_first);
        if (Q < in_range) {
            if constexpr (sizeof(P) >= 4)
                cp_async_bytes<sizeof(P), kOffset>(dst, global_first);
            else
                shared_first[kOffset / sizeof(P)] = global_first[kOffset / sizeof(P)];
        }
        cp_async_packs<Q + 1, Count, Stride>(shared_first, global_first, in_range);
    }
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Lone floats (pack 1: rows of odd length) in 512-thread blocks with a shared part:
// with the .ftz exp the compiler keeps more exps in flight and took 80 registers,
// one block per SM instead of two (H200, 2026-11-22: 1024 x 65537 fp32 fell from
// 2,060 to 1,570 GB/s); asking for two blocks holds it to 64 (a few values spill,
// not the row). 0 leaves every other kernel to the compiler, as before.
template <typename T, int PackSize, int BlockSize, int SharedPacks>
constexpr int kLoneFloatMinBlocks = sizeof(T) == 4 && PackSize == 1 && SharedPacks > 0 && BlockSize == 512 ? 2 : 0;

constexpr int kPhaseClockWords = 6;
// The GPU's nanosecond clock: one clock for all SMs (clock64 counts each SM's own cycles).
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// A row split across a cluster of ClusterSize blocks, held on chip: block `rank`
// of the cluster keeps columns [rank * share, (rank + 1) * share), an equal share of
// the row (below), each thread up to ColsPerThread of them in registers as packs
// (pack p of a thread at (p * BlockSize + thread) * PackSize, so a warp's loads are
// contiguous) and, with SharedPacks > 0, up to SharedPacks more packs in shared
// memory, after the register part. Registers hold at most 128 bytes of the row per
// thread (beyond that they spill); shared memory doubles what one SM holds, so a row
// needs half the blocks, and a cluster half the size (or none). Those packs arrive
// by cp.async, without registers, and each thread reads back only its own slots: no
// barrier.
// ClusterSize 1 is a block per row. With Edges the pack need not divide cols: the
// slices cover the row's aligned middle, and its head and tail go to the first block.
// The packs stay in the storage type: a 16-bit row takes half the registers of a
// float one, so twice the bytes can be in flight per SM. bf16 needs care for that:
// each value is widened from its pack's 32-bit word (widen_at, rows.cuh), and the
// kept exponentials below go into a new pack, not back into the one being read.
// Writing a value into the word its neighbour is still to be widened from made the
// compiler split every bf16 word into two registers (fp16 did not): 80-88 registers
// against fp16's 48-59, so bf16 rows had to take the float shapes (twice the
// threads or the cluster). H200, 2026-11-23, in turns: bf16 2048 x 65536 3,443 ->
// 4,007 GB/s, 512 x 262144 3,088 -> 3,370, 8192 x 16384 3,807 -> 4,057.
// For 16-bit rows (not log-softmax) each value is then replaced by exp(x - thread
// max), rounded to the storage type, as the sum is taken, and the end is one
// multiply per value: y = e * exp(thread max - row max) / sum (one more rounding:
// under 1e-3 in fp16, 8e-3 in bf16, the tests' bounds). Recomputing exp at the end,
// as fp32 rows still do, left the SM computing between its loads and its stores
// while it holds the only block: fp16 512 x 262144 went 3,590 -> 3,650 GB/s, bf16
// (in the float shapes) 2,910 -> 3,090 (H200, 2026-11-22). For fp32 rows in clusters
// the same change measured 4% slower (65536: 3,885 -> 3,735), cause not found, so they
// keep the second exp.
// Every load of a thread is issued before any is used (up to 128 bytes in flight
// per thread), the row crosses HBM once, and max and sum come from ONE reduction
// of MaxSum states: warp shuffles, one block barrier, then, for a cluster, one
// exchange of messages through distributed shared memory (cluster_merge, rows.cuh).
// Launch: rows * ClusterSize blocks, in clusters of ClusterSize along x
// (consecutive blocks form a cluster); SharedPacks * BlockSize packs of dynamic
// shared memory.
// Timed: thread 0 of each block writes kPhaseClockWords words to phase_clock (at
// blockIdx.x * kPhaseClockWords): its SM, then %globaltimer (ns) at its start,
// once its own loads have arrived (after the max), after the block merge, after
// the cluster merge and once its stores are issued. That is how the chapter shows
// where a block's time goes; the kernels softmax() runs are Timed = false, where
// phase_clock is unused (pass null) and the code is the same as without it.
template <typename T, int PackSize, int ColsPerThread, int BlockSize, int ClusterSize, bool Log = false,
          int SharedPacks = 0, bool Timed = false, bool Edges = false>
__global__ void __launch_bounds__(BlockSize, kLoneFloatMinBlocks<T, PackSize, BlockSize, SharedPacks>)
softmax_cluster_per_row(const T* __restrict__ x, T* __restrict__ y, long long rows, long long cols,
                        unsigned long long* __restrict__ phase_clock) {
    unsigned long long* my_clock = phase_clock + blockIdx.x * kPhaseClockWords;
    auto clock_phase = [&](int word) {
        if constexpr (Timed) {
            if (threadIdx.x == 0) my_clock[word] = global_ns();
        }
    };
    if constexpr (Timed) {
        if (threadIdx.x == 0) {
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            my_clock[0] = sm;
        }
    }
    clock_phase(1);
    if constexpr (ClusterSize > 1) cluster_open_inbox<MaxSum, ClusterSize>();
    static_assert(ColsPerThread % PackSize == 0, "whole packs");
    static_assert(ClusterSize >= 1 && ClusterSize <= 16 && (ClusterSize & (ClusterSize - 1)) == 0, "1 to 16 blocks");
    constexpr int kPacks = ColsPerThread / PackSize;
    constexpr long long kSlice = static_cast<long long>(BlockSize) * (ColsPerThread + SharedPacks * PackSize);
    using P = Pack<T, PackSize>;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    P* shared_packs = reinterpret_cast<P*>(shared_bytes);  // [SharedPacks][BlockSize]
    const float minus_inf = -__int_as_float(0x7f800000);
    const long long row = blockIdx.x / ClusterSize;
    const RowEdges<PackSize, Edges> ends(row, cols, blockIdx.x % ClusterSize == 0);
    // Every block of the cluster takes an equal share of the row's middle (cluster_share,
    // rows.cuh), in whole warps' packs. A row that fills the cluster in part then leaves every
    // block a little short of its slice, which it takes from the shared part first; cut into
    // whole slices, it kept the first blocks full, shared part and all, and the last ones empty
    // while they held their SMs' slots until the row was done. H200, 2026-11-24, in turns,
    // 256 MiB, us, whole slices -> shares: fp16 1677 x 80000 152.6 -> 134.5, 1342 x 100001
    // 145.1 -> 140.8, 671 x 200000 143.9 -> 136.8; fp32 479 x 140000 160.8 -> 135.8. Rows that
    // fill their shape are cut as before. Lone values (PackSize 1) keep whole slices: with
    // shares the compiler kept their bounds predicates in registers (P2R), 46 -> 75 of them for
    // 256 x 25 values x 8 blocks, and 1,335 x 50257 fp32 fell from 3,908 to 3,357 GB/s in a
    // recording made with them; the shapes fitted to them fill their blocks.
    const long long share = cluster_share<PackSize, ClusterSize, static_cast<int>(kSlice)>(ends.middle_cols);
    const long long first_col = (blockIdx.x % ClusterSize) * share;  // of the middle
    const long long slice_cols = min(share, ends.middle_cols - first_col);  // <= 0: a block past the row's end
    // Pack i of this thread is mine[i * BlockSize] (column (i * BlockSize + thread) * PackSize
    // of the slice, so a warp's accesses are contiguous): one base pointer per side and
    // constant offsets, and one count for the bounds, so no per-pack address or
    // column index has to stay live across the reductions.
    const P* mine = reinterpret_cast<const P*>(x + row * cols + ends.head + first_col) + threadIdx.x;
    P* my_out = reinterpret_cast<P*>(y + row * cols + ends.head + first_col) + threadIdx.x;
    constexpr int kStride = BlockSize * PackSize;  // columns between a thread's packs
    const int my_packs = static_cast<int>(  // packs of this thread inside the slice
        min(static_cast<long long>(kPacks + SharedPacks), max(0LL, ceil_div(slice_cols - threadIdx.x * PackSize,
                                                                            static_cast<long long>(kStride)))));
    // The shared-memory part first: it needs no registers.
    cp_async_packs<0, SharedPacks, BlockSize * static_cast<int>(sizeof(P))>(
        &shared_packs[threadIdx.x], mine + kPacks * BlockSize, my_packs - kPacks);
    P packs[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p)  // every load first
        packs[p] = p < my_packs ? mine[p * BlockSize] : P{};
    float edge = minus_inf;  // this thread's edge value (exp(edge - shift) once kept), -inf if none
    if (ends.col >= 0) edge = widen(x[row * cols + ends.col]);
    if constexpr (SharedPacks > 0) cp_async_wait_all();
    // Pack i of this thread: in registers (i < kPacks) or in shared memory.
    auto pack_at = [&](int i) -> P& {
        return i < kPacks ? packs[i] : shared_packs[(i - kPacks) * BlockSize + threadIdx.x];
    };
    float thread_max = edge;
#pragma unroll
    for (int i = 0; i < kPacks + SharedPacks; ++i) {
        if (i < my_packs) {
            const P pack = pack_at(i);
#pragma unroll
            for (int k = 0; k < PackSize; ++k) thread_max = fmaxf(thread_max, widen_at(pack, k));
        }
    }
    clock_phase(2);
    const float shift = thread_max == minus_inf ? 0.0f : thread_max;  // -inf entries give exp(-inf) = 0
    constexpr bool kKeepExp = !Log && sizeof(T) == 2;  // values become exp(x - shift): above
    float thread_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPacks + SharedPacks; ++i) {
        if (i < my_packs) {
            const P pack = pack_at(i);
            P kept;
#pragma unroll
            for (int k = 0; k < PackSize; ++k) {
                const float e = fast_exp(widen_at(pack, k) - shift);
                thread_sum += e;
                if constexpr (kKeepExp) kept.values[k] = narrow<T>(e);
            }
            if constexpr (kKeepExp) pack_at(i) = kept;  // a shared pack: this thread's own slot, no barrier
        }
    }
    if (ends.col >= 0) {
        const float e = fast_exp(edge - shift);
        thread_sum += e;
        if constexpr (kKeepExp) edge = e;  // kept as a float: no rounding to T before the scale
    }
    MaxSum row_state = block_merge<MaxSum, BlockSize>({thread_max, thread_sum});
    clock_phase(3);
    if constexpr (ClusterSize > 1) row_state = cluster_merge<MaxSum, ClusterSize>(row_state);
    clock_phase(4);
    // A fully masked row (max -inf) gives NaN, as in PyTorch: exp(-inf - -inf) where exp
    // is recomputed, and the scale below where it is kept. A thread whose values are all
    // -inf in a row that is not writes zeros (its scale, exp(0 - max), could overflow).
    const float norm = row_norm<Log>(row_state.sum);
    float scale = 0.0f;  // kept exponentials only
    if constexpr (kKeepExp)
        scale = thread_max != minus_inf ? fast_exp(shift - row_state.max) * norm
                : row_state.max == minus_inf ? __int_as_float(0x7fffffff) : 0.0f;
#pragma unroll
    for (int i = 0; i < kPacks + SharedPacks; ++i) {
        if (i < my_packs) {
            const P values = pack_at(i);
            P pack;
#pragma unroll
            for (int k = 0; k < PackSize; ++k)
                pack.values[k] = kKeepExp ? narrow<T>(widen_at(values, k) * scale)
                                          : narrow<T>(finish<Log>(widen_at(values, k), row_state.max, norm));
            store_pack(&my_out[i * BlockSize], pack);
        }
    }
    if (ends.col >= 0)
        y[row * cols + ends.col] = narrow<T>(kKeepExp ? edge * scale : finish<Log>(edge, row_state.max, norm));
    clock_phase(5);
}

// Step 1 of the ladder, naive: three kernels and two intermediate vectors. The
// matrix is read three times and written once (4 * rows * cols * sizeof(T) bytes)
// plus 2 * rows floats written and read back; three launches.
template <typename T, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
naive_row_max(const T* __restrict__ x, float* __restrict__ row_max, long long rows, long long cols) {
    float m = -__int_as_float(0x7f800000);
    for (long long c = threadIdx.x; c < cols; c += BlockSize) m = fmaxf(m, widen(x[blockIdx.x * cols + c]));
    m = block_reduce<Max, BlockSize>(m);
    if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}
template <typename T, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
naive_row_sum_exp(const T* __restrict__ x, const float* __restrict__ row_max, float* __restrict__ row_sum,
                  long long rows, long long cols) {
    const float m = row_max[blockIdx.x];
    float s = 0.0f;
    for (long long c = threadIdx.x; c < cols; c += BlockSize) s += fast_exp(widen(x[blockIdx.x * cols + c]) - m);
    s = block_reduce<Sum, BlockSize>(s);
    if (threadIdx.x == 0) row_sum[blockIdx.x] = s;
}
template <typename T>
__global__ void naive_normalize(const T* __restrict__ x, const float* __restrict__ row_max,
                                const float* __restrict__ row_sum, T* __restrict__ y, long long rows, long long cols) {
    const long long n = rows * cols;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long row = i / cols;
        y[i] = narrow<T>(fast_exp(widen(x[i]) - row_max[row]) / row_sum[row]);
    }
}

// Step 2, FasterTransformer-style (its attention softmax): one element per thread,
// the block as wide as the row rounded up to a warp (at most 1024 columns), two
// block reductions through shared memory. RowsPerBlock rows, one after another:
// FasterTransformer launches a block per row, or, for short rows, a block per
// (batch, head) that walks that head's rows.
template <typename T, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
softmax_ft_style(const T* __restrict__ x, T* __restrict__ y, long long rows, long long cols, long long rows_per_block) {
    const long long first = blockIdx.x * rows_per_block;
    for (long long row = first; row < min(rows, first + rows_per_block); ++row) {
        const bool in_row = threadIdx.x < cols;
        const float v = in_row ? widen(x[row * cols + threadIdx.x]) : -__int_as_float(0x7f800000);
        const float row_max = block_all_reduce<Max, BlockSize>(v);
        const float e = in_row ? fast_exp(v - row_max) : 0.0f;
        const float row_sum = block_all_reduce<Sum, BlockSize>(e);
        if (in_row) y[row * cols + threadIdx.x] = narrow<T>(e / row_sum);
    }
}

// Measures the bank conflicts of the two cache layouts of softmax_block_cached:
// one warp stores 8 packs per lane of PackSize floats into shared memory through
// the layout and reads them back, `repeats` times, timed with clock64.
// Layout 0: pack-major [PackSize][packs] (32 lanes on 32 consecutive words);
// 1: naive [packs][PackSize], as the compiler emits it (one wide STS/LDS per pack);
// 2: naive forced to one 4-byte access per value (volatile): lanes PackSize words
// apart, the PackSize-way conflict of the textbook.
template <int PackSize, int Layout>
__global__ void cache_layout_probe(int repeats, long long* __restrict__ cycles, float* __restrict__ sink) {
    constexpr int kPacks = 32 * 8;
    __shared__ __align__(16) float cache[kPacks * PackSize];
    auto slot = [](int p, int k) { return Layout == 0 ? k * kPacks + p : p * PackSize + k; };
    float* plain = cache;
    volatile float* scalar = cache;
    const int lane = threadIdx.x;
    float acc = 0.0f;
    const long long start = clock64();
    for (int r = 0; r < repeats; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
            for (int k = 0; k < PackSize; ++k) {
                const float value = static_cast<float>(lane + k + r);
                if (Layout == 2) scalar[slot(i * 32 + lane, k)] = value;
                else plain[slot(i * 32 + lane, k)] = value;
            }
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
            for (int k = 0; k < PackSize; ++k)
                acc += Layout == 2 ? scalar[slot(i * 32 + lane, k)] : plain[slot(i * 32 + lane, k)];
        }
        __syncwarp();
    }
    const long long end = clock64();
    if (lane == 0) *cycles = end - start;
    sink[lane] = acc;
}
