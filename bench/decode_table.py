#!/usr/bin/env python3
"""The decoding table of bench/decode_gpu.sh: fa-bench --decode's CSV beside
decode_sdpa.py's, one markdown row per (batch, cache): our time, K/V GB/s
and fraction of the copy bandwidth measured in the same run, SDPA's time
and the SDPA backend that ran fastest, and SDPA time / ours (> 1: faster
than SDPA)."""
import csv
import os
import sys


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.reader(f))


def main():
    ours = rows(sys.argv[1])
    peer = {}
    for r in rows(sys.argv[2]) if len(sys.argv) > 2 else []:
        peer[(int(r[0]), int(r[1]))] = (float(r[9]), r[8], r[7])
    if not ours:
        print("no fa-bench --decode results")
        return 1
    head = ours[0]
    col = {name: i for i, name in enumerate(head)}
    gqa = next(iter(peer.values()))[2] if peer else "-"
    print(f"SDPA GQA through {gqa}; frac = K/V bytes a step reads / time, over a device copy's (read + write) GB/s")
    print()
    print("| batch | cache | kernel | splits | ms | KV GB | GB/s | copy GB/s | frac | SDPA ms | SDPA backend | SDPA / ours |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ours[1:]:
        b, n = int(r[col["batch"]]), int(r[col["cache"]])
        ms = float(r[col["ms"]])
        p = peer.get((b, n))
        sdpa = f"{p[0]:.4f} | {p[1]} | {p[0] / ms:.2f}" if p else "- | - | -"
        print(f"| {b} | {n} | {r[col['variant']]} | {r[col['splits']]} | {ms:.4f} | "
              f"{float(r[col['kv_bytes']]) * 1e-9:.3f} | {float(r[col['gbs']]):.0f} | {float(r[col['copy_gbs']]):.0f} | "
              f"{float(r[col['fraction']]):.3f} | {sdpa} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
