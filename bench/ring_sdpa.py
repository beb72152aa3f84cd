#!/usr/bin/env python3
"""Peer for the ring (context-parallel) attention benchmark: ring-flash-attn's
zigzag ring (zhuzilin/ring-flash-attention, zigzag_ring_flash_attn.py) over
FlashAttention-2, written again on PyTorch SDPA's own FlashAttention-2
kernels, aten::_scaled_dot_product_flash_attention and its backward, for
machines where the flash-attn package cannot be installed. It needs PyTorch
with CUDA and NCCL and nothing else.

The algorithm is ring-flash-attn's, step for step:
  * layout: zigzag with --causal (rank r holds chunks r and 2W-1-r of 2W
    chunks), contiguous otherwise (rank r holds chunk r of W); batch 1, each
    rank holding q [1, N/W, heads, dim] and k, v [1, N/W, heads_kv, dim];
  * forward: W steps; at step t a rank has the K/V of rank (r - t) mod W and
    has already started sending them to r+1 and receiving the next from r-1
    (one batch_isend_irecv, waited after the step's attention); causal steps:
    step 0 causal over the whole local pair of chunks, a source rank below
    this one: all local queries against the first half of its keys, a source
    rank above: the second half of the local queries against all its keys,
    both non-causal; partial outputs merged in fp32 through the log-sum-exp
    as update_out_and_lse merges them;
  * backward: K/V travel as in the forward, the fp32 dK/dV accumulators one
    step behind them, back to their owner after W steps; each step calls the
    flash backward with the final output and log-sum-exp (the rows it covers)
    and accumulates dq, dk, dv in fp32.

Grouped-query attention: K/V keep heads_kv heads and go to the kernel as they
are, since FlashAttention-2 takes fewer K/V heads than query heads (dK, dV
come back with heads_kv heads). Each rank checks this once at start on a
small problem; where the kernel refuses or disagrees (or with --expand-kv),
each step expands K/V with repeat_interleave inside the step and sums dK/dV
back over the groups, inside the timed step, so the cost is counted. The
header line says which ran.

Timing: each pass starts after a barrier and ends with a device
synchronisation; its time is the slowest rank's (all_reduce MAX), the median
over --repeats. FLOPs: forward 4*N*N*heads*dim (half of it causal),
backward 2.5 times the forward; the rate per rank is FLOPs / W / time. Beside
it, rank 0 alone times the same kernels on one rank's tokens (N/W, the same
mask) and the efficiency is the ring's rate over that one.

Run (it starts one process per GPU itself):
  python3 bench/ring_sdpa.py --ranks 2 --seqlen 65536 --heads 32 --heads-kv 8 \\
      --dim 128 --dtype bf16 --causal --repeats 3 --warmup 1 --json ring.jsonl
  python3 bench/ring_sdpa.py --ranks 2 --check   # out, lse, dq, dk, dv against
      # one GPU's fp32 SDPA (math) on the whole sequence, causal and not

The aten signatures assumed, as PyTorch 2.11.0+cu130 declares them (their
_schema); --check is what catches a change in another release:
  _scaled_dot_product_flash_attention(Tensor query, Tensor key, Tensor value,
      float dropout_p=0.0, bool is_causal=False, bool return_debug_mask=False,
      *, float? scale=None)
    -> (Tensor output, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k,
        SymInt max_q, SymInt max_k, Tensor rng_state, Tensor unused,
        Tensor debug_attn_mask)
    query/key/value [batch, heads, seq, dim] (views of [batch, seq, heads,
    dim] memory), output likewise, logsumexp [batch, heads, seq] fp32,
    natural log, not padded; cum_seq_q/k undefined (None) for dense inputs.
  _scaled_dot_product_flash_attention_backward(Tensor grad_out, Tensor query,
      Tensor key, Tensor value, Tensor out, Tensor logsumexp, Tensor cum_seq_q,
      Tensor cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p,
      bool is_causal, Tensor philox_seed, Tensor philox_offset, *,
      float? scale=None) -> (Tensor grad_query, Tensor grad_key,
      Tensor grad_value)
    called with the cum_seq_q/k and rng_state/unused tensors of a forward
    call (what autograd passes it) as philox_seed/philox_offset; with
    dropout 0 they are not read.
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
import warnings

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
except ImportError:
    print("ring_sdpa: PyTorch is not installed", file=sys.stderr)
    sys.exit(1)

PEER = "sdpa-flash zigzag ring"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def fail(message):
    print(f"ring_sdpa: {message}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- one step


class FlashAux:
    """What a forward call returns beside output and log-sum-exp, which its
    backward takes back: cum_seq_q/k and the RNG state tensors."""

    def __init__(self, cum_seq_q, cum_seq_k, philox_seed, philox_offset):
        self.cum_seq_q, self.cum_seq_k = cum_seq_q, cum_seq_k
        self.philox_seed, self.philox_offset = philox_seed, philox_offset


def expand_kv(k, groups):
    """[B, S, Hkv, D] -> [B, S, Hkv * groups, D], query head h using K/V head h // groups."""
    return k if groups == 1 else k.repeat_interleave(groups, dim=2)


