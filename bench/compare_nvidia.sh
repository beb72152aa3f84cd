#!/usr/bin/env bash
# On an NVIDIA GPU machine, from the repository root: times every backend of
# ours that is present (CUDA; OpenCL through NVIDIA's OpenCL; HIP through
# the HIP-on-CUDA mapping when it was built) and PyTorch SDPA's
# FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION and MATH backends on
# the same shapes in one run, writes all points to one JSON lines file and
# prints the ratio tables (bench/ratio_table.py).
#
# Shapes (the FlashAttention-2 paper's setting): 16k tokens (batch =
# 16384 / N), hidden 2048 (heads = 2048 / d), d 64 and 128, N 512 .. 16384,
# causal and not, fp16 and bf16; the OpenCL backend also in fp32, against
# EFFICIENT_ATTENTION in fp32 (the only SDPA backend with fp32 kernels).
# --quick: d 128 and N 2048, 8192 only.
#
# Decoding (issue #19's row): one query token against a KV cache, bf16,
# d 128, 32 query heads on 4 KV heads, batch 1, 8, 64 and caches of 16k and
# 64k keys (--quick: batch 1 and 8, 16k): the CUDA backend's fa_forward on a
# contiguous cache and its KV-cache step on 64-token pages, beside PyTorch
# SDPA on the same contiguous cache (bench/decode_sdpa.py), into decode.md
# (bench/decode_table.py: ms, fraction of the copy bandwidth, SDPA / ours).
# --decode-only runs only that; FA_DECODE=0 leaves it out.
#
# Outputs in $OUT (default ./gpu-out): compare.jsonl (every point, fa-bench's
# and sdpa_peer.py's schema), ratio.md (ours / peer, forward and backward),
# ratio-full.md (the same with the TFLOP/s of each peer), compare-bench.txt
# (fa-bench's tables), logs.
#
# Environment: FA_BACKENDS: our backends to time, a list with spaces
# (default: every one present). FA_PEERS: the SDPA backends (default
# flash,cudnn,efficient,math). FA_BUILD_DIR: an existing build to use (nothing is built);
# otherwise build-gpu is configured and built. FA_COMMIT: the label stored
# with each point (default: the checkout's short commit). FA_STEP_TIMEOUT:
# seconds one fa-bench sweep may take (default 150).
#
# The default run is planned to finish in under 8 minutes on an H200 with
# the build: median of 10 repeats after 2 warm-ups for CUDA and for
# PyTorch's fused backends, 5 after 1 for OpenCL and HIP (FMA kernels, 5-20x
# slower), 3 after 1 for MATH (it materialises N x N and may run out of
# memory at large N: such points are written with "error": "oom").
#
# Usage: bench/compare_nvidia.sh [--quick] [--decode-only]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

quick=0
decode_only=0
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    --decode-only) decode_only=1 ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done

# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_gpu_info
fa_nvidia_opencl || echo "no NVIDIA OpenCL: the OpenCL backend is left out"

if [ -n "${FA_BUILD_DIR:-}" ]; then
  build=$FA_BUILD_DIR
  if [ ! -x "$build/fa-bench" ] || [ ! -x "$build/fa-info" ]; then
    echo "FA_BUILD_DIR=$build holds no fa-bench and fa-info" >&2
    exit 1
  fi
  stamp "using the build in $build"
else
  build="build-gpu"
  fa_hip_nvidia_args
  targets="fa-bench fa-info"
  [ "${hip_args[1]}" = "-DFA_HIP_NVIDIA=ON" ] && targets+=" fa_hip_on_cuda"
  stamp "configure and build $build"
  fa_gpu_build "$build" "$targets" -DCMAKE_BUILD_TYPE=Release -DFA_OPENCL=AUTO -DFA_CUDA=AUTO "${hip_args[@]}" ||
    exit 1
