"""The copy kernels on a GPU: exact results on irregular sizes, and clear errors.
Every test here takes the ``gpu`` fixture and is skipped without a GPU."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import helpers
from helpers.copy_kernels import CopyVariant, check_copy, ladder
from helpers.device import DeviceArray

SIZES = [1, 7, 31, 1023, (1 << 20) + 3]
VARIANTS = (ladder("float32") + ladder("float16")
            + [CopyVariant("packed", "float32", 4, 128, 4), CopyVariant("packed", "float16", 8, 1024, 8),
               CopyVariant("packed", "float16", 2, 64, 2), CopyVariant("one_per_thread", block_size=33)])


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name_expression)
def test_every_copy_is_exact_on_irregular_sizes(gpu, variant):
    for n in SIZES:
        src, dst = DeviceArray((n,), variant.dtype), DeviceArray((n,), variant.dtype)
        assert check_copy(variant, src, dst) == 0.0  # fresh random input, poisoned output


@pytest.mark.parametrize("variant", [v for v in VARIANTS if not v.packed], ids=lambda v: v.name_expression)
def test_scalar_copies_take_misaligned_views(gpu, variant):
    n = 1000
    src, dst = DeviceArray((n + 1,), variant.dtype), DeviceArray((n + 1,), variant.dtype)
    assert check_copy(variant, src.view(1, n), dst.view(1, n)) == 0.0


def test_a_large_copy_is_exact(gpu):
    variant = CopyVariant("packed", "float32", 4, 256)
    n = (1 << 26) + 5
    assert check_copy(variant, DeviceArray((n,), "float32"), DeviceArray((n,), "float32")) == 0.0


def test_an_empty_copy_launches_nothing(gpu):
    empty = DeviceArray((0,), "float32")
    CopyVariant("packed", pack_size=4).launch(empty, DeviceArray((0,), "float32"))
    assert empty.to_numpy().shape == (0,)


def test_misaligned_and_mismatched_inputs_are_refused_and_the_gpu_stays_usable(gpu):
    variant = CopyVariant("packed", "float32", 4, 256)
    buffer = DeviceArray((1025,), "float32")
    with pytest.raises(helpers.InputError, match="not aligned to 16 bytes.*pack_size=1"):
        variant.launch(buffer.view(1, 1024), buffer.view(0, 1024))
    with pytest.raises(helpers.InputError, match="compiled for float32; src is float16"):
        variant.launch(DeviceArray((8,), "float16"), DeviceArray((8,), "float32"))
    with pytest.raises(helpers.InputError, match="src has 8 elements, dst has 4"):
        variant.launch(DeviceArray((8,), "float32"), DeviceArray((4,), "float32"))
    assert check_copy(variant, DeviceArray((100,), "float32"), DeviceArray((100,), "float32")) == 0.0


def test_launch_limits_are_checked_on_the_real_device(gpu):
    variant = CopyVariant("one_per_thread")
    kernel = variant.compiled().kernel(variant.name_expression)
    a = DeviceArray((4,), "float32")
    with pytest.raises(helpers.LaunchConfigError, match="too large"):
        kernel(1, 2048, a, a, 4)
    with pytest.raises(helpers.LaunchConfigError, match="shared memory"):
        kernel(1, 32, a, a, 4, shared_bytes=gpu.max_shared_per_block_optin + 1)
    kernel(1, 32, a, a, 4, shared_bytes=64 * 1024)  # above 48 KiB: opted in through the attribute
    helpers.synchronize()


def test_out_of_memory_is_a_clear_error_and_the_gpu_stays_usable(gpu):
    with pytest.raises(helpers.DeviceOutOfMemoryError, match="GiB are free"):
        DeviceArray((1 << 50,), "uint8")
    assert DeviceArray.from_numpy(np.arange(5, dtype=np.float32)).to_numpy().tolist() == [0, 1, 2, 3, 4]


def test_timing_is_consistent(gpu):
    variant = CopyVariant("packed", "float32", 4, 256)
    src, dst = DeviceArray((1 << 26,), "float32"), DeviceArray((1 << 26,), "float32")
    timing = helpers.time_gpu(lambda: variant.launch(src, dst))
    assert timing.reps >= 10 and timing.ms_min <= timing.ms_q1 <= timing.ms <= timing.ms_q3 <= timing.ms_max
    assert 500 < timing.gbs(2 * src.nbytes) < 10_000  # GB/s: an H100/H200-class GPU


def test_a_faulting_kernel_explains_that_the_context_is_lost(gpu, tmp_path):
    script = textwrap.dedent("""
        import helpers
        from helpers.copy_kernels import CopyVariant
        from helpers.device import DeviceArray
        variant = CopyVariant("one_per_thread")
        kernel = variant.compiled().kernel(variant.name_expression)
        src = DeviceArray((16,), "float32")
        nowhere = DeviceArray((1 << 20,), "float32", _ptr=0x10)  # memory nobody owns
        try:
            kernel(4096, 256, src, nowhere, 1 << 20)
            helpers.synchronize()
        except helpers.KernelFaultError as e:
            print("FAULT:", e)
        try:
            src.to_numpy()
        except helpers.KernelFaultError as e:
            print("LATER:", str(e).splitlines()[0])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "FAULT:" in done.stdout and "CUDA_ERROR_ILLEGAL_ADDRESS" in done.stdout, done.stdout + done.stderr
    assert "context of this process is lost" in done.stdout and "Restart the Python kernel" in done.stdout
    assert "LATER:" in done.stdout  # later calls repeat the one-line explanation


