#!/usr/bin/env python3
"""Prints a markdown table of TFLOP/s by run label beside PyTorch SDPA's
backends, each cell with its ratio to cuDNN, from JSON lines written by
fa-bench (--label) and sdpa_peer.py in one run: one column per label (a
schedule, a build option, a plan), rows (dtype, head dim, causal, N), and a
last row with each column's geometric mean over cuDNN and its lowest ratio.
Where ratio_table.py sets our backends beside every peer, this sets our
variants beside one another.

Usage: label_table.py RESULTS.jsonl --pass fwd|bwd"""
import argparse
import collections
import json
import math


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--pass", dest="which", choices=["fwd", "bwd"], required=True)
    args = ap.parse_args()
    rows = collections.defaultdict(dict)
    with open(args.results) as f:
        for line in f:
            r = json.loads(line)
            if r.get("error"):
                continue
            t = r.get(args.which + "_tflops") or (r.get("tflops") if args.which == "fwd" else None)
            if not t:
                continue
            name = r["label"] if r["label"] != "sdpa" else r["algo"]
            rows[(r["dtype"], r["d"], int(r["causal"]), r["n"])][name] = t
    cols = sorted({c for v in rows.values() for c in v})
    print("TFLOP/s %s (x cuDNN)" % ("forward" if args.which == "fwd" else "backward"))
    print("| dtype | d | causal | N | " + " | ".join(cols) + " |")
    print("|" + "---|" * (4 + len(cols)))
    for k in sorted(rows):
        ref = rows[k].get("cudnn")
        cells = []
        for c in cols:
            v = rows[k].get(c)
            cells.append("-" if v is None else "%.1f" % v + (" (%.2f)" % (v / ref) if ref else ""))
        print("| %s | %d | %d | %d | " % k + " | ".join(cells) + " |")

    def stat(c):
        r = [rows[k][c] / rows[k]["cudnn"] for k in rows if c in rows[k] and rows[k].get("cudnn")]
        return "%.3f (min %.2f)" % (math.exp(sum(map(math.log, r)) / len(r)), min(r)) if r else "-"

    print("| geomean x cuDNN | | | | " + " | ".join(stat(c) for c in cols) + " |")


if __name__ == "__main__":
    main()
