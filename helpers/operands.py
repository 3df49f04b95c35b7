"""What elementwise chapters share on the host: fresh random inputs kept on the
device during a sweep, operand checks before a launch, and the PyTorch baseline.

Introduced in chapter 1 (copy) and shared from chapter 2 (GELU) on.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import device
from .bench import Unavailable
from .compiler import compile_kernels, loaded_kernel
from .device import DeviceArray
from .errors import InputError, LaunchConfigError

DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
try:  # bfloat16 on the host comes from ml_dtypes (NumPy has none)
    import ml_dtypes
    DTYPES["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is in requirements.txt
    pass


def np_dtype(name: str) -> np.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise InputError(f"dtype must be one of {tuple(DTYPES)}, got {name!r}") from None


PACK_BYTES_MAX = 16  # the widest single access of sm_90
# The storage types of the kernels that compute in float (GELU, softmax), as C++ names.
C_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}


def check_pack_size(pack_size: int, dtype: str):
    """A pack is a power of two of elements moving as one access of at most 16 bytes."""
    itemsize = np_dtype(dtype).itemsize
    if pack_size < 1 or pack_size & (pack_size - 1) or pack_size * itemsize > PACK_BYTES_MAX:
        raise InputError(f"pack_size must be a power of two with at most {PACK_BYTES_MAX} bytes "
                         f"per pack ({PACK_BYTES_MAX // itemsize} {dtype}), got {pack_size}")


def widest_pack(*arrays: DeviceArray) -> int:
    """The widest pack (elements, up to 16 bytes) that every array's address is aligned
    to; 1 when none is. (The dispatchers then take the widest that divides a row as well,
    where they need one.)"""
    itemsize = arrays[0].dtype.itemsize
    pack = PACK_BYTES_MAX // itemsize
    while pack > 1 and any(not a.aligned_to(pack * itemsize) for a in arrays):
        pack //= 2
    return pack


def full_pack(dtype: str) -> int:
    """Values of ``dtype`` in the widest pack, 16 bytes: 4 floats, 8 16-bit values."""
    return PACK_BYTES_MAX // np_dtype(dtype).itemsize


def widest_pack_for(length: int, dtype: str) -> int:
    """The widest pack (elements, up to 16 bytes) that divides ``length``: what the
    dispatchers pick for a row of that length when the arrays are aligned."""
    if length < 1:
        raise InputError(f"a row has at least one value, got {length}")
    return min(full_pack(dtype), length & -length)


_row_scratches = {}


def row_scratch(rows: int, name: str) -> DeviceArray:
    """A float32 vector of ``rows`` values kept between calls under ``name``: the
    per-row intermediates of the ladders' unfused kernels (softmax's max and sum,
    LayerNorm's mean and rstd). It grows when a call needs more rows."""
    if _row_scratches.get(name) is None or _row_scratches[name].shape[0] < rows:
        _row_scratches[name] = DeviceArray((rows,), "float32")
    return _row_scratches[name].view(0, rows)


def _check_workers() -> int:
    """Threads for the float64 checks: the cores, at most 16."""
    return min(os.cpu_count() or 1, 16)


def _row_blocks(rows: int, values: int) -> list:
    """(start, stop) blocks of rows to spread float64 work over the cores: one block when
    the work is small, else a few per core."""
    workers = _check_workers()
    if workers == 1 or values < 1 << 20 or rows < 2:
        return [(0, rows)]
    count = min(rows, 4 * workers)
    bounds = np.linspace(0, rows, count + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _map_row_blocks(fn, arrays) -> list:
    blocks = _row_blocks(len(arrays[0]), arrays[0].size)
    if len(blocks) == 1:
        return [fn(*arrays)]
    with ThreadPoolExecutor(max_workers=_check_workers()) as pool:
        return list(pool.map(lambda block: fn(*(a[block[0]:block[1]] for a in arrays)), blocks))


def by_rows(fn, *arrays):
    """``fn(*arrays)`` for a row-wise ``fn`` (each output row depends on the same rows of
    the inputs alone, such as a softmax or a LayerNorm reference): computed on blocks of
    rows in threads and joined, the same values as one call. NumPy releases the GIL in its
    array loops, so the blocks run on all cores: on the GPU host's 16 (2026-11-24), the
    float64 softmax of 262144 x 256 fp32 values took 0.27 s against 1.07 in one call, its
    largest error 0.08 against 0.91 (max_by_rows), LayerNorm's 0.54 against 1.70 and 0.04
    against 0.51. ``fn`` returns an array or a tuple of arrays."""
    parts = _map_row_blocks(fn, arrays)
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(column) for column in zip(*parts))
    return np.concatenate(parts)


