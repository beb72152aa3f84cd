#!/usr/bin/env bash
# On an NVIDIA GPU machine, in one call of about 7 minutes with the build
# (each step has a time limit that keeps the whole under 8): the CUDA
# backend's score options (softcap, ALiBi, additive bias) against the fp64
# reference, then their cost.
#   tests     every cuda_attention test (the suite, score_options among
#             them, and this backend's cases: score_options_simt, _mma,
#             _wgmma, _wide_heads, _decode_shapes run each option and all
#             three together on every kernel family, forced and planned),
#             side by side; beside them compute-sanitizer's memcheck on the
#             suite's option cases and on the mma.sync ones, the suite's
#             option cases with fp16/bf16 for fp32 (FA_TEST_HALF=1: on the
#             planner's tensor-core kernels), and one untimed pass of each
#             speed-check problem to fill the kernel cache
#   speed     fa-bench, bf16, head_dim 128, N 8192, causal, 16k tokens
#             (batch 2, 16 heads), forward and backward timed on an idle
#             GPU: without options, with softcap 30, ALiBi, a bf16 bias
#             [batch, heads, N, N], and all three; the plans fa-info prints
#             for each (which kernel runs), and each one's TFLOP/s against
#             the run without options
# Logs to $OUT (default ./gpu-out): build.log, ctest.log, options-cases.txt,
# memcheck-*.log, half-score_options.log, plans.txt, speed.jsonl, speed.txt.
# Usage: bench/score_options_gpu.sh [tests|speed|all] (default all);
# FA_TESTS_SECONDS (default 240) bounds the tests step.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
steps=${*:-all}
want() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }

fa_gpu_info
stamp "configure and build (CUDA only)"
fa_gpu_build build-gpu-options "test_cuda_attention fa-bench fa-info" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON \
  -DFA_OPENCL=OFF -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF || exit 1
status=0

# The speed check's problems: name and fa-bench / fa-info options.
shape=(--backend cuda --dtype bf16 --dim 128 --causal)
names=(none softcap alibi bias all)
opts=("" "--softcap 30" "--alibi" "--bias bf16" "--softcap 30 --alibi --bias bf16")

if want tests; then
  stamp "tests: cuda_attention (every case), memcheck, the speed check's kernels compiled"
  san=/usr/local/cuda/bin/compute-sanitizer
  bg=()
  if [ -x "$san" ]; then
    for c in score_options score_options_mma; do
      timeout 230 "$san" --tool memcheck --error-exitcode 3 build-gpu-options/test_cuda_attention "$c" \
        > "$out/memcheck-$c.log" 2>&1 &
      bg+=("$!:memcheck $c")
    done
  else
    echo "no $san here: no memcheck"
  fi
  # The suite's option cases again with their fp32 problems in fp16 or
  # bf16 (FA_TEST_HALF): the planner's tensor-core kernels run them.
  FA_TEST_HALF=1 timeout 230 build-gpu-options/test_cuda_attention score_options > "$out/half-score_options.log" 2>&1 &
  bg+=("$!:half score_options")
  if want speed; then
    for i in "${!names[@]}"; do
      # shellcheck disable=SC2086  # the options are words
      timeout 230 build-gpu-options/fa-bench "${shape[@]}" ${opts[$i]} --seqlens 8192 --repeats 1 --warmup 0 \
        > "$out/warm-${names[$i]}.txt" 2>&1 &
      bg+=("$!:compile ${names[$i]}")
    done
  fi
  # Every test stops by then, so that the whole call stays under 8 minutes
  # (FA_TESTS_SECONDS: another budget, for a call of the tests alone).
  stop=$(date -d "+${FA_TESTS_SECONDS:-240} seconds" +%H:%M:%S)
  (cd build-gpu-options && ctest -R '^cuda_attention[.]' -j12 --timeout 230 --stop-time "$stop" -V) \
    > "$out/ctest.log" 2>&1 || status=1
  grep -E "tests passed|\*\*\*|Failed  |CHECK failed|tests failed" "$out/ctest.log" | head -40
  # Each option case: the kernels it ran and its errors against the reference.
  grep -E "^[0-9]+:   .*(softcap|alibi|bias|all three)" "$out/ctest.log" | sed 's/^[0-9]*: //' \
    > "$out/options-cases.txt"
  echo "option cases run: $(wc -l < "$out/options-cases.txt") (options-cases.txt)"
  for entry in "${bg[@]}"; do
    pid=${entry%%:*}
    wait "$pid"
    rc=$?
    echo "${entry#*:}: exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out)')"
    case ${entry#*:} in
      memcheck*)
        # Out of time (124) is not an error found: the log says how far it got.
        grep -E "ERROR SUMMARY|passed, " "$out/memcheck-${entry##* }.log" | tail -2
        [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || status=1 ;;
      half*)
        grep -E "CHECK failed|passed, " "$out/half-score_options.log" | tail -4
        [ "$rc" -eq 0 ] || status=1 ;;
    esac
  done
fi

if want speed; then
  stamp "plans"
  : > "$out/plans.txt"
  for i in "${!names[@]}"; do
    echo "## ${names[$i]}" >> "$out/plans.txt"
    # shellcheck disable=SC2086
    build-gpu-options/fa-info "${shape[@]}" ${opts[$i]} --seqlen 8192 --batch 2 --heads 16 2>&1 \
      | grep -E "^(forward|backward)" >> "$out/plans.txt"
  done
  cat "$out/plans.txt"
  stamp "speed: fa-bench bf16 d128 N 8192 causal"
  rm -f "$out/speed.jsonl"
  for i in "${!names[@]}"; do
    # shellcheck disable=SC2086
    timeout 60 build-gpu-options/fa-bench "${shape[@]}" ${opts[$i]} --seqlens 8192 --repeats 10 --warmup 3 \
      --label "${names[$i]}" --json "$out/speed.jsonl" > "$out/speed-${names[$i]}.txt" 2>&1 || status=1
  done
  python3 - "$out/speed.jsonl" <<'PY' | tee "$out/speed.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
base = next((r for r in rows if r["label"] == "none" and "fwd_tflops" in r), None)
print(f"{'options':<10} {'fwd ms':>8} {'TFLOP/s':>8} {'x none':>7} {'bwd ms':>8} {'TFLOP/s':>8} {'x none':>7}  tile")
for r in rows:
    if "fwd_tflops" not in r:
        print(f"{r['label']:<10} {r.get('error', '?')}: {r.get('message', '')}")
        continue
    rf = r["fwd_tflops"] / base["fwd_tflops"] if base else float("nan")
    rb = r["bwd_tflops"] / base["bwd_tflops"] if base else float("nan")
    print(f"{r['label']:<10} {r['fwd_ms']:8.3f} {r['fwd_tflops']:8.1f} {rf:7.2f} {r['bwd_ms']:8.3f} "
          f"{r['bwd_tflops']:8.1f} {rb:7.2f}  {r['br']}x{r['bc']}/{r['wg']}")
PY
fi
stamp "done (exit $status)"
exit $status