def reduce_kv_grad(g, groups):
    """The inverse of expand_kv for gradients: sum over each K/V head's group."""
    if groups == 1:
        return g
    b, s, h, d = g.shape
    return g.reshape(b, s, h // groups, groups, d).sum(dim=3)


def step_forward(q, k, v, causal, scale, expand):
    """One flash forward. q [B, Sq, H, D], k, v [B, Sk, Hkv, D].
    Returns out [B, Sq, H, D], lse [B, H, Sq] (fp32) and the FlashAux."""
    groups = q.shape[2] // k.shape[2]
    if expand:
        k, v = expand_kv(k, groups), expand_kv(v, groups)
    res = torch.ops.aten._scaled_dot_product_flash_attention(
        query=q.transpose(1, 2), key=k.transpose(1, 2), value=v.transpose(1, 2),
        dropout_p=0.0, is_causal=causal, return_debug_mask=False, scale=scale)
    if len(res) != 9:
        raise RuntimeError(f"_scaled_dot_product_flash_attention returned {len(res)} values, expected 9")
    out, lse = res[0], res[1]
    want = (q.shape[0], q.shape[2], q.shape[1])
    if tuple(lse.shape) != want or lse.dtype != torch.float32:
        raise RuntimeError(f"_scaled_dot_product_flash_attention: logsumexp is {tuple(lse.shape)} {lse.dtype}, "
                           f"expected {want} float32")
    return out.transpose(1, 2), lse, FlashAux(res[2], res[3], res[6], res[7])


def step_backward(dout, q, k, v, out, lse, causal, scale, aux, expand):
    """One flash backward with the final out and lse of these query rows.
    Returns dq [B, Sq, H, D], dk, dv [B, Sk, Hkv, D] in the input dtype."""
    groups = q.shape[2] // k.shape[2]
    if expand:
        k, v = expand_kv(k, groups), expand_kv(v, groups)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad_out=dout.transpose(1, 2), query=q.transpose(1, 2), key=k.transpose(1, 2),
        value=v.transpose(1, 2), out=out.transpose(1, 2), logsumexp=lse,
        cum_seq_q=aux.cum_seq_q, cum_seq_k=aux.cum_seq_k, max_q=q.shape[1], max_k=k.shape[1],
        dropout_p=0.0, is_causal=causal, philox_seed=aux.philox_seed, philox_offset=aux.philox_offset,
        scale=scale)
    dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    if expand:
        dk, dv = reduce_kv_grad(dk, groups), reduce_kv_grad(dv, groups)
    return dq, dk, dv


def kernel_takes_gqa(heads, heads_kv, dim, dtype, scale):
    """Whether the flash op runs K/V with fewer heads than the queries and
    agrees with the same call on K/V expanded to all heads."""
    if heads == heads_kv:
        return True
    g = torch.Generator(device="cuda").manual_seed(7)
    q, dout = (torch.randn(1, 256, heads, dim, device="cuda", generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(1, 256, heads_kv, dim, device="cuda", generator=g).to(dtype) for _ in range(2))
    try:
        results = []
        for expand in (False, True):
            out, lse, aux = step_forward(q, k, v, True, scale, expand)
            results.append((out, lse) + step_backward(dout, q, k, v, out, lse, True, scale, aux, expand))
        torch.cuda.synchronize()
    except RuntimeError:
        return False
    return all(torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2) for a, b in zip(*results))


