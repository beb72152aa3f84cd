#!/usr/bin/env python3
"""Measured HBM bytes (Nsight Compute's dram__bytes_read.sum and
dram__bytes_write.sum) beside the IO model's prediction, as a markdown table.

Input: the folder bench/io_measure.sh fills. Each profiled fa-bench call
leaves two files named after it, ALGO-PASS-dDIM-nN.csv (what ncu --csv
printed, the application's own output mixed in) and ALGO-PASS-dDIM-nN.jsonl
(fa-bench's --json row of that call, holding pred_fwd_bytes and
pred_bwd_bytes).

Which kernels count. ncu profiles every kernel of the process, in launch
order; kernels are told apart by their names only.
  Forward run (--pass fwd --warmup 0 --repeats 2): whatever the process
  launches before its first call (none expected), then the forward call
  twice. The list is split as SETUP + CALL + CALL with the shortest SETUP
  that makes the two halves equal; the second CALL is what is counted.
  A list that does not split so is counted whole, as one call, and marked.
  Backward run (--pass bwd --warmup 0 --repeats 1): SETUP, then the forward
  once per input set fa-bench fills (one, or a few when the tensors are
  small), then one backward. SETUP and whole copies of CALL are removed from
  the front; the rest is the backward. Where no forward run is there or no
  copy is found, every kernel is summed and the row is marked as an upper
  bound.

Usage: io_table.py DIR [--json FILE]     the table
       io_table.py --kernels FILE.csv    one ncu CSV, kernel by kernel
"""
import argparse
import csv
import io
import json
import math
import os
import re
import sys

READ, WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
# ncu scales byte counts with decimal prefixes unless --print-units base.
UNIT_SCALE = {
    "byte": 1.0, "bytes": 1.0, "b": 1.0,
    "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40,
}
NAME_RE = re.compile(r"^(?P<algo>[a-z]+)-(?P<pass>fwd|bwd)-d(?P<d>\d+)-n(?P<n>\d+)$")


class NcuError(Exception):
    pass


