#!/usr/bin/env bash
# On an NVIDIA GPU machine: the caller's queue (fa_context_set_native_queue),
# the per-call dropout seed (fa_plan_set_dropout_seed) and the dropout origin
# of a ring's pieces (test_dropout_seed's origin_* cases: a plan of part of a
# problem drops what the whole problem's plan drops there) on every backend
# there: CUDA, NVIDIA's OpenCL, and HIP through the mapping onto CUDA when
# .deps/hip holds its headers (bench/hip_nvidia_check.sh says how).
# Runs tests/test_native_queue.c and tests/test_dropout_seed.c; the Python
# package on PyTorch's streams is bench/python_gpu_check.sh. Logs to $OUT
# (default ./gpu-out).
#
# Expected: every case passes, except skips for what is not there: HIP
# without .deps/hip, hip_standard and origin_hip_standard (the HIP backend
# runs fused attention only), opencl_standard and origin_opencl_standard
# without CLBlast in .deps/clblast.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_gpu_info
fa_nvidia_opencl
fa_clblast
fa_hip_nvidia_args
stamp "configure and build"
fa_gpu_build build-gpu "test_native_queue test_dropout_seed" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON \
  -DFA_OPENCL=ON "${hip_args[@]}" || exit 1
stamp "native queue and dropout seed tests"
ctest --test-dir build-gpu -R "^(native_queue|dropout_seed)\." --output-on-failure --timeout 500 \
  > "$out/native-queue.log" 2>&1
status=$?
grep -E "Test +#|SKIP|CHECK failed|tests passed" "$out/native-queue.log"
stamp "done"
exit "$status"
