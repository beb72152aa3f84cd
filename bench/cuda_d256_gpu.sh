#!/usr/bin/env bash
# On an NVIDIA GPU machine, in one call of about 7 minutes with the
# build (each step's commands have time limits that keep it under 8): the tensor-core backward at head_dim 96, 192 and 256 (above 128
# warps share each key strip, kernels_cuda/bwd_mma.cu DK_SPLIT), and at 128
# with dropout (on sm_90 the warpgroup one, keep bits drawn while its
# products run).
#   tests  test_cuda_attention's wide-head cases (every option, forced
#          shapes), the d128 dropout backward (on sm_90 the warpgroup one)
#          and mma_head_dims against the fp64 reference, side by
#          side, beside the differential test on CUDA with its random cases
#          at head_dim 96, 192 and 256 (FA_DIFF_HEAD_DIMS)
#   bench  the backward (and forward) at d256 and at d128 with dropout 0.1,
#          fp16 and bf16, N 4096 and 8192, causal and not, 16k tokens, then
#          PyTorch SDPA's FlashAttention-2 and cuDNN on the same shapes
#          (bench/sdpa_peer.py), and a table of TFLOP/s and ratios
# Logs and JSON lines go to $OUT (default ./gpu-out): build.log,
# wide-<case>.log, differential-cuda.log, bench.jsonl, peer.jsonl,
# ratios.txt.
# Usage: bench/cuda_d256_gpu.sh [tests|bench|all] (default all)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
steps=${*:-all}
want() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }

fa_gpu_info
stamp "configure and build"
fa_gpu_build build-gpu "test_cuda_attention test_differential fa-bench fa-info" -DCMAKE_BUILD_TYPE=Release \
  -DFA_CUDA=ON -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF -DFA_OPENCL=OFF || exit 1
build-gpu/fa-info --backend cuda --dtype bf16 --dim 256 --seqlen 8192 --batch 2 --heads 8 | grep -A4 "^backward"

status=0
if want tests; then
  stamp "tests: wide-head backward cases and the differential test at d96/192/256, side by side"
  cases="mma_wide_heads_d96 mma_wide_heads_d192 mma_wide_heads_d256 mma_wide_heads_shapes dropout_d128_backward mma_head_dims"
  pids=()
  for c in $cases; do
    timeout 240 build-gpu/test_cuda_attention "$c" > "$out/wide-$c.log" 2>&1 &
    pids+=($!)
  done
  # The opt-in shared Philox draw of the warpgroup backward (bwd_mma.cu
  # KEEP_BITS_SHARED) against the reference too.
  FLASHATTN_CUDA_OPTIONS=-DKEEP_BITS_SHARED timeout 240 build-gpu/test_cuda_attention dropout_d128_backward \
    > "$out/wide-dropout-shared.log" 2>&1 &
  shared_pid=$!
  FA_DIFF_HEAD_DIMS=96,192,256 FA_DIFF_CASES=${FA_DIFF_CASES:-150} FA_DIFF_BUILDS=${FA_DIFF_BUILDS:-12} \
    timeout 240 build-gpu/test_differential cuda > "$out/differential-cuda.log" 2>&1 &
  diff_pid=$!
  i=0
  for c in $cases; do
    wait "${pids[$i]}"
    rc=$?
    i=$((i + 1))
    echo "$c: exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out)')"
    [ "$rc" -eq 0 ] || status=1
    grep -E "^(ok|FAIL|SKIP)|CHECK failed|passed, " "$out/wide-$c.log" | head -12
  done
  wait "$shared_pid"
  rc=$?
  echo "dropout_d128_backward with -DKEEP_BITS_SHARED: exit $rc"
  [ "$rc" -eq 0 ] || status=1
  grep -E "^(ok|FAIL|SKIP)|CHECK failed" "$out/wide-dropout-shared.log" | head -6
  wait "$diff_pid"
  rc=$?
  echo "differential (cuda, d96/192/256): exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out)')"
  [ "$rc" -eq 0 ] || status=1
  grep -E "^differential:|FAILED|^    |backward:|forward:" "$out/differential-cuda.log" | head -30
  # The worst errors of the wide-head runs, by head_dim and dtype.
  cat "$out"/wide-mma_wide_heads_d*.log "$out"/wide-dropout_d128_backward.log | python3 -c '
import re, sys
worst = {}
for line in sys.stdin:
    m = re.search(r" d(\d+) (fp16|bf16) .* dQ ([0-9.e+-]+) dK ([0-9.e+-]+) dV ([0-9.e+-]+)", line)
    if m:
        k = (int(m.group(1)), m.group(2))
        worst[k] = max([worst.get(k, 0.0)] + [float(x) for x in m.groups()[2:]])
