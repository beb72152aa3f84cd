#!/usr/bin/env bash
# On an NVIDIA GPU machine, from the repository root: Nsight Compute on the
# OpenCL backend's matrix-unit backward (fa_bwd_dkdv) as NVIDIA's OpenCL
# builds it, beside FlashAttention-2's backward kernel (PyTorch SDPA), then
# the backward sweep (bench/fa-cl-mma-sweep.c). Nsight Compute does not see
# OpenCL launches: the planner's launch is recorded (FLASHATTN_OPENCL_RECORD,
# backends/opencl/cl_record.c) and run again through the CUDA driver by
# tools/cl_replay/fa-cl-replay from NVIDIA's own PTX, which ncu profiles.
#
# Env: PROF_DIMS (default "64 128"), PROF_N (default 16384; 16k tokens,
# hidden 2048, fp16), PROF_PEER=0 (no FlashAttention-2 profile),
# PROF_SWEEP=0 (no sweep; PROF_SWEEP_PASS: its pass, default bwd, empty for
# both; PROF_SWEEP_CHECK=0: no reference check first), PROF_OPTIONS (FLASHATTN_OPENCL_OPTIONS for the
# recorded launch). Output: $OUT/opencl-bwd-profile.tgz (ncu details and
# SASS per kernel, FlashAttention-2's included, replay times, the sweep).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
build="build-gpu"
fa_gpu_build_opencl "fa-run fa-bench fa-cl-replay fa-cl-mma-sweep test_opencl_mma" || exit 1
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
prof="$out/prof"
mkdir -p "$prof"
n=${PROF_N:-16384}
failed=0

for dim in ${PROF_DIMS:-64 128}; do
  rec=/tmp/fa-rec-d$dim
  rm -rf "$rec"
  stamp "d$dim: record the planner's fa_bwd_dkdv"
  FLASHATTN_OPENCL_RECORD=$rec FLASHATTN_OPENCL_RECORD_KERNEL=fa_bwd_dkdv FLASHATTN_OPENCL_RECORD_MAX=1 \
    FLASHATTN_OPENCL_OPTIONS="${PROF_OPTIONS:-}" \
    "$build/fa-run" --backend opencl --dtype fp16 --dim "$dim" --seqlen "$n" --batch $(( 16384 / n )) \
    --heads $(( 2048 / dim )) --repeats 3 --no-check > "$prof/fa-run-d$dim.txt" 2>&1 || failed=1
  grep -iE "backward|plan" "$prof/fa-run-d$dim.txt" | head -6
  cp "$rec/launch-000/meta.txt" "$prof/meta-d$dim.txt" 2>/dev/null
  cp "$rec/launch-000/program.bin" "$prof/program-d$dim.ptx" 2>/dev/null
  stamp "d$dim: replay through the CUDA driver"
  "$build/fa-cl-replay" "$rec/launch-000" 5 1 2>&1 | tee "$prof/replay-d$dim.txt" || failed=1
  if [ -x "$ncu" ]; then
    stamp "d$dim: ncu on the replay"
    timeout 300 "$ncu" --set full --clock-control none --import-source no -f -o "/tmp/ncu-cl-d$dim" \
      -k regex:fa_bwd_dkdv --launch-count 1 "$build/fa-cl-replay" "$rec/launch-000" 1 0 \
      > "$prof/ncu-run-d$dim.txt" 2>&1 || failed=1
    "$ncu" -i "/tmp/ncu-cl-d$dim.ncu-rep" --page details > "$prof/ncu-cl-d$dim.txt" 2>&1
    "$ncu" -i "/tmp/ncu-cl-d$dim.ncu-rep" --page source --print-source sass --csv > "$prof/sass-cl-d$dim.csv" 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Shared Memory|Bank" \
      "$prof/ncu-cl-d$dim.txt" | head -40
  fi
  rm -rf "$rec"
done

if [ "${PROF_PEER:-1}" = 1 ] && [ -x "$ncu" ]; then
  stamp "FlashAttention-2's backward (SDPA FLASH_ATTENTION), d128, under ncu"
  cat > /tmp/fa2_bwd_once.py <<EOF
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
n, d = $n, 128
b, h = 16384 // n, 2048 // d
q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()
EOF
  timeout 300 "$ncu" --set full --clock-control none -f -o /tmp/ncu-fa2-bwd -k regex:dq_dk_dv \
    --launch-count 1 python3 /tmp/fa2_bwd_once.py > "$prof/ncu-run-fa2.txt" 2>&1 || echo "ncu FA2: exit $?"
  "$ncu" -i /tmp/ncu-fa2-bwd.ncu-rep --page details > "$prof/ncu-fa2-d128.txt" 2>&1
  "$ncu" -i /tmp/ncu-fa2-bwd.ncu-rep --page source --print-source sass --csv > "$prof/sass-fa2-d128.csv" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Shared Memory Configuration|Block Size|Grid Size" \
    "$prof/ncu-fa2-d128.txt" | head -20
fi

if [ "${PROF_SWEEP:-1}" = 1 ]; then
  stamp "the backward sweep"
  OUT="$prof" FA_SWEEP_SEQLENS=$n FA_SWEEP_PASS=${PROF_SWEEP_PASS-bwd} FA_SWEEP_CHECK=${PROF_SWEEP_CHECK:-1} bash bench/opencl_mma_gpu.sh sweep \
    > "$prof/sweep-run.txt" 2>&1 || failed=1
  tail -40 "$prof/sweep-run.txt"
fi
rm -rf "$prof/cl-cache-sweep" "$prof/sweep-logs"
tar -czf "$out/opencl-bwd-profile.tgz" -C "$out" prof && rm -rf "$prof"
stamp "done (failed=$failed)"
exit $failed
