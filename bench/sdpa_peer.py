#!/usr/bin/env python3
"""Times PyTorch SDPA backends on the shapes fa-bench sweeps (same token
budget, hidden size, dtypes, head dims, causal flag; or a fixed batch and
head count with --batch / --heads), on the same GPU in the same run, and
appends JSON lines in fa-bench's schema (backend "pytorch", algo = the SDPA
backend: flash, cudnn, efficient, math). FLOPs are counted as fa-bench
counts them: forward 4*b*h*N^2*d (times the causal mask's visible
fraction), backward 2.5x forward.

Memory: device_bytes is torch.cuda.max_memory_allocated() over the point,
with the peak reset before it: the inputs Q, K, V plus everything the
forward and backward allocate (O, dO, the gradients, saved tensors,
workspace), which is what fa-bench's device_bytes counts for its own call.
fwd_device_bytes and bwd_device_bytes are the peaks of the forward timing
alone and of the backward timing. A point that runs out of memory is
written with "error": "oom"; a backend that cannot run the shape or dtype
with the error message."""
import argparse
import gc
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def time_ms(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def visible_fraction(n, causal):
    return (n + 1) / (2 * n) if causal else 1.0


def first_line(e):
    text = str(e).strip()
    return text.splitlines()[0][:160] if text else type(e).__name__


def release():
    gc.collect()
    torch.cuda.empty_cache()


def time_backend(name, q, k, v, causal, warmup, repeats, dropout=0.0):
    """Forward and backward timings and memory peaks of one SDPA backend."""
    rec = {}
    with sdpa_kernel([BACKENDS[name]]):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fwd = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal), warmup,
                      repeats)
        fwd_peak = torch.cuda.max_memory_allocated()
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal)
        g = torch.randn_like(o)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        bwd = time_ms(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True), warmup, repeats)
        bwd_peak = torch.cuda.max_memory_allocated()
        del o, g
    rec.update(fwd_ms=fwd, bwd_ms=bwd, fwd_device_bytes=fwd_peak, bwd_device_bytes=bwd_peak,
               device_bytes=max(fwd_peak, bwd_peak))
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen (at least 1)")
    ap.add_argument("--hidden", type=int, default=2048, help="heads = hidden / dim")
    ap.add_argument("--batch", type=int, default=0, help="fixed batch (overrides --tokens)")
    ap.add_argument("--heads", type=int, default=0, help="fixed heads (overrides --hidden)")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout probability (fa-bench --dropout)")
    ap.add_argument("--backends", default="flash,cudnn,efficient")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--math-repeats", type=int, default=0,
                    help="repeats for the math backend (default: --repeats); it is slow at large N")
    ap.add_argument("--json", required=True)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    names = args.backends.split(",")
    for name in names:
        if name not in BACKENDS:
            ap.error(f"--backends: unknown backend {name!r} (expected {', '.join(BACKENDS)})")
    dev = torch.cuda.get_device_name()
    with open(args.json, "a") as out:
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            for d in map(int, args.dims.split(",")):
                for causal in (c == "1" for c in args.causal.split(",")):
                    for n in map(int, args.seqlens.split(",")):
                        b = args.batch if args.batch > 0 else max(1, args.tokens // n)
                        h = args.heads if args.heads > 0 else args.hidden // d
                        flops = 4 * b * h * n * n * d * visible_fraction(n, causal)
                        base = dict(label=args.label, backend="pytorch", device=dev, dtype=dname, d=d, n=n, b=b,
                                    h=h, h_kv=h, causal=causal, dropout=args.dropout, **{"pass": "both"})
                        try:
                            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, requires_grad=True)
                                       for _ in range(3))
                        except torch.cuda.OutOfMemoryError as e:
                            for name in names:
                                rec = dict(base, algo=name, error="oom", message=first_line(e))
                                out.write(json.dumps(rec) + "\n")
                                print(json.dumps(rec), flush=True)
                            release()
                            continue
                        for name in names:
                            rec = dict(base, algo=name)
                            repeats = args.math_repeats if name == "math" and args.math_repeats > 0 else args.repeats
                            try:
                                rec.update(time_backend(name, q, k, v, causal, args.warmup, repeats, args.dropout))
                                rec.update(fwd_tflops=flops / rec["fwd_ms"] * 1e-9,
                                           bwd_tflops=2.5 * flops / rec["bwd_ms"] * 1e-9)
                            except torch.cuda.OutOfMemoryError as e:
                                rec.update(error="oom", message=first_line(e))
                            except Exception as e:  # a backend that does not support the shape or dtype
                                rec.update(error=first_line(e), message=first_line(e))
                            release()
                            out.write(json.dumps(rec) + "\n")
                            out.flush()
                            print(json.dumps(rec), flush=True)
                        del q, k, v
                        release()


if __name__ == "__main__":
    main()
