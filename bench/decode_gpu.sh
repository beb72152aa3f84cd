#!/usr/bin/env bash
# On an NVIDIA GPU machine, in one call (under 7 minutes with the build):
# the CUDA decoding kernel's device tests (tests/test_cuda_attention.c,
# decode_*: packed GQA rows against the fp64 reference), then the decoding
# table (bf16, d128, 32 query heads on 4 KV heads, seqlen_q 1, caches 4k to
# 128k, batch 1, 8, 64): fa-bench --decode (time, K/V bytes, GB/s, fraction
# of a device copy measured in the same run) beside PyTorch SDPA on the same
# contiguous cache (bench/decode_sdpa.py). Logs and the table to $OUT
# (default ./gpu-out): decode-tests.log, decode-ours.csv, decode-sdpa.csv,
# decode-table.md.
#
#   bench/decode_gpu.sh          tests, the table, the sanitizers
#   bench/decode_gpu.sh sweep    tests, the table for the planner's choice
#                                and again for each alternative the
#                                environment selects (FLASHATTN_DECODE_MERGE
#                                =kernel: the split merge as its own launch;
#                                FLASHATTN_CUDA_OPTIONS=-DKV_EVICT_FIRST: K
#                                and V loaded with L2 evict_first, after its
#                                device tests; decode-ours-<alt>.csv,
#                                decode-table-<alt>.md),
#                                then ncu's SpeedOfLight of one batch-1 step
#                                at 4k and 128k keys (decode-ncu-*.txt)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
mode=${1:-table}
case $mode in table|sweep) ;; *) echo "usage: $0 [table|sweep]" >&2; exit 2 ;; esac
fa_gpu_info
stamp "configure and build (CUDA only)"
fa_gpu_build build-gpu-decode "test_cuda_attention fa-bench" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON \
  -DFA_OPENCL=OFF -DFA_HIP=OFF || exit 1
failed=0

stamp "decoding device tests"
(cd build-gpu-decode && ctest -R 'cuda_attention\.decode_' -j8 --timeout 300 --output-on-failure) \
  > "$out/decode-tests.log" 2>&1 || failed=1
grep -E "tests passed|Failed|\*\*\*|CHECK failed" "$out/decode-tests.log" | head -40

batches=1,8,64
caches=4096,8192,16384,32768,65536,131072
shape=(--heads 32 --heads-kv 4 --dim 128 --dtype bf16)
stamp "fa-bench --decode"
rm -f "$out"/decode-ours*.csv "$out/decode-sdpa.csv"
timeout 150 build-gpu-decode/fa-bench --decode --backend cuda --batch "$batches" --cache "$caches" "${shape[@]}" \
  --repeats 20 --csv "$out/decode-ours.csv" 2>&1 | tee "$out/decode-ours.txt" || failed=1

stamp "PyTorch SDPA on the same caches"
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1; then
  timeout 150 python3 bench/decode_sdpa.py --batch "$batches" --cache "$caches" "${shape[@]}" --repeats 20 \
    --csv "$out/decode-sdpa.csv" 2>&1 | tee "$out/decode-sdpa.txt" || failed=1
else
  echo "no PyTorch with CUDA here: the SDPA column stays empty"
fi

python3 bench/decode_table.py "$out/decode-ours.csv" "$out/decode-sdpa.csv" | tee "$out/decode-table.md"

if [ "$mode" = sweep ]; then
  # Alternatives, each NAME=VALUE of the environment; the SDPA column is
  # the run above.
  alts=(FLASHATTN_DECODE_MERGE=kernel FLASHATTN_CUDA_OPTIONS=-DKV_EVICT_FIRST)
  stamp "decoding device tests with K/V evicted first from L2"
  (cd build-gpu-decode && FLASHATTN_CUDA_OPTIONS=-DKV_EVICT_FIRST ctest -R 'cuda_attention\.decode_(varlen|causal)' \
    -j8 --timeout 300 --output-on-failure) > "$out/decode-tests-evict.log" 2>&1 || failed=1
  grep -E "tests passed|Failed|CHECK failed" "$out/decode-tests-evict.log" | head -10
  for alt in "${alts[@]}"; do
    tag=$(echo "${alt#*=}" | tr -cd 'A-Za-z0-9_')
    stamp "fa-bench --decode with $alt"
    env "$alt" timeout 100 build-gpu-decode/fa-bench --decode --backend cuda --batch "$batches" --cache "$caches" \
      "${shape[@]}" --repeats 20 --csv "$out/decode-ours-$tag.csv" > "$out/decode-ours-$tag.txt" 2>&1 || failed=1
    echo "### $alt"
    python3 bench/decode_table.py "$out/decode-ours-$tag.csv" "$out/decode-sdpa.csv" | tee "$out/decode-table-$tag.md"
  done
  ncu=/usr/local/cuda/bin/ncu
  if [ -x "$ncu" ]; then
    for cache in 4096 131072; do
      stamp "ncu SpeedOfLight, batch 1, $cache keys"
      timeout 60 "$ncu" --section SpeedOfLight -k 'regex:fa_fwd_decode|fa_splitk_merge' -c 2 \
        build-gpu-decode/fa-bench --decode --backend cuda --batch 1 --cache "$cache" "${shape[@]}" --repeats 1 \
        > "$out/decode-ncu-$cache.txt" 2>&1
      echo "  exit $?"
      grep -E "fa_fwd_decode|fa_splitk_merge|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)" \
        "$out/decode-ncu-$cache.txt" | head -16
    done
  else
    echo "no $ncu here: no SpeedOfLight section"
  fi
fi

# With time left, compute-sanitizer's memcheck and racecheck (the stages'
# refills and the warps' merge share one shared-memory window) on the
# varlen case: small shapes, split and not.
san=/usr/local/cuda/bin/compute-sanitizer
if [ -x "$san" ] && [ $(( $(date +%s) - t_start )) -lt 330 ]; then
  for tool in memcheck racecheck; do
    stamp "compute-sanitizer $tool"
    timeout 60 "$san" --tool "$tool" --error-exitcode 3 build-gpu-decode/test_cuda_attention decode_varlen \
      > "$out/decode-$tool.log" 2>&1
    rc=$?
    echo "  $tool: exit $rc (0 clean, 3 errors reported, 124 out of time)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/decode-$tool.log" | head -3
    [ $rc -eq 3 ] && failed=1
  done
fi
stamp "done (exit $failed)"
exit $failed
