#!/usr/bin/env bash
# On an NVIDIA GPU machine, from the repository root: the OpenCL backward
# under build-option variants, side by side in one build (fa-run, the
# planner's tiles, 16k tokens, hidden 2048, median of VAR_REPEATS).
#
# Env: VAR_VARIANTS  space-separated label=options (options comma-separated
#                    -D macros for FLASHATTN_OPENCL_OPTIONS; "plain=" for
#                    none), default "plain= pairs=-DFA_DQ_PAIRS"
#      VAR_DIMS (default "64 128"), VAR_SEQLENS (default "4096 16384"),
#      VAR_CAUSAL (default "0 1"), VAR_DTYPE (default fp16),
#      VAR_REPEATS (default 5), VAR_CHECK=1 (each run against the CPU
#      reference first: slow at these lengths; default 0).
# Output: one line a run, $OUT/variants.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_nvidia_opencl || exit 1
build=build-gpu
fa_gpu_build "$build" fa-run -DFA_OPENCL=ON -DFA_CUDA=AUTO -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF \
  -DCMAKE_BUILD_TYPE=Release || exit 1
check=--no-check
[ "${VAR_CHECK:-0}" = 1 ] && check=
for n in ${VAR_SEQLENS:-4096 16384}; do
  for dim in ${VAR_DIMS:-64 128}; do
    for causal in ${VAR_CAUSAL:-0 1}; do
      flag=""
      [ "$causal" = 1 ] && flag=--causal
      for v in ${VAR_VARIANTS:-plain= pairs=-DFA_DQ_PAIRS}; do
        label=${v%%=*} opts=${v#*=}
        # shellcheck disable=SC2086  # the flag's word
        r=$(FLASHATTN_OPENCL_OPTIONS="${opts//,/ }" "$build/fa-run" --backend opencl --dtype "${VAR_DTYPE:-fp16}" \
          --dim "$dim" --seqlen "$n" --batch $((16384 / n)) --heads $((2048 / dim)) $flag \
          --repeats "${VAR_REPEATS:-5}" $check 2>&1 | grep -E "^  backward +[0-9]|mismatch|error" | tr -s ' ')
        printf "d%-3s N%-6s causal %s %-12s %s\n" "$dim" "$n" "$causal" "$label" "$r" | tee -a "$out/variants.txt"
      done
    done
  done
done
