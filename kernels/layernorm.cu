// Chapter 5, "LayerNorm": y = (x - mean) * rstd * weight + bias over each row of a
// (rows, cols) matrix, with rstd = 1 / sqrt(var + eps) and var the biased
// (population) variance, as torch.nn.functional.layer_norm computes it. x,
// weight, bias and y share one storage type (fp32, fp16 or bf16); the arithmetic
// is float. Each row's mean and rstd can be written too, as float (what a
// backward pass needs); a null pointer means "not wanted".
//
// The bytes a LayerNorm must move: the matrix read once and written once, weight
// and bias read once: (2 * rows + 2) * cols * sizeof(T), declared in
// helpers/layernorm_kernels.py.
//
// Requires (checked by the host): every pointer aligned to a Pack, and cols a
// multiple of PackSize, but on the cluster path with Edges (below), which splits
// each row into an aligned middle and its edges; the host picks the widest pack that
// divides cols, or on that path the widest the pointers allow.
#include <cuda/std/type_traits>

#include "convert.cuh"
#include "edges.cuh"
#include "reduce.cuh"
#include "rows.cuh"

// Step 2's statistics: the sum and the sum of squares, merged by adding both;
// then var = E[x²] - E[x]². One pass, one reduction of two floats, and a
// numerical trap: when |mean| is large against the spread, E[x²] and E[x]² are
// two nearly equal large numbers and their difference is rounding noise (step 3).
struct SumSquares {
    float sum, squares;
    __device__ static SumSquares identity() { return {0.0f, 0.0f}; }
    __device__ static SumSquares merge(SumSquares a, SumSquares b) { return {a.sum + b.sum, a.squares + b.squares}; }
    template <typename T, int N>
    __device__ static SumSquares of(const Pack<T, N>& pack) {
        SumSquares s = identity();
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const float v = widen_at(pack, k);
            s.sum += v;
            s.squares += v * v;
        }
        return s;
    }
    __device__ float mean(float n) const { return sum / n; }
    // Cancellation can leave it slightly negative; clamped, or rsqrt would give NaN.
    __device__ float variance(float n) const { return fmaxf(squares / n - mean(n) * mean(n), 0.0f); }
};

// Welford's state: how many values, their mean, and M2 = sum of (x - mean)²,
// which never subtracts two large numbers. Two states merge by Chan's rule:
//   n = na + nb,  d = mean_b - mean_a,  mean = mean_a + d * nb / n,
//   M2 = M2a + M2b + d² * na * nb / n.
// A state of no values is (0, 0, 0) and merges as a no-op.
//
// FastDivision: how a merge divides nb / n. An IEEE division is a
// dozen instructions and a branch to a slow path; __fdividef (a reciprocal and a
// multiply, within 2 ulp) changes mean and M2 by a relative 2^-22 of a merge's
// correction terms, far below the rounding of the sums themselves. A block of
// 1024 threads merges at ten levels of its shuffle trees, where the divisions are
// a large share of its instructions. MeanM2 divides as IEEE does; the block path picks
// the fast division where it measured faster (layernorm_cluster_per_row).
template <bool FastDivision>
struct WelfordState {
    float count, mean_, m2;
    __device__ static WelfordState identity() { return {0.0f, 0.0f, 0.0f}; }
    __device__ static float divide(float a, float b) { return FastDivision ? __fdividef(a, b) : a / b; }
    __device__ static WelfordState merge(WelfordState a, WelfordState b) {
        const float count = a.count + b.count;
        const float share = count > 0.0f ? divide(b.count, count) : 0.0f;
        const float d = b.mean_ - a.mean_;
        return {count, a.mean_ + d * share, a.m2 + b.m2 + d * d * a.count * share};
    }
    // A pack's own state, exactly: its mean first, then the squares about it.
    template <typename T, int N>
    __device__ static WelfordState of(const Pack<T, N>& pack) {
        float sum = 0.0f, m2 = 0.0f;
#pragma unroll
        for (int k = 0; k < N; ++k) sum += widen_at(pack, k);
        const float mean = sum * (1.0f / N);
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const float d = widen_at(pack, k) - mean;
            m2 += d * d;
        }
        return {static_cast<float>(N), mean, m2};
    }
    __device__ float mean(float) const { return mean_; }
    __device__ float variance(float n) const { return m2 / n; }
};

using MeanM2 = WelfordState<false>;

// The output of one pack: (x - mean) * rstd * weight + bias, rounded once.
// (x - shift - mean) * rstd * weight + bias, with mean and rstd the statistics of
// x - shift (shift 0: of x itself).
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> normalized(const Pack<T, N>& in, const Pack<T, N>& weight, const Pack<T, N>& bias,
                                                 float mean, float rstd, float shift = 0.0f) {
    Pack<T, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k)
        out.values[k] =
            narrow<T>((widen_at(in, k) - shift - mean) * rstd * widen_at(weight, k) + widen_at(bias, k));
    return out;
}

__device__ __forceinline__ void write_statistics(float* mean_out, float* rstd_out, long long row, float mean,
                                                 float rstd) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
}

// The mean's rounding, taken back without a shift (the 16-bit warp kernels: layernorm_warp_per_row
// and layernorm_warp_rows). mean0 = sum * (1 / cols) is off by an ulp or so of the mean, which
// x - mean0 keeps; where the row is nearly constant (16-bit values at a large offset), rstd is
// large and multiplies it. The sum of 16-bit values at a large offset is exact (they share their
// low bits), so sum - mean0 * cols is exact in one fma, and c = (sum - mean0 * cols) / cols is
// the rounding. The squares taken about mean0 give the variance m2 / cols - c², and each output
// is (x - mean0) * rstd - c * rstd: one FFMA. mean0 must be rounded once, on purpose: written
// `sum * inv_cols`, the compiler fused each x - mean0 into an FFMA with the unrounded product,
// which c, computed for the rounded one, then missed (fp16 rows of 184, 192 and 1000 at
// 10^4 + N(0, 1) came out 69-209x the tolerance off, H200, 2026-11-27).
__device__ __forceinline__ float rounded_mean(float sum, float inv_cols) { return __fmul_rn(sum, inv_cols); }
__device__ __forceinline__ float mean_rounding(float sum, float mean0, long long cols, float inv_cols) {
    return fmaf(-mean0, static_cast<float>(cols), sum) * inv_cols;
}
// m2 / cols + eps - c²: what rstd's rsqrt takes, with m2 the squares about mean0.
__device__ __forceinline__ float variance_plus_eps(float m2, float correction, float inv_cols, float eps) {
    return fmaf(m2, inv_cols, eps) - correction * correction;
}

// Steps 2 and 3: a block per row, fused. The first walk over the row folds each
// pack into the State (SumSquares: step 2; MeanM2: step 3's fix), ONE block
// reduction merges the states (warp results in shared memory, one barrier), and
// every thread derives mean and rstd from the merged state. The second walk
// re-reads the row (from L1 or L2 when the row is short enough to still be there)
// and writes the output. One launch; the intermediates never leave the SM.
template <typename T, int PackSize, int BlockSize, typename State>
__global__ void __launch_bounds__(BlockSize)
layernorm_block_fused(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                      T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                      long long rows, long long cols, float eps) {
    using P = Pack<T, PackSize>;
    const long long row = blockIdx.x, num_packs = cols / PackSize;
    const P* in = reinterpret_cast<const P*>(x + row * cols);
    State state = State::identity();
    for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
        const P pack = in[p];  // a copy: passed by reference, it was loaded value by value
        state = State::merge(state, State::of(pack));
    }
    state = block_merge<State, BlockSize>(state);
    const float n = static_cast<float>(cols), mean = state.mean(n), rstd = rsqrtf(state.variance(n) + eps);
    if (threadIdx.x == 0) write_statistics(mean_out, rstd_out, row, mean, rstd);
    const P *w = reinterpret_cast<const P*>(weight), *b = reinterpret_cast<const P*>(bias);
    P* out = reinterpret_cast<P*>(y + row * cols);
    for (long long p = threadIdx.x; p < num_packs; p += BlockSize) {
        const P pack = in[p], scale = w[p], shift = b[p];
        out[p] = normalized(pack, scale, shift, mean, rstd);
    }
}

// A load as the compiler makes it: what load_slice does unless told otherwise.
struct PlainLoad {
    template <typename P>
    __device__ __forceinline__ P operator()(const P* slice, int index) const { return slice[index]; }
};

