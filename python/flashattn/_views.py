"""Tensors as the C library sees them: a pointer, a shape, strides in
elements, a dtype, and where the memory is. NumPy arrays and CPU DLPack
producers come in through NumPy; PyTorch tensors through flashattn._torch."""
import ctypes

import numpy as np

from ._lib import DTYPE_BF16, DTYPE_F16, DTYPE_F32

__all__ = ["View", "from_numpy", "as_numpy"]

_DLPACK_CPU = 1
# fa_tensor_desc needs 16-byte aligned offsets and strides (FA_ERR_MISALIGNED).
ALIGN = 16


class View:
    """One tensor: ptr (int), shape, strides (elements), dtype (fa_dtype),
    itemsize, device ("cpu", "cuda"), device_index, and obj, the object
    that owns the memory (kept alive while the view is)."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "itemsize", "device", "device_index", "obj")

    def __init__(self, ptr, shape, strides, dtype, itemsize, device, device_index, obj):
        self.ptr, self.shape, self.strides = ptr, tuple(shape), tuple(strides)
        self.dtype, self.itemsize = dtype, itemsize
        self.device, self.device_index, self.obj = device, device_index, obj

    def span_bytes(self):
        """Bytes from the first element to the end of the last one."""
        if any(n == 0 for n in self.shape):
            return 0
        return (sum((n - 1) * s for n, s in zip(self.shape, self.strides)) + 1) * self.itemsize

    def is_packed(self):
        """C-contiguous (sizes of 1 aside): the layout of the log-sum-exp."""
        expected = 1
        for n, s in reversed(list(zip(self.shape, self.strides))):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def is_canonical(self):
        """Whether the library can take an attention tensor as it is:
        head_dim contiguous, the other strides non-negative multiples of 16
        bytes, the first element 16-byte aligned. Anything else is copied
        first."""
        *outer, (last_n, last_s) = zip(self.shape, self.strides)
        if last_n > 1 and last_s != 1:
            return False
        if self.ptr % ALIGN:
            return False
        return all(n == 1 or (s > 0 and (s * self.itemsize) % ALIGN == 0) for n, s in outer)

    def desc_strides(self):
        """(stride_batch, stride_seq, stride_head) for fa_tensor_desc: a
        4-D [batch, seq, heads, dim] view, or a 3-D varlen [tokens, heads,
        dim] one (no batch stride). 0 (packed) where the size is 1, whose
        stride is never used."""
        outer = [0 if n == 1 else s for n, s in zip(self.shape[:-1], self.strides[:-1])]
        return tuple([0] * (3 - len(outer)) + outer)


_NUMPY_DTYPES = {np.dtype(np.float32): DTYPE_F32, np.dtype(np.float16): DTYPE_F16,
                 np.dtype(np.uint16): DTYPE_BF16}


def _fa_dtype(dtype):
    if dtype.name == "bfloat16":  # ml_dtypes' bfloat16, where installed
        return DTYPE_BF16
    try:
        return _NUMPY_DTYPES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported: float32, float16, and bfloat16 "
                        "(as uint16 bit patterns, or ml_dtypes.bfloat16)") from None


def as_numpy(x, name):
    """x as a NumPy array without a copy: an ndarray, or a CPU DLPack
    producer."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        device_type, _ = x.__dlpack_device__()
        if device_type != _DLPACK_CPU:
            raise TypeError(f"{name}: a DLPack tensor on device type {device_type} among host arrays")
        return np.from_dlpack(x)
    raise TypeError(f"{name} must be a NumPy array, a DLPack producer or a torch.Tensor, not {type(x).__name__}")


def from_numpy(a, name, packed=False):
    """A View of a NumPy input array (copied to a fresh C-contiguous array
    when the library cannot take it as it is); packed: the array must be
    C-contiguous (the log-sum-exp), else it is an attention tensor."""
    view = numpy_view(a)
    if not (view.is_packed() if packed else view.is_canonical()):
        view = numpy_view(np.array(a, order="C", copy=True))
    return view


def numpy_view(a):
    """A View of a NumPy array as it is (outputs: their layout is ours)."""
    strides = [s // a.itemsize for s in a.strides]
    return View(a.ctypes.data, a.shape, strides, _fa_dtype(a.dtype), a.itemsize, "cpu", 0, a)


def empty_numpy(shape, dtype, like_strides=None):
    """A NumPy array of shape; with like_strides (elements), laid out with
    those strides in storage of its own (gaps included)."""
    if like_strides is None:
        return np.empty(shape, dtype)
    span = sum((n - 1) * s for n, s in zip(shape, like_strides)) + 1 if all(shape) else 0
    storage = np.empty(span, dtype)
    item = storage.itemsize
    return np.lib.stride_tricks.as_strided(storage, shape, [s * item for s in like_strides])


def host_pointer(view):
    return ctypes.c_void_p(view.ptr)
