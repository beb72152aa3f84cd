#!/usr/bin/env bash
# On an NVIDIA GPU machine: build every backend (OpenCL through NVIDIA's
# OpenCL, CUDA, HIP through the mapping onto CUDA) and run every device test
# suite plus the CUDA compile sweep. Logs to $OUT (default ./gpu-out).
# HIP headers: Debian's libamdhip64-dev unpacked into .deps/hip (see
# bench/hip_nvidia_check.sh). Set FA_TEST_LARGE=1 for sequences up to 16k.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
lib=""
for c in /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 /usr/lib/libnvidia-opencl.so.1 \
         /usr/local/nvidia/lib64/libnvidia-opencl.so.1; do
  [ -e "$c" ] && { lib=$c; break; }
done
mkdir -p /tmp/fa-icd && echo "${lib:-libnvidia-opencl.so.1}" > /tmp/fa-icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/fa-icd
hip=()
[ -d .deps/hip/usr/include ] && hip=(-DFA_HIP_NVIDIA=ON -DFA_HIP_INCLUDE="$PWD/.deps/hip/usr/include")
[ ${#hip[@]} -eq 0 ] && hip=(-DFA_HIP=OFF)
cmake -S . -B build-gpu -DFA_WERROR=ON -DCMAKE_BUILD_TYPE=Release "${hip[@]}" > "$out/cmake.log" 2>&1 ||
  { tail -30 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j16 > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
build-gpu/fa-info 2>&1 | grep -E "^\[|available" | tee "$out/fa-info.txt"
ctest --test-dir build-gpu -L "device|compile" -j4 --timeout 400 > "$out/ctest.log" 2>&1
echo "device and compile tests: exit $?"
grep -E "tests passed|\*\*\*|Total Test" "$out/ctest.log" | head -60
