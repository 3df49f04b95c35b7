// What the row kernels share (softmax, chapter 4; LayerNorm, chapter 5): widening
// a value of a pack held in registers, storing a pack as one access, and
// reductions whose partial result is more than one float (softmax's running
// (max, sum), LayerNorm's (count, mean, M2)).
//
// A State is a struct of 4-byte fields with
//     static State identity();                 // merges with anything as a no-op
//     static State merge(State a, State b);    // associative (up to rounding)
// and is reduced in ONE round per level: shuffles within a warp, one barrier
// within a block, one exchange through distributed shared memory within a
// thread-block cluster. Merging whole states, instead of reducing one float and
// then another, is what lets a row's two statistics cost one reduction.
#pragma once
#include "convert.cuh"
#include "pack.cuh"

// Value k of a pack, as a float. A bf16 is the top half of a float: a pair of them in one
// 32-bit word widens with a shift (the low one) and a mask (the high one), the word kept
// whole. Widened one bf16 at a time (the header's conversion takes a 16-bit register),
// every word was split in two registers first (PRMT): a row held in bf16 took half as
// many registers again as in fp16 (LayerNorm's cluster path, 256 x 64: 96 against 64), so
// half the blocks an SM. H200, 2026-11-23, in turns: LayerNorm bf16 8192 x 16384 3,344 ->
// 4,003 GB/s (torch.compile 3,982); 2048 x 65536 2,089 -> 3,180 (its spills gone).
template <typename T, int N>
__device__ __forceinline__ float widen_at(const Pack<T, N>& pack, int k) { return widen(pack.values[k]); }
template <int N>
__device__ __forceinline__ float widen_at(const Pack<__nv_bfloat16, N>& pack, int k) {
    if constexpr (N == 1) {
        return widen(pack.values[0]);  // a lone value: no pair to keep whole
    } else {
        unsigned word;
        memcpy(&word, &pack.values[k & ~1], 4);
        return __uint_as_float(k % 2 ? word & 0xffff0000u : word << 16);
    }
}

// a / b rounded up, for a >= 0 and b > 0 (a caller that may pass a < 0 clamps the result).
template <typename I>
__device__ __forceinline__ I ceil_div(I a, I b) { return (a + b - 1) / b; }

// The columns of a row's middle (RowEdges, edges.cuh) that each block of a cluster takes:
// an equal share, in whole warps' packs, at most the block's Slice. A row that fills its
// cluster in part then leaves every block a little short of its slice. Cut into whole
// slices, it kept the first blocks full and the last ones empty, holding their SMs' slots
// until the row was done: softmax.cu and layernorm.cu give what that cost. Lone values
// (PackSize 1) keep whole slices (softmax.cu tells why). In 32-bit arithmetic, as a row on
// chip is well under 2^31 values: in 64 bits LayerNorm's cluster kernels with Edges took
// 11-14 more registers (fp32 512 x 32 x 8: 61 -> 75, one block an SM instead of two).
template <int PackSize, int ClusterSize, int Slice>
__device__ __forceinline__ int cluster_share(long long middle_cols) {
    constexpr int kWarpCols = 32 * PackSize;
    if constexpr (PackSize == 1 || ClusterSize == 1) return Slice;  // a single block's slice holds the row
    return min(Slice, ceil_div(static_cast<int>(middle_cols), ClusterSize * kWarpCols) * kWarpCols);
}

// One store of a whole pack as a single access of its size. A plain `*dst = pack`
// is what the other chapters use; in softmax's cluster kernel NVVM split that
// copy into 4-byte stores (seen in its PTX: st.global.f32, four per pack, even
// through an int4), so the 8- and 16-byte cases are written in PTX.
template <typename P>
__device__ __forceinline__ void store_pack(P* dst, const P& pack) {
    if constexpr (sizeof(P) == 16) {
        unsigned w[4];
        memcpy(w, &pack, 16);
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                     "r"(w[3]) : "memory");
    } else if constexpr (sizeof(P) == 8) {
        unsigned w[2];
        memcpy(w, &pack, 8);
        asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(dst), "r"(w[0]), "r"(w[1]) : "memory");
    } else {
        *dst = pack;  // 2 or 4 bytes: one access already
    }
}

