"""ring_attention against flash_attn_func on the whole sequence.

Threads of this process (ThreadTransport, NumPy arrays) drive the ring
through the same ctypes transport machinery as torch.distributed does,
with no PyTorch: these run everywhere. Then processes of a
torch.distributed group (Gloo on the CPU; NCCL where there are GPUs),
with autograd: skipped where PyTorch is not installed."""
import contextlib
import ctypes
import datetime
import gc
import os
import socket
import threading
import time

import numpy as np
import pytest

import flashattn
from conftest import random, rel_error
from flashattn import _lib
from flashattn._ring import cp_parts

CASES = [  # batch, seqlen (whole), heads_q, heads_kv, head_dim, causal, window, layout
    (2, 96, 4, 2, 32, True, (-1, -1), "zigzag"),        # GQA, causal
    (1, 96, 2, 2, 64, False, (-1, -1), "contiguous"),
    (1, 96, 4, 4, 32, False, (16, 8), "contiguous"),    # sliding window
    (1, 96, 4, 1, 32, True, (24, -1), "zigzag"),        # MQA, causal sliding window
]
CASE_IDS = ["causal-zigzag-gqa", "contiguous", "window", "causal-window-zigzag-mqa"]


def _whole(case, seed=3):
    b, n, hq, hk, d = case[:5]
    rng = np.random.default_rng(seed)
    shapes = [(b, n, hq, d), (b, n, hk, d), (b, n, hk, d), (b, n, hq, d)]  # q, k, v, dout
    return [random(rng, s) for s in shapes]


def _reference(case, backend, q, k, v, dout):
    causal, window = case[5], case[6]
    out, lse = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, return_softmax_lse=True,
                                         backend=backend)
    grads = flashattn.flash_attn_backward(dout, q, k, v, out, lse, causal=causal, window_size=window,
                                          backend=backend)
    return (out, lse) + tuple(grads)


def _close(got, want, what, tol=1e-5):
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), f"{what}: not finite where the reference is"
    assert rel_error(got[finite], want[finite]) < tol, f"{what}: relative error {rel_error(got[finite], want[finite])}"


# ------------------------------------------------------------ threads

_rank_contexts = {}


def _rank_context(backend, rank):
    """A context per (backend, rank): the ranks of one process each need
    their own, since a context runs one call at a time."""
    key = (backend, rank)
    if key not in _rank_contexts:
        _rank_contexts[key] = flashattn.Context(backend)
    return _rank_contexts[key]


def _run_threads(transports, fn, timeout=300):
    """fn(transport) on a thread a rank; every rank's result, or raises
    the first rank's exception."""
    results, errors = [None] * len(transports), [None] * len(transports)

    def body(rank):
        try:
            results[rank] = fn(transports[rank])
        except BaseException as e:  # noqa: B036 (reported below)
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(len(transports))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a rank did not finish"
    return results, errors


def _raise_first(errors):
    for e in errors:
        if e is not None:
            raise e


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_threads_match_one_device(backend, world, case):
    """Each rank's out, lse, dq, dk, dv are flash_attn_func's (and its
    backward's) on the whole sequence, cut as the layout cuts it; and
    cp_unshard puts the whole out back together on every rank."""
    causal, window, layout = case[5:]
    q, k, v, dout = _whole(case)
    want = _reference(case, backend, q, k, v, dout)

    def rank_main(t):
        shard = lambda x: flashattn.cp_shard(x, t, layout)
        ctx = _rank_context(backend, t.rank)
        out, lse = flashattn.ring_attention(shard(q), shard(k), shard(v), t, causal=causal, window_size=window,
                                            layout=layout, return_softmax_lse=True, context=ctx)
        grads = flashattn.ring_attention_backward(shard(dout), shard(q), shard(k), shard(v), out, lse, t,
                                                  causal=causal, window_size=window, layout=layout, context=ctx)
        whole_out = flashattn.cp_unshard(out, t, layout)
        whole_lse = flashattn.cp_unshard(lse, t, layout, dim=2)
        return (out, lse) + tuple(grads), (whole_out, whole_lse)

    transports = flashattn.ThreadTransport.create(world)
    results, errors = _run_threads(transports, rank_main)
    _raise_first(errors)
    names = ["out", "lse", "dq", "dk", "dv"]
    for t, (local, whole) in zip(transports, results):
        for name, got, full in zip(names, local, want):
            cut = flashattn.cp_shard(full, t, layout, dim=2 if name == "lse" else 1)
            assert got.dtype == full.dtype
            _close(got, cut, f"rank {t.rank} {name}", 1e-5 if name != "lse" else 1e-6)
        _close(whole[0], want[0], f"rank {t.rank} unsharded out")
        _close(whole[1], want[1], f"rank {t.rank} unsharded lse", 1e-6)


