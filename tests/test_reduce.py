"""Reductions: the machine code of each step (no GPU), and exact / bounded sums (GPU)."""
import numpy as np
import pytest

import helpers
from helpers.arith import ceil_div
from helpers.device import DeviceArray
from helpers.reduce_kernels import (CLUSTER_SIZES, FOLDS, LADDER, ROW_KERNELS, ROW_OPS, RowVariant, SumVariant,
                                    random_signs, row_reduce, row_reference, row_variant_for, array_sum,
                                    bank_conflict_cycles, covering_cluster, lone_value_shape, sum_variant_for)


def ops(variant):
    return helpers.opcodes(variant.compiled(arch="sm_90").sass(variant.name_expression))


def test_unrolling_removes_barriers_and_shuffles_remove_shared_memory():
    barriers = {step: ops(SumVariant(step, 256)).get("BAR.SYNC.DEFER_BLOCKING", 0) for step in LADDER}
    assert barriers["sequential"] == 9  # one per level of a 256-thread tree, and one after the load
    assert barriers["complete_unroll"] < barriers["sequential"]  # the last warp needs no block barrier
    shuffle = ops(SumVariant("shuffle", 256))
    assert shuffle["SHFL.BFLY"] >= 10 and shuffle.get("LDS", 0) <= 1
    assert "SHFL.BFLY" not in ops(SumVariant("complete_unroll", 256))


def test_the_single_pass_uses_16_byte_loads_and_one_atomic():
    single = ops(SumVariant("single_pass", 256))
    assert single["LDG.E.128"] >= 1 and sum(n for op, n in single.items() if op.startswith("ATOMG")) == 1
    assert any(op.startswith("MEMBAR") for op in single)  # the fence before the count
    assert "LDG.E.EF.128" not in single and ops(SumVariant("single_pass", 256, evict_first=True))["LDG.E.EF.128"] >= 1


def test_fold_unrolls_the_walk_into_that_many_16_byte_loads():
    """Each iteration of the walk loads fold packs. (ptxas then schedules them as it
    likes; for fold 1 it unrolls the loop by itself: the chapter shows both.)"""
    for fold in FOLDS:
        variant = RowVariant("sum", "block", 256, fold)
        assert ops(variant)["LDG.E.128.CONSTANT"] >= fold, fold


def test_a_warp_per_row_needs_no_barrier_and_a_narrow_group_fewer_shuffles():
    assert not any(op.startswith("BAR") for op in ops(RowVariant("max", "warp", 256)))
    assert ops(RowVariant("max", "warp", 256, 4, 32))["SHFL.BFLY"] == 5
    assert ops(RowVariant("max", "warp", 256, 4, 8))["SHFL.BFLY"] == 3
    assert ops(RowVariant("sum", "block", 256))["LDG.E.128.CONSTANT"] >= 1


def test_no_reduction_uses_local_memory():
    variants = [SumVariant(step, b) for step in LADDER for b in (64, 256, 1024)]
    variants += [RowVariant(op, k, b, f) for op in ROW_OPS for k in ROW_KERNELS for b in (32, 256, 1024) for f in FOLDS]
    variants += [RowVariant("sum", "warp", 256, f, g) for f in FOLDS for g in (1, 2, 4, 8, 16)]
    for variant in variants:
        assert not variant.compiled(arch="sm_90").resources(variant.name_expression).uses_local_memory, variant


@pytest.mark.parametrize("kwargs, message", [(dict(step="tree"), "step must be one of"),
                                              (dict(block_size=96), "power of two from 64"),
                                              (dict(block_size=32), "power of two from 64"),
                                              (dict(fold=3), "fold .* must be one of"),
                                              (dict(step="shuffle", fold=2), "single pass only"),
                                              (dict(step="shuffle", evict_first=True), "single pass only")])
def test_sum_variants_refuse_what_they_cannot_take(kwargs, message):
    with pytest.raises(helpers.BookError, match=message):
        SumVariant(**kwargs)


