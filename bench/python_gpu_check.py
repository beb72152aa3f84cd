#!/usr/bin/env python3
"""On an NVIDIA GPU machine with PyTorch: the Python package on CUDA
tensors against torch.nn.functional.scaled_dot_product_attention, and the
cost of a call from Python against the C call.

1. Gradients, gradcheck-style: for each dtype, shape and mask, out and the
   gradients of q, k, v from flashattn.flash_attn_func (autograd) and from
   SDPA in the same dtype, both against SDPA in float64; ours passes when
   its error is at most twice SDPA's (or under the dtype's floor).
2. No copies: the device memory a forward call allocates is out and
   softmax_lse alone (the inputs are wrapped in place).
3. The current stream: a call on a side stream still busy with a torch op
   (torch.cuda._sleep, then the op that writes q) returns before the stream
   is done (no host wait), runs after that op (its result equals the same
   call's on the default stream), and leaves the context on that stream;
   the default stream is CU_STREAM_LEGACY. Training with dropout (a fresh
   seed per call) adds no plan.
4. KV cache: flashattn.flash_attn_with_kvcache on CUDA tensors (fp16, a
   contiguous cache and a paged one with rotary, both appending) against
   the same call on NumPy copies of the inputs: out and softmax_lse as
   torch tensors on the GPU, the caller's cache tensors appended to in
   place, and no copy of the caches (the call allocates out and
   softmax_lse alone).
5. Overhead: the median wall time of one flash_attn_func call until its
   kernel is done (a synchronize after it) beside the kernel's device time
   that fa-bench reports for the same shape (--fa-bench-json), and the
   median time the call itself takes to return.

Run by bench/python_gpu_check.sh; prints a table and writes JSON lines.
Exits non-zero when a comparison fails."""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flashattn

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
FLOOR = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 2e-2}


def sdpa(q, k, v, causal):
    """SDPA on [batch, seq, heads, dim] tensors (it takes [batch, heads, seq, dim])."""
    gqa = q.shape[2] != k.shape[2]
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                       enable_gqa=gqa)
    return o.transpose(1, 2)


def rel(a, b):
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm()).item()