def test_default_layout_follows_causal():
    """layout=None is zigzag for a causal mask, contiguous otherwise: the
    results then match the whole sequence cut that way."""
    case = CASES[0]
    q, k, v, _ = _whole(case)
    want, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_softmax_lse=True, backend="reference")

    def rank_main(t):
        shard = lambda x: flashattn.cp_shard(x, t, "zigzag")
        return flashattn.ring_attention(shard(q), shard(k), shard(v), t, causal=True,
                                        context=_rank_context("reference", t.rank))

    transports = flashattn.ThreadTransport.create(2)
    results, errors = _run_threads(transports, rank_main)
    _raise_first(errors)
    for t, out in zip(transports, results):
        _close(out, flashattn.cp_shard(want, t, "zigzag"), f"rank {t.rank}")


def test_plans_are_cached_per_problem():
    """The second call of a problem reuses its distributed plan; another
    problem gets a plan of its own, and the least recently used goes when
    the cache is full; close() destroys them and the communicator."""
    case = CASES[1]
    q, k, v, _ = _whole(case)

    def rank_main(t):
        shard = lambda x: flashattn.cp_shard(x, t, "contiguous")
        ctx = _rank_context("reference", t.rank)
        comm = flashattn.Communicator(t)
        for _ in range(2):
            flashattn.ring_attention(shard(q), shard(k), shard(v), comm, context=ctx)
        once = len(comm.plan_summaries())
        flashattn.ring_attention(shard(q), shard(k), shard(v), comm, softmax_scale=0.5, context=ctx)
        two = comm.plan_summaries()
        comm.PLAN_CACHE_SIZE = 2
        flashattn.ring_attention(shard(q), shard(k), shard(v), comm, softmax_scale=0.25, context=ctx)
        full = len(comm.plan_summaries())
        comm.close()
        comm.close()
        return once, two, full, comm.handle, comm.plan_summaries()

    transports = flashattn.ThreadTransport.create(2)
    results, errors = _run_threads(transports, rank_main)
    _raise_first(errors)
    for t, (once, two, full, handle, after) in zip(transports, results):
        assert once == 1 and len(two) == 2 and full == 2
        assert two[0].startswith(f"ring attention: rank {t.rank} of 2, contiguous layout")
        assert handle is None and after == []


