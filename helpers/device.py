"""The GPU through the CUDA driver API (cuda-python's ``cuda.bindings.driver``).

Introduced in chapter 1: one context per process, device buffers to and from
NumPy, kernel launches validated before they happen, and every driver call
checked. When there is no usable GPU, ``gpu()`` raises ``NoGpuError`` with the
reason and the chapters switch to replay mode. When a kernel faults, the CUDA
context is gone for good; every later call then says so in one line instead of
failing with a wall of unrelated errors.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np

from .errors import (CudaError, DeviceOutOfMemoryError, InputError, KernelFaultError,
                     LaunchConfigError, NoGpuError)

STATIC_SHARED_LIMIT = 48 * 1024  # above this, dynamic shared memory must be opted into

_gpu = None  # the Gpu, once created
_no_gpu_reason = None  # why there is none, once we know
_context_lost = None  # the message of the fault that destroyed the context


def _driver():
    from cuda.bindings import driver
    return driver


def _fault_codes():
    r = _driver().CUresult
    names = ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED",
             "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_INVALID_PC",
             "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT")
    return {getattr(r, n) for n in names if hasattr(r, n)}


def check(result, what: str):
    """Check a cuda-python call's result tuple; return its value(s) or raise, by kind of error."""
    global _context_lost
    err, *values = result if isinstance(result, tuple) else (result,)
    cu = _driver()
    if err != cu.CUresult.CUDA_SUCCESS:
        _, description = cu.cuGetErrorString(err)
        detail = f"{what} failed: {err.name} ({(description or b'').decode()})"
        if err in _fault_codes():
            _context_lost = (f"{detail}.\nA kernel faulted, and the CUDA context of this process is "
                             "lost: no further GPU work can run in it. Restart the Python kernel "
                             "(Kernel > Restart) and run the notebook again.")
            raise KernelFaultError(_context_lost)
        if err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise DeviceOutOfMemoryError(f"{detail}: the GPU has no room for this. {_memory_summary()}"
                                         "Try a smaller size, or free buffers you no longer need.")
        raise CudaError(detail)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _memory_summary() -> str:
    try:
        free, total = check(_driver().cuMemGetInfo(), "cuMemGetInfo")
        return f"{free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB are free. "
    except Exception:
        return ""


@dataclass
class Gpu:
    """The device and its context, with the properties the chapters need."""
    name: str
    index: int
    compute_capability: tuple
    sm_count: int
    l2_bytes: int
    max_threads_per_block: int
    max_block_dims: tuple
    max_grid_dims: tuple
    max_shared_per_block_optin: int
    memory_bytes: int
    driver_version: str
    context: object
    device: object


def _attribute(device, name):
    cu = _driver()
    return check(cu.cuDeviceGetAttribute(getattr(cu.CUdevice_attribute, name), device),
                 f"cuDeviceGetAttribute({name})")