def parse_number(text):
    """A metric value as ncu prints it: '123', '1,234,567', '1,234.5', or
    with a decimal comma ('9,5') in locales that use one."""
    t = text.strip().replace("\u00a0", "").replace(" ", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        raise ValueError(f"no value: '{text}'")
    if "," in t and "." in t:
        t = t.replace(",", "") if t.rfind(",") < t.rfind(".") else t.replace(".", "").replace(",", ".")
    elif "," in t:
        groups = t.lstrip("-").split(",")
        if len(groups) > 1 and all(len(g) == 3 and g.isdigit() for g in groups[1:]) and groups[0].isdigit():
            t = t.replace(",", "")
        elif len(groups) == 2:
            t = t.replace(",", ".")
        else:
            raise ValueError(f"cannot read '{text}' as a number")
    v = float(t)
    if not math.isfinite(v):
        raise ValueError(f"not finite: '{text}'")
    return v


def unit_scale(unit):
    u = unit.strip().lower()
    if u not in UNIT_SCALE:
        raise NcuError(f"unknown unit '{unit}' for a byte count")
    return UNIT_SCALE[u]


def csv_rows(text):
    """The CSV records of ncu's output: lines that start with a quote (the
    application's output and ncu's ==PROF== lines do not)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_ncu_csv(text):
    """Kernels in launch order: [{'id', 'name', 'read', 'write'}], bytes as
    floats. Reads both the long layout (default page: one row per metric)
    and the wide one (--page raw: one row per kernel, metric columns)."""
    if "ERR_NVGPUCTRPERM" in text:
        raise NcuError("ncu had no permission to read the GPU's performance counters (ERR_NVGPUCTRPERM): "
                       "run as root or allow profiling for all users (NVreg_RestrictProfilingToAdminUsers=0)")
    rows = csv_rows(text)
    header_at = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "ID" in r), None)
    if header_at is None:
        raise NcuError("no ncu CSV header (a row naming \"ID\" and \"Kernel Name\") in the output")
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    kernels = {}
    order = []

    def kernel(row):
        pid = row[col["Process ID"]] if "Process ID" in col else ""
        key = (pid, row[col["ID"]])
        if key not in kernels:
            try:
                launch = int(parse_number(row[col["ID"]]))
            except ValueError:
                raise NcuError(f"kernel ID '{row[col['ID']]}' is not a number")
            kernels[key] = {"id": launch, "pid": pid, "name": row[col["Kernel Name"]], "read": None,
                            "write": None}
            order.append(key)
        return kernels[key]

    if "Metric Name" in col:
        for f in ("Metric Unit", "Metric Value"):
            if f not in col:
                raise NcuError(f"ncu CSV header has \"Metric Name\" but no \"{f}\"")
        for row in rows[header_at + 1:]:
            if row == header:
                continue
            if len(row) < len(header):
                raise NcuError(f"short CSV row ({len(row)} of {len(header)} fields): {row[:3]}...")
            metric = row[col["Metric Name"]]
            if metric not in (READ, WRITE):
                continue
            try:
                value = parse_number(row[col["Metric Value"]]) * unit_scale(row[col["Metric Unit"]])
            except ValueError as e:
                raise NcuError(f"{metric} of kernel ID {row[col['ID']]}: {e}")
            k = kernel(row)
            k["read" if metric == READ else "write"] = value
    else:
        for f in (READ, WRITE):
            if f not in col:
                raise NcuError(f"ncu CSV has neither \"Metric Name\" nor a \"{f}\" column")
        units = {READ: "byte", WRITE: "byte"}
        for row in rows[header_at + 1:]:
            if row == header or len(row) < len(header):
                continue
            if not row[col["ID"]].strip():  # the units row of --page raw
                units = {m: row[col[m]] or "byte" for m in (READ, WRITE)}
                continue
            k = kernel(row)
            for m in (READ, WRITE):
                try:
                    k["read" if m == READ else "write"] = parse_number(row[col[m]]) * unit_scale(units[m])
                except ValueError as e:
                    raise NcuError(f"{m} of kernel ID {row[col['ID']]}: {e}")
    out = [kernels[k] for k in order]
    missing = [k for k in out if k["read"] is None or k["write"] is None]
    if missing:
        raise NcuError(f"kernel ID {missing[0]['id']} ({missing[0]['name'][:60]}) lacks "
                       f"{READ if missing[0]['read'] is None else WRITE}")
    out.sort(key=lambda k: (k["pid"], k["id"]))
    return out


def split_forward_run(kernels):
    """(setup, call) of a forward run that made the call twice, or None when
    the list is not SETUP + CALL + CALL."""
    names = [k["name"] for k in kernels]
    for s in range(len(names)):
        half, odd = divmod(len(names) - s, 2)
        if half and not odd and names[s:s + half] == names[s + half:]:
            return kernels[:s], kernels[s + half:]
    return None


def strip_forward_calls(kernels, setup_names, call_names):
    """Removes the setup kernels and the leading copies of the forward
    call's kernels. Returns (the backward's kernels, copies removed)."""
    names = [k["name"] for k in kernels]
    i = len(setup_names) if names[:len(setup_names)] == setup_names else 0
    m, copies = len(call_names), 0
    while m and names[i:i + m] == call_names:
        i += m
        copies += 1
    return kernels[i:], copies


def read_text(path):
    with open(path, errors="replace") as f:
        return f.read()


def read_json_row(path):
    """The last JSON object of a fa-bench --json file (None if absent)."""
    if not os.path.exists(path):
        return None
    row = None
    for line in read_text(path).splitlines():
        line = line.strip()
        if line:
            try:
                row = json.loads(line)
            except ValueError:
                pass
    return row


def collect(folder):
    runs = {}
    for name in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(name)
        m = NAME_RE.match(stem)
        if ext != ".csv" or not m:
            continue
        key = (m["algo"], int(m["d"]), int(m["n"]))
        runs.setdefault(key, {})[m["pass"]] = os.path.join(folder, stem)
    if not runs:
        raise SystemExit(f"io_table.py: no ALGO-PASS-dDIM-nN.csv files in {folder}")
    results = []
    for (algo, d, n), passes in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != "fused")):
        setup_names = call_names = None
        for p in ("fwd", "bwd"):
            if p not in passes:
                continue
            stem = passes[p]
            res = {"algo": algo, "pass": p, "n": n, "d": d, "notes": []}
            row = read_json_row(stem + ".jsonl")
            if row is None:
                res["notes"].append("no fa-bench JSON")
            elif row.get("error"):
                # A failed call's kernels, if any ran, are not the pass.
                res["notes"].append(f"fa-bench: {row['error']}")
                results.append(res)
                continue
            else:
                res["predicted"] = row.get(f"pred_{p}_bytes")
                res["shape"] = (row.get("b"), row.get("h"), row.get("dtype"))
            try:
                kernels = parse_ncu_csv(read_text(stem + ".csv"))
            except (NcuError, OSError) as e:
                res["notes"].append(f"ncu: {e}")
                results.append(res)
                continue
            if not kernels:
                res["notes"].append("ncu profiled no kernel")
                results.append(res)
                continue
            if p == "fwd":
                split = split_forward_run(kernels)
                if split:
                    setup, counted = split
                    if setup:
                        res["notes"].append(f"{len(setup)} kernel(s) before the first call not counted")
                else:
                    setup, counted = [], kernels
                    res["notes"].append("not two equal calls: all kernels counted as one call")
                setup_names = [k["name"] for k in setup]
                call_names = [k["name"] for k in counted]
            else:
                counted, copies = strip_forward_calls(kernels, setup_names or [], call_names or [])
                if call_names is None:
                    res["notes"].append("upper bound: no forward run to subtract")
                elif copies == 0:
                    res["notes"].append("upper bound: forward kernels not found at the start")
                    counted = kernels
                elif not counted:
                    res["notes"].append("nothing left after the forward calls")
                else:
                    res["notes"].append(f"{copies} forward call{'s' if copies > 1 else ''} removed")
            res["read"] = sum(k["read"] for k in counted)
            res["write"] = sum(k["write"] for k in counted)
            res["kernels"] = len(counted)
            res["kernel_names"] = sorted({k["name"] for k in counted})
            results.append(res)
    return results


def gb(v):
    return "-" if v is None else f"{v / 1e9:.3f}"


def ratio(a, b):
    return "-" if not a or not b else f"{a / b:.2f}"


def table(results):
    by_shape = {(r["algo"], r["pass"], r["n"], r["d"]): r for r in results}
    lines = []
    shaped = [r for r in results if r.get("shape") and None not in r["shape"]]
    if shaped:
        dtypes = sorted({r["shape"][2] for r in shaped})
        tokens = {r["shape"][0] * r["n"] for r in shaped}
        hidden = {r["shape"][1] * r["d"] for r in shaped}
        batches = {r["shape"][0] for r in shaped}
        if len(batches) == 1:
            batch = f"batch {batches.pop()}"
        elif len(tokens) == 1:
            batch = f"batch x N = {tokens.pop()} tokens"
        else:
            batch = "batch varies"
        heads = f"heads x d = {hidden.pop()}" if len(hidden) == 1 else "heads vary"
        lines.append(f"Shapes: {'/'.join(dtypes)}, {batch}, {heads}. GB = 1e9 bytes. Measured: ncu "
                     "dram__bytes_read.sum and dram__bytes_write.sum summed over the kernels of the call; "
                     "predicted: the IO model's bytes (fa-bench pred_fwd_bytes / pred_bwd_bytes).\n")
    lines.append("| algo | pass | N | d | measured read GB | measured write GB | measured total GB | predicted GB "
                 "| measured / predicted | fused / standard, measured | fused / standard, predicted | kernels | notes |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(results, key=lambda r: (r["d"], r["n"], r["pass"] != "fwd", r["algo"] != "fused", r["algo"])):
        total = r["read"] + r["write"] if "read" in r else None
        pred = r.get("predicted")
        f_s_meas = f_s_pred = "-"
        if r["algo"] == "fused":
            s = by_shape.get(("standard", r["pass"], r["n"], r["d"]))
            if s:
                s_total = s["read"] + s["write"] if "read" in s else None
                f_s_meas = ratio(total, s_total)
                f_s_pred = ratio(pred, s.get("predicted"))
        lines.append(f"| {r['algo']} | {r['pass']} | {r['n']} | {r['d']} | {gb(r.get('read'))} | "
                     f"{gb(r.get('write'))} | {gb(total)} | {gb(pred)} | {ratio(total, pred)} | {f_s_meas} | "
                     f"{f_s_pred} | {r.get('kernels', '-')} | {'; '.join(r['notes'])} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", help="the folder io_measure.sh wrote (OUT/io)")
    ap.add_argument("--json", help="also write one JSON object per table row to this file")
    ap.add_argument("--kernels", metavar="CSV", help="print one ncu CSV kernel by kernel and exit")
    args = ap.parse_args()
    if args.kernels:
        try:
            kernels = parse_ncu_csv(read_text(args.kernels))
        except (NcuError, OSError) as e:
            print(f"io_table.py: {args.kernels}: {e}", file=sys.stderr)
            return 1
        print(f"{'ID':>5} {'read GB':>10} {'write GB':>10}  kernel")
        for k in kernels:
            print(f"{k['id']:>5} {k['read'] / 1e9:10.4f} {k['write'] / 1e9:10.4f}  {k['name'][:100]}")
        print(f"{'sum':>5} {sum(k['read'] for k in kernels) / 1e9:10.4f} "
              f"{sum(k['write'] for k in kernels) / 1e9:10.4f}  ({len(kernels)} kernels)")
        return 0
    if not args.folder:
        ap.error("give the folder io_measure.sh wrote, or --kernels FILE.csv")
    if not os.path.isdir(args.folder):
        print(f"io_table.py: {args.folder} is not a folder", file=sys.stderr)
        return 2
    results = collect(args.folder)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            for r in results:
                rec = {k: v for k, v in r.items() if k != "shape"}
                f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
