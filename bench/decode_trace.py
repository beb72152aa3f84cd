#!/usr/bin/env python3
"""Where a decoding step's time goes, block by block: reads the lines the
DECODE_TRACE build of kernels_cuda/decode.cu prints (one a block: its grid
position, SM, and the global timer at its start, first tile in, last tile
done, partial rows stored, arrival as the last split, merge done; 0 where it
did not get there), splits them into launches (a launch ends where a block
position repeats) and prints, per launch, in microseconds from the first
block's start: when blocks started, when their first tile was in, when
their tiles were done and stored, and the merging blocks' arrival and end.

    decode_trace.py TRACE.txt"""
import statistics
import sys


def launches(lines):
    cur, seen = [], set()
    for ln in lines:
        f = ln.split()
        if len(f) != 11 or f[0] != "decode-trace":
            continue
        pos = tuple(f[1:4])
        if pos in seen:
            yield cur
            cur, seen = [], set()
        seen.add(pos)
        cur.append([int(x) for x in f[1:]])
    if cur:
        yield cur


def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))] if v else float("nan")


def summary(blocks):
    t0 = min(b[4] for b in blocks)
    us = lambda t: (t - t0) / 1000.0
    start = [us(b[4]) for b in blocks]
    first = [us(b[5]) for b in blocks if b[5]]
    tiles = [us(b[6]) for b in blocks]
    stored = [us(b[7]) for b in blocks]
    merging = [b for b in blocks if b[8]]
    end = max([us(b[9]) for b in merging] + stored)
    out = [f"{len(blocks)} blocks on {len(set(b[3] for b in blocks))} SMs, {len(merging)} merging; "
           f"step {end:.2f} us"]
    for name, v in (("start", start), ("first tile in", first), ("tiles done", tiles), ("partials stored", stored)):
        out.append(f"  {name:16s} min {min(v):7.2f}  median {statistics.median(v):7.2f}  p90 {q(v, 0.9):7.2f}  "
                   f"max {max(v):7.2f}")
    per_block = [(b[6] - b[5]) / 1000.0 for b in blocks if b[5]]
    out.append(f"  {'first -> done':16s} min {min(per_block):7.2f}  median {statistics.median(per_block):7.2f}  "
               f"max {max(per_block):7.2f}  (a block's own streaming time)")
    if merging:
        arr = [us(b[8]) for b in merging]
        dur = [(b[9] - b[8]) / 1000.0 for b in merging]
        out.append(f"  merge: last arrivals at {min(arr):.2f}-{max(arr):.2f}, merges take "
                   f"{min(dur):.2f}-{max(dur):.2f}")
    return "\n".join(out)


def main():
    with open(sys.argv[1]) as f:
        all_launches = list(launches(f))
    if not all_launches:
        print("no decode-trace lines")
        return 1
    # Warm-up launches first; the last few are the timed ones.
    for i, blocks in enumerate(all_launches[-3:]):
        print(f"launch {len(all_launches) - min(3, len(all_launches)) + i + 1} of {len(all_launches)}: "
              + summary(blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
