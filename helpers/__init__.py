"""Shared helpers of the book "Memory-bound GPU kernels".

compile (NVRTC) -> inspect (ptxas, SASS) -> launch (driver API) -> time (events,
L2 flushed) -> record / replay -> plot and widgets. Each module says which
chapter introduced it.
"""
from .bench import Bench, Row, Unavailable
from .compiler import CompiledKernels, Resources, compile_kernels, default_arch
from .device import DeviceArray, gpu, gpu_available, no_gpu_reason, synchronize
from .errors import (BookError, CompileError, CudaError, DeviceOutOfMemoryError, InputError,
                     KernelFaultError, LaunchConfigError, NoGpuError, NotRecordedError)
from .record import Recording, stale_sources
from .sass import memory_ops, opcodes
from .timing import Timing, time_gpu, time_interleaved

__all__ = [
    "Bench", "Row", "Unavailable", "CompiledKernels", "Resources", "compile_kernels", "default_arch",
    "DeviceArray", "gpu", "gpu_available", "no_gpu_reason", "synchronize", "BookError",
    "CompileError", "CudaError", "DeviceOutOfMemoryError", "InputError", "KernelFaultError",
    "LaunchConfigError", "NoGpuError", "NotRecordedError", "Recording", "stale_sources",
    "memory_ops", "opcodes", "Timing", "time_gpu", "time_interleaved",
]
