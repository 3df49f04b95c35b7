"""Chapter 4's softmax kernels (kernels/softmax.cu), host side: the ladder's naive and
FasterTransformer-style kernels, the library's paths (a lane group per row with the
row in registers; a block or a thread-block cluster per row with the row in
registers; a block per row with the row in shared memory; a block per row re-reading
the row, optionally online), their launch rules, the dispatcher that picks among them
as a library would, and the measurements of chapter 4.

A softmax moves 2 * rows * cols * sizeof(T) bytes when it reads the row once
(``bytes_moved``); every variant is charged only those bytes, whatever it re-reads
(``SoftmaxVariant.traffic`` says what it actually moves).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import device
from .arith import ceil_div
from .compiler import compile_kernels, loaded_kernel
from .device import DeviceArray
from .errors import InputError, LaunchConfigError
from .operands import (C_TYPES, HostReferences, InputPool, check_by_rows, check_operands, check_pack_size,
                       check_row_fits, full_pack, np_dtype, outputs_where_torch_puts_them, row_scratch,
                       torch_compiled_for_shape, torch_module, torch_tensor, widest_pack, written_over_poison)
from .reduce_kernels import CLUSTER_SIZES, GROUP_WIDTHS, lane_group_shape, lone_value_shape

SOURCE = "softmax.cu"
SOURCES = ["kernels/softmax.cu", "kernels/edges.cuh", "kernels/rows.cuh", "kernels/convert.cuh", "kernels/reduce.cuh",
           "kernels/pack.cuh"]
# The ladder's first two steps, then the library's paths.
PATHS = ("naive", "ft_style", "warp", "block_cached", "block_uncached", "cluster")
MAX_COLS_PER_THREAD = 32  # warp path: floats per thread for the row; beyond this it spills
ROW_BYTES_PER_THREAD = 128  # cluster path: bytes of the row per thread, in 32 registers
SHARED_BYTES_PER_THREAD = 128  # cluster path: bytes per thread it may keep in shared memory besides
NAIVE_BLOCK = 256


def bytes_moved(rows: int, cols: int, dtype) -> int:
    """Each element read once and written once: 2 * rows * cols * sizeof(T) bytes."""
    return 2 * int(rows) * int(cols) * np_dtype(dtype).itemsize


@dataclass(frozen=True)
class SoftmaxVariant:
    path: str = "warp"
    dtype: str = "float32"
    pack_size: int = 4
    block_size: int = 128
    cols_per_thread: int = 4  # warp and cluster paths: row values each thread holds in registers
    group_width: int = 32  # warp path: lanes per row
    rows_per_group: int = 1  # warp path: rows each group handles at once
    pack_major_cache: bool = True  # block_cached: the bank-conflict-free [pack][num_packs] layout
    cluster_size: int = 1  # cluster path: blocks per row (1: a block per row, the row in registers)
    shared_cols_per_thread: int = 0  # cluster path: row values each thread keeps in shared memory as well
    online: bool = False  # block_uncached: max and sum in one pass over the row (two reads, not three)
    rows_per_block: int = 1  # ft_style: rows a block walks (FasterTransformer: 1, or a head's rows)
    log: bool = False  # log-softmax instead of softmax
    edges: bool = False  # cluster path: rows pack_size need not divide (each row's aligned middle in packs)

    def __post_init__(self):
        if self.path not in PATHS:
            raise InputError(f"path must be one of {PATHS}, got {self.path!r}")
        if self.dtype not in C_TYPES:
            raise InputError(f"dtype must be one of {tuple(C_TYPES)}, got {self.dtype!r}")
        check_pack_size(self.pack_size, self.dtype)
        if self.block_size % 32 or not 32 <= self.block_size <= 1024:
            raise LaunchConfigError(f"block_size must be a multiple of 32 from 32 to 1024, got {self.block_size}")
        if self.path in ("warp", "cluster"):
            most = self.most_cols_per_thread
            if self.cols_per_thread % self.pack_size or not self.pack_size <= self.cols_per_thread <= most:
                raise InputError(f"cols_per_thread must be a multiple of pack_size ({self.pack_size}) up to "
                                 f"{most}, got {self.cols_per_thread}")
        if self.path == "warp":
            if self.group_width not in GROUP_WIDTHS:
                raise InputError(f"group_width must be a power of two up to 32, got {self.group_width}")
            if self.rows_per_group not in (1, 2, 4):
                raise InputError(f"rows_per_group must be 1, 2 or 4, got {self.rows_per_group}")
        if self.path == "cluster" and self.cluster_size not in CLUSTER_SIZES:
            raise InputError(f"cluster_size must be one of {CLUSTER_SIZES}, got {self.cluster_size}")
        if self.shared_cols_per_thread:
            most = SHARED_BYTES_PER_THREAD // np_dtype(self.dtype).itemsize
            if self.path != "cluster":
                raise InputError(f"shared_cols_per_thread is a knob of the cluster path, not of {self.path}")
            if self.shared_cols_per_thread % self.pack_size or not 0 < self.shared_cols_per_thread <= most:
                raise InputError(f"shared_cols_per_thread must be a multiple of pack_size ({self.pack_size}) up to "
                                 f"{most}, got {self.shared_cols_per_thread}")
        if self.path in ("naive", "ft_style") and self.pack_size != 1:
            raise InputError(f"the {self.path} kernels load one element at a time: pack_size must be 1")
        if self.path == "ft_style" and self.rows_per_block < 1:
            raise InputError(f"rows_per_block must be at least 1, got {self.rows_per_block}")
        if self.edges and (self.path != "cluster" or self.pack_size == 1):
            raise InputError("edges is a knob of the cluster path with packs of two values or more")
        if self.log and self.path in ("naive", "ft_style", "block_cached"):
            raise InputError(f"log-softmax is on the warp, cluster and block_uncached paths, not {self.path}")

    @property
    def most_cols_per_thread(self) -> int:
        """The warp path holds a row as floats: 32 values (32 registers). The cluster path holds
        it in the storage type: 128 bytes, 32 floats or 64 halves, in the same 32 registers."""
        if self.path == "cluster":
            return ROW_BYTES_PER_THREAD // np_dtype(self.dtype).itemsize
        return MAX_COLS_PER_THREAD

    @property
    def name(self) -> str:
        return f"softmax_{self.path}" + ("_online" if self.online else "") + ("_log" if self.log else "")

    @property
    def c_type(self) -> str:
        return C_TYPES[self.dtype]

    @property
    def name_expressions(self) -> list:
        """Every kernel the variant launches (the naive one launches three)."""
        t, p, b, log = self.c_type, self.pack_size, self.block_size, str(self.log).lower()
        if self.path == "naive":
            return [f"naive_row_max<{t}, {b}>", f"naive_row_sum_exp<{t}, {b}>", f"naive_normalize<{t}>"]
        if self.path == "ft_style":
            return [f"softmax_ft_style<{t}, {b}>"]
        if self.path == "warp":
            return [f"softmax_warp_per_row<{t}, {p}, {self.cols_per_thread}, {self.group_width}, "
                    f"{self.rows_per_group}, {b}, {log}>"]
        if self.path == "block_cached":
            return [f"softmax_block_cached<{t}, {p}, {b}, {str(self.pack_major_cache).lower()}>"]
        if self.path == "cluster":
            return [self._cluster_kernel()]
        return [f"softmax_block_uncached<{t}, {p}, {b}, {str(self.online).lower()}, {log}>"]

    @property
    def name_expression(self) -> str:
        return self.name_expressions[-1]

    @property
    def config(self) -> dict:
        config = {"path": self.path, "pack_size": self.pack_size, "block_size": self.block_size}
        if self.path in ("warp", "cluster"):
            config["cols_per_thread"] = self.cols_per_thread
        if self.path == "warp":
            config.update(group_width=self.group_width, rows_per_group=self.rows_per_group)
        if self.path == "cluster":
            config["cluster_size"] = self.cluster_size
            if self.shared_cols_per_thread:
                config["shared_cols_per_thread"] = self.shared_cols_per_thread
        if self.path == "block_cached":
            config["pack_major_cache"] = self.pack_major_cache
        if self.path == "block_uncached":
            config["online"] = self.online
        if self.path == "ft_style":
            config["rows_per_block"] = self.rows_per_block
        if self.edges:
            config["edges"] = True
        if self.log:
            config["log"] = True
        return config

    def compiled(self, arch: str = None):
        return compile_kernels(SOURCE, self.name_expressions, arch=arch)

    def max_cols(self) -> int | None:
        """The longest row this variant takes (None: any)."""
        if self.path == "warp":
            return self.cols_per_thread * self.group_width
        if self.path == "cluster":
            return ClusterShape(self.block_size, self.cols_per_thread, self.cluster_size,
                                self.shared_cols_per_thread).holds
        if self.path == "ft_style":
            return self.block_size
        return None

    def shared_bytes(self, cols: int) -> int:
        """Dynamic shared memory per block: the cached block's row (as float), or the
        cluster path's shared part of each thread's slice (in the storage type)."""
        if self.path == "block_cached":
            return 4 * cols
        return self.shared_cols_per_thread * self.block_size * np_dtype(self.dtype).itemsize

    def traffic(self, rows: int, cols: int) -> int:
        """Bytes this variant moves through HBM when nothing is found in L2: the naive
        kernels read the matrix three times, write it once and pass two vectors along;
        the uncached block re-reads each row (once more online); the rest read once."""
        n = int(rows) * int(cols) * np_dtype(self.dtype).itemsize
        if self.path == "naive":
            return 4 * n + 4 * 4 * int(rows)  # row_max and row_sum: written, then read
        if self.path == "block_uncached":
            return (3 if self.online else 4) * n
        return 2 * n

    def grid(self, rows: int, cols: int, kernel) -> int:
        if self.path == "warp":
            return max(1, ceil_div(rows, self.block_size // self.group_width * self.rows_per_group))
        if self.path == "ft_style":
            return max(1, ceil_div(rows, self.rows_per_block))
        if self.path == "cluster":
            return rows * self.cluster_size
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
        """y = softmax(x) (log-softmax if ``log``) over the last dimension of a (rows, cols) x."""
        if len(x.shape) != 2:
            raise InputError(f"x must be a (rows, cols) matrix, got shape {x.shape}")
        check_operands(self.name, self.dtype, self.pack_size * np_dtype(self.dtype).itemsize, x=x, y=y)
        rows, cols = x.shape
        check_row_fits(self.name_expression, cols, self.pack_size, self.edges, self.max_cols(), "softmax()")
        if rows == 0 or cols == 0:
            return
        if self.path == "naive":
            self._launch_naive(x, y, rows, cols)
            return
        if self.path == "cluster":
            self._launch_cluster(x, y, rows, cols, self.name_expression, None)
            return
        kernel = loaded_kernel(SOURCE, self.name_expression)
        extra = (self.rows_per_block,) if self.path == "ft_style" else ()
        kernel(self.grid(rows, cols, kernel), self.block_size, x, y, rows, cols, *extra,
               shared_bytes=self.shared_bytes(cols))

    @property
    def timed_name_expression(self) -> str:
        """The cluster kernel's Timed twin: the same code plus clock reads at its phase boundaries."""
        if self.path != "cluster":
            raise InputError(f"only the cluster path has a timed kernel, not {self.path}")
        return self._cluster_kernel(timed=True)

    def _cluster_kernel(self, timed: bool = False) -> str:
        # The template's trailing arguments (SharedPacks, Timed, Edges) are written only up to
        # the last one that differs from its default, as the recorded kernel names have them.
        args = [self.c_type, self.pack_size, self.cols_per_thread, self.block_size, self.cluster_size,
                str(self.log).lower()]
        trailing = [self.shared_cols_per_thread // self.pack_size, str(timed).lower(), str(self.edges).lower()]
        while trailing and trailing[-1] in (0, "false"):
            trailing.pop()
        return f"softmax_cluster_per_row<{', '.join(map(str, args + trailing))}>"

    def _launch_cluster(self, x, y, rows, cols, name, phase_clock):
        kernel = loaded_kernel(SOURCE, name)
        kernel(self.grid(rows, cols, kernel), self.block_size, x, y, rows, cols, phase_clock,
               shared_bytes=self.shared_bytes(cols), cluster=self.cluster_size)

    def _launch_naive(self, x, y, rows, cols):
        row_max, row_sum = row_scratch(rows, "softmax max"), row_scratch(rows, "softmax sum")
        find_max, sum_exp, normalize = (loaded_kernel(SOURCE, n) for n in self.name_expressions)
        find_max(rows, self.block_size, x, row_max, rows, cols)
        sum_exp(rows, self.block_size, x, row_max, row_sum, rows, cols)
        normalize(min(ceil_div(rows * cols, 256), device.gpu().sm_count * 8), 256, x, row_max, row_sum, y, rows, cols)


def ft_style_for(rows: int, cols: int, dtype: str, *, per_head_rows: int = None) -> SoftmaxVariant:
    """FasterTransformer's launch rule: the block as wide as the row rounded up to a warp,
    one block per row, or (per_head_rows given) one block per (batch, head) walking its rows."""
    if cols > 1024:
        raise InputError(f"the FasterTransformer-style kernel holds one element per thread: cols <= 1024, got {cols}")
    return SoftmaxVariant("ft_style", dtype, 1, max(32, ceil_div(cols, 32) * 32), rows_per_block=per_head_rows or 1)


class ClusterShape(NamedTuple):
    """One shape of the cluster path: block threads, values a thread holds in registers,
    blocks a row (the cluster) and values a thread holds in shared memory; the row
    takes it only if it fills at least least_fill of what the shape holds."""
    block: int
    per_thread: int
    cluster: int
    shared: int = 0
    least_fill: float = 0.0

    @property
    def holds(self) -> int:
        return self.block * (self.per_thread + self.shared) * self.cluster

    def takes(self, cols: int) -> bool:
        """Whether a row of ``cols`` values (whole packs) goes to this shape: it holds the row
        and the row fills at least least_fill of it."""
        return self.holds >= cols >= self.least_fill * self.holds


# The cluster path's shapes, shortest rows first, per register bytes per value (see
# variant_for). Tuned on the H200 (2026-11-22; book/softmax.ipynb shows the sweep): the
# row takes up to 128 bytes per thread in registers (32 of them); the block grows to
# 1024 threads before a cluster forms. Once the blocks of a cluster exchanged messages
# instead of meeting at barriers (rows.cuh), clusters became cheap, and re-tuned then
# (H200, 2026-11-24, in turns, 256 MiB, us): long rows held in registers only, in
# clusters of 256-thread blocks twice or four times as large, beat the shapes with a
# shared part wherever the row fills them: fp32 65536 133.6 (512 x 32 + 32 shared, 2
# blocks: 136.6), 131072 133.4 (142.7), 262144 in 512-thread blocks 140.9 (144.1); fp16
# 32768 133.4 (136.6), 65536 133.2 (136.3), 131072 133.3 (141.6), 262144 138.2 (142.2).
# A row that fills such a cluster only in part can cost more than a shared part's slack,
# even cut into equal shares (softmax.cu). In turns (H200, 2026-11-24, us, register-only
# against the shape with a shared part that follows it): fp32 2033 x 33000 in 8 blocks,
# half full, 139.9 / 134.3, but 1677 x 40000 (61%) 132.5 / 134.1; fp16 1342 x 100001 in 8
# blocks (76%) 146.5 / 140.8, 559 x 240000 in 16 (92%) 141.9 / 138.6, 536 x 250000 (95%)
# 141.5 / 141.7. So a register-only cluster is taken only from least_fill of it. The
# shapes with a shared part, re-tuned with the shares: smaller blocks in larger clusters
# (fp32 838 x 80000 133.7 in 16 blocks of 128, 135.9 in 4 of 512; 223 x 300000 142.6 in
# 16 of 512, 158.9 in 8 of 1024; fp16 447 x 300000 143.6 in 16 of 256, 161.7 in 8 of 512;
# 167 x 800000 156.4 in 16 of 512, 187.0 in 8 of 1024). bf16 shares fp16's table, though
# at 447 x 300000 it lost 1.5% to the old shape (164.1 / 161.7).
# 16-bit rows of 2048 and 4096 values take one- and two-warp blocks (more blocks
# per SM, so more bytes in flight than 128-thread blocks of 16 values).
# For each row length the first shape that takes it (ClusterShape.takes).
CLUSTER_SHAPES = {
    4: (ClusterShape(64, 32, 1), ClusterShape(128, 32, 1), ClusterShape(256, 32, 1), ClusterShape(512, 32, 1),
        ClusterShape(1024, 32, 1), ClusterShape(256, 32, 8, least_fill=9 / 16), ClusterShape(128, 32, 8, 32),
        ClusterShape(256, 32, 16, least_fill=5 / 8), ClusterShape(128, 32, 16, 32),
        ClusterShape(512, 24, 16, 8, least_fill=7 / 8), ClusterShape(512, 32, 8, 32), ClusterShape(512, 32, 16, 32)),
    2: (ClusterShape(32, 64, 1), ClusterShape(64, 64, 1), ClusterShape(128, 64, 1), ClusterShape(256, 64, 1),
        ClusterShape(128, 64, 4, least_fill=7 / 8), ClusterShape(256, 64, 1, 64),
        ClusterShape(256, 64, 4, least_fill=7 / 8), ClusterShape(256, 56, 2, 64),
        ClusterShape(256, 64, 8, least_fill=7 / 8), ClusterShape(256, 56, 4, 64),
        ClusterShape(256, 48, 16, 16, least_fill=15 / 16), ClusterShape(256, 64, 8, 64),
        ClusterShape(512, 64, 16, least_fill=7 / 8), ClusterShape(256, 64, 16, 64), ClusterShape(512, 64, 16, 64)),
}
# Four shapes hold fewer values a thread in registers than their neighbours (24 floats, 56
# or 48 16-bit values), the rest in shared memory. Timed in turns at 256 MiB against the
# shapes they replace (H200, 2026-11-24, three rounds, us, old -> new):
# - fp32 rows of 229 377-262 144, (512, 32, 16) -> (512, 24, 16, 8): 240000 142.4 -> 136.8,
#   262144 141.5 -> 138.3;
# - 16-bit rows of 32 769-57 343, (512, 64, 1, 64) -> (256, 56, 2, 64): fp16 33000 135.9 ->
#   134.8, 50257 140.8 -> 138.1, 57000 138.8 / 138.9;
# - 65 537-114 687, (256, 64, 4, 64) -> (256, 56, 4, 64): fp16 100001 141.6 -> 138.3, 70001
#   155.0 -> 136.2, bf16 80000 145.5 -> 135.4, 66000 159.1 -> 137.1; but fp16 rows the pack
#   divides lost 0.4-1.5% (66000 137.8 -> 139.9, 80000 134.8 -> 135.7, 114000 138.7 -> 139.6);
# - 245 760-262 144, (256, 64, 16) -> (256, 48, 16, 16): fp16 250000 142.0 -> 137.5, 262144
#   138.7 -> 136.8, bf16 140.9 -> 137.6.
# Fewer registers can put one more block on an SM (fp16 100001 in 48 of them: 5 blocks, 154
# rows at once, against 4 and 124), but the gain did not follow the blocks: 56 values in 54
# registers, still 4 blocks an SM, gained the most there. With blocks an SM capped by unused
# shared memory, the same kernel lost 10% with one block an SM fewer and 41% with two (fp16
# 100001: 141.0, 155.6, 198.8 us for 4, 3, 2 blocks): these rows need every byte in flight.
# Before (2026-11-22 to 24), for the record: the shared part for fp32 rows from 32769
# values on and 16-bit rows from 16385; 16-bit rows in 512-thread blocks; until the
# shares, fp32 rows past 2^18 values in 8 blocks of 1024 threads and 16-bit ones in 8 of
# 512 or 1024. Re-tuned once the messages came (in turns, us): 16-bit rows in 256-thread
# blocks, twice the cluster: fp16 1024 x 131072 141.1 (512-thread blocks 144.6), 512 x
# 262144 143.0 (146.5); bf16 140.4 (the barrier kernel: 155.0), 141.9 (147.5). fp32 rows
# in two 1024-thread blocks of registers lost where they fill the second block only in
# part: 1335 x 50257 fell from 86% to 79% of the ceiling in the chapter's recording.


# The lane-group path's block: 64 threads when the block still moves at least MIN_BLOCK_BYTES
# (its rows read and written), else 128. Smaller blocks put more of them on an SM, so more
# rows in flight and a shorter last wave, but the H200 starts about 1.65e9 blocks a second (an
# empty kernel of 2^20 blocks: 634 us at 32, 64 and 128 threads; 2026-11-23), so a block that
# moves too few bytes is paid for in starts: rows of 128 fp32 values at 256 MiB in 32-thread
# blocks need 524288 of them, 318 us of starts, against 130 us for the bytes. In turns with
# torch.compile (us, 128-thread blocks -> 32 or 64, torch.compile; 2026-11-23): fp32 131072 x
# 512 132.1 -> 130.6 (130.0), 65536 x 1024 133.1 -> 131.7 (130.3); fp16 131072 x 1024 133.3 ->
# 130.8 (130.0); bf16 133.2 -> 130.7 (129.8); log fp32 131072 x 1024 260.9 -> 256.8 (258.8).
# 32-thread blocks, where the rule had allowed them, then lost to 64 or tied (2026-11-24, three
# rounds: fp32 131072 x 512 131.4 against 130.7; fp16 and bf16 131072 x 1024 131.6 both).
LANE_GROUP_BLOCK = 64
MIN_BLOCK_BYTES = 4096

# Rows longer than SHORT_ROW_COLS give each lane at least LANE_VALUES values (64 bytes of fp32, 32
# of a 16-bit type), so rows of 129 to 256 values take groups of 16 lanes instead of 32, and the
# groups sit in 64-thread blocks wherever those move MIN_BLOCK_BYTES. Shorter rows keep 16 bytes a
# lane (see variant_for). In turns with torch.compile on the H200 (2026-11-24, three rounds, 256
# MiB, us, 16 bytes a lane -> this rule, torch.compile): fp32 262144 x 256 131.5 -> 130.5 (131.8),
# 349525 x 192 132.1 -> 131.4 (132.0); fp16 524288 x 256 132.4 -> 131.4 (130.7), 699050 x 192
# 146.7 -> 132.5 (177.3); bf16 524288 x 256 133.2 -> 131.8 (132.1). Past 256 values both rules
# give the same lanes: 16 lanes of 16 values no longer hold the row, and both take a whole warp.
SHORT_ROW_COLS = 128
LANE_VALUES = 16
LONE_VALUE_BLOCKS = (64, 128, 256, 512, 1024)  # rows of odd length: the blocks lone_value_shape may fit

# Where a lane group would hold more than this many bytes of the row a lane (fp32 rows of 513
# to 1024 values: 32 floats a lane), the row goes to a block of two warps instead, 16 values a
# thread (the register path of the cluster kernel, one block per row): the same bytes in flight
# per SM, twice the warps, half the registers (60 -> 32 a thread at 1024; 88 -> 48 for lone
# floats). In turns with torch.compile on the H200 (2026-11-24, three rounds, us, lane group
# -> two warps, torch.compile): 65536 x 1024 131.4-131.8 -> 129.6-130.8 (130.0-131.0), 67108 x
# 1000 132.6-133.7 -> 131.1-132.0 (132.8-133.4), 65536 x 1023 137.7-138.4 -> 133.8-135.0
# (143.3-143.4), 87381 x 768 131.5 -> 130.9 (131.7); 65536 x 600 level. 16-bit rows of 1024 in
# two-warp blocks lost 3% (134.6 against 130.8), and never hold more than 64 bytes a lane.
BLOCK_ROW_FROM_BYTES = 64


def variant_for(rows: int, cols: int, dtype: str, pack: int, *, log: bool = False) -> SoftmaxVariant:
    """The dispatcher's rule; ``pack`` is the widest pack x and y are both aligned to (up to
    16 bytes). Rows up to 1024 values: a lane group per row, the row in registers, in the
    widest pack that also divides the row, each lane holding at least 16 bytes of it (4
    floats or 8 16-bit values, and a whole pack), or at least 16 values in rows longer than
    128, the group just wide enough for the row; blocks of 64 threads where such a block
    still moves MIN_BLOCK_BYTES, else 128. Where a lane would hold more than
    BLOCK_ROW_FROM_BYTES (fp32 rows of 513 to 1024 values), a block of 64 threads per row,
    16 values a thread, on the cluster kernel. Longer rows, up to 2^19 values (fp32) or 2^20
    (fp16, bf16): the row on chip in a block, or in a cluster of blocks: the first of
    CLUSTER_SHAPES that holds it and that it fills to the shape's least_fill, in whole
    packs; where the pack does not divide the row,
    its aligned middle (edges). Arrays aligned to no pack (pack 1) take a block, or for
    fp32 a cluster, fitted to the row (lone_value_shape): up to 2^15 values (16-bit) or
    2^17 (fp32). Longer still: the uncached block, online (two reads of the row)."""
    itemsize = np_dtype(dtype).itemsize
    dividing = min(pack, cols & -cols)  # the widest pack that divides the row as well
    if cols <= 1024:
        # Rows up to SHORT_ROW_COLS: 16 bytes a lane, one fp32 pack. In turns on the H200
        # (2026-11-23), 4 fp32 values a lane beat 8 at every row of 16 to 128 values, by
        # 0.7-1.8% at 256 MiB (64: 130.0 against 132.4 us) and 1-5% on the small seed shapes
        # (65536 x 32: 9.28 against 9.55 us); lone floats (odd lengths) too, at 31 by 41%
        # (134.5 against 229.3 us), though not at 65536 x 33. Longer rows: LANE_VALUES a lane.
        least_bytes = 16 if cols <= SHORT_ROW_COLS else LANE_VALUES * itemsize
        per_thread, group = lane_group_shape(cols, dividing, itemsize, least_bytes)
        if per_thread * itemsize > BLOCK_ROW_FROM_BYTES:  # fp32 rows of 513-1024 values
            return SoftmaxVariant("cluster", dtype, dividing, 64, per_thread // 2, cluster_size=1, log=log)
        rows_a_block = LANE_GROUP_BLOCK // group
        block = LANE_GROUP_BLOCK if bytes_moved(rows_a_block, cols, dtype) >= MIN_BLOCK_BYTES else 128
        return SoftmaxVariant("warp", dtype, dividing, block, per_thread, group, 1, log=log)
    if pack == 1:  # arrays aligned to no pack: a register a value, whatever the type
        fitted = lone_value_shape(cols, LONE_VALUE_BLOCKS, clusters=itemsize == 4)
        if fitted is None:
            return SoftmaxVariant("block_uncached", dtype, pack, 1024, online=True, log=log)
        block, per_thread, cluster = fitted
        return SoftmaxVariant("cluster", dtype, pack, block, per_thread, cluster_size=cluster, log=log)
    # Packed 16-bit values take half a register each (bf16 too, widened from whole words:
    # widen_at in rows.cuh). A row the pack does not divide keeps its packs (edges): its
    # middle, at most the whole packs the row holds, in the shape of that many values.
    middle = cols // pack * pack
    for shape in CLUSTER_SHAPES[itemsize]:
        if shape.takes(middle) and shape.per_thread >= pack:
            return SoftmaxVariant("cluster", dtype, pack, shape.block, shape.per_thread, cluster_size=shape.cluster,
                                  shared_cols_per_thread=shape.shared, log=log, edges=middle != cols)
    return SoftmaxVariant("block_uncached", dtype, dividing, 1024, online=True, log=log)


def softmax(x: DeviceArray, y: DeviceArray, *, log: bool = False) -> SoftmaxVariant:
    """y = softmax(x) (or log-softmax) over the last dimension, any shape and alignment;
    returns the variant the dispatcher chose."""
    if len(x.shape) != 2:
        raise InputError(f"x must be a (rows, cols) matrix, got shape {x.shape}")
    rows, cols = x.shape
    variant = variant_for(rows, cols, str(x.dtype), widest_pack(x, y), log=log)
    variant.launch(x, y)
    return variant


def reference(x: np.ndarray, log: bool = False) -> np.ndarray:
    """Softmax (or log-softmax) in float64; a fully -inf row gives NaN, like the kernels."""
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        shifted = wide - wide.max(axis=-1, keepdims=True)
        total = np.exp(shifted).sum(axis=-1, keepdims=True)
        return shifted - np.log(total) if log else np.exp(shifted) / total


# max |y - reference| per dtype: the output's rounding (half an ulp of values <= 1:
# 2^-24, 2^-11, 2^-8) plus __expf's and the sum's errors, a few times over. For
# log-softmax the bound is relative to max(1, |reference|) (its values reach -20 and below).
TOLERANCE = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}


def max_error(out: np.ndarray, ref: np.ndarray, log: bool = False) -> float:
    """The error the tolerance bounds: absolute for softmax, relative to max(1, |ref|) for log."""
    out = out.astype(np.float64)
    with np.errstate(invalid="ignore"):  # -inf == -inf (log-softmax of a masked entry) is no error
        diff = np.where(out == ref, 0.0, np.abs(out - ref))
    return float((diff / np.maximum(1.0, np.abs(ref)) if log else diff).max(initial=0.0))


# ---------------------------------------------------------------- measuring (chapter 4)

inputs = InputPool()
_references = HostReferences(keep=16)  # a panel sweep revisits each input once per setting


def _matrix(rows: int, cols: int, dtype: str):
    host, x, y = inputs.get(rows * cols, dtype)
    return host.reshape(rows, cols), x.reshape(rows, cols), y.reshape(rows, cols)


def _compare(what: str, out: np.ndarray, host: np.ndarray, dtype: str, log: bool, tolerance: float) -> float:
    """The largest error of ``out`` against float64 (max_error); raises beyond ``tolerance``."""
    return check_by_rows(what, out, host, dtype, tolerance, _references, "log_softmax" if log else "softmax",
                         lambda rows: reference(rows, log), lambda o, r: max_error(o, r, log))


def _check_output(what: str, write, output, host: np.ndarray, dtype: str, log: bool) -> float:
    """Poison the array ``output()`` gives, ``write`` it once, compare with float64; returns
    the largest error."""
    return _compare(what, written_over_poison(output(), write), host, dtype, log, TOLERANCE[dtype])


def softmax_measurement(variant: SoftmaxVariant, rows: int, cols: int, *, provider: str = None) -> dict:
    """What ``bench.measure`` needs to check one variant against float64 on fresh normal
    inputs and time it. GB/s counts the bytes a softmax must move (bytes_moved), whatever
    the path re-reads. The output is where PyTorch puts its own (outputs_where_torch_puts_them),
    so ours and the PyTorch peers timed in the same turns write the same memory."""
    def setup():
        host, x, y = _matrix(rows, cols, variant.dtype)
        output = outputs_where_torch_puts_them(y)
        return (lambda: variant.launch(x, output())), (
            lambda: _check_output(variant.name_expression, lambda out: variant.launch(x, out), output, host,
                                  variant.dtype, variant.log))
    return dict(provider=provider or variant.name, dtype=variant.dtype, shape=[rows, cols], config=variant.config,
                bytes=bytes_moved(rows, cols, variant.dtype), setup=setup)


def measure_softmax(bench, variant: SoftmaxVariant, rows: int, cols: int, *, provider: str = None):
    return bench.measure(**softmax_measurement(variant, rows, cols, provider=provider))


def dispatcher_measurement(rows: int, cols: int, dtype: str, *, log: bool = False) -> dict:
    """softmax() as a user calls it: the dispatcher's choice, recorded in config."""
    return softmax_measurement(variant_for(rows, cols, dtype, full_pack(dtype), log=log), rows, cols,
                               provider="softmax()" if not log else "log_softmax()")


def measure_dispatcher(bench, rows: int, cols: int, dtype: str, *, log: bool = False):
    return bench.measure(**dispatcher_measurement(rows, cols, dtype, log=log))


def torch_measurement(rows: int, cols: int, dtype: str, *, compiled: bool = False, log: bool = False) -> dict:
    """torch.softmax (or log_softmax) over the last dimension, eager or torch.compile'd for
    this one shape, on the very bytes our kernels read, into its own output."""
    def setup():
        torch = torch_module()
        host, x, _ = _matrix(rows, cols, dtype)
        t = torch_tensor(x)
        fn = (lambda a: torch.log_softmax(a, -1)) if log else (lambda a: torch.softmax(a, -1))
        if compiled:
            fn = torch_compiled_for_shape(("log_softmax" if log else "softmax", rows, cols, dtype), fn)

        def check():
            out = fn(t)
            torch.cuda.synchronize()
            what = f"torch {'log_' if log else ''}softmax"
            return _compare(what, out.float().cpu().numpy(), host, dtype, log, 2 * TOLERANCE[dtype])
        return (lambda: fn(t)), check
    name = ("torch.compile" if compiled else "torch") + (" log_softmax" if log else "")
    return dict(provider=name, dtype=dtype, shape=[rows, cols], config={"op": "log_softmax" if log else "softmax"},
                bytes=bytes_moved(rows, cols, dtype), setup=setup)


def measure_torch_softmax(bench, rows: int, cols: int, dtype: str, *, compiled: bool = False, log: bool = False):
    return bench.measure(**torch_measurement(rows, cols, dtype, compiled=compiled, log=log))


def measure_versus_torch(bench, rows: int, cols: int, dtype: str, *, log: bool = False) -> list:
    """softmax() (or log_softmax()), PyTorch eager and torch.compile on the same bytes, timed
    in turns (one repetition of each per round): [ours, eager, compiled], None for what is
    not installed."""
    return bench.measure_together([dispatcher_measurement(rows, cols, dtype, log=log),
                                   torch_measurement(rows, cols, dtype, log=log),
                                   torch_measurement(rows, cols, dtype, compiled=True, log=log)])


# The cluster kernel's phases, between the clock reads of its Timed twin (kernels/softmax.cu).
PHASES = ("loads arrive, max", "exponentials, sum, block merge", "cluster merge", "stores issued")
PHASE_CLOCK_WORDS = 6  # kPhaseClockWords: the SM, then five clock reads


def cluster_phases(rows: int, cols: int, dtype: str, *, runs: int = 3) -> dict:
    """Where the time of softmax()'s on-chip path goes at (rows, cols): its Timed twin, run
    ``runs`` times after an L2 flush (each output checked against float64), in which
    thread 0 of every block reads %globaltimer at each phase boundary. Per phase (PHASES),
    the median and 90th percentile over all blocks of all runs, in µs; the median block
    lifetime; and the median span from the first block's start to the last block's
    stores. Needs a GPU."""
    from .timing import flush_l2
    variant = variant_for(rows, cols, dtype, full_pack(dtype))
    if variant.path != "cluster":
        raise InputError(f"softmax() runs the {variant.path} path at {cols} columns; phases are timed on the "
                         "cluster path (rows of more than 1024 values; fp32 rows of more than 512)")
    host, x, y = _matrix(rows, cols, dtype)
    clock = DeviceArray((rows * variant.cluster_size * PHASE_CLOCK_WORDS,), np.uint64)
    phases, spans = [], []
    try:
        for _ in range(runs):
            flush_l2()
            _check_output(variant.timed_name_expression, lambda out: variant._launch_cluster(
                x, out, rows, cols, variant.timed_name_expression, clock), lambda: y, host, dtype, False)
            ns = clock.to_numpy().reshape(-1, PHASE_CLOCK_WORDS)[:, 1:].astype(np.int64)
            phases.append(np.diff(ns, axis=1) / 1e3)
            spans.append((ns[:, -1].max() - ns[:, 0].min()) / 1e3)
    finally:
        clock.free()
    phases = np.concatenate(phases)
    return {"config": variant.config, "blocks": int(rows * variant.cluster_size),
            "phases_us": {name: [float(np.median(phases[:, k])), float(np.percentile(phases[:, k], 90))]
                          for k, name in enumerate(PHASES)},
            "lifetime_us": float(np.median(phases.sum(axis=1))), "span_us": float(np.median(spans))}


def cache_layout_cycles(pack_size: int = 4, repeats: int = 256) -> dict:
    """clock64 cycles for one warp to store and reload 8 packs per lane through each cache
    layout of softmax_block_cached (kernel cache_layout_probe): pack-major, naive as
    compiled (wide accesses), naive with one 4-byte access per value. Needs a GPU."""
    cycles, sink = DeviceArray((1,), "int64"), DeviceArray((32,), "float32")
    result = {}
    for layout, label in enumerate(("pack-major", "naive (as compiled)", "naive (4-byte accesses)")):
        kernel = loaded_kernel(SOURCE, f"cache_layout_probe<{pack_size}, {layout}>")
        kernel(1, 32, np.int32(repeats), cycles, sink)
        device.synchronize()
        result[label] = float(cycles.to_numpy()[0]) / repeats
    return result


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
    cluster_variants = [SoftmaxVariant("cluster", d, 4, 128, 8, cluster_size=c, log=log)
                        for d in ("float32", "float16") for c in (1, 2, 16) for log in (False, True)]
    # With a shared part: cp.async of 16, 8 and 4 bytes and the 2-byte copy, slices cut inside it.
    cluster_variants += [SoftmaxVariant("cluster", d, p, 64, 2 * p, cluster_size=c, shared_cols_per_thread=2 * p,
                                        log=log)
                         for d, p in (("float32", 4), ("float16", 4), ("float16", 2), ("float16", 1))
                         for c in (1, 2) for log in (False, True)]
    cases += [case(v, shape) for v in cluster_variants
              for shape in ((1, v.pack_size), (3, v.max_cols() - 4 * v.pack_size), (2, v.max_cols()))]
    # Edges: rows the pack does not divide, starting at every offset within it.
    edge_variants = [SoftmaxVariant("cluster", d, p, 64, 2 * p, cluster_size=c, shared_cols_per_thread=s, log=log,
                                    edges=True)
                     for d, p in (("float32", 4), ("bfloat16", 8)) for c in (1, 2) for s in (0, 2 * p)
                     for log in (False, True)]
    cases += [case(v, shape) for v in edge_variants
              for shape in ((2 * v.pack_size + 1, 3), (2 * v.pack_size + 1, v.max_cols() + v.pack_size - 1))]
    online = [SoftmaxVariant("block_uncached", "float32", 4, 256, online=True, log=log) for log in (False, True)]
    cases += [case(v, shape) for v in online for shape in ((1, 4), (3, 1028), (2, 4100))]
    cases += [case(SoftmaxVariant("naive", d, 1, 256), (5, 77)) for d in ("float32", "bfloat16")]
    cases += [case(ft_style_for(6, 77, d, per_head_rows=4), (6, 77)) for d in ("float32", "float16")]
    cases += [dispatched(d, shape) for d in C_TYPES
              for shape in ((1, 1), (5, 7), (4097, 33), (7, 200), (6, 256), (9, 512), (5, 1000), (3, 3000), (2, 12289),
                            (2, 100000), (9, 4097), (5, 50257), (1, 600000))]
    return cases