def max_by_rows(fn, *arrays) -> float:
    """The largest of ``fn`` over blocks of rows of ``arrays`` (as ``by_rows``), for an
    ``fn`` that returns the largest error of its rows: the same value as one call, NaN
    included (one NaN block makes the result NaN)."""
    return float(np.max(_map_row_blocks(fn, arrays)))


def check_by_rows(what: str, out: np.ndarray, host: np.ndarray, dtype: str, tolerance: float, references,
                  kind, reference_rows, error_rows) -> float:
    """The largest error of ``out`` against the float64 reference of ``host``: the reference
    ``reference_rows(host)`` computed once per input and ``kind`` (``references``, a
    HostReferences) and both on blocks of rows (by_rows, max_by_rows); ``error_rows(out,
    *reference)`` gives the largest error of its rows. Raises past ``tolerance`` (within), NaN included."""
    reference = references.get(host, kind, lambda h: by_rows(reference_rows, h))
    error = max_by_rows(error_rows, out, *(reference if isinstance(reference, tuple) else (reference,)))
    return within(error, tolerance, f"{what} on {host.shape} {dtype}")


def within(error: float, tolerance: float, what: str) -> float:
    """The error, or AssertionError past the tolerance (NaN counts as infinite)."""
    if not error <= tolerance:
        raise AssertionError(f"{what}: error {error:.3g} exceeds the tolerance {tolerance:.3g} "
                             "(NaN counts as infinite)")
    return error


class HostReferences:
    """float64 references of host inputs, computed once per (input, kind) and kept for
    the last few inputs: a sweep checks many kernels against the same input, and a
    reference of 2^28 values takes seconds. An input is known by its memory (address,
    shape, strides), so two views of the same values (a reshape per measurement) share
    an entry while two offset views do not; each entry holds its input, so the memory
    is not reused meanwhile."""

    def __init__(self, keep: int = 4):
        self.keep, self.entries = keep, {}

    def get(self, host: np.ndarray, kind, compute):
        key = (host.__array_interface__["data"][0], host.shape, host.strides, host.dtype.str, kind)
        if key not in self.entries:
            while len(self.entries) >= self.keep:
                self.entries.pop(next(iter(self.entries)))  # the oldest goes first
            self.entries[key] = (host, compute(host))
        return self.entries[key][1]


