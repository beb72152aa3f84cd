"""PyTorch tensors: a torch.autograd.Function running the forward and
backward passes on the tensors' own memory.

CUDA (and ROCm) tensors are wrapped where they lie (fa_buffer_wrap): no
copy. The context runs on PyTorch's current stream
(fa_context_set_native_queue), so the passes are ordered with the torch ops
around them as torch's own kernels are, and no call waits on the host.
PyTorch's streams come from a pool that lives as long as the process, so
the context may keep the last one after a call. One exception: ROCm's null
stream (PyTorch's default there) has no handle the C API can take, so on it
a call waits for PyTorch's stream before it starts and for the library's
before it returns. CPU tensors run on the CPU reference in place, or on an
OpenCL device through copies."""
import torch

from . import _api, _attention, _views
from ._lib import DTYPE_BF16, DTYPE_F16, DTYPE_F32

__all__ = ["FlashAttnFunction", "RingAttnFunction", "KvcacheArgs", "attention", "ring_attention"]

_DTYPES = {torch.float32: DTYPE_F32, torch.float16: DTYPE_F16, torch.bfloat16: DTYPE_BF16}
# cudaStream_t 0, PyTorch's default stream, is the legacy default stream;
# the C API takes it by this handle (CU_STREAM_LEGACY), as NULL means the
# context's own stream.
_CU_STREAM_LEGACY = 0x1


def _backend_of(device):
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return "hip" if getattr(torch.version, "hip", None) else "cuda"
    raise TypeError(f"tensors on {device.type} are not supported: cpu or cuda")


def _view(t):
    return _views.View(t.data_ptr(), t.shape, t.stride(), _DTYPES[t.dtype], t.element_size(),
                       _backend_of(t.device), t.device.index or 0, t)


class TorchAdapter:
    """torch tensors in and out, on one device."""

    def __init__(self, device):
        self.device = device
        self._wait_after = False

    def view(self, t, name, packed=False):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor like the other inputs, not {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} is not supported: float32, float16, bfloat16")
        if t.device != self.device:
            raise ValueError(f"{name} is on {t.device}, the other tensors on {self.device}")
        v = _view(t.detach())
        if not (v.is_packed() if packed else v.is_canonical()):
            v = _view(t.detach().clone(memory_format=torch.contiguous_format))
        return v

    def bias_view(self, t):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attn_bias must be a torch.Tensor like the other inputs, not {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"attn_bias: dtype {t.dtype} is not supported: float32, or the inputs' dtype")
        if t.device != self.device:
            raise ValueError(f"attn_bias is on {t.device}, the other tensors on {self.device}")
        if not 2 <= t.dim() <= 4:
            raise ValueError(f"attn_bias must have 2 to 4 dimensions [batch, heads, seqlen_q, seqlen_k] (leading "
                             f"ones may be left out), has shape {tuple(t.shape)}")
        t = t.detach()[(None,) * (4 - t.dim())]
        if (t.shape[-1] > 1 and t.stride(-1) != 1) or (t.shape[2] > 1 and t.stride(2) == 0):
            t = t.contiguous()  # the key index contiguous, rows apart
        return _view(t)

    def empty(self, shape, like, like_strides=None):
        dtype = torch.float32 if like is None else like.obj.dtype
        if like_strides is None:
            t = torch.empty(shape, dtype=dtype, device=self.device)
        else:
            t = torch.empty_strided(shape, like_strides, dtype=dtype, device=self.device)
        return t, _view(t)

    def before(self, ctx):
        """The context's work goes to PyTorch's current stream."""
        if self.device.type == "cpu" or ctx.backend != _backend_of(self.device):
            return  # host memory; or a mismatch, which binding the tensors reports
        stream = torch.cuda.current_stream(self.device)
        handle = stream.cuda_stream
        if handle == 0 and ctx.backend == "cuda":
            handle = _CU_STREAM_LEGACY
        self._wait_after = handle == 0
        if self._wait_after:  # ROCm's null stream: the context's own, waits on the host
            ctx.set_native_queue(None)
            stream.synchronize()
        else:
            ctx.set_native_queue(handle)

    def after(self, ctx):
        if self._wait_after:
            ctx.synchronize()


