"""LayerNorm (chapter 5): machine code without a GPU; every path against float64 on the
GPU, with the large-offset hazard, constant rows and fp16 near its limits."""
import dataclasses
import re
from collections import Counter

import numpy as np
import pytest

import helpers
from helpers.device import DeviceArray
from helpers.layernorm_kernels import (AFFINE_RING, C_TYPES, SLICED_PATHS, TOLERANCE, WARP_ROWS_LAYOUTS,
                                       LayerNormVariant, bytes_moved, lane_group_variant, layer_norm, max_error,
                                       measure_dispatcher, offset_error, reference, variant_for, warp_rows_layout,
                                       warp_rows_offsets_fit)
from helpers.operands import full_pack, np_dtype, widest_pack_for


def _opcodes(v):
    return helpers.opcodes(v.compiled(arch="sm_90").sass(v.name_expression))


def test_the_register_paths_move_whole_16_byte_packs_without_local_memory():
    for v in [LayerNormVariant("warp", "float32", 4, 32, 32, 32), LayerNormVariant("warp", "float16", 8, 64, 16, 2),
              LayerNormVariant("warp", "float32", 4, 64, 16, 32, early_affine=True),
              LayerNormVariant("cluster", "float32", 4, 1024, 32, cluster_size=8),
              LayerNormVariant("cluster", "bfloat16", 8, 256, 64, cluster_size=16)]:
        ops, packs = _opcodes(v), v.cols_per_thread // v.pack_size
        assert ops["LDG.E.128.CONSTANT"] == 3 * packs and ops["STG.E.128"] == packs, (v, ops)  # x, weight, bias; y
        narrow = sum(n for op, n in ops.items() if op.startswith("LDG") and ".128" not in op)
        # the row's first value (the shift); nothing else value by value. 16-bit lane groups load
        # no shift: they compute the mean's rounding instead (layernorm_warp_per_row)
        shifted = not (v.path == "warp" and np_dtype(v.dtype).itemsize == 2)
        assert narrow == int(shifted), (v, ops)
        assert not v.compiled(arch="sm_90").resources(v.name_expression).uses_local_memory, v
        if v.path == "warp":  # registers and shuffles only
            assert not any(op.startswith(("BAR", "STS", "LDS")) for op in ops), v
        elif v.cluster_size > 1:  # the exchange: messages into each block's inbox (rows.cuh), one cluster barrier
            assert ops["UCGABAR_ARV"] == 1 and ops["UCGABAR_WAIT"] == 1 and ops["BAR.SYNC.DEFER_BLOCKING"] >= 1, ops
            assert ops["STAS"] == 3 and ops["SYNCS.ARRIVE.TRANS64"] == 1, (v, ops)  # count, mean, M2: a word each
    fused = LayerNormVariant("block_fused", "float16", 8, 256)
    ops = _opcodes(fused)
    assert ops["LDG.E.128.CONSTANT"] >= 4 and ops["STG.E.128"] >= 1 and ops["BAR.SYNC.DEFER_BLOCKING"] == 1, ops


def test_16_bit_lane_groups_subtract_the_rounded_mean_from_every_value():
    """16-bit lane groups correct for the rounding of mean0 = round(sum * (1/cols)), so mean0 itself,
    one register, must be what every value has taken off: an FADD each. Written `sum * inv_cols`,
    the compiler fused each subtraction into an FFMA with the unrounded product, and rows of 184,
    192 and 1000 values at 1e4 + N(0, 1) came out 9-209 times the tolerance off (H200, 2026-11-27);
    this SASS check failed on that form at those lengths too. It runs without a GPU."""
    # an FADD with one operand negated, in either place: the register negated is what is subtracted
    subtracted = re.compile(r"FADD R\d+, (?:-(R\d+)(?:\.reuse)?, R\d+(?:\.reuse)?"
                            r"|R\d+(?:\.reuse)?, -(R\d+)(?:\.reuse)?)")
    for dtype in ("float16", "bfloat16"):
        for cols in (7, 184, 192, 248, 1000):
            v = variant_for(cols, dtype, widest_pack_for(cols, dtype), statistics=True)
            assert v.path == "warp", v
            sass = v.compiled(arch="sm_90").sass(v.name_expression)
            by_register = Counter(a or b for a, b in subtracted.findall(sass))
            assert by_register and by_register.most_common(1)[0][1] >= v.cols_per_thread, (v, by_register)


@pytest.mark.parametrize("per_lane, rows_a_warp", WARP_ROWS_LAYOUTS)
def test_warp_rows_loads_each_row_once_and_stores_it_in_one_burst(per_lane, rows_a_warp):
    """layernorm_warp_rows: a 16-byte load a pack of each row from the read-only path, weight and
    bias a pack a lane, kept in L1, no load value by value (no shift), the rows' sums traded between
    lanes (warp_sum_rows: four rows, two sums of six butterfly shuffles and four broadcasts each;
    two rows, five and two), the stores together after the last rsqrt, two registers or fewer
    for each value a lane holds (32 warps an SM at 32 values), nothing in local memory."""
    packs, trading_levels = per_lane // 8, rows_a_warp.bit_length() - 1
    for dtype in ("float16", "bfloat16"):
        v = LayerNormVariant("warp_rows", dtype, 8, 32, per_lane, rows_per_warp=rows_a_warp)
        compiled = v.compiled(arch="sm_90")
        sass = compiled.sass(v.name_expression)
        ops = helpers.opcodes(sass)
        loads = packs * rows_a_warp
        assert ops["LDG.E.128.CONSTANT"] == loads and ops["LDG.E.EL.128"] == 2 * packs, ops
        assert ops["STG.E.128"] == loads, ops
        assert sum(n for op, n in ops.items() if op.startswith(("LDG", "STG"))) == 2 * loads + 2 * packs, ops
        assert ops["SHFL.BFLY"] == 2 * (rows_a_warp - 1 + 5 - trading_levels), ops
        assert ops["SHFL.IDX"] == 2 * rows_a_warp, ops
        assert ops["MUFU.RSQ"] == rows_a_warp and "BAR.SYNC.DEFER_BLOCKING" not in ops, ops
        lines = [line for line in sass.splitlines() if line.strip()]
        stores = [i for i, line in enumerate(lines) if "STG" in line]
        last_rsqrt = max(i for i, line in enumerate(lines) if "MUFU.RSQ" in line)
        assert min(stores) > last_rsqrt and not any("BSSY" in line for line in lines), (stores, last_rsqrt)
        resources = compiled.resources(v.name_expression)
        assert resources.registers <= 2 * per_lane * rows_a_warp and not resources.uses_local_memory, resources