for (d, t), e in sorted(worst.items()):
    print(f"d{d} {t}: worst gradient error {e:.2e}")'
fi

if want bench; then
  stamp "benchmark: ours, then SDPA FlashAttention-2 and cuDNN"
  json="$out/bench.jsonl"
  # Every configuration once in parallel first, untimed, so that their NVRTC
  # builds fill the kernel cache side by side; then the timed runs, one at
  # a time. Fields: dtype, head_dim, extra options, label.
  configs=()
  for dtype in bf16 fp16; do
    for causal in "" "--causal"; do
      configs+=("$dtype|256|$causal|cuda-d256|" "$dtype|128|$causal --dropout 0.1|cuda-d128-dropout|")
    done
    # The shared Philox draw (opt-in; the warpgroup backward, not causal).
    configs+=("$dtype|128|--dropout 0.1|cuda-d128-dropout-shared|-DKEEP_BITS_SHARED")
  done
  bench_one() { # CONFIG REPEATS WARMUP JSON
    local dtype dim opts label defines
    IFS='|' read -r dtype dim opts label defines <<< "$1"
    # shellcheck disable=SC2086  # opts is a list of options
    FLASHATTN_CUDA_OPTIONS=$defines timeout 90 build-gpu/fa-bench --backend cuda --dtype "$dtype" --dim "$dim" \
      $opts --seqlens 4096,8192 --repeats "$2" --warmup "$3" --json "$4" --label "$label" 2>/dev/null |
      grep fused | sed "s/^/$label /"
  }
  for c in "${configs[@]}"; do bench_one "$c" 1 0 /dev/null > /dev/null & done
  wait
  stamp "timed runs"
  for c in "${configs[@]}"; do
    case $c in
      *shared*) bench_one "$c" 10 3 "$out/bench-shared.jsonl" ;;
      *) bench_one "$c" 10 3 "$json" ;;
    esac
  done
  timeout 120 python3 bench/sdpa_peer.py --dtypes bf16,fp16 --dims 256 --seqlens 4096,8192 --causal 0,1 \
    --backends flash,cudnn --repeats 10 --json "$out/peer.jsonl" --label sdpa-d256 > "$out/peer.log" 2>&1
  timeout 120 python3 bench/sdpa_peer.py --dtypes bf16,fp16 --dims 128 --seqlens 4096,8192 --causal 0,1 \
    --dropout 0.1 --backends flash,cudnn --repeats 10 --json "$out/peer.jsonl" --label sdpa-d128-dropout \
    >> "$out/peer.log" 2>&1
  python3 - "$json" "$out/peer.jsonl" <<'PY' | tee "$out/ratios.txt"
import json, sys
ours, peer = {}, {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("algo") != "fused" or "error" in r:
        continue
    drop = r["label"].endswith("dropout")
    ours[(r["dtype"], r["d"], r["n"], bool(r["causal"]), drop)] = r
try:
    for line in open(sys.argv[2]):
        r = json.loads(line)
        peer[(r["algo"], r["dtype"], r["d"], r["n"], bool(r["causal"]), r.get("dropout", 0.0) > 0)] = r
except FileNotFoundError:
    pass
def tf(r, k):
    return f'{r[k]:6.1f}' if r and "error" not in r else "     -"
def ratio(a, r, k):
    return f'{a[k] / r[k]:5.2f}x' if r and "error" not in r and r.get(k) else "     -"
print("TFLOP/s (backward 2.5x the forward FLOPs); ratios ours / peer")
print(f'{"shape":34} {"bwd":>6} {"FA2":>6} {"cuDNN":>6} {"/FA2":>6} {"/cuDNN":>6}   {"fwd":>6} {"FA2":>6} {"cuDNN":>6}')
for key in sorted(ours):
    dtype, d, n, causal, drop = key
    a = ours[key]
    f2, cu = peer.get(("flash",) + key), peer.get(("cudnn",) + key)
    name = f'{dtype} d{d} N{n}{" causal" if causal else ""}{" dropout 0.1" if drop else ""}'
    print(f'{name:34} {a["bwd_tflops"]:6.1f} {tf(f2, "bwd_tflops")} {tf(cu, "bwd_tflops")} '
          f'{ratio(a, f2, "bwd_tflops"):>6} {ratio(a, cu, "bwd_tflops"):>6}   '
          f'{a["fwd_tflops"]:6.1f} {tf(f2, "fwd_tflops")} {tf(cu, "fwd_tflops")}')
for key, r in sorted(peer.items()):
    if "error" in r:
        print("peer", *key, "error:", r["error"][:100])
PY
fi
stamp "done"
exit $status
