"""Ring attention: one attention whose tokens are spread over ranks
(fa_dist_plan_create and the passes of the C API's "Context
parallelism").

The ranks exchange bytes through a transport written in Python: ctypes
callbacks fill the C API's fa_transport with device_memory = 0, so the
library stages device buffers through host memory and hands the
callbacks host pointers, which reach the transport as uint8 NumPy arrays.
Transports plug in: TorchTransport moves the bytes with torch.distributed
(a process a rank), ThreadTransport between threads of one process (a
mailbox of messages per rank), and any Transport subclass may be given.

A Communicator owns the fa_comm, the callbacks (alive as long as it is)
and its distributed plans, cached per context and problem as the
contexts cache theirs; every rank makes the same calls in the same order,
so every rank hits or misses its cache alike, as the collective plan
creation needs. A Python exception in a callback never crosses into C:
it is kept, the callback fails (FA_ERR_LAUNCH) and the exception is
raised again once the C call has returned."""
import collections
import ctypes
import threading

import numpy as np

from . import _api, _attention, _lib
from ._lib import CP_LAYOUTS, FlashAttnError, Status, call, check, lib

__all__ = ["Transport", "ThreadTransport", "TorchTransport", "Communicator", "communicator", "ring_attention",
           "ring_attention_backward", "cp_shard", "cp_unshard"]


class Transport:
    """How the ranks of a ring exchange bytes (the C API's fa_transport,
    in Python). A subclass sets rank and world and defines:

    - start(send, to, recv, source): begin sending the bytes of send to
      rank `to` and receiving recv's size of bytes from rank `source`
      (send and recv are uint8 NumPy arrays over host memory, valid until
      the transfer's wait returns); returns a token for wait. The ring
      starts at most two at a time, and every rank starts its transfers in
      the same order: the n-th start of one rank sends what the n-th start
      of the next receives.
    - wait(token): both halves are complete: recv is filled, send may be
      reused.
    - agree(values): a collective: every rank calls it at the same points
      with an int64 array of the same length; returns the element-wise
      maximum over the ranks.
    - all_gather(array) (for cp_unshard only): every rank's array, in rank
      order.
    - close(): called once, when the communicator goes."""

    rank = 0
    world = 1

    def start(self, send, to, recv, source):
        raise NotImplementedError

    def wait(self, token):
        raise NotImplementedError

    def agree(self, values):
        raise NotImplementedError

    def all_gather(self, array):
        raise NotImplementedError(f"{type(self).__name__} cannot gather (cp_unshard needs all_gather)")

    def close(self):
        pass


class _Hub:
    """What the threads of a ThreadTransport share: every rank's mailbox
    and the meeting point of the collectives."""

    def __init__(self, world, timeout):
        self.world, self.timeout = world, timeout
        self.cond = threading.Condition()
        self.mail = [dict() for _ in range(world)]  # rank -> {(source, sequence): bytes}
        self.arrived, self.generation = 0, 0
        self.contributions, self.result = [None] * world, None

    def collective(self, rank, value, combine):
        """Every rank's value in, combine([values in rank order]) out to
        every rank."""
        with self.cond:
            generation = self.generation
            self.contributions[rank] = value
            self.arrived += 1
            if self.arrived == self.world:
                self.result = combine(self.contributions)
                self.contributions = [None] * self.world
                self.arrived = 0
                self.generation += 1
                self.cond.notify_all()
            elif not self.cond.wait_for(lambda: self.generation != generation, self.timeout):
                raise TimeoutError(f"rank {rank}: the other ranks did not join the collective within "
                                   f"{self.timeout} s")
            return self.result