// The row held in registers by the threads that share it (a lane group, a block
// or a cluster of blocks): each thread keeps kPacks packs, pack p at column
// (p * Stride + lane) * PackSize of its slice, so that the threads' loads are
// contiguous; packs past the slice's end are not loaded. Every load is issued
// before any value is used. `load` is how one pack is read (step 5 passes loads
// with cache hints).
template <int Stride, typename P, int kPacks, typename Load = PlainLoad>
__device__ __forceinline__ void load_slice(P (&packs)[kPacks], const P* slice, int lane, long long slice_packs,
                                           Load load = {}) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
        if (p * Stride + lane < slice_packs) packs[p] = load(slice, p * Stride + lane);
}

// How the threads of a block add up a float, each of them receiving the total
// (slice_mean_m2's sums; a lane group adds with warp_reduce alone): each warp's
// total goes to shared memory, one barrier, then every warp adds
// the BlockSize / 32 totals in groups of that many lanes: no more shuffle rounds than
// the warps need (block_merge's second stage takes five). Each Round has its own slots,
// so two sums in a row need no barrier between them.
template <int BlockSize>
struct WholeBlock {
    template <int Round>
    __device__ static float sum(float v) {
        constexpr int kWarps = BlockSize / 32;
        static_assert(BlockSize % 32 == 0 && (kWarps & (kWarps - 1)) == 0, "a power of two of whole warps");
        __shared__ float warp_totals[kWarps];
        v = warp_reduce<Sum>(v);
        if (threadIdx.x % 32 == 0) warp_totals[threadIdx.x / 32] = v;
        __syncthreads();
        return warp_reduce<Sum, kWarps>(warp_totals[threadIdx.x % kWarps]);
    }
};

// The (count, mean, M2) of x - shift over a slice of slice_packs packs that the
// threads of a block hold together in registers, each thread kPacks of them (pack p at
// p * BlockSize + lane): two passes over the registers, which cost no memory traffic,
// and two sums over the block (WholeBlock). The first pass and sum give the mean, the second the squares
// about it. A merge of (count, mean, M2) states (Chan's rule) exchanges three words
// and divides at every level of its tree; this exchanges one float a level and
// divides once. It measured faster in the streamed path's blocks (where it is used,
// with the numbers), and so do lane groups, which take the same two sums over values
// they keep widened (layernorm_warp_per_row).
//
// Why a shift: Welford's states fix the variance, but the mean is still a float,
// rounded at every merge; on inputs like 1e4 + N(0, 1) that is a few ulps of 1e4
// (~1e-3), and every output inherits it. Shifted by a value of the row (its first
// one, which every thread can load), the statistics are of x - shift, which is
// exact where it matters (Sterbenz: two floats within a factor of 2 of each
// other, as on such inputs; always, for 16-bit inputs widened to float), and
// their mean is small, so its rounding is too. The output is then
// ((x - shift) - mean') * rstd, and the mean the caller gets is shift + mean'.
// FastDivision: how the mean divides by the count (WelfordState's choice).
template <int BlockSize, bool FastDivision = false, typename T, int kPack, int kPacks>
__device__ __forceinline__ MeanM2 slice_mean_m2(const Pack<T, kPack> (&packs)[kPacks], int lane, long long slice_packs,
                                               float shift) {
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
        if (p * BlockSize + lane < slice_packs) {
#pragma unroll
            for (int k = 0; k < kPack; ++k) sum += widen_at(packs[p], k) - shift;
        }
    }
    const float count = static_cast<float>(slice_packs * kPack);
    const float total = WholeBlock<BlockSize>::template sum<0>(sum);  // every thread sums, even one past the last row
    const float mean = slice_packs > 0 ? WelfordState<FastDivision>::divide(total, count) : 0.0f;
    float m2 = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
        if (p * BlockSize + lane < slice_packs) {
#pragma unroll
            for (int k = 0; k < kPack; ++k) {
                const float d = widen_at(packs[p], k) - shift - mean;
                m2 += d * d;
            }
        }
    }
    return {count, mean, WholeBlock<BlockSize>::template sum<1>(m2)};
}

// The thread's own (count, mean, M2) of x - shift, in the same two passes, for Chan's
// merges (the State: which division they use). Its loops are slice_mean_m2's with the
// count taken on the way; written out, not calling it: with the count computed apart,
// the compiler allocated the cluster kernels differently (16-bit, narrow packs: 84 ->
// 127 registers, spills at 1024 threads).
template <int Stride, typename State = MeanM2, typename T, int kPack, int kPacks>
__device__ __forceinline__ State thread_mean_m2(const Pack<T, kPack> (&packs)[kPacks], int lane, long long slice_packs,
                                                float shift) {
    float sum = 0.0f;
    int count = 0;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
        if (p * Stride + lane < slice_packs) {
            count += kPack;
#pragma unroll
            for (int k = 0; k < kPack; ++k) sum += widen_at(packs[p], k) - shift;
        }
    }
    const float mean = count > 0 ? sum / count : 0.0f;
    float m2 = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
        if (p * Stride + lane < slice_packs) {
#pragma unroll
            for (int k = 0; k < kPack; ++k) {
                const float d = widen_at(packs[p], k) - shift - mean;
                m2 += d * d;
            }
        }
    }
    return {static_cast<float>(count), mean, m2};
}

// The pack of N values that starts `shift` values into lo and runs on into hi
// (0 <= shift < N, the same for a whole row but known only at run time). No
// register array may be indexed at run time (it would go to local memory), so the
// words move by selects, in halving steps (by two words, then one: a select a word
// each), and 16-bit values at an odd shift then move half a word by a funnel shift.
// For a 16-byte pack: 11 selects and 4 shifts (fp16, bf16), 9 selects (fp32).
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> realigned(const Pack<T, N>& lo, const Pack<T, N>& hi, int shift) {
    static_assert(sizeof(Pack<T, N>) % 4 == 0, "packs of whole 32-bit words");
    constexpr int kWords = sizeof(Pack<T, N>) / 4;
    unsigned w[2 * kWords];
    memcpy(w, &lo, sizeof(lo));
    memcpy(w + kWords, &hi, sizeof(hi));
    const int byte_shift = shift * static_cast<int>(sizeof(T));
#pragma unroll
    for (int step = kWords / 2; step >= 1; step /= 2) {
        const bool by_step = (byte_shift / 4) & step;
#pragma unroll
        for (int i = 0; i + step < 2 * kWords; ++i) w[i] = by_step ? w[i + step] : w[i];  // reads w[i + step] unmoved
    }
    unsigned out[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i)
        out[i] = sizeof(T) == 2 ? __funnelshift_r(w[i], w[i + 1], 8 * (byte_shift & 2)) : w[i];
    Pack<T, N> pack;
    memcpy(&pack, out, sizeof(pack));
    return pack;
}

// How a 16-byte load may use the caches.
// ReadOnly: the read-only path (ld.global.nc), as the compiler loads a const __restrict__
// pointer's data. KeptInL1: L1::evict_last, for weight and bias, read by every warp of the SM;
// KeptInL1ReadOnly: both. The block path takes the last (Affine's KeptInL1), where the plain
// ld.global.L1::evict_last ran 0.5-2.2% slower at fp32 rows of 17 000 to 26 000 values and
// within 0.7% at the others tried (H200, scratch, 2026-11-28, in turns); warp_rows keeps the
// plain form, which it was tuned with. Keep and LastUse (layernorm_streamed, step 5): L1's
// evict_last and evict_first, with an L2 policy from l2_policy, below.
enum class Reuse { ReadOnly, KeptInL1, KeptInL1ReadOnly, Keep, LastUse };

