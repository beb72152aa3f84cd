#!/usr/bin/env bash
# On an NVIDIA GPU machine: the differential test (tests/test_differential.c:
# random problems, extreme windows, NaN and infinities, against the fp64
# reference) with many more cases than CI gives it, on CUDA, on NVIDIA's
# OpenCL and on HIP through the mapping onto CUDA (when .deps/hip holds its
# headers, bench/gpu_env.sh), the three at once; then compute-sanitizer
# memcheck on the CUDA run of the extreme cases and the first random ones.
# Logs to $OUT (default ./gpu-out): differential-<backend>.log,
# differential-memcheck.log.
#
# Usage: bench/differential_gpu.sh [run|memcheck|all] (default all)
# FA_DIFF_CASES (default 1200 here) cases per backend; FA_DIFF_BUILDS
# (default 20 here: NVRTC takes seconds a build) kernel builds per
# backend; FA_DIFF_SEED another set of cases; FA_DIFF_MEMCHECK_CASES
# (default 40) the cases under memcheck.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
steps=${*:-all}
want() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
export FA_DIFF_CASES=${FA_DIFF_CASES:-1200}
export FA_DIFF_BUILDS=${FA_DIFF_BUILDS:-20}

fa_gpu_build_all || exit 1
# The HIP backend names AMD's runtime by default; the mapping is named here.
mapping=$PWD/build-gpu/libfa_hip_on_cuda.so
[ -e "$mapping" ] && export FLASHATTN_HIP_LIBRARY=$mapping

status=0
if want run; then
  stamp "differential: $FA_DIFF_CASES cases on each of cuda, opencl, hip"
  pids=()
  for backend in cuda opencl hip; do
    build-gpu/test_differential "$backend" > "$out/differential-$backend.log" 2>&1 &
    pids+=($!)
  done
  i=0
  for backend in cuda opencl hip; do
    wait "${pids[$i]}"
    rc=$?
    i=$((i + 1))
    echo "$backend: exit $rc$([ "$rc" -eq 77 ] && echo ' (skipped: no device)')"
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || status=1
    grep -E "^differential:|FAILED|^    |skip" "$out/differential-$backend.log" | head -30
  done
fi

if want memcheck; then
  stamp "compute-sanitizer memcheck: CUDA, the extreme cases and the first random ones"
  san=/usr/local/cuda/bin/compute-sanitizer
  command -v compute-sanitizer > /dev/null && san=$(command -v compute-sanitizer)
  FA_DIFF_CASES=${FA_DIFF_MEMCHECK_CASES:-40} "$san" --tool memcheck --error-exitcode 9 \
    build-gpu/test_differential cuda > "$out/differential-memcheck.log" 2>&1
  rc=$?
  echo "memcheck: exit $rc"
  [ "$rc" -eq 0 ] || status=1
  grep -E "^differential:|ERROR SUMMARY|FAILED" "$out/differential-memcheck.log" | tail -5
fi
stamp "done"
exit $status