def _open_gpu(index: int) -> Gpu:
    if os.environ.get("BOOK_REPLAY") == "1":
        raise NoGpuError("BOOK_REPLAY=1 is set")
    try:
        from cuda.bindings import driver as cu
        import cuda.bindings
    except ImportError as e:
        raise NoGpuError(f"cuda-python is not installed ({e})") from None
    try:
        err, = cu.cuInit(0)
    except Exception as e:  # the driver library itself could not be loaded
        raise NoGpuError(f"no NVIDIA driver found ({type(e).__name__})") from None
    binding_major = int(cuda.bindings.__version__.split(".")[0])
    if err != cu.CUresult.CUDA_SUCCESS:
        if err == cu.CUresult.CUDA_ERROR_NO_DEVICE:
            raise NoGpuError("the NVIDIA driver sees no GPU")
        # The codes differ between cuda-python versions: take the ones this version has.
        too_old = {getattr(cu.CUresult, name) for name in (
            "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
            "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
            "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "CUDA_ERROR_INSUFFICIENT_LOADER_VERSION")
            if hasattr(cu.CUresult, name)}
        if err in too_old:
            raise NoGpuError(f"the NVIDIA driver is too old for cuda-python {cuda.bindings.__version__}: "
                             f"install cuda-python {binding_major - 1}.x or update the driver")
        if err == getattr(cu.CUresult, "CUDA_ERROR_STUB_LIBRARY", None):
            raise NoGpuError("only the CUDA driver's stub library was found, not a driver")
        raise NoGpuError(f"cuInit failed: {err.name}")
    version = check(cu.cuDriverGetVersion(), "cuDriverGetVersion")
    driver_version = f"{version // 1000}.{version % 1000 // 10}"
    if version // 1000 < binding_major:
        raise NoGpuError(f"the NVIDIA driver supports CUDA {driver_version}, older than cuda-python "
                         f"{cuda.bindings.__version__} needs: update the driver or install "
                         f"'cuda-python<{binding_major}'")
    count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    if count == 0:
        raise NoGpuError("the NVIDIA driver sees no GPU")
    if not 0 <= index < count:
        raise NoGpuError(f"GPU {index} requested but only {count} present")
    device = check(cu.cuDeviceGet(index), "cuDeviceGet")
    context = check(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    name = check(cu.cuDeviceGetName(256, device), "cuDeviceGetName")
    a = lambda attr: _attribute(device, "CU_DEVICE_ATTRIBUTE_" + attr)  # noqa: E731
    return Gpu(
        name=name.split(b"\x00")[0].decode(), index=index,
        compute_capability=(a("COMPUTE_CAPABILITY_MAJOR"), a("COMPUTE_CAPABILITY_MINOR")),
        sm_count=a("MULTIPROCESSOR_COUNT"), l2_bytes=a("L2_CACHE_SIZE"),
        max_threads_per_block=a("MAX_THREADS_PER_BLOCK"),
        max_block_dims=(a("MAX_BLOCK_DIM_X"), a("MAX_BLOCK_DIM_Y"), a("MAX_BLOCK_DIM_Z")),
        max_grid_dims=(a("MAX_GRID_DIM_X"), a("MAX_GRID_DIM_Y"), a("MAX_GRID_DIM_Z")),
        max_shared_per_block_optin=a("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        memory_bytes=check(cu.cuDeviceTotalMem(device), "cuDeviceTotalMem"),
        driver_version=driver_version, context=context, device=device)


def gpu(index: int = None) -> Gpu:
    """The GPU (opened on first use). Raises NoGpuError, or KernelFaultError after a fault."""
    global _gpu, _no_gpu_reason
    if _context_lost:
        raise KernelFaultError(_context_lost)
    if _gpu is None:
        if _no_gpu_reason is not None:
            raise NoGpuError(_no_gpu_reason)
        try:
            _gpu = _open_gpu(int(os.environ.get("BOOK_GPU", "0")) if index is None else index)
        except NoGpuError as e:
            _no_gpu_reason = str(e)
            raise
    return _gpu


def gpu_available() -> bool:
    try:
        gpu()
        return True
    except NoGpuError:
        return False


def no_gpu_reason() -> str | None:
    """Why there is no GPU, or None when there is one."""
    try:
        gpu()
        return None
    except NoGpuError as e:
        return str(e)


def synchronize():
    """Wait for the GPU; an asynchronous kernel fault surfaces here."""
    gpu()
    check(_driver().cuCtxSynchronize(), "cuCtxSynchronize (waiting for the GPU)")


def memory_info() -> tuple:
    """(free, total) bytes of device memory."""
    gpu()
    return check(_driver().cuMemGetInfo(), "cuMemGetInfo")


# ----------------------------------------------------------------------------- buffers

class DeviceArray:
    """A contiguous array in device memory. Copies to and from NumPy are explicit."""

    def __init__(self, shape, dtype, *, _ptr=None, _owner=None):
        self.shape = (shape,) if np.isscalar(shape) else tuple(int(s) for s in shape)
        if any(s < 0 for s in self.shape):
            raise InputError(f"negative size in shape {self.shape}")
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self._owner = _owner
        if _ptr is None:
            gpu()
            # cuMemAlloc refuses 0 bytes; an empty array still gets a valid pointer.
            self._allocation = check(_driver().cuMemAlloc(max(self.nbytes, 256)),
                                     f"cuMemAlloc({self.nbytes} bytes)")
            self.ptr = int(self._allocation)
        else:
            self._allocation = None
            self.ptr = int(_ptr)

    @classmethod
    def from_numpy(cls, host: np.ndarray) -> "DeviceArray":
        host = np.ascontiguousarray(host)
        array = cls(host.shape, host.dtype)
        array.copy_from(host)
        return array

    def copy_from(self, host: np.ndarray):
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if host.size != self.size:
            raise InputError(f"host array has {host.size} elements, device array {self.size}")
        if self.nbytes:
            check(_driver().cuMemcpyHtoD(self.ptr, host.ctypes.data, self.nbytes), "cuMemcpyHtoD")

    def to_numpy(self) -> np.ndarray:
        host = np.empty(self.shape, self.dtype)
        if self.nbytes:
            check(_driver().cuMemcpyDtoH(host.ctypes.data, self.ptr, self.nbytes), "cuMemcpyDtoH")
        return host

    def poison(self, byte: int = 0xFF):
        """Fill with a byte pattern (0xFF: NaN in every float format), so that an
        element the kernel forgot to write cannot pass a check by luck."""
        if self.nbytes:
            check(_driver().cuMemsetD8(self.ptr, byte, self.nbytes), "cuMemsetD8")

    def view(self, start: int, count: int) -> "DeviceArray":
        """Elements [start, start + count) as a 1-D array sharing this memory
        (an offset view is how the tests make misaligned pointers)."""
        if not (0 <= start and 0 <= count and start + count <= self.size):
            raise InputError(f"view [{start}, {start + count}) outside an array of {self.size}")
        return DeviceArray((count,), self.dtype, _ptr=self.ptr + start * self.dtype.itemsize,
                           _owner=self)

    def reshape(self, *shape) -> "DeviceArray":
        shape = shape[0] if len(shape) == 1 and not np.isscalar(shape[0]) else shape
        if int(np.prod(shape)) != self.size:
            raise InputError(f"cannot reshape {self.shape} to {tuple(shape)}")
        return DeviceArray(shape, self.dtype, _ptr=self.ptr, _owner=self)

    def aligned_to(self, nbytes: int) -> bool:
        return self.ptr % nbytes == 0

    @property
    def __cuda_array_interface__(self) -> dict:
        """Lets PyTorch (``torch.as_tensor(a, device="cuda")``) and CuPy (``cupy.asarray(a)``)
        use this memory without a copy: baselines are measured on the very same bytes."""
        if self.dtype.kind not in "fiu":  # bfloat16 (ml_dtypes) has no type string they read
            raise InputError(f"{self.dtype} cannot be shared through __cuda_array_interface__")
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}

    def free(self):
        if self._allocation is not None and _context_lost is None and _gpu is not None:
            _driver().cuMemFree(self._allocation)
        self._allocation = None

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass

    def __repr__(self):
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x})"