// A load with a hint is PTX the compiler will not reorder, merge or drop: layernorm_streamed's
// pass 2 load is a real second read (a plain load of a const __restrict__ pointer could be
// served from pass 1's registers). 16-byte packs only: the widths these paths were measured with.
template <Reuse How, typename P>
__device__ __forceinline__ P load_with_hint(const P* src, unsigned long long l2_policy = 0) {
    static_assert(sizeof(P) == 16, "16-byte packs");
    unsigned w[4];
    if constexpr (How == Reuse::ReadOnly)
        asm volatile("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(src));
    else if constexpr (How == Reuse::KeptInL1)
        asm volatile("ld.global.L1::evict_last.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(src));
    else if constexpr (How == Reuse::KeptInL1ReadOnly)
        asm volatile("ld.global.nc.L1::evict_last.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(src));
    else if constexpr (How == Reuse::Keep)
        asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(src), "l"(l2_policy));
    else  // LastUse
        asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(src), "l"(l2_policy));
    P pack;
    memcpy(&pack, w, 16);
    return pack;
}

// Weight and bias: the same cols values for every row, so after the first rows
// they come from L1 and L2. Late (the default): each pack is loaded where its
// output is written, after the reduction (or a chunk of packs at a time: below).
// Early: all are loaded with the row, so their latency overlaps the row's, at the
// price of three times the registers for the row's data. On the H200 that pays
// for short rows in lane groups (fp32 rows of 64 to 1024 values, 16-bit rows of
// 64 to 256: the rule is lane_group_variant's, in helpers/layernorm_kernels.py)
// and costs elsewhere: fewer rows in flight.
// Shifted (a row's aligned middle, Edges): weight and bias are aligned at column 0,
// the middle at column `shift` (the row's head), so each of its packs straddles two
// packs of weight. Both are loaded (L1 hits, but for the first rows) and realigned
// in registers. The middle stops short enough that the second pack of its last pair
// lies inside weight (the kernel's RowEdges, below).
// KeptInL1: loaded with L1::evict_last, so that L1 keeps them over the row's lines
// (layernorm_cluster_per_row tells where, and why).
template <bool Early, int Stride, typename P, int kPacks, bool Shifted = false, bool KeptInL1 = false>
struct Affine {
    static_assert(!KeptInL1 || (!Early && !Shifted && sizeof(P) == 16), "kept in L1: late, aligned 16-byte packs");
    P weight[Early ? kPacks : 1], bias[Early ? kPacks : 1];
    const P *weight_at, *bias_at;
    int shift;  // Shifted: the row's head, in values
    __device__ __forceinline__ Affine(const P* w, const P* b, int lane, long long slice_packs, int head = 0)
        : weight_at(w), bias_at(b), shift(head) {
        if constexpr (Early) {
#pragma unroll
            for (int p = 0; p < kPacks; ++p)
                if (p * Stride + lane < slice_packs)
                    weight[p] = fetch(weight_at, p * Stride + lane), bias[p] = fetch(bias_at, p * Stride + lane);
        }
    }
    // Pack `at` of the slice (a copy: passed by reference, a late pack was loaded value by value).
    __device__ __forceinline__ P fetch(const P* from, long long at) const {
        if constexpr (KeptInL1) {
            return load_with_hint<Reuse::KeptInL1ReadOnly>(from + at);
        } else if constexpr (!Shifted) {
            return from[at];
        } else {
            // At shift 0 the next pack may lie past the end: hi is then lo again (an L1 hit), unused.
            const P lo = from[at], hi = from[at + (shift > 0)];
            return realigned(lo, hi, shift);
        }
    }
    // Pack p of the thread's slice, which is pack `at` of the slice.
    __device__ __forceinline__ P weight_pack(int p, long long at) const {
        if constexpr (Early) return weight[p]; else return fetch(weight_at, at);
    }
    __device__ __forceinline__ P bias_pack(int p, long long at) const {
        if constexpr (Early) return bias[p]; else return fetch(bias_at, at);
    }
};

// Late weight and bias can be loaded Chunk packs at a time, a chunk's loads issued
// together before its stores. A store is a barrier to the compiler (store_pack is
// volatile asm), so one pack at a time makes a thread wait for L2 once per pack with
// nothing else of its own in flight. That wait shows where a block holds a whole SM:
// 1024 threads of 32 floats each (2048 x 32768 fp32 on the H200, 2026-11-22: 3270 GB/s
// one pack a time, 3415 two). Elsewhere the registers of a chunk cost more rows in
// flight than the wait (8192 x 8192 fp32: -5%; fp16: -3 to -30%), so the kernels ask
// for it only there (kAffineChunk). What weight and bias still cost there: without them
// (weight 1 and bias 0 in registers, a wrong result timed as a bound) these kernels ran
// 14-15% faster at 2048 x 32768 fp32, 24-25% at 1024 x 65536 fp32 (clusters of 8) and
// 15-22% at 16-bit rows of 65536, as fast as softmax's kernel at the same shapes or
// faster; thread 0's clock put the difference in the store phase, 2.0 -> 4.2 us a block
// at fp32 32768 (H200, scratch, 2026-11-28). Rows with Edges take a pack at a time: two
// realigned packs at once spilled (fp32 1024 x 32: 20 bytes; 1024 x 32 x 8: 76).
template <typename T, int PackSize, int ColsPerThread, bool Early, bool Edges>
constexpr int kAffineChunk = !Early && !Edges && sizeof(T) == 4 && PackSize == 4 && ColsPerThread == 32 ? 2 : 1;

// Or one pack ahead: pack p + 1's weight and bias are loaded before pack p is
// stored, so a thread's next pair is in flight while it computes and stores. Where
// a block of 1024 threads holds 64 16-bit values each (rows of 32 769 to 65 536, one
// row an SM, and clusters of such blocks) a chunk of two packs spilled, and one pack
// ahead fits in 62-64 registers. Only where the block's slice is full: with bounds
// on every pack, rows that leave it part empty ran 4-6% slower than a pack a wait
// (fp16 3355 x 40000, 3728 x 36000, bf16 2730 x 49152), so they take a pack a wait.
// In turns with the kernel before (H200, 2026-11-28, 256 MiB, five measurements):
// fp16 2048 x 65536 +7.2-7.6% (3,040-3,054 -> 3,264-3,279 GB/s), bf16 +7.3-8.4%, bf16
// 2236 x 60000 +2.6-3.2%, fp16 335 x 400000 (clusters of 8) +0.9-1.1%, the part-empty
// rows above +0.4-1.2%. In blocks of 512 threads (rows of 16 385 to 32 768) it did not
// pay: fp16 4096 x 32768 +0.4-0.7%, bf16 -0.2 to -0.3%, part-empty rows 6-8% slower
// (fp16 6710 x 20000, bf16 5461 x 24576; with bounds). fp32 rows of 32 768, one ahead
// instead of chunks of two: level on the H200, 1% slower on an H100 (scratch).
template <typename T, int PackSize, int ColsPerThread, int BlockSize, bool Early, bool Edges>
constexpr bool kAffineAhead =
    !Early && !Edges && sizeof(T) == 2 && PackSize == 8 && ColsPerThread == 64 && BlockSize == 1024;

// A thread's packs, normalized, weighted and biased, stored to out: pack p at p * Stride +
// lane, those at or past slice_packs left alone. Weight and bias come from Affine a pack at a
// time, Chunk packs at a time (kAffineChunk) or, with Ahead, one pack ahead (kAffineAhead).
template <int Chunk, int Stride, bool Ahead = false, bool Early, typename P, int kPacks, bool Shifted, bool KeptInL1>
__device__ __forceinline__ void store_slice(const P (&packs)[kPacks], P* out,
                                            const Affine<Early, Stride, P, kPacks, Shifted, KeptInL1>& affine,
                                            int lane, long long slice_packs, float mean, float rstd, float shift) {
    static_assert(kPacks % Chunk == 0 && (Chunk == 1 || !Early), "whole chunks, of late weight and bias");
    static_assert(!Ahead || (Chunk == 1 && !Early), "one pack ahead: of late weight and bias, a pack at a time");
    // One pack ahead where the slice is full (every thread holds all its packs: no bounds);
    // a slice the row leaves part empty takes the loop below, a pack at a time (kAffineAhead).
    if (Ahead && slice_packs >= static_cast<long long>(kPacks) * Stride) {
        P w = affine.weight_pack(0, lane), b = affine.bias_pack(0, lane);  // pack p's
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
            const long long at = p * Stride + lane;
            P next_w, next_b;
            if (p + 1 < kPacks)
                next_w = affine.weight_pack(p + 1, at + Stride), next_b = affine.bias_pack(p + 1, at + Stride);
            store_pack(out + at, normalized(packs[p], w, b, mean, rstd, shift));
            w = next_w, b = next_b;
        }
        return;
    }
#pragma unroll
    for (int c = 0; c < kPacks; c += Chunk) {
        P chunk_weight[Chunk], chunk_bias[Chunk];
        if constexpr (Chunk > 1) {
#pragma unroll
            for (int j = 0; j < Chunk; ++j) {
                const long long at = (c + j) * Stride + lane;
                if (at < slice_packs)
                    chunk_weight[j] = affine.weight_pack(c + j, at), chunk_bias[j] = affine.bias_pack(c + j, at);
            }
        }
#pragma unroll
        for (int j = 0; j < Chunk; ++j) {
            const int p = c + j;
            const long long at = p * Stride + lane;
            if (at < slice_packs) {
                if constexpr (Chunk > 1) {
                    store_pack(out + at, normalized(packs[p], chunk_weight[j], chunk_bias[j], mean, rstd, shift));
                } else {
                    const P w = affine.weight_pack(p, at), b = affine.bias_pack(p, at);
                    store_pack(out + at, normalized(packs[p], w, b, mean, rstd, shift));
                }
            }
        }
    }
}

