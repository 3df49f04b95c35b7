"""Bad launches and bad inputs get clear errors before anything reaches the GPU.

These run without a GPU: the device limits come from a stand-in for an H200."""
import ctypes

import numpy as np
import pytest

import helpers
from helpers import device
from helpers.copy_kernels import CopyVariant
from helpers.errors import InputError, LaunchConfigError


@pytest.fixture
def fake_h200(monkeypatch):
    """Device limits of an H200, without a GPU (only validation is exercised)."""
    fake = device.Gpu(name="stand-in H200", index=0, compute_capability=(9, 0), sm_count=132,
                      l2_bytes=60 << 20, max_threads_per_block=1024, max_block_dims=(1024, 1024, 64),
                      max_grid_dims=(2**31 - 1, 65535, 65535), max_shared_per_block_optin=232448,
                      memory_bytes=141 << 30, driver_version="13.0", context=None, device=None)
    monkeypatch.setattr(device, "_gpu", fake)
    kernel = device.Kernel.__new__(device.Kernel)
    kernel.name, kernel.max_threads_per_block, kernel.registers = "k", 1024, 16
    kernel.static_shared_bytes = 1024
    return kernel


@pytest.mark.parametrize("block, message", [(0, "empty dimension"), (2048, "too large"),
                                            ((32, 33), "too large"), ((1, 1, 65), "block.z")])
def test_block_sizes_the_device_cannot_take(fake_h200, block, message):
    with pytest.raises(LaunchConfigError, match=message):
        fake_h200.validate(1, block)


@pytest.mark.parametrize("grid, message", [(0, "grid.x = 0"), (2**31, "grid.x"), ((1, 70000), "grid.y")])
def test_grids_the_device_cannot_take(fake_h200, grid, message):
    with pytest.raises(LaunchConfigError, match=message):
        fake_h200.validate(grid, 128)


def test_shared_memory_over_the_device_limit(fake_h200):
    fake_h200.validate(1, 128, shared_bytes=200_000)  # over 48 KiB: allowed after opting in
    with pytest.raises(LaunchConfigError, match="232448"):
        fake_h200.validate(1, 128, shared_bytes=232448)  # plus 1 KiB of static shared memory


def test_static_and_dynamic_shared_memory_together_decide_the_opt_in(fake_h200, monkeypatch):
    # Without opting in, a block may have 48 KiB in all: with 1 KiB of static shared memory,
    # 47 KiB of dynamic needs nothing and 48 KiB already needs the attribute raised (the
    # occupancy calculator says 0 blocks otherwise).
    from cuda.bindings import driver
    raised = []
    monkeypatch.setattr(driver, "cuFuncSetAttribute",
                        lambda function, attribute, value: raised.append(value) or (driver.CUresult.CUDA_SUCCESS,))
    fake_h200.function, fake_h200._dynamic_shared_opted_in = None, 0  # as a freshly loaded kernel
    fake_h200._allow_dynamic_shared(47 * 1024)
    assert raised == []
    fake_h200._allow_dynamic_shared(48 * 1024)
    assert raised == [48 * 1024]
    fake_h200._allow_dynamic_shared(40 * 1024)  # already allowed: no second call
    assert raised == [48 * 1024]


def test_a_kernel_limited_by_its_registers(fake_h200):
    fake_h200.max_threads_per_block, fake_h200.registers = 512, 128
    with pytest.raises(LaunchConfigError, match="at most 512.*128 registers"):
        fake_h200.validate(1, 1024)


def test_launch_shapes_must_be_ints(fake_h200):
    with pytest.raises(LaunchConfigError, match="tuple of 1 to 3 ints"):
        fake_h200.validate(1.5, 128)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(kernel="packed", block_size=33), LaunchConfigError, "multiple of 32.*try 32"),
    (dict(kernel="packed", block_size=0), LaunchConfigError, "1..1024"),
    (dict(kernel="packed", block_size=2048), LaunchConfigError, "1..1024"),
    (dict(kernel="packed", pack_size=8), InputError, "at most 16 bytes.*4 float32"),
    (dict(kernel="packed", pack_size=3), InputError, "power of two"),
    (dict(kernel="packed", dtype="int8"), InputError, "dtype must be one of"),
    (dict(kernel="memcpy"), InputError, "kernel must be one of"),
    (dict(kernel="grid_stride", unroll=4), InputError, "unroll"),
])
def test_copy_variants_refuse_what_their_kernel_cannot_take(kwargs, error, message):
    with pytest.raises(error, match=message):
        CopyVariant(**kwargs)


