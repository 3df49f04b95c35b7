"""The exceptions the helpers raise. Each message names the problem and, where it
helps, what would work instead: a reader should never have to decode a raw CUDA
error code or a crashed kernel."""


class BookError(Exception):
    """Base class of every error the helpers raise on purpose."""


class NoGpuError(BookError):
    """No usable GPU (no device, no driver, or a driver too old): replay mode."""


class CompileError(BookError):
    """NVRTC rejected a kernel source; the message carries NVRTC's log with file and line."""


class LaunchConfigError(BookError, ValueError):
    """A block size, grid, or shared-memory request the kernel or the device cannot take."""


class InputError(BookError, ValueError):
    """An input a kernel cannot take: wrong dtype, size, alignment or layout."""


class CudaError(BookError):
    """A CUDA driver call failed; the message names the call and the error."""


class DeviceOutOfMemoryError(CudaError, MemoryError):
    """The device has no room for an allocation."""


class KernelFaultError(CudaError):
    """A kernel faulted (illegal address, misaligned access, ...). The CUDA context is
    lost: nothing more can run on the GPU in this process."""


class NotRecordedError(BookError, KeyError):
    """Replay mode was asked for a measurement the recording does not hold."""

    def __str__(self):  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""