class ThreadTransport(Transport):
    """Ranks that are threads of one process: ThreadTransport.create(world)
    gives one transport a rank. A message is a copy of the sent bytes put
    in the receiver's mailbox (so the sender's buffer is free at once),
    matched by its sender and its place in the sender's order of starts;
    a wait or a collective that does not complete within timeout seconds
    raises TimeoutError (in the ring: the call fails rather than hangs).
    Each rank needs a context of its own (ring_attention's context=): a
    context runs one call at a time, and a rank waits inside its call for
    the others."""

    def __init__(self, hub, rank):
        self.hub, self.rank, self.world = hub, rank, hub.world
        self._sequence = 0

    @classmethod
    def create(cls, world, timeout=120.0):
        hub = _Hub(world, timeout)
        return [cls(hub, rank) for rank in range(world)]

    def start(self, send, to, recv, source):
        with self.hub.cond:
            self.hub.mail[to][(self.rank, self._sequence)] = bytes(send)
            self.hub.cond.notify_all()
        token = (recv, source, self._sequence)
        self._sequence += 1
        return token

    def wait(self, token):
        recv, source, sequence = token
        box, key = self.hub.mail[self.rank], (source, sequence)
        with self.hub.cond:
            if not self.hub.cond.wait_for(lambda: key in box, self.hub.timeout):
                raise TimeoutError(f"rank {self.rank}: no message {sequence} from rank {source} within "
                                   f"{self.hub.timeout} s")
            data = box.pop(key)
        if len(data) != recv.nbytes:
            raise ValueError(f"rank {self.rank}: message {sequence} from rank {source} has {len(data)} bytes, "
                             f"the receive {recv.nbytes}")
        recv[:] = np.frombuffer(data, np.uint8)

    def agree(self, values):
        return self.hub.collective(self.rank, np.array(values, np.int64),
                                   lambda all_values: np.maximum.reduce(all_values))

    def all_gather(self, array):
        return self.hub.collective(self.rank, np.array(array), list)


class TorchTransport(Transport):
    """The ranks of a torch.distributed process group (None: the default
    one), a process a rank. Transfers are dist.batch_isend_irecv pairs
    (a send to the next rank and a receive from the previous one, posted
    together so that NCCL cannot deadlock on them), agree an all_reduce
    MAX. Host memory goes as it is to backends that move CPU tensors (Gloo,
    MPI, UCC); for the others (NCCL) it is copied through tensors of
    `device` (default: the current CUDA device)."""

    def __init__(self, group=None, device=None):
        import torch
        import torch.distributed as dist
        self._torch, self._dist = torch, dist
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        backend = str(dist.get_backend(self.group)).lower()
        self.staging = None
        if not any(name in backend for name in ("gloo", "mpi", "ucc")):
            self.staging = torch.device(device) if device is not None else torch.device(
                "cuda", torch.cuda.current_device())
        get_global_rank = getattr(dist, "get_global_rank", None) or getattr(dist.distributed_c10d,
                                                                            "_get_global_rank")
        # Ranks of the group as the p2p calls name them (global ranks).
        self._global = [r if self.group is dist.group.WORLD else get_global_rank(self.group, r)
                        for r in range(self.world)]

    def start(self, send, to, recv, source):
        torch, dist = self._torch, self._dist
        send_t, recv_t = torch.from_numpy(send), torch.from_numpy(recv)
        staged = None
        if self.staging is not None:
            send_t = send_t.to(self.staging)
            staged = torch.empty(recv_t.shape, dtype=torch.uint8, device=self.staging)
        ops = [dist.P2POp(dist.isend, send_t, self._global[to], self.group),
               dist.P2POp(dist.irecv, recv_t if staged is None else staged, self._global[source], self.group)]
        return dist.batch_isend_irecv(ops), send_t, recv_t, staged

    def wait(self, token):
        requests, _send, recv_t, staged = token
        for request in requests:
            request.wait()
        if staged is not None:
            recv_t.copy_(staged)  # to pageable host memory: the host waits for it

    def agree(self, values):
        t = self._torch.from_numpy(np.array(values, np.int64))
        if self.staging is not None:
            t = t.to(self.staging)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return t.cpu().numpy()


# A failing callback's status: a transfer or a collective did not happen.
_CALLBACK_FAILED = int(Status.FA_ERR_LAUNCH)


