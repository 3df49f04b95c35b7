"""Softmax (head start of chapter 4): machine code without a GPU; every path against
float64 with invariants on the GPU."""
import dataclasses

import numpy as np
import pytest

import helpers
from helpers.device import DeviceArray
from helpers.operands import full_pack, np_dtype, widest_pack_for
from helpers.compiler import compile_kernels
from helpers.softmax_kernels import (C_TYPES, CLUSTER_SHAPES, MIN_BLOCK_BYTES, PHASE_CLOCK_WORDS, PHASES, TOLERANCE,
                                     SoftmaxVariant, bytes_moved, cache_layout_cycles, cluster_phases, ft_style_for,
                                     max_error, measure_dispatcher, reference, softmax, variant_for)


def test_every_path_moves_rows_in_16_byte_packs_without_local_memory():
    variants = [SoftmaxVariant("warp", "float32", 4, 128, 32, 32, 1),
                SoftmaxVariant("warp", "float16", 8, 128, 8, 4, 2),
                SoftmaxVariant("block_cached", "float32", 4, 256), SoftmaxVariant("block_uncached", "float16", 8, 256)]
    for v in variants:
        ops = helpers.opcodes(v.compiled(arch="sm_90").sass(v.name_expression))
        assert ops["LDG.E.128.CONSTANT"] >= 1 and ops["STG.E.128"] >= 1, v
    warp = SoftmaxVariant("warp", "float32", 4, 128, 32, 32, 1)
    assert not warp.compiled(arch="sm_90").resources(warp.name_expression).uses_local_memory
    assert not any(op.startswith(("BAR", "STS", "LDS")) for op in helpers.opcodes(
        warp.compiled(arch="sm_90").sass(warp.name_expression)))  # registers and shuffles only


@pytest.mark.parametrize("kwargs, message", [(dict(path="tree"), "path must be one of"),
                                              (dict(pack_size=8), "at most 16 bytes"),
                                              (dict(cols_per_thread=6), "multiple of pack_size"),
                                              (dict(group_width=3), "group_width"),
                                              (dict(block_size=100), "multiple of 32"),
                                              (dict(shared_cols_per_thread=4), "knob of the cluster path"),
                                              (dict(path="cluster", cols_per_thread=32, shared_cols_per_thread=6),
                                               "multiple of pack_size"),
                                              (dict(path="cluster", cols_per_thread=32, shared_cols_per_thread=64),
                                               "up to 32")])
def test_variants_refuse_what_they_cannot_take(kwargs, message):
    with pytest.raises(helpers.BookError, match=message):
        SoftmaxVariant(**kwargs)


COLS = [1, 7, 33, 1000, 1536, 3000, 12289, 100000]


def _check(host, y, dtype):
    out, ref = y.to_numpy().astype(np.float64), reference(host)
    assert not np.isnan(out).any()
    assert np.abs(out - ref).max() <= TOLERANCE[dtype]
    assert np.allclose(out.sum(-1), 1.0, atol=TOLERANCE[dtype] * host.shape[-1] ** 0.5 + 1e-6)


@pytest.mark.parametrize("dtype", list(C_TYPES))
def test_the_dispatcher_on_awkward_shapes(gpu, dtype):
    rng = np.random.default_rng()
    for rows, cols in [(1, c) for c in COLS] + [(4097, c) for c in (1, 33, 1000, 3000)] + [(9, 4097), (5, 50257)]:
        host = (rng.standard_normal((rows, cols)) * 3).astype(np_dtype(dtype))
        x, y = DeviceArray.from_numpy(host), DeviceArray((rows, cols), dtype)
        y.poison()
        variant = softmax(x, y)
        _check(host, y, dtype)
        if cols <= 1024:  # a lane group, or for fp32 rows past 512 values a block of two warps
            expected = "cluster" if dtype == "float32" and cols > 512 else "warp"
            assert variant.path == expected and variant.cluster_size == 1, (cols, variant)
        else:  # the row's aligned middle in 16-byte packs
            assert variant.pack_size == full_pack(dtype) and variant.edges == bool(cols % full_pack(dtype)), variant


