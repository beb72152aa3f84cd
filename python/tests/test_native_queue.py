"""Context.set_native_queue (fa_context_set_native_queue) from Python. On
OpenCL, a second cl_command_queue of the context's cl_context, made through
the ICD loader with ctypes, carries the calls, and a queue of another
cl_context is refused; the reference backend takes no queue. (PyTorch's
current CUDA stream: test_torch.py.)"""
import ctypes

import pytest

import flashattn
from conftest import REQUIRED, batched_fp64, random, rel_error

CL_QUEUE_DEVICE = 0x1091
_P = ctypes.c_void_p


def _opencl():
    """The ICD loader, with the few calls used here declared."""
    available, reason = flashattn.backend_status("opencl")
    if not available:
        if "opencl" in REQUIRED:
            pytest.fail(f"backend opencl is required (FA_TEST_REQUIRE_BACKENDS) but unavailable: {reason}")
        pytest.skip(f"backend opencl unavailable: {reason}")
    cl = ctypes.CDLL("libOpenCL.so.1")
    cl.clGetCommandQueueInfo.argtypes = [_P, ctypes.c_uint, ctypes.c_size_t, _P, _P]
    cl.clCreateContext.restype = _P
    cl.clCreateContext.argtypes = [_P, ctypes.c_uint, ctypes.POINTER(_P), _P, _P, ctypes.POINTER(ctypes.c_int)]
    cl.clCreateCommandQueue.restype = _P
    cl.clCreateCommandQueue.argtypes = [_P, _P, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    cl.clReleaseCommandQueue.argtypes = [_P]
    cl.clReleaseContext.argtypes = [_P]
    return cl


def _device_of(cl, queue):
    device = _P()
    assert cl.clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, ctypes.sizeof(device), ctypes.byref(device), None) == 0
    return device


def _new_queue(cl, context, device):
    err = ctypes.c_int()
    queue = cl.clCreateCommandQueue(context, device, 0, ctypes.byref(err))
    assert err.value == 0 and queue
    return queue


def test_opencl_caller_queue_carries_the_calls(rng):
    cl = _opencl()
    ctx = flashattn.context("opencl", -1)
    context, own = ctx.native()
    mine = _new_queue(cl, context, _device_of(cl, own))
    q, k, v = (random(rng, (2, 40, 4, 32)) for _ in range(3))
    try:
        ctx.set_native_queue(mine)
        assert ctx.native()[1] == mine
        out = flashattn.flash_attn_func(q, k, v, causal=True, backend="opencl")
        assert rel_error(out, batched_fp64(q, k, v, causal=True)[0]) < 1e-5
        assert ctx.native()[1] == mine
    finally:
        ctx.set_native_queue(None)
        cl.clReleaseCommandQueue(mine)
    assert ctx.native()[1] == own


def test_opencl_queue_of_another_context_refused():
    cl = _opencl()
    ctx = flashattn.context("opencl", -1)
    _, own = ctx.native()
    device = _device_of(cl, own)
    err = ctypes.c_int()
    other = cl.clCreateContext(None, 1, ctypes.byref(device), None, None, ctypes.byref(err))
    assert err.value == 0 and other
    foreign = _new_queue(cl, other, device)
    try:
        with pytest.raises(flashattn.FlashAttnError) as e:
            ctx.set_native_queue(foreign)
        assert e.value.status == flashattn.Status.FA_ERR_INVALID_ARGUMENT
        assert "another cl_context" in e.value.message and e.value.function == "fa_context_set_native_queue"
        assert ctx.native()[1] == own
    finally:
        cl.clReleaseCommandQueue(foreign)
        cl.clReleaseContext(other)


def test_reference_takes_no_queue():
    ctx = flashattn.context("reference", -1)
    ctx.set_native_queue(None)
    with pytest.raises(flashattn.FlashAttnError) as e:
        ctx.set_native_queue(0x1234)
    assert e.value.status == flashattn.Status.FA_ERR_UNSUPPORTED
    assert ctx.native() == (0, 0)
