#!/usr/bin/env python3
"""Plots from the JSON lines that fa-bench and sdpa_peer.py write.

Figures (PNG and SVG in the output folder):
  runtime_*     time against sequence length, log-log, one panel per pass:
                fused and standard attention of each backend measured, and
                each PyTorch SDPA backend (the FlashAttention paper's speed
                figure); out-of-memory points are marked at the top edge
  throughput_*  the same points as TFLOP/s
  memory_*      device memory against sequence length (the paper's memory
                figure); an out-of-memory point is a cross at the memory
                the call needed where the row says, else on the top edge;
                forward-only runs (pass "fwd") are a series of their own
  roofline_*    one per device: measured TFLOP/s against arithmetic
                intensity (FLOPs over the IO model's predicted HBM bytes),
                under the compute and bandwidth ceilings

A figure covers one device, dtype, head dimension, causal flag and head
count, and one shape family: a fixed token budget (batch x N constant, the
FlashAttention-2 paper's setting) or a fixed batch (long sequences).

Ceilings: fa-bench does not write them, so give them with --peak-tflops
VALUE[:LABEL] and --bandwidth-gbs VALUE[:LABEL] (both repeatable); rows that
carry "peak_tflops" or "bandwidth_gbs" add theirs.

Usage: plots.py RESULTS.jsonl [MORE.jsonl ...] [-o DIR] [--list]
"""
import argparse
import json
import math
import os
import re
import sys
from collections import OrderedDict, defaultdict

PASSES = (("fwd", "forward"), ("bwd", "backward"), ("fwdbwd", "forward + backward"))
# FLOPs of a pass relative to the forward (the papers' convention).
PASS_FLOPS = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
KINDS = ("runtime", "throughput", "memory", "roofline")

BACKEND_NAMES = {"cuda": "CUDA", "opencl": "OpenCL", "hip": "HIP", "reference": "CPU reference"}
PEER_NAMES = {
    "flash": "PyTorch SDPA flash (FA2)",
    "cudnn": "PyTorch SDPA cuDNN",
    "efficient": "PyTorch SDPA mem-efficient",
    "math": "PyTorch SDPA math",
}
# Fixed colours so that a series looks the same in every figure.
SERIES_STYLE = {
    ("cuda", "fused"): ("#1f4e9c", "-", "o"),
    ("opencl", "fused"): ("#2a9d8f", "-", "o"),
    ("hip", "fused"): ("#6a4c93", "-", "o"),
    ("cuda", "standard"): ("#c0392b", "--", "s"),
    ("opencl", "standard"): ("#e76f51", "--", "s"),
    ("hip", "standard"): ("#b5838d", "--", "s"),
    ("pytorch", "flash"): ("#f4a261", ":", "^"),
    ("pytorch", "cudnn"): ("#7f7f7f", ":", "D"),
    ("pytorch", "efficient"): ("#8ab17d", ":", "v"),
    ("pytorch", "math"): ("#bc6c25", ":", "P"),
}
FALLBACK_COLOURS = ("#17becf", "#bcbd22", "#e377c2", "#8c564b", "#9467bd", "#d62728")


def die(msg, code=2):
    print(f"plots.py: {msg}", file=sys.stderr)
    sys.exit(code)