// Or staged through shared memory: weight and bias copied there by cp.async (global to shared
// memory, past the registers and L1) into Ring slots of a pack pair each. Packs 0 to Ring - 1 are
// asked for before the row's loads, so they arrive while the row does and the block reduces; pack
// p + Ring as pack p is stored, into the slot p's pair leaves. A store then waits for L2 once a
// thread where it waited once a chunk. A thread reads back only the slots it filled: no barrier.
// The price: Ring * 32 bytes a thread of shared memory, which L1 gives up (128 KiB for 1024 threads
// of four slots), and weight and bias no longer stay in L1 from one row to the next. Where they
// would not fit there anyway, in fp32 rows of more than 25 600 values (200 KiB of weight and
// bias) held by blocks of 1024 threads, that paid (helpers/layernorm_kernels.py's AFFINE_RING, with
// the numbers); elsewhere L1 served them better.
template <int Ring, int Stride, typename P, int kPacks>
struct StagedAffine {
    static_assert(sizeof(P) == 16 && Ring >= 1 && Ring <= kPacks, "16-byte packs, at most a slot a pack");
    const P *weight_at, *bias_at;
    int lane;
    long long slice_packs;
    __device__ __forceinline__ StagedAffine(const P* w, const P* b, int lane_, long long slice_packs_)
        : weight_at(w), bias_at(b), lane(lane_), slice_packs(slice_packs_) {
#pragma unroll
        for (int p = 0; p < Ring; ++p) request(p);
    }
    // Slot s: the weight pack of each thread at [lane], the bias pack at [Stride + lane].
    __device__ static P* slot(int s) {
        extern __shared__ uint4 staged_affine[];  // the launch's dynamic shared memory: Ring * 2 * Stride packs
        return reinterpret_cast<P*>(staged_affine) + 2 * s * Stride;
    }
    // Pack p's weight and bias into slot p % Ring, as one cp.async group (.cg: through L2 only). Past
    // the slice the group is empty: every thread commits one a pack, so that waits count alike.
    __device__ __forceinline__ void request(int p) const {
        const long long at = static_cast<long long>(p) * Stride + lane;
        if (p < kPacks && at < slice_packs) {
            P* to = slot(p % Ring);
            cp_async_bytes<16>(shared_address(to + lane), weight_at + at);
            cp_async_bytes<16>(shared_address(to + Stride + lane), bias_at + at);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    // store_slice's work: the thread's packs normalized, weighted, biased and stored.
    __device__ __forceinline__ void store(const P (&packs)[kPacks], P* out, float mean, float rstd, float shift) const {
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
            // Ring + p groups asked for, at most Ring - 1 still in flight: pack p's has come
            asm volatile("cp.async.wait_group %0;" ::"n"(Ring - 1) : "memory");
            const long long at = static_cast<long long>(p) * Stride + lane;
            if (at < slice_packs) {
                const P* from = slot(p % Ring);
                store_pack(out + at, normalized(packs[p], from[lane], from[Stride + lane], mean, rstd, shift));
            }
            request(p + Ring);  // into the slot just read (its pair went into the store above)
        }
    }
};
// The kernel's staging where none is asked for: constructed, does nothing.
struct NoStaging {
    template <typename... Args>
    __device__ __forceinline__ NoStaging(Args...) {}
};

// Step 4, short rows: a group of GroupWidth lanes per row (a warp, or fewer),
// ColsPerThread values per lane. Each lane widens its values to float once, as they
// arrive, and keeps them so: the sum, the squares about the mean and the output then
// take one or two instructions a value. Held in their storage type instead and widened
// at each of those three passes (as the block and cluster paths hold them, to save
// registers), 16-bit rows took more instructions (at 16 values a lane, 504 SASS
// instructions against 368), and in blocks of one or two warps, at most 32 an SM, they
// showed (the numbers are with the dispatcher's rule in helpers/layernorm_kernels.py).
// Statistics: two float sums within the group by shuffles: no shared memory, no
// barrier, no E[x²] - E[x]².
// The mean's rounding: fp32 rows take the shift x[row][0] off every value as they are
// widened (why: above slice_mean_m2). 16-bit rows need no shift: their sum is exact
// where the mean is large against the spread (values at a large offset share their low
// bits), so the rounding of mean0 = sum * (1 / cols) is computed in one fma
// (mean_rounding), and taken off in the output's FFMA. That saves every
// lane a load that waits with the row. In rotated turns (H200, scratch, 2026-11-27, three
// measurements, 256 MiB, us, shift -> fma (torch.compile)): fp16 524288 x 256 130.0 -> 129.5-129.6
// (130.5-130.6), 134217 x 1000 132.3 -> 131.5-131.6 (132.6-132.7), 131072 x 1024 129.8-129.9 ->
// 129.3-129.4 (130.9); bf16 1048576 x 128 130.2-130.3 -> 130.0-130.1 (130.5-130.6), 524288 x 256
// 129.7-129.8 -> 129.4-129.5 (130.8-130.9); fp16 512 0.1-0.2% faster; level (-0.12 to +0.11%) at
// fp16 64 and 768 and bf16 512 and 1024 (131.2 -> 131.2-131.3, torch.compile 131.2). The outputs'
// errors on 1e4 + N(0, 1), constant and N(0, 1) rows did not change. fp32 sums round, so there the
// fma would not find the mean's rounding; the corrected two-pass sum of (x - mean0), reduced with
// the squares, measured level at 128 to 512 values and 0.5% slower at 1024 (and took the outputs'
// error on N(0, 1) rows from 0.2-0.3 of the tolerance to 0.06-0.07: exercise 7's question).
template <typename T, int PackSize, int ColsPerThread, int GroupWidth, int BlockSize, bool EarlyAffine>
__global__ void __launch_bounds__(BlockSize)
layernorm_warp_per_row(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                       T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                       long long rows, long long cols, float eps) {
    static_assert(ColsPerThread % PackSize == 0 && BlockSize % GroupWidth == 0, "whole packs, whole groups");
    constexpr int kPacks = ColsPerThread / PackSize;
    using P = Pack<T, PackSize>;
    const int lane = threadIdx.x % GroupWidth;
    const long long row = static_cast<long long>(blockIdx.x) * (BlockSize / GroupWidth) + threadIdx.x / GroupWidth;
    const long long row_packs = row < rows ? cols / PackSize : 0;  // a group past the last row loads nothing...
    P packs[kPacks];
    load_slice<GroupWidth>(packs, reinterpret_cast<const P*>(x + row * cols), lane, row_packs);
    const Affine<EarlyAffine, GroupWidth, P, kPacks> affine(reinterpret_cast<const P*>(weight),
                                                           reinterpret_cast<const P*>(bias), lane, row_packs);
    constexpr bool kShifted = sizeof(T) == 4;  // fp32: the shift; 16-bit: the mean's rounding by an fma
    const float shift = kShifted && row < rows ? widen(x[row * cols]) : 0.0f;
    float v[ColsPerThread];  // x - shift, then x - shift - mean; 0 where the lane's pack is past the row
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
        const bool in_row = p * GroupWidth + lane < row_packs;
#pragma unroll
        for (int k = 0; k < PackSize; ++k) {
            v[p * PackSize + k] = in_row ? widen_at(packs[p], k) - shift : 0.0f;
            sum += v[p * PackSize + k];
        }
    }
    const float inv_cols = 1.0f / static_cast<float>(cols);
    const float total = warp_reduce<Sum, GroupWidth>(sum);  // every lane sums, even past the last row
    const float mean = kShifted ? total * inv_cols : rounded_mean(total, inv_cols);  // 16-bit: rounded once
    float m2 = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
        const bool in_row = p * GroupWidth + lane < row_packs;
#pragma unroll
        for (int k = 0; k < PackSize; ++k) {
            v[p * PackSize + k] -= mean;
            if (in_row) m2 += v[p * PackSize + k] * v[p * PackSize + k];
        }
    }
    m2 = warp_reduce<Sum, GroupWidth>(m2);
    if (row >= rows) return;  // ...but shuffles with the others first
    // 16-bit rows: c, the mean's rounding (mean_rounding says how); fp32 rows: no c, the plain forms.
    const float correction = kShifted ? 0.0f : mean_rounding(total, mean, cols, inv_cols);
    const float rstd = kShifted ? rsqrtf(m2 * inv_cols + eps)
                                : rsqrtf(variance_plus_eps(m2, correction, inv_cols, eps));
    const float output_shift = -correction * rstd;
    if (lane == 0) write_statistics(mean_out, rstd_out, row, kShifted ? shift + mean : mean + correction, rstd);
    P* out = reinterpret_cast<P*>(y + row * cols);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
        const long long at = p * GroupWidth + lane;
        if (at < row_packs) {
            const P scale = affine.weight_pack(p, at), offset = affine.bias_pack(p, at);
            P result;
#pragma unroll
            for (int k = 0; k < PackSize; ++k) {
                const float normalized = kShifted ? v[p * PackSize + k] * rstd
                                                  : fmaf(v[p * PackSize + k], rstd, output_shift);
                result.values[k] = narrow<T>(normalized * widen_at(scale, k) + widen_at(offset, k));
            }
            store_pack(out + at, result);
        }
    }
}