@pytest.mark.parametrize("cols, per_lane, rows_a_warp", [(168, 8, 4), (344, 16, 2), (568, 24, 2)])
def test_warp_rows_with_the_row_length_compiled_in_divides_by_nothing(cols, per_lane, rows_a_warp):
    """The row length compiled in (row_length): no reciprocal of it at run time (MUFU.RCP), fewer
    instructions than the kernel that takes it as an argument, the same loads, shuffles and stores."""
    for dtype in ("float16", "bfloat16"):
        generic = LayerNormVariant("warp_rows", dtype, 8, 32, per_lane, rows_per_warp=rows_a_warp)
        fixed = LayerNormVariant("warp_rows", dtype, 8, 32, per_lane, rows_per_warp=rows_a_warp, row_length=cols)
        assert fixed.name_expression.endswith(f", {cols}>") and fixed.config["row_length"] == cols
        sass = {v: v.compiled(arch="sm_90").sass(v.name_expression) for v in (generic, fixed)}
        ops = {v: helpers.opcodes(text) for v, text in sass.items()}
        assert ops[generic]["MUFU.RCP"] >= 1 and "MUFU.RCP" not in ops[fixed], ops[fixed]
        moving = ("LDG", "STG", "SHFL")
        for op in {op for v in ops for op in ops[v] if op.startswith(moving)}:
            assert ops[generic][op] == ops[fixed][op], op
        assert sum(ops[fixed].values()) < sum(ops[generic].values()), (sum(ops[fixed].values()),
                                                                       sum(ops[generic].values()))


def test_fp32_rows_of_a_power_of_two_length_move_pairs_of_floats():
    """FLOAT_PAIRS: x, weight and bias in 8-byte loads (weight and bias with the row), y in
    8-byte stores, and no 16-byte access left, whatever wider pack the pointers allow."""
    for cols in (64, 256, 1024):
        v = variant_for(cols, "float32", 4)
        ops, packs = _opcodes(v), v.cols_per_thread // 2
        assert ops["LDG.E.64.CONSTANT"] == 3 * packs and ops["STG.E.64"] == packs, (v, ops)
        assert not any(".128" in op for op in ops), (v, ops)


def test_the_streamed_path_reads_the_row_twice_with_its_cache_hints():
    """Pass 1 loads each pack with evict_last (EL), pass 2 again with evict_first (EF),
    weight and bias through the read-only path, and stores without taking a line in L1
    (NA); without hints, the same loads and stores carry none. The dispatcher's shapes, and
    one with more packs a thread."""
    for blocks, per_thread in ((256, 8), (512, 8), (512, 16), (64, 32)):
        hinted = LayerNormVariant("streamed", "float32", 4, blocks, per_thread)
        plain = LayerNormVariant("streamed", "float32", 4, blocks, per_thread, cache_hints=False)
        packs = per_thread // 4
        ops = _opcodes(hinted)
        assert ops["LDG.E.EL.128"] == packs and ops["LDG.E.EF.128"] == packs, ops
        assert ops["LDG.E.128.CONSTANT"] == 2 * packs and ops["STG.E.NA.128"] == packs and "STG.E.128" not in ops, ops
        assert ops["BAR.SYNC.DEFER_BLOCKING"] == 2, ops  # two block sums: the mean, then the squares about it
        ops = _opcodes(plain)
        assert not any(".EL" in op or ".EF" in op or ".NA" in op for op in ops), ops
        assert ops["LDG.E.128.CONSTANT"] == 4 * packs and ops["STG.E.128"] == packs, ops  # x twice, weight, bias
        for v in (hinted, plain):
            assert not v.compiled(arch="sm_90").resources(v.name_expression).uses_local_memory, v


def test_no_kernel_the_dispatcher_picks_spills():
    """Every register-path shape the dispatcher picks, each dtype at its widest pack, at pack 1
    (arrays aligned to no pack), and on rows of odd length in the widest pack (their aligned
    middle: edges), compiled as it would be launched. A spill puts part of the
    row through local memory, which is what these paths exist to avoid. (fp32 rows of 32
    values a thread load weight and bias two packs at a time: 64 registers of 64 in
    1024-thread blocks, no spill.)"""
    for dtype, widest in (("float32", 4), ("float16", 8), ("bfloat16", 8)):
        for cols in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 40000, 65536, 80000, 90000, 100000, 131072,
                     140000, 262144, 524288):  # 40 000 to 140 000: the clusters of fewer values a thread
            for pack, extra in ((widest, 0), (1, 1), (widest, 1)):  # the last: EDGES
                v = variant_for(cols + extra, dtype, pack)
                if v.path not in SLICED_PATHS:
                    continue
                # Not even a word: fp32 rows of 65536 values (256 x 32 in clusters of 8) kept their
                # packs' bound predicates in one across the cluster exchange (P2R, one STL, two LDL)
                # until the columns of packs were counted in 32 bits (layernorm.cu).
                assert not v.compiled(arch="sm_90").resources(v.name_expression).uses_local_memory, v
    for dtype in ("float16", "bfloat16"):  # rows that leave an eighth of their group's slots empty (PART_FILLED)
        for cols in (40, 80, 96, 192, 200, 320, 448, 576, 640):
            v = variant_for(cols, dtype, 8)
            assert not v.compiled(arch="sm_90").resources(v.name_expression).uses_local_memory, v


def test_16_bit_rows_of_1024_threads_load_weight_and_bias_ahead_of_their_stores():
    """kAffineAhead: where 1024 threads hold 64 16-bit values each and the slice is full, pack p + 1's
    weight and bias are loaded before pack p is stored, so more than one pack's pair is in flight
    between two stores; a slice the row leaves part empty takes a second loop, each store waiting for
    its own pair (two loads between stores), as every store does elsewhere (512 threads here)."""
    def loads_between_stores(v):
        sass = v.compiled(arch="sm_90").sass(v.name_expression)
        sequence = re.findall(r"\b(LDG\.E(?:\.EL)?\.128\S*|STG\.E\.128)", sass)
        counts, loads = [], 0
        for op in sequence[sequence.index("STG.E.128") + 1:]:
            if op == "STG.E.128":
                counts.append(loads)
                loads = 0
            else:
                loads += 1
        return counts
    for dtype in ("float16", "bfloat16"):
        for k in (1, 8, 16):
            ahead = LayerNormVariant("cluster", dtype, 8, 1024, 64, cluster_size=k)
            counts = loads_between_stores(ahead)  # both loops: 16 stores, 15 gaps
            assert len(counts) == 15 and counts.count(2) >= 7 and max(counts) >= 4, (ahead, counts)
            assert sum(counts) <= 2 * 16 - 2, (ahead, counts)  # 2 loads a store; none but the first before the first
            assert ahead.compiled(arch="sm_90").resources(ahead.name_expression).registers <= 64, ahead
        assert loads_between_stores(LayerNormVariant("cluster", dtype, 8, 512, 64)) == [2] * 7
    kept = LayerNormVariant("cluster", "float16", 8, 1024, 64, weight_kept_in_l1=True)  # WEIGHT_KEPT_IN_L1
    plain = LayerNormVariant("cluster", "float16", 8, 1024, 64)  # the same block, weight and bias without the hint
    assert variant_for(65536, "float16", 8) == kept and loads_between_stores(kept) == loads_between_stores(plain)


