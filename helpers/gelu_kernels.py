"""Chapter 2's GELU kernels (kernels/gelu.cu), host side.

``GeluVariant`` says how each kernel is launched and what it may be given;
``gelu()`` is the library entry point that picks the widest aligned pack (and the
scalar path for misaligned pointers); ``check_gelu`` compares against a float64
reference with the tolerances stated in the chapter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import device
from .arith import ceil_div
from .device import DeviceArray
from .errors import InputError
from .operands import (C_TYPES, ElementwiseVariant, HostReferences, InputPool, full_pack, np_dtype,
                       torch_compiled_for_shape, torch_module, torch_tensor, widest_pack, within, written_over_poison)

SOURCE = "gelu.cu"
SOURCES = ["kernels/gelu.cu", "kernels/pack.cuh", "kernels/convert.cuh"]
MATHS = {"tanh": 0, "erf": 1, "tanh_approx": 2, "half2": 3, "sigmoid": 4}  # GeluMath in gelu.cu
PACKS_PER_THREAD = (1, 2, 4)
# gelu() gives each thread the fewest packs that make its grid ONE WAVE: no more blocks
# than the GPU holds at once (SMs x threads an SM holds / BLOCK threads), so no block waits
# for another to finish. One pack while one wave covers the array (up to 4 MiB of input on
# the H200 in blocks of 128 threads; below half a wave, SMALL_ARRAY_VALUES values), two or four
# packs above that while they still do, at most MOST_VALUES_PER_THREAD values a thread (16-bit
# inputs: two packs; four hold 32 values a thread and measured slowest, 0.89-0.98x PyTorch eager
# at 0.5-4 MiB); one pack when no count gives one wave (past 16 MiB of fp32, 8 MiB of fp16),
# where many waves make the last one's tail small. Measured on the H200 in rotated turns
# (2026-11-25): at 8-16 MiB, where one pack per thread makes two to four waves, the count of one
# wave was 1-5% faster than one pack.
MOST_VALUES_PER_THREAD = 16
# SMALL_ARRAY_VALUES: below half a wave of one pack a thread, each thread takes 8 values (two 16-byte
# packs of fp32, one of fp16 and bf16), as PyTorch's elementwise kernel does, so long as every SM still
# gets a block. With 32-bit positions only: two packs of fp32 against one, best PyTorch kernel / ours,
# median over four output buffers in rotated turns (H200, 2026-11-26, scratch): 1 MiB 1.005 against
# 0.991 (64-bit: 0.986 against 0.988), 2 MiB 1.006 against 0.997 (0.995, 0.995); on an H100 the same
# day 1.015 against 0.994 and 1.005 against 0.995, and at 4 MiB (a whole wave of one pack) 1.002
# against 1.015. fp16 with two packs (16 values): 0.962-0.996 on the H200 at 0.5-2 MiB.
SMALL_ARRAY_VALUES = 8
THREADS_PER_SM = 2048  # sm_90; gelu()'s kernels use at most 32 registers, so threads are the limit
# Without a GPU the dispatcher decides for the GPU the book was recorded on (the H200's 132
# SMs and 60 MiB of L2), so that the configurations it names are the recorded ones.
RECORDED_SM_COUNT = 132
RECORDED_L2_BYTES = 60 << 20
# gelu() loads read-once (evict-first, step 7) while its input is at most this many L2s. Measured
# on the H200 in rotated turns (2026-11-25), recording / scratch run: 0.4-1.3% / 1-5% faster up to
# 32 MiB of input (from 8 MiB of fp32, 4 MiB of fp16); at 64 MiB 0.7-1.1% slower / 1.1-1.8% faster;
# from 256 MiB up 1-2% slower in both; level within the noise below 4-8 MiB.
EVICT_FIRST_UP_TO_L2S = 1
# 32-bit positions in the packed kernel: every index it forms stays below n + 4096 (packs past the
# last one a thread may test, the tail), so 2^30 values leave room to spare.
INDEX32_MOST = 1 << 30

# Largest allowed error, as max |y - reference| / max(1, |x|): GELU's output has
# the size of its input, so this is a relative error for |x| > 1 and an absolute
# one near zero (where GELU crosses zero and a pure relative error is meaningless).
# Each bound is a few times the error we expect from the arithmetic and from
# rounding the output to its dtype (half an ulp: 2^-24, 2^-11, 2^-8 relative).
TOLERANCE = {
    ("float32", "tanh"): 2e-6, ("float32", "erf"): 2e-6, ("float32", "sigmoid"): 2e-6,
    ("float32", "tanh_approx"): 2e-3,
    ("float16", "tanh"): 1.5e-3, ("float16", "erf"): 1.5e-3, ("float16", "sigmoid"): 1.5e-3,
    ("float16", "tanh_approx"): 3e-3, ("float16", "half2"): 8e-3,
    ("bfloat16", "tanh"): 1e-2, ("bfloat16", "erf"): 1e-2, ("bfloat16", "sigmoid"): 1e-2,
    ("bfloat16", "tanh_approx"): 1.2e-2,
}
# A share of the inputs has a large magnitude, up to this: GELU must give x (or 0)
# there, never NaN, even where x^3 overflows the storage format.
LARGE = {"float32": 1e30, "float16": 6.0e4, "bfloat16": 1e30}


def bytes_moved(n: int, dtype) -> int:
    """GELU reads n elements and writes n elements: 2 * n * sizeof(T) bytes."""
    return 2 * int(n) * np_dtype(dtype).itemsize


@dataclass(frozen=True)
class GeluVariant(ElementwiseVariant):
    kernel: str = "packed"
    pack_size: int = 4
    math: str = "tanh"  # one of MATHS
    packs_per_thread: int = 1  # the packed kernel: packs each thread loads before computing
    evict_first: bool = False  # the packed kernel: load 16-byte packs read-once (step 7)
    index_bits: int = 64  # the packed kernel: 32-bit positions (arrays of at most INDEX32_MOST values) or 64-bit

    SOURCE: ClassVar[str] = SOURCE
    KERNELS: ClassVar[tuple] = ("grid_stride", "packed")
    C_TYPES: ClassVar[dict] = C_TYPES

    def __post_init__(self):
        super().__post_init__()
        if self.math not in MATHS:
            raise InputError(f"math must be one of {tuple(MATHS)}, got {self.math!r}")
        if self.math == "half2" and not (self.dtype == "float16" and self.kernel == "packed" and
                                         self.pack_size % 2 == 0):
            raise InputError("math='half2' computes pairs of halves: it needs dtype float16, the packed "
                             "kernel and an even pack_size")
        if self.packs_per_thread not in PACKS_PER_THREAD or (self.packs_per_thread > 1 and not self.packed):
            raise InputError(f"packs_per_thread must be one of {PACKS_PER_THREAD} (and 1 for the grid-stride "
                             f"kernel), got {self.packs_per_thread}")
        if self.index_bits not in (32, 64) or (self.index_bits == 32 and not self.packed):
            raise InputError(f"index_bits must be 64, or 32 for the packed kernel, got {self.index_bits} "
                             f"for the {self.kernel} kernel")
        if self.evict_first and not (self.packed and self.pack_size == full_pack(self.dtype)):
            raise InputError(f"evict_first loads 16-byte packs: it needs the packed kernel and pack_size "
                             f"{full_pack(self.dtype)} for {self.dtype}, got {self.kernel} with pack_size "
                             f"{self.pack_size}")

    @property
    def name_expression(self) -> str:
        if self.kernel == "packed":
            return (f"gelu_packed<{self.c_type}, {self.pack_size}, {self.block_size}, {MATHS[self.math]}, "
                    f"{self.packs_per_thread}, {str(self.evict_first).lower()}"
                    f"{', int' if self.index_bits == 32 else ''}>")
        return f"gelu_grid_stride<{self.c_type}, {MATHS[self.math]}>"

    @property
    def config(self) -> dict:
        config = {"block_size": self.block_size, "math": self.math}
        if self.kernel == "packed":
            config["pack_size"] = self.pack_size
            config["packs_per_thread"] = self.packs_per_thread
            config["evict_first"] = self.evict_first
            if self.index_bits == 32:
                config["index_bits"] = 32
        return config

    def launch(self, x: DeviceArray, y: DeviceArray):
        if self.index_bits == 32 and x.size > INDEX32_MOST:
            raise InputError(f"{self.name_expression} indexes with 32 bits: at most {INDEX32_MOST:,} elements "
                             f"(2^30), got {x.size:,}; use index_bits=64")
        super().launch(x, y)

    def grid(self, n: int, kernel) -> int:
        if self.kernel == "packed":
            return packed_blocks(n, self.pack_size, self.block_size, self.packs_per_thread)
        return self.one_wave(kernel, ceil_div(n, self.block_size))


def packed_blocks(n: int, pack_size: int, block_size: int, packs_per_thread: int) -> int:
    """Blocks of gelu_packed for n elements: enough for the whole packs (the fewer than
    pack_size elements past them go to the first block's threads, one each)."""
    return max(1, ceil_div(int(n) // pack_size, block_size * packs_per_thread))


def packs_per_thread_for(n: int, pack_size: int, block_size: int, sm_count: int = None) -> int:
    """gelu()'s packs per thread. A small array (one pack a thread fills at most half a wave):
    SMALL_ARRAY_VALUES values a thread, while that still gives every SM a block. Otherwise the
    fewest packs (at most MOST_VALUES_PER_THREAD values) whose grid is one wave of resident
    blocks; one when none is (or on the scalar path)."""
    if pack_size == 1:
        return 1
    if sm_count is None:
        sm_count = device.gpu().sm_count if device.gpu_available() else RECORDED_SM_COUNT
    one_wave = sm_count * (THREADS_PER_SM // block_size)
    fuller = max(1, SMALL_ARRAY_VALUES // pack_size)
    if (fuller in PACKS_PER_THREAD and packed_blocks(n, pack_size, block_size, 1) <= one_wave // 2
            and packed_blocks(n, pack_size, block_size, fuller) >= sm_count):
        return fuller
    for per_thread in PACKS_PER_THREAD:
        if per_thread * pack_size > MOST_VALUES_PER_THREAD:
            break
        if packed_blocks(n, pack_size, block_size, per_thread) <= one_wave:
            return per_thread
    return 1


def evict_first_for(n: int, dtype: str, pack_size: int, l2_bytes: int = None) -> bool:
    """gelu()'s load hint: read-once loads (16-byte packs only) while the input is at most
    EVICT_FIRST_UP_TO_L2S times the size of L2."""
    if l2_bytes is None:
        l2_bytes = device.gpu().l2_bytes if device.gpu_available() else RECORDED_L2_BYTES
    return pack_size == full_pack(dtype) and int(n) * np_dtype(dtype).itemsize <= EVICT_FIRST_UP_TO_L2S * l2_bytes


def variant_for(n: int, dtype: str, pack_size: int, math: str = "sigmoid", block_size: int = 128) -> GeluVariant:
    """The kernel gelu() runs for n elements whose pointers allow ``pack_size``, with
    packs_per_thread_for's packs per thread, evict_first_for's load hint, and 32-bit positions
    up to INDEX32_MOST elements."""
    if math == "half2" and pack_size < 2:
        math = "tanh_approx"  # pairs need 4-byte alignment; the nearest scalar arithmetic
    return GeluVariant("packed", dtype, pack_size, block_size, math, packs_per_thread_for(n, pack_size, block_size),
                       evict_first_for(n, dtype, pack_size), 32 if n <= INDEX32_MOST else 64)


def gelu(x: DeviceArray, y: DeviceArray, *, math: str = "sigmoid", block_size: int = 128) -> GeluVariant:
    """y = GELU(x), as a library would do it: 16-byte packs when both pointers allow
    them, the scalar path otherwise; the tanh form computed as x * sigmoid(2u) by
    default (near tanhf's accuracy, about half its instructions). Returns the variant that ran."""
    variant = variant_for(x.size, str(x.dtype), widest_pack(x, y), math, block_size)
    variant.launch(x, y)
    return variant


# Host checks walk arrays 2^20 values at a time: the float64 temporaries (8 MiB each) stay in
# the CPU's caches, where whole-array temporaries of 2^28 values (2 GiB each) took seconds.
CHUNK = 1 << 20


def reference(x, math: str = "tanh") -> np.ndarray:
    """GELU in float64: the erf form for math='erf', the tanh form otherwise."""
    x = np.asarray(x)
    flat, out = x.reshape(-1), np.empty(x.size, np.float64)
    for start in range(0, x.size, CHUNK):
        out[start:start + CHUNK] = _reference_chunk(flat[start:start + CHUNK].astype(np.float64), math)
    return out.reshape(x.shape)


def _reference_chunk(x: np.ndarray, math: str) -> np.ndarray:
    if math == "erf":
        try:
            from scipy.special import erf
        except ImportError:  # slower, same values
            erf = np.vectorize(math_erf)
        return 0.5 * x * (1.0 + erf(x / math_sqrt2))
    with np.errstate(over="ignore"):
        inner = math_sqrt_2_over_pi * (x + 0.044715 * (x * x * x))
    return 0.5 * x * (1.0 + np.tanh(inner))


math_erf, math_sqrt2, math_sqrt_2_over_pi = math.erf, math.sqrt(2.0), math.sqrt(2.0 / math.pi)


def random_input(n: int, dtype: str, seed=None) -> np.ndarray:
    """Uniform on [-10, 10], with one value in 64 replaced by a large magnitude
    (up to LARGE[dtype]), spread over decades, of either sign."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-10.0, 10.0, n)
    large = rng.random(n) < 1 / 64
    x[large] = np.sign(rng.uniform(-1, 1, large.sum())) * np.exp(
        rng.uniform(np.log(10.0), np.log(LARGE[dtype]), large.sum()))
    return x.astype(np_dtype(dtype))


_references = HostReferences()


def _reference_of(x: np.ndarray, math: str) -> np.ndarray:
    """The float64 reference of a host input, computed once per input and formula."""
    formula = "erf" if math == "erf" else "tanh"
    return _references.get(x, formula, lambda h: reference(h.reshape(-1), formula))


def gelu_error(x: np.ndarray, y: np.ndarray, math: str) -> float:
    """max |y - reference| / max(1, |x|) over all elements; NaN counts as infinite."""
    ref, xs, ys = _reference_of(x, math), x.reshape(-1), y.reshape(-1)
    worst = 0.0
    for start in range(0, x.size, CHUNK):
        part = slice(start, start + CHUNK)
        err = np.abs(ys[part].astype(np.float64) - ref[part])
        err /= np.maximum(1.0, np.abs(xs[part].astype(np.float64)))
        if np.isnan(err).any():
            return float(np.inf)
        worst = max(worst, float(err.max()))
    return worst


# PyTorch's GELU rounds its tanh form otherwise than ours: it is held to twice our bound.
PEER_TOLERANCE_FACTOR = 2


def within_tolerance(error: float, dtype: str, math: str, what: str, factor: float = 1) -> float:
    """The error, or AssertionError past factor * TOLERANCE[(dtype, math)] (NaN counts as infinite)."""
    return within(error, factor * TOLERANCE[(dtype, math)], what)


def check_gelu(variant: GeluVariant, x: DeviceArray, y: DeviceArray, host: np.ndarray = None) -> float:
    """Poison y, run, and compare with float64; returns the error, raises past the tolerance."""
    if host is None:
        host = random_input(x.size, variant.dtype)
        x.copy_from(host)
    error = gelu_error(host, written_over_poison(y, lambda out: variant.launch(x, out)), variant.math)
    return within_tolerance(error, variant.dtype, variant.math, f"{variant.name_expression} on {x.size} elements")


inputs = InputPool()

# Sweeps check every measurement up to this many elements; beyond it, checking on the
# host (a float64 reference of 2^28 values takes seconds) is done where asked
# (check=True: the ladder tables) and by the tests, which check every kernel at 2^28.
CHECK_UP_TO = 1 << 24


def gelu_measurement(variant: GeluVariant, n: int, *, check: bool = None, provider: str = None) -> dict:
    """What ``bench.measure`` needs to check one kernel against float64 on fresh random
    inputs (see CHECK_UP_TO) and time it."""
    check = n <= CHECK_UP_TO if check is None else check

    def setup():
        host, x, y = inputs.get(n, variant.dtype, random_input)
        return (lambda: variant.launch(x, y)), ((lambda: check_gelu(variant, x, y, host)) if check else None)
    return dict(provider=provider or variant.name, dtype=variant.dtype, shape=[n], config=variant.config,
                bytes=bytes_moved(n, variant.dtype), setup=setup)


def measure_gelu(bench, variant: GeluVariant, n: int, *, check: bool = None, provider: str = None):
    return bench.measure(**gelu_measurement(variant, n, check=check, provider=provider))


def dispatcher_measurement(n: int, dtype: str, *, check: bool = None) -> dict:
    """gelu() as a user calls it, on aligned arrays: its choice is recorded in config."""
    return gelu_measurement(variant_for(n, dtype, full_pack(dtype)), n, check=check, provider="gelu()")


def measure_dispatcher(bench, n: int, dtype: str, *, check: bool = None):
    return bench.measure(**dispatcher_measurement(n, dtype, check=check))


# Where the output lies in memory moves the time of a few-MiB GELU by as much as two good kernels
# differ: gelu() writing four buffers in turn took 5.02-5.15 us at 1 MiB of fp32 (H200, 2026-11-26;
# the chapter's placement table), and 5.46-5.62 us over six buffers on an H100. So the peers write
# gelu()'s output, not one of their own.
PEER_OUTPUT = "gelu()'s output"


_placed_outputs = {}


def _output(n: int, dtype: str, place: int = 0) -> DeviceArray:
    """The buffer a measurement writes: the input pool's output (place 0, which every
    measurement but placement_measurements' writes) or another one, allocated once per place."""
    if place == 0:
        return inputs.get(n, dtype, random_input)[2]
    if (n, dtype, place) not in _placed_outputs:
        _placed_outputs[(n, dtype, place)] = DeviceArray((n,), dtype)
    return _placed_outputs[(n, dtype, place)]


def _peer_setup(n: int, dtype: str, compiled: bool, check: bool, place: int = 0):
    """PyTorch's GELU from the input pool's x into _output(place): eager through ``aten::gelu.out``,
    compiled as ``out.copy_(gelu(x))``, which Inductor turns into one kernel that stores into out."""
    torch = torch_module()
    import torch.nn.functional as F
    host, x, _ = inputs.get(n, dtype, random_input)
    y = _output(n, dtype, place)
    t, out = torch_tensor(x), torch_tensor(y)
    if compiled:
        fn = torch_compiled_for_shape(("gelu into out", n, dtype),
                                      lambda a, o: o.copy_(F.gelu(a, approximate="tanh")))
    else:
        def fn(a, o):
            return torch.ops.aten.gelu.out(a, approximate="tanh", out=o)

    def check_torch():  # PyTorch runs in our primary context: written_over_poison's wait covers its stream
        written = written_over_poison(y, lambda _: fn(t, out))
        return within_tolerance(gelu_error(host, written, "tanh"), dtype, "tanh",
                                f"{'torch.compile' if compiled else 'torch'} GELU on {n} elements",
                                PEER_TOLERANCE_FACTOR)
    return (lambda: fn(t, out)), (check_torch if check else None)


def torch_measurement(n: int, dtype: str, *, compiled: bool = False, check: bool = None) -> dict:
    """``torch.nn.functional.gelu(x, approximate="tanh")``, eager or torch.compile'd for this
    one size, on the very bytes our kernels read (the same input pool) and into the very
    buffer gelu() writes (PEER_OUTPUT)."""
    check = n <= CHECK_UP_TO if check is None else check
    return dict(provider="torch.compile" if compiled else "torch", dtype=dtype, shape=[n],
                config={"op": "gelu(approximate='tanh')", "out": PEER_OUTPUT}, bytes=bytes_moved(n, dtype),
                setup=lambda: _peer_setup(n, dtype, compiled, check))


def measure_torch_gelu(bench, n: int, dtype: str, *, compiled: bool = False, check: bool = None):
    return bench.measure(**torch_measurement(n, dtype, compiled=compiled, check=check))


def measure_versus_torch(bench, n: int, dtype: str, *, check: bool = None) -> list:
    """gelu(), PyTorch eager and torch.compile on the same bytes, timed in turns (one
    repetition of each per round): [ours, eager, compiled], None for what is not installed."""
    return bench.measure_together([dispatcher_measurement(n, dtype, check=check),
                                   torch_measurement(n, dtype, check=check),
                                   torch_measurement(n, dtype, compiled=True, check=check)])


def placement_measurements(n: int, dtype: str, places: int = 4) -> list:
    """gelu() and PyTorch's kernel (``aten::gelu.out``) each writing ``places`` output buffers
    that lie at different addresses (place 0 is the one every other measurement writes), on the
    same input: to be timed in turns, [gelu() to place 0, PyTorch to place 0, gelu() to place 1, ...].
    It shows how far where the output lies moves a few-MiB kernel (PEER_OUTPUT)."""
    def ours(place):
        host, x, _ = inputs.get(n, dtype, random_input)
        y, variant = _output(n, dtype, place), variant_for(n, dtype, full_pack(dtype))
        return (lambda: variant.launch(x, y)), (lambda: check_gelu(variant, x, y, host))

    def theirs(place):
        return _peer_setup(n, dtype, False, True, place)
    return [dict(provider=provider, dtype=dtype, shape=[n], config={"output_place": place},
                 bytes=bytes_moved(n, dtype), setup=lambda setup=setup, place=place: setup(place))
            for place in range(places) for provider, setup in (("gelu()", ours), ("torch", theirs))]


def sanitizer_cases():
    """Every GELU kernel shape at irregular sizes, one element, and misaligned views
    through the library entry point (helpers/sanitize.py)."""
    def case(variant, n):
        def run():
            x, y = DeviceArray.from_numpy(random_input(n, variant.dtype)), DeviceArray((n,), variant.dtype)
            variant.launch(x, y)
        return f"{variant.name_expression} n={n}", run

    def misaligned(dtype, n):
        def run():
            x, y = DeviceArray((n + 1,), dtype), DeviceArray((n + 1,), dtype)
            x.copy_from(random_input(n + 1, dtype))
            gelu(x.view(1, n), y.view(1, n))
        return f"gelu() {dtype} n={n} offset=1", run
    variants = [GeluVariant("grid_stride", d, 1, 256, m) for d in C_TYPES for m in ("tanh", "erf")]
    variants += [GeluVariant("packed", d, full_pack(d), b, m) for d in C_TYPES
                 for b in (128, 1024) for m in ("tanh", "erf", "tanh_approx", "sigmoid")]
    variants += [GeluVariant("packed", d, full_pack(d), 128, "sigmoid", p) for d in C_TYPES
                 for p in (2, 4)]
    variants += [GeluVariant("packed", d, full_pack(d), 128, "sigmoid", p, True) for d in C_TYPES
                 for p in (1, 2, 4)]
    variants += [GeluVariant("packed", "float16", p, 256, "half2", t) for p in (2, 8) for t in (1, 2)]
    cases = [case(v, n) for v in variants for n in (1, 7, 1023, (1 << 16) + 3)]
    return cases + [misaligned(d, 1000) for d in C_TYPES]