@dataclass(frozen=True)
class ElementwiseVariant:
    """One instance of an elementwise kernel ``kernel(const T* in, T* out, long long n)``:
    which template, which dtype, pack and block size. Subclasses (a chapter each)
    name the source file, the C types they take, their operands, and how their
    template is instantiated and their grid sized."""
    kernel: str
    dtype: str = "float32"
    pack_size: int = 1  # elements per access (the packed kernels)
    block_size: int = 256

    SOURCE: ClassVar[str]
    KERNELS: ClassVar[tuple]
    C_TYPES: ClassVar[dict]
    OPERANDS: ClassVar[tuple] = ("x", "y")

    def __post_init__(self):
        if self.kernel not in self.KERNELS:
            raise InputError(f"kernel must be one of {self.KERNELS}, got {self.kernel!r}")
        if self.dtype not in self.C_TYPES:
            raise InputError(f"dtype must be one of {tuple(self.C_TYPES)}, got {self.dtype!r}")
        if not 1 <= self.block_size <= 1024:
            raise LaunchConfigError(f"block_size must be in 1..1024, got {self.block_size}")
        if self.packed:
            check_pack_size(self.pack_size, self.dtype)
            if self.block_size % 32:
                raise LaunchConfigError(f"block_size must be a multiple of 32 (a whole number of warps), "
                                        f"got {self.block_size}; try {max(32, self.block_size // 32 * 32)}")

    @property
    def packed(self) -> bool:
        return self.kernel.startswith("packed")

    @property
    def name(self) -> str:
        return f"{self.SOURCE.removesuffix('.cu')}_{self.kernel}"

    @property
    def c_type(self) -> str:
        return self.C_TYPES[self.dtype]

    @property
    def alignment(self) -> int:
        return self.pack_size * np_dtype(self.dtype).itemsize if self.packed else 1

    def compiled(self, arch: str = None):
        return compile_kernels(self.SOURCE, [self.name_expression], arch=arch)

    def loaded(self):
        return loaded_kernel(self.SOURCE, self.name_expression)

    def one_wave(self, kernel, needed: int) -> int:
        """Blocks for a grid-stride kernel: as many as are resident at once (one wave),
        never more than the work needs. Each thread then loops over the array."""
        resident = device.gpu().sm_count * kernel.max_active_blocks_per_sm(self.block_size)
        return max(1, min(resident, needed))

    def launch(self, source: DeviceArray, out: DeviceArray):
        """out = f(source), with checks that make a bad call an error, not a fault."""
        names = self.OPERANDS
        check_operands(self.name, self.dtype, self.alignment, **{names[0]: source, names[1]: out})
        if source.size == 0:
            return
        kernel = self.loaded()
        kernel(self.grid(source.size, kernel), self.block_size, source, out, source.size)


def check_operands(kernel_name: str, dtype: str, alignment: int, **arrays: DeviceArray):
    """Same dtype, same size, and addresses aligned for the kernel's vector accesses;
    otherwise an InputError that says which operand and what would work."""
    sizes = {name: array.size for name, array in arrays.items()}
    for name, array in arrays.items():
        if not isinstance(array, DeviceArray):
            raise InputError(f"{kernel_name}: {name} must be a DeviceArray, got {type(array).__name__}")
        if array.dtype != np_dtype(dtype):
            raise InputError(f"{kernel_name} was compiled for {dtype}; {name} is {array.dtype}")
        if not array.aligned_to(alignment):
            raise InputError(f"{name} (0x{array.ptr:x}) is not aligned to {alignment} bytes, which this "
                             f"kernel's packs need; use pack_size=1 or an aligned array")
    if len(set(sizes.values())) > 1:
        raise InputError(f"{kernel_name}: operands differ in size: " +
                         ", ".join(f"{name} has {size} elements" for name, size in sizes.items()))


def check_row_fits(kernel: str, cols: int, pack_size: int, edges: bool, max_cols: int | None, dispatcher: str):
    """A row of ``cols`` values for a kernel of ``pack_size``-value packs that holds at most
    ``max_cols`` of them (None: any): the pack must divide the row, unless the kernel takes the
    row's aligned middle in packs and its edges alone (``edges``); the row, or that middle,
    must fit. Otherwise an InputError that names what would work (``dispatcher`` takes any row)."""
    if cols % pack_size and not edges:
        raise InputError(f"{kernel}: cols ({cols}) must be a multiple of pack_size ({pack_size}) unless "
                         f"edges=True (cluster path); {dispatcher} takes any row")
    held = cols // pack_size * pack_size if edges else cols  # the most a row's middle holds
    if max_cols is not None and held > max_cols:
        raise InputError(f"{kernel} holds at most {max_cols} values per row"
                         f"{' in its aligned middle' if edges else ''}, "
                         f"got {held}: use more cols_per_thread, a larger block or cluster, or another path")


def written_over_poison(out: DeviceArray, write) -> np.ndarray:
    """Poison ``out`` (0xFF bytes: NaN in every float format), let ``write(out)`` fill it, wait for
    the GPU, and return what ``out`` holds: an element the write missed still holds the poison,
    which every check of every chapter rejects."""
    out.poison()
    write(out)
    device.synchronize()
    return out.to_numpy()


