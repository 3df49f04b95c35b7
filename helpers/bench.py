"""One object per chapter that measures on a GPU and replays without one.

Introduced in chapter 1. A chapter creates ``Bench("<chapter>", sources=[...])``
and asks it for measurements with ``bench.measure(...)``. With a GPU, the
measurement runs (correctness first, then timing) and is added to a new
recording; without one, the recorded row is returned. The cells are the same
in both modes, so every notebook executes everywhere.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

from . import device
from .errors import NotRecordedError
from .record import Recording, canonical_config, source_hashes, stale_sources
from .timing import time_interleaved

CEILING_BYTES = 1 << 30  # the copy ceiling is measured on a 1 GiB buffer
TIMER_SOURCE = "kernels/timing.cu"  # the timer's own kernel: part of every recording's sources


class Unavailable(Exception):
    """Raised by a measurement's setup when its provider (torch, cupy) is not installed."""


@dataclass
class Row:
    provider: str
    dtype: str
    shape: list
    config: dict
    bytes: int
    ms: float
    gbs: float
    rel_err: float = None
    ms_q1: float = None
    ms_q3: float = None
    reps: int = None

    def pct_of(self, ceiling_gbs: float) -> float:
        return 100.0 * self.gbs / ceiling_gbs


def _row_from_dict(data: dict) -> Row:
    known = {k: data.get(k) for k in Row.__dataclass_fields__}
    return Row(**known)


