#!/usr/bin/env bash
# On an H100 or H200, from the repository root: the warp-specialised
# forward (kernels_cuda/fwd_tma.cu, plan variant wgmma_tma). Steps:
#   smoke    fa-run against the CPU reference on small shapes, every option
#            the kernel takes, each under a time limit (a lost barrier
#            phase hangs rather than fails)
#   tests    the CUDA attention suite (every case plans it where it applies;
#            tma_shapes forces each shape it takes)
#   suite    every target built, then the CUDA device tests beyond the
#            attention suite that run the forward (differential against the
#            fp64 reference with NaN, infinities and extreme windows; dropout
#            seeds; caller streams; KV cache); TMA_SUITE replaces the regex
#   bwd      the warp-specialised backward (as planned on sm_90): a
#            smoke run, the suite's backward cases, and its TFLOP/s beside
#            the warpgroup backward and SDPA's cuDNN and FlashAttention-2
#   bwdtime  that step's timing alone
#   gates    the backward's TFLOP/s at TMA_DIMS under each planner switch of
#            TMA_GATES ("label=VAR=value,VAR=value ...", "label=" for none), causal
#            and not, SDPA's cuDNN and FlashAttention-2 beside (a switch
#            that plans an experimental kernel times it against the default)
#   sanitize compute-sanitizer memcheck and racecheck on small shapes
#   bwdtiles bench/fa-tma-tiles --pass bwd: the TMA backward's forced tiles
#            (TMA_BWD_TILES, default 64x128/2,128x128/2,64x64/2) beside
#            the planned one, TMA_DIMS and
#            TMA_DTYPES
#   tiles    bench/fa-tma-tiles: forced tile shapes beside the planned one,
#            with the planned product schedule and with TMA_SCHEDULES'
#   bench    the forward's TFLOP/s as planned, with each product schedule
#            of TMA_SCHEDULES (FLASHATTN_TMA_SCHEDULE) and with the
#            warpgroup kernel it replaces (FLASHATTN_PLAN_TMA=0), beside
#            PyTorch SDPA's cuDNN and FlashAttention-2 backends in the
#            same run
# Head dims between whole 64-column blocks in TMA_DIMS (96, 160, 224) time
# the padded warp-specialised forward as planned beside mma.sync
# (FLASHATTN_PLAN_TMA_PAD=0).
# Outputs in $OUT (default ./gpu-out). Environment: TMA_STEPS (default
# "smoke tests bench"), TMA_DIMS (64 128), TMA_SEQLENS (2048,8192,16384),
# TMA_SCHEDULES (none), TMA_DTYPES (fp16), TMA_TILES (fa-tma-tiles'
# default), TMA_SMOKE_DIMS (64 128), TMA_TESTS (the ctest regex of the
# tests step, default ^cuda_attention[.]).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
steps=${TMA_STEPS:-smoke tests bench}
want() { [[ " $steps " == *" $1 "* ]]; }
read -r -a dims <<< "${TMA_DIMS:-64 128}"
read -r -a schedules <<< "${TMA_SCHEDULES:-}"
read -r -a dtypes <<< "${TMA_DTYPES:-fp16}"
seqlens=${TMA_SEQLENS:-2048,8192,16384}
export FLASHATTN_CACHE_DIR=/tmp/fa-kcache

fa_gpu_info
# TMA_NO_BUILD=1: build-gpu as a run of this script built it (two runs at
# once, one building first).
if [ "${TMA_NO_BUILD:-0}" != 1 ]; then
  stamp "configure and build"
  fa_gpu_build build-gpu "test_cuda_attention fa-bench fa-run fa-info fa-tma-tiles" -DCMAKE_BUILD_TYPE=Release \
    -DFA_CUDA=ON -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF -DFA_OPENCL=OFF || exit 1
fi
failed=0

# bwd_sweep JSON LABEL DTYPE DIM CAUSAL LOG [VAR=value ...]: one backward
# sweep of fa-bench over $seqlens (16k tokens, hidden 2048) with the
# variables set, JSON lines appended to JSON, its output to LOG.
bwd_sweep() {
  local json=$1 label=$2 dt=$3 dim=$4 causal=$5 log=$6 flag=()
  shift 6
  [ "$causal" = 1 ] && flag=(--causal)
  env "$@" timeout 150 build-gpu/fa-bench --backend cuda --dtype "$dt" --dim "$dim" "${flag[@]}" --seqlens "$seqlens" \
    --tokens 16384 --hidden 2048 --pass bwd --repeats 10 --warmup 2 --json "$json" --label "$label" >> "$log" 2>&1 ||
    echo "  bench $label $dt d$dim c$causal failed"
}