def test_row_variants_refuse_what_they_cannot_take():
    with pytest.raises(helpers.BookError, match="op must be one of"):
        RowVariant("mean")
    with pytest.raises(helpers.BookError, match="multiple of 32"):
        RowVariant("sum", "block", 100)
    with pytest.raises(helpers.BookError, match="group_width"):
        RowVariant("sum", "warp", 256, 4, 3)
    with pytest.raises(helpers.BookError, match="group_width"):
        RowVariant("sum", "block", 256, 4, 16)


def test_the_dispatcher_gives_short_rows_narrow_groups_and_long_rows_blocks():
    assert [(v.kernel, v.group_width) for v in map(row_variant_for, (1, 33, 256, 1000, 4097))] == [
        ("warp", 1), ("warp", 8), ("warp", 32), ("warp", 32), ("block", 32)]
    for cols in range(1, 1025):  # no lane ever has more than 8 packs to fold per row
        variant = row_variant_for(cols)
        assert ceil_div(cols, 4) <= variant.group_width * 8


def test_rows_of_lone_values_get_the_smallest_shape_that_holds_them():
    """The shared rule for rows of odd length (softmax and LayerNorm): every value held, no
    thread holding more than 32, the smallest block, then the smallest cluster, and no thread
    of it idle but the row's last few."""
    blocks = (128, 256, 512, 1024)
    assert lone_value_shape(4097, blocks, clusters=True) == (256, 17, 1)
    assert lone_value_shape(32769, blocks, clusters=True) == (256, 17, 8)
    assert lone_value_shape(65537, blocks, clusters=True) == (512, 17, 8)
    assert lone_value_shape(32769, blocks, clusters=False) is None
    assert lone_value_shape(131073, blocks, clusters=True) is None
    for cols in range(1, 131073, 7):
        shape = lone_value_shape(cols, blocks, clusters=True)
        block, per_thread, cluster = shape
        slots = block * cluster
        assert per_thread <= 32 and slots * per_thread >= cols > slots * (per_thread - 1), (cols, shape)
        if cluster == 1:
            assert block == blocks[0] or cols > block // 2 * 32, (cols, shape)
    with pytest.raises(helpers.BookError, match="at least one value"):
        lone_value_shape(0, blocks, clusters=True)


def test_the_panels_cluster_is_the_fewest_blocks_a_power_of_two_that_hold_the_row():
    """covering_cluster, the cluster shape chapters 4 and 5 let the reader pick a block size
    for: enough blocks to hold every value, a power of two, and no half of them idle."""
    assert covering_cluster(1, 256, 16) == 1
    assert covering_cluster(4096, 256, 16) == 1
    assert covering_cluster(4097, 256, 16) == 2
    assert covering_cluster(65536, 256, 32) == 8
    for cols in range(1, 1 << 17, 97):
        for block, per_thread in ((128, 16), (256, 32), (1024, 64)):
            held = block * per_thread
            if cols > 16 * held:
                with pytest.raises(helpers.LaunchConfigError, match="more than 16 blocks"):
                    covering_cluster(cols, block, per_thread)
                continue
            cluster = covering_cluster(cols, block, per_thread)
            assert cluster in CLUSTER_SIZES and cluster * held >= cols, (cols, block, cluster)
            assert cluster == 1 or cluster // 2 * held < cols, (cols, block, cluster)


# ---------------------------------------------------------------- on the GPU

SIZES = [1, 31, 1023, (1 << 20) + 7, (1 << 24) + 7]


@pytest.mark.parametrize("variant", [SumVariant(step, b) for step in LADDER for b in (64, 256, 1024)] +
                         [SumVariant("single_pass", 512, f, e) for f in FOLDS for e in (False, True)],
                         ids=lambda v: v.name_expression)
