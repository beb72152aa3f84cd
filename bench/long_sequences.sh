#!/usr/bin/env bash
# On an NVIDIA GPU machine: attention at long sequences, batch 1, 16 heads,
# d = 128, bf16, not causal, on the CUDA backend.
#   1. fused attention, forward then backward (fa-bench --pass fwdbwd), at
#      N = 64k, 128k, 256k, 512k, 1M;
#   2. standard (unfused) attention at N = 1k, 2k, 4k, ... until a point
#      runs out of memory (or fails): first forward + backward, then the
#      forward alone from that N on, which needs no backward workspace;
#   3. PyTorch SDPA's flash backend at the long N up to 256k (cheap there).
# Each point is its own process, so one failure does not stop the rest,
# and nvidia-smi samples the GPU's memory meanwhile: "peak used" is the
# highest memory.used seen minus the idle level before the run (it includes
# the CUDA context). "needs" is fa-bench's device_bytes: the tensors and the
# workspace the call allocates (for PyTorch rows, what sdpa_peer.py reports).
#
# Repeats: from N = 256k on each pass runs once, without warm-up
# (--repeats 1 --warmup 0): 1M forward + backward is about 31.5 PFLOP, some
# 3 minutes at the 200 / 150 TFLOP/s the kernels reach at 8k. Below, the
# median of 3 after 1 warm-up. Default total on an H200: about 5-6 minutes,
# most of it N = 1M; LONG_SEQLENS="65536 131072 262144 524288" takes about
# 2.5. Plots of the run go to $OUT/long-plots where matplotlib is installed.
#
# Environment: FA_BUILD_DIR (default build-gpu, holding fa-bench), OUT
# (default ./gpu-out), LONG_SEQLENS, LONG_PEER_SEQLENS (default 65536 131072
# 262144; empty: no PyTorch), LONG_STD_MAX (default 1048576), LONG_GPU
# (nvidia-smi index, default 0).
# Writes $OUT/long.jsonl (fa-bench and sdpa_peer.py JSON lines), logs, and
# $OUT/long.md (the markdown table, also printed).
# Usage (from the repository root): bench/long_sequences.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${FA_BUILD_DIR:-build-gpu}
out=${OUT:-$PWD/gpu-out}
bench="$build/fa-bench"
seqlens=${LONG_SEQLENS:-65536 131072 262144 524288 1048576}
peer_seqlens=${LONG_PEER_SEQLENS-65536 131072 262144}
std_max=${LONG_STD_MAX:-1048576}
gpu=${LONG_GPU:-0}
dtype=bf16
dim=128
heads=16
json="$out/long.jsonl"
mem="$out/long-memory.tsv"
logs="$out/long-logs"
export FLASHATTN_CACHE_DIR=${FLASHATTN_CACHE_DIR:-/tmp/fa-kernel-cache}

if [ ! -x "$bench" ]; then
  echo "long_sequences.sh: no $bench; build it first:" >&2
  echo "  cmake -S . -B $build -DFA_HIP=OFF -DFA_OPENCL=OFF && cmake --build $build -j --target fa-bench" >&2
  exit 1
fi
mkdir -p "$out" "$logs"
rm -f "$json" "$mem"
t_start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t_start )) s] $*"; }

have_smi=0
command -v nvidia-smi > /dev/null && have_smi=1
gpu_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$gpu" 2>/dev/null | head -1; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i "$gpu" 2>&1
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified tree)')"
  echo "shape: batch 1, $heads heads, d = $dim, $dtype, not causal"
} | tee "$out/long-setup.txt"

# measure LABEL N COMMAND...: runs the command with the GPU's memory sampled
# every 100 ms and appends "LABEL N peak-MiB idle-MiB" to $mem.
measure() {
  local label=$1 n=$2 sampler="" idle="" samples="$logs/$1-$2.mem"
  shift 2
  if [ "$have_smi" = 1 ]; then
    idle=$(gpu_used_mib)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$gpu" -lms 100 > "$samples" 2>/dev/null &
    sampler=$!
  fi
  "$@" > "$logs/$label-$n.log" 2>&1
  local rc=$?
  if [ -n "$sampler" ]; then
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    local peak
    peak=$(sort -n "$samples" | tail -1)
    printf '%s\t%s\t%s\t%s\n' "$label" "$n" "${peak:-}" "${idle:-}" >> "$mem"
  fi
  return $rc
}

# last_error LABEL N: "oom", "failed" or "" for the newest JSON row of that run.
last_error() {
  python3 - "$json" "$1" "$2" <<'PY'
import json, sys
path, label, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
err = "missing"
try:
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("label") == label and r.get("n") == n:
            err = r.get("error") or ""
except OSError:
    pass
print(err)
PY
}

reps() { if [ "$1" -ge 262144 ]; then echo "--repeats 1 --warmup 0"; else echo "--repeats 3 --warmup 1"; fi; }

common=(--backend cuda --dtype "$dtype" --dim "$dim" --batch 1 --heads "$heads")