# ----------------------------------------------------------------------------- kernels

def load_module(cubin: bytes, source: str):
    gpu()
    image = np.frombuffer(cubin, dtype=np.uint8)
    return check(_driver().cuModuleLoadData(image.ctypes.data), f"loading the cubin of {source}")


def _as_dims(value, what: str) -> tuple:
    dims = (value,) if isinstance(value, (int, np.integer)) else value
    if not isinstance(dims, tuple) or not 1 <= len(dims) <= 3 or \
            not all(isinstance(d, (int, np.integer)) for d in dims):
        raise LaunchConfigError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def _kernel_argument(value):
    """Python values to the C types our kernels take: pointers (None: a null pointer, for
    an output that is not wanted), long long, float."""
    if value is None:
        return ctypes.c_void_p(0)
    if isinstance(value, DeviceArray):
        return ctypes.c_void_p(value.ptr)
    if isinstance(value, ctypes._SimpleCData):
        return value
    if isinstance(value, np.generic):
        return np.ctypeslib.as_ctypes_type(value.dtype)(value.item())
    if isinstance(value, bool):
        return ctypes.c_bool(value)
    if isinstance(value, int):
        return ctypes.c_longlong(value)  # every integer parameter in kernels/ is long long
    if isinstance(value, float):
        return ctypes.c_float(value)
    raise InputError(f"cannot pass {type(value).__name__} to a kernel; pass a DeviceArray (or None), "
                     "an int (long long), a float (float) or a NumPy scalar")


