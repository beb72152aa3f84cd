"""One attention problem through the C API: the descriptor from the
tensors' shapes, strides and the options, the plan (cached per context),
buffers over the tensors' memory, the forward and backward calls.

Array libraries plug in through an adapter (NumpyAdapter here, the PyTorch
one in flashattn._torch): it turns arrays into Views, allocates outputs and
orders the library's work after and before its own."""
import ctypes
import secrets

import numpy as np

from . import _lib, _views
from ._lib import ALGORITHMS, call, lib

__all__ = ["Options", "NumpyAdapter", "Runner", "describe", "forward", "backward"]


class Options:
    """Everything of fa_attention_desc that is not a tensor shape or layout,
    with flash_attn_func's names and defaults."""

    def __init__(self, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                 deterministic=False, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                 max_seqlen_k=None, dropout_seed=None, dropout_offset=0, block_mask=None, block_size=None,
                 algorithm="fused", allow_tf32=False, softcap=0.0, alibi_slopes=None):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, not {algorithm!r}")
        if len(window_size) != 2:
            raise ValueError(f"window_size must be (left, right), not {window_size!r}")
        if (block_mask is None) != (block_size is None):
            raise ValueError("block_mask and block_size=(block_q, block_k) go together")
        self.dropout_p = float(dropout_p)
        self.softmax_scale = 0.0 if softmax_scale is None else float(softmax_scale)
        self.causal = bool(causal)
        self.window = (int(window_size[0]), int(window_size[1]))
        self.deterministic = bool(deterministic)
        self.varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        if self.varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
            raise ValueError("variable-length batches need both cu_seqlens_q and cu_seqlens_k")
        self.cu_seqlens_q = _int32_host(cu_seqlens_q, "cu_seqlens_q")
        self.cu_seqlens_k = _int32_host(cu_seqlens_k, "cu_seqlens_k")
        self.max_seqlen_q, self.max_seqlen_k = max_seqlen_q, max_seqlen_k
        # A seed drawn here cannot be given to a later backward call: only
        # autograd (which keeps it) may rely on it.
        self.seed_drawn = self.dropout_p > 0 and dropout_seed is None
        if self.seed_drawn:
            dropout_seed = secrets.randbits(64)
        self.dropout_seed = 0 if dropout_seed is None else int(dropout_seed)
        self.dropout_offset = int(dropout_offset)
        self.block_mask = None if block_mask is None else np.ascontiguousarray(block_mask, dtype=np.uint8)
        self.block_size = None if block_size is None else (int(block_size[0]), int(block_size[1]))
        self.algorithm = ALGORITHMS[algorithm]
        self.allow_tf32 = bool(allow_tf32)
        self.softcap = float(softcap)
        self.alibi_slopes = None
        if alibi_slopes is not None:
            if hasattr(alibi_slopes, "detach"):  # a torch tensor: the C API copies slopes from the host
                alibi_slopes = alibi_slopes.detach().cpu().numpy()
            self.alibi_slopes = np.ascontiguousarray(_views.as_numpy(alibi_slopes, "alibi_slopes"), dtype=np.float32)
            if self.alibi_slopes.ndim != 1:
                raise ValueError("alibi_slopes must be 1-D (one slope per query head)")


def _int32_host(x, name):
    if x is None:
        return None
    if hasattr(x, "detach"):  # a torch tensor, maybe on a GPU: the C API reads offsets on the host
        x = x.detach().cpu().numpy()
    a = np.ascontiguousarray(_views.as_numpy(x, name))
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer array (batch + 1 cumulative offsets)")
    return a.astype(np.int32)


class NumpyAdapter:
    """NumPy arrays and CPU DLPack producers in, NumPy arrays out."""

    def view(self, x, name, packed=False):
        return _views.from_numpy(_views.as_numpy(x, name), name, packed)

    def empty(self, shape, like, like_strides=None):
        dtype = np.float32 if like is None else like.obj.dtype
        a = _views.empty_numpy(shape, dtype, like_strides)
        return a, _views.numpy_view(a)

    def default_context(self, views):
        return ("any", -1)

    def before(self, ctx):
        pass

    def after(self, ctx):
        pass