def _host_bytes(pointer, size):
    if not size:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_uint8)), shape=(size,))


class _Bridge:
    """What the callbacks share: the transport, the transfers in flight and
    the first exception a callback raised, kept for the caller of the C
    function. The callbacks are closures over it (not its methods), so a
    communicator makes no reference cycle and goes when its last user does."""

    def __init__(self, transport):
        self.transport = transport
        self.pending = {}
        self.next_token = 1
        self.error = None

    def failed(self, error):
        if self.error is None:
            self.error = error
        return _CALLBACK_FAILED


def _callbacks(bridge):
    """fa_transport's start, wait and agree over bridge, as ctypes
    function pointers: each catches every exception (nothing may cross
    into C), keeps it and fails."""

    def start(_impl, _queue, send, send_bytes, to, recv, recv_bytes, source, pending):
        try:
            token = bridge.transport.start(_host_bytes(send, send_bytes), to, _host_bytes(recv, recv_bytes), source)
            key = bridge.next_token
            bridge.next_token += 1
            bridge.pending[key] = token
            pending[0] = key
            return 0
        except BaseException as e:  # noqa: B036
            return bridge.failed(e)

    def wait(_impl, _queue, key):
        try:
            bridge.transport.wait(bridge.pending.pop(key))
            return 0
        except BaseException as e:  # noqa: B036
            return bridge.failed(e)

    def agree(_impl, values, count):
        try:
            mine = np.ctypeslib.as_array(values, shape=(count,))
            result = np.asarray(bridge.transport.agree(mine.copy()), np.int64)
            if result.shape != (count,):
                raise ValueError(f"{type(bridge.transport).__name__}.agree returned shape {result.shape}, "
                                 f"not ({count},)")
            mine[:] = result
            return 0
        except BaseException as e:  # noqa: B036
            return bridge.failed(e)

    return _lib.TRANSPORT_START(start), _lib.TRANSPORT_WAIT(wait), _lib.TRANSPORT_AGREE(agree)


# Plans of communicators that went, each with its context: destroyed where
# nothing runs on their context. A communicator may go at any point of
# another call (the garbage collector runs where it runs: inside a
# transport's wait, or a rank's callback in the middle of its ring), where
# destroying a plan there could deadlock on the context's lock or break
# the call in flight.
_graveyard = collections.deque()


def _bury(ctx, plan):
    _graveyard.append((ctx, plan))


def _collect():
    """Destroys the buried plans whose context no other thread is using
    (its lock, taken without waiting). Call where this thread runs no call
    on a context either (Communicator.plan: before its call starts)."""
    for _ in range(len(_graveyard)):
        try:
            ctx, plan = _graveyard.popleft()
        except IndexError:
            return
        if ctx.lock.acquire(blocking=False):
            try:
                lib.fa_dist_plan_destroy(plan)
            finally:
                ctx.lock.release()
        else:
            _graveyard.append((ctx, plan))