fi
build=$(cd "$build" && pwd)
# The HIP backend's default list names AMD's runtime; the mapping is named here.
[ -e "$build/libfa_hip_on_cuda.so" ] && export FLASHATTN_HIP_LIBRARY=$build/libfa_hip_on_cuda.so

"$build/fa-info" > "$out/fa-info.txt" 2>&1
backends=()
for b in ${FA_BACKENDS:-cuda hip opencl}; do
  grep -qE "^  $b +available" "$out/fa-info.txt" && backends+=("$b")
done
echo "our backends present: ${backends[*]:-none}"
grep -E "^  (cuda|hip|opencl) +unavailable" "$out/fa-info.txt" | cut -c1-160

if [ "$quick" = 1 ]; then
  seqlens=2048,8192
  dims=(128)
else
  seqlens=512,1024,2048,4096,8192,16384
  dims=(64 128)
fi
# Overrides, to try the script on a small device: FA_SEQLENS (a list with
# commas), FA_DIMS (with spaces), FA_TOKENS, FA_HIDDEN; FA_DTYPES (with
# spaces: our dtypes, for every backend; fp32 on OpenCL only).
seqlens=${FA_SEQLENS:-$seqlens}
[ -n "${FA_DIMS:-}" ] && read -r -a dims <<< "$FA_DIMS"
tokens=${FA_TOKENS:-16384}
hidden=${FA_HIDDEN:-2048}
dims_csv=$(IFS=,; echo "${dims[*]}")
json="$out/compare.jsonl"
: > "$json"
commit=$(fa_commit_label)
step_timeout=${FA_STEP_TIMEOUT:-150}
failed=0

# One fa-bench sweep over N: backend, dtype, head dim, causal (0/1), repeats, warm-ups.
sweep() {
  local backend=$1 dtype=$2 dim=$3 causal=$4 repeats=$5 warmup=$6 flag=()
  [ "$causal" = 1 ] && flag=(--causal)
  echo "## $backend $dtype d$dim causal $causal" >> "$out/compare-bench.txt"
  timeout "$step_timeout" "$build/fa-bench" --backend "$backend" --dtype "$dtype" --dim "$dim" "${flag[@]}" \
    --seqlens "$seqlens" --tokens "$tokens" --hidden "$hidden" --algos fused --pass both --repeats "$repeats" \
    --warmup "$warmup" --json "$json" --label "$commit" >> "$out/compare-bench.txt" 2>> "$out/compare-progress.log"
  local rc=$?
  case $rc in
    0) ;;
    124) echo "  $backend $dtype d$dim causal $causal: stopped after ${step_timeout} s (FA_STEP_TIMEOUT)"; failed=1 ;;
    *) echo "  $backend $dtype d$dim causal $causal: fa-bench exit $rc (see compare-bench.txt)"; failed=1 ;;
  esac
}

# The decoding row: CUDA only (the other backends' steps are FMA kernels,
# timed by bench/decode_gpu_profile.sh beside it).
decode_row() {
  local batches=1,8,64 caches=16384,65536
  [ "$quick" = 1 ] && { batches=1,8; caches=16384; }
  local common=(--backend cuda --decode --dtype bf16 --dim 128 --heads 32 --heads-kv 4 --batch "$batches"
                --cache "$caches")
  rm -f "$out"/decode-*.csv
  stamp "decoding: fa-bench --decode (contiguous fa_forward, KV-cache step on 64-token pages)"
  timeout "$step_timeout" "$build/fa-bench" "${common[@]}" --csv "$out/decode-contiguous.csv" \
    > "$out/decode-bench.txt" 2>&1 || { echo "  fa-bench --decode failed (decode-bench.txt)"; failed=1; }
  timeout "$step_timeout" "$build/fa-bench" "${common[@]}" --kvcache --page-size 64 --csv "$out/decode-paged64.csv" \
    >> "$out/decode-bench.txt" 2>&1 || { echo "  fa-bench --decode --kvcache failed"; failed=1; }
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1; then
    stamp "decoding: PyTorch SDPA on the same contiguous cache"
    timeout "$step_timeout" python3 bench/decode_sdpa.py --batch "$batches" --cache "$caches" \
      --csv "$out/decode-sdpa.csv" > "$out/decode-sdpa.txt" 2>&1 || { echo "  decode_sdpa.py failed"; failed=1; }
  fi
  {
    echo "### contiguous cache, fa_forward"
    python3 bench/decode_table.py "$out/decode-contiguous.csv" "$out/decode-sdpa.csv"
    echo
    echo "### 64-token pages, fa_forward_kvcache (SDPA on the contiguous cache)"
    python3 bench/decode_table.py "$out/decode-paged64.csv" "$out/decode-sdpa.csv"
  } | tee "$out/decode.md"
}

