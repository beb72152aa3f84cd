#!/usr/bin/env bash
# On an NVIDIA GPU machine, after a build into build-gpu: Nsight Compute's
# full section set for one forward and one key-side backward kernel of the
# CUDA backend's plan (16k tokens, hidden 2048), to see what holds the
# tensor-core kernels back (stall reasons, pipe use, shared-memory bank
# conflicts, occupancy), and the same sections for PyTorch's
# FlashAttention-2 kernels on the same shape (when PyTorch is there), so the
# two can be read side by side. Per-instruction counters (SASS, with stall
# samples and excess shared-memory wavefronts) go to a CSV per kernel. Also
# keeps the compile logs of the kernels that ran.
# Usage: bench/cuda_profile.sh [DIM [SEQLEN [DTYPE]]]; output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-$PWD/gpu-out}
dim=${1:-128}
n=${2:-4096}
dtype=${3:-fp16}
mkdir -p "$out/logs"
ncu=/usr/local/cuda/bin/ncu
command -v ncu > /dev/null && ncu=$(command -v ncu)
tag=$dtype-d$dim-n$n
# One launch of each kernel, each pass run on its own (a backward bench
# also runs forwards, which a shared launch count would catch instead).
for k in fwd:fa_fwd_mma bwd:fa_bwd_dkdv_mma; do
  pass=${k%%:*} kern=${k#*:}
  rep=/tmp/ncu-ours-$tag-$pass
  FLASHATTN_CACHE_DIR=off FLASHATTN_CUDA_LOG_DIR="$out/logs" \
    "$ncu" --set full --clock-control none --import-source yes -f -o "$rep" --kernel-name "$kern" --launch-count 1 \
    build-gpu/fa-bench --backend cuda --dtype "$dtype" --dim "$dim" --seqlens "$n" --pass "$pass" --repeats 1 --warmup 0 \
    > "$out/ncu-run-$tag-$pass.txt" 2>&1
  echo "ncu $kern: exit $?"
  "$ncu" -i "$rep.ncu-rep" --page details >> "$out/ncu-$tag.txt" 2>&1
  "$ncu" -i "$rep.ncu-rep" --page source --print-source sass --csv > "$out/sass-$kern-$tag.csv" 2>&1
done

# PyTorch's FlashAttention-2 on the same shape.
if python3 -c 'import torch' 2> /dev/null; then
  cat > /tmp/fa_peer_once.py <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
dt = {"fp16": torch.float16, "bf16": torch.bfloat16}["$dtype"]
n, d = $n, $dim
b, h = 16384 // n, 2048 // d
q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = F.scaled_dot_product_attention(q, k, v)
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
  "$ncu" --set full --clock-control none -f -o "/tmp/ncu-peer-$tag" --kernel-name regex:'flash_fwd_kernel|flash_bwd_dq_dk_dv' --launch-count 2 \
    python3 /tmp/fa_peer_once.py > "$out/ncu-peer-run-$tag.txt" 2>&1
  echo "ncu peer: exit $?"
  "$ncu" -i "/tmp/ncu-peer-$tag.ncu-rep" --page details > "$out/ncu-peer-$tag.txt" 2>&1
  for k in flash_fwd_kernel flash_bwd_dq_dk_dv; do
    "$ncu" -i "/tmp/ncu-peer-$tag.ncu-rep" --kernel-name regex:"$k" --page source --print-source sass --csv \
      > "$out/sass-peer-$k-$tag.csv" 2>&1
  done
fi
# The lines that say most, per kernel.
for f in "$out/ncu-$tag.txt" "$out/ncu-peer-$tag.txt"; do
  [ -e "$f" ] || continue
  grep -E "fa_fwd_mma|fa_bwd_dkdv_mma|flash_fwd|flash_bwd|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|Executed Instructions  |excessive wavefronts|Tensor is|stalled" "$f" | head -40
done