// Value `half` (0: the low one) of a 32-bit word holding two 16-bit values, as a float. A
// bfloat16 pair is widened as the lane groups widen theirs (widen_at masks or shifts the
// word: a bfloat16 is the top half of a float). A half is converted from its 16 bits: seen
// as a Pack<__half, 2>, the compiler first moved each half into a register of its own
// (64 PRMTs in the kernel below, local compile, 2026-11-27).
template <typename T> __device__ __forceinline__ float widen_half_of(unsigned word, int half);
template <> __device__ __forceinline__ float widen_half_of<__half>(unsigned word, int half) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(half ? word >> 16 : word & 0xffffu)));
}
template <> __device__ __forceinline__ float widen_half_of<__nv_bfloat16>(unsigned word, int half) {
    Pack<__nv_bfloat16, 2> pair;
    memcpy(&pair, &word, 4);
    return widen_at(pair, half);
}

// N 16-byte stores (N = 2 or 4; a stride apart), each made only where wanted, as ONE asm
// block: the compiler then computes all N packs first and issues the stores together, as
// torch.compile's kernel does. Written as `if (wanted[r]) *dst = out[r]`, it moved each pack's
// arithmetic into the branch around its store and spread the stores through the arithmetic, and
// layernorm_warp_rows ran 4.6-5.3% slower (H200, scratch, 2026-11-26, 16-bit rows of 192).
template <int N, typename P>
__device__ __forceinline__ void store_packs_if(P* dst, int stride, const P (&out)[N], const bool (&wanted)[N]) {
    static_assert(sizeof(P) == 16 && (N == 2 || N == 4), "two or four 16-byte packs");
    unsigned w[N][4];
    memcpy(w, out, sizeof(w));
    if constexpr (N == 4)
        asm volatile("{\n\t.reg .pred p0, p1, p2, p3;\n\t"
                     "setp.ne.u32 p0, %20, 0;\n\tsetp.ne.u32 p1, %21, 0;\n\t"
                     "setp.ne.u32 p2, %22, 0;\n\tsetp.ne.u32 p3, %23, 0;\n\t"
                     "@p0 st.global.v4.b32 [%0], {%4, %5, %6, %7};\n\t"
                     "@p1 st.global.v4.b32 [%1], {%8, %9, %10, %11};\n\t"
                     "@p2 st.global.v4.b32 [%2], {%12, %13, %14, %15};\n\t"
                     "@p3 st.global.v4.b32 [%3], {%16, %17, %18, %19};\n\t}"
                     ::"l"(dst), "l"(dst + stride), "l"(dst + 2 * stride), "l"(dst + 3 * stride),
                       "r"(w[0][0]), "r"(w[0][1]), "r"(w[0][2]), "r"(w[0][3]), "r"(w[1][0]), "r"(w[1][1]),
                       "r"(w[1][2]), "r"(w[1][3]), "r"(w[2][0]), "r"(w[2][1]), "r"(w[2][2]), "r"(w[2][3]),
                       "r"(w[3][0]), "r"(w[3][1]), "r"(w[3][2]), "r"(w[3][3]), "r"(static_cast<unsigned>(wanted[0])),
                       "r"(static_cast<unsigned>(wanted[1])), "r"(static_cast<unsigned>(wanted[2])),
                       "r"(static_cast<unsigned>(wanted[3]))
                     : "memory");
    else
        asm volatile("{\n\t.reg .pred p0, p1;\n\t"
                     "setp.ne.u32 p0, %10, 0;\n\tsetp.ne.u32 p1, %11, 0;\n\t"
                     "@p0 st.global.v4.b32 [%0], {%2, %3, %4, %5};\n\t"
                     "@p1 st.global.v4.b32 [%1], {%6, %7, %8, %9};\n\t}"
                     ::"l"(dst), "l"(dst + stride),
                       "r"(w[0][0]), "r"(w[0][1]), "r"(w[0][2]), "r"(w[0][3]), "r"(w[1][0]), "r"(w[1][1]),
                       "r"(w[1][2]), "r"(w[1][3]), "r"(static_cast<unsigned>(wanted[0])),
                       "r"(static_cast<unsigned>(wanted[1]))
                     : "memory");
}

// The sums of a warp's Rows rows (2 or 4), each left in every lane, in 2 * Rows + 4 - log2(Rows)
// shuffles where a whole-warp reduction of each would take 5 * Rows (and as many adds). The first
// log2(Rows) levels trade rows instead of reducing all of them: across lanes 16 apart a lane keeps
// half of the rows' sums (the upper lane the upper half) and sends the other half; across lanes 8
// apart, half of what is left; and so on until a lane holds one row, row lane / (32 / Rows). The
// levels left finish that row, and lane (32 / Rows) * r hands row r's total to every lane. Four
// rows: 10 shuffles and 6 adds a sum, where there were 20 and 20; two rows: 7 and 5, for 10 and 10.
// Reducing row by row, layernorm_warp_rows<T, 1, 4> compiled to 456 SASS instructions (sm_90), 40
// of them shuffles; with this, to 424, 20 of them (and to 400 with its loads issued together; what
// the two gained: the kernel's comment).
template <int Rows>
__device__ __forceinline__ void warp_sum_rows(float (&sums)[Rows], int lane) {
    static_assert(Rows == 2 || Rows == 4, "two or four rows a warp");
    float part[Rows];  // part[i]: the partial sum of the i-th row this lane still holds
#pragma unroll
    for (int r = 0; r < Rows; ++r) part[r] = sums[r];
#pragma unroll
    for (int held = Rows, across = 16; held > 1; held /= 2, across /= 2) {
        const bool upper = lane & across;
#pragma unroll
        for (int i = 0; i < held / 2; ++i) {
            const float keep = upper ? part[held / 2 + i] : part[i], send = upper ? part[i] : part[held / 2 + i];
            part[i] = keep + __shfl_xor_sync(0xffffffffu, send, across);
        }
    }
    float own = part[0];
#pragma unroll
    for (int across = 16 / Rows; across >= 1; across /= 2) own += __shfl_xor_sync(0xffffffffu, own, across);
#pragma unroll
    for (int r = 0; r < Rows; ++r) sums[r] = __shfl_sync(0xffffffffu, own, 32 / Rows * r);
}

