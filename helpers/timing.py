"""Time GPU work honestly: CUDA events, warm-up, L2 flushed, median and spread.

Introduced in chapter 1, which shows why each of these matters. A single host
timer around a launch measures the launch call, not the kernel; the first runs
pay for module loading and clock ramp-up; and an input that fits in the 60 MiB
L2 of an H200 is served from cache on the second repetition, inflating the
bandwidth. So: events on the GPU's own timeline, a few warm-up runs, a write
over a buffer twice the L2's size before every repetition, and the median of
many repetitions with the spread beside it. The repetitions are queued in
batches, each behind a tiny kernel that holds the GPU while the host queues the
batch, so no host-side gap (Python issuing the next launch) is inside a timed
region; a batch whose hold ended before the host had queued it is queued again.
On the H200 the events count time in units of 32 ns, so a median is a multiple of
16 ns (halfway between two repetitions when their number is even): at 5 us one
step is 0.3-0.6% (every median recorded for chapters 2 and 5 on 2026-11-27 is).
"""
from __future__ import annotations

import ctypes
import time
import warnings
from dataclasses import dataclass

import numpy as np

from .arith import ceil_div
from .device import DeviceArray, _driver, check, gpu


@dataclass(frozen=True)
class Timing:
    ms: float  # median
    ms_q1: float  # 25th percentile
    ms_q3: float  # 75th percentile
    ms_min: float
    ms_max: float
    reps: int
    l2_flushed: bool

    def gbs(self, nbytes: int) -> float:
        """Achieved bandwidth in GB/s (10^9 bytes per second) for nbytes moved."""
        return nbytes / (self.ms * 1e-3) / 1e9


_flush_buffer = None


