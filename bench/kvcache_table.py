#!/usr/bin/env python3
"""The decoding table of bench/kvcache_gpu.sh: one markdown row per (cache
layout, batch, cache length) from fa-bench --decode's CSV files (columns read
by name, so added columns do not matter), beside decode_sdpa.py's CSV on the
same contiguous cache: our time, the K/V bytes a step reads, their rate and
its fraction of the copy bandwidth measured in the same run, SDPA's time and
SDPA time / ours (> 1: faster than SDPA). Then the issue's bar per row
(from 16k keys: fraction >= 0.80 and faster than SDPA), with the rows that
miss it.

    kvcache_table.py [--sdpa SDPA.csv] LABEL=OURS.csv ..."""
import csv
import os
import sys

BAR_FRACTION = 0.80
BAR_FROM_KEYS = 16384


def read(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def main(argv):
    sdpa_path = None
    runs = []
    i = 0
    while i < len(argv):
        if argv[i] == "--sdpa" and i + 1 < len(argv):
            sdpa_path = argv[i + 1]
            i += 2
            continue
        label, _, path = argv[i].partition("=")
        runs.append((label, path))
        i += 1
    peer = {}
    gqa = "-"
    if sdpa_path and os.path.exists(sdpa_path):
        with open(sdpa_path) as f:
            for r in csv.reader(f):
                # batch,cache,seqlen_q,heads_q,heads_kv,d,dtype,gqa,backend,ms
                peer[(int(r[0]), int(r[1]))] = (float(r[9]), r[8])
                gqa = r[7]
    print(f"SDPA on the contiguous cache, GQA through {gqa}; frac = K/V bytes a step reads / time, over a device "
          "copy's (read + write) GB/s in the same run")
    print()
    print("| layout | batch | cache | kernel | splits | ms | KV GB | GB/s | copy GB/s | frac | SDPA ms | SDPA / ours |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    met, missed, rows = 0, [], 0
    for label, path in runs:
        data = read(path)
        if not data:
            print(f"| {label} | no results ({path}) |  |  |  |  |  |  |  |  |  |  |")
            continue
        for r in data:
            rows += 1
            b, n, ms = int(r["batch"]), int(r["cache"]), float(r["ms"])
            frac = float(r["fraction"])
            p = peer.get((b, n))
            ratio = p[0] / ms if p else None
            sdpa = f"{p[0]:.4f} ({p[1]}) | {ratio:.2f}" if p else "- | -"
            print(f"| {label} | {b} | {n} | {r['variant']} | {r['splits']} | {ms:.4f} | "
                  f"{float(r['kv_bytes']) * 1e-9:.3f} | {float(r['gbs']):.0f} | {float(r['copy_gbs']):.0f} | "
                  f"{frac:.3f} | {sdpa} |")
            if n >= BAR_FROM_KEYS:
                ok = frac >= BAR_FRACTION and (ratio is None or ratio >= 1.0)
                if ok:
                    met += 1
                else:
                    why = []
                    if frac < BAR_FRACTION:
                        why.append(f"frac {frac:.3f}")
                    if ratio is not None and ratio < 1.0:
                        why.append(f"{ratio:.2f}x SDPA")
                    missed.append(f"{label} batch {b} cache {n}: " + ", ".join(why))
    if not rows:
        print("no fa-bench --decode results")
        return 1
    print()
    print(f"Bar (caches of {BAR_FROM_KEYS} keys and up: frac >= {BAR_FRACTION:.2f} and at least SDPA's speed): "
          f"{met} rows meet it, {len(missed)} miss it" + (":" if missed else "."))
    for m in missed:
        print(f"- {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
