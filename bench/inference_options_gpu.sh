#!/usr/bin/env bash
# On an NVIDIA GPU machine, in one call of about 8 minutes with the build:
# the score options (softcap, ALiBi, additive bias) and the KV-cache step on
# every backend the machine runs, against the fp64 reference, then the
# decoding table. One build serves every step:
#   build     CUDA, NVIDIA's OpenCL and HIP through the mapping (where
#             .deps/hip holds its headers) into build-gpu
#   tests     side by side, each with a time limit: the score-option cases
#             of cuda_attention (the suite's and every kernel family's,
#             forced), hip_attention (the suite's and forced SIMT and
#             matrix-core tiles), opencl_attention and opencl_mma (NVIDIA's
#             OpenCL, the matrix units); test_kvcache on every device and
#             CUDA's own KV-cache cases; compute-sanitizer memcheck on the
#             CUDA option and KV-cache cases
#   decode    fa-bench --decode, bf16, head_dim 128, 32 query heads on 4 KV
#             heads, batch 1 and 8, caches 16k and 64k: fa_forward on the
#             contiguous cache and the KV-cache step on 64- and 256-token
#             pages, beside PyTorch SDPA on the same contiguous cache
#             (bench/decode_sdpa.py), as fractions of a device copy's
#             bandwidth measured in the same run
# Outputs in $OUT (default ./gpu-out). Usage: bench/inference_options_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
failed=0

fa_gpu_info
fa_nvidia_opencl
fa_hip_nvidia_args
targets="test_cuda_attention test_opencl_attention test_opencl_mma test_kvcache fa-bench fa-info"
[ -e tests/test_cuda_kvcache.c ] && targets="$targets test_cuda_kvcache"
[ "${hip_args[0]}" = "-DFA_HIP=AUTO" ] && targets="$targets test_hip_attention"
stamp "configure and build ($targets)"
fa_gpu_build build-gpu "$targets" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=ON "${hip_args[@]}" || exit 1

stamp "tests, side by side"
tests='^cuda_attention[.](score_options.*|decoding_splitk|decode_.*)$'
tests+='|^hip_attention[.](score_option.*)$'
tests+='|^opencl_attention[.]score_options.*$|^opencl_mma[.]score_options$'
tests+='|^kvcache[.].*$|^cuda_kvcache[.].*$'
san=/usr/local/cuda/bin/compute-sanitizer
bg=()
if [ -x "$san" ]; then
  for c in score_options_mma score_options_wgmma; do
    FLASHATTN_CACHE_DIR=/tmp/fa-san-cache timeout 220 "$san" --tool memcheck --error-exitcode 3 \
      build-gpu/test_cuda_attention "$c" > "$out/memcheck-cuda-$c.log" 2>&1 &
    bg+=("$!:memcheck cuda_attention $c")
  done
  if [ -e build-gpu/test_cuda_kvcache ]; then
    FLASHATTN_CACHE_DIR=/tmp/fa-san-cache timeout 220 "$san" --tool memcheck --error-exitcode 3 \
      build-gpu/test_cuda_kvcache > "$out/memcheck-cuda-kvcache.log" 2>&1 &
    bg+=("$!:memcheck cuda_kvcache")
  fi
fi
(cd build-gpu && ctest -R "$tests" -j12 --timeout 230 --output-on-failure) > "$out/tests.log" 2>&1 || failed=1
grep -E "tests passed|[*]{3}|CHECK failed|Not Run|Skipped" "$out/tests.log" | head -60
grep -E "refused|running on" "$out/tests.log" | sort | uniq -c | head -20
for entry in "${bg[@]}"; do
  pid=${entry%%:*}
  wait "$pid"
  rc=$?
  echo "${entry#*:}: exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out)')"
  [ "$rc" -eq 0 ] || failed=1
done
grep -h "ERROR SUMMARY" "$out"/memcheck-*.log 2>/dev/null

stamp "decoding table"
common=(--backend cuda --decode --dtype bf16 --dim 128 --heads 32 --heads-kv 4 --batch 1,8 --cache 16384,65536)
timeout 35 build-gpu/fa-bench "${common[@]}" --csv "$out/decode-contiguous.csv" > "$out/decode-contiguous.txt" 2>&1
for page in 64 256; do
  timeout 35 build-gpu/fa-bench "${common[@]}" --kvcache --page-size "$page" --csv "$out/decode-paged-$page.csv" \
    > "$out/decode-paged-$page.txt" 2>&1
done
timeout 35 build-gpu/fa-bench "${common[@]}" --kvcache --page-size 64 --append 1 --rotary 128 \
  --csv "$out/decode-append.csv" > "$out/decode-append.txt" 2>&1
tail -n 8 "$out"/decode-*.txt
if python3 -c "import torch" 2> /dev/null; then
  timeout 60 python3 bench/decode_sdpa.py --batch 1,8 --cache 16384,65536 --csv "$out/decode-sdpa.csv" \
    > "$out/decode-sdpa.txt" 2>&1
  tail -n 8 "$out/decode-sdpa.txt"
fi
stamp "done (failed=$failed)"
exit $failed