def test_kernels_timed_in_turns_keep_their_own_times(gpu):
    """time_interleaved: one Timing per run, in order, with the same number of repetitions;
    a copy 16 times larger takes several times longer, and a tiny one stays tiny."""
    variant = CopyVariant("packed", "float32", 4, 256)
    small = DeviceArray((1 << 22,), "float32"), DeviceArray((1 << 22,), "float32")
    large = DeviceArray((1 << 26,), "float32"), DeviceArray((1 << 26,), "float32")
    tiny = DeviceArray((1024,), "float32"), DeviceArray((1024,), "float32")
    timings = helpers.time_interleaved([lambda: variant.launch(*small), lambda: variant.launch(*large),
                                        lambda: variant.launch(*tiny)])
    assert len(timings) == 3 and len({t.reps for t in timings}) == 1 and timings[0].reps >= 10
    assert timings[0].reps % 3 == 0  # whole rotations: each run in each place equally often
    assert timings[1].ms > 4 * timings[0].ms and timings[2].ms < 0.015, timings
    alone = helpers.time_gpu(lambda: variant.launch(*large))
    assert abs(alone.ms - timings[1].ms) < 0.1 * alone.ms, (alone, timings[1])


def test_turns_wait_for_the_run_their_last_rotation_puts_last(gpu):
    """The last round starts with the tiny copy, so the long run is queued last: its times
    must be read after it finished, not after the copy's."""
    variant = CopyVariant("packed", "float32", 4, 256)
    tiny = DeviceArray((1024,), "float32"), DeviceArray((1024,), "float32")
    long, copy = helpers.time_interleaved([lambda: helpers.timing.hold_gpu(20.0), lambda: variant.launch(*tiny)],
                                          reps=2, warmup=1, flush=False)
    assert long.ms > 15 and copy.ms < 0.015, (long, copy)


def test_host_overhead_is_not_inside_the_timed_region(gpu):
    """A 4 KiB copy runs in a few microseconds; Python's launch overhead must not show up."""
    variant = CopyVariant("packed", "float32", 4, 256)
    src, dst = DeviceArray((1024,), "float32"), DeviceArray((1024,), "float32")
    for flush in (True, False):
        timing = helpers.time_gpu(lambda: variant.launch(src, dst), flush=flush)
        assert timing.ms < 0.015, timing
