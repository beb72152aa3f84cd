#!/usr/bin/env python3
"""Prints markdown tables of our TFLOP/s beside every PyTorch SDPA backend
present in the results, forward and backward, with the ratios (ours / peer),
from JSON lines written by fa-bench and sdpa_peer.py in one run. One table
per fa-bench backend (opencl, cuda, hip); rows are (dtype, head dim, causal,
N); a peer that has no row of that backend's shapes gets no columns. A point
that failed shows its error ("oom" for out of memory). The last row gives the
geometric mean of each ratio over the rows where both ran.

Usage: ratio_table.py RESULTS.jsonl [--ours BACKEND] [--peers flash,cudnn]
                      [--algo fused] [--ratios-only]"""
import argparse
import json
import math
import sys

PEER_ORDER = ["flash", "cudnn", "efficient", "math"]
PEER_TITLES = {"flash": "FA2", "cudnn": "cuDNN", "efficient": "mem-eff", "math": "math"}


def key(r):
    return (r["dtype"], r["d"], bool(r["causal"]), r["n"])


def sort_key(k):
    dtypes = {"fp32": 0, "fp16": 1, "bf16": 2}
    return (dtypes.get(k[0], 9), k[0], k[1], k[2], k[3])


def tflops(r, which):
    """TFLOP/s of one pass, or None where the point failed or the pass did not run."""
    if r is None or "error" in r:
        return None
    x = r.get(f"{which}_tflops")
    return x if isinstance(x, (int, float)) and x > 0 else None


def cell(r, which):
    if r is None:
        return "-"
    if "error" in r:
        return "oom" if r["error"] == "oom" else "failed"
    x = tflops(r, which)
    if x is None:
        return "-"
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def load(path, ours_filter, algo):
    ours, peers = {}, {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"{path}:{lineno}: not JSON ({e}); skipped", file=sys.stderr)
                continue
            if r.get("backend") == "pytorch":
                peers.setdefault(r["algo"], {})[key(r)] = r
            elif r.get("algo") == algo and (ours_filter is None or r.get("backend") == ours_filter):
                ours.setdefault(r["backend"], {})[key(r)] = r
    return ours, peers


def table(backend, algo, rows, peers, names, ratios_only):
    present = [p for p in names if any(k in peers.get(p, {}) for k in rows)]
    print(f"\n### {backend} ({algo}) against PyTorch SDPA, TFLOP/s forward / backward\n")
    if not present:
        print("(no PyTorch SDPA results for these shapes)\n")
    cols = ["dtype", "d", "causal", "N", "ours fwd", "ours bwd"]
    for p in present:
        t = PEER_TITLES.get(p, p)
        cols += ([] if ratios_only else [f"{t} fwd", f"{t} bwd"]) + [f"ours/{t} fwd", f"ours/{t} bwd"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    logs = {(p, w): [] for p in present for w in ("fwd", "bwd")}
    for k in sorted(rows, key=sort_key):
        r = rows[k]
        cells = [k[0], str(k[1]), "yes" if k[2] else "no", str(k[3]), cell(r, "fwd"), cell(r, "bwd")]
        for p in present:
            pr = peers.get(p, {}).get(k)
            if not ratios_only:
                cells += [cell(pr, "fwd"), cell(pr, "bwd")]
            for w in ("fwd", "bwd"):
                a, b = tflops(r, w), tflops(pr, w)
                if a is not None and b is not None:
                    cells.append(f"{a / b:.2f}")
                    logs[(p, w)].append(math.log(a / b))
                else:
                    cells.append("-")
        print("| " + " | ".join(cells) + " |")
    if present:
        cells = ["geomean", "", "", "", "", ""]
        for p in present:
            if not ratios_only:
                cells += ["", ""]
            for w in ("fwd", "bwd"):
                v = logs[(p, w)]
                cells.append(f"**{math.exp(sum(v) / len(v)):.2f}**" if v else "-")
        print("| " + " | ".join(cells) + " |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--ours", default=None, help="fa-bench backend name (opencl, cuda, hip); default: all")
    ap.add_argument("--peers", default=None,
                    help="SDPA backends to compare with, in this order; default: every one present")
    ap.add_argument("--algo", default="fused", help="fa-bench algorithm to compare (default fused)")
    ap.add_argument("--ratios-only", action="store_true", help="ratio columns only, no peer TFLOP/s")
    args = ap.parse_args()
    ours, peers = load(args.results, args.ours, args.algo)
    if args.peers:
        names = args.peers.split(",")
    else:
        names = [p for p in PEER_ORDER if p in peers] + sorted(p for p in peers if p not in PEER_ORDER)
    if not ours:
        print(f"no fa-bench results ({args.algo}{', ' + args.ours if args.ours else ''}) in {args.results}",
              file=sys.stderr)
        return 1
    order = ["cuda", "hip", "opencl"]
    for backend in sorted(ours, key=lambda b: (order.index(b) if b in order else len(order), b)):
        table(backend, args.algo, ours[backend], peers, names, args.ratios_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