def random_normal(n: int, dtype: str) -> np.ndarray:
    """Fresh standard-normal values (never zeros: zeros hide unwritten outputs)."""
    return np.random.default_rng().standard_normal(n, dtype=np.float32).astype(np_dtype(dtype))


class InputPool:
    """Device buffers holding fresh random inputs, one set per (size, dtype, kind),
    kept while a sweep measures several kernels on them: drawing and uploading
    1 GiB of random numbers for every kernel would cost more than measuring it.
    Each entry is (host input, device input, device output); the output is
    poisoned by each check before the kernel writes it."""

    def __init__(self, budget_bytes: int = 8 << 30):
        self.budget_bytes = budget_bytes
        self.entries = {}

    def get(self, n: int, dtype: str, make_input=random_normal):
        """``make_input(n, dtype)`` draws the host values the first time."""
        key = (n, dtype, make_input)
        if key not in self.entries:
            need = 2 * n * np_dtype(dtype).itemsize
            while self.entries and need + sum(2 * h.nbytes for h, *_ in self.entries.values()) > self.budget_bytes:
                self.entries.pop(next(iter(self.entries)))  # the oldest goes first
            host = make_input(n, dtype)
            self.entries[key] = (host, DeviceArray.from_numpy(host), DeviceArray((n,), dtype))
        return self.entries[key]


def torch_module():
    """PyTorch, or Unavailable (the baseline is then not measured) with the reason."""
    try:
        import torch
    except ImportError:
        raise Unavailable("PyTorch is not installed") from None
    if not torch.cuda.is_available():
        raise Unavailable("PyTorch sees no GPU")
    return torch


_compiled_torch = {}


def torch_compiled_for_shape(key, fn):
    """``torch.compile(fn, dynamic=False)``, compiled once per ``key`` (which names the
    operation and the shape): Inductor specializes its kernel to the shape, its best case.
    Dynamo's limits on recompilations are raised, since a sweep compiles one per shape."""
    if key not in _compiled_torch:
        import torch
        import torch._dynamo
        for limit in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 256))
        _compiled_torch[key] = torch.compile(fn, dynamic=False)
    return _compiled_torch[key]


def torch_tensor(x: DeviceArray):
    """A PyTorch tensor over ``x``'s device memory, no copy: the peers are measured on the
    very bytes our kernels read. bfloat16 (which ``__cuda_array_interface__`` cannot name)
    is shared as int16 and viewed back as torch.bfloat16."""
    torch = torch_module()
    if x.dtype == np_dtype("bfloat16"):
        bits = DeviceArray(x.shape, np.int16, _ptr=x.ptr, _owner=x)
        return torch.as_tensor(bits, device="cuda").view(torch.bfloat16)
    return torch.as_tensor(x, device="cuda")


def outputs_where_torch_puts_them(y: DeviceArray):
    """A function giving the array a timed run writes to: a tensor shaped and typed as ``y``,
    fresh from PyTorch's caching allocator, freed as soon as the caller drops it. Timed in turns,
    each run drops its output before the next allocates, so ours and PyTorch's calls write the
    same block, as PyTorch's own outputs do among themselves. Without PyTorch, ``y`` itself.

    Where the output lives moves a kernel's time, and PyTorch's outputs never land in ``y``:
    layer_norm() writing 256 MiB to ``y`` ran 0.15-0.8% slower than into PyTorch's block (H200,
    2026-11-27, chapter 5's "Where the output lives"), as much as the gaps it was chasing."""
    try:
        torch = torch_module()
    except Unavailable:
        return lambda: y
    kind = torch_dtype(torch, y.dtype.name)

    def fresh() -> DeviceArray:
        tensor = torch.empty(y.shape, dtype=kind, device="cuda")
        return DeviceArray(y.shape, y.dtype, _ptr=tensor.data_ptr(), _owner=tensor)
    return fresh


def torch_dtype(torch, dtype: str):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