class Bench:
    def __init__(self, chapter: str, sources):
        self.chapter = chapter
        self.sources = list(dict.fromkeys([*sources, TIMER_SOURCE]))
        self.reason = device.no_gpu_reason()
        self.live = self.reason is None
        path = Recording.path_for(chapter)
        self.recorded = Recording.load(chapter) if path.exists() else None
        self._unavailable = set()
        if self.live:
            gpu = device.gpu()
            self.recording = Recording(
                chapter=chapter, device=gpu.name, recorded=datetime.date.today().isoformat(),
                sources=source_hashes(self.sources), copy_gbs=0.0,
                environment=_environment(gpu))
        elif self.recorded is None:
            raise NotRecordedError(f"no GPU ({self.reason}) and no recording at {path}: run this "
                                   "chapter once on a GPU with BOOK_RECORD=1 to create one")
        else:
            self.recording = self.recorded

    # -- what the reader is looking at -------------------------------------------------
    @property
    def label(self) -> str:
        verb = "measured" if self.live else "recorded"
        return f"{verb} on {self.recording.device} on {self.recording.recorded}"

    def banner(self):
        """Say where the numbers below come from."""
        if self.live:
            print(f"Live mode: measuring on {self.recording.device} "
                  f"({self.recording.environment.get('sm_count')} SMs, "
                  f"{self.recording.environment.get('l2_mib')} MiB L2). Figures are {self.label}.")
        else:
            print(f"Replay mode is on: {self.reason}.\nThe figures below were {self.label}; "
                  "nothing is measured on this machine.")
            stale = stale_sources(self.recording)
            if stale:
                print(f"WARNING: {', '.join(stale)} changed since this recording; its figures are stale.")

    # -- the ceiling ------------------------------------------------------------------
    @property
    def copy_gbs(self) -> float:
        """Device-to-device copy bandwidth (read + write counted), measured once per run."""
        if self.live and not self.recording.copy_gbs:
            self.recording.copy_gbs = self.measure_driver_copy(CEILING_BYTES).gbs
        return self.recording.copy_gbs

    def measure_driver_copy(self, nbytes: int) -> Row:
        """The driver's cuMemcpyDtoD on nbytes: the bar our copy kernels must reach."""
        def setup():
            src, dst = device.DeviceArray((nbytes,), "uint8"), device.DeviceArray((nbytes,), "uint8")
            src.poison(0x5A)
            return (lambda: device.copy_device_to_device(dst, src)), None
        return self.measure("driver_copy", dtype="uint8", shape=[nbytes], config={},
                            bytes=2 * nbytes, setup=setup)

    # -- measurements -----------------------------------------------------------------
    def measure(self, provider: str, *, dtype: str, shape, config: dict = None, bytes: int,
                setup, flush: bool = True) -> Row | None:
        """Measure one thing, or replay it.

        ``setup()`` (called only with a GPU) allocates and fills the inputs and
        returns ``(run, check)``: ``run()`` enqueues the work to time and
        ``check()`` (or None) runs it once on fresh inputs and returns its
        relative error against a float64 reference, raising if it is wrong.
        ``bytes`` is the count of bytes the operation must move; GB/s derives
        from it. A measurement already taken in this run is returned as it is.
        Returns None when the provider is not installed.
        """
        return self.measure_together([dict(provider=provider, dtype=dtype, shape=shape, config=config,
                                           bytes=bytes, setup=setup)], flush=flush)[0]

    def measure_together(self, measurements: list, *, flush: bool = True) -> list:
        """Measure several things head to head: each is checked first, then they are
        timed taking turns, one repetition of each in every round (timing.time_interleaved),
        so that what drifts during the measurement drifts for all of them alike.
        ``measurements`` holds the keyword arguments of ``measure`` (provider, dtype,
        shape, config, bytes, setup). With more than one, each row's config records
        the providers it was timed with ("in_turns_with"), so these rows never stand
        in for ones timed alone. Returns a Row (or None: not installed) for each."""
        keys = []
        for m in measurements:
            config = dict(m.get("config") or {})
            if len(measurements) > 1:
                config["in_turns_with"] = ", ".join(o["provider"] for o in measurements if o is not m)
            keys.append((m["provider"], str(m["dtype"]), [int(s) for s in m["shape"]], canonical_config(config)))
        if not self.live:
            rows = []
            for provider, dtype, shape, config in keys:
                found = self.recording.find(provider, dtype, shape, config)
                if found is None:
                    raise NotRecordedError(
                        f"{provider} {dtype} {shape} {config} was not recorded on {self.recording.device}; "
                        f"recorded configurations of {provider}: {self.recorded_configs(provider)}")
                rows.append(_row_from_dict(found))
            return rows
        rows, runs, pending = [None] * len(keys), [], []
        for index, (m, (provider, dtype, shape, config)) in enumerate(zip(measurements, keys)):
            if provider in self._unavailable:
                continue
            taken = self.recording.find(provider, dtype, shape, config) if flush else None
            if taken is not None:
                rows[index] = _row_from_dict(taken)
                continue
            try:
                run, check = m["setup"]()
            except Unavailable as e:
                self._unavailable.add(provider)
                print(f"{provider} is not measured here: {e}")
                continue
            rel_err = check() if check is not None else None
            runs.append(run)
            pending.append((index, rel_err))
        if runs:
            for (index, rel_err), timing in zip(pending, time_interleaved(runs, flush=flush)):
                provider, dtype, shape, config = keys[index]
                nbytes = int(measurements[index]["bytes"])
                row = Row(provider=provider, dtype=dtype, shape=shape, config=config, bytes=nbytes,
                          ms=timing.ms, gbs=timing.gbs(nbytes), rel_err=None if rel_err is None else float(rel_err),
                          ms_q1=timing.ms_q1, ms_q3=timing.ms_q3, reps=timing.reps)
                self.recording.add(dict(row.__dict__))
                rows[index] = row
        return rows

    def value(self, name: str, compute):
        """A measured result that is not a bandwidth row (a dict of numbers, say):
        ``compute()`` with a GPU, the recorded value without one."""
        if self.live:
            self.recording.values[name] = compute()
        elif name not in self.recording.values:
            raise NotRecordedError(f"{name!r} was not recorded on {self.recording.device}")
        return self.recording.values[name]

    def rows(self, provider: str = None, **where) -> list:
        """Rows measured (or recorded) so far, filtered by provider and fields/config keys."""
        found = []
        for data in self.recording.rows:
            if provider is not None and data["provider"] != provider:
                continue
            if all(data.get(k, data["config"].get(k)) == v for k, v in where.items()):
                found.append(_row_from_dict(data))
        return found

    def recorded_configs(self, provider: str) -> list:
        seen = []
        for data in (self.recorded.rows if self.recorded else []):
            if data["provider"] == provider and data["config"] not in seen:
                seen.append(data["config"])
        return seen

    def save(self):
        """Write the recording (live mode, with BOOK_RECORD=1) to book/data/<chapter>.json."""
        if not self.live:
            print(f"Replay mode: nothing to save ({self.label}).")
            return None
        if os.environ.get("BOOK_RECORD") != "1":
            print(f"Measured {len(self.recording.rows)} rows {self.label}; not saved "
                  "(set BOOK_RECORD=1 to record them to book/data).")
            return None
        self.copy_gbs  # the ceiling is part of every recording
        path = self.recording.save()
        print(f"Recorded {len(self.recording.rows)} rows to {path.name} ({self.label}).")
        return path


def _environment(gpu) -> dict:
    import numpy
    import cuda.bindings
    from .compiler import nvrtc_version
    env = {"driver": gpu.driver_version, "cuda_bindings": cuda.bindings.__version__,
           "nvrtc": nvrtc_version(), "numpy": numpy.__version__, "sm_count": gpu.sm_count,
           "l2_mib": gpu.l2_bytes // 2**20,
           "compute_capability": ".".join(map(str, gpu.compute_capability))}
    for name in ("torch", "cupy"):
        try:
            env[name] = __import__(name).__version__
        except ImportError:
            pass
        except Exception as e:  # noqa: BLE001 - an optional peer that fails to import is noted, not fatal
            env[name] = f"failed to import: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return env