def test_communicators_may_go_during_another_ring():
    """Communicators that go (to the garbage collector, wherever it runs:
    inside a rank's transport wait, in the middle of another ring) leave
    their plans to be destroyed where nothing runs on their contexts: the
    rings go on, none waits forever."""
    case = CASES[0]
    q, k, v, dout = _whole(case)

    def rank_main(t):
        shard = lambda x: flashattn.cp_shard(x, t, "zigzag")
        ctx = _rank_context("reference", t.rank)
        out, lse = flashattn.ring_attention(shard(q), shard(k), shard(v), t, causal=True, return_softmax_lse=True,
                                            context=ctx)
        flashattn.ring_attention_backward(shard(dout), shard(q), shard(k), shard(v), out, lse, t, causal=True,
                                          context=ctx)

    threshold = gc.get_threshold()
    gc.set_threshold(20, 1, 1)
    try:
        for _ in range(40):
            # Each transport holds its communicator (a cycle): only the
            # collector frees them.
            _, errors = _run_threads(flashattn.ThreadTransport.create(3, timeout=20), rank_main, timeout=60)
            _raise_first(errors)
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    flashattn.ring_attention(*(np.zeros((1, 16, 2, 32), np.float32),) * 3, flashattn.ThreadTransport.create(1)[0],
                             context=_rank_context("reference", 0))
    assert not flashattn._ring._graveyard


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_cp_shard_is_the_library_scatter(rng, layout, world):
    """cp_shard cuts as fa_cp_scatter does, on every rank."""
    x = random(rng, (2, 24, 3, 8))
    token_bytes = x.shape[2] * x.shape[3] * x.itemsize
    for rank in range(world):
        ranked = flashattn.Transport()
        ranked.rank, ranked.world = rank, world
        local = np.empty((2, 24 // world, 3, 8), np.float32)
        _lib.call("fa_cp_scatter", _lib.CP_LAYOUTS[layout], world, rank, 2, 24, token_bytes,
                  x.ctypes.data_as(ctypes.c_void_p), local.ctypes.data_as(ctypes.c_void_p))
        assert np.array_equal(flashattn.cp_shard(x, ranked, layout), local)
        assert [p[2] for p in cp_parts(layout, 24, world, rank)] == ([0, 12 // world] if layout == "zigzag" else [0])


class _FailingStart(flashattn.ThreadTransport):
    def start(self, send, to, recv, source):
        raise KeyError(f"no route from rank {self.rank}")


class _FailingAgree(flashattn.ThreadTransport):
    def agree(self, values):
        raise ZeroDivisionError(f"rank {self.rank} cannot agree")


@pytest.mark.parametrize("transport,error", [(_FailingStart, KeyError), (_FailingAgree, ZeroDivisionError)],
                         ids=["start", "agree"])
def test_a_callback_exception_is_raised_after_the_call(transport, error):
    """An exception in a transport's callback does not cross into C: the
    callback fails, the library's call fails on every rank, and the
    exception comes out of ring_attention, from the library's error."""
    case = CASES[1]
    q, k, v, _ = _whole(case)

    def rank_main(t):
        shard = lambda x: flashattn.cp_shard(x, t, "contiguous")
        return flashattn.ring_attention(shard(q), shard(k), shard(v), t, context=_rank_context("reference", t.rank))

    _, errors = _run_threads(transport.create(2, timeout=30), rank_main)
    for rank, e in enumerate(errors):
        assert isinstance(e, error), f"rank {rank}: {e!r}"
        assert isinstance(e.__cause__, flashattn.FlashAttnError)
        assert e.__cause__.status == flashattn.Status.FA_ERR_LAUNCH


def test_ranks_that_disagree_all_fail():
    """A problem that differs between ranks fails every rank (the library
    agrees on it), none waits forever."""
    case = CASES[1]
    q, k, v, _ = _whole(case)

    def rank_main(t):
        shard = lambda x: flashattn.cp_shard(x, t, "contiguous")
        return flashattn.ring_attention(shard(q), shard(k), shard(v), t, causal=t.rank == 0, layout="contiguous",
                                        context=_rank_context("reference", t.rank))

    _, errors = _run_threads(flashattn.ThreadTransport.create(2, timeout=30), rank_main)
    for e in errors:
        assert isinstance(e, flashattn.FlashAttnError) and e.status == flashattn.Status.FA_ERR_INVALID_ARGUMENT
        assert "disagree" in e.message


def test_bad_arguments():
    t = flashattn.ThreadTransport.create(1)[0]
    q = np.zeros((1, 16, 2, 32), np.float32)
    with pytest.raises(ValueError, match="layout"):
        flashattn.ring_attention(q, q, q, t, layout="striped")
    with pytest.raises(TypeError, match="dropout"):
        flashattn.ring_attention(q, q, q, t, dropout_p=0.1)


# ------------------------------------------------------------ torch.distributed

def _torch():
    try:
        import torch
        import torch.distributed  # noqa: F401
        import torch.multiprocessing  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch is not installed: the torch.distributed transport and autograd are not tested here "
                    "(the thread tests above cover the transport machinery, the C tests the ring)")
    return torch


def _free_port():
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torch_case(torch, case, device, fa_backend, dtype):
    causal, window, layout = case[5:]
    whole = [torch.from_numpy(x).to(device=device, dtype=dtype) for x in _whole(case)]
    q, k, v, dout = whole
    # The whole problem on this rank's device, as one device computes it.
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    o_ref, lse_ref = flashattn.flash_attn_func(qr, kr, vr, causal=causal, window_size=window,
                                               return_softmax_lse=True, backend=fa_backend)
    o_ref.backward(dout)
    # The ring, over this rank's tokens.
    ql, kl, vl = (flashattn.cp_shard(t, None, layout).requires_grad_() for t in (q, k, v))
    out, lse = flashattn.ring_attention(ql, kl, vl, None, causal=causal, window_size=window, layout=layout,
                                        return_softmax_lse=True, backend=fa_backend)
    assert out.shape == ql.shape and out.dtype == dtype and out.device == ql.device and not lse.requires_grad
    out.backward(flashattn.cp_shard(dout, None, layout))
    as_numpy = lambda t: t.detach().float().cpu().numpy()
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    pairs = [("out", out, flashattn.cp_shard(o_ref, None, layout)),
             ("lse", lse, flashattn.cp_shard(lse_ref, None, layout, dim=2)),
             ("dq", ql.grad, flashattn.cp_shard(qr.grad, None, layout)),
             ("dk", kl.grad, flashattn.cp_shard(kr.grad, None, layout)),
             ("dv", vl.grad, flashattn.cp_shard(vr.grad, None, layout)),
             ("unsharded out", flashattn.cp_unshard(out.detach(), None, layout), o_ref)]
    for name, got, want in pairs:
        _close(as_numpy(got), as_numpy(want), f"rank {torch.distributed.get_rank()} {name}", tol)


def _torch_worker(rank, world, port, dist_backend, fa_backend, device_kind, dtype_name):
    """One process of the group: every case, against flash_attn_func on
    the whole sequence with autograd."""
    import torch
    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if device_kind == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group(dist_backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        for case in CASES:
            _torch_case(torch, case, device, fa_backend, getattr(torch, dtype_name))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world, *args, timeout=600):
    import torch.multiprocessing as mp
    procs = mp.start_processes(_torch_worker, args=(world, _free_port()) + args, nprocs=world, join=False,
                               start_method="spawn")
    deadline = time.monotonic() + timeout
    while not procs.join(timeout=5):
        if time.monotonic() > deadline:
            for p in procs.processes:
                p.kill()
            pytest.fail(f"the ranks did not finish within {timeout} s")


@pytest.mark.parametrize("world", [2, 3])
def test_torch_gloo_cpu(backend, world):
    """Processes over Gloo, CPU tensors, on the conftest backends."""
    _torch()
    _spawn(world, "gloo", backend, "cpu", "float32")


def test_torch_gloo_cuda_tensors():
    """CUDA tensors of one GPU, ranks over Gloo: the library stages them
    through host memory for the transport."""
    torch = _torch()
    if not torch.cuda.is_available() or not flashattn.backend_status("cuda")[0]:
        pytest.skip("no CUDA device, or the library has no CUDA backend")
    _spawn(2, "gloo", "cuda", "cuda", "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_torch_nccl(dtype):
    """A GPU a rank over NCCL: host bytes copied through CUDA staging
    tensors of each rank's device."""
    torch = _torch()
    if torch.cuda.device_count() < 2 or not flashattn.backend_status("cuda")[0] or not \
            torch.distributed.is_nccl_available():
        pytest.skip("needs 2 CUDA devices, NCCL and the library's CUDA backend")
    _spawn(2, "nccl", "cuda", "cuda", dtype)