# ---------------------------------------------------------------- the ring


class Ring:
    """Rank r sends to r+1 and receives from r-1 (mod W)."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.next, self.prev = (rank + 1) % world, (rank - 1) % world

    def send_recv(self, tensors, into=None):
        """Starts sending tensors to the next rank and receiving as many from
        the previous one (into the given buffers or new ones); returns the
        receive buffers and the requests to wait on."""
        recv = into if into is not None else [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev) for t in recv]
        return recv, dist.batch_isend_irecv(ops)


def wait(reqs):
    for req in reqs:
        req.wait()


def merge(out, lse, block_out, block_lse):
    """ring-flash-attn's update_out_and_lse in fp32: out [B, S, H, D], lse
    [B, S, H, 1]; block_lse as the kernel returns it, [B, H, S]."""
    block_out = block_out.to(torch.float32)
    block_lse = block_lse.transpose(1, 2).unsqueeze(dim=-1)
    if out is None:
        return block_out, block_lse
    out = out - torch.sigmoid(block_lse - lse) * (out - block_out)
    lse = lse - F.logsigmoid(lse - block_lse)
    return out, lse


def ring_forward(ring, q, k, v, causal, scale, expand):
    """Returns out [1, S, H, D] (input dtype), lse [1, H, S] (fp32,
    contiguous) and the FlashAux of the first step."""
    half = q.shape[1] // 2
    out = lse = aux = None
    for step in range(ring.world):
        if step + 1 < ring.world:
            (next_k, next_v), reqs = ring.send_recv([k, v])
        if step == 0 or not causal:
            block_out, block_lse, step_aux = step_forward(q, k, v, causal and step == 0, scale, expand)
            out, lse = merge(out, lse, block_out, block_lse)
            if step == 0:
                aux = step_aux
        elif step <= ring.rank:
            # source rank r - step is below this one: its first chunk lies
            # before both local chunks, its second after both
            block_out, block_lse, _ = step_forward(q, k[:, :half], v[:, :half], False, scale, expand)
            out, lse = merge(out, lse, block_out, block_lse)
        else:
            # source rank above this one: both its chunks lie between the
            # local ones, so only the second local half sees them, all of them
            block_out, block_lse, _ = step_forward(q[:, half:], k, v, False, scale, expand)
            out_2, lse_2 = merge(out[:, half:], lse[:, half:], block_out, block_lse)
            out[:, half:], lse[:, half:] = out_2, lse_2
        if step + 1 < ring.world:
            wait(reqs)
            k, v = next_k, next_v
    return out.to(q.dtype), lse.squeeze(dim=-1).transpose(1, 2).contiguous(), aux


def ring_backward(ring, dout, q, k, v, out, lse, aux, causal, scale, expand):
    """Returns dq, dk, dv of the local tokens, in the input dtype."""
    half = q.shape[1] // 2
    dout_1, q_1, out_1 = dout[:, half:], q[:, half:], out[:, half:]
    lse_1 = lse[:, :, half:].contiguous()
    dq = dk = dv = None
    next_dk = next_dv = None
    dkv_reqs = dkv_buffers = None
    for step in range(ring.world):
        if step + 1 < ring.world:
            (next_k, next_v), kv_reqs = ring.send_recv([k, v])
        if step == 0:
            bdq, bdk, bdv = step_backward(dout, q, k, v, out, lse, causal, scale, aux, expand)
            dq, dk, dv = bdq.to(torch.float32), bdk.to(torch.float32), bdv.to(torch.float32)
        else:
            if not causal:
                bdq, bdk, bdv = step_backward(dout, q, k, v, out, lse, False, scale, aux, expand)
                dq += bdq
            elif step <= ring.rank:
                bdq, bdk, bdv = step_backward(dout, q, k[:, :half], v[:, :half], out, lse, False, scale, aux,
                                              expand)
                dq += bdq
            else:
                bdq, bdk, bdv = step_backward(dout_1, q_1, k, v, out_1, lse_1, False, scale, aux, expand)
                dq[:, half:] += bdq
            # the accumulators of the visiting K/V's owner, sent last step
            wait(dkv_reqs)
            dkv_buffers = [dk, dv]
            dk, dv = next_dk, next_dv
            if causal and step <= ring.rank:
                dk[:, :half] += bdk
                dv[:, :half] += bdv
            else:
                dk += bdk
                dv += bdv
        if step + 1 < ring.world:
            wait(kv_reqs)
            k, v = next_k, next_v
        if ring.world > 1:
            (next_dk, next_dv), dkv_reqs = ring.send_recv([dk, dv], into=dkv_buffers)
        else:
            next_dk, next_dv = dk, dv
    if ring.world > 1:
        wait(dkv_reqs)
    return dq.to(q.dtype), next_dk.to(q.dtype), next_dv.to(q.dtype)


# ---------------------------------------------------------------- layout


def shard(x, ring, causal, dim=1):
    """This rank's tokens of a whole-sequence tensor along dim."""
    if not causal:
        return x.chunk(ring.world, dim=dim)[ring.rank].contiguous()
    chunks = x.chunk(2 * ring.world, dim=dim)
    return torch.cat([chunks[ring.rank], chunks[2 * ring.world - 1 - ring.rank]], dim=dim).contiguous()