class Communicator:
    """An fa_comm over a Transport, with the distributed plans made on it.
    Calls on one communicator run one at a time (its lock); every rank
    makes the same calls in the same order."""

    PLAN_CACHE_SIZE = 16

    def __init__(self, transport):
        self.transport = transport
        self.rank, self.world = int(transport.rank), int(transport.world)
        self._bridge = _Bridge(transport)
        self._callbacks = _callbacks(self._bridge)  # alive as long as the fa_comm
        t = _lib.Transport(self.rank, self.world, 0, None, *self._callbacks, _lib.TRANSPORT_RELEASE())
        handle = ctypes.c_void_p()
        call("fa_comm_create", ctypes.byref(t), ctypes.byref(handle))
        self.handle = handle
        self.lock = threading.RLock()
        self._plans = collections.OrderedDict()

    def __repr__(self):
        return f"<flashattn.Communicator rank {self.rank} of {self.world} over {type(self.transport).__name__}>"

    def call(self, name, *args):
        """The C function name, whose transfers run through this
        communicator's callbacks: a callback's exception is raised here
        (from the library's error), else a failure as FlashAttnError."""
        with self.lock:
            if self.handle is None:
                raise ValueError("the communicator is closed")
            self._bridge.error = None
            status = getattr(lib, name)(*args)
            error, self._bridge.error = self._bridge.error, None
            if error is None:
                check(status, name)
                return
            try:
                check(status, name)
            except FlashAttnError as library_error:
                raise error from library_error
            raise error

    def plan(self, ctx, key, make_desc, layout):
        """The distributed plan of a problem on context ctx (collective
        when made: every rank asks for the same problems in the same
        order). Call under ctx.lock."""
        key = (ctx.handle.value, layout) + tuple(key)
        with self.lock:
            _collect()
            cached = self._plans.get(key)
            if cached is not None:
                self._plans.move_to_end(key)
                return cached[1]
            desc = make_desc()
            handle = ctypes.c_void_p()
            self.call("fa_dist_plan_create", ctx.handle, self.handle, ctypes.byref(desc), layout,
                      ctypes.byref(handle))
            self._plans[key] = (ctx, handle)
            while len(self._plans) > self.PLAN_CACHE_SIZE:
                _bury(*self._plans.popitem(last=False)[1])
            _collect()
            return handle

    def plan_summaries(self):
        """fa_dist_plan_format of each cached plan (the steps, their pieces,
        the bytes moved a step), least recently used first."""
        out = []
        with self.lock:
            for _, handle in self._plans.values():
                size = lib.fa_dist_plan_format(handle, None, 0) + 1
                text = ctypes.create_string_buffer(size)
                lib.fa_dist_plan_format(handle, text, size)
                out.append(text.value.decode())
        return out

    def close(self):
        """Destroys the fa_comm and closes the transport; the plans go
        now where nothing runs on their contexts, else at a later plan."""
        with self.lock:
            self._release()
        _collect()

    def _release(self):
        if self.handle is None:
            return
        for ctx, plan in self._plans.values():
            _bury(ctx, plan)
        self._plans.clear()
        lib.fa_comm_destroy(self.handle)  # frees it: no callback, no context touched
        self.handle = None
        self.transport.close()

    def __del__(self):
        # Wherever the collector runs: no lock, no plan destroyed here.
        try:
            if getattr(self, "handle", None) is not None and lib is not None:
                self._release()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


_torch_comms = {}
_torch_comms_lock = threading.Lock()


def communicator(group=None, device=None):
    """The Communicator of group: a Communicator as it is; a Transport's
    own (made once); else a torch.distributed process group (None: the
    default one), whose TorchTransport communicator is made once per group
    and staging device."""
    if isinstance(group, Communicator):
        return group
    if isinstance(group, Transport):
        comm = getattr(group, "_flashattn_communicator", None)
        if comm is None:
            comm = group._flashattn_communicator = Communicator(group)
        return comm
    try:
        import torch.distributed as dist
    except ImportError:
        raise TypeError("group must be a flashattn Communicator or Transport (torch.distributed, for process "
                        "groups, is not installed)") from None
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring attention over a process group needs torch.distributed initialised "
                           "(dist.init_process_group), or a flashattn Communicator or Transport as group")
    group = group if group is not None else dist.group.WORLD
    backend = str(dist.get_backend(group)).lower()
    staged = not any(name in backend for name in ("gloo", "mpi", "ucc"))
    key = (group, str(device) if staged and device is not None else None)
    with _torch_comms_lock:
        comm = _torch_comms.get(key)
        if comm is None:
            comm = _torch_comms[key] = Communicator(TorchTransport(group, device if staged else None))
        return comm


def _layout_code(layout, causal):
    if layout is None:
        layout = "zigzag" if causal else "contiguous"
    try:
        return CP_LAYOUTS[layout]
    except KeyError:
        raise ValueError(f"layout must be one of {sorted(CP_LAYOUTS)}, not {layout!r}") from None