// A state moves between lanes one 32-bit word at a time.
template <typename State>
__device__ __forceinline__ State shuffle_xor(const State& s, int lane_mask) {
    static_assert(sizeof(State) % 4 == 0, "a State is made of 4-byte fields");
    constexpr int kWords = sizeof(State) / 4;
    unsigned words[kWords];
    memcpy(words, &s, sizeof(State));
#pragma unroll
    for (int k = 0; k < kWords; ++k) words[k] = __shfl_xor_sync(0xffffffffu, words[k], lane_mask);
    State out;
    memcpy(&out, words, sizeof(State));
    return out;
}

// Width < 32 merges each group of Width consecutive lanes on its own (as
// warp_reduce in reduce.cuh). Every lane of the warp must take part; every lane
// of a group ends with the group's state.
template <typename State, int Width = 32>
__device__ __forceinline__ State warp_merge(State s) {
    static_assert(Width >= 1 && Width <= 32 && (Width & (Width - 1)) == 0, "a power of two up to 32 lanes");
#pragma unroll
    for (int lane_mask = Width / 2; lane_mask > 0; lane_mask /= 2) s = State::merge(s, shuffle_xor(s, lane_mask));
    return s;
}

// Every thread of the block receives the block's state after ONE barrier: each
// warp leaves its state in shared memory, then every warp merges all of them
// (a second barrier and a broadcast slot would cost more than 32 lanes
// re-merging at most 32 states). Callers that loop must put a barrier between
// two calls: the slots are rewritten.
template <typename State, int BlockSize>
__device__ __forceinline__ State block_merge(State s) {
    static_assert(BlockSize % 32 == 0 && BlockSize <= 1024, "whole warps, at most 1024 threads");
    __shared__ State warp_states[BlockSize / 32];
    s = warp_merge(s);
    if (threadIdx.x % 32 == 0) warp_states[threadIdx.x / 32] = s;
    __syncthreads();
    const int lane = threadIdx.x % 32;
    return warp_merge(lane < BlockSize / 32 ? warp_states[lane] : State::identity());
}

// Hopper's thread-block clusters, in PTX (sm_90): the CTAs of a cluster run at
// the same time on one GPC and may write into each other's shared memory
// (distributed shared memory). A block's state reaches the others' as a message:
// st.async writes it into their shared memory and counts its bytes on their
// mbarrier, and each block waits on its own mbarrier for ClusterSize states.
// No cluster barrier stands between the blocks then, and none before exiting:
// a block's shared memory receives nothing more once it has its ClusterSize
// states. The first version published each block's state, read the others'
// between two cluster barriers (release, acquire), and waited at a third before
// exiting. A second exchange, run on states already equal, measured what those
// barriers cost: fp32 512 x 131072, 146.7 -> 160.3 us. With messages 146.4 ->
// 139.9, where the kernel without any exchange (a wrong result, the bound) took
// 136.0 (H200, 2026-11-24, in turns; the chapter's "Where a long row's time goes").
template <typename State, int ClusterSize>
struct ClusterInbox {
    static_assert(ClusterSize >= 2 && ClusterSize <= 16 && (ClusterSize & (ClusterSize - 1)) == 0, "2 to 16 blocks");
    static_assert(sizeof(State) % 4 == 0, "whole words");
    unsigned long long received;  // mbarrier: one arrival (the block's own) and ClusterSize * sizeof(State) bytes
    State states[ClusterSize];    // states[r]: the state of the block of rank r
};

