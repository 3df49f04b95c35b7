"""Reductions: the machine code of each step (no GPU), and exact / bounded sums (GPU)."""
import numpy as np
import pytest

import helpers
from helpers.device import DeviceArray
from helpers.reduce_kernels import (LADDER, ROW_KERNELS, ROW_OPS, RowVariant, SumVariant, random_signs,
                                    row_reduce, row_reference)


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


def test_a_warp_per_row_needs_no_barrier():
    assert not any(op.startswith("BAR") for op in ops(RowVariant("max", "warp", 256)))
    assert ops(RowVariant("sum", "block", 256))["LDG.E.128.CONSTANT"] >= 1


def test_no_reduction_uses_local_memory():
    variants = [SumVariant(step, b) for step in LADDER for b in (64, 256, 1024)]
    variants += [RowVariant(op, k, b) for op in ROW_OPS for k in ROW_KERNELS for b in (32, 256, 1024)]
    for variant in variants:
        assert not variant.compiled(arch="sm_90").resources(variant.name_expression).uses_local_memory, variant


@pytest.mark.parametrize("kwargs, message", [(dict(step="tree"), "step must be one of"),
                                              (dict(block_size=96), "power of two from 64"),
                                              (dict(block_size=32), "power of two from 64")])
def test_sum_variants_refuse_what_they_cannot_take(kwargs, message):
    with pytest.raises(helpers.BookError, match=message):
        SumVariant(**kwargs)


def test_row_variants_refuse_what_they_cannot_take():
    with pytest.raises(helpers.BookError, match="op must be one of"):
        RowVariant("mean")
    with pytest.raises(helpers.BookError, match="multiple of 32"):
        RowVariant("sum", "block", 100)


# ---------------------------------------------------------------- on the GPU

SIZES = [1, 31, 1023, (1 << 20) + 7, (1 << 24) + 7]


@pytest.mark.parametrize("variant", [SumVariant(step, b) for step in LADDER for b in (64, 256, 1024)],
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


@pytest.mark.parametrize("variant", [RowVariant(op, k, b) for op in ROW_OPS for k in ROW_KERNELS for b in (32, 256, 1024)],
                         ids=lambda v: v.name_expression)
def test_row_reductions_on_awkward_shapes(gpu, variant):
    rng = np.random.default_rng()
    for shape in ((1, 1), (1, 33), (7, 1000), (4097, 33), (3, 4097), (2, 100003)):
        host = rng.standard_normal(shape, dtype=np.float32) - (5.0 if variant.op == "max" else 0.0)  # max: all negative
        x, y = DeviceArray.from_numpy(host), DeviceArray((shape[0],), np.float32)
        y.poison()
        variant.launch(x, y)
        out, ref = y.to_numpy().astype(np.float64), row_reference(host, variant.op)
        if variant.op == "max":
            assert np.array_equal(out, ref), shape  # max is exact in any order
        else:
            bound = (shape[1] + 2 * np.log2(max(shape[1], 2)) + 4) * 2.0 ** -24 * np.abs(host).astype(np.float64).sum(-1)
            assert (np.abs(out - ref) <= bound).all(), shape


def test_the_row_dispatcher_picks_warps_for_short_rows(gpu):
    x, y = DeviceArray((64, 100), np.float32), DeviceArray((64,), np.float32)
    x.copy_from(np.ones((64, 100), np.float32))
    assert row_reduce(x, y).kernel == "warp" and (y.to_numpy() == 100).all()
    x, y = DeviceArray((4, 5000), np.float32), DeviceArray((4,), np.float32)
    x.copy_from(np.ones((4, 5000), np.float32))
    assert row_reduce(x, y, "max").kernel == "block" and (y.to_numpy() == 1).all()