class RingRunner(_attention.Runner):
    """The passes as a ring over comm's ranks: the views are this rank's
    tokens, the problem is the whole sequence (world times as long)."""

    def __init__(self, comm, layout):
        self.comm, self.layout = comm, layout

    def plan(self, ctx, q, k, v, o, opts, bias=None):
        if opts.varlen:
            raise ValueError("ring attention takes fixed-length batches [batch, seqlen, heads, head_dim]")
        if bias is not None:
            raise ValueError("ring attention takes no attn_bias (the library's ring refuses the score options)")
        batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = _attention._problem(q, k, v, opts)
        dims = (batch, seqlen_q * self.comm.world, seqlen_k * self.comm.world, heads_q, heads_kv, head_dim)
        _, key, make_desc = _attention.describe(dims, q, k, v, o, opts)
        return self.comm.plan(ctx, key, make_desc, self.layout)

    def forward(self, plan, *buffers, bias=None):
        self.comm.call("fa_dist_forward", plan, *buffers)

    def backward(self, plan, *buffers, bias=None):
        self.comm.call("fa_dist_backward", plan, *buffers)


def _options(causal, window_size, softmax_scale, deterministic, options):
    if "dropout_p" in options:
        raise TypeError("ring attention from Python has no dropout yet (the library's ring has it; these bindings "
                        "do not yet give its plans a seed per call, fa_dist_plan_set_dropout_seed)")
    return _attention.Options(0.0, softmax_scale, causal, window_size, deterministic, **options)


def ring_attention(q, k, v, group=None, causal=False, window_size=(-1, -1), softmax_scale=None, layout=None,
                   return_softmax_lse=False, backend=None, device=None, *, context=None, deterministic=False,
                   **options):
    """Attention over a sequence whose tokens are spread over the ranks of
    group: q [batch, seqlen_q / world, heads_q, head_dim] and k, v [batch,
    seqlen_k / world, heads_kv, head_dim] are this rank's tokens as layout
    cuts the whole sequence ("zigzag" by default when causal, where it
    balances the work, else "contiguous"; cp_shard cuts a whole tensor so).
    Every rank of the group calls it with the same problem; the chunks of
    K and V travel around the ring. Returns this rank's out (as q), and
    with return_softmax_lse=True (out, softmax_lse [batch, heads_q,
    seqlen_q / world]), equal to flash_attn_func's on the whole sequence
    cut the same way.

    group: a torch.distributed process group (None: the default one), or
    a flashattn Communicator or Transport (ThreadTransport, or your own).
    causal, window_size, softmax_scale as flash_attn_func, on the whole
    sequence. PyTorch tensors get their gradients through autograd (the
    backward pass is a ring too); NumPy arrays through
    ring_attention_backward. backend, device: as flash_attn_func;
    context: a flashattn.Context to run on instead (ranks that are
    threads of one process need one each). Keyword options:
    deterministic, algorithm, allow_tf32, block_mask with block_size (of
    the whole sequence); the library refuses, on every rank alike, what
    its ring cannot do (FlashAttnError, FA_ERR_UNSUPPORTED)."""
    code = _layout_code(layout, causal)
    opts = _options(causal, window_size, softmax_scale, deterministic, options)
    if _api._is_torch(q, k, v):
        from . import _torch
        out, lse = _torch.ring_attention(q, k, v, opts, group, code, backend, device, context)
    else:
        adapter = _attention.NumpyAdapter()
        views = [adapter.view(x, n, packed=True) for x, n in ((q, "q"), (k, "k"), (v, "v"))]
        ctx = context if context is not None else _api.select_context(views, backend, device)
        runner = RingRunner(communicator(group), code)
        out, lse = _attention.forward(adapter, ctx, *views, opts, runner)
    return (out, lse) if return_softmax_lse else out


