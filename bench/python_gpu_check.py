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
3. Overhead: the median wall time of one flash_attn_func call (forward,
   stream synchronised before and after) beside the kernel's device time
   that fa-bench reports for the same shape (--fa-bench-json).

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


def overhead(shape, dtype, repeats, fa_bench):
    b, s, h, d = shape
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    for _ in range(10):
        flashattn.flash_attn_func(q, k, v)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        flashattn.flash_attn_func(q, k, v)
        times.append((time.perf_counter() - t0) * 1e3)
    py_ms = statistics.median(times)
    row = {"check": "overhead", "b": b, "s": s, "h": h, "d": d, "dtype": dtype, "python_call_ms": py_ms}
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
              f"Python call {r['python_call_ms']:.4f} ms{extra}")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    failed = [r for r in rows if r.get("ok") is False]
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
