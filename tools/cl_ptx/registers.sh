#!/usr/bin/env bash
# Registers and spills of the OpenCL matrix-unit kernels on NVIDIA, without
# a GPU: the program cl_attention.c would build for NVIDIA's layer
# (kernels_cl/common.h, mma_frag.h, mma_nvidia.h, mma_generic.h,
# mma_common.h, wgmma_nvidia.h, then the pass's files) compiled by clang's NVPTX OpenCL
# target and assembled by ptxas for sm_90. Not NVIDIA's OpenCL compiler: the
# kernels of the first GPU run (h100.md) count 241 / 222 forward (d64 /
# d128) and 169-175 / 253-255 backward here, where NVIDIA's reported
# 218-224 / 207-211 and 170-240 / 254-255. An estimate, then: a change that
# adds or saves registers shows here, and a kernel near 255 needs the GPU's
# word (bench/opencl_mma_gpu.sh compile or sweep).
#
# Usage: tools/cl_ptx/registers.sh fwd|bwd "BUILD OPTIONS" [ROOT]
#   e.g. tools/cl_ptx/registers.sh bwd "-DHEAD_DIM=128 -DDTYPE_F16 -DBR=16
#        -DBC=64 -DTR=4 -DTC=2 -DWARPS=4 -DDQ_ATOMIC -DFA_NV_PTX"
# ROOT: a tree holding kernels_cl/ (default: this repository), to compare
# with another commit's kernels (git archive REV kernels_cl | tar -x -C DIR).
# Needs clang (OpenCL C to NVPTX) and ptxas (CUDA) on PATH or in
# /usr/local/cuda/bin. Prints one line per kernel of the pass.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pass=${1:?fwd or bwd}
opts=${2:?build options}
root=${3:-$here/../..}
case $pass in
  fwd) files="kernels_cl/fwd_mma.cl" ;;
  bwd) files="kernels_cl/bwd_common.cl kernels_cl/bwd_mma.cl" ;;
  *) echo "pass: fwd or bwd" >&2; exit 2 ;;
esac
ptxas=$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)
[ -x "$ptxas" ] || { echo "no ptxas" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in kernels_cl/common.h kernels_cl/mma_frag.h kernels_cl/mma_nvidia.h kernels_cl/mma_generic.h \
         kernels_cl/mma_common.h kernels_cl/wgmma_nvidia.h $files; do
  cat "$root/$f"
  echo
done > "$tmp/k.cl"
# shellcheck disable=SC2086  # the options' words
clang -x cl -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -include opencl-c.h -include "$here/prelude.h" -O3 -S \
  -DFA_GPU -DFA_MMA_NVIDIA $opts -o "$tmp/k.ptx" "$tmp/k.cl"
# clang writes its own PTX version; red.global.add.v2 (FA_RED_V2) needs 8.1.
sed -i 's/^\.version .*/.version 8.1/; s/^\.target .*/.target sm_90/' "$tmp/k.ptx"
"$ptxas" -arch=sm_90 -v "$tmp/k.ptx" -o /dev/null > "$tmp/log" 2>&1 || { grep -E "error|fatal" "$tmp/log" >&2; exit 1; }
python3 - "$tmp/log" <<'PY'
import re, sys
name = spill = None
for line in open(sys.argv[1]):
    m = re.search(r"entry function '(\w+)'", line)
    if m:
        name, spill = m.group(1), None
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        spill = "%s/%s" % m.groups()
    m = re.search(r"Used (\d+) registers", line)
    if m and name in ("fa_forward", "fa_bwd_dkdv", "fa_bwd_dq"):
        print("%-12s %3s registers, spill stores/loads %s bytes" % (name, m.group(1), spill))
PY