# bwd_peer JSON DIMS_CSV LOG: PyTorch SDPA's cuDNN and FlashAttention-2
# backward on the same shapes, where PyTorch sees the GPU.
bwd_peer() {
  python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1 || return 0
  local dtypes_csv
  dtypes_csv=$(IFS=,; echo "${dtypes[*]}")
  python3 bench/sdpa_peer.py --dtypes "$dtypes_csv" --dims "$2" --seqlens "$seqlens" --causal 0,1 \
    --tokens 16384 --hidden 2048 --backends cudnn,flash --repeats 10 --warmup 2 \
    --json "$1" --label sdpa > "$3" 2>&1 || echo "  sdpa_peer.py failed"
}

if want smoke; then
  stamp "smoke: fa-run against the reference (in parallel)"
  run() { fa_smoke_run "$@"; }
  for dim in ${TMA_SMOKE_DIMS:-64 128}; do
    run --dtype fp16 --dim "$dim" --batch 2 --heads 4 --seqlen 512
    run --dtype bf16 --dim "$dim" --batch 1 --heads 2 --seqlen 1000 --causal
    run --dtype fp16 --dim "$dim" --batch 2 --heads 8 --heads-kv 2 --seqlen-q 300 --seqlen-k 777
    run --dtype fp16 --dim "$dim" --batch 1 --heads 4 --seqlen 1024 --window 100,50
    run --dtype fp16 --dim "$dim" --batch 1 --heads 4 --seqlen 1024 --block-sparse 128,0.5
    run --dtype fp16 --dim "$dim" --batch 1 --heads 4 --seqlen 640 --dropout 0.2 --seed 7
    run --dtype bf16 --dim "$dim" --batch 1 --heads 4 --seqlen 700 --softcap 30 --alibi
    run --dtype bf16 --dim "$dim" --batch 2 --heads 2 --seqlen 333 --bias fp32 --causal
    run --dtype fp16 --dim "$dim" --batch 1 --heads 2 --seqlen-q 4096 --seqlen-k 64 --causal
  done
  for sched in overlap pingpong plain; do
    FLASHATTN_TMA_SCHEDULE=$sched run --dtype fp16 --dim 128 --batch 1 --heads 2 --seqlen 1000 --causal
  done
  fa_smoke_report || failed=1
fi

if want tests; then
  stamp "tests: the CUDA attention suite (ctest cuda_attention.*)"
  ctest --test-dir build-gpu -R "${TMA_TESTS:-^cuda_attention[.]}" -j8 --timeout "${TMA_TEST_TIMEOUT:-400}" --output-on-failure > "$out/tests.txt" 2>&1
  echo "  rc $?: $(grep -E "tests passed" "$out/tests.txt")"
  grep -E "Failed|Timeout|\*\*\*" "$out/tests.txt" | head -20
fi

if want suite; then
  stamp "suite: every test and tool built; the CUDA device tests that run the forward"
  cmake --build build-gpu -j"$(nproc)" > "$out/build-all.log" 2>&1 || { grep -E "error" "$out/build-all.log" | head; }
  ctest --test-dir build-gpu -R "${TMA_SUITE:-^(differential|differential_mma_nvidia)[.]cuda|^dropout_seed[.].*cuda|^native_queue[.]cuda|^cuda_kvcache|^dist_device[.]cuda|^cuda_attention[.]score_options}" \
    -j8 --timeout 500 --output-on-failure > "$out/suite.txt" 2>&1
  echo "  rc $?: $(grep -E "tests passed" "$out/suite.txt")"
  grep -E "CHECK failed|Failed|Timeout" "$out/suite.txt" | head -20
fi

if want bwd; then
  # The warp-specialised backward (bwd_mma.cu built with TMA), as planned
  # on sm_90 (FLASHATTN_PLAN_TMA_BWD=1 below only says so): the suite's cases against the reference
  # (tma_backward_shapes forces its tiles), the sanitizers on those, then
  # its time beside the warpgroup backward and SDPA's, with each schedule
  # of TMA_BWD_VARIANTS (label=plan_tma:NVRTC options; the kernel's
  # defaults are the split step, dQ in turns, bulk reductions above
  # head_dim 64).
  stamp "bwd: forced shapes (a lost barrier phase hangs: a short limit)"
  FLASHATTN_PLAN_TMA_BWD=1 timeout 90 build-gpu/test_cuda_attention tma_backward_shapes > "$out/bwd-shapes.txt" 2>&1
  rc=$?
  echo "  rc $rc: $(tail -1 "$out/bwd-shapes.txt")"
  grep -E "CHECK failed" "$out/bwd-shapes.txt" | head -5
  bwd_failed=0
  if [ "$rc" != 0 ] && [ "${TMA_BWD_GO_ON:-0}" != 1 ]; then
    echo "  the forced shapes failed: no timing"
    bwd_failed=1
  fi