def test_long_rows_of_1024_thread_blocks_keep_weight_and_bias_in_l1():
    """WEIGHT_KEPT_IN_L1: past 160 KiB of weight and bias, where a block of 1024 threads holds the row,
    weight and bias are loaded with L1::evict_last (LDG.E.EL) and the row without it; shorter rows,
    smaller blocks, clusters and rows with edges load all three alike, and fp32 rows past 25 600
    values stage them in shared memory instead (AFFINE_RING)."""
    for dtype, shortest, longest in (("float32", 20484, 25600), ("float16", 40968, 65536),
                                     ("bfloat16", 40968, 65536)):
        pack = full_pack(dtype)
        for cols in (shortest - pack, longest + pack, 32768 + pack, 2 * longest, longest // 2):
            assert not variant_for(cols, dtype, pack).weight_kept_in_l1, (dtype, cols)
        with_edges = variant_for(longest - 1, dtype, pack)
        assert with_edges.edges and not with_edges.weight_kept_in_l1
        for cols in (shortest, longest):
            v = variant_for(cols, dtype, pack)
            assert v.weight_kept_in_l1 and (v.block_size, v.cluster_size) == (1024, 1), v
            ops, packs = _opcodes(v), v.cols_per_thread // v.pack_size
            # the row's packs as before; weight and bias kept, a load each a pack (16-bit: in both of
            # kAffineAhead's loops)
            assert ops["LDG.E.128.CONSTANT"] == packs and ops["LDG.E.EL.128.CONSTANT"] in (2 * packs, 4 * packs), ops


def test_long_fp32_rows_of_1024_thread_blocks_stage_weight_and_bias_in_shared_memory():
    """AFFINE_RING: fp32 rows of 25 601 to 32 768 values in 16-byte packs, a block of 1024 threads a row,
    copy weight and bias into four slots of shared memory (cp.async: LDGSTS, a pair a pack), the first
    four before the row's loads; each store waits once (DEPBAR) and reads its pair back (LDS.128). No
    16-bit row, no row with edges and no row past the block takes it."""
    for cols in (25604, 30000, 32768):
        v = variant_for(cols, "float32", 4)
        assert v.affine_ring == AFFINE_RING == 4 and not v.weight_kept_in_l1, v
        assert (v.block_size, v.cluster_size, v.shared_bytes) == (1024, 1, 4 * 2 * 16 * 1024), v
        assert v.config["affine_ring"] == 4 and v.name_expression.endswith(", false, false, 4>"), v
    for dtype, cols, pack in (("float32", 25600, 4), ("float32", 32772, 4), ("float32", 32767, 4),
                              ("float32", 30000, 2), ("float16", 65536, 8), ("bfloat16", 60000, 8)):
        assert not variant_for(cols, dtype, pack).affine_ring, (dtype, cols, pack)
    v = variant_for(32768, "float32", 4)
    sass = v.compiled(arch="sm_90").sass(v.name_expression)
    ops, packs = helpers.opcodes(sass), v.cols_per_thread // v.pack_size
    assert ops["LDGSTS.E.BYPASS.128"] == 2 * packs and ops["LDS.128"] == 2 * packs, ops
    assert ops["LDG.E.128.CONSTANT"] == packs and ops["DEPBAR.LE"] == packs and ops["STG.E.128"] == packs, ops
    assert "LDG.E.EL.128.CONSTANT" not in ops, ops
    order = re.findall(r"\b(LDGSTS\.E\.BYPASS\.128|LDG\.E\.128\.CONSTANT)", sass)
    assert order[:8] == ["LDGSTS.E.BYPASS.128"] * 8, order  # four slots asked for before the row's first load
    resources = v.compiled(arch="sm_90").resources(v.name_expression)
    assert resources.registers <= 64 and not resources.uses_local_memory, resources


def test_rows_with_edges_move_their_middle_and_their_weight_in_16_byte_packs():
    """The aligned middle of a row the pack does not divide travels in 16-byte packs: x and y one
    access a pack, weight and bias two (the pair of aligned packs a realigned one straddles); the
    edge values alone (x, weight, bias; y), with the row's first value (the shift). The realigning
    is selects and, for 16-bit values, funnel shifts; no register array goes to local memory, and
    of the dispatcher's shapes none spills more than a word (test_no_kernel_the_dispatcher_picks_spills)."""
    for v in [variant_for(4097, "float32", 4), variant_for(4097, "float16", 8), variant_for(32769, "bfloat16", 8),
              variant_for(65537, "float32", 4), LayerNormVariant("cluster", "float32", 4, 64, 16, early_affine=True,
                                                                 edges=True)]:
        assert v.edges, v
        ops, packs = _opcodes(v), v.cols_per_thread // v.pack_size
        assert ops["LDG.E.128.CONSTANT"] == 5 * packs and ops["STG.E.128"] == packs, (v, ops)
        narrow_loads = {op: n for op, n in ops.items() if op.startswith("LDG") and ".128" not in op}
        narrow_stores = sum(n for op, n in ops.items() if op.startswith("STG") and ".128" not in op)
        assert sum(narrow_loads.values()) == 4, (v, narrow_loads)  # the shift, an edge value, its weight and bias
        assert narrow_stores >= 1, (v, ops)  # the edge's output (and the statistics)
        assert ops["SEL"] >= 2 * packs * (2 if v.pack_size * np_dtype(v.dtype).itemsize == 16 else 1), (v, ops)
        if np_dtype(v.dtype).itemsize == 2:
            assert sum(n for op, n in ops.items() if op.startswith("SHF.R.W")) >= 2 * 4 * packs, (v, ops)
        assert v.compiled(arch="sm_90").resources(v.name_expression).local_bytes == 0, v


def test_bf16_rows_take_the_registers_of_fp16_rows():
    """A bf16 row in registers costs what an fp16 row costs: two values a 32-bit register,
    widened where they are used (widen_at). Widened one bf16 at a time, the compiler split
    every register in two first (PRMT), and the cluster path took 92-96 registers where fp16
    takes 56-64: half the blocks an SM, 3.3 against 4.0 TB/s at 8192 x 16384."""
    for cols in (256, 1024, 2048, 4096, 8192, 16384, 65536, 131072):
        half = variant_for(cols, "float16", 8)
        bf16 = dataclasses.replace(half, dtype="bfloat16")  # the same shape in bf16
        registers = [v.compiled(arch="sm_90").resources(v.name_expression).registers for v in (half, bf16)]
        assert registers[1] <= registers[0] + 8, (bf16, registers)
        assert variant_for(cols, "bfloat16", 8) == bf16, cols  # the dispatcher gives bf16 fp16's shape


@pytest.mark.parametrize("kwargs, message", [(dict(path="tree"), "path must be one of"),
                                              (dict(pack_size=8), "at most 16 bytes"),
                                              (dict(cols_per_thread=6), "multiple of pack_size"),
                                              (dict(cols_per_thread=64), "up to 32"),
                                              (dict(group_width=3), "group_width"),
                                              (dict(path="cluster", cluster_size=3), "cluster_size"),
                                              (dict(statistics="kahan"), "statistics"),
                                              (dict(path="unfused"), "pack_size must be 1"),
                                              (dict(block_size=100), "multiple of 32"),
                                              (dict(path="streamed", pack_size=2), "16-byte packs"),
                                              (dict(cache_hints=False), "choice of the streamed path"),
                                              (dict(path="warp_rows", pack_size=4, block_size=32), "16-bit rows"),
                                              (dict(path="warp_rows", dtype="float16", pack_size=8), "block_size 32"),
                                              (dict(path="warp_rows", dtype="float16", pack_size=8, block_size=32,
                                                    cols_per_thread=16, rows_per_warp=4), "rows_per_warp"),
                                              (dict(rows_per_warp=2), "choice of the warp_rows path"),
                                              (dict(row_length=8), "choice of the warp_rows path"),
                                              (dict(edges=True), "choice of the cluster path"),
                                              (dict(weight_kept_in_l1=True), "choice of the cluster path with late"),
                                              (dict(path="cluster", weight_kept_in_l1=True, early_affine=True),
                                               "weight_kept_in_l1"),
                                              (dict(path="cluster", pack_size=2, weight_kept_in_l1=True), "16-byte"),
                                              (dict(affine_ring=4), "affine_ring is a choice of the cluster path"),
                                              (dict(path="cluster", cluster_size=2, affine_ring=1), "cluster_size 1"),
                                              (dict(path="cluster", affine_ring=1, weight_kept_in_l1=True),
                                               "weight_kept_in_l1"),
                                              (dict(path="cluster", affine_ring=3), "1 to 2 slots"),
                                              (dict(path="cluster", pack_size=1, cols_per_thread=8, edges=True),
                                               "two values or more"),
                                              (dict(path="warp_rows", dtype="float16", pack_size=8, block_size=32,
                                                    cols_per_thread=8, row_length=264), "up to 256"),
                                              (dict(path="warp_rows", dtype="float16", pack_size=8, block_size=32,
                                                    cols_per_thread=8, row_length=170), "16-byte packs")])
def test_variants_refuse_what_they_cannot_take(kwargs, message):
    with pytest.raises(helpers.BookError, match=message):
        LayerNormVariant(**kwargs)


def test_the_dispatcher_prefers_a_lane_group_then_a_block_then_a_cluster():
    # rows of up to 1024 values: a lane group per row, 16 values a lane or more, two-warp blocks
    assert variant_for(384, "float32", 4) == LayerNormVariant("warp", "float32", 4, 64, 12, 32, early_affine=True)
    assert variant_for(96, "float32", 4) == LayerNormVariant("warp", "float32", 4, 64, 16, 8)
    # fp32 rows of a power-of-two length from 64 values: pairs of floats, 8 a lane or more,
    # weight and bias with the row (FLOAT_PAIRS), whatever wider pack the pointers allow
    assert variant_for(512, "float32", 4) == LayerNormVariant("warp", "float32", 2, 64, 16, 32, early_affine=True)
    assert variant_for(256, "float32", 2) == LayerNormVariant("warp", "float32", 2, 64, 8, 32, early_affine=True)
    assert variant_for(64, "float32", 4) == LayerNormVariant("warp", "float32", 2, 128, 8, 8, early_affine=True)
    assert variant_for(128, "float32", 4) == LayerNormVariant("warp", "float32", 2, 128, 8, 16, early_affine=True)
    assert variant_for(1024, "float32", 4) == LayerNormVariant("warp", "float32", 2, 32, 32, 32, early_affine=True)
    assert variant_for(32, "float32", 4).pack_size == 4 and variant_for(256, "float32", 1).pack_size == 1
    assert variant_for(640, "float32", 4).pack_size == variant_for(192, "float32", 4).pack_size == 4
    # 16-bit rows of 64 to 256 values load weight and bias with the row too
    assert variant_for(256, "float16", 8) == LayerNormVariant("warp", "float16", 8, 64, 16, 16, early_affine=True)
    assert variant_for(64, "bfloat16", 8).early_affine and not variant_for(336, "float16", 8).early_affine
    # 16-bit rows that leave an eighth of the group's slots empty or more: a group half as wide,
    # each lane the packs it needs; one warp a block where that fills the group (PART_FILLED)
    assert lane_group_variant(192, "float16", 8) == LayerNormVariant("warp", "float16", 8, 32, 24, 8)
    assert lane_group_variant(200, "bfloat16", 8) == LayerNormVariant("warp", "bfloat16", 8, 64, 32, 8)
    assert lane_group_variant(640, "float16", 8) == LayerNormVariant("warp", "float16", 8, 32, 40, 16)
    assert lane_group_variant(480, "float16", 8) == LayerNormVariant("warp", "float16", 8, 64, 16, 32)  # 60 of 64 slots
    assert variant_for(896, "bfloat16", 8) == LayerNormVariant("warp", "bfloat16", 8, 32, 32, 32)  # 56 a lane: no
    assert variant_for(192, "float32", 4) == LayerNormVariant("warp", "float32", 4, 64, 16, 16)  # fp32: as it was
    assert variant_for(8, "float16", 8) == LayerNormVariant("warp", "float16", 8, 64, 16, 1)  # one lane: none narrower
    # 16-bit rows of 21 to 31 16-byte packs: a whole warp a row, four rows a warp (WARP_ROWS); of 43
    # to 63 and 71 to 95, two rows a warp of two and three packs a lane; not where mean and rstd are
    # wanted, nor past its 32-bit offsets, nor at 20, 32, 42, 64, 70 or 96 packs, nor in narrower
    # packs or fp32
    rows_path = LayerNormVariant("warp_rows", "float16", 8, 32)
    assert variant_for(192, "float16", 8) == rows_path and variant_for(184, "float16", 8) == rows_path
    for cols, per_lane in ((368, 16), (504, 16), (608, 24), (760, 24)):
        assert variant_for(cols, "bfloat16", 8) == LayerNormVariant("warp_rows", "bfloat16", 8, 32, per_lane,
                                                                    rows_per_warp=2), cols
    # ...with the row length compiled in at 21-22, 43-45 and 71-75 packs (ROW_LENGTH_COMPILED_IN)
    for cols, per_lane, rows_a_warp in ((168, 8, 4), (176, 8, 4), (344, 16, 2), (360, 16, 2), (568, 24, 2),
                                        (600, 24, 2)):
        assert variant_for(cols, "float16", 8) == LayerNormVariant("warp_rows", "float16", 8, 32, per_lane,
                                                                   rows_per_warp=rows_a_warp, row_length=cols), cols
    assert variant_for(248, "bfloat16", 8) == LayerNormVariant("warp_rows", "bfloat16", 8, 32)
    # ...but bf16 rows of 60 and 62 packs stay with the lane groups (WARP_ROWS_EXCEPT); fp16 ones do not
    for cols in (480, 496):
        assert variant_for(cols, "bfloat16", 8) == lane_group_variant(cols, "bfloat16", 8), cols
        assert variant_for(cols, "float16", 8) == warp_rows_layout(cols, "float16"), cols
    for cols in (472, 488, 504):
        assert variant_for(cols, "bfloat16", 8) == warp_rows_layout(cols, "bfloat16"), cols
    # warp_rows_layout: the layout that holds a row, inside the rule's bounds or out of them
    for cols in (8, 160, 168, 256, 264, 336, 512, 520, 552, 632, 768):
        per_lane = 8 * -(-cols // 256)
        assert warp_rows_layout(cols, "float16") == LayerNormVariant("warp_rows", "float16", 8, 32, per_lane,
                                                                     rows_per_warp=4 if per_lane == 8 else 2), cols
        if variant_for(cols, "float16", 8).path == "warp_rows":
            assert variant_for(cols, "float16", 8) in (warp_rows_layout(cols, "float16"),
                                                       warp_rows_layout(cols, "float16", compiled_in=True)), cols
    assert warp_rows_layout(632, "bfloat16", compiled_in=True).row_length == 632
    for cols, dtype in ((776, "float16"), (170, "bfloat16"), (0, "float16"), (192, "float32")):
        with pytest.raises(helpers.BookError, match="16-bit rows of 8 to 768 values"):
            warp_rows_layout(cols, dtype)
    assert variant_for(192, "float16", 8, statistics=True) == lane_group_variant(192, "float16", 8)
    assert variant_for(192, "float16", 8, rows=1 << 28) == lane_group_variant(192, "float16", 8)
    for cols, dtype, pack in ((160, "float16", 8), (256, "bfloat16", 8), (336, "float16", 8), (512, "float16", 8),
                              (560, "bfloat16", 8), (768, "float16", 8), (192, "float16", 4), (352, "float32", 4)):
        assert variant_for(cols, dtype, pack).path == "warp", (cols, dtype, pack)
    assert warp_rows_offsets_fit(89_478_482, 192) and not warp_rows_offsets_fit(89_478_483, 192)  # (r + 3) * 24 < 2^31
    assert warp_rows_offsets_fit(48_806_445, 352, 2) and not warp_rows_offsets_fit(48_806_446, 352, 2)  # (r + 1) * 44
    assert variant_for(352, "float16", 8, rows=1 << 26) == lane_group_variant(352, "float16", 8)
    # ...and one-warp blocks where a lane holds more (rows of 513 to 1024 values)
    # a whole warp: each lane as many packs as the row needs (768 values: 24 a lane, not 32)
    assert variant_for(768, "float32", 4) == LayerNormVariant("warp", "float32", 4, 32, 24, 32, early_affine=True)
    assert variant_for(768, "bfloat16", 8) == LayerNormVariant("warp", "bfloat16", 8, 32, 24, 32, early_affine=True)
    assert variant_for(520, "float32", 4).cols_per_thread == 20 and variant_for(513, "float16", 1).cols_per_thread == 17
    # 16-bit rows in a whole warp load weight and bias with the row where the lanes' 16-byte
    # slots are full or nearly so, and at the stores where more are empty (WHOLE_WARP_EARLY)
    for cols, block, per_lane, early in ((512, 64, 16, True), (768, 32, 24, True), (776, 32, 32, False),
                                         (960, 32, 32, False), (968, 32, 32, True), (1024, 32, 32, True)):
        for dtype in ("float16", "bfloat16"):
            assert variant_for(cols, dtype, 8) == LayerNormVariant("warp", dtype, 8, block, per_lane, 32,
                                                                   early_affine=early), (cols, dtype)
    assert not variant_for(480, "bfloat16", 8).early_affine  # bf16 480 and 496 (WARP_ROWS_EXCEPT): 60 and 62 of 64
    assert variant_for(1024, "float16", 4) == LayerNormVariant("warp", "float16", 4, 32, 32, 32)  # 8-byte packs: late
    assert variant_for(7, "float16", 1) == LayerNormVariant("warp", "float16", 1, 64, 16, 1)
    assert variant_for(2048, "float16", 8) == LayerNormVariant("cluster", "float16", 8, 64, 32)  # past 1024 values
    for cols in (8193, 16384, 65536, 262144, 524288):
        v = variant_for(cols, "float32", 4)
        assert v.path == "cluster" and v.max_cols() >= cols // 4 * 4 and v.edges == (cols % 4 > 0), (cols, v)
    # fp32 rows of 1025 to 8192 values in 16-byte packs are read twice; with other packs,
    # and in 16-bit formats, the row stays in registers
    assert variant_for(1028, "float32", 4) == LayerNormVariant("streamed", "float32", 4, 256, 8)
    assert variant_for(4096, "float32", 4) == LayerNormVariant("streamed", "float32", 4, 512, 8)
    assert variant_for(4100, "float32", 4) == LayerNormVariant("streamed", "float32", 4, 512, 16)
    assert variant_for(8196, "float32", 4).path == "cluster"
    assert variant_for(2050, "float32", 2).path == variant_for(2048, "float16", 8).path == "cluster"
    assert variant_for(524292, "float32", 4).path == "block_fused" and variant_for(524289, "float32", 4).edges
    assert variant_for(1048584, "float16", 8) == LayerNormVariant("block_fused", "float16", 8, 1024)
    # rows the pack does not divide, on aligned arrays: the aligned middle in the shape of its
    # packs, the edges alone (EDGES); past the largest register shape, the fused block in the
    # packs that divide the row
    assert variant_for(4097, "float32", 4) == LayerNormVariant("cluster", "float32", 4, 256, 16, edges=True)
    assert variant_for(4098, "float16", 8) == LayerNormVariant("cluster", "float16", 8, 64, 64, edges=True)
    assert variant_for(1025, "bfloat16", 8) == LayerNormVariant("cluster", "bfloat16", 8, 64, 32, edges=True)
    assert variant_for(65537, "float32", 4) == LayerNormVariant("cluster", "float32", 4, 256, 32, cluster_size=8,
                                                                edges=True)
    # rows in clusters: the first shape of CLUSTER_SHAPES that holds the row's middle, so 16-bit rows of
    # 65 537-131 072 values in 8 blocks of 256 holding 40 to 64 values a thread, not 16 blocks of 64, and
    # fp32 rows of 32 769-40 960 and 65 537-81 920 in blocks of 20 values a thread
    assert variant_for(80000, "float16", 8) == LayerNormVariant("cluster", "float16", 8, 256, 40, cluster_size=8)
    assert variant_for(90000, "bfloat16", 8) == LayerNormVariant("cluster", "bfloat16", 8, 256, 48, cluster_size=8)
    assert variant_for(100001, "float16", 8) == LayerNormVariant("cluster", "float16", 8, 256, 56, cluster_size=8,
                                                                 edges=True)
    assert variant_for(131072, "bfloat16", 8) == LayerNormVariant("cluster", "bfloat16", 8, 256, 64, cluster_size=8)
    assert variant_for(131073, "float16", 8) == LayerNormVariant("cluster", "float16", 8, 256, 64, cluster_size=8,
                                                                 edges=True)  # its middle: 131 072 values
    assert variant_for(140000, "float16", 8) == LayerNormVariant("cluster", "float16", 8, 256, 48, cluster_size=16)
    assert variant_for(300000, "float16", 8) == LayerNormVariant("cluster", "float16", 8, 512, 64, cluster_size=16)
    assert variant_for(40000, "float32", 4) == LayerNormVariant("cluster", "float32", 4, 256, 20, cluster_size=8)
    assert variant_for(70001, "float32", 4) == LayerNormVariant("cluster", "float32", 4, 256, 20, cluster_size=16,
                                                                edges=True)
    assert variant_for(100001, "float32", 4) == LayerNormVariant("cluster", "float32", 4, 256, 32, cluster_size=16,
                                                                 edges=True)
    assert variant_for(200000, "float32", 4) == LayerNormVariant("cluster", "float32", 4, 512, 32, cluster_size=16)
    assert variant_for(1030, "float32", 4).edges  # 1028, which 16-byte packs divide, is streamed (above)
    assert variant_for(1048577, "float32", 4) == LayerNormVariant("block_fused", "float32", 1, 1024)
    assert variant_for(1048578, "float32", 4) == LayerNormVariant("block_fused", "float32", 2, 1024)
    assert variant_for(1023, "float32", 4).path == "warp" and variant_for(1023, "float32", 4).pack_size == 1
    # arrays aligned to no pack (pack 1): a block fitted to the row (4097 values: 256 threads of 17,
    # not 512 of 16), clusters of such blocks for fp32, then the fused block, which re-reads the row
    assert variant_for(4097, "float32", 1) == LayerNormVariant("cluster", "float32", 1, 256, 17)
    assert variant_for(1025, "bfloat16", 1) == LayerNormVariant("cluster", "bfloat16", 1, 128, 9)
    assert variant_for(32769, "float32", 1) == LayerNormVariant("cluster", "float32", 1, 256, 17, cluster_size=8)
    assert variant_for(32769, "float16", 1) == LayerNormVariant("block_fused", "float16", 1, 1024)
    assert variant_for(131073, "float32", 1) == LayerNormVariant("block_fused", "float32", 1, 1024)


def test_the_bytes_and_the_unfused_traffic():
    assert bytes_moved(10, 100, "float16") == (2 * 10 + 2) * 100 * 2
    assert bytes_moved(10, 100, "float32", statistics=True) == 22 * 400 + 80
    assert [widest_pack_for(n, "float32") for n in (3000, 12, 6, 7)] == [4, 4, 2, 1]
    assert widest_pack_for(3000, "float16") == 8 and widest_pack_for(1024, "bfloat16") == 8
    unfused = LayerNormVariant("unfused", "float32", 1, 256)
    assert len(unfused.name_expressions) == 3 and unfused.traffic(10, 100) == 22 * 400 + 2 * 4000 + 160


def _operands(rows, cols, dtype, rng, scale=3.0, offset=1.0):
    host = (rng.standard_normal((rows, cols)) * scale + offset).astype(np_dtype(dtype))
    return (host, *_affine(cols, dtype, rng))


def _affine(cols, dtype, rng):
    """Fresh weight around 1 and bias around 0, as trained ones are."""
    weight = (1 + 0.5 * rng.standard_normal(cols)).astype(np_dtype(dtype))
    bias = (0.5 * rng.standard_normal(cols)).astype(np_dtype(dtype))
    return weight, bias


def _run(fn, host, weight, bias, dtype, statistics=True):
    """fn(x, w, b, y, mean=, rstd=) on poisoned outputs; returns (y, mean, rstd) on the host."""
    rows, cols = host.shape
    x, w, b = (DeviceArray.from_numpy(a) for a in (host, weight, bias))
    y = DeviceArray((rows, cols), dtype)
    mean, rstd = DeviceArray((rows,), "float32"), DeviceArray((rows,), "float32")
    for a in (y, mean, rstd):
        a.poison()
    fn(x, w, b, y, **(dict(mean=mean, rstd=rstd) if statistics else {}))
    return y.to_numpy(), mean.to_numpy(), rstd.to_numpy()


def _check(host, weight, bias, dtype, y, mean=None, rstd=None, amplification=1.0):
    """y (and mean, rstd) against float64; ``amplification`` widens the tolerances by what
    the variant's formula is known to lose (see _sum_squares_amplification)."""
    ref = reference(host, weight, bias)
    assert not np.isnan(y.astype(np.float64)).any()
    error = max_error(y, ref)
    assert error <= TOLERANCE[dtype] * amplification, error
    if mean is not None:
        assert np.allclose(mean, ref[1], rtol=1e-5, atol=1e-5 * np.abs(host.astype(np.float64)).max())
        assert np.allclose(rstd, ref[2], rtol=2e-5 * amplification)
    return error


def _sum_squares_amplification(host):
    """E[x²] / Var[x], the largest over the rows: E[x²] - E[x]² subtracts two numbers of
    the size of E[x²], so the variance's relative error is that many times the sums'
    rounding (step 3's hazard). Near 1 for these inputs' typical rows, it is large for a
    row whose few values happen to lie close together: the row of two values is such a row
    in several percent of draws (8% in a float32 simulation of the formula), and failed the
    plain tolerance once."""
    wide = host.astype(np.float64)
    variance = wide.var(axis=-1)
    return float(max(1.0, np.max((wide ** 2).mean(axis=-1) / np.maximum(variance, np.finfo(np.float64).tiny))))


@pytest.mark.parametrize("dtype", list(C_TYPES))
def test_the_dispatcher_on_awkward_shapes(gpu, dtype):
    rng = np.random.default_rng()
    shapes = [(1, c) for c in (1, 7, 768, 1000, 4097, 12289, 100000)] + \
        [(4097, c) for c in (1, 8, 33, 40, 64, 200, 256, 320, 504, 576, 1000, 1536)] + [(5, 1024)] + \
        [(17, c) for c in (1025, 1030, 4097, 4100, 24576, 26000, 32768, 32769, 49152, 65536, 65537)] + \
        [(3, c) for c in (36001, 80000, 100001, 140000, 200001, 300007)]  # clusters the row fills in part: equal shares
    for rows, cols in shapes:
        host, weight, bias = _operands(rows, cols, dtype, rng)
        y, mean, rstd = _run(layer_norm, host, weight, bias, dtype)
        _check(host, weight, bias, dtype, y, mean, rstd)


VARIANTS = [LayerNormVariant("warp", d, p, 128, c, g) for d, p in (("float32", 4), ("float16", 8), ("float32", 1))
            for c, g in ((8, 1), (8, 4), (32, 32)) if c >= p]
VARIANTS += [LayerNormVariant("cluster", "float32", 4, 128, 8, cluster_size=k) for k in (1, 2, 4, 8, 16)]
VARIANTS += [LayerNormVariant("cluster", "float32", 4, 128, 32, cluster_size=2)]  # weight and bias two packs a time
VARIANTS += [LayerNormVariant("cluster", d, 8, 1024, 64, cluster_size=k)  # weight and bias one pack ahead
             for d, k in (("float16", 1), ("bfloat16", 8))]
VARIANTS += [LayerNormVariant("cluster", d, p, b, c, weight_kept_in_l1=True)  # WEIGHT_KEPT_IN_L1
             for d, p, b, c in (("float32", 4, 1024, 32), ("bfloat16", 8, 1024, 64), ("float16", 8, 128, 16))]
VARIANTS += [LayerNormVariant("cluster", d, p, b, c, affine_ring=r)  # AFFINE_RING, and rings of other sizes
             for d, p, b, c, r in (("float32", 4, 1024, 32, 4), ("float32", 4, 128, 16, 1), ("float16", 8, 256, 64, 3))]
VARIANTS += [LayerNormVariant("cluster", "bfloat16", 8, 256, 64, cluster_size=2),
             LayerNormVariant("cluster", "float32", 4, 64, 16, cluster_size=4, early_affine=True),
             LayerNormVariant("warp", "float16", 8, 64, 32, 8, early_affine=True),
             LayerNormVariant("warp", "float32", 2, 128, 8, 8, early_affine=True)]  # FLOAT_PAIRS
VARIANTS += [LayerNormVariant("block_fused", d, 2, 256, statistics=s) for d in ("float32", "bfloat16")
             for s in ("welford", "sum_squares")]
VARIANTS += [LayerNormVariant("unfused", "float16", 1, 256), LayerNormVariant("unfused", "float32", 1, 1024)]
VARIANTS += [LayerNormVariant("streamed", "float32", 4, 128, 16, cache_hints=h) for h in (True, False)]
VARIANTS += [LayerNormVariant("streamed", "float32", 4, b, c) for b, c in ((256, 8), (512, 8), (512, 16))]
VARIANTS += [LayerNormVariant("streamed", d, 8, 64, 32) for d in ("float16", "bfloat16")]
VARIANTS += [LayerNormVariant("warp_rows", d, 8, 32, c, rows_per_warp=r) for d in ("float16", "bfloat16")
             for c, r in WARP_ROWS_LAYOUTS]  # writes no statistics


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name_expression)
def test_every_path_against_float64_with_its_statistics(gpu, variant):
    rng = np.random.default_rng()
    cap = variant.max_cols() or 5000
    for rows, cols in ((1, variant.pack_size), (7, cap - variant.pack_size), (33, cap // 2 + variant.pack_size),
                       (3, cap)):
        if not 0 < cols <= cap:
            continue
        host, weight, bias = _operands(rows, cols, variant.dtype, rng)
        one_pass = variant.path == "block_fused" and variant.statistics == "sum_squares"
        amplification = _sum_squares_amplification(host) if one_pass else 1.0
        if variant.path == "warp_rows":
            with pytest.raises(helpers.BookError, match="writes no mean or rstd"):
                _run(variant.launch, host, weight, bias, variant.dtype)
        else:
            y, mean, rstd = _run(variant.launch, host, weight, bias, variant.dtype)
            _check(host, weight, bias, variant.dtype, y, mean, rstd, amplification=amplification)
        y, _, _ = _run(variant.launch, host, weight, bias, variant.dtype, statistics=False)  # null statistics pointers
        _check(host, weight, bias, variant.dtype, y, amplification=amplification)


EDGE_VARIANTS = [LayerNormVariant("cluster", d, p, 64, 2 * p, cluster_size=k, early_affine=e, edges=True)
                 for d, p in (("float32", 4), ("float16", 8), ("bfloat16", 8), ("float32", 2), ("float16", 2))
                 for k, e in ((1, False), (2, False), (1, True))]


@pytest.mark.parametrize("variant", EDGE_VARIANTS, ids=lambda v: v.name_expression)
def test_rows_with_edges_against_float64_at_every_head(gpu, variant):
    """Rows the pack does not divide: 2 * pack + 1 rows, so that every head (0 to pack - 1 values
    before the middle) comes up, at lengths whose middle fills the slice, leaves it short, holds
    one pack or none, and whose tail plus head is less than a pack (the middle then ends a pack
    early: the weight's pack after it must lie inside weight) or more."""
    rng = np.random.default_rng()
    p, cap = variant.pack_size, variant.max_cols()
    for cols in (1, p - 1, p + 1, 2 * p - 1, 3 * p + 2, cap // 2 + 3, cap - 1, cap + 1, cap + p - 1):
        if cols < 1 or cols % p == 0:
            continue
        host, weight, bias = _operands(2 * p + 1, cols, variant.dtype, rng)
        y, mean, rstd = _run(variant.launch, host, weight, bias, variant.dtype)
        _check(host, weight, bias, variant.dtype, y, mean, rstd)
    with pytest.raises(helpers.BookError, match="in its aligned middle"):
        variant.launch(*(DeviceArray(s, variant.dtype) for s in ((2, cap + p), (cap + p,), (cap + p,), (2, cap + p))))


def test_constant_rows_give_the_bias_and_a_finite_rstd(gpu):
    for v in [variant_for(768, "float32", 4), variant_for(4096, "float32", 4), variant_for(65536, "float32", 4),
              LayerNormVariant("block_fused", "float32", 4, 256, statistics="sum_squares"),
              LayerNormVariant("unfused", "float32", 1, 256)]:
        cols = v.max_cols() or 4096
        host = np.full((4, cols), 3.25, np.float32)
        host[1] = -7.0
        weight, bias = _affine(cols, "float32", np.random.default_rng())
        y, mean, rstd = _run(v.launch, host, weight, bias, "float32")
        assert np.isfinite(rstd).all() and np.allclose(rstd, 1 / np.sqrt(1e-5), rtol=1e-5), (v, rstd)
        assert np.array_equal(y, np.broadcast_to(bias, y.shape)), v  # x - mean is exactly 0


def test_the_large_offset_breaks_the_sum_of_squares_and_not_welford(gpu):
    # Inputs 1e4 + N(0, 1) in float32 (their ulp is 2^-10): E[x²] - E[x]² subtracts two
    # numbers near 1e8 whose ulp is 8, so the variance is noise. Welford's states fix the
    # variance and keep the rounding of the float mean, a few ulps of 1e4; the register
    # paths, shifted by the row's first value, lose neither.
    naive = offset_error(LayerNormVariant("block_fused", "float32", 4, 256, statistics="sum_squares"))
    welford = offset_error(LayerNormVariant("block_fused", "float32", 4, 256))
    assert naive > 1.0 and welford < 1e-2 and welford < naive / 1000, (naive, welford)
    for v in [variant_for(1024, "float32", 4), variant_for(4096, "float32", 4),
              LayerNormVariant("cluster", "float32", 4, 1024, 32, cluster_size=2)]:
        error = offset_error(v, cols=min(4096, v.max_cols()))
        assert error < 10 * TOLERANCE["float32"], (v, error)
    error = offset_error(variant_for(4097, "float32", 4), cols=4097)  # EDGES: the edge values take the shift too
    assert error < 10 * TOLERANCE["float32"], error


def _rows_for_the_mean_rounding(rng, cols, dtype, offsets=(1e4,)):
    """4099 rows (the last warp or block holds fewer) of each kind the 16-bit kernels' correction
    of the mean's rounding must get right: N(0, 1) at each large offset (nearly constant once
    rounded to 16 bits), constant rows at 1e4 and at -3.25, and N(1, 3²) rows."""
    shape = (4099, cols)
    kinds = [offset + rng.standard_normal(shape) for offset in offsets]
    kinds += [np.full(shape, 1e4), np.full(shape, -3.25), rng.standard_normal(shape) * 3.0 + 1.0]
    return [kind.astype(np_dtype(dtype)) for kind in kinds]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_warp_rows_takes_back_the_rounding_of_the_mean(gpu, dtype):
    # 16-bit rows at 10^4 + N(0, 1) are nearly constant once rounded (fp16's ulp there is 8),
    # so rstd is large and multiplies any error of the mean: mean0 = sum * (1 / cols) is off
    # by an ulp or so, and without the correction such rows came out 0.13-0.22 of the
    # outputs' scale off (H200, 2026-11-26). Constant rows too (rstd 1/sqrt(eps)), and 4099
    # rows (the last warp holds three, or one). Every layout, at the ends of its lengths. Also
    # through layer_norm() with statistics: the lane groups.
    rng = np.random.default_rng()
    for cols in (168, 184, 192, 248, 344, 504, 568, 760):
        variant = variant_for(cols, dtype, 8)
        assert variant.path == "warp_rows", variant
        for host in _rows_for_the_mean_rounding(rng, cols, dtype):
            weight, bias = _affine(cols, dtype, rng)
            y, _, _ = _run(variant.launch, host, weight, bias, dtype, statistics=False)
            _check(host, weight, bias, dtype, y)
            y, mean, rstd = _run(layer_norm, host, weight, bias, dtype)
            _check(host, weight, bias, dtype, y, mean, rstd)


def test_warp_rows_refuses_rows_of_another_length_than_it_compiled_in(gpu):
    rng = np.random.default_rng()
    host = rng.standard_normal((5, 176)).astype(np.float16)
    weight, bias = _affine(176, "float16", rng)
    fixed = LayerNormVariant("warp_rows", "float16", 8, 32, row_length=168)
    with pytest.raises(helpers.BookError, match="compiled in"):
        _run(fixed.launch, host, weight, bias, "float16", statistics=False)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_lane_groups_take_back_the_rounding_of_the_mean(gpu, dtype):
    # 16-bit lane groups load no shift: the rounding of mean0 = sum * (1 / cols) is computed in
    # one fma and taken off each output (layernorm_warp_per_row). Without it, rows nearly constant
    # once rounded (10^4 + N(0, 1)) come out a tenth or more of the outputs' scale off (warp_rows'
    # test above). Groups of 1 to 32 lanes, lone values (7), a row its packs fill unevenly (1000:
    # 125 packs in 32 lanes), 4099 rows (the last block holds fewer groups), with and without the
    # statistics.
    rng = np.random.default_rng()
    for cols in (7, 64, 256, 512, 1000, 1024):
        variant = variant_for(cols, dtype, widest_pack_for(cols, dtype))
        assert variant.path == "warp", variant
        for host in _rows_for_the_mean_rounding(rng, cols, dtype, offsets=(1e4, -300)):
            weight, bias = _affine(cols, dtype, rng)
            y, mean, rstd = _run(variant.launch, host, weight, bias, dtype)
            _check(host, weight, bias, dtype, y, mean, rstd)
            y, _, _ = _run(variant.launch, host, weight, bias, dtype, statistics=False)
            _check(host, weight, bias, dtype, y)


def test_fp16_near_its_limits_and_tiny_spreads(gpu):
    rng = np.random.default_rng()
    big = (np.float16(60000) * np.sign(rng.standard_normal((8, 1000)))).astype(np.float16)  # x² overflows fp16
    weight, bias = _affine(1000, "float16", rng)
    y, _, _ = _run(layer_norm, big, weight, bias, "float16")
    _check(big, weight, bias, "float16", y)
    tiny = (rng.standard_normal((8, 3000)) * 1e-3).astype(np.float16)  # subnormal squares, rstd near 1/sqrt(eps)
    weight, bias = _affine(3000, "float16", rng)
    y, _, _ = _run(layer_norm, tiny, weight, bias, "float16")
    _check(tiny, weight, bias, "float16", y)


def test_bad_operands_are_refused_before_launching(gpu):
    x, y = DeviceArray((4, 64), "float32"), DeviceArray((4, 64), "float32")
    w, b = DeviceArray((64,), "float32"), DeviceArray((64,), "float32")
    v = LayerNormVariant("warp", "float32", 4, 128, 8, 8)
    with pytest.raises(helpers.BookError, match="one value per column"):
        v.launch(x, DeviceArray((63,), "float32"), DeviceArray((63,), "float32"), y)
    with pytest.raises(helpers.BookError, match="one float per row"):
        v.launch(x, w, b, y, mean=DeviceArray((3,), "float32"))
    with pytest.raises(helpers.BookError, match="float32"):
        v.launch(x, w, b, y, rstd=DeviceArray((4,), "float16"))
    with pytest.raises(helpers.BookError, match="eps must be positive"):
        v.launch(x, w, b, y, eps=0.0)
    with pytest.raises(helpers.BookError, match="not aligned"):
        v.launch(x, DeviceArray((65,), "float32").view(1, 64), b, y)
    with pytest.raises(helpers.BookError, match="at most 64 values"):
        v.launch(DeviceArray((4, 128), "float32"), DeviceArray((128,), "float32"), DeviceArray((128,), "float32"),
                 DeviceArray((4, 128), "float32"))


def test_measurements_check_first_and_count_the_bytes_a_layer_norm_must_move(gpu):
    bench = helpers.Bench("layernorm-test", ["kernels/layernorm.cu"])
    row = measure_dispatcher(bench, 1000, 3000, "float16")
    assert row.bytes == (2 * 1000 + 2) * 3000 * 2 and row.rel_err <= TOLERANCE["float16"]
    assert row.config["path"] == "cluster"


def test_without_pytorch_the_output_is_our_own_buffer(monkeypatch):
    from helpers import operands
    from helpers.bench import Unavailable

    def no_torch():
        raise Unavailable("PyTorch is not installed")
    monkeypatch.setattr(operands, "torch_module", no_torch)
    y = DeviceArray((4, 8), "float16", _ptr=0x1000)  # no memory is touched
    assert operands.outputs_where_torch_puts_them(y)() is y


def test_our_output_is_the_block_pytorch_gives_its_own(gpu):
    """Timed in turns, each call drops its output before the next allocates: ours then lands
    where F.layer_norm's output did, and is right there (checked on a poisoned block)."""
    torch = pytest.importorskip("torch")
    from helpers.layernorm_kernels import OWN_BUFFER, _operands, layer_norm_measurement
    from helpers.operands import outputs_where_torch_puts_them, torch_tensor
    rows, cols = 4099, 192
    variant = variant_for(cols, "float16", 8, rows=rows)
    *_, x, w, b, y = _operands(rows, cols, "float16")
    theirs = torch.nn.functional.layer_norm(torch_tensor(x), (cols,), torch_tensor(w), torch_tensor(b)).data_ptr()
    ours = outputs_where_torch_puts_them(y)()
    assert ours.ptr == theirs != y.ptr and ours.shape == y.shape and ours.dtype == y.dtype
    del ours
    for own in (False, True):
        m = layer_norm_measurement(variant, rows, cols, own_buffer=own)
        run, check = m["setup"]()
        assert check() <= TOLERANCE["float16"]
        assert (m["config"].get("out") == OWN_BUFFER) == own
