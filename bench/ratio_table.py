#!/usr/bin/env python3
"""Prints a markdown table of our TFLOP/s beside each PyTorch SDPA backend's
and the ratios, from JSON lines written by fa-bench and sdpa_peer.py in one
run. Usage: ratio_table.py RESULTS.jsonl [--ours BACKEND] [--peers flash,cudnn]"""
import argparse
import json


def key(r):
    return (r["dtype"], r["d"], bool(r["causal"]), r["n"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--ours", default=None, help="fa-bench backend name (opencl, cuda, hip); default: all")
    ap.add_argument("--peers", default="flash,cudnn,efficient")
    args = ap.parse_args()
    ours, peers = {}, {}
    with open(args.results) as f:
        for line in f:
            r = json.loads(line)
            if "error" in r:
                continue
            if r["backend"] == "pytorch":
                peers.setdefault(r["algo"], {})[key(r)] = r
            elif r.get("algo") == "fused" and (args.ours is None or r["backend"] == args.ours):
                ours.setdefault(r["backend"], {})[key(r)] = r
    names = args.peers.split(",")
    for backend, rows in ours.items():
        print(f"\n### {backend} (fused) against PyTorch SDPA, TFLOP/s forward / backward\n")
        head = "| dtype | d | causal | N | ours fwd | ours bwd | " + " | ".join(
            f"{p} fwd | {p} bwd | ratio fwd | ratio bwd" for p in names) + " |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for k in sorted(rows):
            r = rows[k]
            cells = [k[0], str(k[1]), "yes" if k[2] else "no", str(k[3]), f"{r['fwd_tflops']:.1f}",
                     f"{r['bwd_tflops']:.1f}"]
            for p in names:
                pr = peers.get(p, {}).get(k)
                if pr:
                    cells += [f"{pr['fwd_tflops']:.1f}", f"{pr['bwd_tflops']:.1f}",
                              f"{r['fwd_tflops'] / pr['fwd_tflops']:.2f}", f"{r['bwd_tflops'] / pr['bwd_tflops']:.2f}"]
                else:
                    cells += ["-", "-", "-", "-"]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