def test_every_sum_is_exact_on_integers_and_within_its_bound_on_normals(gpu, variant):
    rng = np.random.default_rng()
    for n in SIZES:
        signs = random_signs(n)
        assert variant.sum(DeviceArray.from_numpy(signs)) == signs.astype(np.int64).sum(), n  # exact
        normal = rng.standard_normal(n, dtype=np.float32)
        exact = normal.astype(np.float64).sum()
        bound = variant.error_bound(n, np.abs(normal.astype(np.float64)).sum())
        assert abs(variant.sum(DeviceArray.from_numpy(normal)) - exact) <= bound, n


def test_sums_of_2_to_the_28_and_misaligned_views(gpu):
    n = 1 << 28
    signs = random_signs(n + 3)
    x = DeviceArray.from_numpy(signs)
    for variant in (SumVariant("single_pass", 256), SumVariant("shuffle", 512), SumVariant("complete_unroll", 256)):
        assert variant.sum(x.view(0, n)) == signs[:n].astype(np.int64).sum()
    for offset in (1, 2, 3):  # the single pass peels the elements before the first 16-byte boundary
        view = x.view(offset, (1 << 20) + 5)
        assert SumVariant("single_pass").sum(view) == signs[offset:offset + view.size].astype(np.int64).sum()


def test_the_single_pass_can_run_again_and_sums_an_empty_array_to_zero(gpu):
    variant = SumVariant("single_pass", 256)
    signs = random_signs(1 << 22)
    x = DeviceArray.from_numpy(signs)
    assert [variant.sum(x) for _ in range(3)] == [signs.astype(np.int64).sum()] * 3  # the counter resets
    assert variant.sum(DeviceArray((0,), np.float32)) == 0.0


@pytest.mark.parametrize("variant", [RowVariant(op, k, b, f) for op in ROW_OPS for k in ROW_KERNELS
                                     for b in (32, 256, 1024) for f in (1, 8)] +
                         [RowVariant(op, "warp", 128, 4, g) for op in ROW_OPS for g in (1, 4, 16)],
                         ids=lambda v: v.name_expression)
def test_row_reductions_on_awkward_shapes(gpu, variant):
    rng = np.random.default_rng()
    for shape in ((1, 1), (1, 33), (7, 1000), (4097, 33), (3, 4097), (2, 100003)):
        host = rng.standard_normal(shape, dtype=np.float32)
        if variant.op == "max":
            host = -np.abs(host) - np.float32(1e-3)  # all negative: a max that starts from 0 would be wrong
        x, y = DeviceArray.from_numpy(host), DeviceArray((shape[0],), np.float32)
        y.poison()
        variant.launch(x, y)
        out, ref = y.to_numpy().astype(np.float64), row_reference(host, variant.op)
        if variant.op == "max":
            assert np.array_equal(out, ref), shape  # max is exact in any order
        else:
            magnitude = np.abs(host).astype(np.float64).sum(-1)
            bound = (shape[1] + 2 * np.log2(max(shape[1], 2)) + 4) * 2.0 ** -24 * magnitude
            assert (np.abs(out - ref) <= bound).all(), shape


def test_the_row_dispatcher_on_every_short_row_length(gpu):
    """Every length from 1 to 1100 through the dispatcher (narrow groups, warps, blocks),
    on 37 rows (not a multiple of any group count per block), exact on +-1."""
    for cols in list(range(1, 70)) + [127, 128, 129, 255, 256, 257, 511, 1000, 1023, 1024, 1025, 1100]:
        host = random_signs(37 * cols).reshape(37, cols)
        x, y = DeviceArray.from_numpy(host), DeviceArray((37,), np.float32)
        for op in ROW_OPS:
            y.poison()
            row_reduce(x, y, op)
            assert np.array_equal(y.to_numpy(), row_reference(host, op)), (cols, op)


def test_bank_conflicts_cost_what_the_banks_predict(gpu):
    cycles = bank_conflict_cycles()
    # 32 lanes in one bank: the access is replayed; on an H200 a dependent access costs
    # about 33 cycles without a conflict and 157 with a 32-way one (chapter 3)
    assert cycles[32] > 3 * cycles[1]
    assert cycles[1] <= cycles[2] <= cycles[4] <= cycles[8] <= cycles[16] <= cycles[32]


