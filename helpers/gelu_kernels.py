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
from .device import DeviceArray
from .errors import InputError
from .operands import (C_TYPES, ElementwiseVariant, HostReferences, InputPool, np_dtype, torch_dtype,
                       torch_module, widest_pack)

SOURCE = "gelu.cu"
SOURCES = ["kernels/gelu.cu", "kernels/pack.cuh"]
MATHS = {"tanh": 0, "erf": 1, "tanh_approx": 2, "half2": 3}  # GeluMath in gelu.cu

# Largest allowed error, as max |y - reference| / max(1, |x|): GELU's output has
# the size of its input, so this is a relative error for |x| > 1 and an absolute
# one near zero (where GELU crosses zero and a pure relative error is meaningless).
# Each bound is a few times the error we expect from the arithmetic and from
# rounding the output to its dtype (half an ulp: 2^-24, 2^-11, 2^-8 relative).
TOLERANCE = {
    ("float32", "tanh"): 2e-6, ("float32", "erf"): 2e-6, ("float32", "tanh_approx"): 2e-3,
    ("float16", "tanh"): 1.5e-3, ("float16", "erf"): 1.5e-3, ("float16", "tanh_approx"): 3e-3,
    ("float16", "half2"): 8e-3,
    ("bfloat16", "tanh"): 1e-2, ("bfloat16", "erf"): 1e-2, ("bfloat16", "tanh_approx"): 1.2e-2,
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

    SOURCE: ClassVar[str] = SOURCE
    KERNELS: ClassVar[tuple] = ("grid_stride", "packed")
    C_TYPES: ClassVar[dict] = C_TYPES

    def __post_init__(self):
        super().__post_init__()
        if self.math not in MATHS:
            raise InputError(f"math must be one of {tuple(MATHS)}, got {self.math!r}")
        if self.math == "half2" and not (self.dtype == "float16" and self.kernel == "packed" and self.pack_size % 2 == 0):
            raise InputError("math='half2' computes pairs of halves: it needs dtype float16, the packed "
                             "kernel and an even pack_size")

    @property
    def name_expression(self) -> str:
        if self.kernel == "packed":
            return f"gelu_packed<{self.c_type}, {self.pack_size}, {self.block_size}, {MATHS[self.math]}>"
        return f"gelu_grid_stride<{self.c_type}, {MATHS[self.math]}>"

    @property
    def config(self) -> dict:
        config = {"block_size": self.block_size, "math": self.math}
        if self.kernel == "packed":
            config["pack_size"] = self.pack_size
        return config

    def grid(self, n: int, kernel) -> int:
        if self.kernel == "packed":  # one pack per thread: the grid covers the array
            return max(1, -(-(n // self.pack_size) // self.block_size))
        return self.one_wave(kernel, -(-n // self.block_size))


def gelu(x: DeviceArray, y: DeviceArray, *, math: str = "tanh", block_size: int = 256) -> GeluVariant:
    """y = GELU(x), as a library would do it: 16-byte packs when both pointers allow
    them, the scalar path otherwise. Returns the variant that ran."""
    pack = widest_pack(x, y)
    if math == "half2" and pack < 2:
        math = "tanh_approx"  # pairs need 4-byte alignment; the nearest scalar arithmetic
    variant = GeluVariant("packed", str(x.dtype), pack, block_size, math)
    variant.launch(x, y)
    return variant


def reference(x, math: str = "tanh") -> np.ndarray:
    """GELU in float64: the erf form for math='erf', the tanh form otherwise."""
    x = np.asarray(x, dtype=np.float64)
    if math == "erf":
        try:
            from scipy.special import erf
        except ImportError:  # slower, same values
            erf = np.vectorize(math_erf)
        return 0.5 * x * (1.0 + erf(x / math_sqrt2))
    with np.errstate(over="ignore"):
        inner = math_sqrt_2_over_pi * (x + 0.044715 * x ** 3)
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
    return _references.get(x, formula, lambda h: reference(h.astype(np.float64).reshape(-1), formula))


def gelu_error(x: np.ndarray, y: np.ndarray, math: str) -> float:
    """max |y - reference| / max(1, |x|) over all elements; NaN counts as infinite."""
    if x.size == 0:
        return 0.0
    err = np.abs(y.astype(np.float64).reshape(-1) - _reference_of(x, math))
    err /= np.maximum(1.0, np.abs(x.astype(np.float64).reshape(-1)))
    return float(np.inf) if np.isnan(err).any() else float(err.max())


def check_gelu(variant: GeluVariant, x: DeviceArray, y: DeviceArray, host: np.ndarray = None) -> float:
    """Poison y, run, and compare with float64; returns the error, raises past the tolerance."""
    if host is None:
        host = random_input(x.size, variant.dtype)
        x.copy_from(host)
    y.poison()
    variant.launch(x, y)
    device.synchronize()
    error = gelu_error(host, y.to_numpy(), variant.math)
    tolerance = TOLERANCE[(variant.dtype, variant.math)]
    if not error <= tolerance:
        raise AssertionError(f"{variant.name_expression} on {x.size} elements: error {error:.3g} "
                             f"exceeds the tolerance {tolerance:.1g} (NaN counts as infinite)")
    return error


inputs = InputPool()

# Sweeps check every measurement up to this many elements; beyond it, checking on the
# host (a float64 reference of 2^28 values takes seconds) is done where asked
# (check=True: the ladder tables) and by the tests, which check every kernel at 2^28.
CHECK_UP_TO = 1 << 24


def measure_gelu(bench, variant: GeluVariant, n: int, *, check: bool = None):
    """Check against float64 on fresh random inputs (see CHECK_UP_TO), then time."""
    check = n <= CHECK_UP_TO if check is None else check

    def setup():
        host, x, y = inputs.get(n, variant.dtype, random_input)
        return (lambda: variant.launch(x, y)), ((lambda: check_gelu(variant, x, y, host)) if check else None)
    return bench.measure(variant.name, dtype=variant.dtype, shape=[n], config=variant.config,
                         bytes=bytes_moved(n, variant.dtype), setup=setup)


_compiled_torch_gelu = {}


def measure_torch_gelu(bench, n: int, dtype: str, *, compiled: bool = False, check: bool = None):
    """``torch.nn.functional.gelu(x, approximate="tanh")``, eager or torch.compile'd
    (dynamic shapes: one compilation serves every size), on the same kind of input."""
    check = n <= CHECK_UP_TO if check is None else check

    def setup():
        torch = torch_module()
        import torch.nn.functional as F
        fn = F.gelu
        if compiled:
            if dtype not in _compiled_torch_gelu:
                _compiled_torch_gelu[dtype] = torch.compile(
                    lambda t: F.gelu(t, approximate="tanh"), dynamic=True)
            fn = _compiled_torch_gelu[dtype]
        host = random_input(n, dtype)
        x = torch.from_numpy(host.astype(np.float32)).to("cuda", torch_dtype(torch, dtype))
        run = (lambda: fn(x)) if compiled else (lambda: fn(x, approximate="tanh"))

        def check_torch():
            y = run()
            torch.cuda.synchronize()
            return gelu_error(host, y.float().cpu().numpy().astype(np_dtype(dtype)), "tanh")
        return run, (check_torch if check else None)
    provider = "torch.compile" if compiled else "torch"
    return bench.measure(provider, dtype=dtype, shape=[n], config={"op": "gelu(approximate='tanh')"},
                         bytes=bytes_moved(n, dtype), setup=setup)


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
    variants += [GeluVariant("packed", d, 16 // np_dtype(d).itemsize, b, m) for d in C_TYPES
                 for b in (128, 1024) for m in ("tanh", "erf", "tanh_approx")]
    variants += [GeluVariant("packed", "float16", p, 256, "half2") for p in (2, 8)]
    cases = [case(v, n) for v in variants for n in (1, 7, 1023, (1 << 16) + 3)]
    return cases + [misaligned(d, 1000) for d in C_TYPES]
