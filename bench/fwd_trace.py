#!/usr/bin/env python3
"""Reads the FWD_TRACE lines of one fa-run (bench/fwd_trace.sh) and prints,
for the last launch's block (0, 0, 0), the median clocks of each phase of
a key tile, consumer warpgroup by warpgroup, the transposer's waits, and
how the two warpgroups' tiles interleave.

A line: fwd-trace WHO TILE c0 .. c8, WHO 0 or 1 a consumer warpgroup (c0
loop top, c1 K in, c2 its turn, c3 V^T in, c4 products issued, c5 S
ready, c6 softmax done, c7 P V done, c8 P converted), 9 the first
transposer warp (c0 top, c1 V in, c2 V^T stage free, c3 transposed)."""
import statistics
import sys

rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if not f or f[0] != "fwd-trace":
        continue
    who, tile = int(f[1]), int(f[2])
    if tile == 0 and who in rows and len(rows[who]) > 1:
        rows[who] = {}  # a later launch: keep the last
    rows.setdefault(who, {})[tile] = [int(x) for x in f[3:]]
if not rows:
    sys.exit("no fwd-trace lines")
CONSUMER_PHASES = ["K wait", "turn wait", "S issued, V^T wait", "P V issued, turn end", "S wait", "softmax",
                   "P V wait", "rescale + convert"]
TRANSPOSER_PHASES = ["V wait", "V^T stage wait", "transpose"]
t0 = min(v[0] for r in rows.values() for v in r.values())
for who in sorted(rows):
    r = rows[who]
    tiles = sorted(r)
    steady = tiles[2:-2] if len(tiles) > 6 else tiles
    consumer = who != 9
    print("%s: %d tiles, first top at %d, last at %d clocks" %
          ("consumer warpgroup %d" % who if consumer else "transposer", len(tiles), r[tiles[0]][0] - t0,
           r[tiles[-1]][0] - t0))
    pairs = list(zip(steady, steady[1:]))
    nxt = [r[b][0] - r[a][0] for a, b in pairs]
    print("  period (top to top) median %d, min %d, max %d" % (statistics.median(nxt), min(nxt), max(nxt)))
    for k, name in enumerate(CONSUMER_PHASES if consumer else TRANSPOSER_PHASES, 1):
        d = [r[t][k] - r[t][k - 1] for t in steady]
        print("  %-22s median %6d  min %6d  max %6d" % (name, statistics.median(d), min(d), max(d)))
    if consumer:
        print("  %-22s median %6d" % ("to next top", statistics.median([r[b][0] - r[a][8] for a, b in pairs])))
if 0 in rows and 1 in rows:
    common = sorted(set(rows[0]) & set(rows[1]))[2:-2]
    d = [rows[1][t][4] - rows[0][t][4] for t in common]
    print("warpgroup 1 issues its products %d clocks (median) after warpgroup 0" % statistics.median(d))
    d = [rows[0][t][5] - rows[0][t][4] for t in common]
    e = [rows[1][t][5] - rows[1][t][4] for t in common]
    print("S ready after issue: warpgroup 0 %d, 1 %d clocks (median)" % (statistics.median(d), statistics.median(e)))
