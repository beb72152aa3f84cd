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


def test_cpu_score_options(backend):
    """softcap, ALiBi and attn_bias (expanded over the batch: stride 0)
    through autograd; a bias that asks for a gradient is refused, as the
    library gives it none."""
    q, k, v, dout = _inputs("cpu", torch.float32, (2, 40, 4, 32), (2, 56, 2, 32))
    g = torch.Generator().manual_seed(9)
    bias = torch.randn(1, 4, 40, 56, generator=g).expand(2, 4, 40, 56)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    kw = dict(causal=True, softcap=2.0, alibi_slopes=slopes, attn_bias=bias, backend=backend)
    out = flashattn.flash_attn_func(q, k, v, **kw)
    out.backward(dout)
    as64 = lambda t: t.detach().double().cpu().numpy()
    o_ref, _, dq, dk, dv = batched_fp64(as64(q), as64(k), as64(v), as64(dout), causal=True, softcap=2.0,
                                        alibi_slopes=slopes.numpy(), bias=as64(bias[:1]))
    assert rel_error(as64(out), o_ref) < 1e-4
    for t, want in ((q, dq), (k, dk), (v, dv)):
        assert rel_error(as64(t.grad), want) < 1e-4
    with pytest.raises(ValueError, match="detach"):
        flashattn.flash_attn_func(q, k, v, attn_bias=bias.clone().requires_grad_(), backend=backend)


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


def test_cuda_runs_on_the_current_stream():
    """The calls queue on PyTorch's current stream: behind a torch op still
    running there, with no host wait (the call returns while the stream is
    busy), and with the result a call after a synchronize gives; on the
    default stream the context holds CU_STREAM_LEGACY."""
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        pytest.skip("no CUDA device")
    q, k, v, _ = (t.detach() for t in _inputs("cuda", torch.float16))
    want = flashattn.flash_attn_func(q, k, v, causal=True)  # also builds the plan
    ctx = flashattn.context("cuda", q.device.index or 0)
    assert ctx.native()[1] == 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1 << 30)  # about half a second of GPU time
        late_q = q * 1.0  # written only after the sleep
        out = flashattn.flash_attn_func(late_q, k, v, causal=True)
        busy = not side.query()
        assert ctx.native()[1] == side.cuda_stream
    side.synchronize()
    assert busy, "the call waited for the stream on the host"
    assert torch.equal(out, want)
