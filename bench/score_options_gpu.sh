#!/usr/bin/env bash
# On an NVIDIA GPU machine: every backend built here (OpenCL through
# NVIDIA's OpenCL, CUDA, HIP through the mapping onto CUDA where .deps/hip
# holds its headers) must refuse softcap, ALiBi and the additive bias at
# plan creation with FA_ERR_UNSUPPORTED naming the option, and still plan
# the same problem without them; the fp64 reference's option tests run
# beside. Logs to $OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_gpu_build_all || exit 1
build-gpu/fa-info 2>&1 | grep -E "^\[|available" | tee "$out/fa-info.txt"
stamp "score options"
build-gpu/test_reference_options > "$out/score-options.log" 2>&1
echo "test_reference_options: exit $?"
tail -12 "$out/score-options.log"
stamp "done"
