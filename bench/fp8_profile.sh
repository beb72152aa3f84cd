#!/usr/bin/env bash
# On an H100 or H200, from the repository root: the sm_90 forward
# (fa_fwd_tma) under Nsight Compute, fp8 and bf16 at head_dim 128, N 8192
# (16k tokens; PROFILE_SEQLENS="4096 16384" for others, each its own
# launch): the tensor pipe's active share, the XU pipe (exponentials and
# conversions), the shared-memory pipe and its bank conflicts, issue
# activity, and the SMs' active cycles against the elapsed ones with the
# waves of blocks (what a launch loses between and after its blocks, to
# compare across N). One launch each, after fa-bench's warm-ups. Outputs in
# $OUT (default ./gpu-out): ncu-LABEL-nN.txt; the metrics on stdout.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_gpu_build_cuda "fa-bench" || exit 1
ncu=/usr/local/cuda/bin/ncu
command -v ncu > /dev/null && ncu=$(command -v ncu)
# The tensor pipe's busy share under the names this ncu (2025.x) lists
# (sm__pipe_tensor_op_gmma_cycles_active is not among them), its warpgroup
# instructions and their shared-memory wavefronts and bank conflicts.
metrics=sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__pipe_tensor_op_hmma_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__inst_executed_pipe_tensor_op_gmma.sum
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_gmma.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_gmma.sum
metrics+=,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_xu.sum
metrics+=,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
metrics+=,gpu__time_duration.sum
metrics+=,sm__cycles_active.avg,sm__cycles_elapsed.avg,launch__waves_per_multiprocessor
failed=0
# PROFILE_RUNS: "label:dtype:options" (options: FLASHATTN_CUDA_OPTIONS,
# commas for spaces); default the plain fp8 and bf16 builds.
for n in ${PROFILE_SEQLENS:-8192}; do
  for run in ${PROFILE_RUNS:-fp8:fp8: bf16:bf16:}; do
    IFS=: read -r label dt opts <<< "$run"
    FLASHATTN_CUDA_OPTIONS="${opts//,/ }" timeout 240 "$ncu" --clock-control none --kernel-name fa_fwd_tma \
      --launch-skip 3 --launch-count 1 --metrics "$metrics" \
      build-gpu/fa-bench --backend cuda --dtype "$dt" --dim 128 --seqlens "$n" --tokens 16384 --hidden 2048 \
      --pass fwd --repeats 2 --warmup 2 > "$out/ncu-$label-n$n.txt" 2>&1 || failed=1
    echo "== $label ($dt${opts:+, $opts}), N $n"
    grep -E "^ +(sm|smsp|l1tex|gpu|launch)__" "$out/ncu-$label-n$n.txt"
  done
done
exit $failed
