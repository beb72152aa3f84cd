#!/usr/bin/env python3
"""Times PyTorch SDPA backends on the shapes fa-bench sweeps (same token
budget, hidden size, dtypes, head dims, causal flag), on the same GPU in the
same run, and appends JSON lines in fa-bench's schema (algo = the SDPA
backend). FLOPs are counted as fa-bench counts them: forward 4*b*h*N^2*d
(halved by the causal mask's visible fraction), backward 2.5x forward."""
import argparse
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--backends", default="flash,cudnn,efficient")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", required=True)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    dev = torch.cuda.get_device_name()
    with open(args.json, "a") as out:
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            for d in map(int, args.dims.split(",")):
                for causal in (c == "1" for c in args.causal.split(",")):
                    for n in map(int, args.seqlens.split(",")):
                        b, h = max(1, args.tokens // n), args.hidden // d
                        flops = 4 * b * h * n * n * d * visible_fraction(n, causal)
                        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, requires_grad=True)
                                   for _ in range(3))
                        for name in args.backends.split(","):
                            rec = dict(label=args.label, backend="pytorch", device=dev, algo=name, dtype=dname,
                                       d=d, n=n, b=b, h=h, causal=causal)
                            try:
                                with sdpa_kernel([BACKENDS[name]]):
                                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                    g = torch.randn_like(o)
                                    fwd = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                                  args.warmup, args.repeats)
                                    bwd = time_ms(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True),
                                                  args.warmup, args.repeats)
                                rec.update(fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=flops / fwd * 1e-9,
                                           bwd_tflops=2.5 * flops / bwd * 1e-9)
                            except Exception as e:  # a backend that does not support the shape or dtype
                                rec.update(error=str(e).splitlines()[0][:160] if str(e) else type(e).__name__)
                            out.write(json.dumps(rec) + "\n")
                            out.flush()
                            print(json.dumps(rec), flush=True)
                        del q, k, v
                        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
