"""flash_attn_with_kvcache: one step of attention against a KV cache
(fa_forward_kvcache), with FlashAttention's names and defaults: contiguous
or paged caches (block_table), new keys and values appended in place,
rotary embedding, causal masks and windows, softcap, ALiBi."""
import ctypes

import numpy as np

from . import _attention, _lib, _views
from ._lib import DTYPE_F32, call

__all__ = ["flash_attn_with_kvcache"]


def _host_array(x, name, dtype, ndim):
    """x as a C-contiguous NumPy array of dtype and ndim (a copy where it
    is not one already)."""
    if hasattr(x, "detach"):  # a torch tensor: read on the host
        x = x.detach().cpu().numpy()
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
        raise ValueError(f"{name}: head_dim must be contiguous, the other strides and the first element 16-byte "
                         f"aligned (it is updated in place, so it cannot be copied)")
    if not x.flags.writeable:
        raise ValueError(f"{name} is read-only (it is updated in place)")
    return view


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, block_table=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None, rotary_interleaved=True, softmax_scale=None,
                            return_softmax_lse=False, *, backend=None, device=None):
    """Attention of q [batch, seqlen_q, heads_q, head_dim] over a KV cache,
    as FlashAttention's flash_attn_with_kvcache.

    k_cache, v_cache: [batch, seqlen_cache, heads_kv, head_dim], or with
    block_table pools of pages [num_pages, page_size, heads_kv, head_dim]
    (page_size a multiple of 16 up to 256); NumPy arrays, updated in place
    where k and v are given. k, v: [batch, seqlen_new, heads_kv, head_dim],
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
    device present by default)."""
    from ._api import _is_torch, select_context  # noqa: import cycle at module level

    if _is_torch(q, k_cache, v_cache, k, v):
        raise TypeError("flash_attn_with_kvcache takes NumPy arrays (and CPU DLPack producers for q, k, v) for now")
    if (k is None) != (v is None):
        raise ValueError("k and v go together (the tokens to append)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin go together")
    adapter = _attention.NumpyAdapter()
    qv = adapter.view(q, "q")
    kc, vc = _cache_view(k_cache, "k_cache"), _cache_view(v_cache, "v_cache")
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
        table = _host_array(block_table, "block_table", np.int32, 2)
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
        lens = np.full(batch, capacity, np.int32)
    elif np.ndim(cache_seqlens) == 0:
        lens = np.full(batch, int(cache_seqlens), np.int32)
    else:
        lens = _host_array(cache_seqlens, "cache_seqlens", np.int32, 1)
        if lens.shape[0] != batch:
            raise ValueError(f"cache_seqlens must have batch = {batch} entries, has {lens.shape[0]}")

    tables = None
    rotary_dim = 0
    if rotary_cos is not None:
        cos_t = _host_array(rotary_cos, "rotary_cos", np.float32, 2)
        sin_t = _host_array(rotary_sin, "rotary_sin", np.float32, 2)
        if cos_t.shape != sin_t.shape or cos_t.shape[0] < capacity:
            raise ValueError(f"rotary_cos and rotary_sin must be one shape [seqlen_ro >= {capacity}, rotary_dim / 2], "
                             f"have {cos_t.shape} and {sin_t.shape}")
        rotary_dim = 2 * cos_t.shape[1]
        tables = (np.ascontiguousarray(cos_t[:capacity]), np.ascontiguousarray(sin_t[:capacity]))

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
        with _attention._Buffers(ctx) as b:
            append = new is not None
            args = _lib.KvcacheArgs(
                q=b.bind(qv), k_cache=b.bind(kc, inout=append), v_cache=b.bind(vc, inout=append),
                o=b.bind(out, True), lse=b.bind(lse, True), cache_seqlens=b.bind(_raw_view(lens)),
                block_table=b.bind(_raw_view(table)) if paged else None,
                k_new=b.bind(new[0]) if append else None, v_new=b.bind(new[1]) if append else None,
                rotary_cos=b.bind(_raw_view(tables[0])) if tables else None,
                rotary_sin=b.bind(_raw_view(tables[1])) if tables else None)
            call("fa_forward_kvcache", plan, ctypes.byref(args))
            b.finish()
    return (out_obj, lse_obj) if return_softmax_lse else out_obj
