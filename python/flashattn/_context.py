"""Devices and contexts: which devices exist, one context per device for
the whole process (opening one compiles nothing but may probe bandwidth), and
each context's plans, reused while the same problem comes back."""
import collections
import ctypes
import threading

from . import _lib
from ._lib import BACKENDS, BACKEND_NAMES, call, lib

__all__ = ["Device", "devices", "backend_status", "Context", "context"]

Device = collections.namedtuple("Device", "backend index name vendor arch type driver_version global_mem_bytes")
Device.__doc__ = "A device of one backend; (backend, index) selects it."

_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "accelerator"}


def _device(info):
    d = info.desc
    return Device(BACKEND_NAMES.get(info.backend, str(info.backend)), info.index, d.name.decode(),
                  d.vendor.decode(), d.arch.decode(), _DEVICE_TYPES.get(d.type, str(d.type)),
                  info.driver_version.decode(), d.global_mem_bytes)


def devices():
    """Every device of every backend whose runtime loaded, best order first
    within each backend (the CPU reference is one of them)."""
    count = ctypes.c_int()
    call("fa_device_count", ctypes.byref(count))
    found = []
    for i in range(count.value):
        info = _lib.DeviceInfo()
        call("fa_device_get_info", i, ctypes.byref(info))
        found.append(_device(info))
    return found


def backend_status(backend):
    """(available, reason): whether a backend was compiled in and its
    runtime loaded, and if not, why."""
    reason = ctypes.create_string_buffer(512)
    status = lib.fa_backend_get_status(_backend_code(backend), reason, len(reason))
    return status == _lib.Status.FA_SUCCESS, reason.value.decode()


def _backend_code(backend):
    try:
        return BACKENDS[backend]
    except KeyError:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, not {backend!r}") from None


class Context:
    """An open device. Calls on one context are serialised by its lock (the
    C API asks callers to serialise them); plans are cached by problem."""

    PLAN_CACHE_SIZE = 32

    def __init__(self, backend="any", device=-1):
        handle = ctypes.c_void_p()
        call("fa_context_create", _backend_code(backend), int(device), ctypes.byref(handle))
        self.handle = handle
        info = _lib.DeviceInfo()
        call("fa_context_get_info", handle, ctypes.byref(info))
        self.device = _device(info)
        self.backend = self.device.backend
        self.lock = threading.RLock()
        self._plans = collections.OrderedDict()

    def __repr__(self):
        return f"<flashattn.Context {self.backend}:{self.device.index} {self.device.name}>"

    def native(self):
        """(native context, native queue) as integers: cl_context and
        cl_command_queue, CUcontext and CUstream, HIP ordinal and stream."""
        c, q = ctypes.c_void_p(), ctypes.c_void_p()
        call("fa_context_get_native", self.handle, ctypes.byref(c), ctypes.byref(q))
        return c.value or 0, q.value or 0

    def synchronize(self):
        call("fa_context_synchronize", self.handle)

    def plan(self, key, make_desc):
        """The plan of a problem: cached under key (every field of the
        descriptor and the host arrays it points to), else created from
        make_desc(), whose result must stay alive until fa_plan_create
        returns (it copies masks and offsets)."""
        with self.lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan
            desc = make_desc()
            handle = ctypes.c_void_p()
            call("fa_plan_create", self.handle, ctypes.byref(desc), ctypes.byref(handle))
            self._plans[key] = handle
            while len(self._plans) > self.PLAN_CACHE_SIZE:
                _, old = self._plans.popitem(last=False)
                lib.fa_plan_destroy(old)
            return handle


_contexts = {}
_contexts_lock = threading.Lock()


def context(backend="any", device=-1):
    """The process-wide context of (backend, device index), opened once."""
    key = (backend, int(device))
    with _contexts_lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = _contexts[key] = Context(backend, device)
        return ctx