fi
if want bwd && [ "${bwd_failed:-0}" = 0 ]; then
  stamp "bwd: the suite's backward cases"
  FLASHATTN_PLAN_TMA_BWD=1 timeout 120 build-gpu/fa-run --backend cuda --repeats 3 --dtype bf16 --dim 128 --batch 2 \
    --heads 8 --seqlen 1000 --causal > "$out/bwd-smoke.txt" 2>&1
  echo "  smoke rc $?: $(grep -m1 -o "backward: [a-z_]*, tile [0-9]* x [0-9]*" "$out/bwd-smoke.txt") $(grep -E "^  d[QKV] " "$out/bwd-smoke.txt" | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
  FLASHATTN_PLAN_TMA_BWD=1 ctest --test-dir build-gpu \
    -R "${TMA_BWD_TESTS:-^cuda_attention[.](dtypes|head_dims|causal|sliding_window|block_sparse|dropout|gqa_mqa|lengths|strides_offsets|deterministic_backward|score_options|mma_dtypes|mma_masks|mma_dropout|score_options_wgmma)$}" \
    -j8 --timeout 200 --output-on-failure > "$out/bwd-tests.txt" 2>&1
  echo "  rc $?: $(grep -E "tests passed" "$out/bwd-tests.txt")"
  grep -E "CHECK failed|Failed|Timeout" "$out/bwd-tests.txt" | head -20
  # TMA_BWD_SANITIZE: 1 (default) the probe and both tools on the forced
  # shapes, probe the probe alone (seconds, where the tools take minutes), 0 none.
  sanitize=${TMA_BWD_SANITIZE:-1}
  if command -v compute-sanitizer > /dev/null && [ "$sanitize" != 0 ]; then
    # Whether racecheck orders accesses by an mbarrier's phase at all
    # (bench/probes/mbarrier_racecheck.cu): "ordered" is correct code.
    if command -v nvcc > /dev/null && nvcc -arch=sm_90 -o /tmp/mbar-probe bench/probes/mbarrier_racecheck.cu > /dev/null 2>&1; then
      for mode in ordered warp named arrive racy; do
        compute-sanitizer --tool racecheck /tmp/mbar-probe "$mode" > "$out/probe-$mode.txt" 2>&1
        echo "  racecheck probe $mode: $(grep -E "RACECHECK SUMMARY|values" "$out/probe-$mode.txt" | tr '\n' ' ')"
      done
    fi
    [ "$sanitize" = probe ] || for opts in "" "-DBWD_DQ_RED"; do
      for tool in memcheck racecheck; do
        f="$out/bwd-sanitize-$tool${opts:+-red}.txt"
        FLASHATTN_CUDA_OPTIONS="$opts" timeout 240 compute-sanitizer --tool "$tool" build-gpu/test_cuda_attention \
          tma_backward_shapes > "$f" 2>&1
        echo "  $tool ${opts:-(default)} rc $?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" "$f" | tail -2 | tr '\n' ' ')"
      done
    done
  fi
