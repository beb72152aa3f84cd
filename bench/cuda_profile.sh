#!/usr/bin/env bash
# On an NVIDIA GPU machine, after a build into build-gpu: Nsight Compute's
# full section set for one forward and one key-side backward kernel of the
# CUDA backend's plan (fp16, 16k tokens, hidden 2048), to see what holds
# the tensor-core kernels back (stall reasons, pipe use, shared-memory bank
# conflicts, occupancy). Also keeps the compile logs (ptxas' registers and
# spills) of the kernels that ran.
# Usage: bench/cuda_profile.sh [DIM [SEQLEN [DTYPE]]]; output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
dim=${1:-128}
n=${2:-4096}
dtype=${3:-fp16}
mkdir -p "$out/logs"
ncu=/usr/local/cuda/bin/ncu
command -v ncu > /dev/null && ncu=$(command -v ncu)
FLASHATTN_CACHE_DIR=off FLASHATTN_CUDA_LOG_DIR="$out/logs" \
  "$ncu" --set full --kernel-name regex:'fa_fwd_mma|fa_bwd_dkdv_mma' --launch-count 2 \
  build-gpu/fa-bench --backend cuda --dtype "$dtype" --dim "$dim" --seqlens "$n" --repeats 1 --warmup 0 \
  > "$out/ncu-$dtype-d$dim-n$n.txt" 2>&1
echo "ncu: exit $?"
# The lines that say most, per kernel.
grep -E "fa_fwd_mma|fa_bwd_dkdv_mma|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Bank Conflicts|L1/TEX Hit|Executed Ipc A|One or More Eligible" \
  "$out/ncu-$dtype-d$dim-n$n.txt" | head -80