// Step 4, 16-bit rows of 21 to 31 packs (168 to 248 values), and of 43 to 63 and 71 to 95
// (344 to 504, 568 to 760; helpers/layernorm_kernels.py's WARP_ROWS, bf16 480 and 496 aside:
// WARP_ROWS_EXCEPT), laid out as torch.compile's generated kernel lays them out: a whole warp
// per row, lane l holding the row's 16-byte packs l, l + 32, ... (Packs of them; lanes past the
// row idle), Rows rows side by side in each warp (a block): four rows of a pack a lane, two rows
// of two or three. The lane groups hold a row of 192 values in 8 lanes of three packs, or leave
// slots empty (200 values: 25 packs in 16 lanes of two); here each lane holds Packs packs of each
// of Rows rows.
// Two and three packs a lane were measured in a scratch form of this kernel, then as committed
// (H200, 2026-11-27; the numbers are above WARP_ROWS, and in the chapter's section "Two rows a
// warp"); the rest of this comment measured a pack a lane, four rows.
// From that kernel's program, each measured against it (H200, scratch, 2026-11-26, rotated
// turns, 16-bit rows of 192): the row kept as loaded, in 32-bit words, each value widened
// from its word (halves held in a pack that starts at zero were first moved into registers
// of their own, 64 PRMTs, 1.2% slower); offsets in 32 bits (the host keeps (rows + Rows - 1)
// * cols / 8 below 2^31; in 64 bits the compiler ordered the work otherwise, 0.5-2% slower);
// weight and bias loaded once the first sums are issued, one pack a lane for all four
// rows, kept in L1; every row's output computed before any is stored. Of ours: x through
// the read-only path (ld.global.nc: 0.1-0.5% faster than its plain ld.global), rstd by the
// approximate rsqrt with no denormal path (m2 / cols + eps >= eps), and the mean's rounding.
// The mean's rounding (mean_rounding above): at 10^4 most of N(0, 1) rounds to one fp16
// value, and without it this kernel's outputs on such rows were 0.13-0.22 of their scale off
// (fp16 and bf16 rows of 184 to 248 values at 10^4 + N(0, 1), H200, 2026-11-26). The lane
// groups then took x[row][0] off every value first (fp32 ones still do); here that shift cost
// a shuffle from lane 0 that waits on the row (0.8-2.2%) or a load by every lane (1.6-4.5%).
// Computed, the rounding costs an FFMA where the uncorrected output has an FMUL; subtracting
// c from every value instead cost 0.6-1.9%.
// Two more of ours, from our SASS read beside that kernel's (dumped on the H200, 2026-11-27).
// It reduces each row by its own whole-warp shuffles, 40 in all, as this kernel did;
// warp_sum_rows trades rows between lanes and takes 20. And each row's pack is one
// offset from own_pack (an IMAD.WIDE a load, the four loads within 10 instructions), where
// the pointer was rebuilt for each row (LDC, LEA, LEA.HI.X; the four loads over 35).
// 456 -> 400 SASS instructions (torch.compile's kernel: 416; written for any Packs and Rows, as
// now, the four-row form compiles to 392, the same loads, shuffles and stores). Speed over
// torch.compile's, five measurements in rotated turns, 256 MiB (H200, scratch, 2026-11-27),
// before -> after:
// bf16 184 values 0.979-0.980 -> 0.999, 192 0.997-0.998 -> 0.999-1.000, 248 0.997-0.998 ->
// 0.998-0.999; fp16 184 0.993-0.994 -> 0.999-1.001, 192 level, 232 0.996-0.997 ->
// 0.998-0.999. The exchange of rows alone gave most of it (bf16 184: 0.994), the offsets
// alone 0.986.
// No statistics: written from here they cost 4-6% in the forms we tried (the dispatcher gives
// rows whose mean and rstd are wanted to the lane groups), so the host refuses their pointers.
// RowLength, when not 0, compiles the row length in, as torch.compile compiles it in: the host
// launches such an instance for rows of that length only (layer_norm() does at the lengths of
// helpers/layernorm_kernels.py's ROW_LENGTH_COMPILED_IN). 392 SASS instructions become 368 (three
// packs: 544 -> 504). Against the kernel with the length as an argument (H200, scratch, 2026-11-27,
// three measurements in rotated turns, 256 MiB): +0.3 to +2.0% at 160-176 values, +0.1 to +1.4% at
// 336-360, +0.3 to +2.3% at 552-600 (where a lane's last pack lies past the row for many lanes);
// -0.2 to +0.2% from 184 to 512 otherwise, -0.1 to -0.7% from 632 to 768. fp16 168: 0.990 ->
// 1.002-1.003x torch.compile's speed.
template <typename T, int Packs, int Rows, int RowLength = 0>
__global__ void __launch_bounds__(32)
layernorm_warp_rows(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                    T* __restrict__ y, float* __restrict__, float* __restrict__, long long rows, long long cols,
                    float eps) {
    if constexpr (RowLength > 0) cols = RowLength;  // everything computed from cols folds
    static_assert(sizeof(T) == 2, "16-bit values");
    constexpr int kPack = 8;  // values a pack
    using P = Pack<T, kPack>;
    const int lane = threadIdx.x % 32;  // one warp a block; % 32: the form measured (without, the SASS differs)
    const int row_packs = static_cast<int>(cols) / kPack;
    const int first = blockIdx.x * Rows;  // this warp's first row
    const int own_pack = first * row_packs + lane;  // the lane's first pack of row `first`; of row first + r,
                                                    // pack p: + r * row_packs + 32 * p
    const uint4* in = reinterpret_cast<const uint4*>(x);
    bool in_row[Packs];  // pack p of the lane lies in the row
#pragma unroll
    for (int p = 0; p < Packs; ++p) in_row[p] = lane + 32 * p < row_packs;
    // A pack past the row, or a row past the last, holds zeros: they add nothing to the sums.
    unsigned words[Rows][Packs][4];
    bool stored[Packs][Rows];
#pragma unroll
    for (int r = 0; r < Rows; ++r)
#pragma unroll
        for (int p = 0; p < Packs; ++p) {
            stored[p][r] = in_row[p] && first + r < static_cast<int>(rows);
            uint4 pack = make_uint4(0u, 0u, 0u, 0u);
            if (stored[p][r]) pack = in[own_pack + r * row_packs + 32 * p];
            words[r][p][0] = pack.x, words[r][p][1] = pack.y, words[r][p][2] = pack.z, words[r][p][3] = pack.w;
        }
    const float inv_cols = __fdividef(1.0f, static_cast<float>(cols));
    float v[Rows][Packs * kPack], sum[Rows];
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
        sum[r] = 0.0f;
#pragma unroll
        for (int k = 0; k < Packs * kPack; ++k) {
            v[r][k] = widen_half_of<T>(words[r][k / kPack][k % kPack / 2], k % 2);
            sum[r] += v[r][k];
        }
    }
    warp_sum_rows<Rows>(sum, lane);
    // Weight and bias, once the sums are under way. Where pack p lies past the row, scale[p] and
    // offset[p] are left unwritten: the outputs made from them are never stored (stored[p][r] is
    // false), but reading them is, by the letter of C++, undefined. Each way we tried of giving them
    // a value was slower at some length (H200, scratch, 2026-11-27, three measurements in rotated
    // turns, 256 MiB): pack 0 loaded there, 1.8-1.9% at bf16 352; the load predicated inside its
    // asm, 1.2-1.3% at bf16 352 and 400 (on the bound compared in the asm, 1.4-1.5% at bf16 400);
    // an empty asm that defines them in an else, 5.1-5.3% at fp16 400.
    P scale[Packs], offset[Packs];
#pragma unroll
    for (int p = 0; p < Packs; ++p)
        if (in_row[p]) {
            scale[p] = load_with_hint<Reuse::KeptInL1>(reinterpret_cast<const P*>(weight) + lane + 32 * p);
            offset[p] = load_with_hint<Reuse::KeptInL1>(reinterpret_cast<const P*>(bias) + lane + 32 * p);
        }
    float m2[Rows], correction[Rows];
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
        const float mean0 = rounded_mean(sum[r], inv_cols);
        correction[r] = mean_rounding(sum[r], mean0, cols, inv_cols);
#pragma unroll
        for (int p = 0; p < Packs; ++p) {
            float squares = 0.0f;
#pragma unroll
            for (int k = p * kPack; k < (p + 1) * kPack; ++k) {
                v[r][k] -= mean0;
                squares += v[r][k] * v[r][k];
            }
            squares = in_row[p] ? squares : 0.0f;  // a pack past the row: its zeros, less the mean, are not zero
            m2[r] = p == 0 ? squares : m2[r] + squares;
        }
    }
    warp_sum_rows<Rows>(m2, lane);
    float rstd[Rows], shift[Rows];
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
        const float variance = variance_plus_eps(m2[r], correction[r], inv_cols, eps);
        asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(rstd[r]) : "f"(variance));
        shift[r] = -correction[r] * rstd[r];
    }
    P out[Packs][Rows];
#pragma unroll
    for (int p = 0; p < Packs; ++p)
#pragma unroll
        for (int r = 0; r < Rows; ++r)
#pragma unroll
            for (int k = 0; k < kPack; ++k)
                out[p][r].values[k] = narrow<T>(fmaf(v[r][p * kPack + k], rstd[r], shift[r]) * widen_at(scale[p], k) +
                                                widen_at(offset[p], k));
#pragma unroll
    for (int p = 0; p < Packs; ++p)
        store_packs_if<Rows>(reinterpret_cast<P*>(y) + own_pack + 32 * p, row_packs, out[p], stored[p]);
}

