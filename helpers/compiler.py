"""Compile CUDA C++ at run time with NVRTC (through cuda-python), with a disk cache.

Introduced in chapter 1 and used by every chapter: a kernel file in kernels/ is
compiled for the current GPU (or for a given architecture when there is none),
template instances are picked by name expression (``"copy_packed<float, 4, 256, 2>"``),
and the resulting cubin is cached on disk, keyed by the sources, the options and
the NVRTC version, so moving a slider back to a setting already seen does not
recompile.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CompileError
from .paths import KERNELS, cache_dir, display_path, kernel_path

DEFAULT_ARCH = "sm_90"  # the H200 (Hopper) that recorded the book's figures

# How many times NVRTC actually ran in this process: the cache tests read it.
stats = {"nvrtc_compiles": 0, "disk_hits": 0, "memory_hits": 0}
_memory_cache: dict[str, "CompiledKernels"] = {}
_lock = threading.Lock()


def _nvrtc():
    from cuda.bindings import nvrtc
    return nvrtc


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> str:
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check_nvrtc(err, "nvrtcVersion")
    return f"{major}.{minor}"


def _check_nvrtc(err, what):
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, name = nvrtc.nvrtcGetErrorString(err)
        raise CompileError(f"{what} failed: {name.decode()}")


@functools.lru_cache(maxsize=None)
def include_dirs() -> tuple:
    """kernels/ itself, then the CUDA headers (cuda_fp16.h, cuda_bf16.h) and CCCL
    (CUB) from NVIDIA's pip wheels, falling back to a CUDA toolkit install."""
    dirs = [str(KERNELS)]
    try:
        from cuda.pathfinder import find_nvidia_header_directory
        for lib in ("cudart", "cccl"):
            found = find_nvidia_header_directory(lib)
            if found and found not in dirs:
                dirs.append(found)
    except ImportError:  # an older cuda-python without pathfinder
        pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for candidate in (Path(home) / "include", Path(home) / "include" / "cccl"):
        if candidate.is_dir() and str(candidate) not in dirs:
            dirs.append(str(candidate))
    return tuple(dirs)


def default_arch() -> str:
    """sm_XY of the current GPU, or sm_90 when there is no GPU."""
    from . import device
    if device.gpu_available():
        major, minor = device.gpu().compute_capability
        return f"sm_{major}{minor}"
    return DEFAULT_ARCH


@dataclass(frozen=True)
class Resources:
    """What one compiled kernel uses: the numbers that decide occupancy."""
    registers: int  # per thread
    shared_bytes: int  # static shared memory per block
    stack_bytes: int  # per thread
    local_bytes: int  # per thread: arrays indexed at run time, and spills
    spill_store_bytes: int  # from ptxas' report in NVRTC's log
    spill_load_bytes: int

    @property
    def spills(self) -> bool:
        return bool(self.spill_store_bytes or self.spill_load_bytes)

    @property
    def uses_local_memory(self) -> bool:
        """Spills, or an array indexed at run time: both go to (slow) local memory."""
        return bool(self.spills or self.stack_bytes or self.local_bytes)


@dataclass
class CompiledKernels:
    """The cubin of one kernel file, compiled for some template instances."""
    source: str  # display path of the .cu file
    arch: str
    cubin: bytes
    mangled: dict  # name expression -> lowered (mangled) symbol
    log: str  # NVRTC's log, with ptxas' resource report
    key: str
    _module: object = field(default=None, repr=False)
    _kernels: dict = field(default_factory=dict, repr=False)

    def _mangled(self, name: str) -> str:
        try:
            return self.mangled[name]
        except KeyError:
            raise KeyError(f"{name!r} was not compiled from {self.source}; compiled: "
                           f"{', '.join(self.mangled)}") from None

    def resources(self, name: str) -> Resources:
        """Registers, shared and local memory (cuobjdump -res-usage) and spills (ptxas). Raises
        CompileError where the log holds no report on ``name``: no spills cannot be told from
        spills not reported."""
        symbol = self._mangled(name)
        report = _spill_report(self.log, symbol)
        if report is None:
            raise CompileError(f"NVRTC's log for {self.source} ({len(self.log)} characters) holds no ptxas "
                               f"report on {name}, so its spills are unknown")
        from .sass import resource_usage
        usage = resource_usage(self.cubin, symbol)
        return Resources(registers=usage["REG"], shared_bytes=usage["SHARED"], stack_bytes=usage["STACK"],
                         local_bytes=usage["LOCAL"], spill_store_bytes=report[0], spill_load_bytes=report[1])

    def sass(self, name: str) -> str:
        """The SASS (machine code) of one kernel, disassembled with cuobjdump."""
        from .sass import disassemble
        return disassemble(self.cubin, self._mangled(name))

    def kernel(self, name: str):
        """The loaded kernel, ready to launch (needs a GPU)."""
        from . import device
        if name not in self._kernels:
            symbol = self._mangled(name)
            if self._module is None:
                self._module = device.load_module(self.cubin, self.source)
            self._kernels[name] = device.Kernel(self._module, symbol, name)
        return self._kernels[name]