if [[ " ${backends[*]} " == *" cuda "* ]] && [ "${FA_DECODE:-1}" != 0 ]; then
  decode_row
fi
if [ "$decode_only" = 1 ]; then
  stamp "done (--decode-only)"
  exit "$failed"
fi

for backend in "${backends[@]}"; do
  stamp "fa-bench --backend $backend"
  dtypes=(fp16 bf16)
  repeats=10 warmup=2
  if [ "$backend" != cuda ]; then repeats=5 warmup=1; fi
  [ "$backend" = opencl ] && dtypes=(fp32 fp16 bf16)
  [ -n "${FA_DTYPES:-}" ] && read -r -a dtypes <<< "$FA_DTYPES"
  for dtype in "${dtypes[@]}"; do
    for dim in "${dims[@]}"; do
      for causal in 0 1; do
        sweep "$backend" "$dtype" "$dim" "$causal" "$repeats" "$warmup"
      done
    done
  done
done

if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1; then
  stamp "PyTorch SDPA (${FA_PEERS:-flash,cudnn,efficient,math})"
  python3 bench/sdpa_peer.py --dtypes fp16,bf16 --dims "$dims_csv" --seqlens "$seqlens" --causal 0,1 \
    --tokens "$tokens" --hidden "$hidden" --backends "${FA_PEERS:-flash,cudnn,efficient,math}" --repeats 10 --warmup 2 --math-repeats 3 \
    --json "$json" --label "$commit" > "$out/peer.log" 2>&1 || { echo "  sdpa_peer.py failed:"; tail -5 "$out/peer.log"; failed=1; }
  if [[ " ${backends[*]} " == *" opencl "* ]] && [[ " ${FA_DTYPES:-fp32} " == *" fp32 "* ]]; then
    stamp "PyTorch SDPA efficient, fp32"
    python3 bench/sdpa_peer.py --dtypes fp32 --dims "$dims_csv" --seqlens "$seqlens" --causal 0,1 \
      --tokens "$tokens" --hidden "$hidden" --backends efficient --repeats 10 --warmup 2 \
      --json "$json" --label "$commit" >> "$out/peer.log" 2>&1 || { echo "  sdpa_peer.py (fp32) failed"; failed=1; }
  fi
  # Points that did not run (out of memory, unsupported), ours and the peers'.
  grep -h '"error"' "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("  %s %s %s d%d N%d causal %d: %s" % (r["backend"], r["algo"], r["dtype"], r["d"], r["n"],
                                               int(r["causal"]), r["error"]))
' | head -40
else
  echo "no PyTorch with CUDA here: no SDPA peers"
fi

stamp "ratio tables"
python3 bench/ratio_table.py "$json" > "$out/ratio-full.md"
python3 bench/ratio_table.py "$json" --ratios-only | tee "$out/ratio.md"
stamp "done: $(grep -c . "$json") points in $json"
elapsed=$(( $(date +%s) - t_start ))
[ "$elapsed" -gt 480 ] && echo "note: the run took ${elapsed} s, more than the 8 minutes planned; try --quick"
exit "$failed"