def grads(fn, q, k, v, dout, causal):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, causal)
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def compare(dtype, b, s, h, hkv, d, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *shape: torch.randn(*shape, device="cuda", generator=g)
    q, k, v, dout = mk(b, s, h, d), mk(b, s, hkv, d), mk(b, s, hkv, d), mk(b, s, h, d)
    t = DTYPES[dtype]
    ref = grads(sdpa, q.double(), k.double(), v.double(), dout.double(), causal)
    ours = grads(lambda *a: flashattn.flash_attn_func(*a[:3], causal=a[3]), q.to(t), k.to(t), v.to(t), dout.to(t),
                 causal)
    peer = grads(sdpa, q.to(t), k.to(t), v.to(t), dout.to(t), causal)
    row = {"dtype": dtype, "b": b, "s": s, "h": h, "h_kv": hkv, "d": d, "causal": causal}
    ok = True
    for name, r, o, p in zip(("out", "dq", "dk", "dv"), ref, ours, peer):
        row[name] = rel(o, r)
        row[name + "_sdpa"] = rel(p, r)
        ok &= row[name] <= max(2 * row[name + "_sdpa"], FLOOR[dtype])
    row["ok"] = bool(ok)
    return row


def no_copy_check():
    """Forward on [2, 1024, 8, 128] fp16: the call allocates out and lse only."""
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    flashattn.flash_attn_func(q, k, v)  # plan and kernels built, allocator warmed
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out, lse = flashattn.flash_attn_func(q, k, v, return_softmax_lse=True)
    extra = torch.cuda.max_memory_allocated() - before
    expected = out.numel() * out.element_size() + lse.numel() * lse.element_size()
    return {"check": "no_copy", "allocated": extra, "out_plus_lse": expected, "ok": extra <= expected + 1024}


def stream_check():
    """See 3. in the module's description."""
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    want = flashattn.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    ctx = flashattn.context("cuda", torch.cuda.current_device())
    default_handle = ctx.native()[1]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        t0 = time.perf_counter()
        torch.cuda._sleep(1 << 30)
        late_q = q * 1.0
        out = flashattn.flash_attn_func(late_q, k, v, causal=True)
        call_ms = (time.perf_counter() - t0) * 1e3
        busy = not side.query()
        side_handle = ctx.native()[1]
    side.synchronize()
    stream_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.current_stream().wait_stream(side)
    plans = len(ctx._plans)
    for _ in range(5):
        flashattn.flash_attn_func(q, k, v, dropout_p=0.1)
    dropout_plans = len(ctx._plans) - plans
    torch.cuda.synchronize()
    row = {"check": "stream", "returned_ms": call_ms, "stream_done_ms": stream_ms, "returned_while_busy": busy,
           "same_result": bool(torch.equal(out, want)), "context_on_side_stream": side_handle == side.cuda_stream,
           "default_is_legacy": default_handle == 1, "plans_for_5_dropout_seeds": dropout_plans}
    row["ok"] = bool(busy and row["same_result"] and row["context_on_side_stream"] and row["default_is_legacy"]
                     and dropout_plans <= 1)
    return row


def kvcache_check(paged):
    """See 4. in the module's description."""
    import numpy as np
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda *shape: torch.randn(*shape, device="cuda", generator=g, dtype=torch.float16)
    b, hq, hk, d, capacity, page, sn = 4, 16, 4, 128, 1024, 64, 2
    if paged:
        pages = b * capacity // page + 3
        k_cache, v_cache = mk(pages, page, hk, d), mk(pages, page, hk, d)
        table = torch.randperm(pages, device="cuda", generator=g)[:b * capacity // page].to(torch.int32)
        table = table.reshape(b, capacity // page)
        pos = torch.arange(capacity, device="cuda", dtype=torch.float32)[:, None]
        freq = 1.0 / 10000 ** (torch.arange(0, 64, 2, device="cuda", dtype=torch.float32) / 64)
        cos, sin = torch.cos(pos * freq), torch.sin(pos * freq)
    else:
        k_cache, v_cache = mk(b, capacity, hk, d), mk(b, capacity, hk, d)
        table = cos = sin = None
    q, k_new, v_new = mk(b, sn, hq, d), mk(b, sn, hk, d), mk(b, sn, hk, d)
    lens = torch.tensor([0, 100, 513, capacity - sn], dtype=torch.int32, device="cuda")
    host = lambda t: None if t is None else t.cpu().numpy()
    kc_n, vc_n = host(k_cache), host(v_cache)
    v_before = vc_n.copy()
    want, want_lse = flashattn.flash_attn_with_kvcache(host(q), kc_n, vc_n, host(k_new), host(v_new), host(cos),
                                                       host(sin), host(lens), host(table), causal=True,
                                                       return_softmax_lse=True, backend="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cos, sin, lens, table,
                                                 causal=True, return_softmax_lse=True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    expected = out.numel() * out.element_size() + lse.numel() * lse.element_size()
    row = {"check": "kvcache", "paged": paged, "allocated": extra, "out_plus_lse": expected,
           "out": rel(out, torch.from_numpy(want).cuda()), "lse": rel(lse, torch.from_numpy(want_lse).cuda()),
           "k_cache_max_diff": float(np.max(np.abs(k_cache.float().cpu().numpy() - kc_n.astype(np.float32)))),
           "v_cache_equal": bool(np.array_equal(v_cache.cpu().numpy(), vc_n)),
           "torch_out": out.is_cuda and out.dtype == torch.float16 and lse.dtype == torch.float32,
           "appended": not np.array_equal(v_before, vc_n)}
    row["ok"] = bool(row["out"] <= FLOOR["fp16"] and row["lse"] <= 1e-5 and row["k_cache_max_diff"] <= 4e-3
                     and row["v_cache_equal"] and row["appended"] and row["torch_out"] and extra <= expected + 4096)
    return row


def overhead(shape, dtype, repeats, fa_bench):
    b, s, h, d = shape
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    for _ in range(10):
        flashattn.flash_attn_func(q, k, v)
    times, returns = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        flashattn.flash_attn_func(q, k, v)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        returns.append((t1 - t0) * 1e3)
    py_ms = statistics.median(times)
    row = {"check": "overhead", "b": b, "s": s, "h": h, "d": d, "dtype": dtype, "python_call_ms": py_ms,
           "python_return_ms": statistics.median(returns)}
    c = fa_bench.get((b, s, h, d, dtype))
    if c is not None:
        row["fa_bench_fwd_ms"] = c
        row["python_overhead_ms"] = py_ms - c
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="append one JSON object per result")
    ap.add_argument("--fa-bench-json", help="fa-bench --json output for the overhead shapes")
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    print(f"flashattn {flashattn.__version__} from {flashattn.library_path}; torch {torch.__version__}; "
          f"{torch.cuda.get_device_name()}")
    rows = []
    for dtype in ("fp32", "fp16", "bf16"):
        for b, s, h, hkv, d in ((2, 256, 8, 8, 64), (1, 1024, 8, 2, 128), (2, 512, 4, 4, 256)):
            for causal in (False, True):
                r = compare(dtype, b, s, h, hkv, d, causal)
                rows.append(r)
                print("{dtype} b{b} s{s} h{h}/{h_kv} d{d} causal={causal}: ".format(**r) +
                      " ".join(f"{n} {r[n]:.2e} (sdpa {r[n + '_sdpa']:.2e})" for n in ("out", "dq", "dk", "dv")) +
                      ("  ok" if r["ok"] else "  FAIL"))
    r = no_copy_check()
    rows.append(r)
    print(f"no copies: a forward call allocated {r['allocated']} bytes, out + lse are {r['out_plus_lse']}:"
          f" {'ok' if r['ok'] else 'FAIL'}")
    r = stream_check()
    rows.append(r)
    print(f"current stream: the call returned after {r['returned_ms']:.1f} ms, the busy stream was done after "
          f"{r['stream_done_ms']:.1f} ms; returned while busy {r['returned_while_busy']}, same result "
          f"{r['same_result']}, context on the side stream {r['context_on_side_stream']}, default stream is "
          f"CU_STREAM_LEGACY {r['default_is_legacy']}, plans added by 5 dropout seeds "
          f"{r['plans_for_5_dropout_seeds']}: {'ok' if r['ok'] else 'FAIL'}")
    for paged in (False, True):
        r = kvcache_check(paged)
        rows.append(r)
        print(f"kvcache {'paged' if paged else 'contiguous'} fp16 with append on CUDA tensors against NumPy copies: "
              f"out {r['out']:.2e}, lse {r['lse']:.2e}, k_cache max diff {r['k_cache_max_diff']:.1e}, v_cache equal "
              f"{r['v_cache_equal']}, allocated {r['allocated']} bytes (out + lse {r['out_plus_lse']}): "
              f"{'ok' if r['ok'] else 'FAIL'}")
    fa_bench = {}
    if args.fa_bench_json:
        for line in open(args.fa_bench_json):
            p = json.loads(line)
            fa_bench[(p["b"], p["n"], p["h"], p["d"], p["dtype"])] = p["fwd_ms"]
    for shape, dtype in (((1, 128, 8, 64), "fp16"), ((4, 2048, 16, 128), "bf16")):
        r = overhead(shape, dtype, args.repeats, fa_bench)
        rows.append(r)
        extra = (f", fa-bench kernel {r['fa_bench_fwd_ms']:.4f} ms, Python overhead {r['python_overhead_ms']:.4f} ms"
                 if "fa_bench_fwd_ms" in r else " (no fa-bench figure)")
        print(f"overhead b{shape[0]} s{shape[1]} h{shape[2]} d{shape[3]} {dtype}: "
              f"Python call to kernel done {r['python_call_ms']:.4f} ms{extra}; the call returns after "
              f"{r['python_return_ms']:.4f} ms")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    failed = [r for r in rows if r.get("ok") is False]
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