def _problem(q, k, v, opts):
    """(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim) from the
    shapes; what the descriptor cannot express (K and V of different
    shapes) is refused here, the rest is checked by the library."""
    want = 3 if opts.varlen else 4
    layout = "[total_tokens, heads, head_dim]" if opts.varlen else "[batch, seqlen, heads, head_dim]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != want:
            raise ValueError(f"{name} must have {want} dimensions {layout}, has shape {t.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, have {k.shape} and {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim, have {q.shape[-1]} and {k.shape[-1]}")
    if not opts.varlen:
        if q.shape[0] != k.shape[0]:
            raise ValueError(f"q and k must have the same batch, have {q.shape[0]} and {k.shape[0]}")
        return q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]
    batch = len(opts.cu_seqlens_q) - 1
    if len(opts.cu_seqlens_k) - 1 != batch:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1)")
    longest_q = opts.max_seqlen_q if opts.max_seqlen_q is not None else int(np.max(np.diff(opts.cu_seqlens_q)))
    longest_k = opts.max_seqlen_k if opts.max_seqlen_k is not None else int(np.max(np.diff(opts.cu_seqlens_k)))
    return batch, int(longest_q), int(longest_k), q.shape[1], k.shape[1], q.shape[2]


def _tensor_desc(td, view):
    td.dtype = view.dtype
    td.offset = 0
    td.stride_batch, td.stride_seq, td.stride_head = view.desc_strides()


def describe(dims, q, k, v, o, opts):
    """(desc, key, make_desc) of a problem of dims (batch, seqlen_q,
    seqlen_k, heads_q, heads_kv, head_dim) over views laid out as q, k, v, o
    with opts: the key holds everything of the problem (the dropout seed and
    offset aside), make_desc() gives the descriptor with its host arrays,
    which must stay alive until the plan is created (it copies them)."""
    desc = _lib.AttentionDesc()
    lib.fa_attention_desc_init(ctypes.byref(desc))
    (desc.batch, desc.seqlen_q, desc.seqlen_k, desc.heads_q, desc.heads_kv, desc.head_dim) = dims
    for field, view in (("q", q), ("k", k), ("v", v), ("o", o)):
        _tensor_desc(getattr(desc, field), view)
    desc.softmax_scale = opts.softmax_scale
    desc.causal = int(opts.causal)
    desc.window_left, desc.window_right = opts.window
    desc.dropout_p = opts.dropout_p
    desc.algorithm = opts.algorithm
    desc.deterministic = int(opts.deterministic)
    desc.allow_tf32 = int(opts.allow_tf32)
    desc.softcap = opts.softcap
    if opts.block_mask is not None:
        desc.block_mask_bytes = opts.block_mask.nbytes
        desc.block_q, desc.block_k = opts.block_size
    # The host arrays the descriptor points to are part of the problem: the
    # key holds their bytes, the descriptor (pointers NULL so far, dropout
    # seed and offset 0: they are set per call) the rest.
    key = (bytes(desc),) + tuple(None if a is None else a.tobytes()
                                 for a in (opts.cu_seqlens_q, opts.cu_seqlens_k, opts.block_mask,
                                           opts.alibi_slopes))

    def make_desc():
        if opts.alibi_slopes is not None:
            if opts.alibi_slopes.shape[0] != desc.heads_q:
                raise ValueError(f"alibi_slopes has {opts.alibi_slopes.shape[0]} entries, not heads_q = {desc.heads_q}")
            desc.alibi_slopes = opts.alibi_slopes.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if opts.block_mask is not None:
            desc.block_mask = opts.block_mask.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        if opts.varlen:
            desc.cu_seqlens_q = opts.cu_seqlens_q.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            desc.cu_seqlens_k = opts.cu_seqlens_k.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        return desc

    return desc, key, make_desc