# 1. Fused attention.
for n in $seqlens; do
  stamp "fused N=$n ($(reps "$n"))"
  # shellcheck disable=SC2046
  measure long-fused "$n" "$bench" "${common[@]}" --seqlens "$n" --algos fused --pass fwdbwd $(reps "$n") \
    --json "$json" --label long-fused
  grep -E "^fused" "$logs/long-fused-$n.log" | tail -1
done

# 2. Standard attention: forward + backward until it stops fitting, then
# the forward alone from there.
n=1024
std_stop=""
for pass in fwdbwd fwd; do
  while [ "$n" -le "$std_max" ]; do
    stamp "standard $pass N=$n"
    # shellcheck disable=SC2046
    measure "long-standard-$pass" "$n" "$bench" "${common[@]}" --seqlens "$n" --algos standard --pass "$pass" \
      $(reps "$n") --json "$json" --label "long-standard-$pass"
    grep -E "^standard" "$logs/long-standard-$pass-$n.log" | tail -1
    err=$(last_error "long-standard-$pass" "$n")
    if [ -n "$err" ]; then
      echo "standard attention ($pass) stops at N = $n: $err"
      [ "$pass" = fwdbwd ] && std_stop="$n"
      break
    fi
    n=$(( n * 2 ))
  done
  [ -n "$std_stop" ] || break
done

# 3. PyTorch SDPA flash at the same shapes.
if [ -n "$peer_seqlens" ]; then
  if python3 -c "import torch; assert torch.cuda.is_available()" 2> /dev/null; then
    for n in $peer_seqlens; do
      stamp "PyTorch SDPA flash N=$n"
      if [ "$n" -ge 262144 ]; then pr=(--repeats 1 --warmup 0); else pr=(--repeats 3 --warmup 1); fi
      # --tokens 1 gives batch 1; --hidden 2048 / d = 128 gives 16 heads.
      measure long-pytorch-flash "$n" python3 bench/sdpa_peer.py --dtypes "$dtype" --dims "$dim" --seqlens "$n" \
        --tokens 1 --hidden $(( heads * dim )) --causal 0 --backends flash "${pr[@]}" --json "$json" \
        --label long-pytorch-flash
      tail -1 "$logs/long-pytorch-flash-$n.log"
    done
  else
    echo "PyTorch with CUDA not available: no SDPA rows"
  fi
fi

stamp "done"
python3 - "$json" "$mem" <<'PY' | tee "$out/long.md"
import json, os, sys
path, mem_path = sys.argv[1], sys.argv[2]
peaks = {}
if os.path.exists(mem_path):
    for line in open(mem_path):
        parts = line.rstrip("\n").split("\t")
        if len(parts) == 4 and parts[2] and parts[3]:
            try:
                peaks[(parts[0], int(parts[1]))] = (int(float(parts[2])) - int(float(parts[3]))) / 1024
            except ValueError:
                pass
rows = []
for line in open(path):
    try:
        rows.append(json.loads(line))
    except ValueError:
        pass
def num(r, k):
    v = r.get(k)
    return v if isinstance(v, (int, float)) and v > 0 else None
def ms(v):
    return "-" if v is None else f"{v:,.0f}" if v >= 1000 else f"{v:.2f}"
def tf(v):
    return "-" if v is None else f"{v:.1f}"
name = {"long-fused": "flashattn fused", "long-standard-fwdbwd": "flashattn standard",
        "long-standard-fwd": "flashattn standard (forward only)", "long-pytorch-flash": "PyTorch SDPA flash"}
print("| algo | N | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd ms | needs GiB | peak used GiB (nvidia-smi) | status |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    label = r.get("label", "")
    fwdbwd = num(r, "fwdbwd_ms")
    if fwdbwd is None and num(r, "fwd_ms") and num(r, "bwd_ms"):
        fwdbwd = r["fwd_ms"] + r["bwd_ms"]
    need = num(r, "device_bytes")
    peak = peaks.get((label, r.get("n")))
    status = "ok"
    if r.get("error"):
        status = "out of memory" if r["error"] == "oom" else "failed"
        msg = str(r.get("message") or "")
        if msg.startswith("out of memory: "):
            msg = msg[len("out of memory: "):]
        if msg:
            status += ": " + msg[:90]
    print(f"| {name.get(label, label or r.get('algo', '?'))} | {r.get('n')} | {ms(num(r, 'fwd_ms'))} | "
          f"{tf(num(r, 'fwd_tflops'))} | {ms(num(r, 'bwd_ms'))} | {tf(num(r, 'bwd_tflops'))} | {ms(fwdbwd)} | "
          f"{'-' if need is None else f'{need / 2**30:.2f}'} | {'-' if peak is None else f'{peak:.2f}'} | {status} |")
PY
if python3 -c "import matplotlib" 2> /dev/null; then
  python3 bench/plots.py "$json" -o "$out/long-plots" --kinds runtime,memory
fi
