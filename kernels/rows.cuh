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

// One store of a whole pack as a single access of its size. A plain `*dst = pack`
// is what the other chapters use; in softmax's cluster kernel NVVM split that
// copy into 4-byte stores (seen in its PTX: st.global.f32, four per pack, even
// through an int4), so the 8- and 16-byte cases are written in PTX.
template <typename P>
__device__ __forceinline__ void store_pack(P* dst, const P& pack) {
    if constexpr (sizeof(P) == 16) {
        unsigned w[4];
        memcpy(w, &pack, 16);
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
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
// the same time on one GPC, may read each other's shared memory (distributed
// shared memory) and may wait for each other at a cluster barrier.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// The State at the same shared-memory address in the CTA of rank `rank`:
// mapa turns the local address into the other CTA's, ld.shared::cluster reads it.
template <typename State>
__device__ __forceinline__ State load_from_cluster_rank(const State* local, unsigned rank) {
    constexpr int kWords = sizeof(State) / 4;
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(local));
    unsigned words[kWords];
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
        unsigned remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address + 4 * k), "r"(rank));
        asm volatile("ld.shared::cluster.b32 %0, [%1];" : "=r"(words[k]) : "r"(remote) : "memory");
    }
    State s;
    memcpy(&s, words, sizeof(State));
    return s;
}

// The cluster's state, from each block's (every thread of a block holds its
// block's state, as block_merge leaves it): thread 0 publishes it in shared
// memory, a cluster barrier makes it visible, and every warp reads and merges
// the ClusterSize states. Before exiting, the caller must cluster_wait() for the
// arrive at the end: no block may leave while another can still read its state.
template <typename State, int ClusterSize>
__device__ __forceinline__ State cluster_merge(State block_state) {
    static_assert(ClusterSize >= 2 && ClusterSize <= 16 && (ClusterSize & (ClusterSize - 1)) == 0, "2 to 16 blocks");
    __shared__ State published;
    if (threadIdx.x == 0) published = block_state;
    cluster_arrive();  // release: published is visible to the cluster...
    cluster_wait();    // ...once every block has arrived (acquire)
    const int lane = threadIdx.x % 32;
    const State s = warp_merge(lane < ClusterSize ? load_from_cluster_rank(&published, lane) : State::identity());
    cluster_arrive();  // done reading the others' shared memory
    return s;
}
