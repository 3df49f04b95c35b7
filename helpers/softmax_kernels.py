"""Chapter 4's softmax kernels (kernels/softmax.cu), host side: the three paths
(a lane group per row with the row in registers, a block per row with the row in
shared memory, a block per row re-reading the row), their launch rules, and the
dispatcher that picks among them as a library would.

A softmax moves 2 * rows * cols * sizeof(T) bytes when it reads the row once
(``bytes_moved``); the uncached path reads it three times, and is still charged
only the bytes the operation must move.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import device
from .compiler import compile_kernels, loaded_kernel
from .device import DeviceArray
from .errors import InputError, LaunchConfigError
from .operands import C_TYPES, check_operands, check_pack_size, np_dtype, widest_pack
from .reduce_kernels import GROUP_WIDTHS, power_of_two_at_least

SOURCE = "softmax.cu"
SOURCES = ["kernels/softmax.cu", "kernels/convert.cuh", "kernels/reduce.cuh", "kernels/pack.cuh"]
PATHS = ("warp", "block_cached", "block_uncached")
MAX_COLS_PER_THREAD = 32  # registers per lane for the row: beyond this the warp path spills


def bytes_moved(rows: int, cols: int, dtype) -> int:
    """Each element read once and written once: 2 * rows * cols * sizeof(T) bytes."""
    return 2 * int(rows) * int(cols) * np_dtype(dtype).itemsize


@dataclass(frozen=True)
class SoftmaxVariant:
    path: str = "warp"
    dtype: str = "float32"
    pack_size: int = 4
    block_size: int = 128
    cols_per_thread: int = 4  # warp path: row values each lane holds in registers
    group_width: int = 32  # warp path: lanes per row
    rows_per_group: int = 1  # warp path: rows each group handles at once
    pack_major_cache: bool = True  # block_cached: the bank-conflict-free [pack][num_packs] layout

    def __post_init__(self):
        if self.path not in PATHS:
            raise InputError(f"path must be one of {PATHS}, got {self.path!r}")
        if self.dtype not in C_TYPES:
            raise InputError(f"dtype must be one of {tuple(C_TYPES)}, got {self.dtype!r}")
        check_pack_size(self.pack_size, self.dtype)
        if self.block_size % 32 or not 32 <= self.block_size <= 1024:
            raise LaunchConfigError(f"block_size must be a multiple of 32 from 32 to 1024, got {self.block_size}")
        if self.path == "warp":
            if self.group_width not in GROUP_WIDTHS:
                raise InputError(f"group_width must be a power of two up to 32, got {self.group_width}")
            if self.cols_per_thread % self.pack_size or not self.pack_size <= self.cols_per_thread <= MAX_COLS_PER_THREAD:
                raise InputError(f"cols_per_thread must be a multiple of pack_size ({self.pack_size}) up to "
                                 f"{MAX_COLS_PER_THREAD}, got {self.cols_per_thread}")
            if self.rows_per_group not in (1, 2):
                raise InputError(f"rows_per_group must be 1 or 2, got {self.rows_per_group}")

    @property
    def name(self) -> str:
        return f"softmax_{self.path}"

    @property
    def c_type(self) -> str:
        return C_TYPES[self.dtype]

    @property
    def name_expression(self) -> str:
        t, p, b = self.c_type, self.pack_size, self.block_size
        if self.path == "warp":
            return (f"softmax_warp_per_row<{t}, {p}, {self.cols_per_thread}, {self.group_width}, "
                    f"{self.rows_per_group}, {b}>")
        if self.path == "block_cached":
            return f"softmax_block_cached<{t}, {p}, {b}, {str(self.pack_major_cache).lower()}>"
        return f"softmax_block_uncached<{t}, {p}, {b}>"

    @property
    def config(self) -> dict:
        config = {"path": self.path, "pack_size": self.pack_size, "block_size": self.block_size}
        if self.path == "warp":
            config.update(cols_per_thread=self.cols_per_thread, group_width=self.group_width,
                          rows_per_group=self.rows_per_group)
        if self.path == "block_cached":
            config["pack_major_cache"] = self.pack_major_cache
        return config

    def compiled(self, arch: str = None):
        return compile_kernels(SOURCE, [self.name_expression], arch=arch)

    def max_cols(self) -> int | None:
        """The longest row this variant takes (None: any)."""
        return self.cols_per_thread * self.group_width if self.path == "warp" else None

    def shared_bytes(self, cols: int) -> int:
        return 4 * cols if self.path == "block_cached" else 0

    def grid(self, rows: int, cols: int, kernel) -> int:
        if self.path == "warp":
            return max(1, -(-rows // (self.block_size // self.group_width * self.rows_per_group)))
        needed = self.shared_bytes(cols) + kernel.static_shared_bytes
        if needed > device.gpu().max_shared_per_block_optin:
            raise LaunchConfigError(f"{self.name_expression}: a row of {cols} values needs {needed} bytes of shared "
                                    f"memory, over the {device.gpu().max_shared_per_block_optin} a block may have; "
                                    f"use the block_uncached path (softmax() does)")
        resident = kernel.max_active_blocks_per_sm(self.block_size, self.shared_bytes(cols))
        if resident == 0:
            raise LaunchConfigError(f"{self.name_expression}: a row of {cols} values needs "
                                    f"{self.shared_bytes(cols)} bytes of shared memory, more than one SM has")
        return max(1, min(rows, device.gpu().sm_count * resident))

    def launch(self, x: DeviceArray, y: DeviceArray):
        """y = softmax(x) over the last dimension of a (rows, cols) x."""
        if len(x.shape) != 2:
            raise InputError(f"x must be a (rows, cols) matrix, got shape {x.shape}")
        check_operands(self.name, self.dtype, self.pack_size * np_dtype(self.dtype).itemsize, x=x, y=y)
        rows, cols = x.shape
        if cols % self.pack_size:
            raise InputError(f"{self.name_expression}: cols ({cols}) must be a multiple of pack_size "
                             f"({self.pack_size}); softmax() picks a pack that divides it")
        if self.max_cols() is not None and cols > self.max_cols():
            raise InputError(f"{self.name_expression} holds at most {self.max_cols()} values per row in registers, "
                             f"got {cols}: use more cols_per_thread, or a block path")
        if rows == 0 or cols == 0:
            return
        kernel = loaded_kernel(SOURCE, self.name_expression)
        kernel(self.grid(rows, cols, kernel), self.block_size, x, y, rows, cols,
               shared_bytes=self.shared_bytes(cols))


def variant_for(rows: int, cols: int, dtype: str, pack: int) -> SoftmaxVariant:
    """The dispatcher's rule. Rows up to 1024 values: a lane group per row, the row in
    registers, with just enough lanes that each holds at most 32 values, and two rows
    per group when a row is at most one pack per lane (more loads in flight). Longer
    rows: a block per row with the row in shared memory, the block size the driver's
    occupancy calculator says keeps the most threads resident (the larger block on a
    tie); if a row does not fit in shared memory, the uncached block."""
    if cols <= 1024:
        group = min(32, power_of_two_at_least(-(-cols // pack)))
        per_thread = max(pack, power_of_two_at_least(-(-cols // group)))
        two_rows = per_thread == pack and rows > 1
        return SoftmaxVariant("warp", dtype, pack, 128, per_thread, group, 2 if two_rows else 1)
    best, best_threads = None, 0
    for block in (128, 256, 512, 1024):
        variant = SoftmaxVariant("block_cached", dtype, pack, block)
        kernel = loaded_kernel(SOURCE, variant.name_expression)
        shared = variant.shared_bytes(cols)
        if shared + kernel.static_shared_bytes > device.gpu().max_shared_per_block_optin:
            break
        threads = kernel.max_active_blocks_per_sm(block, shared) * block
        if threads and threads >= best_threads:
            best, best_threads = variant, threads
    return best or SoftmaxVariant("block_uncached", dtype, pack, 1024)


def softmax(x: DeviceArray, y: DeviceArray) -> SoftmaxVariant:
    """y = softmax(x) over the last dimension, any shape and alignment; returns the variant."""
    if len(x.shape) != 2:
        raise InputError(f"x must be a (rows, cols) matrix, got shape {x.shape}")
    rows, cols = x.shape
    variant = variant_for(rows, cols, str(x.dtype), widest_pack(x, y, divides=cols))
    variant.launch(x, y)
    return variant


def reference(x: np.ndarray) -> np.ndarray:
    """Softmax in float64 (a fully -inf row gives NaN, like the kernels)."""
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        shifted = np.exp(wide - wide.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)


# max |y - reference| per dtype: the output's rounding (half an ulp of values <= 1:
# 2^-24, 2^-11, 2^-8) plus __expf's and the sum's errors, a few times over.
TOLERANCE = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}


def sanitizer_cases():
    """Each path at awkward shapes: one row, one column, columns that fill no pack or group."""
    def case(variant, shape):
        def run():
            x = DeviceArray.from_numpy(np.random.default_rng().standard_normal(shape).astype(np_dtype(variant.dtype)))
            variant.launch(x, DeviceArray(shape, variant.dtype))
        return f"{variant.name_expression} shape={shape}", run

    def dispatched(dtype, shape):
        def run():
            x = DeviceArray.from_numpy(np.random.default_rng().standard_normal(shape).astype(np_dtype(dtype)))
            softmax(x, DeviceArray(shape, dtype))
        return f"softmax() {dtype} shape={shape}", run
    cases = [case(SoftmaxVariant("warp", d, 1, 128, 4, g, r), (s, c)) for d in ("float32", "float16")
             for g in (4, 32) for r in (1, 2) for s, c in ((1, 1), (7, 13), (33, 4 * g))]
    block_variants = [SoftmaxVariant("block_cached", d, 4, b, pack_major_cache=m) for d in ("float32", "bfloat16")
                      for b in (128, 1024) for m in (True, False)]
    block_variants += [SoftmaxVariant("block_uncached", d, 4, b) for d in ("float32", "bfloat16") for b in (128, 1024)]
    cases += [case(v, shape) for v in block_variants for shape in ((1, 4), (3, 1028), (2, 4100))]
    cases += [dispatched(d, shape) for d in C_TYPES for shape in ((1, 1), (5, 7), (4097, 33), (3, 3000), (2, 12289))]
    return cases
