"""Record measurements on a GPU, replay them anywhere.

Introduced in chapter 1. A run on a GPU writes ``book/data/<chapter>.json``;
on a machine without one, the same notebook cells read it back and label what
they show "recorded on <GPU> on <date>". The file also stores the sha256 of
every kernel source it was measured with, so a kernel that changed after its
figures were recorded is caught by the tests instead of landing silently.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .paths import DATA, ROOT

ROW_FIELDS = ("provider", "dtype", "shape", "config", "bytes", "ms", "gbs")


def sha256_of(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def canonical_config(config: dict) -> dict:
    """Configs compare by value: keys sorted, NumPy scalars turned into Python ones."""
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in sorted((config or {}).items())}


@dataclass
class Recording:
    chapter: str
    device: str
    recorded: str  # ISO date
    sources: dict  # kernel file (relative to the project) -> sha256
    copy_gbs: float  # device-to-device copy of >= 1 GiB in the same run, read + write counted
    rows: list = field(default_factory=list)
    environment: dict = field(default_factory=dict)  # driver, library versions
    values: dict = field(default_factory=dict)  # other measured results, by name

    @staticmethod
    def path_for(chapter: str, folder=None) -> Path:
        return Path(folder or DATA) / f"{chapter}.json"

    @classmethod
    def load(cls, chapter: str, folder=None) -> "Recording":
        path = cls.path_for(chapter, folder)
        data = json.loads(path.read_text())
        problems = validate(data)
        if problems:
            raise ValueError(f"{path} is not a valid recording: " + "; ".join(problems))
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def save(self, folder=None) -> Path:
        """Write atomically: an interrupted run never leaves half a file behind."""
        path = self.path_for(self.chapter, folder)
        path.parent.mkdir(parents=True, exist_ok=True)
        problems = validate(asdict(self))
        if problems:
            raise ValueError("refusing to save an invalid recording: " + "; ".join(problems))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{self.chapter}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(asdict(self), out, indent=1)
                out.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def find(self, provider: str, dtype: str, shape, config: dict = None):
        """The row recorded for exactly this measurement, or None."""
        config, shape = canonical_config(config), list(shape)
        for row in self.rows:
            if (row["provider"] == provider and row["dtype"] == dtype and row["shape"] == shape
                    and canonical_config(row["config"]) == config):
                return row
        return None

    def add(self, row: dict):
        """Add a row, replacing an earlier one for the same measurement."""
        old = self.find(row["provider"], row["dtype"], row["shape"], row["config"])
        if old is not None:
            self.rows.remove(old)
        self.rows.append(row)


def validate(data: dict) -> list:
    """Everything wrong with a recording's JSON, as readable strings (empty when valid)."""
    problems = []
    for key, kind in (("chapter", str), ("device", str), ("recorded", str), ("sources", dict),
                      ("copy_gbs", (int, float)), ("rows", list)):
        if not isinstance(data.get(key), kind):
            problems.append(f"'{key}' missing or not a {getattr(kind, '__name__', 'number')}")
    if problems:
        return problems
    if data["copy_gbs"] <= 0:
        problems.append("copy_gbs must be positive")
    for i, row in enumerate(data["rows"]):
        missing = [k for k in ROW_FIELDS if k not in row]
        if missing:
            problems.append(f"row {i} lacks {', '.join(missing)}")
            continue
        if not (isinstance(row["shape"], list) and isinstance(row["config"], dict)):
            problems.append(f"row {i}: shape must be a list and config a dict")
        elif row["ms"] <= 0 or row["bytes"] < 0:
            problems.append(f"row {i}: ms must be positive and bytes non-negative")
        elif abs(row["gbs"] - row["bytes"] / (row["ms"] * 1e-3) / 1e9) > 1e-6 * max(row["gbs"], 1):
            problems.append(f"row {i}: gbs does not equal bytes / ms")
    return problems


def source_hashes(sources) -> dict:
    """{path relative to the project: sha256} for kernel files."""
    from .paths import display_path, kernel_path
    return {display_path(kernel_path(s)): sha256_of(kernel_path(s)) for s in sources}


def stale_sources(recording: Recording) -> list:
    """Kernel files whose content changed (or vanished) since the recording was made."""
    stale = []
    for name, digest in recording.sources.items():
        path = ROOT / name
        if not path.is_file() or sha256_of(path) != digest:
            stale.append(name)
    return stale