_loaded = {}  # (source, name expression) -> loaded Kernel


def loaded_kernel(source, name: str):
    """The kernel ``name`` of ``source``, compiled and loaded on first use and kept:
    later calls are a dictionary lookup, so a launch on the hot path costs microseconds."""
    key = (str(source), name)
    if key not in _loaded:
        _loaded[key] = compile_kernels(source, [name]).kernel(name)
    return _loaded[key]


def _cache_key(source_text: str, headers: dict, options: list, names: list) -> str:
    material = json.dumps({"source": source_text, "headers": headers, "options": options,
                           "names": sorted(names), "nvrtc": nvrtc_version()}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def _local_headers(path: Path) -> dict:
    """Every header beside the source: a change to one invalidates the cache."""
    return {p.name: p.read_text() for p in sorted(path.parent.glob("*.cuh"))}


def nvrtc_options(arch: str, defines=(), extra_options=()) -> list:
    """What NVRTC is told on every compile. ``--ptxas-options=--verbose`` asks ptxas for its
    report (registers, spills: resources() reads it). ``--no-cache`` turns off NVRTC's own
    cache (CUDA 12.9+), which hands back a cubin it has seen before, keyed by the PTX and
    ptxas' options, without running ptxas, so without its report: on the GPU host (NVRTC 13.0,
    2026-11-27) every kernel compiled before on that machine, by any process, came back with
    an empty log, or NVRTC's warnings alone. The cache below keeps each log with its cubin."""
    return [f"--gpu-architecture={arch}", "--std=c++17", "-lineinfo", "--ptxas-options=--verbose", "--no-cache",
            *[f"-D{d}" for d in defines], *extra_options, *[f"--include-path={d}" for d in include_dirs()]]


def compile_kernels(source, names, *, arch: str | None = None, defines=(), extra_options=()):
    """Compile the template instances ``names`` of the kernel file ``source``.

    ``source`` is a file in kernels/ (``"copy.cu"``) or a path; ``names`` are name
    expressions such as ``"copy_packed<float, 4, 256, 2>"``. Returns a
    ``CompiledKernels``; raises ``CompileError`` with NVRTC's log on failure.
    """
    if isinstance(names, str):
        names = [names]
    names = list(dict.fromkeys(names))
    if not names:
        raise ValueError("name at least one kernel (a name expression) to compile")
    path = kernel_path(source)
    arch = arch or default_arch()
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise ValueError(f"arch must look like 'sm_90', got {arch!r}")
    options = nvrtc_options(arch, defines, extra_options)
    text = path.read_text()
    # Include paths differ between machines: key on the options without them.
    portable = [o for o in options if not o.startswith("--include-path")]
    key = _cache_key(text, _local_headers(path), portable, names)

    with _lock:
        if key in _memory_cache:
            stats["memory_hits"] += 1
            return _memory_cache[key]
        cached = _load_cached(key, display_path(path), arch)
        if cached is None:
            cached = _run_nvrtc(path, text, names, options, arch, key)
            _store_cached(cached)
        else:
            stats["disk_hits"] += 1
        _memory_cache[key] = cached
        return cached


def _run_nvrtc(path, text, names, options, arch, key) -> CompiledKernels:
    """Compile with NVRTC. The log must hold ptxas' report on every kernel of ``names``, since
    resources() cannot tell spills without it: a compile whose log lacks it is refused."""
    nvrtc = _nvrtc()
    shown = display_path(path)
    err, program = nvrtc.nvrtcCreateProgram(text.encode(), shown.encode(), 0, [], [])
    _check_nvrtc(err, "nvrtcCreateProgram")
    try:
        for name in names:
            _check_nvrtc(nvrtc.nvrtcAddNameExpression(program, name.encode())[0],
                         f"nvrtcAddNameExpression({name})")
        stats["nvrtc_compiles"] += 1
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        log = _read_back(program, "ProgramLog").decode(errors="replace").rstrip("\x00").strip()
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC could not compile {shown} for {arch} "
                               f"({', '.join(names)}):\n{log}")
        cubin = _read_back(program, "CUBIN")
        mangled = {}
        for name in names:
            err, lowered = nvrtc.nvrtcGetLoweredName(program, name.encode())
            _check_nvrtc(err, f"nvrtcGetLoweredName({name})")
            mangled[name] = lowered.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    missing = _unreported(log, mangled)
    if missing:
        raise CompileError(f"NVRTC compiled {shown}, but its log ({len(log)} characters) holds no ptxas report on "
                           f"{', '.join(missing)}: its registers and spills are unknown. Did the options lose "
                           f"--ptxas-options=--verbose or --no-cache?")
    return CompiledKernels(source=shown, arch=arch, cubin=cubin, mangled=mangled, log=log, key=key)


