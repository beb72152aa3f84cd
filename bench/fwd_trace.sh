#!/usr/bin/env bash
# On an H100 or H200, from the repository root: where a tile's time goes
# in the warp-specialised forward (kernels_cuda/fwd_tma.cu built with the
# diagnostic option FWD_TRACE). fa-run runs the forward at TRACE_DTYPES
# (default "fp8 bf16"), head_dim TRACE_DIM (128), N TRACE_N (4096), 16
# heads; block (0, 0, 0) prints the SM's clock at each phase of each key
# tile, for each consumer warpgroup and the first transposer warp
# (bench/fwd_trace.py reads them). Outputs in $OUT (default ./gpu-out):
# trace-DTYPE.txt and the table of bench/fwd_trace.py on stdout.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_gpu_build_cuda "fa-run" || exit 1
failed=0
for dt in ${TRACE_DTYPES:-fp8 bf16}; do
  # shellcheck disable=SC2086  # TRACE_OPTIONS: more NVRTC options, split
  FLASHATTN_CUDA_OPTIONS="-DFWD_TRACE ${TRACE_OPTIONS:-}" timeout 120 build-gpu/fa-run --backend cuda --dtype "$dt" \
    --dim "${TRACE_DIM:-128}" --batch 1 --heads 16 --seqlen "${TRACE_N:-4096}" --repeats 1 > "$out/trace-$dt.txt" 2>&1
  rc=$?
  echo "$dt: rc $rc, $(grep -c fwd-trace "$out/trace-$dt.txt") trace lines"
  [ "$rc" = 0 ] || { grep -v fwd-trace "$out/trace-$dt.txt" | tail -5; failed=1; }
  python3 bench/fwd_trace.py "$out/trace-$dt.txt" || failed=1
done
exit $failed