def number(v):
    """A finite positive float, or None (missing, zero, null, text)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) and v > 0 else None


def load(paths):
    rows, skipped = [], []
    for path in paths:
        try:
            f = open(path)
        except OSError as e:
            die(f"cannot read {path}: {e.strerror}")
        with f:
            for i, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                where = f"{os.path.basename(path)}:{i}"
                try:
                    r = json.loads(line)
                except ValueError:
                    skipped.append((where, "not JSON"))
                    continue
                if not isinstance(r, dict):
                    skipped.append((where, "not a JSON object"))
                    continue
                missing = [k for k in ("dtype", "d", "n") if k not in r]
                if missing:
                    skipped.append((where, "no " + ", ".join(missing)))
                    continue
                try:
                    r["d"], r["n"] = int(r["d"]), int(r["n"])
                    r["b"] = int(r.get("b") or 1)
                    r["h"] = int(r.get("h") or 0)
                except (TypeError, ValueError):
                    skipped.append((where, "d, n, b or h not an integer"))
                    continue
                r["_where"] = where
                r["device"] = str(r.get("device") or "unknown device")
                r["backend"] = str(r.get("backend") or "?")
                r["algo"] = str(r.get("algo") or "?")
                r["causal"] = bool(r.get("causal"))
                r["label"] = str(r.get("label") or "")
                rows.append(r)
    return rows, skipped


def error_kind(r):
    """None for a measured point, 'oom' or 'failed' otherwise."""
    err = r.get("error")
    if not err:
        return None
    text = str(err).lower()
    return "oom" if text == "oom" or "out of memory" in text or "outofmemory" in text else "failed"


def series_key(r, by_label, split_forward_only=False):
    """(backend, algo, label or "", "fwd" for forward-only runs where those
    are kept apart: the memory figure, as they allocate no gradients)."""
    fwd_only = "fwd" if split_forward_only and r.get("pass") == "fwd" else ""
    return (r["backend"], r["algo"], r["label"] if by_label else "", fwd_only)


def series_name(key):
    backend, algo, label, fwd_only = key
    if backend == "pytorch":
        name = PEER_NAMES.get(algo, f"PyTorch SDPA {algo}")
    else:
        kind = {"fused": "fused", "standard": "standard (unfused)"}.get(algo, algo)
        name = f"flashattn {BACKEND_NAMES.get(backend, backend)} {kind}"
    if fwd_only:
        name += ", forward only"
    return f"{name} [{label}]" if label else name


def series_style(key, fallback_index):
    """(colour, line style, marker, marker face colour)."""
    colour, ls, marker = SERIES_STYLE.get(key[:2]) or (FALLBACK_COLOURS[fallback_index % len(FALLBACK_COLOURS)],
                                                         "-.", "x")
    if key[3]:  # forward-only runs: same colour, hollow markers, dash-dot
        return colour, "-.", marker, "white"
    return colour, ls, marker, colour


def visible_fraction(r):
    n = r["n"]
    return (n + 1) / (2 * n) if r["causal"] and n > 0 else 1.0


def pass_ms(r, p):
    return number(r.get(f"{p}_ms"))


def pass_flops(r, p):
    """FLOPs as the row counted them (TFLOP/s x ms), else from the shape."""
    ms, tf = pass_ms(r, p), number(r.get(f"{p}_tflops"))
    if ms and tf:
        return tf * ms * 1e9
    if r["h"] <= 0:
        return None
    return 4.0 * r["b"] * r["h"] * r["n"] * r["n"] * r["d"] * visible_fraction(r) * PASS_FLOPS[p]


def pred_bytes(r, p):
    if p == "fwdbwd":
        f, b = number(r.get("pred_fwd_bytes")), number(r.get("pred_bwd_bytes"))
        return f + b if f and b else None
    return number(r.get(f"pred_{p}_bytes"))


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


# --------------------------------------------------------------------------
# Grouping

def families(rows):
    """Shape family of each row of one (device, dtype, d, causal, heads)
    group. A token budget T is a family when rows of two or more sequence
    lengths share batch x N = T; the rest form fixed-batch families. A row
    fits every family its shape belongs to."""
    lengths = defaultdict(set)
    for r in rows:
        lengths[r["b"] * r["n"]].add(r["n"])
    budgets = {t for t, ns in lengths.items() if len(ns) >= 2}
    batches = {r["b"] for r in rows if r["b"] * r["n"] not in budgets}
    out = defaultdict(list)
    for r in rows:
        if r["b"] * r["n"] in budgets:
            out[("tokens", r["b"] * r["n"])].append(r)
        if r["b"] in batches:
            out[("batch", r["b"])].append(r)
    return out


def figure_groups(rows):
    by_shape = defaultdict(list)
    for r in rows:
        by_shape[(r["device"], r["dtype"], r["d"], r["causal"], r["h"])].append(r)
    groups = OrderedDict()
    for key in sorted(by_shape, key=lambda k: (k[0], k[1], k[2], k[3], k[4])):
        for fam, members in sorted(families(by_shape[key]).items()):
            groups[key + fam] = members
    return groups


def group_title(key):
    device, dtype, d, causal, h, fam, value = key
    shape = f"batch x N = {value} tokens" if fam == "tokens" else f"batch {value}"
    heads = f", {h} heads" if h else ""
    return f"{device}: {dtype}, d = {d}{heads}, {shape}{', causal' if causal else ''}"


def group_file(kind, key, prefix):
    device, dtype, d, causal, h, fam, value = key
    tag = f"t{value}" if fam == "tokens" else f"b{value}"
    return f"{prefix}{kind}_{slug(device)}_{dtype}_d{d}_h{h}_{tag}{'_causal' if causal else ''}"


def collect_series(members, by_label, split_forward_only=False):
    """Per series: {n: [rows]} in file order. Where several rows share a
    point, a figure draws the last one that measured what it shows."""
    series = OrderedDict()
    for r in members:
        k = series_key(r, by_label, split_forward_only)
        series.setdefault(k, {}).setdefault(r["n"], []).append(r)
    dups = [(series_name(k), n, len(rs)) for k, pts in series.items() for n, rs in pts.items() if len(rs) > 1]
    peer_rank = {name: i for i, name in enumerate(PEER_NAMES)}
    order = sorted(series, key=lambda k: (k[0] == "pytorch", k[1] != "fused", peer_rank.get(k[1], 99), k))
    return OrderedDict((k, series[k]) for k in order), dups


def measured(rows, value_of):
    """The last row that has the value (None if none has)."""
    found = None
    for r in rows:
        if not error_kind(r) and value_of(r):
            found = r
    return found


def point_status(rows, value_of):
    """'ok', 'oom', 'failed' or None (nothing about this value)."""
    if measured(rows, value_of):
        return "ok"
    kinds = {error_kind(r) for r in rows}
    return "oom" if "oom" in kinds else "failed" if "failed" in kinds else None


def memory_of(r):
    return number(r.get("device_bytes"))


def passes_present(members):
    return [p for p, _ in PASSES if any(pass_ms(r, p) for r in members)]


# --------------------------------------------------------------------------
# Listing

def describe_points(pts, value_of):
    status = {n: point_status(rows, value_of) for n, rows in pts.items()}
    ok, oom, failed = ([n for n in sorted(status) if status[n] == s] for s in ("ok", "oom", "failed"))
    text = f"{len(ok)} points" + (f" (N {ok[0]}..{ok[-1]})" if ok else "")
    if oom:
        text += f", out of memory at N = {', '.join(map(str, oom))}"
    if failed:
        text += f", failed at N = {', '.join(map(str, failed))} (not drawn)"
    return text


def plan_figures(rows, args):
    """What would be drawn: (kind, file stem, title, group key, data, passes,
    lines for --list) per figure."""
    plans = []
    kinds = args.kinds
    for key, members in figure_groups(rows).items():
        if args.dtypes and key[1] not in args.dtypes:
            continue
        if args.dims and key[2] not in args.dims:
            continue
        series, dups = collect_series(members, args.by_label)
        passes = [p for p in passes_present(members) if not args.passes or p in args.passes]
        title = group_title(key)
        for kind in ("runtime", "throughput"):
            if kind not in kinds or not passes:
                continue
            lines = []
            for k, pts in series.items():
                for p in passes:
                    lines.append(f"{series_name(k)}, {p}: {describe_points(pts, lambda r, p=p: pass_ms(r, p))}")
            lines += [f"{count} rows for {name} at N = {n}: the last that measured a value is drawn"
                      for name, n, count in dups]
            plans.append((kind, group_file(kind, key, args.prefix), title, key, series, passes, lines))
        if "memory" in kinds and any(memory_of(r) or error_kind(r) == "oom" for r in members):
            mem_series, _ = collect_series(members, args.by_label, split_forward_only=True)
            mem_series = OrderedDict((k, pts) for k, pts in mem_series.items()
                                     if any(memory_of(r) or error_kind(r) == "oom"
                                            for rows in pts.values() for r in rows))
            lines = [f"{series_name(k)}: {describe_points(pts, memory_of)}" for k, pts in mem_series.items()]
            plans.append(("memory", group_file("memory", key, args.prefix), title, key, mem_series, passes, lines))
    if "roofline" in kinds:
        by_device = defaultdict(list)
        for r in rows:
            if (not args.dtypes or r["dtype"] in args.dtypes) and (not args.dims or r["d"] in args.dims):
                by_device[r["device"]].append(r)
        for device in sorted(by_device):
            pts, no_pred = roofline_points(by_device[device])
            ceilings = roofline_ceilings(by_device[device], args)
            if not pts:
                continue
            lines = [f"{len(pts)} kernel points ({len({(p['backend'], p['algo'], p['pass']) for p in pts})} kinds)"]
            lines += [f"ceiling: {lab} {val:g} TFLOP/s" for val, lab in ceilings[0]]
            lines += [f"ceiling: {lab} {val:g} GB/s" for val, lab in ceilings[1]]
            if not ceilings[0] and not ceilings[1]:
                lines.append("no ceilings: give --peak-tflops and --bandwidth-gbs")
            if no_pred:
                lines.append("not placed (no predicted bytes): " + ", ".join(sorted(no_pred)))
            plans.append(("roofline", f"{args.prefix}roofline_{slug(device)}", f"{device}: roofline", device,
                          (pts, ceilings), None, lines))
    return plans


# --------------------------------------------------------------------------
# Roofline data

def roofline_points(rows):
    pts, no_pred = [], set()
    for r in rows:
        if error_kind(r):
            continue
        for p in ("fwd", "bwd"):
            ms = pass_ms(r, p)
            if not ms:
                continue
            flops, nbytes = pass_flops(r, p), pred_bytes(r, p)
            if not flops:
                continue
            if not nbytes:
                no_pred.add(series_name(series_key(r, False)))
                continue
            pts.append({"backend": r["backend"], "algo": r["algo"], "dtype": r["dtype"], "d": r["d"], "n": r["n"],
                        "pass": p, "intensity": flops / nbytes, "tflops": flops / ms * 1e-9})
    return pts, no_pred


def parse_ceiling(text, what):
    value, _, label = text.partition(":")
    try:
        v = float(value)
    except ValueError:
        die(f"{what} expects VALUE[:LABEL], got '{text}'")
    if not (v > 0 and math.isfinite(v)):
        die(f"{what} must be a positive number, got '{text}'")
    return v, label or None


def roofline_ceilings(rows, args):
    peaks, bws = OrderedDict(), OrderedDict()
    for text in args.peak_tflops:
        v, lab = parse_ceiling(text, "--peak-tflops")
        peaks.setdefault(v, lab or "peak compute")
    for text in args.bandwidth_gbs:
        v, lab = parse_ceiling(text, "--bandwidth-gbs")
        bws.setdefault(v, lab or "memory bandwidth")
    by_value = defaultdict(set)
    for r in rows:
        v = number(r.get("peak_tflops"))
        if v:
            by_value[v].add(r["dtype"])
        v = number(r.get("bandwidth_gbs"))
        if v:
            bws.setdefault(v, "bandwidth (device description)")
    for v, dtypes in sorted(by_value.items()):
        peaks.setdefault(v, "peak " + "/".join(sorted(dtypes)) + " (device description)")
    return list(peaks.items()), list(bws.items())


# --------------------------------------------------------------------------
# Drawing

def setup_matplotlib():
    try:
        import matplotlib
    except ImportError:
        die("matplotlib is not installed; install it with\n"
            "    python3 -m pip install --user matplotlib\n"
            "or your distribution's package (Debian/Ubuntu: sudo apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({
        "font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 9.5,
        "figure.titlesize": 13, "axes.grid": True, "grid.alpha": 0.3, "grid.linestyle": "-",
        "svg.fonttype": "none", "svg.hashsalt": "flashattn", "savefig.bbox": "tight",
    })
    return plt


def log_axis_n(ax, ns):
    """Sequence lengths on a log2 axis labelled 1k, 2k, ..."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(ns))
    ax.set_xticks(ticks)
    ax.set_xticklabels([human_n(n) for n in ticks], rotation=0 if len(ticks) <= 8 else 45)
    ax.minorticks_off()
    ax.set_xlabel("sequence length N")


