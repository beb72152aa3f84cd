# Shared setup of the NVIDIA GPU-machine scripts in bench/ (sourced, from
# the repository root): the output folder, the kernel cache, NVIDIA's OpenCL
# through the ICD loader, the HIP-on-CUDA build options and the build.
#
# Sets: out (from $OUT, default ./gpu-out; created), t_start.
# Exports: FLASHATTN_CACHE_DIR (default /tmp/fa-kernel-cache).
# Functions: stamp, fa_gpu_info, fa_nvidia_opencl, fa_hip_nvidia_args,
# fa_clblast, fa_gpu_build, fa_gpu_build_all.
# shellcheck shell=bash

out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export FLASHATTN_CACHE_DIR=${FLASHATTN_CACHE_DIR:-/tmp/fa-kernel-cache}
t_start=$(date +%s)

# Prints a line prefixed with the seconds since the script started.
stamp() { echo "[$(( $(date +%s) - t_start )) s] $*"; }

# The GPU, driver and clocks, into $out/gpu.txt and on stdout.
fa_gpu_info() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    > "$out/gpu.txt" 2>&1
  cat "$out/gpu.txt"
}

# NVIDIA's OpenCL library through the ICD loader: the image's vendor list
# names only a PoCL that is not installed, so OCL_ICD_VENDORS points at a
# folder of our own holding one nvidia.icd. Returns 1 when the library is
# not on the machine.
fa_nvidia_opencl() {
  local lib="" candidate
  for candidate in /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 /usr/lib/libnvidia-opencl.so.1 \
                   /usr/local/nvidia/lib64/libnvidia-opencl.so.1 /usr/lib64/libnvidia-opencl.so.1; do
    [ -e "$candidate" ] && { lib=$candidate; break; }
  done
  [ -n "$lib" ] || lib=$(ldconfig -p 2>/dev/null | awk '/libnvidia-opencl.so.1/ {print $NF; exit}')
  [ -n "$lib" ] || { echo "no libnvidia-opencl.so.1 found" >&2; return 1; }
  mkdir -p /tmp/fa-icd
  echo "$lib" > /tmp/fa-icd/nvidia.icd
  export OCL_ICD_VENDORS=/tmp/fa-icd
}

# Sets the array hip_args to the CMake options of the HIP backend running on
# CUDA (the HIP-on-CUDA mapping) when Debian's HIP headers were unpacked into
# .deps/hip (see bench/hip_nvidia_check.sh), else to build without HIP. Both
# switches are given either way: a build folder keeps the cached values of
# the last script that configured it.
# shellcheck disable=SC2034  # hip_args is the result, read by the caller
fa_hip_nvidia_args() {
  local include=${FA_HIP_INCLUDE:-$PWD/.deps/hip/usr/include}
  if [ -e "$include/hip/hip_runtime_api.h" ]; then
    hip_args=(-DFA_HIP=AUTO -DFA_HIP_NVIDIA=ON -DFA_HIP_INCLUDE="$include")
  else
    hip_args=(-DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF)
  fi
}

# CLBlast for the OpenCL backend's standard attention: the GPU image has
# none, so Debian's libclblast1 unpacked into .deps/clblast travels with the
# tree (`apt-get download libclblast1 && dpkg -x libclblast1_*.deb
# .deps/clblast`). Returns 1 when it is not there.
fa_clblast() {
  local lib=$PWD/.deps/clblast/usr/lib/x86_64-linux-gnu/libclblast.so.1
  [ -e "$lib" ] || { echo "no CLBlast in .deps/clblast: OpenCL standard attention will not run" >&2; return 1; }
  export FLASHATTN_CLBLAST_LIBRARY=$lib
}

# fa_gpu_build DIR TARGETS [CMAKE OPTIONS...]: configures DIR (warnings as
# errors) and builds TARGETS, a space-separated list (empty: everything).
# Logs: $out/cmake.log and $out/build.log; on failure their errors are
# printed and it returns 1.
fa_gpu_build() {
  local dir=$1 targets=$2 t
  shift 2
  local target_args=()
  for t in $targets; do target_args+=(--target "$t"); done
  cmake -S . -B "$dir" -DFA_WERROR=ON "$@" > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; return 1; }
  cmake --build "$dir" -j"$(nproc)" "${target_args[@]}" > "$out/build.log" 2>&1 ||
    { grep -E "error|warning" "$out/build.log" | head -40; tail -5 "$out/build.log"; return 1; }
}

# Every backend the machine can run (CUDA, NVIDIA's OpenCL with CLBlast
# where .deps/clblast has it, HIP through the mapping where .deps/hip has
# its headers) built into build-gpu (Release), after the GPU's details.
# Returns 1 when the build fails.
fa_gpu_build_all() {
  fa_gpu_info
  fa_nvidia_opencl
  fa_clblast
  fa_hip_nvidia_args
  stamp "configure and build"
  fa_gpu_build build-gpu "" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=ON "${hip_args[@]}"
}