@pytest.mark.parametrize("path", ["block_cached", "block_uncached"])
def test_block_paths_take_any_length(gpu, path):
    rng = np.random.default_rng()
    for cols in (4, 1028, 4100, 12288, 65536):  # 12288 floats: 48 KiB of cache, over the limit with static memory
        for major in ((True, False) if path == "block_cached" else (True,)):
            v = SoftmaxVariant(path, "float32", 4, 256, pack_major_cache=major)
            host = rng.standard_normal((5, cols)).astype(np.float32)
            x, y = DeviceArray.from_numpy(host), DeviceArray((5, cols), "float32")
            y.poison()
            if path == "block_cached" and 4 * cols > helpers.device.gpu().max_shared_per_block_optin:
                with pytest.raises(helpers.BookError, match="use the block_uncached path"):
                    v.launch(x, y)
                continue
            v.launch(x, y)
            _check(host, y, "float32")


def test_shift_invariance_masks_and_fp16_limits(gpu):
    rng = np.random.default_rng()
    for cols in (33, 3000):
        host = rng.standard_normal((64, cols)).astype(np.float32)
        outs = []
        for shift in (0.0, 1000.0):
            x, y = DeviceArray.from_numpy(host + np.float32(shift)), DeviceArray((64, cols), "float32")
            softmax(x, y)
            outs.append(y.to_numpy())
        assert np.abs(outs[0] - outs[1]).max() <= 1e-4  # x + 1000 has lost bits of x in float32 itself
        masked = host.copy()
        masked[:, ::3] = -np.inf  # -inf entries give exactly 0
        masked[5] = -np.inf  # a fully masked row: NaN, as in PyTorch (documented in softmax.cu)
        x, y = DeviceArray.from_numpy(masked), DeviceArray((64, cols), "float32")
        softmax(x, y)
        out = y.to_numpy()
        assert np.isnan(out[5]).all() and (np.delete(out, 5, 0)[:, ::3] == 0).all()
        assert np.abs(np.delete(out, 5, 0) - np.delete(reference(masked), 5, 0)).max() <= 1e-6
    big = np.float16(60000) * np.sign(rng.standard_normal((8, 1000))).astype(np.float16)
    x, y = DeviceArray.from_numpy(big), DeviceArray((8, 1000), "float16")
    softmax(x, y)
    assert np.abs(y.to_numpy().astype(np.float64) - reference(big)).max() <= TOLERANCE["float16"]


