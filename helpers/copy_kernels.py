"""Chapter 1's copy kernels (kernels/copy.cu), host side.

Each ``CopyVariant`` says how its kernel is launched and what it may be given;
``bytes_moved`` says, once, what a copy must move. The chapter, its panel and
the tests all go through here, so they measure and check the same thing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .arith import ceil_div
from .device import DeviceArray
from .errors import InputError
from .operands import (ElementwiseVariant, InputPool, full_pack, random_normal, torch_dtype, torch_module,
                       written_over_poison)

SOURCE = "copy.cu"
SOURCES = ["kernels/copy.cu", "kernels/pack.cuh"]


def bytes_moved(n: int, dtype) -> int:
    """A copy reads n elements and writes n elements: 2 * n * sizeof(T) bytes."""
    return 2 * int(n) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class CopyVariant(ElementwiseVariant):
    kernel: str = "packed"
    unroll: int = 1  # packs loaded before any is stored (packed only)

    SOURCE: ClassVar[str] = SOURCE
    KERNELS: ClassVar[tuple] = ("one_per_thread", "grid_stride", "packed_grid_stride", "packed")
    C_TYPES: ClassVar[dict] = {"float32": "float", "float16": "__half"}
    OPERANDS: ClassVar[tuple] = ("src", "dst")

    def __post_init__(self):
        super().__post_init__()
        if self.unroll not in (1, 2, 4, 8) or (self.unroll != 1 and self.kernel != "packed"):
            raise InputError(f"unroll must be 1, 2, 4 or 8 (and 1 for {self.kernel}), got {self.unroll}")

    @property
    def name_expression(self) -> str:
        if self.kernel == "packed":
            return f"copy_packed<{self.c_type}, {self.pack_size}, {self.block_size}, {self.unroll}>"
        if self.kernel == "packed_grid_stride":
            return f"copy_packed_grid_stride<{self.c_type}, {self.pack_size}, {self.block_size}>"
        return f"copy_{self.kernel}<{self.c_type}>"

    @property
    def config(self) -> dict:
        if self.kernel == "packed":
            return {"pack_size": self.pack_size, "block_size": self.block_size, "unroll": self.unroll}
        if self.kernel == "packed_grid_stride":
            return {"pack_size": self.pack_size, "block_size": self.block_size}
        return {"block_size": self.block_size}

    def grid(self, n: int, kernel) -> int:
        """Blocks to launch for n elements."""
        if self.kernel == "one_per_thread":
            return ceil_div(n, self.block_size)
        per_block = self.block_size * (self.pack_size * self.unroll if self.packed else 1)
        needed = max(1, ceil_div(n, per_block))
        if self.kernel == "packed":  # one chunk per thread: the grid covers the array
            return needed
        return self.one_wave(kernel, needed)


random_input = random_normal


def check_copy(variant: CopyVariant, src: DeviceArray, dst: DeviceArray, host: np.ndarray = None) -> float:
    """Poison dst, copy src into it, and demand an exact copy of ``host`` (fresh
    random values are uploaded to src first when host is None). Returns the
    relative error against the float64 reference, 0.0 for a correct copy;
    anything else raises."""
    if host is None:
        host = random_input(src.size, variant.dtype)
        src.copy_from(host)
    out = written_over_poison(dst, lambda out: variant.launch(src, out)).reshape(-1)
    bits = f"u{host.itemsize}"
    wrong = np.flatnonzero(out.view(bits) != host.reshape(-1).view(bits))
    if len(wrong):
        raise AssertionError(f"{variant.name_expression} copied {len(wrong)} of {src.size} elements "
                             f"wrongly (first at index {wrong[0]})")
    # Bit-for-bit equal to the input, so equal to its float64 reference: error 0.
    return 0.0


inputs = InputPool()


def measure_copy(bench, variant: CopyVariant, n: int, *, flush: bool = True):
    """Check (exact copy of fresh random values into a poisoned output), then time."""
    def setup():
        host, src, dst = inputs.get(n, variant.dtype)
        return (lambda: variant.launch(src, dst)), (lambda: check_copy(variant, src, dst, host))
    config = dict(variant.config, **({} if flush else {"l2_flush": False}))
    return bench.measure(variant.name, dtype=variant.dtype, shape=[n], config=config,
                         bytes=bytes_moved(n, variant.dtype), setup=setup, flush=flush)


def measure_torch_copy(bench, n: int, dtype: str = "float32"):
    """PyTorch's device-to-device copy (``dst.copy_(src)``) on the same data size."""
    def setup():
        torch = torch_module()
        src = torch.randn(n, device="cuda").to(torch_dtype(torch, dtype))
        dst = torch.empty_like(src)

        def check():
            dst.fill_(float("nan"))
            dst.copy_(src)
            torch.cuda.synchronize()
            if not torch.equal(dst, src):
                raise AssertionError("torch copy_ is wrong")
            return 0.0
        return (lambda: dst.copy_(src)), check
    return bench.measure("torch", dtype=dtype, shape=[n], config={"op": "copy_"},
                         bytes=bytes_moved(n, dtype), setup=setup)


def ladder(dtype: str = "float32", block_size: int = 256) -> list:
    """The chapter's ladder, step by step."""
    widest = full_pack(dtype)
    return [CopyVariant("one_per_thread", dtype, block_size=block_size),
            CopyVariant("grid_stride", dtype, block_size=block_size),
            CopyVariant("packed_grid_stride", dtype, pack_size=widest // 2, block_size=block_size),
            CopyVariant("packed_grid_stride", dtype, pack_size=widest, block_size=block_size),
            CopyVariant("packed", dtype, pack_size=widest, block_size=block_size)]


def sanitizer_cases():
    """Every copy kernel at sizes that are not a multiple of its pack or block, one
    element, and (for the scalar kernels) a misaligned view (helpers/sanitize.py)."""
    def case(variant, n, offset=0):
        def run():
            src, dst = DeviceArray((n + offset,), variant.dtype), DeviceArray((n + offset,), variant.dtype)
            src.copy_from(random_input(n + offset, variant.dtype))
            variant.launch(src.view(offset, n), dst.view(offset, n))
        return f"{variant.name_expression} n={n} offset={offset}", run
    cases = []
    for variant in ladder("float32") + ladder("float16") + [CopyVariant("packed", "float32", 4, 128, 4)]:
        for n in (1, 7, 1023, (1 << 16) + 3):
            cases.append(case(variant, n))
        if not variant.packed:
            cases.append(case(variant, 1000, offset=1))
    return cases
