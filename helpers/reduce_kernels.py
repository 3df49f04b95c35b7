"""Chapter 3's reductions (kernels/reduce.cu), host side: whole-array sums (the
classic ladder) and row-wise sum and max, with the error bound the tests use.

A whole-array sum moves n * 4 bytes (the 4-byte result is not counted): the
bytes formula is ``bytes_moved``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import device
from .compiler import compile_kernels, loaded_kernel
from .device import DeviceArray
from .errors import InputError, LaunchConfigError

SOURCE = "reduce.cu"
SOURCES = ["kernels/reduce.cu", "kernels/pack.cuh"]
LADDER = ("interleaved_divergent", "interleaved_strided", "sequential", "first_add", "unroll_last_warp",
          "complete_unroll", "cascaded", "shuffle", "single_pass")
TWO_PER_THREAD = ("first_add", "unroll_last_warp", "complete_unroll")  # each thread loads two elements
GRID_STRIDE = ("cascaded", "shuffle", "single_pass")  # one wave of blocks; each thread loops
UNIT_ROUNDOFF = 2.0 ** -24  # float32


def bytes_moved(n: int) -> int:
    """A sum reads n float32 values once: 4 * n bytes."""
    return 4 * int(n)


def _require_float32(name, array):
    if not isinstance(array, DeviceArray) or array.dtype != np.float32:
        raise InputError(f"{name} must be a float32 DeviceArray, got "
                         f"{getattr(array, 'dtype', type(array).__name__)}")


@dataclass(frozen=True)
class SumVariant:
    step: str = "single_pass"  # one of LADDER
    block_size: int = 256

    def __post_init__(self):
        if self.step not in LADDER:
            raise InputError(f"step must be one of {LADDER}, got {self.step!r}")
        if self.block_size not in (64, 128, 256, 512, 1024):
            raise LaunchConfigError(f"block_size must be a power of two from 64 to 1024 (the tree halves it "
                                    f"down to one warp), got {self.block_size}")

    @property
    def name(self) -> str:
        return f"reduce_{self.step}"

    @property
    def name_expression(self) -> str:
        return f"reduce_{self.step}<{self.block_size}>"

    @property
    def config(self) -> dict:
        return {"block_size": self.block_size}

    def compiled(self, arch: str = None):
        return compile_kernels(SOURCE, [self.name_expression], arch=arch)

    def grid(self, n: int) -> int:
        per_block = self.block_size * (2 if self.step in TWO_PER_THREAD else 1)
        needed = max(1, -(-n // per_block))
        if self.step in GRID_STRIDE:
            kernel = loaded_kernel(SOURCE, self.name_expression)
            return min(needed, device.gpu().sm_count * kernel.max_active_blocks_per_sm(self.block_size))
        return needed

    def elements_per_thread(self, n: int) -> int:
        """How many inputs one thread adds up sequentially before the tree (for the bound)."""
        return max(1, -(-n // (self.grid(n) * self.block_size)))

    def workspace(self, n: int) -> dict:
        """The buffers a sum of n elements needs, allocated once per size."""
        key = (self, n)
        if key not in _workspaces:
            grid = self.grid(n)
            space = {"partial": DeviceArray((grid,), np.float32), "result": DeviceArray((1,), np.float32)}
            if self.step == "single_pass":
                space["blocks_done"] = DeviceArray((1,), np.uint32)
                space["blocks_done"].poison(0)  # the kernel resets it after every launch
            else:  # every later pass reduces the previous pass's partials
                sizes, m = [], grid
                while m > 1:
                    m = self.grid(m)
                    sizes.append(m)
                space["passes"] = [DeviceArray((s,), np.float32) for s in sizes]
            _workspaces[key] = space
        return _workspaces[key]

    def launch(self, x: DeviceArray) -> DeviceArray:
        """Enqueue the sum of x; returns the 1-element array that will hold it."""
        _require_float32("x", x)
        n = x.size
        space = self.workspace(n)
        kernel = loaded_kernel(SOURCE, self.name_expression)
        if n == 0:
            space["result"].poison(0)  # the empty sum is 0.0 (all-zero bytes)
            return space["result"]
        if self.step == "single_pass":
            kernel(self.grid(n), self.block_size, x, space["partial"], space["blocks_done"], space["result"], n)
            return space["result"]
        source, out = x, space["partial"]
        kernel(self.grid(n), self.block_size, source, out, n)
        for following in space["passes"]:
            source, out = out, following
            kernel(self.grid(source.size), self.block_size, source, out, source.size)
        if out.size == 1:
            return out
        raise AssertionError("the passes must end with one value")  # pragma: no cover

    def sum(self, x: DeviceArray) -> float:
        result = self.launch(x)
        device.synchronize()
        return float(result.to_numpy()[0])

    def error_bound(self, n: int, abs_sum: float) -> float:
        """A worst-case bound on |computed - exact| for float32 summation in this
        kernel's order: each result is a sum of depth d (the sequential adds of a
        thread, then the levels of the trees), so |error| <= gamma_d * sum |x_i|
        with gamma_d = d u / (1 - d u) and u = 2^-24."""
        per_thread = self.elements_per_thread(n) if self.step in GRID_STRIDE else (
            2 if self.step in TWO_PER_THREAD else 1)
        if self.step == "single_pass":
            per_thread += 3  # the four values of a pack are added first
        depth = per_thread + 2 * math.ceil(math.log2(max(n, 2))) + 2  # trees of every pass
        gamma = depth * UNIT_ROUNDOFF / (1 - depth * UNIT_ROUNDOFF)
        return gamma * abs_sum


_workspaces = {}

ROW_OPS = {"sum": "Sum", "max": "Max"}
ROW_KERNELS = ("block", "warp")


@dataclass(frozen=True)
class RowVariant:
    op: str = "sum"
    kernel: str = "block"  # a block per row, or a warp per row
    block_size: int = 256

    def __post_init__(self):
        if self.op not in ROW_OPS:
            raise InputError(f"op must be one of {tuple(ROW_OPS)}, got {self.op!r}")
        if self.kernel not in ROW_KERNELS:
            raise InputError(f"kernel must be one of {ROW_KERNELS}, got {self.kernel!r}")
        if self.block_size % 32 or not 32 <= self.block_size <= 1024:
            raise LaunchConfigError(f"block_size must be a multiple of 32 from 32 to 1024, got {self.block_size}")

    @property
    def name(self) -> str:
        return f"row_{self.op}_{self.kernel}"

    @property
    def name_expression(self) -> str:
        return f"row_reduce_{self.kernel}<{ROW_OPS[self.op]}, {self.block_size}>"

    @property
    def config(self) -> dict:
        return {"kernel": self.kernel, "block_size": self.block_size}

    def compiled(self, arch: str = None):
        return compile_kernels(SOURCE, [self.name_expression], arch=arch)

    def launch(self, x: DeviceArray, y: DeviceArray):
        """y[r] = op over x[r, :] for a (rows, cols) float32 x."""
        _require_float32("x", x)
        _require_float32("y", y)
        if len(x.shape) != 2:
            raise InputError(f"x must be a (rows, cols) matrix, got shape {x.shape}")
        rows, cols = x.shape
        if y.size != rows:
            raise InputError(f"y must hold one value per row: {rows}, got {y.size}")
        if rows == 0:
            return
        if cols == 0:
            raise InputError(f"cannot {self.op} rows of length 0")
        kernel = loaded_kernel(SOURCE, self.name_expression)
        if self.kernel == "block":
            kernel(rows, self.block_size, x, y, cols)
        else:
            rows_per_block = self.block_size // 32
            kernel(-(-rows // rows_per_block), self.block_size, x, y, rows, cols)


def row_reduce(x: DeviceArray, y: DeviceArray, op: str = "sum", *, warp_up_to: int = 1024) -> RowVariant:
    """The dispatcher: a warp per row for rows up to ``warp_up_to`` long, a block per row beyond."""
    cols = x.shape[-1] if x.shape else 0
    variant = RowVariant(op, "warp" if cols <= warp_up_to else "block", 256 if cols <= 16384 else 512)
    variant.launch(x, y)
    return variant


def row_reference(host: np.ndarray, op: str) -> np.ndarray:
    values = host.astype(np.float64)
    return values.sum(axis=-1) if op == "sum" else values.max(axis=-1)


def random_signs(n: int, seed=None) -> np.ndarray:
    """Random +-1: every partial sum of these is an integer far below 2^24 in
    magnitude, so float32 adds them exactly in any order and the sum must be exact."""
    return np.random.default_rng(seed).choice(np.array([-1.0, 1.0], dtype=np.float32), n)


def sanitizer_cases():
    """Every reduction at awkward sizes: one element, odd sizes, rows of 1, 33, 4097 (helpers/sanitize.py)."""
    def whole(variant, n):
        def run():
            variant.launch(DeviceArray.from_numpy(random_signs(n)))
        return f"{variant.name_expression} n={n}", run

    def rows(variant, shape):
        def run():
            x = DeviceArray.from_numpy(np.random.default_rng().standard_normal(shape, dtype=np.float32))
            variant.launch(x, DeviceArray((shape[0],), np.float32))
        return f"{variant.name_expression} shape={shape}", run
    cases = [whole(SumVariant(step, b), n) for step in LADDER for b in (64, 1024) for n in (1, 31, 1023, (1 << 16) + 7)]
    cases += [rows(RowVariant(op, kernel, b), shape) for op in ROW_OPS for kernel in ROW_KERNELS for b in (32, 256)
              for shape in ((1, 1), (33, 7), (5, 4097), (3, 1000))]
    return cases