def test_the_library_sum_takes_any_size_and_alignment(gpu):
    signs = random_signs((1 << 20) + 9)
    x = DeviceArray.from_numpy(signs)
    for offset, n in ((0, 1), (1, 5), (3, 1000), (2, (1 << 20) + 7)):
        assert array_sum(x.view(offset, n)) == signs[offset:offset + n].astype(np.int64).sum(), (offset, n)
    assert sum_variant_for(1 << 20).evict_first and not sum_variant_for(1 << 30).evict_first


def test_the_replayed_library_choice_uses_the_recorded_gpus_l2():
    import json
    from helpers.paths import ROOT
    from helpers.reduce_kernels import RECORDED_L2_BYTES
    recording = json.loads((ROOT / "book" / "data" / "reduce.json").read_text())
    assert RECORDED_L2_BYTES == recording["environment"]["l2_mib"] << 20


def test_the_library_sum_loads_evict_first_up_to_where_the_hint_stopped_paying(monkeypatch):
    # Measured on the H200 (60 MiB of L2): the hint pays up to 192 MiB of floats and costs from 256 MiB.
    import helpers.reduce_kernels as reduce_kernels
    monkeypatch.setattr(reduce_kernels.device, "no_gpu_reason", lambda: "a test of the recorded GPU's rule")
    chosen = {mib: sum_variant_for((mib << 20) // 4).evict_first for mib in (1, 64, 128, 192, 256, 512, 1024)}
    assert chosen == {1: True, 64: True, 128: True, 192: True, 256: False, 512: False, 1024: False}


def test_host_references_are_shared_by_reshaped_views_not_by_offset_views():
    from helpers.operands import HostReferences
    references, computed = HostReferences(), []
    values = np.arange(12.0)
    total = lambda h: computed.append(h.shape) or h.sum(-1)  # noqa: E731
    assert references.get(values[0:6], "sum", total) == 15 and references.get(values[1:7], "sum", total) == 21
    first = references.get(values.reshape(3, 4), "sum", total)
    assert np.array_equal(references.get(values.reshape(3, 4), "sum", total), first)
    assert computed == [(6,), (6,), (3, 4)]  # the second reshape was a lookup


def test_float64_checks_by_blocks_of_rows_give_the_values_of_one_call_nan_included(monkeypatch):
    import helpers.operands as operands
    from helpers.layernorm_kernels import max_error as layernorm_error, reference as layernorm_reference
    from helpers.softmax_kernels import max_error, reference
    monkeypatch.setattr(operands.os, "cpu_count", lambda: 8)  # blocks on any machine, even a one-core one
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4099, 257)).astype(np.float32)  # just over 2^20 values: a few blocks per core
    assert len(operands._row_blocks(len(x), x.size)) == 32
    ref = operands.by_rows(reference, x)
    assert np.array_equal(ref, reference(x))
    weight, bias = rng.standard_normal(257).astype(np.float32), rng.standard_normal(257).astype(np.float32)
    joined = operands.by_rows(lambda rows: layernorm_reference(rows, weight, bias), x)
    whole = layernorm_reference(x, weight, bias)
    assert len(joined) == 4 and all(np.array_equal(a, b) for a, b in zip(joined, whole))
    assert operands.max_by_rows(lambda o, *r: layernorm_error(o, r), whole[0], *joined) < 1e-15
    out = ref.astype(np.float32)
    out[4000, 3] += 0.25  # in the last block
    assert operands.max_by_rows(lambda o, r: max_error(o, r), out, ref) == max_error(out, ref) > 0.2
    out[2000, 0] = np.nan  # in a middle block: the largest error is NaN, not the largest of the other blocks
    assert np.isnan(operands.max_by_rows(lambda o, r: max_error(o, r), out, ref))
