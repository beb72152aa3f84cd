"""flash_attn_with_kvcache: one step of attention against a KV cache
(fa_forward_kvcache), with FlashAttention's names and defaults: contiguous
or paged caches (block_table), new keys and values appended in place,
rotary embedding, causal masks and windows, softcap, ALiBi."""
import ctypes
import numbers

import numpy as np

from . import _attention, _lib, _views
from ._lib import DTYPE_F32, call

__all__ = ["flash_attn_with_kvcache"]


_CACHE_LAYOUT = ("head_dim must be contiguous, the other strides and the first element 16-byte aligned (it is "
                 "updated in place, so it cannot be copied)")
_TENSOR_ARGS = ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "block_table",
                "alibi_slopes")


def _host_array(x, name, dtype, ndim):
    """x as a C-contiguous NumPy array of dtype and ndim (a copy where it
    is not one already)."""
    a = np.ascontiguousarray(_views.as_numpy(x, name), dtype=dtype)
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, has shape {a.shape}")
    return a


def _raw_view(a):
    """A View of an int32 or fp32 array: only its memory matters."""
    return _views.View(a.ctypes.data, a.shape, [s // a.itemsize for s in a.strides], DTYPE_F32, a.itemsize, "cpu",
                       0, a)


def _cache_view(x, name):
    """The cache as it is: it is written in place, so it cannot be a copy."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array (it is updated in place), not {type(x).__name__}")
    view = _views.numpy_view(x)
    if not view.is_canonical():
        raise ValueError(f"{name}: {_CACHE_LAYOUT}")
    if not x.flags.writeable:
        raise ValueError(f"{name} is read-only (it is updated in place)")
    return view


class _NumpyArgs:
    """The arguments besides q, k and v as NumPy arrays (host memory)."""

    def __init__(self):
        self.adapter = _attention.NumpyAdapter()

    cache = staticmethod(_cache_view)

    @staticmethod
    def int32(x, name, ndim):
        return _raw_view(_host_array(x, name, np.int32, ndim))

    @staticmethod
    def full_int32(n, value):
        return _raw_view(np.full(n, value, np.int32))

    @staticmethod
    def fp32_table(x, name):
        return _raw_view(_host_array(x, name, np.float32, 2))


def _rows(view, rows):
    """The first rows rows of a C-contiguous 2-D view (contiguous too)."""
    return _views.View(view.ptr, (rows,) + view.shape[1:], view.strides, view.dtype, view.itemsize, view.device,
                       view.device_index, view.obj)


def _array_kind(named):
    """"torch" or "numpy": torch tensors and NumPy arrays (or other
    DLPack producers) do not mix (cache_seqlens may be an int with either)."""
    from ._api import _is_torch  # noqa: import cycle at module level

    given = [(n, x) for n, x in named
             if x is not None and not (n == "cache_seqlens" and isinstance(x, numbers.Integral))]
    torch_names = [n for n, x in given if _is_torch(x)]
    if not torch_names:
        return "numpy"
    others = [n for n, x in given if not _is_torch(x)]
    if others:
        raise TypeError(f"flash_attn_with_kvcache takes torch tensors or NumPy arrays, not both: "
                        f"{', '.join(torch_names)} torch, {', '.join(others)} not")
    return "torch"


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, block_table=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None, rotary_interleaved=True, softmax_scale=None,
                            return_softmax_lse=False, *, backend=None, device=None):
    """Attention of q [batch, seqlen_q, heads_q, head_dim] over a KV cache,
    as FlashAttention's flash_attn_with_kvcache.

    k_cache, v_cache: [batch, seqlen_cache, heads_kv, head_dim], or with
    block_table pools of pages [num_pages, page_size, heads_kv, head_dim]
    (page_size a multiple of 16 up to 256); updated in place where k and v
    are given, so never copied: they must be laid out as the library takes
    them (head_dim contiguous, the other strides and the first element
    16-byte aligned). k, v: [batch, seqlen_new, heads_kv, head_dim],
    written into the cache at cache_seqlens[b] and attended to.
    cache_seqlens: int or int32 [batch], tokens in each cache before the
    call (None: the whole capacity; not updated, as in FlashAttention).
    block_table: int32 [batch, max_pages]; the capacity is max_pages x
    page_size. rotary_cos, rotary_sin: [seqlen_ro >= capacity, rotary_dim
    / 2], applied to q and k (rotary_interleaved: pairs (2i, 2i + 1), else
    (i, i + rotary_dim / 2)); queries at cache_seqlens + i under a causal
    mask or a window, else at cache_seqlens. softcap, alibi_slopes
    ([heads_q] fp32), causal (bottom-right aligned), window_size and
    softmax_scale as in flash_attn_func. A sequence whose length or pages
    break these rules gets NaN and appends nothing. Returns out (as q), or
    (out, softmax_lse [batch, heads_q, seqlen_q]) with return_softmax_lse.
    backend, device: as flash_attn_func (host arrays run on the best
    device present by default, CUDA tensors on their GPU).

    The tensors are NumPy arrays (q, k, v may be CPU DLPack producers) or
    torch tensors, all on one device, not a mix (cache_seqlens may be an
    int with either); torch tensors give torch tensors back, on q's
    device. CUDA tensors are used in place and the call runs on PyTorch's
    current stream, as flash_attn_func's; torch's cache_seqlens and
    block_table must be int32. Host memory on a device backend (OpenCL) is
    copied in and back out around the call, the caches included, so they
    hold the appended tokens when the call returns. Not differentiable
    (as FlashAttention's): out has no gradient."""
    from ._api import select_context  # noqa: import cycle at module level

    named = tuple(zip(_TENSOR_ARGS, (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table,
                                     alibi_slopes)))
    kind = _array_kind(named)
    if (k is None) != (v is None):
        raise ValueError("k and v go together (the tokens to append)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin go together")
    if kind == "torch":
        from . import _torch
        args = _torch.KvcacheArgs(q)
        if alibi_slopes is not None:
            args.check_device(alibi_slopes, "alibi_slopes")
    else:
        args = _NumpyArgs()
    adapter = args.adapter
    qv = adapter.view(q, "q")
    kc, vc = args.cache(k_cache, "k_cache"), args.cache(v_cache, "v_cache")
    if len(qv.shape) != 4 or len(kc.shape) != 4 or kc.shape != vc.shape:
        raise ValueError(f"q must be [batch, seqlen_q, heads_q, head_dim] and k_cache, v_cache of one shape "
                         f"[batch or pages, seqlen or page_size, heads_kv, head_dim]; have {qv.shape}, {kc.shape} "
                         f"and {vc.shape}")
    batch, seqlen_q, heads_q, head_dim = qv.shape
    heads_kv = kc.shape[2]
    if kc.shape[3] != head_dim:
        raise ValueError(f"q and k_cache must have the same head_dim, have {head_dim} and {kc.shape[3]}")

    paged = block_table is not None
    table = None
    if paged:
        table = args.int32(block_table, "block_table", 2)
        if table.shape[0] != batch:
            raise ValueError(f"block_table must have batch = {batch} rows, has {table.shape[0]}")
        page_size, num_pages = kc.shape[1], kc.shape[0]
        capacity = table.shape[1] * page_size
    else:
        if kc.shape[0] != batch:
            raise ValueError(f"k_cache must have batch = {batch} sequences, has {kc.shape[0]}")
        page_size, num_pages, capacity = 0, 0, kc.shape[1]

    new = None
    if k is not None:
        new = (adapter.view(k, "k"), adapter.view(v, "v"))
        if len(new[0].shape) != 4 or new[0].shape != new[1].shape or new[0].shape[0] != batch or \
                new[0].shape[2:] != (heads_kv, head_dim):
            raise ValueError(f"k and v must be [batch, seqlen_new, heads_kv, head_dim] = [{batch}, n, {heads_kv}, "
                             f"{head_dim}], have {new[0].shape} and {new[1].shape}")
    seqlen_new = new[0].shape[1] if new else 0

    if cache_seqlens is None:
        lens = args.full_int32(batch, capacity)
    elif isinstance(cache_seqlens, numbers.Integral) or (kind == "numpy" and np.ndim(cache_seqlens) == 0):
        lens = args.full_int32(batch, int(cache_seqlens))
    elif kind == "torch" and cache_seqlens.dim() == 0:  # one length for all, kept on its device
        lens = args.int32(cache_seqlens.expand(batch), "cache_seqlens", 1)
    else:
        lens = args.int32(cache_seqlens, "cache_seqlens", 1)
        if lens.shape[0] != batch:
            raise ValueError(f"cache_seqlens must have batch = {batch} entries, has {lens.shape[0]}")

    tables = None
    rotary_dim = 0
    if rotary_cos is not None:
        cos_t = args.fp32_table(rotary_cos, "rotary_cos")
        sin_t = args.fp32_table(rotary_sin, "rotary_sin")
        if cos_t.shape != sin_t.shape or cos_t.shape[0] < capacity:
            raise ValueError(f"rotary_cos and rotary_sin must be one shape [seqlen_ro >= {capacity}, rotary_dim / 2], "
                             f"have {cos_t.shape} and {sin_t.shape}")
        rotary_dim = 2 * cos_t.shape[1]
        tables = (_rows(cos_t, capacity), _rows(sin_t, capacity))

    opts = _attention.Options(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                              alibi_slopes=alibi_slopes)
    out_obj, out = adapter.empty(qv.shape, qv)
    lse_obj, lse = adapter.empty((batch, heads_q, seqlen_q), None)
    desc, _, make_base = _attention.describe((batch, seqlen_q, capacity, heads_q, heads_kv, head_dim), qv, kc, vc,
                                             out, opts)
    desc.kv_cache = 1
    desc.page_size, desc.num_pages = page_size, num_pages
    desc.seqlen_new = seqlen_new
    if new:
        _attention._tensor_desc(desc.k_new, new[0])
        _attention._tensor_desc(desc.v_new, new[1])
    desc.rotary_dim = rotary_dim
    desc.rotary_interleaved = int(bool(rotary_interleaved)) if rotary_dim else 0
    key = ("kvcache", bytes(desc), None if opts.alibi_slopes is None else opts.alibi_slopes.tobytes())

    ctx = select_context([qv, kc, vc], backend, device)
    with ctx.lock:
        plan = ctx.plan(key, make_base)
        adapter.before(ctx)
        with _attention._Buffers(ctx) as b:
            append = new is not None
            call_args = _lib.KvcacheArgs(
                q=b.bind(qv), k_cache=b.bind(kc, inout=append), v_cache=b.bind(vc, inout=append),
                o=b.bind(out, True), lse=b.bind(lse, True), cache_seqlens=b.bind(lens),
                block_table=b.bind(table) if paged else None,
                k_new=b.bind(new[0]) if append else None, v_new=b.bind(new[1]) if append else None,
                rotary_cos=b.bind(tables[0]) if tables else None,
                rotary_sin=b.bind(tables[1]) if tables else None)
            call("fa_forward_kvcache", plan, ctypes.byref(call_args))
            b.finish()
            adapter.after(ctx)
    return (out_obj, lse_obj) if return_softmax_lse else out_obj
