#!/usr/bin/env bash
# On an NVIDIA GPU machine, from the repository root: the OpenCL backward's
# time kernel by kernel (fa_bwd_dot, fa_bwd_dkdv, fa_bwd_dq_convert; from
# the queue's events, FLASHATTN_OPENCL_KERNEL_TIMES) beside
# FlashAttention-2's (PyTorch SDPA, torch.profiler: its dot, main and dQ
# conversion kernels), fp16, 16k tokens, hidden 2048, to see where a
# backward's fixed cost goes. Env: KT_DIMS (default "64 128"), KT_SEQLENS
# (default "2048 16384"), KT_CAUSAL (default "0 1"). Output:
# $OUT/bwd-kernels.txt (median ms per kernel and shape, ours and FA2's).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
build="build-gpu"
fa_gpu_build_opencl "fa-bench" || exit 1
res="$out/bwd-kernels.txt"
: > "$res"
for dim in ${KT_DIMS:-64 128}; do
  for n in ${KT_SEQLENS:-2048 16384}; do
    for causal in ${KT_CAUSAL:-0 1}; do
      mask=""; [ "$causal" = 1 ] && mask=--causal
      stamp "d$dim N$n causal $causal"
      # shellcheck disable=SC2086  # the mask flag's word
      FLASHATTN_OPENCL_KERNEL_TIMES=1 "$build/fa-bench" --backend opencl --dtype fp16 --dim "$dim" \
        --seqlens "$n" --pass bwd --repeats 7 --warmup 2 $mask > "$out/kt-run.txt" 2>&1 || echo "  fa-bench failed"
      python3 - "$dim" "$n" "$causal" "$out/kt-run.txt" >> "$res" <<'PY'
import re, statistics, sys
times = {}
for line in open(sys.argv[4]):
    m = re.match(r"opencl kernel (\w+) ([\d.]+) ms", line)
    if m:
        times.setdefault(m.group(1), []).append(float(m.group(2)))
# The warmup's events are not timed: every kernel's runs are the repeats.
row = "  ".join("%s %.4f" % (k, statistics.median(v)) for k, v in times.items())
print("ours d%s N%s causal %s: %s  sum %.4f" % (sys.argv[1], sys.argv[2], sys.argv[3], row,
      sum(statistics.median(v) for v in times.values())))
PY
      python3 - "$dim" "$n" "$causal" >> "$res" 2>> "$out/kt-peer.log" <<'PY'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile, ProfilerActivity
d, n, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
b, h = 16384 // n, 2048 // d
q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    g = torch.randn_like(o)
    for _ in range(2):
        torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
    torch.cuda.synchronize()
    reps = 7
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
        torch.cuda.synchronize()
per = {}
for e in prof.key_averages():
    if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "self_device_time_total", 0) > 0:
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t > 0:
            per[e.key[:60]] = t / reps / 1000.0
row = "  ".join("%s %.4f" % (k, t) for k, t in sorted(per.items(), key=lambda x: -x[1]))
print("FA2  d%d N%d causal %d: %s  sum %.4f" % (d, n, causal, row, sum(per.values())))
PY
    done
  done
done
cat "$res"
stamp "done"
