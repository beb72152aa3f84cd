#!/usr/bin/env bash
# On an NVIDIA GPU machine: build every backend (OpenCL through NVIDIA's
# OpenCL, CUDA, HIP through the mapping onto CUDA when .deps/hip holds its
# headers) and run every device test suite and the compile sweeps, then
# compute-sanitizer on small CUDA shapes. Logs to $OUT (default ./gpu-out).
# CLBlast for OpenCL standard attention: .deps/clblast (bench/gpu_env.sh).
# Set FA_TEST_LARGE=1 for sequences up to 16k.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_gpu_build_all || exit 1
build-gpu/fa-info 2>&1 | grep -E "^\[|available" | tee "$out/fa-info.txt"
stamp "device and compile tests"
ctest --test-dir build-gpu -L "device|compile" -j8 --timeout 500 > "$out/ctest.log" 2>&1
echo "device and compile tests: exit $?"
grep -E "tests passed|\*\*\*|Total Test" "$out/ctest.log" | head -60
stamp "done"
