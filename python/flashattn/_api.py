"""The public functions, named and defaulted as flash_attn's
flash_attn_func and flash_attn_varlen_func, plus the backward passes for
callers without autograd."""
import numpy as np

from . import _attention, _context

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_backward", "flash_attn_varlen_backward"]

_OPTIONS_DOC = """
    backend: "any", "reference", "opencl", "cuda" or "hip"; device: the index
    within the backend (-1: its best). By default CUDA tensors run on their
    own GPU through the CUDA backend, host memory on the best device
    present. Keyword options: dropout_seed, dropout_offset (the Philox
    counter of the dropout mask; a fresh seed per call when not given, and
    the backward pass needs the forward's), block_mask (uint8
    [ceil(seqlen_q / block_q), ceil(seqlen_k / block_k)], 0 masks a block)
    with block_size=(block_q, block_k), algorithm ("fused", or "standard":
    S and P in memory), allow_tf32 (fp32 inputs may use TF32 units),
    softcap and alibi_slopes (one fp32 slope per query head, host memory)
    as in FlashAttention, and attn_bias, an additive bias [batch or 1,
    heads_q or 1, seqlen_q, seqlen_k] (leading dimensions of 1 may be left
    out; fp32 or the inputs' dtype; not with varlen; it gets no gradient):
    the reference and OpenCL backends compute them, the others refuse them
    (FA_ERR_UNSUPPORTED). Failures of the library raise FlashAttnError
    (status and message)."""


def _is_torch(*xs):
    return any(type(x).__module__.startswith("torch") for x in xs)


def select_context(views, backend, device):
    """The context a call runs on: as asked, else the device holding the
    tensors (device memory), else the best device present (host memory)."""
    on_device = [t for t in views if t.device != "cpu"]
    if backend is None:
        backend = on_device[0].device if on_device else "any"
    if device is None:
        device = on_device[0].device_index if on_device and on_device[0].device == backend else -1
    return _context.context(backend, device)


def _on_device(x):
    """Whether x is a DLPack producer whose memory is not on the CPU."""
    return not isinstance(x, np.ndarray) and hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] != 1


def _forward(q, k, v, opts, return_softmax_lse, backend, device):
    if not _is_torch(q, k, v) and any(_on_device(x) for x in (q, k, v)):
        # Device memory of another library (CuPy, JAX, ...): PyTorch takes
        # it without a copy, runs it as its own, and the results go back
        # through DLPack the same way (torch tensors out).
        try:
            import torch
        except ImportError:
            raise TypeError("DLPack tensors in device memory need PyTorch installed (it holds the outputs); "
                            "host memory works without it") from None
        q, k, v = (torch.from_dlpack(x) for x in (q, k, v))
    if _is_torch(q, k, v):
        from . import _torch
        out, lse = _torch.attention(q, k, v, opts, backend, device)
    else:
        adapter = _attention.NumpyAdapter()
        views = [adapter.view(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"))]
        out, lse = _attention.forward(adapter, select_context(views, backend, device), *views, opts)
    return (out, lse) if return_softmax_lse else out


def _backward(dout, q, k, v, out, softmax_lse, opts, backend, device):
    if _is_torch(dout, q, k, v, out, softmax_lse):
        raise TypeError("PyTorch tensors get their gradients through autograd: call .backward()")
    if opts.seed_drawn:
        raise ValueError("dropout_p > 0: give the forward call's dropout_seed (and dropout_offset)")
    if getattr(dout, "strides", None) != getattr(out, "strides", None):
        dout, out = np.ascontiguousarray(dout), np.ascontiguousarray(out)  # dO takes O's layout
    adapter = _attention.NumpyAdapter()
    named = ((dout, "dout"), (q, "q"), (k, "k"), (v, "v"), (out, "out"), (softmax_lse, "softmax_lse"))
    views = [adapter.view(x, n, packed=(n == "softmax_lse")) for x, n in named]
    ctx = select_context(views, backend, device)
    return _attention.backward(adapter, ctx, *views, opts)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    deterministic=False, return_softmax_lse=False, *, backend=None, device=None, **options):
    """Attention of q [batch, seqlen_q, heads_q, head_dim] over k, v [batch,
    seqlen_k, heads_kv, head_dim] (heads_q a multiple of heads_kv: MQA,
    GQA). softmax_scale: 1/sqrt(head_dim) when None. causal: bottom-right
    aligned when seqlen_q != seqlen_k. window_size=(left, right): keys
    visible around the diagonal, -1 unlimited. Returns out (as q), and with
    return_softmax_lse=True (out, softmax_lse [batch, heads_q, seqlen_q],
    float32)."""
    opts = _attention.Options(dropout_p, softmax_scale, causal, window_size, deterministic, **options)
    return _forward(q, k, v, opts, return_softmax_lse, backend, device)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           deterministic=False, return_softmax_lse=False, *, backend=None, device=None,
                           **options):
    """Variable-length batches: q [total_q, heads_q, head_dim], k, v
    [total_k, heads_kv, head_dim], the tokens of every sequence packed one
    after the other; cu_seqlens_q, cu_seqlens_k: batch + 1 cumulative
    offsets (int32). max_seqlen_*: the longest sequence (computed when
    None). softmax_lse is [heads_q, total_q]. Other arguments as
    flash_attn_func."""
    opts = _attention.Options(dropout_p, softmax_scale, causal, window_size, deterministic,
                              cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                              max_seqlen_k=max_seqlen_k, **options)
    return _forward(q, k, v, opts, return_softmax_lse, backend, device)


def flash_attn_backward(dout, q, k, v, out, softmax_lse, dropout_p=0.0, softmax_scale=None, causal=False,
                        window_size=(-1, -1), deterministic=False, *, backend=None, device=None, **options):
    """(dq, dk, dv) of flash_attn_func's problem from its inputs, out,
    softmax_lse and dout (the gradient of out), laid out as q, k and v; the
    options must be the forward call's, dropout_seed included."""
    opts = _attention.Options(dropout_p, softmax_scale, causal, window_size, deterministic, **options)
    return _backward(dout, q, k, v, out, softmax_lse, opts, backend, device)


def flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                               max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                               window_size=(-1, -1), deterministic=False, *, backend=None, device=None,
                               **options):
    """(dq, dk, dv) of flash_attn_varlen_func's problem; as
    flash_attn_backward."""
    opts = _attention.Options(dropout_p, softmax_scale, causal, window_size, deterministic,
                              cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                              max_seqlen_k=max_seqlen_k, **options)
    return _backward(dout, q, k, v, out, softmax_lse, opts, backend, device)


for _f in (flash_attn_func, flash_attn_varlen_func, flash_attn_backward, flash_attn_varlen_backward):
    _f.__doc__ += "\n" + _OPTIONS_DOC