def flush_l2():
    """Overwrite a buffer twice the size of L2, evicting whatever a kernel left there."""
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = DeviceArray((2 * gpu().l2_bytes // 4,), np.uint32)
    cu = _driver()
    check(cu.cuMemsetD32Async(_flush_buffer.ptr, 0, _flush_buffer.size, cu.CUstream(0)),
          "flushing L2 (cuMemsetD32Async)")


def hold_gpu(milliseconds: float):
    """Queue a kernel that keeps the GPU busy for ``milliseconds`` (kernels/timing.cu)."""
    from .compiler import loaded_kernel
    loaded_kernel("timing.cu", "hold_gpu")(1, 1, ctypes.c_ulonglong(int(milliseconds * 1e6)))


def _events(count):
    cu = _driver()
    return [check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
            for _ in range(count)]


def _elapsed_ms(start, end) -> float:
    cu = _driver()
    elapsed = getattr(cu, "cuEventElapsedTime_v2", None) or cu.cuEventElapsedTime
    return check(elapsed(start, end), "cuEventElapsedTime")


def _queue_round(cu, stream, runs, events, flush: bool, first: int = 0):
    """Queue one repetition of each run, starting with run ``first`` and wrapping around:
    flush L2, event, run, event (run k's events are 2k and 2k + 1, whatever its slot)."""
    for slot in range(len(runs)):
        k = (first + slot) % len(runs)
        if flush:
            flush_l2()
        check(cu.cuEventRecord(events[2 * k], stream), "cuEventRecord")
        runs[k]()
        check(cu.cuEventRecord(events[2 * k + 1], stream), "cuEventRecord")


# Rounds queued behind one hold. The host must queue a whole batch before the hold ends, and
# the driver's launch queue must take it without blocking: a few hundred commands at most.
ROUNDS_PER_BATCH = 16
MOST_HOLD_MS = 500.0


def _timed_batch(cu, stream, runs, rounds, flush: bool, host_ms: float) -> np.ndarray:
    """Queue ``rounds`` behind a kernel that holds the GPU for twice the host time they take,
    and return their times (one row per run, in ms). An event marks the hold's end: if it has
    already passed when the host finishes queueing, the GPU may have waited for Python inside
    a timed region, so the batch is queued again with a hold twice as long. (One hold for all
    the rounds, as this timer had before, ended before the host had queued 201 rounds in 8
    measurements of 8 on the H200, 2026-11-25; a GELU recording then read spreads of 130-490%
    at 5-7 us. Batches of 16 were queued within their holds in all 104.)"""
    hold_ms = min(2.0 * len(rounds) * host_ms + 0.2, MOST_HOLD_MS)
    for attempt in range(4):
        if attempt:
            hold_ms = min(2 * hold_ms, MOST_HOLD_MS)
        events = [_events(2 * len(runs)) for _ in rounds]
        released = _events(1)[0]
        try:
            hold_gpu(hold_ms)
            check(cu.cuEventRecord(released, stream), "cuEventRecord")
            for r, round_events in zip(rounds, events):
                _queue_round(cu, stream, runs, round_events, flush, first=r % len(runs))
            starved = cu.cuEventQuery(released)[0] == cu.CUresult.CUDA_SUCCESS  # the hold was over
            # the last round ends with whichever run its rotation puts last: wait for the stream
            check(cu.cuStreamSynchronize(stream), "waiting for the timed runs (cuStreamSynchronize)")
            times = np.array([[_elapsed_ms(e[2 * k], e[2 * k + 1]) for e in events] for k in range(len(runs))])
        finally:
            for e in [released, *(e for round_events in events for e in round_events)]:
                cu.cuEventDestroy(e)
        if not starved:
            return times
    warnings.warn(f"the host could not queue {len(rounds)} rounds within a hold of {hold_ms:.0f} ms: "
                  "these times may include host gaps", RuntimeWarning)
    return times


def time_gpu(run, *, reps: int = None, warmup: int = 3, flush: bool = True,
             budget_ms: float = 400.0, min_reps: int = 10, max_reps: int = 200) -> Timing:
    """Time ``run()`` (which enqueues GPU work on the default stream).

    Each repetition: flush L2 (outside the timed region), record an event, run,
    record an event. With ``reps=None`` the count is chosen so the whole
    measurement takes about ``budget_ms`` (between min_reps and max_reps).
    """
    return time_interleaved([run], reps=reps, warmup=warmup, flush=flush, budget_ms=budget_ms,
                            min_reps=min_reps, max_reps=max_reps)[0]


def time_interleaved(runs, *, reps: int = None, warmup: int = 3, flush: bool = True,
                     budget_ms: float = 400.0, min_reps: int = 10, max_reps: int = 200) -> list:
    """Time several ``runs`` taking turns: every round times each run once, each after
    its own L2 flush. Whatever drifts during a measurement (clocks, the state the
    previous work left in memory) then drifts for all of them alike, which matters for
    kernels of a few microseconds compared head to head. The order rotates from round
    to round (round r starts with run r mod len(runs)), so that each run takes every
    place in the round equally often: a place keeps its own offset through a
    measurement. On the H200 one kernel timed in two fixed places of each round
    differed by up to 0.7 us at 5 us and by 0.3-0.5 us at 37-257 us (2026-11-25),
    more than the kernels compared at those sizes differ. One Timing per run."""
    if not runs:
        raise ValueError("time_interleaved needs at least one run")
    cu = _driver()
    stream = cu.CUstream(0)
    for run in runs:
        for _ in range(warmup):
            run()
    check(cu.cuCtxSynchronize(), "warm-up (cuCtxSynchronize)")
    # One probe: the GPU time of a round, and the host time to queue one.
    probe = _events(2 * len(runs))
    queued = time.perf_counter()
    _queue_round(cu, stream, runs, probe, flush)
    host_ms = (time.perf_counter() - queued) * 1e3
    check(cu.cuEventSynchronize(probe[-1]), "cuEventSynchronize")
    once = max(sum(_elapsed_ms(probe[2 * k], probe[2 * k + 1]) for k in range(len(runs))), 1e-3)
    for e in probe:
        cu.cuEventDestroy(e)
    if reps is None:
        reps = int(np.clip(budget_ms / (once + (0.05 * len(runs) if flush else 0.0)), min_reps, max_reps))
    reps = ceil_div(reps, len(runs)) * len(runs)  # a whole number of rotations: every place equally often
    times = np.empty((len(runs), reps))
    for start in range(0, reps, ROUNDS_PER_BATCH):
        rounds = range(start, min(reps, start + ROUNDS_PER_BATCH))
        times[:, start:rounds.stop] = _timed_batch(cu, stream, runs, rounds, flush, host_ms)
    timings = []
    for row in times:
        q1, median, q3 = np.percentile(row, [25, 50, 75])
        timings.append(Timing(ms=float(median), ms_q1=float(q1), ms_q3=float(q3), ms_min=float(row.min()),
                              ms_max=float(row.max()), reps=reps, l2_flushed=flush))
    return timings