def _read_back(program, what: str) -> bytes:
    """NVRTC's ``nvrtcGet<what>`` (ProgramLog, CUBIN), copied into a buffer of our own.
    The buffer must be a fresh bytearray: NVRTC writes into it. ``b" " * size`` is not fresh when
    size is 1 (an empty log, its NUL alone): it is CPython's shared one-byte b" ", and the NUL
    written into it made every f-string compiled afterwards by Python 3.12 drop a lone space
    between two fields: f"{a} {b}" gave "ab"."""
    nvrtc = _nvrtc()
    err, size = getattr(nvrtc, f"nvrtcGet{what}Size")(program)
    _check_nvrtc(err, f"nvrtcGet{what}Size")
    buffer = bytearray(size)
    _check_nvrtc(getattr(nvrtc, f"nvrtcGet{what}")(program, buffer)[0], f"nvrtcGet{what}")
    return bytes(buffer)


def _spill_report(log: str, symbol: str):
    """(spill store bytes, spill load bytes) of ``symbol`` from ptxas' verbose report, or None."""
    report = re.search(rf"Function properties for {re.escape(symbol)}\s*\n[^\n]*?"
                       r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (int(report.group(1)), int(report.group(2))) if report else None


def _unreported(log: str, mangled: dict) -> list:
    """The kernels (name expressions) of ``mangled`` that ptxas' report in ``log`` leaves out."""
    return [name for name, symbol in mangled.items() if _spill_report(log, symbol) is None]


def _load_cached(key, shown, arch):
    folder = cache_dir()
    meta, binary = folder / f"{key}.json", folder / f"{key}.cubin"
    if not (meta.is_file() and binary.is_file()):
        return None
    try:
        info = json.loads(meta.read_text())
        if _unreported(info["log"], info["mangled"]):
            return None  # every compile passes ptxas --verbose: an entry without its report is damaged
        return CompiledKernels(source=shown, arch=arch, cubin=binary.read_bytes(),
                               mangled=info["mangled"], log=info["log"], key=key)
    except (OSError, ValueError, KeyError):
        return None  # a damaged entry is simply compiled again


def _store_cached(compiled: CompiledKernels):
    folder = cache_dir()
    # Write then rename: a reader in another process never sees half a file.
    for suffix, payload in ((".cubin", compiled.cubin),
                            (".json", json.dumps({"mangled": compiled.mangled,
                                                  "log": compiled.log}).encode())):
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
        os.replace(tmp, folder / f"{compiled.key}{suffix}")


def find_tool(name: str) -> str:
    """cuobjdump / nvdisasm from NVIDIA's pip wheels, else from PATH or CUDA_HOME."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
        found = find_nvidia_binary_utility(name)
        if found:
            return found
    except (ImportError, Exception):  # pathfinder raises its own not-found errors
        pass
    found = shutil.which(name)
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if found is None and Path(home, "bin", name).is_file():
        found = str(Path(home, "bin", name))
    if found is None:
        raise FileNotFoundError(f"{name} not found: pip install nvidia-cuda-cuobjdump "
                                f"nvidia-cuda-nvdisasm (they are in requirements.txt)")
    return found


def run_tool(args: list[str]) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr}")
    return done.stdout
