// Pack<T, N>: N consecutive values of T that travel as ONE memory access.
//
// Shared by every chapter. alignas(sizeof(T) * N) is what lets the compiler
// turn a load of a Pack into a single vector instruction: with N * sizeof(T)
// equal to 8 or 16 bytes, a Pack load becomes LDG.E.64 or LDG.E.128 in SASS
// instead of N separate narrow loads. The price is a promise: the address of
// every Pack must be a multiple of its size. The host side checks that promise
// before a launch (check_operands, helpers/operands.py), because breaking it is
// a misaligned-address fault that destroys the CUDA context.
#pragma once

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    static_assert(N >= 1 && (N & (N - 1)) == 0, "pack size must be a power of two");
    static_assert(sizeof(T) * N <= 16, "a single access moves at most 16 bytes on sm_90");
    T values[N];
};