def test_scalar_kernels_take_any_block_size():
    assert CopyVariant("one_per_thread", block_size=33).config == {"block_size": 33}


def test_kernel_arguments_are_typed():
    assert isinstance(device._kernel_argument(3), ctypes.c_longlong)
    assert isinstance(device._kernel_argument(1.5), ctypes.c_float)
    assert isinstance(device._kernel_argument(np.int32(3)), ctypes.c_int)
    with pytest.raises(InputError, match="cannot pass str"):
        device._kernel_argument("x")


def test_without_a_gpu_every_entry_point_says_replay(monkeypatch):
    monkeypatch.setenv("BOOK_REPLAY", "1")
    monkeypatch.setattr(device, "_gpu", None)
    monkeypatch.setattr(device, "_no_gpu_reason", None)
    assert not helpers.gpu_available()
    assert "BOOK_REPLAY=1" in helpers.no_gpu_reason()
    with pytest.raises(helpers.NoGpuError):
        helpers.DeviceArray((4,), "float32")
    assert helpers.default_arch() == "sm_90"


def test_a_lost_context_is_reported_in_one_line(monkeypatch):
    monkeypatch.setattr(device, "_context_lost", "launching k failed: CUDA_ERROR_ILLEGAL_ADDRESS. Restart")
    with pytest.raises(helpers.KernelFaultError, match="Restart"):
        helpers.gpu()


def test_turns_rotate_so_that_every_run_takes_every_place():
    """time_interleaved's rounds: round r starts with run r mod len(runs), and each run's
    events stay its own whatever its place (a place in the round has its own offset)."""
    from cuda.bindings import driver

    from helpers import timing
    recorded, order = [], []

    class Driver:
        def cuEventRecord(self, event, stream):
            recorded.append(event)
            return (driver.CUresult.CUDA_SUCCESS,)
    runs = [lambda k=k: order.append(k) for k in range(3)]
    for first in range(3):
        timing._queue_round(Driver(), None, runs, [f"start {k}" if e == 0 else f"end {k}" for k in range(3)
                                                   for e in range(2)], flush=False, first=first)
    assert order == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    assert recorded[6:12] == ["start 1", "end 1", "start 2", "end 2", "start 0", "end 0"]


class _FakeBatchDriver:
    """The driver calls of timing._timed_batch, with the hold's end event reported as passed
    (the host was too slow) for the first ``late`` queries."""

    def __init__(self, late):
        from cuda.bindings import driver
        self.CUresult, self.late, self.queued = driver.CUresult, late, []

    def cuEventRecord(self, event, stream):
        self.queued.append(event)
        return (self.CUresult.CUDA_SUCCESS,)

    def cuEventQuery(self, event):
        self.late -= 1
        return (self.CUresult.CUDA_SUCCESS if self.late >= 0 else self.CUresult.CUDA_ERROR_NOT_READY,)

    def cuStreamSynchronize(self, stream):
        return (self.CUresult.CUDA_SUCCESS,)

    def cuEventDestroy(self, event):
        return (self.CUresult.CUDA_SUCCESS,)


def _batch_with(monkeypatch, late):
    from helpers import timing
    holds = []
    monkeypatch.setattr(timing, "hold_gpu", holds.append)
    monkeypatch.setattr(timing, "_events", lambda count: [object() for _ in range(count)])
    monkeypatch.setattr(timing, "_elapsed_ms", lambda start, end: 1.0)
    times = timing._timed_batch(_FakeBatchDriver(late), None, [lambda: None] * 2, range(16), False, host_ms=0.5)
    return holds, times


def test_a_batch_the_host_queued_too_slowly_is_queued_again_behind_a_longer_hold(monkeypatch):
    holds, times = _batch_with(monkeypatch, late=2)
    assert holds == [16.2, 32.4, 64.8] and times.shape == (2, 16)


def test_a_batch_that_never_fits_its_hold_is_timed_with_a_warning(monkeypatch):
    from helpers import timing
    with pytest.warns(RuntimeWarning, match="within a hold of 130 ms"):
        holds, times = _batch_with(monkeypatch, late=4)
    assert holds == [16.2, 32.4, 64.8, 129.6] and times.shape == (2, 16)
    monkeypatch.setattr(timing, "MOST_HOLD_MS", 40.0)
    with pytest.warns(RuntimeWarning, match="within a hold of 40 ms"):
        holds, _ = _batch_with(monkeypatch, late=4)
    assert holds == [16.2, 32.4, 40.0, 40.0]