def ring_attention_backward(dout, q, k, v, out, softmax_lse, group=None, causal=False, window_size=(-1, -1),
                            softmax_scale=None, layout=None, backend=None, device=None, *, context=None,
                            deterministic=False, **options):
    """(dq, dk, dv) of ring_attention's problem, this rank's tokens, for
    callers without autograd (NumPy arrays): from its inputs, out,
    softmax_lse and dout (the gradient of out); the arguments must be the
    forward call's. Collective, as the forward."""
    if _api._is_torch(dout, q, k, v, out, softmax_lse):
        raise TypeError("PyTorch tensors get their gradients through autograd: call .backward()")
    code = _layout_code(layout, causal)
    opts = _options(causal, window_size, softmax_scale, deterministic, options)
    adapter = _attention.NumpyAdapter()
    named = ((dout, "dout"), (q, "q"), (k, "k"), (v, "v"), (out, "out"), (softmax_lse, "softmax_lse"))
    views = [adapter.view(x, n, packed=True) for x, n in named]
    ctx = context if context is not None else _api.select_context(views, backend, device)
    return _attention.backward(adapter, ctx, *views, opts, RingRunner(communicator(group), code))


# ---------------------------------------------------------------- layouts


def _rank_world(group):
    if isinstance(group, (Communicator, Transport)):
        return int(group.rank), int(group.world)
    import torch.distributed as dist
    group = group if group is not None else dist.group.WORLD
    return dist.get_rank(group), dist.get_world_size(group)


def cp_parts(layout, n, world, rank):
    """[(start, length, local)]: where rank's parts of a sequence of n
    tokens lie in the whole sequence (start) and in the rank's tensors
    (local), as fa_cp_part gives them."""
    code = _layout_code(layout, False)
    parts = []
    for part in range(2 if code == CP_LAYOUTS["zigzag"] else 1):
        start, length, local = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        call("fa_cp_part", code, int(n), int(world), int(rank), part, ctypes.byref(start), ctypes.byref(length),
             ctypes.byref(local))
        parts.append((start.value, length.value, local.value))
    return parts


def _is_torch_tensor(x):
    return type(x).__module__.startswith("torch")


def _narrow(x, dim, start, length):
    return x[(slice(None),) * dim + (slice(start, start + length),)]


def _cat(pieces, dim, like):
    if _is_torch_tensor(like):
        import torch
        return torch.cat(pieces, dim)
    return np.concatenate(pieces, dim)


def cp_shard(x, group, layout, dim=1):
    """This rank's tokens of a whole tensor x (the same on every rank),
    cut along dim as layout ("contiguous" or "zigzag") cuts it for
    ring_attention: the cut fa_cp_scatter makes. A new array (for torch
    tensors, differentiable: the gradient flows back to x)."""
    rank, world = _rank_world(group)
    dim = dim % len(x.shape)
    parts = cp_parts(layout, x.shape[dim], world, rank)
    return _cat([_narrow(x, dim, start, length) for start, length, _ in parts], dim, x)


def cp_unshard(x_local, group, layout, dim=1):
    """The whole tensor from every rank's tokens (cp_shard's inverse, on
    every rank): gathered with all_gather over group (a process group's
    dist.all_gather, with no gradient; a Transport's all_gather)."""
    _, world = _rank_world(group)
    dim = dim % len(x_local.shape)
    transport = group.transport if isinstance(group, Communicator) else group
    if isinstance(transport, TorchTransport):
        group, transport = transport.group, None
    if isinstance(transport, Transport):
        gathered = transport.all_gather(x_local)
    else:
        import torch.distributed as dist
        x_local = x_local.contiguous()
        gathered = [x_local.new_empty(x_local.shape) for _ in range(world)]
        dist.all_gather(gathered, x_local, group=group)
    n = x_local.shape[dim] * world
    pieces = []
    for r in range(world):
        for start, length, local in cp_parts(layout, n, world, r):
            pieces.append((start, _narrow(gathered[r], dim, local, length)))
    pieces.sort(key=lambda p: p[0])
    return _cat([p for _, p in pieces], dim, x_local)
