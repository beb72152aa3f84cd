"""PyTorch tensors through autograd, against the NumPy fp64 attention:
CPU tensors on the backends of conftest.py, CUDA tensors on the CUDA
backend where a GPU is present. Skipped where PyTorch is not installed."""
import numpy as np
import pytest

import flashattn
from conftest import batched_fp64, rel_error

torch = pytest.importorskip("torch")


def _inputs(device, dtype, shape_q=(2, 96, 4, 64), shape_kv=(2, 128, 2, 64)):
    g = torch.Generator().manual_seed(5)
    make = lambda s: torch.randn(s, generator=g).to(device=device, dtype=dtype).requires_grad_()
    return make(shape_q), make(shape_kv), make(shape_kv), torch.randn(shape_q, generator=g).to(device, dtype)


def _check(q, k, v, dout, tol, **kw):
    out = flashattn.flash_attn_func(q, k, v, causal=True, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    out.backward(dout)
    as64 = lambda t: t.detach().double().cpu().numpy()
    o_ref, _, dq, dk, dv = batched_fp64(as64(q), as64(k), as64(v), as64(dout), causal=True)
    assert rel_error(as64(out), o_ref) < tol
    for t, want in ((q, dq), (k, dk), (v, dv)):
        assert rel_error(as64(t.grad), want) < tol


def test_cpu_tensors(backend):
    q, k, v, dout = _inputs("cpu", torch.float32)
    _check(q, k, v, dout, 1e-4, backend=backend)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("float16", 5e-3), ("bfloat16", 3e-2)])
def test_cuda_tensors_in_place(dtype, tol):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q, k, v, dout = _inputs("cuda", getattr(torch, dtype))
    _check(q, k, v, dout, tol)


def test_cuda_packed_qkv_strided():
    """q, k, v sliced from one packed tensor: used with their strides, and
    the gradients land in a tensor of the same layout."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    qkv = torch.randn(2, 64, 3, 4, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    q, k, v = qkv.unbind(2)
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    out.sum().backward()
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.detach().transpose(1, 2).float() for t in (q, k, v)),
                                                           is_causal=True).transpose(1, 2)
    assert rel_error(out.detach().float().cpu().numpy(), ref.cpu().numpy()) < 5e-3
    assert qkv.grad is not None and torch.isfinite(qkv.grad).all()


def test_cuda_dlpack_producer():
    """Device memory from any DLPack producer (a wrapper here, so the torch
    path is not taken directly) runs in place and comes back as tensors."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")

    class Producer:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, *args, **kwargs):
            return self.t.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    q, k, v, _ = _inputs("cuda", torch.float16)
    out = flashattn.flash_attn_func(*(Producer(t.detach()) for t in (q, k, v)), causal=True)
    want = flashattn.flash_attn_func(q.detach(), k.detach(), v.detach(), causal=True)
    assert isinstance(out, torch.Tensor) and out.is_cuda
    assert rel_error(out.float().cpu().numpy(), want.float().cpu().numpy()) < 1e-3


def test_lse_is_returned_and_not_differentiable():
    q, k, v, _ = _inputs("cpu", torch.float32, (1, 32, 2, 32), (1, 32, 2, 32))
    out, lse = flashattn.flash_attn_func(q, k, v, return_softmax_lse=True, backend="reference")
    assert lse.shape == (1, 2, 32) and lse.dtype == torch.float32 and not lse.requires_grad
    assert np.isfinite(lse.numpy()).all()