fi
if { want bwd || want bwdtime; } && [ "${bwd_failed:-0}" = 0 ]; then
  json=$out/bwd.jsonl
  : > "$json"
  read -r -a variants <<< "${TMA_BWD_VARIANTS:-wgmma=0: base=1:-DBWD_WHOLE_STEP,-DBWD_DQ_SHARED split=1:-DBWD_DQ_SHARED turns=1:-DBWD_DQ_RED tma=1:}"
  for dt in "${dtypes[@]}"; do
    for dim in 64 128; do
      for causal in 0 1; do
        for v in "${variants[@]}"; do
          label=${v%%=*} rest=${v#*=}
          tma=${rest%%:*} opts=${rest#*:}
          bwd_sweep "$json" "$label" "$dt" "$dim" "$causal" "$out/bwd-bench.txt" FLASHATTN_PLAN_TMA_BWD="$tma" \
            FLASHATTN_CUDA_OPTIONS="${opts//,/ }"
        done
      done
    done
  done
  bwd_peer "$json" 64,128 "$out/bwd-peer.log"
  python3 bench/label_table.py "$json" --pass bwd
fi

if want gates; then
  json=$out/gates.jsonl
  : > "$json"
  read -r -a gates <<< "${TMA_GATES:-planned=}"
  for dt in "${dtypes[@]}"; do
    for dim in "${dims[@]}"; do
      for causal in 0 1; do
        for g in "${gates[@]}"; do
          label=${g%%=*} assign=${g#*=}
          stamp "gates $label $dt d$dim causal $causal"
          # shellcheck disable=SC2086 # one word a VAR=value
          bwd_sweep "$json" "$label" "$dt" "$dim" "$causal" "$out/gates-bench.txt" ${assign//,/ }
        done
      done
    done
  done
  bwd_peer "$json" "$(IFS=,; echo "${dims[*]}")" "$out/gates-peer.log"
  python3 bench/label_table.py "$json" --pass bwd
fi

# TMA_SANITIZE_DIMS (default 128) and TMA_SANITIZE_ARGS (fa-run's problem,
# default a small causal one: 64-key backward tiles; --batch 1 --heads 16
# --seqlen 1536 plans the 128-key ones) choose what the tools run.
if want sanitize && command -v compute-sanitizer > /dev/null; then
  read -r -a sanitize_args <<< "${TMA_SANITIZE_ARGS:---batch 1 --heads 2 --seqlen 300 --causal}"
  for dim in ${TMA_SANITIZE_DIMS:-128}; do
    for tool in ${TMA_SANITIZE_TOOLS:-memcheck racecheck}; do
      stamp "compute-sanitizer $tool d$dim"
      timeout 300 compute-sanitizer --tool "$tool" build-gpu/fa-run --backend cuda --repeats 1 --dtype fp16 \
        --dim "$dim" "${sanitize_args[@]}" > "$out/sanitize-$tool-d$dim.txt" 2>&1
      echo "  rc $?: $(grep -m1 -o "backward: [a-z_]*, tile [0-9]* x [0-9]*" "$out/sanitize-$tool-d$dim.txt"):" \
        "$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitize-$tool-d$dim.txt" | head -2)"
    done
  done
fi

if want bwdtiles; then
  dims_csv=$(IFS=,; echo "${dims[*]}")
  for dt in "${dtypes[@]}"; do
    stamp "backward tiles $dt"
    FLASHATTN_PLAN_TMA_BWD=1 timeout 300 build-gpu/fa-tma-tiles --pass bwd --dtype "$dt" --dims "$dims_csv" \
      --seqlens "$seqlens" ${TMA_BWD_TILES:+--tiles "$TMA_BWD_TILES"} 2>> "$out/bwdtiles.err" | tee -a "$out/bwdtiles.txt"
  done
fi

if want tiles; then
  for dt in "${dtypes[@]}"; do
    for sched in planned "${schedules[@]}"; do
      stamp "tiles $dt, schedule $sched"
      dims_csv=$(IFS=,; echo "${dims[*]}")
      ( [ "$sched" = planned ] || export FLASHATTN_TMA_SCHEDULE=$sched
        timeout 300 build-gpu/fa-tma-tiles --dtype "$dt" --dims "$dims_csv" --seqlens "$seqlens" \
          ${TMA_TILES:+--tiles "$TMA_TILES"} ) 2>> "$out/tiles.err" | tee -a "$out/tiles.txt"
    done
  done
fi

if want bench; then
  json=$out/tma.jsonl
  : > "$json"
  sweep() { fa_fwd_sweep "$json" "$1" "$2" "$3" "$4" "$seqlens" || failed=1; }
  for dt in "${dtypes[@]}"; do
    for dim in "${dims[@]}"; do
      for causal in 0 1; do
        stamp "bench $dt d$dim causal $causal"
        if [ $((dim % 64)) != 0 ]; then
          # Between whole blocks: the padded warp-specialised forward as
          # planned, and mma.sync (FLASHATTN_PLAN_TMA_PAD=0).
          sweep planned "$dt" "$dim" "$causal"
          FLASHATTN_PLAN_TMA_PAD=0 sweep mma "$dt" "$dim" "$causal"
          continue
        fi
        FLASHATTN_PLAN_TMA=0 sweep wgmma "$dt" "$dim" "$causal"
        sweep planned "$dt" "$dim" "$causal"
        for sched in "${schedules[@]}"; do FLASHATTN_TMA_SCHEDULE=$sched sweep "tma-$sched" "$dt" "$dim" "$causal"; done
      done
    done
  done
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1; then
    stamp "PyTorch SDPA cudnn, flash"
    dims_csv=$(IFS=,; echo "${dims[*]}")
    dtypes_csv=$(IFS=,; echo "${dtypes[*]}")
    python3 bench/sdpa_peer.py --dtypes "$dtypes_csv" --dims "$dims_csv" --seqlens "$seqlens" --causal 0,1 \
      --tokens 16384 --hidden 2048 --backends cudnn,flash --repeats 10 --warmup 2 \
      --json "$json" --label sdpa > "$out/peer.log" 2>&1 || { echo "  sdpa_peer.py failed"; tail -5 "$out/peer.log"; }
  fi
  python3 bench/label_table.py "$json" --pass fwd
fi
stamp "done"
exit $failed