# ---------------------------------------------------------------- timing


def distributed():
    return dist.is_available() and dist.is_initialized()


def barrier():
    if distributed():
        dist.barrier()
    torch.cuda.synchronize()


def slowest(seconds):
    """The largest of the ranks' values."""
    if not distributed():
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_pass(fn, warmup, repeats, collective=True):
    """Median seconds of fn over repeats after warmup; with collective, every
    run starts after a barrier and counts as its slowest rank."""
    times = []
    for i in range(warmup + repeats):
        if collective:
            barrier()
        else:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
        if collective:
            t = slowest(t)
        if i >= warmup:
            times.append(t)
    return statistics.median(times)


def bench(ring, args, expand, kv_note):
    W, rank, N = ring.world, ring.rank, args.seqlen
    S, H, Hkv, D = N // W, args.heads, args.heads_kv, args.dim
    dtype, causal, scale = DTYPES[args.dtype], args.causal, 1.0 / math.sqrt(args.dim)
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    q, dout = (torch.randn(1, S, H, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(1, S, Hkv, D, device="cuda", generator=g).to(dtype) for _ in range(2))

    # one GPU alone on a rank's tokens (rank 0; the others wait)
    one = {}
    if rank == 0:
        out, lse, aux = step_forward(q, k, v, causal, scale, expand)
        one["fwd"] = time_pass(lambda: step_forward(q, k, v, causal, scale, expand), args.warmup, args.repeats,
                               collective=False)
        one["bwd"] = time_pass(lambda: step_backward(dout, q, k, v, out, lse, causal, scale, aux, expand),
                               args.warmup, args.repeats, collective=False)
        del out, lse, aux
    barrier()

    ring_t = {"fwd": time_pass(lambda: ring_forward(ring, q, k, v, causal, scale, expand), args.warmup,
                               args.repeats)}
    out, lse, aux = ring_forward(ring, q, k, v, causal, scale, expand)
    ring_t["bwd"] = time_pass(lambda: ring_backward(ring, dout, q, k, v, out, lse, aux, causal, scale, expand),
                              args.warmup, args.repeats)
    if rank != 0:
        return True

    fwd_flops = 4.0 * N * N * H * D * (0.5 if causal else 1.0)
    one_fwd_flops = 4.0 * S * S * H * D * (0.5 if causal else 1.0)
    device = torch.cuda.get_device_name()
    print(f"{PEER} (PyTorch {torch.__version__} SDPA flash): {W} rank{'s' if W > 1 else ''} "
          f"{'over NCCL ' if W > 1 else ''}on {device}; seqlen {N} ({S} a rank, "
          f"{'zigzag' if causal else 'contiguous'} layout), heads {H}/{Hkv}, dim {D}, {args.dtype}, "
          f"{'causal' if causal else 'non-causal'}; {kv_note}; median of {args.repeats}")
    print(f"{'pass':<5}{'ms':>12}{'TFLOP/s a rank':>17}{'one GPU TFLOP/s':>18}{'efficiency':>12}")
    records = []
    for p, mult in (("fwd", 1.0), ("bwd", 2.5)):
        per_rank = mult * fwd_flops / W / ring_t[p] * 1e-12
        one_gpu = mult * one_fwd_flops / one[p] * 1e-12
        print(f"{p:<5}{ring_t[p] * 1e3:>12.3f}{per_rank:>17.1f}{one_gpu:>18.1f}{per_rank / one_gpu:>12.3f}")
        records.append({"peer": PEER, "ranks": W, "seqlen": N, "pass": p, "ms": round(ring_t[p] * 1e3, 4),
                        "tflops_per_rank": round(per_rank, 2), "one_gpu_tflops": round(one_gpu, 2),
                        "efficiency": round(per_rank / one_gpu, 4), "heads": H, "heads_kv": Hkv, "dim": D,
                        "dtype": args.dtype, "causal": causal, "layout": "zigzag" if causal else "contiguous",
                        "kv_expanded": expand, "device": device, "torch": torch.__version__})
    if args.json:
        with open(args.json, "a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    return True


# ---------------------------------------------------------------- check


def reference(q, k, v, dout, causal, scale):
    """One GPU, the whole sequence, fp32: SDPA's math backend with autograd
    for out, dq, dk, dv; the log-sum-exp from the scores."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # the autograd thread's first cuBLAS call warns that it sets the context
    warnings.filterwarnings("ignore", message="Attempting to run cuBLAS")
    groups = q.shape[2] // k.shape[2]
    qf, kf, vf = (x.to(torch.float32).requires_grad_() for x in (q, k, v))
    qh, kh, vh = qf.transpose(1, 2), expand_kv(kf, groups).transpose(1, 2), expand_kv(vf, groups).transpose(1, 2)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=scale)
    o.backward(dout.to(torch.float32).transpose(1, 2))
    with torch.no_grad():
        s = qh @ kh.transpose(-1, -2) * scale
        if causal:
            n = s.shape[-1]
            s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
    return {"out": o.detach().transpose(1, 2), "lse": lse, "dq": qf.grad, "dk": kf.grad, "dv": vf.grad}


def run_all(ring, q, k, v, dout, causal, scale, expand):
    out, lse, aux = ring_forward(ring, q, k, v, causal, scale, expand)
    dq, dk, dv = ring_backward(ring, dout, q, k, v, out, lse, aux, causal, scale, expand)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


NAMES = ("out", "lse", "dq", "dk", "dv")


def sq_errors(got, ref):
    """[sum of squared differences, sum of squared reference values] for each of NAMES."""
    vals = []
    for name in NAMES:
        a, b = got[name].to(torch.float32), ref[name].to(torch.float32)
        vals += [((a - b) ** 2).sum(), (b ** 2).sum()]
    return torch.stack(vals).to(torch.float64)


def rel(sq):
    return [math.sqrt(sq[2 * i].item() / max(sq[2 * i + 1].item(), 1e-300)) for i in range(len(NAMES))]


def check(ring, args, expand, kv_note):
    """The ring against one GPU's fp32 SDPA on the whole sequence, causal and
    non-causal. The relative error (Frobenius norm of the difference over the
    reference's) must stay within twice that of the flash kernel run on the
    whole sequence on one GPU, plus 2e-3 (1e-4 for the log-sum-exp)."""
    N = args.seqlen
    H, Hkv, D, dtype = args.heads, args.heads_kv, args.dim, DTYPES[args.dtype]
    scale = 1.0 / math.sqrt(D)
    ok = True
    for causal in (True, False):
        g = torch.Generator().manual_seed(0)  # the same whole-sequence tensors on every rank
        q, dout = (torch.randn(1, N, H, D, generator=g).to("cuda", dtype) for _ in range(2))
        k, v = (torch.randn(1, N, Hkv, D, generator=g).to("cuda", dtype) for _ in range(2))
        ref = reference(q, k, v, dout, causal, scale)
        one_gpu = rel(sq_errors(run_all(Ring(0, 1), q, k, v, dout, causal, scale, expand), ref))
        local = [shard(x, ring, causal) for x in (q, k, v, dout)]
        got = run_all(ring, *local, causal, scale, expand)
        ref_local = {name: shard(ref[name], ring, causal, dim=2 if name == "lse" else 1) for name in NAMES}
        sq = sq_errors(got, ref_local)
        if distributed():
            dist.all_reduce(sq)
        ring_err = rel(sq)
        if ring.rank == 0:
            print(f"check: {ring.world} rank{'s' if ring.world > 1 else ''}, seqlen {N}, heads {H}/{Hkv}, "
                  f"dim {D}, {args.dtype}, {'causal, zigzag' if causal else 'non-causal, contiguous'}; {kv_note}")
            print(f"  {'tensor':<8}{'ring':>12}{'one GPU':>12}{'limit':>12}")
            for name, e, base in zip(NAMES, ring_err, one_gpu):
                limit = 2 * base + (1e-4 if name == "lse" else 2e-3)
                good = e <= limit  # False for NaN
                ok &= good
                print(f"  {name:<8}{e:>12.3e}{base:>12.3e}{limit:>12.3e}  {'PASS' if good else 'FAIL'}")
    if ring.rank == 0:
        print("check: PASS" if ok else "check: FAIL")
    return ok


# ---------------------------------------------------------------- processes


def worker(rank, world, args):
    torch.cuda.set_device(rank)
    if world > 1:
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        ring = Ring(rank, world)
        scale = 1.0 / math.sqrt(args.dim)
        expand = args.expand_kv or not kernel_takes_gqa(args.heads, args.heads_kv, args.dim, DTYPES[args.dtype],
                                                        scale)
        if args.heads == args.heads_kv:
            kv_note = "K/V heads as query heads"
        elif expand:
            kv_note = (f"K/V expanded to {args.heads} heads by repeat_interleave in each step"
                       f"{'' if args.expand_kv else ' (the kernel refused ' + str(args.heads_kv) + ')'}")
        else:
            kv_note = f"K/V with {args.heads_kv} heads in the kernel (GQA)"
        ok = check(ring, args, expand, kv_note) if args.check else bench(ring, args, expand, kv_note)
        if distributed():
            barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()
    if not ok:
        sys.exit(1)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, required=True, help="W: processes, one GPU each")
    ap.add_argument("--seqlen", type=int, default=0, help="the whole sequence (all ranks); --check: 2048 unless given")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=0, help="K/V heads (default: --heads)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--causal", action="store_true", help="causal mask, zigzag layout (else contiguous)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", help="append one JSON line per pass")
    ap.add_argument("--expand-kv", action="store_true",
                    help="expand K/V to all heads in each step even where the kernel takes fewer")
    ap.add_argument("--check", action="store_true",
                    help="compare out, lse, dq, dk, dv with one GPU's fp32 SDPA (causal and not); no timing")
    args = ap.parse_args()
    W = args.ranks
    args.heads_kv = args.heads_kv or args.heads
    if W < 1:
        ap.error("--ranks must be at least 1")
    if args.heads % args.heads_kv:
        ap.error("--heads must be a multiple of --heads-kv")
    if args.repeats < 1 or args.warmup < 0:
        ap.error("--repeats must be at least 1 and --warmup at least 0")
    if args.check:
        args.seqlen = args.seqlen or 2048
    elif args.seqlen <= 0:
        ap.error("--seqlen is required")
    unit = 2 * W if args.causal or args.check else W
    if args.seqlen % unit:
        ap.error(f"--seqlen must be a multiple of {unit} ({'a chunk' if unit == W else '2 chunks'} a rank)")

    if not torch.cuda.is_available():
        fail("no CUDA device visible to PyTorch")
    if torch.cuda.device_count() < W:
        fail(f"--ranks {W} needs {W} GPUs, {torch.cuda.device_count()} visible")
    if W > 1 and not (dist.is_available() and dist.is_nccl_available()):
        fail("this PyTorch has no NCCL backend for torch.distributed")

    if W == 1:  # no process group, no communication
        worker(0, 1, args)
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    try:
        mp.spawn(worker, args=(W, args), nprocs=W, join=True)
    except mp.ProcessExitedException as e:  # a rank exited non-zero; it said why
        if e.exit_code not in (1, None):
            print(f"ring_sdpa: {e}", file=sys.stderr)
        sys.exit(1)
    except mp.ProcessRaisedException as e:
        fail(f"a rank failed:\n{e}")


if __name__ == "__main__":
    main()
