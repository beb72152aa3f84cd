#!/usr/bin/env python3
"""PyTorch SDPA on the decoding steps fa-bench --decode times: the same
contiguous cache layout (K and V stored [batch, cache, kv_heads, d], passed
to SDPA as transposed views), seqlen_q query tokens, grouped-query
attention through scaled_dot_product_attention(enable_gqa=True) where the
installed torch has it, else K and V expanded with repeat_interleave (its
copy is not timed: the expanded tensors are made once per point). Each
timed run starts after an untimed write of a buffer larger than the L2
cache, as fa-bench's do (with --flush read, a read of it: the cache is left
clean, as fa-bench --decode --flush read leaves it). Median over repeats of the default SDPA dispatch
and of each backend that accepts the shape; the fastest is reported.
Appends CSV rows: batch,cache,seqlen_q,heads_q,heads_kv,d,dtype,gqa,backend,ms."""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def ints(text):
    return [int(x) for x in text.split(",") if x]


def sdpa_has_gqa():
    """scaled_dot_product_attention is a builtin without a signature in some
    PyTorch builds: ask it instead, with a tiny GQA call."""
    q = torch.zeros(1, 2, 1, 8, device="cuda")
    kv = torch.zeros(1, 1, 1, 8, device="cuda")
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except TypeError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=ints, default=[1])
    ap.add_argument("--cache", type=ints, default=[4096])
    ap.add_argument("--seqlen-q", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--flush", default="fill", choices=["fill", "read"])
    ap.add_argument("--csv", required=True)
    a = ap.parse_args()
    dt = DTYPES[a.dtype]
    gqa = sdpa_has_gqa()
    how = "enable_gqa" if gqa else "repeat_interleave"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, GQA through {how}")
    flush = torch.ones(512 << 20, dtype=torch.uint8, device="cuda")
    flush_words = flush.view(torch.int32)

    def flush_cache():
        if a.flush == "read":
            torch.amax(flush_words)
        else:
            flush.fill_(1)
    with open(a.csv, "a") as out:
        for b in a.batch:
            for n in a.cache:
                try:
                    q = torch.randn(b, a.seqlen_q, a.heads, a.dim, dtype=dt, device="cuda").transpose(1, 2)
                    k = torch.randn(b, n, a.heads_kv, a.dim, dtype=dt, device="cuda").transpose(1, 2)
                    v = torch.randn(b, n, a.heads_kv, a.dim, dtype=dt, device="cuda").transpose(1, 2)
                    group = a.heads // a.heads_kv
                    if gqa:
                        args, kw = (q, k, v), {"enable_gqa": True}
                    else:
                        args, kw = (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)), {}
                except torch.OutOfMemoryError:
                    print(f"{b:5d} {n:7d} | out of memory")
                    torch.cuda.empty_cache()
                    continue
                # A decoding step sees the whole cache: no mask.
                results = {}
                for name, backend in [("default", None)] + list(BACKENDS.items()):
                    def step():
                        if backend is None:
                            return F.scaled_dot_product_attention(*args, **kw)
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(*args, **kw)
                    try:
                        for _ in range(3):
                            step()
                        times = []
                        for _ in range(a.repeats):
                            flush_cache()
                            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            s.record()
                            step()
                            e.record()
                            e.synchronize()
                            times.append(s.elapsed_time(e))
                        results[name] = statistics.median(times)
                    except RuntimeError:
                        continue
                if not results:
                    print(f"{b:5d} {n:7d} | no SDPA backend ran")
                    continue
                best = min(results, key=results.get)
                print(f"{b:5d} {n:7d} | {best:9s} {results[best]:9.4f} ms  ("
                      + ", ".join(f"{k} {v:.4f}" for k, v in results.items()) + ")")
                out.write(f"{b},{n},{a.seqlen_q},{a.heads},{a.heads_kv},{a.dim},{a.dtype},{how},{best},"
                          f"{results[best]:.6f}\n")
                out.flush()
                del q, k, v, args
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
