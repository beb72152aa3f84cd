#!/usr/bin/env bash
# On an NVIDIA machine of one or more GPUs, in one call: ring attention
# (context parallelism) checked and timed.
# - Correctness: the ring's element-wise passes on every backend
#   (test_rows), the ring against one context on the whole sequence on
#   CUDA, NVIDIA's OpenCL and HIP through the mapping (test_dist_device, with
#   FA_TEST_LARGE=1: ranks as threads sharing one GPU over host memory, and
#   over NCCL one GPU a rank where there are two or more), the NCCL
#   transport's device test (test_ring_device).
# - Speed: fa-bench --ranks W over NCCL for each W the machine has GPUs for
#   (2 and 4), bf16, d128, 32 query heads on 8 KV heads, causal, zigzag,
#   TOKENS_PER_GPU tokens a GPU (default 262144), beside one GPU on a rank's
#   tokens; the PyTorch peer (bench/ring_sdpa.py: the zigzag ring on SDPA's
#   FlashAttention-2 kernels) on the same shapes where PyTorch is there;
#   and fa-info's prediction for NVLink beside it.
# Logs and JSON lines to $OUT (default ./gpu-out): cp-tests.log,
# cp-bench.jsonl, cp-bench.txt, cp-peer.jsonl, cp-model.txt.
#
#   bench/context_parallel.sh            tests and the timing
#   bench/context_parallel.sh tests      tests only
#   bench/context_parallel.sh bench      the timing only (after the tests,
#                                        on the same machine)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
mode=${1:-all}
case $mode in all|tests|bench) ;; *) echo "usage: $0 [all|tests|bench]" >&2; exit 2 ;; esac
fa_gpu_info
fa_nvidia_opencl
# NVLink multicast (NVLS) stays off on the lent machines.
export NCCL_NVLS_ENABLE=0
fa_hip_nvidia_args
gpus=$(nvidia-smi -L | grep -c '^GPU')
stamp "$gpus GPU(s); configure and build"
fa_gpu_build build-gpu-cp "test_rows test_dist test_dist_device test_ring_device fa-bench fa-info" \
  -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=ON "${hip_args[@]}" || exit 1
failed=0

if [ "$mode" != bench ]; then
stamp "ring tests"
for t in test_rows test_dist test_ring_device "test_dist_device cuda" "test_dist_device opencl" "test_dist_device hip"; do
  stamp "$t"
  # shellcheck disable=SC2086  # the test and its case are two words
  FA_TEST_LARGE=1 timeout 300 build-gpu-cp/$t >> "$out/cp-tests.log" 2>&1 || { failed=1; echo "$t failed"; }
done
grep -E "^(ok|FAIL|skip)|passed|CHECK failed|not run" "$out/cp-tests.log" | head -60
if python3 -c "import torch" > /dev/null 2>&1; then
  stamp "Python ring_attention over torch.distributed (Gloo, NCCL)"
  fa_gpu_build build-gpu-cp "flashattn" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=ON "${hip_args[@]}" || failed=1
  FLASHATTN_LIBRARY=$PWD/build-gpu-cp/libflashattn.so PYTHONPATH=$PWD/python timeout 300 \
    python3 -m pytest python/tests/test_ring.py -q -rs > "$out/cp-python.log" 2>&1 || failed=1
  tail -n 15 "$out/cp-python.log"
fi
fi

if [ "$mode" != tests ] && [ -f bench/ring_sdpa.py ] && python3 -c "import torch" > /dev/null 2>&1; then
  stamp "PyTorch peer: its ring against one GPU"
  timeout 200 python3 bench/ring_sdpa.py --ranks 2 --check 2>&1 | tail -n 14
fi

if [ "$mode" = all ] || [ "$mode" = bench ]; then
  per_gpu=${TOKENS_PER_GPU:-262144}
  shape=(--heads 32 --heads-kv 8 --dim 128 --dtype bf16 --causal --batch 1)
  rm -f "$out/cp-bench.jsonl" "$out/cp-peer.jsonl"
  for w in 2 4; do
    [ "$w" -le "$gpus" ] || { echo "ranks $w: not run ($gpus GPU(s) here)"; continue; }
    n=$((per_gpu * w))
    stamp "fa-bench --ranks $w, $n tokens"
    # A rank needs about 30 GiB at 256k tokens (its tensors, the ring's
    # buffers, each piece plan's workspace): halve the length where a GPU
    # has less.
    if ! timeout 400 build-gpu-cp/fa-bench --ranks "$w" --backend cuda --seqlen "$n" "${shape[@]}" --repeats 3 \
      --warmup 1 --json "$out/cp-bench.jsonl" 2>&1 | tee -a "$out/cp-bench.txt"; then
      n=$((n / 2))
      stamp "again at $n tokens"
      timeout 300 build-gpu-cp/fa-bench --ranks "$w" --backend cuda --seqlen "$n" "${shape[@]}" --repeats 3 \
        --warmup 1 --json "$out/cp-bench.jsonl" 2>&1 | tee -a "$out/cp-bench.txt" || failed=1
    fi
    build-gpu-cp/fa-info --backend cuda --seqlen "$n" "${shape[@]}" --ranks "$w" --link-gbs 450 \
      > "$out/cp-model-$w.txt" 2>&1
    tail -n 20 "$out/cp-model-$w.txt"
    if [ -f bench/ring_sdpa.py ] && python3 -c "import torch" > /dev/null 2>&1; then
      stamp "PyTorch zigzag ring on SDPA flash, $w ranks"
      timeout 400 python3 bench/ring_sdpa.py --ranks "$w" --seqlen "$n" --heads 32 --heads-kv 8 --dim 128 \
        --dtype bf16 --causal --repeats 3 --warmup 1 --json "$out/cp-peer.jsonl" 2>&1 | tail -n 12
    fi
  done
fi
stamp "done (failed=$failed)"
exit $failed
