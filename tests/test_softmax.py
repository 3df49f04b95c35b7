"""Softmax (head start of chapter 4): machine code without a GPU; every path against
float64 with invariants on the GPU."""
import numpy as np
import pytest

import helpers
from helpers.device import DeviceArray
from helpers.operands import np_dtype
from helpers.softmax_kernels import C_TYPES, TOLERANCE, SoftmaxVariant, reference, softmax, variant_for


def test_every_path_moves_rows_in_16_byte_packs_without_local_memory():
    variants = [SoftmaxVariant("warp", "float32", 4, 128, 32, 32, 1), SoftmaxVariant("warp", "float16", 8, 128, 8, 4, 2),
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
                                              (dict(block_size=100), "multiple of 32")])
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
    for rows, cols in [(1, c) for c in COLS] + [(4097, c) for c in (1, 33, 1000, 3000)]:
        host = (rng.standard_normal((rows, cols)) * 3).astype(np_dtype(dtype))
        x, y = DeviceArray.from_numpy(host), DeviceArray((rows, cols), dtype)
        y.poison()
        variant = softmax(x, y)
        _check(host, y, dtype)
        if cols <= 1024:
            assert variant.path == "warp", (cols, variant)


@pytest.mark.parametrize("path", ["block_cached", "block_uncached"])
def test_block_paths_take_any_length(gpu, path):
    rng = np.random.default_rng()
    for cols in (4, 1028, 4100, 65536):
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


def test_the_dispatcher_prefers_registers_for_short_rows_and_shared_memory_for_long():
    assert variant_for(4096, 128, "float32", 4).path == "warp"
    assert variant_for(4096, 32, "float32", 4).rows_per_group == 2
