#!/usr/bin/env bash
# On an NVIDIA GPU machine: the hostile-input cases of issue 21 on CUDA,
# on NVIDIA's OpenCL and (when .deps/hip holds its headers) on HIP through
# the mapping onto CUDA: windows from INT_MIN to INT_MAX, every order of
# destroy calls, block sizes of INT_MAX, build options from the environment
# that would redefine the plan's macros, fa-run on one-token sequences;
# then the same CUDA cases under compute-sanitizer (memcheck). The host
# cases (test_hostile, test_cli, the planner's largest shapes) run too.
# Logs to $OUT (default ./gpu-out). Every test listed must pass.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_gpu_info
fa_nvidia_opencl
fa_hip_nvidia_args
stamp "configure and build"
fa_gpu_build build-gpu "" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=ON "${hip_args[@]}" || exit 1
build-gpu/fa-info 2>&1 | grep -E "^\[|available" | tee "$out/fa-info.txt"

cases='extreme_windows|destroy_in_any_order|huge_mask_blocks|env_build_options'
stamp "hostile cases on every backend, and the host ones"
ctest --test-dir build-gpu -R "^((cuda|opencl|hip)_attention\.($cases)|hostile\..*|cli\..*|cli_device\..*|planner\.largest_shapes_plan_at_once)\$" \
  --timeout 600 --output-on-failure > "$out/robust-ctest.log" 2>&1
echo "hostile cases: exit $?"
grep -E "tests passed|Passed|Failed|Skipped|\*\*\*" "$out/robust-ctest.log" | head -60

sanitizer=/usr/local/cuda/bin/compute-sanitizer
if [ -x "$sanitizer" ]; then
  for c in extreme_windows huge_mask_blocks destroy_in_any_order; do
    stamp "compute-sanitizer memcheck: cuda_attention $c"
    "$sanitizer" --tool memcheck --error-exitcode 99 build-gpu/test_cuda_attention "$c" \
      > "$out/robust-memcheck-$c.log" 2>&1
    echo "memcheck $c: exit $? ($(grep -E 'ERROR SUMMARY' "$out/robust-memcheck-$c.log" | tail -1))"
  done
else
  echo "no compute-sanitizer at $sanitizer: memcheck skipped"
fi
stamp "done"
