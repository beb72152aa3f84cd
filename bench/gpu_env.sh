# Shared setup of the NVIDIA GPU-machine scripts in bench/ (sourced, from
# the repository root): the output folder, the kernel cache, NVIDIA's OpenCL
# through the ICD loader, the HIP-on-CUDA build options and the build.
#
# Sets: out (from $OUT, default ./gpu-out; created), t_start.
# Exports: FLASHATTN_CACHE_DIR (default /tmp/fa-kernel-cache).
# Functions: stamp, fa_commit_label, fa_gpu_info, fa_nvidia_opencl, fa_hip_nvidia_args,
# fa_clblast, fa_gpu_build, fa_gpu_build_cuda, fa_gpu_build_opencl, fa_gpu_build_all, fa_smoke_run,
# fa_smoke_report, fa_fwd_sweep.
# shellcheck shell=bash

out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export FLASHATTN_CACHE_DIR=${FLASHATTN_CACHE_DIR:-/tmp/fa-kernel-cache}
t_start=$(date +%s)

# The label of this tree's JSON lines: FA_COMMIT, else the checkout's
# commit with "-dirty" where tracked files differ from it (the GPU machine's
# copy of the history can stand behind the tree it runs).
fa_commit_label() { echo "${FA_COMMIT:-$(git describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)}"; }

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

# fa_gpu_build_cuda TARGETS: the CUDA backend alone (Release) built into
# build-gpu, after the GPU's details; returns 1 when the build fails.
fa_gpu_build_cuda() {
  fa_gpu_info
  fa_gpu_build build-gpu "$1" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF -DFA_OPENCL=OFF
}

# fa_gpu_build_opencl TARGETS: NVIDIA's OpenCL (and CUDA where found, for
# the tools that replay its launches) built into build-gpu (Release), after
# the GPU's details; returns 1 when the library or the build is missing.
fa_gpu_build_opencl() {
  fa_nvidia_opencl || return 1
  fa_gpu_info
  stamp "build"
  fa_gpu_build build-gpu "$1" -DFA_OPENCL=ON -DFA_CUDA=AUTO -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF -DCMAKE_BUILD_TYPE=Release
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

# Smoke runs of build-gpu/fa-run (CUDA) against the CPU reference, eight at
# a time in the background, each under a two-minute limit (a lost barrier
# phase hangs rather than fails), one file each in $out/smoke:
# fa_smoke_run FA_RUN_OPTIONS... (variables set before it apply to that
# run). fa_smoke_report waits for them, prints a line a run (exit status,
# options, the forward's tile, O's error), gathers the files into
# $out/smoke.txt and returns 1 when a run failed.
fa_smoke_n=0
fa_smoke_run() {
  fa_smoke_n=$((fa_smoke_n + 1))
  mkdir -p "$out/smoke"
  ( timeout 120 build-gpu/fa-run --backend cuda --repeats 1 "$@" > "$out/smoke/$fa_smoke_n.txt" 2>&1
    echo "rc $? args $*" >> "$out/smoke/$fa_smoke_n.txt" ) &
  if [ $((fa_smoke_n % 8)) = 0 ]; then wait; fi
}

fa_smoke_report() {
  local f rc plan err status=0
  wait
  for f in $(ls "$out/smoke" | sort -n); do
    f=$out/smoke/$f
    rc=$(grep -o "^rc [0-9]*" "$f" | cut -d' ' -f2)
    plan=$(grep -m1 -o "forward: [a-z_]*, tile [0-9]* x [0-9]*" "$f" || true)
    err=$(grep -m1 "^  O " "$f" | sed "s/ *(limit.*)//" || true)
    printf "  rc %-3s %-70s %s %s\n" "$rc" "$(grep -o "args .*" "$f" | cut -c6-)" "$plan" "$err"
    [ "$rc" = 0 ] || status=1
  done
  # One file back instead of one a run.
  for f in $(ls "$out/smoke" | sort -n); do cat "$out/smoke/$f"; done > "$out/smoke.txt"
  rm -rf "$out/smoke"
  fa_smoke_n=0
  return $status
}

# fa_fwd_sweep JSON LABEL DTYPE DIM CAUSAL SEQLENS: one forward sweep of
# build-gpu/fa-bench (CUDA, 16k tokens, hidden 2048, the median of 10
# repeats), JSON lines appended to JSON, the table to $out/bench.txt;
# returns 1, with a line saying which, when it failed.
fa_fwd_sweep() {
  local json=$1 label=$2 dt=$3 dim=$4 causal=$5 seqlens=$6 flag=()
  [ "$causal" = 1 ] && flag=(--causal)
  timeout 200 build-gpu/fa-bench --backend cuda --dtype "$dt" --dim "$dim" "${flag[@]}" --seqlens "$seqlens" \
    --tokens 16384 --hidden 2048 --pass fwd --repeats 10 --warmup 2 --json "$json" --label "$label" \
    >> "$out/bench.txt" 2>&1 || { echo "  $label $dt d$dim causal $causal failed"; return 1; }
}