class Runner:
    """How the passes run: here one device's plan (fa_plan_create,
    fa_forward, fa_backward); flashattn._ring's runs a ring over ranks."""

    def plan(self, ctx, q, k, v, o, opts):
        """The context's plan for this problem and layout, seeded for this
        call (call under ctx.lock, which keeps the seed until the pass is
        queued)."""
        _, key, make_desc = describe(_problem(q, k, v, opts), q, k, v, o, opts)
        plan = ctx.plan(key, make_desc)
        if opts.dropout_p > 0:
            call("fa_plan_set_dropout_seed", plan, opts.dropout_seed, opts.dropout_offset)
        return plan

    def forward(self, plan, *buffers):
        call("fa_forward", plan, *buffers)

    def backward(self, plan, *buffers):
        call("fa_backward", plan, *buffers)


LOCAL = Runner()


class _Buffers:
    """fa_buffers over views: device memory and (on the reference backend)
    host memory are wrapped in place; host memory for a device backend is
    copied in, and outputs copied back, around the call."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.handles = []
        self.copy_back = []

    def __enter__(self):
        return self

    def bind(self, view, output=False, inout=False):
        """A buffer over view: an input (uploaded where copied), an output
        (downloaded), or with inout both (a cache the call appends to)."""
        handle = ctypes.c_void_p()
        size = view.span_bytes()
        if view.device != "cpu" or self.ctx.backend == "reference":
            if view.device != "cpu" and view.device != self.ctx.backend:
                raise ValueError(f"a tensor on {view.device}:{view.device_index} cannot run on the "
                                 f"{self.ctx.backend} backend")
            call("fa_buffer_wrap", self.ctx.handle, ctypes.c_void_p(view.ptr), size, ctypes.byref(handle))
            self.handles.append(handle)
        else:
            call("fa_buffer_alloc", self.ctx.handle, size, ctypes.byref(handle))
            self.handles.append(handle)
            if output or inout:
                self.copy_back.append((handle, view, size))
            if not output:
                call("fa_buffer_upload", handle, 0, ctypes.c_void_p(view.ptr), size)
        return handle

    def finish(self):
        for handle, view, size in self.copy_back:
            call("fa_buffer_download", handle, 0, ctypes.c_void_p(view.ptr), size)

    def __exit__(self, *exc):
        for handle in self.handles:
            lib.fa_buffer_free(handle)


def _lse_shape(q, opts):
    if opts.varlen:
        return (q.shape[1], q.shape[0])          # [heads_q, total_q]
    return (q.shape[0], q.shape[2], q.shape[1])  # [batch, heads_q, seqlen_q]


def forward(adapter, ctx, q, k, v, opts, runner=LOCAL):
    """O and the log-sum-exp of views q, k, v: (o, lse) as the adapter's
    arrays."""
    o_obj, o = adapter.empty(q.shape, q)
    lse_obj, lse = adapter.empty(_lse_shape(q, opts), None)
    with ctx.lock:
        plan = runner.plan(ctx, q, k, v, o, opts)
        adapter.before(ctx)
        with _Buffers(ctx) as b:
            handles = [b.bind(q), b.bind(k), b.bind(v), b.bind(o, True), b.bind(lse, True)]
            runner.forward(plan, *handles)
            b.finish()
            adapter.after(ctx)
    return o_obj, lse_obj


def backward(adapter, ctx, dout, q, k, v, o, lse, opts, runner=LOCAL):
    """dQ, dK, dV (laid out as Q, K and V are) as the adapter's arrays. dO
    takes O's layout in the descriptor, so the two must agree."""
    if dout.strides != o.strides or dout.shape != o.shape:
        raise ValueError("dout must have the shape and strides of out")
    dq_obj, dq = adapter.empty(q.shape, q, q.strides)
    dk_obj, dk = adapter.empty(k.shape, k, k.strides)
    dv_obj, dv = adapter.empty(v.shape, v, v.strides)
    with ctx.lock:
        plan = runner.plan(ctx, q, k, v, o, opts)
        adapter.before(ctx)
        with _Buffers(ctx) as b:
            handles = [b.bind(q), b.bind(k), b.bind(v), b.bind(o), b.bind(lse), b.bind(dout),
                       b.bind(dq, True), b.bind(dk, True), b.bind(dv, True)]
            runner.backward(plan, *handles)
            b.finish()
            adapter.after(ctx)
    return dq_obj, dk_obj, dv_obj