class FlashAttnFunction(torch.autograd.Function):
    """(out, softmax_lse) = FlashAttnFunction.apply(q, k, v, opts, backend,
    device); softmax_lse is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, opts, backend, device):
        adapter = TorchAdapter(q.device)
        views = [adapter.view(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"))]
        fa_ctx = _api.select_context(views, backend, device)
        out, lse = _attention.forward(adapter, fa_ctx, *views, opts)
        # The tensors as the plan saw them (a misaligned input was copied).
        ctx.save_for_backward(*(view.obj for view in views), out, lse)
        ctx.fa = (fa_ctx, opts)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        fa_ctx, opts = ctx.fa
        adapter = TorchAdapter(q.device)
        # dO takes O's layout (packed) in the descriptor.
        dout = adapter.view(dout.contiguous(), "dout")
        views = [adapter.view(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"))]
        views.append(adapter.view(lse, "lse", packed=True))
        dq, dk, dv = _attention.backward(adapter, fa_ctx, dout, *views, opts)
        return dq, dk, dv, None, None, None


def attention(q, k, v, opts, backend, device):
    return FlashAttnFunction.apply(q, k, v, opts, backend, device)


class RingAttnFunction(torch.autograd.Function):
    """(out, softmax_lse) = RingAttnFunction.apply(q, k, v, opts, group,
    layout, backend, device, context): ring attention over this rank's
    tokens (flashattn._ring); the backward pass is a ring too, so every
    rank of the group runs it."""

    @staticmethod
    def forward(ctx, q, k, v, opts, group, layout, backend, device, context):
        from . import _ring
        adapter = TorchAdapter(q.device)
        # Packed tensors: the plans are cached by layout, which is then the
        # same on every rank, as the collective plan creation needs.
        views = [adapter.view(t, n, packed=True) for t, n in ((q, "q"), (k, "k"), (v, "v"))]
        fa_ctx = context if context is not None else _api.select_context(views, backend, device)
        runner = _ring.RingRunner(_ring.communicator(group, q.device if q.is_cuda else None), layout)
        out, lse = _attention.forward(adapter, fa_ctx, *views, opts, runner)
        ctx.save_for_backward(*(view.obj for view in views), out, lse)
        ctx.fa = (fa_ctx, opts, runner)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        fa_ctx, opts, runner = ctx.fa
        adapter = TorchAdapter(q.device)
        dout = adapter.view(dout.contiguous(), "dout", packed=True)
        views = [adapter.view(t, n, packed=True) for t, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"))]
        views.append(adapter.view(lse, "lse", packed=True))
        dq, dk, dv = _attention.backward(adapter, fa_ctx, dout, *views, opts, runner)
        return dq, dk, dv, None, None, None, None, None, None


def ring_attention(q, k, v, opts, group, layout, backend, device, context):
    return RingAttnFunction.apply(q, k, v, opts, group, layout, backend, device, context)


def _raw(t):
    """A View of an int32 or fp32 tensor: only its memory matters."""
    return _views.View(t.data_ptr(), t.shape, t.stride(), DTYPE_F32, t.element_size(), _backend_of(t.device),
                       t.device.index or 0, t)


class KvcacheArgs:
    """flash_attn_with_kvcache's arguments besides q, k and v as torch
    tensors on q's device. The caches are wrapped as they are (appended to
    in place, never copied: where they lie in host memory and the backend
    is a device one, the call copies them in and back out around the
    kernel, as every host tensor is); cache_seqlens, block_table and the
    rotary tables are made int32 or fp32 and contiguous on that device by
    torch ops on the current stream, which the call then runs on, so CUDA
    tensors are never read on the host (alibi_slopes aside: the plan copies
    them from host memory, as flash_attn_func's)."""

    def __init__(self, q):
        self.device = q.device
        self.adapter = TorchAdapter(q.device)

    def check_device(self, t, name):
        if t.device != self.device:
            raise ValueError(f"{name} is on {t.device}, the other tensors on {self.device}")

    def _checked(self, t, name, ndim):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor like the other inputs, not {type(t).__name__}")
        self.check_device(t, name)
        if t.dim() != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions, has shape {tuple(t.shape)}")
        return t.detach()

    def cache(self, t, name):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor like the other inputs, not {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} is not supported: float32, float16, bfloat16")
        self.check_device(t, name)
        from ._kvcache import _CACHE_LAYOUT
        view = _view(t.detach())
        if not view.is_canonical():
            raise ValueError(f"{name}: {_CACHE_LAYOUT}")
        return view

    def int32(self, t, name, ndim):
        t = self._checked(t, name, ndim)
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, not {t.dtype}")
        return _raw(t.contiguous())

    def full_int32(self, n, value):
        return _raw(torch.full((n,), value, dtype=torch.int32, device=self.device))

    def fp32_table(self, t, name):
        t = self._checked(t, name, 2)
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, not {t.dtype}")
        return _raw(t.to(torch.float32).contiguous())
