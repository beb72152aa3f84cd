#!/usr/bin/env bash
# On an NVIDIA GPU machine, in one call (under 8 minutes on an H100 with the
# build): the KV-cache step (fa_forward_kvcache) and decoding speed.
#   1. build into build-gpu: CUDA, NVIDIA's OpenCL (through the ICD loader)
#      and HIP through the mapping where .deps/hip holds its headers, so
#      that the device-generic test runs every backend the machine has;
#   2. device tests: test_kvcache (every backend against the fp64
#      reference's KV-cache step), test_cuda_kvcache (the CUDA kernel's own
#      cases: pages straddling tiles, NaN for bad lengths and pages, the
#      cache after each step) and test_cuda_attention's decoding cases;
#   3. compute-sanitizer: memcheck on the invalid-data and row-tile cases,
#      racecheck on repeated steps (the page ring and the merge share
#      shared memory);
#   4. the decoding table: fa-bench --decode (bf16, d128, 32 query heads on
#      4 KV heads, one query token, caches 4k to 128k, batch 1, 8, 64):
#      fa_forward on the contiguous cache, and where fa-bench has the flags
#      the KV-cache step (fa_forward_kvcache) on the contiguous cache
#      (--kvcache), on 64- and 256-token pages (--page-size) and with one
#      appended token a step (--append 1, 64-token pages, three cache
#      lengths), beside PyTorch SDPA on the same contiguous cache; each
#      row's K/V bytes over its time as a fraction of a device copy's
#      bandwidth measured in the same run, and the issue's bar (0.80 from
#      16k keys, faster than SDPA) checked per row;
#   5. with time left, ncu's SpeedOfLight of one batch-1 step at 4k and
#      128k keys (the fixed cost per step).
# Outputs in $OUT (default ./gpu-out): kvcache-tests.log,
# kvcache-{memcheck,racecheck}-*.log, kvcache-ours-*.csv,
# kvcache-sdpa.csv, kvcache-table.md, kvcache-ncu-*.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
failed=0

fa_gpu_info
fa_nvidia_opencl
fa_hip_nvidia_args
targets="test_cuda_kvcache test_cuda_attention fa-bench"
have_generic=0
if [ -e tests/test_kvcache.c ]; then
  targets="test_kvcache $targets"
  have_generic=1
fi
stamp "configure and build ($targets)"
fa_gpu_build build-gpu "$targets" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=ON "${hip_args[@]}" || exit 1
[ $have_generic -eq 1 ] || echo "no tests/test_kvcache.c in this tree: only the CUDA tests run"

stamp "device tests"
(cd build-gpu && ctest -R '^(kvcache|cuda_kvcache)[.]|^cuda_attention[.]decode_' -j8 --timeout 200 \
  --output-on-failure) > "$out/kvcache-tests.log" 2>&1 || failed=1
grep -E "tests passed|Failed|[*]{3}|CHECK failed|Not Run" "$out/kvcache-tests.log" | head -40

# The sanitizers on the kernels the tests above compiled (their cache),
# while the time allows.
san=/usr/local/cuda/bin/compute-sanitizer
if [ -x "$san" ] && [ $(( $(date +%s) - t_start )) -lt 240 ]; then
  for spec in "memcheck invalid_data" "memcheck row_tiles" "racecheck repeated_steps"; do
    read -r tool case <<< "$spec"
    stamp "compute-sanitizer $tool, test_cuda_kvcache $case"
    FLASHATTN_CACHE_DIR=$PWD/build-gpu/kernel-cache-device timeout 90 "$san" --tool "$tool" --error-exitcode 3 \
      build-gpu/test_cuda_kvcache "$case" > "$out/kvcache-$tool-$case.log" 2>&1
    rc=$?
    echo "  exit $rc (0 clean, 3 errors reported, 124 out of time)"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$out/kvcache-$tool-$case.log" | head -3
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && failed=1
  done
else
  echo "no sanitizer runs (no $san here, or past 240 s)"
fi

# The decoding table. Which of fa-bench's cache flags exist is asked of
# fa-bench itself (a one-point run), so the script works on trees with or
# without them.
batches=1,8,64
caches=4096,8192,16384,32768,65536,131072
shape=(--heads 32 --heads-kv 4 --dim 128 --dtype bf16)
bench=build-gpu/fa-bench
has_flag() {
  timeout 60 "$bench" --decode --backend cuda --batch 1 --cache 4096 "${shape[@]}" --repeats 1 "$@" \
    > /dev/null 2>&1
}
# label=caches=flags: fa_forward first (the plain decoding path), then the
# cache step's layouts.
runs=("forward=$caches=")
if has_flag --kvcache; then
  runs+=("cache=$caches=--kvcache")
  has_flag --page-size 64 && runs+=("pages64=$caches=--page-size 64" "pages256=$caches=--page-size 256")
  has_flag --page-size 64 --append 1 && runs+=("pages64+append1=4096,16384,131072=--page-size 64 --append 1")
else
  echo "fa-bench --decode has no --kvcache here: fa_forward rows only"
fi
rm -f "$out"/kvcache-ours-*.csv "$out/kvcache-sdpa.csv"
table_args=()
for run in "${runs[@]}"; do
  tag=${run%%=*}
  rest=${run#*=}
  run_caches=${rest%%=*}
  read -r -a extra <<< "${rest#*=}"
  stamp "fa-bench --decode ($tag)"
  timeout 120 "$bench" --decode --backend cuda --batch "$batches" --cache "$run_caches" "${shape[@]}" --repeats 20 \
    "${extra[@]}" --csv "$out/kvcache-ours-$tag.csv" > "$out/kvcache-ours-$tag.txt" 2>&1 || failed=1
  tail -n +2 "$out/kvcache-ours-$tag.txt" | head -20
  table_args+=("$tag=$out/kvcache-ours-$tag.csv")
done

stamp "PyTorch SDPA on the same contiguous caches"
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1; then
  timeout 150 python3 bench/decode_sdpa.py --batch "$batches" --cache "$caches" "${shape[@]}" --repeats 20 \
    --csv "$out/kvcache-sdpa.csv" > "$out/kvcache-sdpa.txt" 2>&1 || failed=1
else
  echo "no PyTorch with CUDA here: the SDPA column stays empty"
fi
python3 bench/kvcache_table.py --sdpa "$out/kvcache-sdpa.csv" "${table_args[@]}" | tee "$out/kvcache-table.md"

# With time left: ncu of one batch-1 step (contiguous), the fixed cost.
ncu=/usr/local/cuda/bin/ncu
if [ -x "$ncu" ] && [ $(( $(date +%s) - t_start )) -lt 400 ]; then
  for cache in 4096 131072; do
    stamp "ncu SpeedOfLight, batch 1, $cache keys"
    timeout 45 "$ncu" --section SpeedOfLight -k 'regex:fa_fwd_decode' -c 1 \
      "$bench" --decode --backend cuda --batch 1 --cache "$cache" "${shape[@]}" --repeats 1 \
      > "$out/kvcache-ncu-$cache.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput" "$out/kvcache-ncu-$cache.txt" | head -4
  done
fi
stamp "done (exit $failed)"
exit $failed