def human_n(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}k"
    return str(n)


def log_axis_y(ax):
    """Readable labels on a log y axis (call once its limits are final):
    plain numbers where every tick has few digits, else powers of ten;
    1, 2, 5 x 10^k over a few decades, fewer ticks over many."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    lo, hi = ax.get_ylim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1
    subs = (1.0, 2.0, 5.0) if decades <= 3.5 else (1.0, 3.0) if decades <= 5 else (1.0,)
    plain = lo >= 1e-3 and hi < 1e5

    def label(v, _pos=None):
        if v <= 0:
            return ""
        if plain:
            return f"{v:g}"
        exp = math.floor(math.log10(v) + 1e-9)
        mant = round(v / 10 ** exp, 6)
        return f"$10^{{{exp}}}$" if mant == 1 else f"${mant:g}\\cdot 10^{{{exp}}}$"

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(label))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(lo, hi)


def oom_headroom(ax, rows):
    """Raise the top of the y axis so that the rows of out-of-memory marks
    sit above every data point."""
    if rows <= 0:
        return
    lo, hi = ax.get_ylim()
    keep = 1.0 - 0.06 - 0.055 * rows  # the fraction of the height left to the data
    if ax.get_yscale() == "log":
        ax.set_ylim(lo, lo * (hi / lo) ** (1.0 / keep))
    else:
        ax.set_ylim(lo, lo + (hi - lo) / keep)


def mark_oom(ax, xs, colour, row):
    """Out-of-memory points as crosses along the top edge of the axes, one
    row per series so that two series failing at the same N stay visible."""
    if not xs:
        return
    import matplotlib.transforms as mtransforms
    trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    ax.scatter(xs, [0.96 - 0.055 * row] * len(xs), transform=trans, marker="x", s=70, linewidths=2.2,
               color=colour, clip_on=False, zorder=5)


def oom_handle(plt):
    from matplotlib.lines import Line2D
    return Line2D([], [], color="black", marker="x", linestyle="none", markersize=8, markeredgewidth=2,
                  label="out of memory (x along the top)")


def draw_vs_n(plt, plan, kind):
    _, stem, title, key, series, passes, _ = plan
    fig, axes = plt.subplots(1, len(passes), figsize=(5.6 * len(passes) + 0.4, 4.6), squeeze=False)
    axes = axes[0]
    any_oom, handles = False, OrderedDict()
    # One x range for every panel, so that the panels line up.
    all_ns = {n for pts in series.values() for n, rows in pts.items()
              if any(point_status(rows, lambda r, p=p: pass_ms(r, p)) in ("ok", "oom") for p in passes)}
    for ax, p in zip(axes, passes):
        oom_rows = 0
        # Seconds rather than ms where some point of the panel takes more than 20 s.
        longest = max((pass_ms(r, p) or 0 for pts in series.values() for rows in pts.values() for r in rows),
                      default=0)
        unit, scale = ("s", 1e-3) if longest > 2e4 else ("ms", 1.0)
        for i, (k, pts) in enumerate(series.items()):
            colour, ls, marker, face = series_style(k, i)

            def has(r, p=p):
                return pass_ms(r, p)

            xs, ys, oom = [], [], []
            for n in sorted(pts):
                r = measured(pts[n], has)
                if r:
                    ms = pass_ms(r, p)
                    xs.append(n)
                    ys.append(ms * scale if kind == "runtime" else pass_flops(r, p) / ms * 1e-9)
                elif point_status(pts[n], has) == "oom":
                    oom.append(n)
            if xs:
                (h,) = ax.plot(xs, ys, linestyle=ls, marker=marker, color=colour, markerfacecolor=face, linewidth=2,
                               markersize=6, label=series_name(k))
                handles.setdefault(series_name(k), h)
            if oom:
                any_oom = True
                mark_oom(ax, oom, colour, oom_rows)
                oom_rows += 1
                if not xs:
                    from matplotlib.lines import Line2D
                    handles.setdefault(series_name(k), Line2D([], [], linestyle=ls, marker=marker, color=colour,
                                                              markerfacecolor=face, label=series_name(k)))
        ax.set_title(dict(PASSES)[p])
        if all_ns:
            log_axis_n(ax, all_ns)
        if kind == "runtime":
            ax.set_yscale("log")
            ax.set_ylabel(f"time ({unit}, log scale)")
        else:
            ax.set_ylim(bottom=0)
            ax.set_ylabel("TFLOP/s")
        oom_headroom(ax, oom_rows)
        if kind == "runtime":
            log_axis_y(ax)
    if any_oom:
        handles["oom"] = oom_handle(plt)
    what = "Runtime" if kind == "runtime" else "Throughput"
    fig.suptitle(f"{what}: {title}")
    fig.legend(handles.values(), [h.get_label() for h in handles.values()], loc="lower center",
               ncol=min(4, len(handles)), frameon=False, bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.06 + 0.055 * ((len(handles) - 1) // 4), 1, 1))
    return fig


def draw_memory(plt, plan):
    _, stem, title, key, series, _, _ = plan
    from matplotlib.lines import Line2D
    fig, ax = plt.subplots(figsize=(7.4, 5.0))
    all_ns, any_oom, handles, oom_rows = set(), False, [], 0
    peers = ours = False
    for i, (k, pts) in enumerate(series.items()):
        colour, ls, marker, face = series_style(k, i)
        xs, ys, need_x, need_y, top = [], [], [], [], []
        for n in sorted(pts):
            r = measured(pts[n], memory_of)
            if r:
                xs.append(n)
                ys.append(memory_of(r) / 2**30)
            elif point_status(pts[n], memory_of) == "oom":
                # fa-bench reports what an out-of-memory call would have
                # needed: the cross goes there when it is known.
                need = max((memory_of(q) or 0 for q in pts[n] if error_kind(q) == "oom"), default=0)
                if need:
                    need_x.append(n)
                    need_y.append(need / 2**30)
                else:
                    top.append(n)
        all_ns.update(xs + need_x + top)
        if xs or need_x or top:
            peers |= k[0] == "pytorch"
            ours |= k[0] != "pytorch"
        if xs:
            (h,) = ax.plot(xs, ys, linestyle=ls, marker=marker, color=colour, markerfacecolor=face, linewidth=2,
                           markersize=6, label=series_name(k))
            handles.append(h)
        elif need_x or top:
            handles.append(Line2D([], [], linestyle=ls, marker=marker, color=colour, markerfacecolor=face,
                                  label=series_name(k)))
        if need_x:
            any_oom = True
            ax.scatter(need_x, need_y, marker="x", s=70, linewidths=2.2, color=colour, zorder=5)
        if top:
            any_oom = True
            mark_oom(ax, top, colour, oom_rows)
            oom_rows += 1
    if not handles:
        plt.close(fig)
        return None
    if all_ns:
        log_axis_n(ax, all_ns)
    ax.set_yscale("log")
    ax.set_ylabel("device memory (GiB, log scale)")
    oom_headroom(ax, oom_rows)
    log_axis_y(ax)
    if any_oom:
        handles.append(Line2D([], [], color="black", marker="x", linestyle="none", markersize=8, markeredgewidth=2,
                              label="out of memory (x at the memory needed, or along the top)"))
    ncol = 2 if len(handles) > 3 else 1
    fig.legend(handles=handles, loc="lower center", ncol=ncol, frameon=False, bbox_to_anchor=(0.5, -0.01))
    what = []
    if ours:
        what.append("flashattn: tensors + workspace the call allocates")
    if peers:
        what.append("PyTorch: peak allocated")
    ax.set_title(f"Memory: {title}" + (f"\n{'; '.join(what)}" if what else ""), fontsize=11)
    fig.tight_layout(rect=(0, 0.045 * ((len(handles) + ncol - 1) // ncol) + 0.02, 1, 1))
    return fig


def draw_roofline(plt, plan):
    _, stem, title, device, (pts, (peaks, bws)), _, _ = plan
    from matplotlib.lines import Line2D
    fig, ax = plt.subplots(figsize=(8.6, 5.6))
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = [p["intensity"] for p in pts]
    ys = [p["tflops"] for p in pts]
    x_lo, x_hi = min(xs) / 3, max(xs) * 3
    y_lo, y_hi = min(ys) / 3, max(ys) * 3
    top_bw = max((v for v, _ in bws), default=None)
    for v, _ in peaks:
        y_hi = max(y_hi, v * 2)
        if top_bw:
            x_lo = min(x_lo, v * 1e3 / top_bw / 30)
            x_hi = max(x_hi, v * 1e3 / top_bw * 4)
    if top_bw:
        y_lo = min(y_lo, x_lo * top_bw * 1e-3)
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    # Ceilings: bandwidth slopes up to the highest peak, each peak flat
    # from where the steepest bandwidth meets it.
    top_peak = max((v for v, _ in peaks), default=y_hi)
    slope_labels = []
    for v, lab in bws:
        x_end = min(x_hi, top_peak * 1e3 / v)
        ax.plot([x_lo, x_end], [x_lo * v * 1e-3, x_end * v * 1e-3], color="black", linewidth=1.6)
        slope_labels.append((v, ax.text(x_lo * 1.5, x_lo * 1.5 * v * 1e-3 * 1.15, f"{lab}: {v:g} GB/s", fontsize=9,
                                        va="bottom", ha="left", rotation_mode="anchor")))
    for v, lab in peaks:
        x_start = v * 1e3 / top_bw if top_bw else x_lo
        ax.plot([x_start, x_hi], [v, v], color="black", linewidth=1.6, linestyle="-" if top_bw else "--")
        ax.text(x_hi / 1.1, v * 1.08, f"{lab}: {v:g} TFLOP/s", ha="right", va="bottom", fontsize=9)
    # Colour: dtype and head dimension; marker: which kernel and pass.
    colour_keys = sorted({(p["dtype"], p["d"]) for p in pts}, key=lambda k: ({"fp32": 0, "fp16": 1, "bf16": 2}.get(
        k[0], 3), k[1]))
    # One hue per dtype, darker for larger head dimensions.
    shades = {"fp32": ("#9ecae1", "#4292c6", "#08519c"), "fp16": ("#fc9272", "#ef3b2c", "#a50f15"),
              "bf16": ("#a1d99b", "#41ab5d", "#006d2c")}
    spare = (("#d4b9da", "#c51b8a", "#7a0177"), ("#fdd0a2", "#f16913", "#a63603"), ("#d9d9d9", "#969696", "#252525"))
    colour_of = {}
    for i, dtype in enumerate(sorted({k[0] for k in colour_keys})):
        hue = shades.get(dtype) or spare[i % len(spare)]
        dims = sorted(k[1] for k in colour_keys if k[0] == dtype)
        for j, dim in enumerate(dims):
            colour_of[(dtype, dim)] = hue[max(0, len(hue) - len(dims) + j) % len(hue)]
    marker_keys = sorted({(p["backend"], p["algo"], p["pass"]) for p in pts})
    markers = {("fused", "fwd"): "o", ("fused", "bwd"): "s", ("standard", "fwd"): "^", ("standard", "bwd"): "v"}
    spare = iter("DPX*hp<>")
    marker_of = {k: markers.get(k[1:]) or next(spare, "x") for k in marker_keys}
    many_backends = len({k[0] for k in marker_keys}) > 1
    for mk in marker_keys:
        for ck in colour_keys:
            sel = [p for p in pts if (p["backend"], p["algo"], p["pass"]) == mk and (p["dtype"], p["d"]) == ck]
            if sel:
                # bf16 and fp16 often sit on the same spot: bf16 hollow.
                hollow = ck[0] == "bf16"
                ax.scatter([p["intensity"] for p in sel], [p["tflops"] for p in sel], marker=marker_of[mk],
                           s=70 if hollow else 46, facecolors="none" if hollow else colour_of[ck],
                           edgecolors=colour_of[ck] if hollow else "black", linewidths=1.8 if hollow else 0.4,
                           zorder=5 if hollow else 4)
    ax.set_xlabel("arithmetic intensity (FLOPs / predicted HBM bytes, FLOP/byte)")
    ax.set_ylabel("measured TFLOP/s")
    backends = sorted({BACKEND_NAMES.get(p["backend"], p["backend"]) for p in pts})
    ax.set_title(f"Roofline: {device}, flashattn {' and '.join(backends)} kernels"
                 + ("" if peaks or bws else " (no ceilings given)"))
    colour_handles = [Line2D([], [], marker="o", linestyle="none", markersize=8, markeredgecolor=colour_of[k],
                             markerfacecolor="none" if k[0] == "bf16" else colour_of[k],
                             markeredgewidth=1.8 if k[0] == "bf16" else 1, label=f"{k[0]}, d = {k[1]}")
                      for k in colour_keys]
    marker_handles = [Line2D([], [], marker=marker_of[k], linestyle="none", color="white", markeredgecolor="black",
                             markersize=8, label=(f"{BACKEND_NAMES.get(k[0], k[0])} " if many_backends else "")
                             + f"{k[1]} {dict(PASSES)[k[2]]}") for k in marker_keys]
    first = ax.legend(handles=colour_handles, loc="lower right", title="dtype, head dim", framealpha=0.9)
    ax.add_artist(first)
    ax.legend(handles=marker_handles, loc="upper left", title="kernel", framealpha=0.9)
    fig.tight_layout()
    # The slope of a bandwidth line on screen is known once the layout is.
    for v, text in slope_labels:
        (x0, y0), (x1, y1) = ax.transData.transform([(x_lo, x_lo * v * 1e-3), (x_lo * 10, x_lo * 10 * v * 1e-3)])
        text.set_rotation(math.degrees(math.atan2(y1 - y0, x1 - x0)))
    return fig


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__[
                                     __doc__.index("Ceilings"):])
    ap.add_argument("results", nargs="+", help="JSON lines from fa-bench --json or sdpa_peer.py --json")
    ap.add_argument("-o", "--out", default="plots", help="output folder (default ./plots)")
    ap.add_argument("--list", action="store_true", help="print what would be plotted and exit")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"figures to draw (default {','.join(KINDS)})")
    ap.add_argument("--dtypes", default="", help="only these dtypes (comma-separated)")
    ap.add_argument("--dims", default="", help="only these head dimensions (comma-separated)")
    ap.add_argument("--peak-tflops", action="append", default=[], metavar="VALUE[:LABEL]",
                    help="a compute ceiling for the roofline (repeatable)")
    ap.add_argument("--bandwidth-gbs", action="append", default=[], metavar="VALUE[:LABEL]",
                    help="a memory-bandwidth ceiling for the roofline, GB/s (repeatable)")
    ap.add_argument("--passes", default="", help="panels of the runtime and throughput figures, from fwd,bwd,fwdbwd "
                    "(default: each pass the rows time)")
    ap.add_argument("--prefix", default="", help="prepended to every file name")
    ap.add_argument("--by-label", action="store_true", help="one series per run label as well")
    ap.add_argument("--formats", default="png,svg", help="image formats (default png,svg)")
    ap.add_argument("--dpi", type=int, default=150, help="PNG resolution (default 150)")
    args = ap.parse_args()
    args.kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in args.kinds if k not in KINDS]
    if bad:
        die(f"--kinds: unknown {', '.join(bad)} (known: {', '.join(KINDS)})")
    args.passes = [p for p in args.passes.split(",") if p]
    bad = [p for p in args.passes if p not in PASS_FLOPS]
    if bad:
        die(f"--passes: unknown {', '.join(bad)} (known: fwd, bwd, fwdbwd)")
    args.dtypes = {t for t in args.dtypes.split(",") if t}
    try:
        args.dims = {int(t) for t in args.dims.split(",") if t}
    except ValueError:
        die("--dims expects integers, e.g. 64,128")
    if not 30 <= args.dpi <= 1200:
        die("--dpi: between 30 and 1200")
    formats = [f for f in args.formats.split(",") if f]
    if not formats or any(f not in ("png", "svg", "pdf") for f in formats):
        die("--formats: choose from png, svg, pdf")
    if args.prefix and not re.fullmatch(r"[A-Za-z0-9._-]+", args.prefix):
        die("--prefix: letters, digits, '.', '_' and '-' only")
    for text in args.peak_tflops:
        parse_ceiling(text, "--peak-tflops")
    for text in args.bandwidth_gbs:
        parse_ceiling(text, "--bandwidth-gbs")

    rows, skipped = load(args.results)
    plans = plan_figures(rows, args)
    unplotted = sum(1 for r in rows if error_kind(r) == "failed" and (not args.dtypes or r["dtype"] in args.dtypes)
                    and (not args.dims or r["d"] in args.dims))

    if args.list:
        print(f"{len(rows)} rows from {len(args.results)} file(s); {len(plans)} figure(s) into {args.out}/")
        for plan in plans:
            kind, stem, title = plan[:3]
            print(f"\n{stem}.{{{','.join(formats)}}}  [{kind}] {title}")
            for line in plan[-1]:
                print(f"    {line}")
        if unplotted:
            print(f"\n{unplotted} row(s) with an error other than out of memory are not drawn")
        for where, why in skipped:
            print(f"skipped {where}: {why}")
        return 0
    if not plans:
        die("nothing to plot (see --list)", 1)

    plt = setup_matplotlib()
    os.makedirs(args.out, exist_ok=True)
    written = 0
    for plan in plans:
        kind, stem = plan[0], plan[1]
        if kind in ("runtime", "throughput"):
            fig = draw_vs_n(plt, plan, kind)
        elif kind == "memory":
            fig = draw_memory(plt, plan)
        else:
            fig = draw_roofline(plt, plan)
        if fig is None:
            continue
        for fmt in formats:
            path = os.path.join(args.out, f"{stem}.{fmt}")
            # No creation date in the files, so that a rerun on the same data changes nothing.
            meta = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt)
            fig.savefig(path, dpi=args.dpi, metadata=meta)
            written += 1
        plt.close(fig)
    for where, why in skipped:
        print(f"plots.py: skipped {where}: {why}", file=sys.stderr)
    print(f"wrote {written} file(s) ({len(plans)} figure(s)) to {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