// Blocks an SM the compiler must leave registers for (__launch_bounds__' second argument;
// 0: no bound). 16-bit rows of 2048 values, 64 threads of 32 values: counting the columns
// in 32 bits took the fp16 kernel from 40 registers to 48 (25 blocks an SM to 21), and its
// rows from 4,061 to 3,978 GB/s in the recording. Twenty-two blocks leave at most 46
// registers, and it takes 40 again, with no spill (asking for 25 left 40 and it took 32
// and spilled 8 bytes). In turns (H200, 2026-11-28, 256 MiB, three measurements): fp16
// 65536 x 2048 135.6 -> 133.7 us (+1.3-1.4%); bf16, at 40 registers already, level.
template <typename T, int PackSize, int ColsPerThread, int BlockSize, bool Edges>
constexpr int kMinBlocksPerSM =
    sizeof(T) == 2 && PackSize == 8 && ColsPerThread == 32 && BlockSize == 64 && !Edges ? 22 : 0;

// Step 4, long rows: the row in the registers of a block, or of a cluster of
// ClusterSize blocks (block `rank` holds columns [rank * slice, (rank + 1) *
// slice), slice = BlockSize * ColsPerThread), as in softmax's cluster kernel.
// Each thread's exact (count, mean, M2) of x - x[row][0]; one block merge (one barrier); for a
// cluster, one exchange through distributed shared memory. The row crosses HBM
// once. Launch: rows * ClusterSize blocks, in clusters of ClusterSize along x.
// Edges: rows the pack does not divide (RowEdges, edges.cuh). The slices are of the
// row's aligned middle, weight and bias realigned to it (Affine's Shifted); a thread
// with an edge value adds it to its state and writes its output alone.
// WeightKeptInL1: weight and bias loaded with L1::evict_last, so that L1 keeps them from
// one row to the next over the row's own lines, which arrive with the default priority.
// The host asks for it where a block of 1024 threads holds the row and weight and bias
// together take more than 160 KiB (rows of more than 20 480 fp32 or 40 960 16-bit values),
// but for the fp32 rows that take AffineRing: there it ran level to 3% faster, and below that
// up to 1.8% slower (WEIGHT_KEPT_IN_L1 in helpers/layernorm_kernels.py, with the measurements).
// AffineRing, when not 0: weight and bias staged through that many slots of shared memory
// (StagedAffine), asked for before the row's loads; the launch gives the block AffineRing * 2 *
// BlockSize * 16 bytes of it. The host asks for four slots where a block of 1024 threads holds an
// fp32 row of more than 25 600 values: level to 7.8% faster than kept in L1 (AFFINE_RING in
// helpers/layernorm_kernels.py, with the measurements).
template <typename T, int PackSize, int ColsPerThread, int BlockSize, int ClusterSize, bool EarlyAffine,
          bool Edges = false, bool WeightKeptInL1 = false, int AffineRing = 0>
__global__ void __launch_bounds__(BlockSize, (kMinBlocksPerSM<T, PackSize, ColsPerThread, BlockSize, Edges>))
layernorm_cluster_per_row(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                          long long rows, long long cols, float eps) {
    static_assert(ColsPerThread % PackSize == 0, "whole packs");
    static_assert(!Edges || PackSize > 1, "a row of lone values has no edges");
    constexpr int kPacks = ColsPerThread / PackSize;
    constexpr long long kSlice = static_cast<long long>(BlockSize) * ColsPerThread;
    using P = Pack<T, PackSize>;
    const long long row = blockIdx.x / ClusterSize, rank = blockIdx.x % ClusterSize;
    // A middle of M packs with a head reads M + 1 packs of weight (Affine's Shifted): all inside it.
    const RowEdges<PackSize, Edges> ends(row, cols, rank == 0, (cols / PackSize - 1) * PackSize);
    // Each block of a cluster takes an equal share of the middle (cluster_share, rows.cuh). In
    // whole slices, rows that fill the cluster in part left its last blocks empty; H200,
    // 2026-11-28, in turns, 256 MiB, us, whole slices -> shares: fp16 1677 x 80000 533 -> 376,
    // 1342 x 100001 517 -> 362, 335 x 400000 274 -> 248; bf16 671 x 200000 238 -> 208; fp32
    // 479 x 140000 315 -> 268, 671 x 100001 235 -> 220. Rows that fill their shape: within
    // 0.1% (fp16 512 x 262144) or faster (fp32 1024 x 65536: 1.9-2.4%).
    // Packs count their columns in 32 bits (a row on chip is well under 2^31 values). The
    // 64-bit arithmetic before the first loads goes (fp16 1024 x 64: LOP3 37 -> 18, SHF 18 ->
    // 9), and the first load issues at instruction 30, not 52. Same day, in turns with 64
    // bits: fp16 2048 x 65536 +3.8-4.0%, 3355 x 40000 +5.7-5.9%, 4096 x 32768 +1.8-2.0%, bf16
    // 65536 x 2048 +4.5-4.8%, fp32 2048 x 32768 +2.1-2.5%; rows with Edges fp16 32760 x 4097
    // +7.3-7.5%, fp32 2047 x 32769 +5.6-6.5%; fp32 16380 x 4097 -0.2 to -0.4%; the rest within
    // 0.6%. Lone values keep 64 bits: in 32 they took more registers (fp32 512 x 32: 64 -> 98).
    using Col = cuda::std::conditional_t<(PackSize > 1), int, long long>;
    const Col share = cluster_share<PackSize, ClusterSize, static_cast<int>(kSlice)>(ends.middle_cols);
    const Col first = static_cast<Col>(rank) * share;  // the block's first column of the middle
    // 0: a block past the row's end
    const long long slice_packs = max(Col(0), min(share, static_cast<Col>(ends.middle_cols) - first) / PackSize);
    const long long offset = row * cols + ends.head + first;
    static_assert(AffineRing == 0 || (ClusterSize == 1 && !EarlyAffine && !Edges && !WeightKeptInL1),
                  "staged weight and bias: a block per row, late, aligned, not also kept in L1");
    // Staged: weight and bias asked for first (the ring's first slots), then the row; else a no-op.
    using Staging = cuda::std::conditional_t<(AffineRing > 0),
                                             StagedAffine<AffineRing, BlockSize, P, kPacks>,
                                             NoStaging>;
    const Staging staged(reinterpret_cast<const P*>(weight + first), reinterpret_cast<const P*>(bias + first),
                         threadIdx.x, slice_packs);
    P packs[kPacks];
    load_slice<BlockSize>(packs, reinterpret_cast<const P*>(x + offset), threadIdx.x, slice_packs);
    float edge = 0.0f;  // this thread's edge value, if it has one
    if (Edges && ends.col >= 0) edge = widen(x[row * cols + ends.col]);
    const Affine<EarlyAffine, BlockSize, P, kPacks, Edges, WeightKeptInL1> affine(
        reinterpret_cast<const P*>(weight + first), reinterpret_cast<const P*>(bias + first), threadIdx.x,
        slice_packs, static_cast<int>(ends.head));
    const float shift = widen(x[row * cols]);  // the same address for every thread: one load per warp
    // The fast division (WelfordState) where it measured faster: 16-byte packs, a block per row
    // (H200, 2026-11-22, in turns with IEEE division: fp32 2048 x 32768 3,426 -> 3,485 GB/s, fp16
    // 4096 x 32768 3,760 -> 3,873, bf16 8192 x 16384 3,024 -> 3,362; the other rows within 1%). In
    // clusters and with narrower packs the compiler took more registers with it (fp32 65536: 64 -> 69,
    // 3% slower; fp16 pack 2: 58 -> 80, 24% slower). Lane groups measured 0.8% slower with it, the
    // streamed kernel 5.5% (its registers fell from 36 to 32: 8 blocks an SM instead of 6).
    using State = WelfordState<sizeof(P) == 16 && ClusterSize == 1>;
    State thread_state = thread_mean_m2<BlockSize, State>(packs, threadIdx.x, slice_packs, shift);
    if (Edges && ends.col >= 0) thread_state = State::merge(thread_state, {1.0f, edge - shift, 0.0f});
    // The inbox opens here, not at the start as softmax's does: opened there, fp32 rows of 65536
    // values (256 x 32, clusters of 8) spilled 12 bytes at 64 registers; here 4, their bound predicates.
    if constexpr (ClusterSize > 1) cluster_open_inbox<State, ClusterSize>();
    State state = block_merge<State, BlockSize>(thread_state);
    if constexpr (ClusterSize > 1) state = cluster_merge<State, ClusterSize>(state);
    const float rstd = rsqrtf(state.m2 / static_cast<float>(cols) + eps);
    if (rank == 0 && threadIdx.x == 0) write_statistics(mean_out, rstd_out, row, shift + state.mean_, rstd);
    if constexpr (AffineRing > 0)
        staged.store(packs, reinterpret_cast<P*>(y + offset), state.mean_, rstd, shift);
    else
        store_slice<kAffineChunk<T, PackSize, ColsPerThread, EarlyAffine, Edges>, BlockSize,
                    kAffineAhead<T, PackSize, ColsPerThread, BlockSize, EarlyAffine, Edges>>(
            packs, reinterpret_cast<P*>(y + offset), affine, threadIdx.x, slice_packs, state.mean_, rstd, shift);
    if (Edges && ends.col >= 0)  // normalized's formula, for one value
        y[row * cols + ends.col] = narrow<T>((edge - shift - state.mean_) * rstd * widen(weight[ends.col]) +
                                             widen(bias[ends.col]));
}

