"""Chapter 3's reductions (kernels/reduce.cu), host side: whole-array sums (the
classic ladder) and row-wise sum and max, with the error bound the tests use.

A whole-array sum moves n * 4 bytes (the 4-byte result is not counted): the
bytes formula is ``bytes_moved``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from . import device
from .arith import ceil_div
from .bench import Unavailable
from .compiler import compile_kernels, loaded_kernel
from .device import DeviceArray
from .errors import InputError, LaunchConfigError
from .operands import (HostReferences, InputPool, torch_compiled_for_shape, torch_module, torch_tensor,
                       within, written_over_poison)

SOURCE = "reduce.cu"
SOURCES = ["kernels/reduce.cu", "kernels/reduce.cuh", "kernels/pack.cuh"]
LADDER = ("interleaved_divergent", "interleaved_strided", "sequential", "first_add", "unroll_last_warp",
          "complete_unroll", "cascaded", "shuffle", "single_pass")
TWO_PER_THREAD = ("first_add", "unroll_last_warp", "complete_unroll")  # each thread loads two elements
GRID_STRIDE = ("cascaded", "shuffle", "single_pass")  # one wave of blocks; each thread loops
UNIT_ROUNDOFF = 2.0 ** -24  # float32
FOLDS = (1, 2, 4, 8)  # 16-byte loads in flight per thread (the fast kernels' template parameter)
GROUP_WIDTHS = (1, 2, 4, 8, 16, 32)  # lanes per row when a warp serves several rows (warp_reduce<Op, Width>)


def bytes_moved(n: int) -> int:
    """A sum reads n float32 values once: 4 * n bytes."""
    return 4 * int(n)


def _require_float32(name, array):
    if not isinstance(array, DeviceArray) or array.dtype != np.float32:
        raise InputError(f"{name} must be a float32 DeviceArray, got "
                         f"{getattr(array, 'dtype', type(array).__name__)}")


def _check_fold(fold):
    if fold not in FOLDS:
        raise InputError(f"fold (16-byte loads in flight per thread) must be one of {FOLDS}, got {fold!r}")


@dataclass(frozen=True)
class SumVariant:
    step: str = "single_pass"  # one of LADDER
    block_size: int = 256
    fold: int = None  # the single pass only: 16-byte loads in flight per thread (default 4)
    evict_first: bool = False  # the single pass only: mark the loads read-once (ld.global.cs)

    def __post_init__(self):
        if self.step not in LADDER:
            raise InputError(f"step must be one of {LADDER}, got {self.step!r}")
        if self.block_size not in (64, 128, 256, 512, 1024):
            raise LaunchConfigError(f"block_size must be a power of two from 64 to 1024 (the tree halves it "
                                    f"down to one warp), got {self.block_size}")
        if self.step != "single_pass":
            if self.fold not in (None, 1) or self.evict_first:
                raise InputError(f"fold and evict_first apply to the single pass only; step {self.step!r} "
                                 f"loads one element at a time")
            object.__setattr__(self, "fold", 1)
        else:
            object.__setattr__(self, "fold", 4 if self.fold is None else self.fold)
            _check_fold(self.fold)

    @property
    def name(self) -> str:
        return f"reduce_{self.step}"

    @property
    def name_expression(self) -> str:
        if self.step == "single_pass":
            return f"reduce_single_pass<{self.block_size}, {self.fold}, {str(self.evict_first).lower()}>"
        return f"reduce_{self.step}<{self.block_size}>"

    @property
    def config(self) -> dict:
        if self.step == "single_pass":
            return {"block_size": self.block_size, "fold": self.fold, "evict_first": self.evict_first}
        return {"block_size": self.block_size}

    def compiled(self, arch: str = None):
        return compile_kernels(SOURCE, [self.name_expression], arch=arch)

    def grid(self, n: int) -> int:
        per_block = self.block_size * (2 if self.step in TWO_PER_THREAD else 1)
        needed = max(1, ceil_div(n, per_block))
        if self.step in GRID_STRIDE:
            kernel = loaded_kernel(SOURCE, self.name_expression)
            return min(needed, device.gpu().sm_count * kernel.max_active_blocks_per_sm(self.block_size))
        return needed

    def elements_per_thread(self, n: int) -> int:
        """How many inputs one thread adds up sequentially before the tree (for the bound)."""
        return max(1, ceil_div(n, self.grid(n) * self.block_size))

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


RECORDED_L2_BYTES = 60 << 20  # the H200 of book/data/reduce.json
# The single pass loads evict-first for arrays of at most this many L2s. Timed in turns with plain
# loads on the H200 (2026-11-25, medians of three measurements), evict-first / plain speed: 64 MiB
# 1.125x, 96 MiB 1.106x, 128 MiB 1.076x, 192 MiB 1.019x, 256 MiB 0.986x, 512 MiB 0.933x, 1 GiB
# 0.906x: the two meet near 230 MiB, about 3.8 L2s.
EVICT_FIRST_UP_TO_L2S = 3.5


def sum_variant_for(n: int) -> SumVariant:
    """The library's choice for a whole-array sum, read off chapter 3's measurements:
    the single pass with 1024 threads and one 16-byte load per iteration (the compiler
    unrolls the walk itself), and evict-first loads for arrays of up to
    EVICT_FIRST_UP_TO_L2S times the L2, where they pay (beyond, they cost up to 9% on an H200)."""
    # Without a GPU (replay) the recorded H200's L2 decides, as it did when recording.
    l2_bytes = device.gpu().l2_bytes if device.no_gpu_reason() is None else RECORDED_L2_BYTES
    return SumVariant("single_pass", 1024, 1, evict_first=bytes_moved(n) <= EVICT_FIRST_UP_TO_L2S * l2_bytes)


def array_sum(x: DeviceArray) -> float:
    """The sum of a float32 array of any size and alignment, in one launch."""
    return sum_variant_for(x.size).sum(x)


def bank_conflict_cycles(strides=(1, 2, 4, 8, 16, 32), repeats: int = 4096) -> dict:
    """Cycles per dependent shared-memory read-modify-write when the 32 lanes of a warp
    access s[lane * stride] (kernels/reduce.cu, bank_conflict_probe): {stride: cycles}."""
    kernel = loaded_kernel(SOURCE, "bank_conflict_probe")
    cycles, sink = DeviceArray((1,), np.int64), DeviceArray((32,), np.float32)
    found = {}
    for stride in strides:
        kernel(1, 32, np.int32(stride), np.int32(repeats), cycles, sink)  # warm-up
        kernel(1, 32, np.int32(stride), np.int32(repeats), cycles, sink)
        device.synchronize()
        found[stride] = float(cycles.to_numpy()[0]) / repeats
    return found

ROW_OPS = {"sum": "Sum", "max": "Max"}
ROW_KERNELS = ("block", "warp")


@dataclass(frozen=True)
class RowVariant:
    op: str = "sum"
    kernel: str = "block"  # a block per row, or a warp per row
    block_size: int = 256
    fold: int = 4  # 16-byte loads in flight per thread
    group_width: int = 32  # the "warp" kernel: lanes per row (fewer than 32 for short rows)

    def __post_init__(self):
        _check_fold(self.fold)
        if self.group_width not in GROUP_WIDTHS or (self.kernel == "block" and self.group_width != 32):
            raise InputError(f"group_width (lanes per row of the warp kernel) must be a power of two up to 32, "
                             f"and 32 for the block kernel; got {self.group_width}")
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
        if self.kernel == "warp":
            return f"row_reduce_warp<{ROW_OPS[self.op]}, {self.block_size}, {self.fold}, {self.group_width}>"
        return f"row_reduce_block<{ROW_OPS[self.op]}, {self.block_size}, {self.fold}>"

    @property
    def config(self) -> dict:
        config = {"kernel": self.kernel, "block_size": self.block_size, "fold": self.fold}
        return {**config, "group_width": self.group_width} if self.kernel == "warp" else config

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
            rows_per_block = self.block_size // self.group_width
            kernel(ceil_div(rows, rows_per_block), self.block_size, x, y, rows, cols)


def power_of_two_at_least(value: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(value, 1))))


def lane_group_shape(cols: int, pack: int, itemsize: int, least_bytes: int) -> tuple[int, int]:
    """(values per lane, lanes per row) for a row of ``cols`` values held in the registers
    of a group of lanes: each lane holds a whole pack and at least ``least_bytes`` of the
    row (fewer lanes to reduce across), and the group, a power of two up to a warp, is
    just wide enough for the row."""
    per_thread = max(pack, least_bytes // itemsize, power_of_two_at_least(ceil_div(cols, 32)))
    return per_thread, min(32, power_of_two_at_least(ceil_div(cols, per_thread)))


# Rows of odd length load one value at a time (pack 1), and each value takes a register of its
# own, whatever its type. Shape tables made for 16-byte packs hold such a row in power-of-two
# slots, so a row of 2^k + 1 values leaves half of them empty: 4097 fp32 values in 512 threads
# of 16 hold two rows an SM where fitted blocks hold five. Fitted to the row (lone_value_shape),
# in turns with the old shapes and torch.compile (H200, 2026-11-24, about 512 MiB moved, us, old ->
# fitted (torch.compile)): LayerNorm fp32 32760 x 4097 529 -> 287 (420), 44724 x 3001 401 -> 274
# (560), 4095 x 32769 1072 -> 474 (543), 1342 x 100001 534 -> 474 (571); fp16 65520 x 4097 802 ->
# 551 (914); softmax fp32 32760 x 4097 379 -> 277 (torch 451), 4095 x 32769 528 -> 333 (415);
# fp16 65520 x 4097 765 -> 406 (903). Clusters of such blocks paid only for fp32 and up to 8
# blocks (16 of 256 threads: LayerNorm 65537 721 us against 593 re-reading the row); 16-bit rows
# past one block were faster re-read (LayerNorm fp16 8191 x 32769: 770 against 871 in a cluster;
# softmax 32769: 476 against 542).
LONE_VALUES_MOST = 32  # values a thread holds, a register each (1024-thread blocks get 64 registers a thread)
LONE_CLUSTER_BLOCKS = (256, 512)
LONE_LARGEST_CLUSTER = 8
CLUSTER_SIZES = (1, 2, 4, 8, 16)  # blocks per row on a cluster path (16: Hopper's non-portable maximum)


def covering_cluster(cols: int, block: int, per_thread: int) -> int:
    """Blocks per row, a power of two, for blocks of ``block`` threads holding ``per_thread``
    values each to hold a row of ``cols`` between them (the panels' cluster shapes)."""
    cluster = power_of_two_at_least(ceil_div(cols, block * per_thread))
    if cluster > CLUSTER_SIZES[-1]:
        raise LaunchConfigError(f"a row of {cols} needs more than {CLUSTER_SIZES[-1]} blocks of {block} threads")
    return cluster


def lone_value_shape(cols: int, blocks: tuple, clusters: bool) -> tuple[int, int, int] | None:
    """(block, values per thread, blocks per row) for a row of ``cols`` lone values held in
    registers: the smallest of ``blocks`` in which no thread holds more than LONE_VALUES_MOST,
    each holding just what the row needs; else (``clusters``) the smallest cluster of up to
    LONE_LARGEST_CLUSTER blocks of LONE_CLUSTER_BLOCKS threads (smaller blocks first); None
    when neither holds the row (the caller re-reads it)."""
    if cols < 1:
        raise InputError(f"a row needs at least one value, got {cols}")
    shapes = [(block, 1) for block in blocks]
    if clusters:
        shapes += [(block, 2 ** k) for block in LONE_CLUSTER_BLOCKS  # clusters of 2, 4, ... blocks
                   for k in range(1, LONE_LARGEST_CLUSTER.bit_length())]
    for block, cluster in shapes:
        per_thread = ceil_div(cols, block * cluster)
        if per_thread <= LONE_VALUES_MOST:
            return block, per_thread, cluster
    return None


def row_variant_for(cols: int, op: str = "sum") -> RowVariant:
    """The dispatcher's choice for rows of ``cols`` float32 values, as a library would
    make it (the chapter measures each rule). Rows up to 1024 long get a group of
    lanes each: enough lanes that each has at most 2 packs of 16 bytes (up to a
    whole warp), all loaded at once; a group narrower than a warp lets one warp
    serve several short rows instead of idling most of its lanes. Longer rows get
    a block each: 256 threads, or 1024 for rows long enough that many loads in
    flight per row matter more than the last wave of blocks."""
    packs = ceil_div(max(cols, 1), 4)
    if cols <= 1024:
        group = min(32, power_of_two_at_least(ceil_div(packs, 2)))
        return RowVariant(op, "warp", 256, min(8, power_of_two_at_least(ceil_div(packs, group))), group)
    return RowVariant(op, "block", 256 if cols <= 16384 else 1024, 4)


def row_reduce(x: DeviceArray, y: DeviceArray, op: str = "sum") -> RowVariant:
    """y[r] = op over x[r, :] with the dispatcher's kernel (row_variant_for); returns it."""
    if len(x.shape) != 2:
        raise InputError(f"x must be a (rows, cols) matrix, got shape {x.shape}")
    variant = row_variant_for(x.shape[1], op)
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
    sums = [SumVariant(step, b) for step in LADDER for b in (64, 1024)]
    sums += [SumVariant("single_pass", 256, fold, True) for fold in FOLDS]
    cases = [whole(v, n) for v in sums for n in (1, 31, 1023, (1 << 16) + 7)]
    row_variants = [RowVariant(op, "block", b, f) for op in ROW_OPS for b in (32, 256) for f in (1, 8)]
    row_variants += [RowVariant(op, "warp", b, f, g) for op in ROW_OPS for b in (32, 256) for f in (1, 8)
                     for g in (4, 32)]
    cases += [rows(v, shape) for v in row_variants for shape in ((1, 1), (33, 7), (5, 4097), (3, 1000))]
    cases.append(("bank_conflict_probe strides 1-32", lambda: bank_conflict_cycles(repeats=64)))
    return cases


# ---------------------------------------------------------------- measuring (chapter 3)

inputs = InputPool()
_exact = HostReferences()


def _exact_of(host: np.ndarray):
    """The float64 sums along the last axis of a host input, and of its magnitudes."""
    def sums(h):
        wide = h.astype(np.float64)
        return wide.sum(axis=-1), np.abs(wide).sum(axis=-1)
    return _exact.get(host, "sums", sums)


def check_sum(variant: SumVariant, x: DeviceArray, host: np.ndarray) -> float:
    """Run once with the result poisoned; the error |sum - exact| / sum |x_i| (the
    error relative to the size of the terms, which is what summation controls: the sum
    itself can be near zero) must be within the variant's bound. Returns the error."""
    exact, magnitude = _exact_of(host)
    result = variant.launch(x)
    device.synchronize()
    got = float(result.to_numpy()[0])
    if not abs(got - exact) <= variant.error_bound(host.size, magnitude):
        raise AssertionError(f"{variant.name_expression} on {host.size} elements: {got!r} vs float64 {exact!r}, "
                             f"beyond the bound {variant.error_bound(host.size, magnitude):.3g}")
    return abs(got - exact) / max(magnitude, np.finfo(np.float64).tiny)


def sum_measurement(variant: SumVariant, n: int, *, provider: str = None) -> dict:
    """What ``bench.measure`` needs to check a sum against float64 on fresh normal inputs
    and time it. Every size is checked: the float64 sum of 2^28 values takes a second."""
    def setup():
        host, x, _ = inputs.get(n, "float32")
        return (lambda: variant.launch(x)), (lambda: check_sum(variant, x, host))
    return dict(provider=provider or variant.name, dtype="float32", shape=[n], config=variant.config,
                bytes=bytes_moved(n), setup=setup)


def measure_sum(bench, variant: SumVariant, n: int):
    return bench.measure(**sum_measurement(variant, n))


def _row_bytes(rows: int, cols: int) -> int:
    """A row reduction reads rows * cols floats and writes rows: 4 * rows * (cols + 1) bytes."""
    return 4 * rows * (cols + 1)


def check_rows(variant: RowVariant, x: DeviceArray, y: DeviceArray, host: np.ndarray) -> float:
    """Poison y, run, compare with float64: max is exact in any order; a row sum must be
    within gamma_d * sum |x| with d = cols + the tree's depth. Returns the largest
    error relative to sum |x| (sum) or 0 (max)."""
    out = written_over_poison(y, lambda out: variant.launch(x, out)).astype(np.float64)
    if variant.op == "max":
        if not np.array_equal(out, host.max(axis=-1).astype(np.float64)):
            raise AssertionError(f"{variant.name_expression}: a row max differs from the exact one")
        return 0.0
    exact, magnitude = _exact_of(host)
    cols = host.shape[-1]
    depth = cols + 2 * math.ceil(math.log2(max(cols, 2))) + 4
    bound = depth * UNIT_ROUNDOFF / (1 - depth * UNIT_ROUNDOFF) * magnitude
    if not (np.abs(out - exact) <= bound).all():
        raise AssertionError(f"{variant.name_expression}: a row sum is beyond its error bound")
    return float((np.abs(out - exact) / np.maximum(magnitude, np.finfo(np.float64).tiny)).max())


def _matrix(rows, cols):
    host, x, _ = inputs.get(rows * cols, "float32")
    return host.reshape(rows, cols), x.reshape(rows, cols)


_outputs = {}


def _row_output(rows):
    if rows not in _outputs:
        _outputs[rows] = DeviceArray((rows,), np.float32)
    return _outputs[rows]


def rows_measurement(variant: RowVariant, rows: int, cols: int, *, provider: str = None) -> dict:
    def setup():
        host, x = _matrix(rows, cols)
        y = _row_output(rows)
        return (lambda: variant.launch(x, y)), (lambda: check_rows(variant, x, y, host))
    return dict(provider=provider or variant.name, dtype="float32", shape=[rows, cols], config=variant.config,
                bytes=_row_bytes(rows, cols), setup=setup)


# ---------------------------------------------------------------- the peers, on the same bytes

def _torch_view(x: DeviceArray):
    return torch_module(), torch_tensor(x)


def _torch_sum(torch, dims, compiled: bool, shape):
    """torch.sum over ``dims``, eager or torch.compile'd for this one shape."""
    fn = (lambda t: t.sum()) if dims is None else (lambda t: t.sum(dims))
    return torch_compiled_for_shape(("sum", dims, tuple(shape)), fn) if compiled else fn


PEER_TOLERANCE = 1e-5  # |sum - exact| / sum |x| for the libraries we compare with: a sanity check


def _check_peer(got, exact, magnitude, what: str) -> float:
    error = np.abs(np.asarray(got, np.float64) - exact) / np.maximum(magnitude, np.finfo(np.float64).tiny)
    return within(float(error.max()), PEER_TOLERANCE, f"{what} against the float64 sum")  # a NaN max raises


def _check_torch(run, torch, exact, magnitude, what):
    out = run()
    torch.cuda.synchronize()
    return _check_peer(out.double().cpu().numpy(), exact, magnitude, what)


def torch_sum_measurement(n: int, *, compiled: bool = False) -> dict:
    """``torch.sum`` (eager or torch.compile'd) on the very bytes our kernels sum."""
    def setup():
        host, x, _ = inputs.get(n, "float32")
        torch, t = _torch_view(x)
        fn = _torch_sum(torch, None, compiled, t.shape)
        exact, magnitude = _exact_of(host)
        return (lambda: fn(t)), (lambda: _check_torch(lambda: fn(t), torch, exact, magnitude, "torch.sum"))
    return dict(provider="torch.compile" if compiled else "torch", dtype="float32", shape=[n],
                config={"op": "sum"}, bytes=bytes_moved(n), setup=setup)


def measure_torch_sum(bench, n: int, *, compiled: bool = False):
    return bench.measure(**torch_sum_measurement(n, compiled=compiled))


def cub_description() -> str:
    """What cupy.sum runs: CUB's device reduction when CuPy's CUB accelerator is on."""
    try:
        from cupy._core import _accelerator
        return "CUB (cupy.sum)" if _accelerator.ACCELERATOR_CUB in _accelerator.get_reduction_accelerators() \
            else "cupy.sum (CuPy's own reduction: CUB accelerator off)"
    except (ImportError, AttributeError):
        return "cupy.sum"


def cub_sum_measurement(n: int) -> dict:
    """``cupy.sum``, which CuPy runs through CUB's DeviceReduce (CUPY_ACCELERATORS=cub,
    CuPy's default), on the very bytes our kernels sum."""
    def setup():
        os.environ.setdefault("CUPY_ACCELERATORS", "cub")  # CuPy's default since v11; read at import
        try:
            import cupy
        except ImportError:
            raise Unavailable("CuPy is not installed") from None
        host, x, _ = inputs.get(n, "float32")
        c = cupy.asarray(x)
        exact, magnitude = _exact_of(host)
        return (lambda: c.sum()), (lambda: _check_peer(float(c.sum()), exact, magnitude, "cupy.sum"))
    return dict(provider="cub", dtype="float32", shape=[n], config={"op": "cupy.sum"}, bytes=bytes_moved(n),
                setup=setup)


def measure_cub_sum(bench, n: int):
    return bench.measure(**cub_sum_measurement(n))


def measure_sum_versus_peers(bench, n: int) -> list:
    """array_sum()'s kernel (sum_variant_for), torch.sum eager and torch.compile'd, and CUB
    (cupy.sum), on the same bytes, timed in turns (one repetition of each per round):
    [ours, eager, compiled, CUB], None for what is not installed."""
    return bench.measure_together([sum_measurement(sum_variant_for(n), n, provider="array_sum()"),
                                   torch_sum_measurement(n), torch_sum_measurement(n, compiled=True),
                                   cub_sum_measurement(n)])


def torch_rows_measurement(rows: int, cols: int, *, compiled: bool = False) -> dict:
    """``x.sum(-1)`` (eager or torch.compile'd) on the very bytes our row kernels read."""
    def setup():
        host, x = _matrix(rows, cols)
        torch, t = _torch_view(x)
        fn = _torch_sum(torch, -1, compiled, t.shape)
        exact, magnitude = _exact_of(host)
        return (lambda: fn(t)), (lambda: _check_torch(lambda: fn(t), torch, exact, magnitude, "torch.sum(-1)"))
    return dict(provider="torch.compile" if compiled else "torch", dtype="float32", shape=[rows, cols],
                config={"op": "sum(-1)"}, bytes=_row_bytes(rows, cols), setup=setup)


def measure_rows_versus_torch(bench, rows: int, cols: int) -> list:
    """row_reduce()'s kernel (row_variant_for), x.sum(-1) eager and torch.compile'd, on the
    same bytes, timed in turns: [ours, eager, compiled], None for what is not installed."""
    return bench.measure_together([rows_measurement(row_variant_for(cols), rows, cols, provider="row_reduce()"),
                                   torch_rows_measurement(rows, cols),
                                   torch_rows_measurement(rows, cols, compiled=True)])
