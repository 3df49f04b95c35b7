"""Chapter 1's copy kernels (kernels/copy.cu), host side.

Each ``CopyVariant`` says how its kernel is launched and what it may be given;
``bytes_moved`` says, once, what a copy must move. The chapter, its panel and
the tests all go through here, so they measure and check the same thing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from . import device
from .bench import Unavailable
from .compiler import compile_kernels
from .device import DeviceArray
from .errors import InputError, LaunchConfigError

SOURCE = "copy.cu"
SOURCES = ["kernels/copy.cu", "kernels/pack.cuh"]
C_TYPES = {"float32": "float", "float16": "__half"}
KERNELS = ("one_per_thread", "grid_stride", "packed_grid_stride", "packed")
PACK_BYTES_MAX = 16  # the widest single access of sm_90
_loaded = {}  # CopyVariant -> loaded Kernel


def bytes_moved(n: int, dtype) -> int:
    """A copy reads n elements and writes n elements: 2 * n * sizeof(T) bytes."""
    return 2 * int(n) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class CopyVariant:
    kernel: str = "packed"  # one of KERNELS
    dtype: str = "float32"
    pack_size: int = 1  # elements per access (the packed kernels)
    block_size: int = 256
    unroll: int = 1  # packs loaded before any is stored (packed only)

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise InputError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.dtype not in C_TYPES:
            raise InputError(f"dtype must be one of {tuple(C_TYPES)}, got {self.dtype!r}")
        if not 1 <= self.block_size <= 1024:
            raise LaunchConfigError(f"block_size must be in 1..1024, got {self.block_size}")
        if self.packed:
            pack_bytes = self.pack_size * np.dtype(self.dtype).itemsize
            if self.pack_size < 1 or self.pack_size & (self.pack_size - 1) or pack_bytes > PACK_BYTES_MAX:
                raise InputError(f"pack_size must be a power of two with at most {PACK_BYTES_MAX} bytes "
                                 f"per pack ({PACK_BYTES_MAX // np.dtype(self.dtype).itemsize} "
                                 f"{self.dtype}), got {self.pack_size}")
            if self.block_size % 32:
                raise LaunchConfigError(f"block_size must be a multiple of 32 (a whole number of "
                                        f"warps), got {self.block_size}; try {max(32, self.block_size // 32 * 32)}")
        if self.unroll not in (1, 2, 4, 8) or (self.unroll != 1 and self.kernel != "packed"):
            raise InputError(f"unroll must be 1, 2, 4 or 8 (and 1 for {self.kernel}), got {self.unroll}")

    @property
    def packed(self) -> bool:
        return self.kernel.startswith("packed")

    @property
    def name(self) -> str:
        return f"copy_{self.kernel}"

    @property
    def name_expression(self) -> str:
        t = C_TYPES[self.dtype]
        if self.kernel == "packed":
            return f"copy_packed<{t}, {self.pack_size}, {self.block_size}, {self.unroll}>"
        if self.kernel == "packed_grid_stride":
            return f"copy_packed_grid_stride<{t}, {self.pack_size}, {self.block_size}>"
        return f"copy_{self.kernel}<{t}>"

    @property
    def config(self) -> dict:
        if self.kernel == "packed":
            return {"pack_size": self.pack_size, "block_size": self.block_size, "unroll": self.unroll}
        if self.kernel == "packed_grid_stride":
            return {"pack_size": self.pack_size, "block_size": self.block_size}
        return {"block_size": self.block_size}

    @property
    def alignment(self) -> int:
        return self.pack_size * np.dtype(self.dtype).itemsize if self.packed else 1

    def compiled(self, arch: str = None):
        return compile_kernels(SOURCE, [self.name_expression], arch=arch)

    def loaded(self):
        """The loaded kernel, kept after the first call: a launch costs microseconds."""
        if self not in _loaded:
            _loaded[self] = self.compiled().kernel(self.name_expression)
        return _loaded[self]

    def grid(self, n: int, kernel) -> int:
        """Blocks to launch for n elements."""
        if self.kernel == "one_per_thread":
            return -(-n // self.block_size)
        per_block = self.block_size * (self.pack_size * self.unroll if self.packed else 1)
        needed = max(1, -(-n // per_block))
        if self.kernel == "packed":  # one chunk per thread: the grid covers the array
            return needed
        # Grid-stride kernels: as many blocks as are resident at once (one wave),
        # never more than the work needs. Each thread then loops over the array.
        resident = device.gpu().sm_count * kernel.max_active_blocks_per_sm(self.block_size)
        return min(resident, needed)

    def launch(self, src: DeviceArray, dst: DeviceArray):
        """dst[:] = src[:], with checks that make a bad call an error, not a fault."""
        for name, array in (("src", src), ("dst", dst)):
            if array.dtype != np.dtype(self.dtype):
                raise InputError(f"{self.name} was compiled for {self.dtype}; {name} is {array.dtype}")
            if not array.aligned_to(self.alignment):
                raise InputError(
                    f"{name} (0x{array.ptr:x}) is not aligned to {self.alignment} bytes, which "
                    f"pack_size={self.pack_size} needs; use pack_size=1 or an aligned array")
        if src.size != dst.size:
            raise InputError(f"src has {src.size} elements but dst has {dst.size}")
        if src.size == 0:
            return
        kernel = self.loaded()
        kernel(self.grid(src.size, kernel), self.block_size, src, dst, src.size)


def random_input(n: int, dtype: str, seed=None) -> np.ndarray:
    """Fresh random values (never zeros: zeros hide unwritten outputs)."""
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32).astype(dtype)


def check_copy(variant: CopyVariant, src: DeviceArray, dst: DeviceArray, host: np.ndarray = None) -> float:
    """Poison dst, copy src into it, and demand an exact copy of ``host`` (fresh
    random values are uploaded to src first when host is None). Returns the
    relative error against the float64 reference, 0.0 for a correct copy;
    anything else raises."""
    if host is None:
        host = random_input(src.size, variant.dtype)
        src.copy_from(host)
    dst.poison()
    variant.launch(src, dst)
    device.synchronize()
    out = dst.to_numpy().reshape(-1)
    bits = f"u{host.itemsize}"
    wrong = np.flatnonzero(out.view(bits) != host.reshape(-1).view(bits))
    if len(wrong):
        raise AssertionError(f"{variant.name_expression} copied {len(wrong)} of {src.size} elements "
                             f"wrongly (first at index {wrong[0]})")
    # Bit-for-bit equal to the input, so equal to its float64 reference: error 0.
    return 0.0


class _InputPool:
    """Device buffers with fresh random inputs, one pair per (size, dtype), kept
    while a sweep measures several kernels on them: drawing and uploading 1 GiB
    of random numbers for every kernel would cost more than measuring it."""

    def __init__(self, budget_bytes: int = 8 << 30):
        self.budget_bytes = budget_bytes
        self.entries = {}

    def get(self, n: int, dtype: str):
        key = (n, dtype)
        if key not in self.entries:
            need = 2 * n * np.dtype(dtype).itemsize
            while self.entries and need + sum(2 * h.nbytes for h, _, _ in self.entries.values()) > self.budget_bytes:
                self.entries.pop(next(iter(self.entries)))  # the oldest goes first
            host = random_input(n, dtype)
            self.entries[key] = (host, DeviceArray.from_numpy(host), DeviceArray((n,), dtype))
        return self.entries[key]


inputs = _InputPool()


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
        try:
            import torch
        except ImportError:
            raise Unavailable("PyTorch is not installed") from None
        if not torch.cuda.is_available():
            raise Unavailable("PyTorch sees no GPU")
        src = torch.randn(n, device="cuda").to(getattr(torch, dtype))
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
    widest = PACK_BYTES_MAX // np.dtype(dtype).itemsize
    return [CopyVariant("one_per_thread", dtype, block_size=block_size),
            CopyVariant("grid_stride", dtype, block_size=block_size),
            CopyVariant("packed_grid_stride", dtype, pack_size=widest // 2, block_size=block_size),
            CopyVariant("packed_grid_stride", dtype, pack_size=widest, block_size=block_size),
            CopyVariant("packed", dtype, pack_size=widest, block_size=block_size)]