def test_the_dispatcher_prefers_registers_then_clusters_then_the_uncached_block():
    assert variant_for(4096, 128, "float32", 4).path == "warp"
    assert variant_for(4096, 32, "float32", 4) == SoftmaxVariant("warp", "float32", 4, 128, 4, 8, 1)  # 16 bytes a lane
    assert variant_for(4096, 32, "float16", 8) == SoftmaxVariant("warp", "float16", 8, 128, 8, 4, 1)
    # past 128 values, 16 values a lane; lane groups in 64-thread blocks where such a block still
    # moves MIN_BLOCK_BYTES, else 128
    assert variant_for(4096, 512, "float32", 4) == SoftmaxVariant("warp", "float32", 4, 64, 16, 32, 1)
    assert variant_for(4096, 256, "float32", 4) == SoftmaxVariant("warp", "float32", 4, 64, 16, 16, 1)
    assert variant_for(4096, 256, "float16", 8) == SoftmaxVariant("warp", "float16", 8, 64, 16, 16, 1)
    assert variant_for(4096, 192, "float16", 8) == SoftmaxVariant("warp", "float16", 8, 128, 16, 16, 1)  # 3 KiB
    assert variant_for(4096, 128, "float16", 8) == SoftmaxVariant("warp", "float16", 8, 128, 8, 16, 1)
    assert variant_for(4096, 1024, "bfloat16", 8) == SoftmaxVariant("warp", "bfloat16", 8, 64, 32, 32, 1)
    for cols in range(1, 1025):
        for dtype, pack in (("float32", 4 if cols % 4 == 0 else 1), ("float16", 8 if cols % 8 == 0 else 1)):
            v = variant_for(4096, cols, dtype, pack)
            if v.path == "cluster":  # fp32 rows past 512 values: two warps of 16 values a thread
                assert dtype == "float32" and cols > 512
                assert (v.block_size, v.cols_per_thread, v.cluster_size) == (64, 16, 1)
                continue
            assert v.path == "warp" and not (dtype == "float32" and cols > 512), (cols, v)
            assert v.cols_per_thread >= (16 if cols > 128 else 16 // np_dtype(dtype).itemsize), (cols, v)
            moved = bytes_moved(v.block_size // v.group_width, cols, dtype)
            assert v.block_size in (64, 128) and (v.block_size == 128 or moved >= MIN_BLOCK_BYTES), (cols, v)
    assert variant_for(4096, 1024, "float32", 4) == SoftmaxVariant("cluster", "float32", 4, 64, 16, cluster_size=1)
    assert variant_for(4096, 1023, "float32", 1, log=True) == SoftmaxVariant("cluster", "float32", 1, 64, 16,
                                                                             cluster_size=1, log=True)
    for cols in (1025, 4096, 16384, 65536, 262144, 524288):
        v = variant_for(64, cols, "float32", 4)
        assert v.path == "cluster" and v.max_cols() >= cols, (cols, v)
    assert variant_for(64, 1048584, "float16", 8) == SoftmaxVariant("block_uncached", "float16", 8, 1024, online=True)
    assert variant_for(64, 1048585, "float16", 8) == SoftmaxVariant("block_uncached", "float16", 1, 1024, online=True)
    assert variant_for(64, 524292, "float32", 4).path == "block_uncached"
    assert variant_for(64, 1048576, "bfloat16", 8).path == "cluster"  # as fp16: two values a register
    assert variant_for(64, 3000, "float16", 8, log=True).log
    # rows the pack does not divide keep their packs: the shape of their whole packs, with edges
    assert variant_for(64, 4097, "float32", 4) == SoftmaxVariant("cluster", "float32", 4, 128, 32, edges=True)
    assert variant_for(64, 4098, "float16", 8) == SoftmaxVariant("cluster", "float16", 8, 64, 64, edges=True)
    aligned = variant_for(64, 524288, "float32", 4)
    assert variant_for(64, 524291, "float32", 4) == dataclasses.replace(aligned, edges=True)
    assert variant_for(64, 1048577, "bfloat16", 8).edges and not variant_for(64, 4096, "float32", 4).edges
    for cols in range(1, 1025):  # short rows: the widest pack that divides the row as well, never edges
        for dtype in ("float32", "float16"):
            assert variant_for(4096, cols, dtype, full_pack(dtype)) == variant_for(4096, cols, dtype,
                                                                                 widest_pack_for(cols, dtype))
    # arrays aligned to no pack: a block fitted to the row, clusters of such blocks for fp32, then
    # the uncached block
    assert variant_for(64, 4097, "float32", 1) == SoftmaxVariant("cluster", "float32", 1, 256, 17, cluster_size=1)
    assert variant_for(64, 1537, "float16", 1) == SoftmaxVariant("cluster", "float16", 1, 64, 25, cluster_size=1)
    assert variant_for(64, 100001, "float32", 1) == SoftmaxVariant("cluster", "float32", 1, 512, 25, cluster_size=8)
    assert variant_for(64, 32769, "bfloat16", 1).path == variant_for(64, 131073, "float32", 1).path == "block_uncached"


@pytest.mark.parametrize("dtype", list(C_TYPES))
def test_rows_the_pack_does_not_divide_keep_their_packs(gpu, dtype):
    """edges: rows starting at every offset within a pack (2 * pack + 1 rows of lengths prime to
    it), rows shorter than a pack, the longest middle a shape holds, a cluster, a shared part,
    log-softmax, -inf entries and a fully masked row."""
    rng = np.random.default_rng()
    pack = full_pack(dtype)
    for cluster in (1, 4):
        for shared in (0, 2 * pack):
            for log in (False, True):
                v = SoftmaxVariant("cluster", dtype, pack, 64, 2 * pack, cluster_size=cluster,
                                   shared_cols_per_thread=shared, log=log, edges=True)
                for cols in (3, pack + 1, pack + 2, v.max_cols() // 3 + 1, v.max_cols() + pack - 1):
                    host = (rng.standard_normal((2 * pack + 1, cols)) * 3).astype(np_dtype(dtype))
                    if not log and cols > 3:
                        host[:, ::5] = -np.inf
                        host[4] = -np.inf
                    x, y = DeviceArray.from_numpy(host), DeviceArray(host.shape, dtype)
                    y.poison()
                    v.launch(x, y)
                    out, ref = y.to_numpy(), reference(host, log)
                    if cols % pack:
                        with pytest.raises(helpers.BookError, match="multiple of pack_size"):
                            dataclasses.replace(v, edges=False).launch(x, y)
                    if not log and cols > 3:
                        assert np.isnan(out[4]).all(), (v, cols)
                        out, ref = np.delete(out, 4, 0), np.delete(ref, 4, 0)
                    assert max_error(out, ref, log) <= TOLERANCE[dtype], (v.name_expression, cols)
                with pytest.raises(helpers.BookError, match="holds at most"):
                    v.launch(DeviceArray((1, v.max_cols() + pack), dtype), DeviceArray((1, v.max_cols() + pack), dtype))


def test_rows_with_edges_load_their_middle_in_packs():
    for v in [SoftmaxVariant("cluster", "float32", 4, 128, 32, edges=True),
              SoftmaxVariant("cluster", "float16", 8, 512, 64, cluster_size=2, shared_cols_per_thread=64, edges=True),
              SoftmaxVariant("cluster", "bfloat16", 8, 64, 64, log=True, edges=True)]:
        compiled = v.compiled(arch="sm_90")
        ops = helpers.opcodes(compiled.sass(v.name_expression))
        packs = (v.cols_per_thread + v.shared_cols_per_thread) // v.pack_size
        wide_loads = sum(n for op, n in ops.items() if op.startswith(("LDG.E.128", "LDGSTS.E.BYPASS.128")))
        assert wide_loads == ops["STG.E.128"] == packs, (v, ops)  # the middle: 16 bytes an access
        narrow = {op: n for op, n in ops.items() if op.startswith(("LDG.E", "STG.E")) and "128" not in op}
        loads = sum(n for op, n in narrow.items() if op.startswith("LDG"))
        assert loads == 1 and sum(narrow.values()) == 2, (v, ops)  # the edge value, alone, once each way
        assert not compiled.resources(v.name_expression).spills, v
    with pytest.raises(helpers.BookError, match="edges is a knob of the cluster path"):
        SoftmaxVariant("warp", "float32", 4, edges=True)


def test_the_register_paths_keep_their_rows_out_of_local_memory_and_store_whole_packs():
    for v in [SoftmaxVariant("cluster", "float32", 4, 1024, 32, cluster_size=8),
              SoftmaxVariant("cluster", "float16", 8, 512, 32, cluster_size=16, log=True),
              SoftmaxVariant("cluster", "bfloat16", 8, 256, 16)]:
        compiled = v.compiled(arch="sm_90")
        ops = helpers.opcodes(compiled.sass(v.name_expression))
        assert ops["LDG.E.128.CONSTANT"] == ops["STG.E.128"] == v.cols_per_thread // v.pack_size, (v, ops)
        assert not compiled.resources(v.name_expression).uses_local_memory, v
        if v.cluster_size > 1:  # the exchange: messages into each block's inbox (rows.cuh), one cluster barrier
            assert ops["UCGABAR_ARV"] == 1 and ops["UCGABAR_WAIT"] == 1, (v, ops)  # inboxes made before any message
            assert ops["STAS.64"] == 1 and ops["SYNCS.ARRIVE.TRANS64"] == 1, (v, ops)  # max and sum, one message


def test_the_shared_part_of_a_slice_arrives_by_cp_async_without_registers():
    for v in [SoftmaxVariant("cluster", "float32", 4, 512, 32, cluster_size=8, shared_cols_per_thread=32),
              SoftmaxVariant("cluster", "float16", 8, 512, 64, shared_cols_per_thread=64)]:
        compiled = v.compiled(arch="sm_90")
        ops = helpers.opcodes(compiled.sass(v.name_expression))
        register_packs, shared_packs = v.cols_per_thread // v.pack_size, v.shared_cols_per_thread // v.pack_size
        loads = sum(n for op, n in ops.items() if op in ("LDG.E.128", "LDG.E.128.CONSTANT"))
        assert loads == register_packs and ops["LDGSTS.E.BYPASS.128"] == shared_packs, (v, ops)
        assert ops["STG.E.128"] == register_packs + shared_packs, (v, ops)
        assert compiled.resources(v.name_expression).spill_store_bytes == 0, v  # the row stays out of local memory
        assert v.shared_bytes(v.max_cols()) == shared_packs * 16 * v.block_size
        assert v.max_cols() == (v.cols_per_thread + v.shared_cols_per_thread) * v.block_size * v.cluster_size


@pytest.mark.parametrize("log", [False, True])
def test_no_kernel_the_dispatcher_picks_spills(log):
    """Every on-chip shape of CLUSTER_SHAPES, softmax and log-softmax, each dtype at its widest
    pack and at pack 1 (rows of odd length), compiled as the dispatcher would launch it. A
    spill would put the row through local memory, which is what the path exists to avoid.
    (Log-softmax once spilled 136 bytes here: a column index per pack, kept for the stores.)
    Rows of a power of two fill the shapes that hold them; rows of just over half of one
    (17/32) take the shapes that follow a register-only cluster, which they fill too little."""
    for dtype, widest in (("float32", 4), ("float16", 8), ("bfloat16", 8)):
        picked = set()
        for full in (1 << k for k in range(11, 21)):
            for cols in (full, full // 32 * 17):
                for pack in (widest, 1):
                    v = variant_for(64, cols + (pack == 1), dtype, pack, log=log)
                    if v.path != "cluster":
                        continue
                    if pack > 1:
                        picked.add((v.block_size, v.cols_per_thread, v.cluster_size, v.shared_cols_per_thread))
                    spilled = v.compiled(arch="sm_90").resources(v.name_expression).spill_store_bytes
                    # pack 1: lone values, up to 32 registers of them (lone_value_shape): a few values
                    # may spill (at most 24 bytes over every shape the rule gives, NVRTC 13.0; the exps
                    # kept in flight), never the row.
                    assert spilled <= (0 if pack > 1 else 56), (v, spilled)
        assert picked == {tuple(shape[:4]) for shape in CLUSTER_SHAPES[np_dtype(dtype).itemsize]}, (dtype, picked)


def test_bf16_rows_take_the_shapes_and_registers_of_fp16_rows():
    """A bf16 row held in registers costs what an fp16 row costs: each value is widened from
    its 32-bit word (widen_at) and the kept exponentials go into a fresh pack. Written back
    into the pack being read, every bf16 word was split into two registers: 80-88 where fp16
    takes 48-59, so bf16 rows took the float shapes (2048 x 65536: 3.4 against 4.0 TB/s)."""
    names = {}
    for log in (False, True):
        for cols in (2048, 4096, 16384, 65536, 262144, 1048576):
            for pack in (8, 2):
                half, bf16 = (variant_for(64, cols, dtype, pack, log=log) for dtype in ("float16", "bfloat16"))
                assert half.path == "cluster" and bf16 == dataclasses.replace(half, dtype="bfloat16"), (half, bf16)
                names[half.name_expression] = bf16.name_expression
    compiled = compile_kernels("kernels/softmax.cu", [*names, *names.values()], arch="sm_90")
    for half, bf16 in names.items():
        registers = [compiled.resources(n).registers for n in (half, bf16)]
        assert registers[1] <= registers[0] + 8 and not compiled.resources(bf16).spills, (bf16, registers)


def test_the_dispatcher_holds_the_longest_rows_on_chip(gpu):
    """The first and the largest shapes of CLUSTER_SHAPES with a shared part (the largest:
    clusters of sixteen 512-thread blocks, each with 64 KiB of shared memory) must be
    placeable on this GPU, not only compile. (Rows that fill the register-only clusters
    before them too little take them: 70000 fp32 values, 20000 fp16 ones.)"""
    rng = np.random.default_rng()
    for dtype, cols in (("float32", 70000), ("float32", 524288), ("float16", 20000), ("float16", 1048576)):
        host = (rng.standard_normal((2, cols)) * 3).astype(np_dtype(dtype))
        x, y = DeviceArray.from_numpy(host), DeviceArray((2, cols), dtype)
        y.poison()
        variant = softmax(x, y)
        assert variant.path == "cluster" and variant.shared_cols_per_thread > 0, variant
        _check(host, y, dtype)


def test_the_timed_twin_adds_clock_reads_and_nothing_else():
    """cluster_phases times softmax()'s own cluster kernel: its Timed twin must differ from it only
    by the clock reads (globaltimer and the SM id, and the stores of them by thread 0)."""
    for v in (variant_for(64, 262144, "float32", 4), variant_for(64, 131072, "float16", 8),
              variant_for(64, 4096, "bfloat16", 8)):
        compiled = compile_kernels("kernels/softmax.cu", [v.name_expression, v.timed_name_expression], arch="sm_90")
        plain, timed = (helpers.opcodes(compiled.sass(n)) for n in (v.name_expression, v.timed_name_expression))
        assert "GLOBALTIMER" not in compiled.sass(v.name_expression), v
        assert "GLOBALTIMER" in compiled.sass(v.timed_name_expression), v
        memory = ("LDG", "STG", "LDGSTS", "LDS", "STS", "UCGABAR", "BAR", "MUFU")
        for op in set(plain) | set(timed):
            if op.startswith(memory) and not op.startswith("STG.E.64"):
                assert plain[op] == timed[op], (v, op, plain[op], timed[op])
        assert timed["STG.E.64"] - plain["STG.E.64"] == PHASE_CLOCK_WORDS, (v, timed["STG.E.64"])


def test_cluster_phases_time_the_dispatchers_kernel(gpu):
    phases = cluster_phases(64, 65536, "float16", runs=2)  # checks the output against float64 as well
    assert phases["config"] == variant_for(64, 65536, "float16", 8).config
    assert list(phases["phases_us"]) == list(PHASES)
    assert phases["blocks"] == 64 * phases["config"].get("cluster_size", 1)
    for median, p90 in phases["phases_us"].values():
        assert 0 <= median <= p90
    assert 0 < phases["lifetime_us"] <= phases["span_us"]
    with pytest.raises(helpers.InputError, match="cluster path"):
        cluster_phases(64, 512, "float32")


def test_the_ladder_kernels_compile_as_described():
    naive = SoftmaxVariant("naive", "float32", 1, 256)
    assert len(naive.name_expressions) == 3 and naive.traffic(10, 100) == 4 * 4000 + 160
    ft = ft_style_for(2048 * 16, 16, "float32", per_head_rows=16)
    assert ft.block_size == 32 and ft.rows_per_block == 16
    with pytest.raises(helpers.BookError, match="cols <= 1024"):
        ft_style_for(1, 1025, "float32")
    with pytest.raises(helpers.BookError, match="log-softmax"):
        SoftmaxVariant("block_cached", log=True)
    probe = [helpers.opcodes(helpers.compile_kernels("softmax.cu", [f"cache_layout_probe<4, {layout}>"], arch="sm_90")
                             .sass(f"cache_layout_probe<4, {layout}>")) for layout in (0, 1, 2)]
    assert probe[0]["STS"] == 32 and probe[1]["STS.128"] == 8 and probe[2]["STS"] == 32  # as the chapter says


LONG_VARIANTS = [SoftmaxVariant("cluster", "float32", 4, 128, 8, cluster_size=c, log=log)
                 for c in (1, 2, 4, 8, 16) for log in (False, True)]
# The shared-memory part of a slice: 16-, 8-, 4-byte cp.async, and 2-byte packs through a register.
LONG_VARIANTS += [SoftmaxVariant("cluster", d, p, 64, 2 * p, cluster_size=c, shared_cols_per_thread=s, log=log)
                  for d, p, s, c, log in (("float32", 4, 8, 1, False), ("float32", 4, 4, 4, True),
                                          ("float32", 2, 4, 16, False), ("float16", 2, 8, 2, True),
                                          ("float16", 1, 4, 2, False), ("bfloat16", 8, 16, 8, False))]
LONG_VARIANTS += [SoftmaxVariant("block_uncached", d, 2, 256, online=o, log=log)
                  for d in ("float32", "bfloat16") for o in (False, True) for log in (False, True)]
LONG_VARIANTS += [SoftmaxVariant("naive", "float16", 1, 256),
                  SoftmaxVariant("ft_style", "float32", 1, 1024, rows_per_block=3)]


@pytest.mark.parametrize("variant", LONG_VARIANTS, ids=lambda v: v.name_expression)
def test_every_path_and_its_log_against_float64(gpu, variant):
    rng = np.random.default_rng()
    cap = variant.max_cols() or 5000
    for rows, cols in ((1, variant.pack_size), (7, cap - variant.pack_size), (33, cap // 2 + variant.pack_size),
                       (3, cap)):
        host = (rng.standard_normal((rows, cols)) * 4).astype(np_dtype(variant.dtype))
        masked = host.copy()
        masked[:, 1::5] = -np.inf
        for data in (host, masked):
            x, y = DeviceArray.from_numpy(data), DeviceArray((rows, cols), variant.dtype)
            y.poison()
            variant.launch(x, y)
            out, ref = y.to_numpy(), reference(data, variant.log)
            assert max_error(out, ref, variant.log) <= TOLERANCE[variant.dtype], (rows, cols)


def test_a_fully_masked_row_is_nan_on_every_path(gpu):
    for v in [SoftmaxVariant("cluster", "float32", 4, 128, 8, cluster_size=4),
              SoftmaxVariant("cluster", "float16", 8, 128, 16, cluster_size=2, shared_cols_per_thread=16),
              SoftmaxVariant("block_uncached", "float32", 4, 128, online=True), SoftmaxVariant("warp", "float32", 4)]:
        host = np.random.default_rng().standard_normal((3, 16)).astype(np_dtype(v.dtype))
        host[1] = -np.inf
        x, y = DeviceArray.from_numpy(host), DeviceArray((3, 16), v.dtype)
        v.launch(x, y)
        out = y.to_numpy()
        assert np.isnan(out[1]).all() and not np.isnan(out[[0, 2]]).any(), v


@pytest.mark.parametrize("dtype", list(C_TYPES))
def test_threads_holding_only_masked_values_write_zeros(gpu, dtype):
    """Causal-style rows: the second half -inf, the first far below zero (-1e4 + N(0, 1)). The
    16-bit cluster kernel scales each thread's kept exponentials by exp(thread max - row max); a
    thread that holds only -inf has no max of its own, and must write 0, not 0 * exp(0 + 1e4) = NaN."""
    rng = np.random.default_rng()
    for cols in (4096, 65536):
        host = (-1e4 + rng.standard_normal((3, cols))).astype(np_dtype(dtype))
        host[:, cols // 2:] = -np.inf
        x, y = DeviceArray.from_numpy(host), DeviceArray((3, cols), dtype)
        y.poison()
        variant = softmax(x, y)
        out = y.to_numpy().astype(np.float64)
        assert variant.path == "cluster", variant
        assert (out[:, cols // 2:] == 0).all(), variant
        assert max_error(out, reference(host)) <= TOLERANCE[dtype], variant


def test_the_layout_probe_measures_the_textbook_conflict(gpu):
    cycles = cache_layout_cycles(4)
    # 4-way conflicts on the accesses, which are not the whole loop: 1.75x on the H200
    assert cycles["naive (4-byte accesses)"] > 1.4 * cycles["pack-major"], cycles


def test_measurements_check_first_and_count_the_bytes_a_softmax_must_move(gpu):
    bench = helpers.Bench("softmax-test", ["kernels/softmax.cu"])
    row = measure_dispatcher(bench, 1000, 3000, "float16")
    assert row.bytes == 2 * 1000 * 3000 * 2 and row.rel_err <= TOLERANCE["float16"] and row.config["path"] == "cluster"


def test_our_output_is_the_block_torch_softmax_gives_its_own(gpu):
    """Timed in turns, each call drops its output before the next allocates: ours then lands
    where torch.softmax's output did, and the check reads that very block (a write that does
    not happen leaves the poison, and the check fails)."""
    torch = pytest.importorskip("torch")
    from helpers.operands import outputs_where_torch_puts_them, torch_tensor
    from helpers.softmax_kernels import _check_output, _matrix, softmax_measurement
    rows, cols, dtype = 4099, 1000, "bfloat16"
    host, x, y = _matrix(rows, cols, dtype)
    theirs = torch.softmax(torch_tensor(x), -1).data_ptr()
    ours = outputs_where_torch_puts_them(y)()
    assert ours.ptr == theirs != y.ptr and ours.shape == y.shape and ours.dtype == y.dtype
    del ours
    run, check = softmax_measurement(variant_for(rows, cols, dtype, full_pack(dtype)), rows, cols)["setup"]()
    assert check() <= TOLERANCE[dtype]
    with pytest.raises(AssertionError, match="exceeds the tolerance"):
        _check_output("nothing written", lambda out: None, outputs_where_torch_puts_them(y), host, dtype, False)
