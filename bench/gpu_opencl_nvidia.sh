#!/usr/bin/env bash
# On an NVIDIA GPU machine: build, run the OpenCL test suite through NVIDIA's
# OpenCL at larger sizes, then benchmark the OpenCL backend beside PyTorch
# SDPA on the same GPU in the same run. Writes logs and JSON lines to $OUT
# (default ./gpu-out). Usage: bench/gpu_opencl_nvidia.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
what=${1:-all}
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_nvidia_opencl || exit 1
# Standard attention (opencl_standard.*) needs CLBlast; without it those
# tests report themselves skipped.
fa_clblast || true

fa_gpu_info
# Every switch is given: build-gpu keeps what other scripts configured.
fa_gpu_build build-gpu "" -DFA_OPENCL=ON -DFA_CUDA=AUTO -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF \
  -DCMAKE_BUILD_TYPE=Release || exit 1
build-gpu/fa-info --backend opencl --seqlen 4096 --dim 128 2>&1 | tee "$out/fa-info.txt"

if [ "$what" = tests ] || [ "$what" = all ]; then
  # The OpenCL suite at its larger sizes (FA_TEST_LARGE=1: N up to 16k).
  FA_TEST_LARGE=1 ctest --test-dir build-gpu -R "opencl_" --output-on-failure -j4 --timeout 600 \
    > "$out/opencl-tests.log" 2>&1
  echo "opencl tests: exit $?"; grep -E "tests passed|FAILED|Failed|Skipped" "$out/opencl-tests.log" | head -40
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
  json="$out/bench.jsonl"
  commit=$(fa_commit_label)
  for dtype in fp32 fp16 bf16; do
    for dim in 64 128; do
      build-gpu/fa-bench --backend opencl --dtype "$dtype" --dim "$dim" --seqlens 1024,2048,4096,8192,16384 \
        --repeats 10 --json "$json" --label "$commit" 2>/dev/null | tee -a "$out/bench.txt"
    done
  done
  python3 bench/sdpa_peer.py --dtypes fp32,fp16,bf16 --dims 64,128 --seqlens 1024,2048,4096,8192,16384 \
    --causal 0 --backends flash,cudnn,efficient --json "$json" --label "$commit" > "$out/peer.log" 2>&1
  python3 bench/ratio_table.py "$json" --ours opencl --peers efficient,flash | tee "$out/ratio.md"
fi