template <typename State, int ClusterSize>
__device__ __forceinline__ ClusterInbox<State, ClusterSize>& cluster_inbox() {
    __shared__ ClusterInbox<State, ClusterSize> inbox;  // one per kernel, whatever calls it
    return inbox;
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// One cp.async of Bytes (4, 8 or 16) from global to shared memory, past the registers
// (softmax's shared part of a row, LayerNorm's staged weight and bias). 16 bytes go .cg:
// through L2 only, past L1, since each is read once; .cg takes nothing smaller, so 4 and
// 8 bytes go .ca. Offset is added to both addresses as an immediate, so that a thread
// copying several packs keeps one base register per side (a pointer per pack would cost
// two registers each).
template <int Bytes, int Offset = 0>
__device__ __forceinline__ void cp_async_bytes(unsigned shared_to, const void* global_from) {
    static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async moves 4, 8 or 16 bytes");
    if constexpr (Bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%2], 16;" ::"r"(shared_to), "l"(global_from),
                     "n"(Offset) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0+%2], [%1+%2], %3;" ::"r"(shared_to), "l"(global_from),
                     "n"(Offset), "n"(Bytes) : "memory");
}

// Every thread, before cluster_merge (softmax: at the kernel's start): thread 0 makes
// the inbox's mbarrier, and the block arrives (relaxed: nothing to publish yet) at the
// cluster barrier that cluster_merge waits on before it writes into other blocks'
// inboxes. Opened early, every block has long arrived by then: the wait costs nothing.
template <typename State, int ClusterSize>
__device__ __forceinline__ void cluster_open_inbox() {
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;"
                     :: "r"(shared_address(&cluster_inbox<State, ClusterSize>().received)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // seen by the other blocks' writes
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// The cluster's state, from each block's (every thread of a block holds its block's
// state, as block_merge leaves it). Every thread must call it, after
// cluster_open_inbox. Thread 0 announces the bytes to come; threads 0 to ClusterSize-1
// each send the block's state to one block (its own included), in one message of 8
// bytes or a word at a time; then every thread waits until its inbox holds the
// ClusterSize states and merges them.
template <typename State, int ClusterSize>
__device__ __forceinline__ State cluster_merge(State block_state) {
    ClusterInbox<State, ClusterSize>& inbox = cluster_inbox<State, ClusterSize>();
    const unsigned received = shared_address(&inbox.received);
    if (threadIdx.x == 0) {
        unsigned long long token;  // the barrier's phase (unused: the inbox is used once)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;"
                     : "=l"(token) : "r"(received), "r"(static_cast<unsigned>(ClusterSize * sizeof(State))) : "memory");
    }
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // every block's inbox is made
    if (threadIdx.x < ClusterSize) {
        unsigned my_rank, slot, counter;
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(my_rank));
        // mapa: the same shared-memory address in the block of rank threadIdx.x
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                     : "=r"(slot) : "r"(shared_address(&inbox.states[my_rank])), "r"(threadIdx.x));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(counter) : "r"(received), "r"(threadIdx.x));
        constexpr int kWords = sizeof(State) / 4;
        unsigned words[kWords];
        memcpy(words, &block_state, sizeof(State));
        if constexpr (sizeof(State) == 8) {  // one message (8-byte aligned: the mbarrier comes first)
            asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];"
                         :: "r"(slot), "r"(words[0]), "r"(words[1]), "r"(counter) : "memory");
        } else {
#pragma unroll
            for (int k = 0; k < kWords; ++k)
                asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                             :: "r"(slot + 4 * k), "r"(words[k]), "r"(counter) : "memory");
        }
    }
    unsigned arrived;
    do {  // try_wait suspends the thread for a while when the states are not all there yet
        asm volatile("{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [%1], 0; "
                     "selp.u32 %0, 1, 0, done; }"
                     : "=r"(arrived) : "r"(received) : "memory");
    } while (!arrived);
    const int lane = threadIdx.x % 32;
    return warp_merge(lane < ClusterSize ? inbox.states[lane] : State::identity());
}