class Kernel:
    """One loaded kernel. Calling it validates the launch, then launches."""

    def __init__(self, module, symbol: str, name: str):
        cu = _driver()
        self.name = name
        self.function = check(cu.cuModuleGetFunction(module, symbol.encode()),
                              f"cuModuleGetFunction({name})")
        attr = lambda a: check(cu.cuFuncGetAttribute(getattr(cu.CUfunction_attribute, a), self.function),  # noqa: E731
                               f"cuFuncGetAttribute({a})")
        self.max_threads_per_block = attr("CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK")
        self.registers = attr("CU_FUNC_ATTRIBUTE_NUM_REGS")
        self.static_shared_bytes = attr("CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES")
        self._dynamic_shared_opted_in = 0  # bytes of dynamic shared memory opted in to so far
        self._occupancy = {}
        self._non_portable_clusters = False
        self._cluster_configs = {}

    def validate(self, grid, block, shared_bytes: int = 0) -> tuple:
        """Raise LaunchConfigError, with what would work, for a launch the kernel cannot take."""
        device = gpu()
        grid, block = _as_dims(grid, "grid"), _as_dims(block, "block")
        if any(b < 1 for b in block):
            raise LaunchConfigError(f"{self.name}: block {block} has an empty dimension")
        threads = block[0] * block[1] * block[2]
        if threads > self.max_threads_per_block:
            raise LaunchConfigError(
                f"{self.name}: a block of {threads} threads is too large; this kernel takes at most "
                f"{self.max_threads_per_block} (device limit {device.max_threads_per_block}; "
                f"{self.registers} registers per thread)")
        for b, limit, axis in zip(block, device.max_block_dims, "xyz"):
            if b > limit:
                raise LaunchConfigError(f"{self.name}: block.{axis} = {b} exceeds the device limit {limit}")
        for g, limit, axis in zip(grid, device.max_grid_dims, "xyz"):
            if not 1 <= g <= limit:
                raise LaunchConfigError(f"{self.name}: grid.{axis} = {g} is outside 1..{limit}")
        if shared_bytes < 0:
            raise LaunchConfigError(f"{self.name}: negative shared memory {shared_bytes}")
        total_shared = shared_bytes + self.static_shared_bytes
        if total_shared > device.max_shared_per_block_optin:
            raise LaunchConfigError(
                f"{self.name}: {total_shared} bytes of shared memory per block exceed the device's "
                f"{device.max_shared_per_block_optin} bytes")
        return grid, block

    def __call__(self, grid, block, *args, shared_bytes: int = 0, stream=None, cluster: int = 1):
        """Launch. cluster > 1: consecutive blocks along x form thread-block clusters of
        that many blocks (sm_90; they run together on one GPC and share shared memory)."""
        grid, block = self.validate(grid, block, shared_bytes)
        cu = _driver()
        self._allow_dynamic_shared(shared_bytes)
        values = [_kernel_argument(a) for a in args]
        pointers = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        stream = stream if stream is not None else cu.CUstream(0)
        if cluster == 1:
            check(cu.cuLaunchKernel(self.function, *grid, *block, shared_bytes, stream, ctypes.addressof(pointers), 0),
                  f"launching {self.name} (grid {grid}, block {block})")
            return
        key = (grid, block, shared_bytes, cluster)
        if key not in self._cluster_configs:  # built once per launch shape: a timing loop relaunches it
            threads = block[0] * block[1] * block[2]
            if self.max_active_clusters(threads, cluster, shared_bytes) == 0:
                raise LaunchConfigError(f"{self.name}: the GPU cannot place a cluster of {cluster} blocks of "
                                        f"{threads} threads")
            self._cluster_configs[key] = self._cluster_config(grid, block, shared_bytes, cluster)
        config = self._cluster_configs[key]
        config.hStream = stream
        check(cu.cuLaunchKernelEx(config, self.function, ctypes.addressof(pointers), 0),
              f"launching {self.name} (grid {grid}, block {block}, clusters of {cluster})")

    def _cluster_config(self, grid, block, shared_bytes: int, cluster: int):
        cu = _driver()
        if cluster not in (2, 4, 8, 16):
            raise LaunchConfigError(f"{self.name}: a cluster is 1, 2, 4, 8 or 16 blocks, got {cluster}")
        if grid[0] % cluster:
            raise LaunchConfigError(f"{self.name}: grid.x = {grid[0]} is not a multiple of the cluster size {cluster}")
        if cluster > 8 and not self._non_portable_clusters:
            # 16 blocks per cluster is Hopper-specific: the kernel must opt in.
            check(cu.cuFuncSetAttribute(
                self.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                f"allowing {self.name} clusters of {cluster} blocks")
            self._non_portable_clusters = True
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = shared_bytes
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = cluster, 1, 1
        config.attrs = [attribute]
        config.numAttrs = 1
        return config

    def max_active_clusters(self, block_threads: int, cluster: int, shared_bytes: int = 0) -> int:
        """Clusters of `cluster` blocks the whole GPU runs at once (cuOccupancyMaxActiveClusters):
        0 when such a cluster cannot be placed at all."""
        key = ("cluster", block_threads, cluster, shared_bytes)
        if key not in self._occupancy:
            gpu()
            self._allow_dynamic_shared(shared_bytes)
            config = self._cluster_config((cluster, 1, 1), (block_threads, 1, 1), shared_bytes, cluster)
            self._occupancy[key] = check(_driver().cuOccupancyMaxActiveClusters(self.function, config),
                                         "cuOccupancyMaxActiveClusters")
        return self._occupancy[key]

    def _allow_dynamic_shared(self, shared_bytes: int):
        # Without opting in, a block may have 48 KiB of shared memory in all, static included.
        allowed = max(self._dynamic_shared_opted_in, STATIC_SHARED_LIMIT - self.static_shared_bytes)
        if shared_bytes > allowed:
            cu = _driver()
            check(cu.cuFuncSetAttribute(
                self.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_bytes), f"raising {self.name}'s dynamic shared memory to {shared_bytes} bytes")
            self._dynamic_shared_opted_in = shared_bytes

    def max_active_blocks_per_sm(self, block_threads: int, shared_bytes: int = 0) -> int:
        """Resident blocks per SM, from the driver's occupancy calculator (after the
        opt-in that dynamic shared memory above 48 KiB needs)."""
        key = (block_threads, shared_bytes)
        if key not in self._occupancy:
            gpu()
            self._allow_dynamic_shared(shared_bytes)
            self._occupancy[key] = check(_driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
                self.function, block_threads, shared_bytes), "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return self._occupancy[key]


def copy_device_to_device(dst: DeviceArray, src: DeviceArray, nbytes: int = None):
    """The driver's own device-to-device copy (cuMemcpyDtoDAsync on the default stream)."""
    nbytes = min(dst.nbytes, src.nbytes) if nbytes is None else nbytes
    check(_driver().cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, _driver().CUstream(0)),
          "cuMemcpyDtoDAsync")