// An L2 policy for loads that carry one: evict_last (keep) or evict_first (last use), for all of L2.
__device__ __forceinline__ unsigned long long l2_policy(Reuse how) {
    unsigned long long policy = 0;
    if (how == Reuse::Keep) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    if (how == Reuse::LastUse) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// A store that takes no line in L1 (st.global.L1::no_allocate), for pass 2 of
// layernorm_streamed: a plain store allocates its line in L1, where it can push out
// lines of the rows that pass 2 has yet to read again; the output never comes back to
// this SM. Under Nsight Compute (fp32 8192 x 8192, one launch, caches flushed, H200,
// 2026-11-24) the plain stores' kernel read 275.2 MB from HBM for a 268.4 MB matrix,
// and its L1 misses hit in L2 1.83 M times; with this store, 270.0 MB and 0.79 M.
// Same PTX form as store_pack, 16-byte packs only.
template <typename P>
__device__ __forceinline__ void store_past_l1(P* dst, const P& pack) {
    static_assert(sizeof(P) == 16, "16-byte packs");
    unsigned w[4];
    memcpy(w, &pack, 16);
    asm volatile("st.global.L1::no_allocate.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                 "r"(w[3]) : "memory");
}

// Step 5, the row read twice, as torch.compile's generated kernel does it for fp32
// rows of a few thousand values: a block per row, ColsPerThread values a thread.
// Pass 1 loads the row and takes its mean and M2 of x - x[row][0] in two passes over
// the registers and two block sums (slice_mean_m2); the values are then dropped, not
// kept. Pass 2 loads the row again, with weight and bias, and stores.
// Chan's merges of the threads' states, as the register path takes them, measured far
// slower with two packs a thread (H200, 2026-11-23, in turns with the sums: fp32
// 65536 x 2048 in 256 x 8, 3,306 against 4,222 GB/s; 32768 x 4096 in 512 x 8, with the
// fast division, 3,822 against 4,137). In 512 x 16 it is mixed: with the fast division
// the merges were ahead on full rows (16384 x 8192: 4,191 against 4,088; 30011 x 8192:
// 4,256 against 4,117) and behind on ragged ones (20000 x 6000: 3,890 against 4,193);
// why, not found. The sums serve every shape.
// The row crosses HBM once only if the second read finds it on chip, so the loads
// carry cache hints (CacheHints): pass 1 asks L1 and L2 to keep the row
// (evict_last), pass 2 says it is the last use (evict_first), so that the row makes
// room for the rows after it, and its stores take no line in L1 (store_past_l1). In
// turns with plain stores (H200, 2026-11-24, 256 MiB, us): 8192 values 133.25 ->
// 131.87, 7000 131.97 -> 131.78, 6000 131.46 -> 130.85, 5000 131.26 -> 130.53, 4096
// 129.92 -> 129.54, 3000 144.22 -> 143.01, 2048 level. (The register paths, which
// read the row once, keep plain stores: with this one, lane groups were 0.2-0.4%
// slower at fp32 256-1024 and bf16 1024, blocks and clusters within 0.2% but for fp16
// 32768, 0.5% faster.) What the path can buy over the register path: the values hold
// no registers across the block merge, so an SM may hold more rows.
// Its two divisions, the mean's and the variance's, are the fast ones (__fdividef): a
// thread's whole share of a row is two to four packs a pass, and the IEEE division's
// instructions and slow-path branch showed (H200, 2026-11-24, in turns: 16384 x 4096
// 130.6 -> 129.3 us, 32768 x 4096 255.6 -> 252.7; level at 2048, 6000 and 8192 values).
template <typename T, int PackSize, int ColsPerThread, int BlockSize, bool CacheHints>
__global__ void __launch_bounds__(BlockSize)
layernorm_streamed(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                   T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                   long long rows, long long cols, float eps) {
    static_assert(ColsPerThread % PackSize == 0, "whole packs");
    constexpr int kPacks = ColsPerThread / PackSize;
    constexpr Reuse kFirstRead = CacheHints ? Reuse::Keep : Reuse::ReadOnly;
    constexpr Reuse kSecondRead = CacheHints ? Reuse::LastUse : Reuse::ReadOnly;
    using P = Pack<T, PackSize>;
    const long long row = blockIdx.x, row_packs = cols / PackSize;
    const P* in = reinterpret_cast<const P*>(x + row * cols);
    float shift;
    MeanM2 state;
    {  // pass 1: the packs live only until the thread's state is taken
        const unsigned long long keep = l2_policy(kFirstRead);
        P packs[kPacks];
        load_slice<BlockSize>(packs, in, threadIdx.x, row_packs,
                              [keep](const P* slice, int index) {
                                  return load_with_hint<kFirstRead>(&slice[index], keep);
                              });
        shift = widen(x[row * cols]);
        state = slice_mean_m2<BlockSize, true>(packs, threadIdx.x, row_packs, shift);
    }
    const float rstd = rsqrtf(WelfordState<true>::divide(state.m2, static_cast<float>(cols)) + eps);
    if (threadIdx.x == 0) write_statistics(mean_out, rstd_out, row, shift + state.mean_, rstd);
    // pass 2: one pack at a time, its three loads issued before its store
    const unsigned long long last_use = l2_policy(kSecondRead);
    const P *w = reinterpret_cast<const P*>(weight), *b = reinterpret_cast<const P*>(bias);
    P* out = reinterpret_cast<P*>(y + row * cols);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
        const long long at = p * BlockSize + threadIdx.x;
        if (at < row_packs) {
            const P values = load_with_hint<kSecondRead>(&in[at], last_use);
            const P scale = load_with_hint<Reuse::ReadOnly>(&w[at]);
            const P offset = load_with_hint<Reuse::ReadOnly>(&b[at]);
            const P result = normalized(values, scale, offset, state.mean_, rstd, shift);
            if constexpr (CacheHints) store_past_l1(out + at, result); else store_pack(out + at, result);
        }
    }
}

// Step 1, unfused: three kernels, as a framework without fusion would run them,
// each reading the matrix: the row means, the row rstds (from the squares about
// those means, so no cancellation), then the elementwise normalization. The
// matrix is read three times and written once, the two per-row vectors written
// and read back: three launches and about 4 * rows * cols * sizeof(T) bytes.
template <typename T, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
unfused_row_mean(const T* __restrict__ x, float* __restrict__ row_mean, long long rows, long long cols) {
    float s = 0.0f;
    for (long long c = threadIdx.x; c < cols; c += BlockSize) s += widen(x[blockIdx.x * cols + c]);
    s = block_reduce<Sum, BlockSize>(s);
    if (threadIdx.x == 0) row_mean[blockIdx.x] = s / static_cast<float>(cols);
}
template <typename T, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
unfused_row_rstd(const T* __restrict__ x, const float* __restrict__ row_mean, float* __restrict__ row_rstd,
                 long long rows, long long cols, float eps) {
    const float mean = row_mean[blockIdx.x];
    float s = 0.0f;
    for (long long c = threadIdx.x; c < cols; c += BlockSize) {
        const float d = widen(x[blockIdx.x * cols + c]) - mean;
        s += d * d;
    }
    s = block_reduce<Sum, BlockSize>(s);
    if (threadIdx.x == 0) row_rstd[blockIdx.x] = rsqrtf(s / static_cast<float>(cols) + eps);
}
template <typename T>
__global__ void unfused_normalize(const T* __restrict__ x, const float* __restrict__ row_mean,
                                  const float* __restrict__ row_rstd, const T* __restrict__ weight,
                                  const T* __restrict__ bias, T* __restrict__ y, long long rows, long long cols) {
    const long long n = rows * cols;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long row = i / cols, col = i - row * cols;
        y[i] = narrow<T>((widen(x[i]) - row_mean[row]) * row_rstd[row] * widen(weight[col]) + widen(bias[col]));
    }
}
