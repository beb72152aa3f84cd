#!/usr/bin/env bash
# On an NVIDIA GPU machine, in one call of about 6 minutes: the decoding
# steps of issue #19 timed over the issue's grid and profiled where they fall
# short. One CUDA + OpenCL build (build-gpu), then
#   table   fa-bench --decode (bf16, head_dim 128, 32 query heads on 4 KV
#           heads, one token) over batch DEC_BATCHES and caches DEC_CACHES:
#           fa_forward on the contiguous cache, the KV-cache step on the
#           contiguous cache and on 64- and 256-token pages; PyTorch SDPA on
#           the same contiguous cache (bench/decode_sdpa.py); NVIDIA's
#           OpenCL KV-cache step on 64-token pages beside them
#   ncu     Nsight Compute on the decoding kernel of DEC_PROFILE's points
#           (speed of light, memory, warp states, launch, occupancy), with
#           --clock-control none
# With DEC_BASE=DIR (a second source tree carried beside this one), the same
# table for that tree's build first, so that a change is compared on the
# same card in the same call. DEC_FLUSH="copy read" times every table (and
# SDPA) after each kind of cache flush (fa-bench --flush; a copy leaves the
# L2 dirty, a read clean); DEC_MODES picks the tables' steps (forward kv
# paged64 paged256); DEC_TRACE="1:16384 ..." (batch:cache) runs the
# DECODE_TRACE build there and keeps its per-block timestamps
# (trace-*.txt, summarised by bench/decode_trace.py).
# Outputs in $OUT (default ./gpu-out): decode-all.tgz (decode-*.csv, *.txt,
# ncu-*.txt and the logs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
batches=${DEC_BATCHES:-1,8,64}
caches=${DEC_CACHES:-4096,16384,65536,131072}
profile=${DEC_PROFILE:-"1:16384: 8:65536: 8:65536:64"}
failed=0

fa_gpu_info
fa_nvidia_opencl || true

flushes=${DEC_FLUSH:-copy}
modes=${DEC_MODES:-forward kv paged64 paged256}

# decode_table TAG BUILD: the table's rows from BUILD's fa-bench, after
# each flush of DEC_FLUSH (tags of flushes other than copy end in -FLUSH).
decode_table() {
  local tag=$1 bin=$2/fa-bench flush mode t extra
  for flush in $flushes; do
    t=$tag
    [ "$flush" = copy ] || t=$tag-$flush
    for mode in $modes; do
      case $mode in
        forward) extra=() ;;
        kv) extra=(--kvcache) ;;
        paged*) extra=(--kvcache --page-size "${mode#paged}") ;;
        *) echo "DEC_MODES: unknown mode $mode"; failed=1; continue ;;
      esac
      stamp "$t: $mode"
      timeout 120 "$bin" --backend cuda --decode --dtype bf16 --dim 128 --heads 32 --heads-kv 4 --batch "$batches" \
        --cache "$caches" --flush "$flush" "${extra[@]}" --csv "$out/decode-$t-$mode.csv" \
        > "$out/decode-$t-$mode.txt" 2>&1 || failed=1
    done
  done
}

if [ -n "${DEC_BASE:-}" ]; then
  stamp "configure and build the base tree $DEC_BASE"
  (cd "$DEC_BASE" && OUT="$out/base" bash -c '. bench/gpu_env.sh; fa_gpu_build build-gpu "fa-bench" \
      -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=OFF -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF') || failed=1
  decode_table base "$DEC_BASE/build-gpu"
fi

stamp "configure and build"
# HIP through the mapping where .deps/hip holds Debian's headers: the
# KV-cache tests then run on its device too.
fa_hip_nvidia_args
targets="fa-bench fa-info test_kvcache test_cuda_kvcache test_cuda_attention"
[ "${hip_args[0]}" = "-DFA_HIP=AUTO" ] && targets="$targets test_hip_compile"
fa_gpu_build build-gpu "$targets" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_OPENCL=ON "${hip_args[@]}" || exit 1
# The decoding kernels' tests against the fp64 reference (every device for
# test_kvcache) first: the tables then time an idle GPU.
stamp "tests: ${DEC_TESTS:=^kvcache[.]|^cuda_kvcache[.]|^cuda_attention[.](decod.*|score_options_decode_shapes)$}"
(cd build-gpu && ctest -R "$DEC_TESTS" -j8 --timeout 200 --output-on-failure) > "$out/tests.log" 2>&1 || failed=1
grep -E "tests passed|[*]{3}|CHECK failed|Not Run|Skipped" "$out/tests.log" | head -30
decode_table new build-gpu

# DEC_VARIANTS: tuning macros (FLASHATTN_CUDA_OPTIONS) timed on the same
# build, contiguous and 64-token pages, e.g. "-DKV_SWIZZLE -DKV_EVICT_FIRST"
# (a comma joins macros into one variant: "-DKV_SWIZZLE,-DKV_NO_PREFETCH").
for opt in ${DEC_VARIANTS:-}; do
  tag=${opt//-D/}
  tag=${tag//,/+}
  opt=${opt//,/ }
  for mode in forward paged64; do
    extra=()
    [ "$mode" = paged64 ] && extra=(--kvcache --page-size 64)
    stamp "$tag: $mode"
    FLASHATTN_CUDA_OPTIONS="$opt" timeout 120 build-gpu/fa-bench --backend cuda --decode --dtype bf16 --dim 128 \
      --heads 32 --heads-kv 4 --batch "$batches" --cache "$caches" "${extra[@]}" \
      --csv "$out/decode-$tag-$mode.csv" > "$out/decode-$tag-$mode.txt" 2>&1 || failed=1
  done
done

# DEC_EXTRA: "layout" times one KV head of 8 query heads at 4x the batch
# (the same bytes as 32 on 4, each token's K and V row alone in its 256
# bytes instead of beside the other heads'); "merge" the separate merge
# launch (FLASHATTN_DECODE_MERGE=kernel) at batch 1.
case " ${DEC_EXTRA:-} " in *" layout "*)
  stamp "layout: 8 query heads on 1 KV head, batch x4"
  timeout 120 build-gpu/fa-bench --backend cuda --decode --dtype bf16 --dim 128 --heads 8 --heads-kv 1 \
    --batch 4,32,256 --cache "$caches" --csv "$out/decode-layout-hk1.csv" > "$out/decode-layout-hk1.txt" 2>&1 ;;
esac
case " ${DEC_EXTRA:-} " in *" merge "*)
  stamp "merge: a separate launch at batch 1"
  FLASHATTN_DECODE_MERGE=kernel timeout 120 build-gpu/fa-bench --backend cuda --decode --dtype bf16 --dim 128 \
    --heads 32 --heads-kv 4 --batch 1 --cache "$caches" --csv "$out/decode-merge-kernel.csv" \
    > "$out/decode-merge-kernel.txt" 2>&1 ;;
esac

stamp "NVIDIA's OpenCL KV-cache step, pages of 64"
timeout 120 build-gpu/fa-bench --backend opencl --decode --dtype bf16 --dim 128 --heads 32 --heads-kv 4 \
  --batch 1,8 --cache 16384,65536 --kvcache --page-size 64 --csv "$out/decode-opencl-paged64.csv" \
  > "$out/decode-opencl-paged64.txt" 2>&1 || echo "OpenCL decode: exit $?"

if python3 -c "import torch" 2> /dev/null; then
  for flush in $flushes; do
    t=sdpa
    [ "$flush" = copy ] || t=sdpa-$flush
    stamp "PyTorch SDPA, flush $flush"
    timeout 200 python3 bench/decode_sdpa.py --batch "$batches" --cache "$caches" \
      --flush "$([ "$flush" = copy ] && echo fill || echo read)" --csv "$out/decode-$t.csv" \
      > "$out/decode-$t.txt" 2>&1 || failed=1
  done
fi

# Per-block timestamps of the decoding kernel (DECODE_TRACE), after each
# flush: every launch prints one line a block; the last launch is kept.
for point in ${DEC_TRACE:-}; do
  IFS=: read -r b n <<< "$point"
  for flush in $flushes; do
    stamp "trace b$b n$n, flush $flush"
    FLASHATTN_CUDA_OPTIONS="${DEC_TRACE_OPTIONS:-} -DDECODE_TRACE" timeout 120 build-gpu/fa-bench --backend cuda \
      --decode --dtype bf16 --dim 128 --heads 32 --heads-kv 4 --batch "$b" --cache "$n" --repeats 3 \
      --flush "$flush" > "$out/trace-b$b-n$n-$flush.txt" 2>&1 || echo "trace: exit $?"
    python3 bench/decode_trace.py "$out/trace-b$b-n$n-$flush.txt" | tee "$out/decode-trace-b$b-n$n-$flush.txt"
  done
done

ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ -x "$ncu" ] && [ "${DEC_NCU:-1}" = 1 ]; then
  for point in $profile; do
    IFS=: read -r b n page <<< "$point"
    extra=()
    tag="b$b-n$n"
    [ -n "$page" ] && { extra=(--kvcache --page-size "$page"); tag="$tag-p$page"; }
    stamp "ncu $tag"
    timeout 150 "$ncu" --clock-control none -k regex:fa_fwd_decode --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
      --section Occupancy --section SchedulerStats \
      build-gpu/fa-bench --backend cuda --decode --dtype bf16 --dim 128 --heads 32 --heads-kv 4 --batch "$b" \
      --cache "$n" --repeats 2 "${extra[@]}" > "$out/ncu-$tag.txt" 2>&1 || echo "ncu $tag: exit $?"
    if [[ " ${DEC_NCU_FULL:-} " == *" $point "* ]]; then
      stamp "ncu full $tag"
      timeout 200 "$ncu" --clock-control none -k regex:fa_fwd_decode --launch-skip 3 --launch-count 1 --set full \
        --import-source no -o "$out/ncu-full-$tag" \
        build-gpu/fa-bench --backend cuda --decode --dtype bf16 --dim 128 --heads 32 --heads-kv 4 --batch "$b" \
        --cache "$n" --repeats 2 "${extra[@]}" > /dev/null 2>&1 || echo "ncu full $tag: exit $?"
      "$ncu" --import "$out/ncu-full-$tag.ncu-rep" --page details --print-details all > "$out/ncu-full-$tag.txt" 2>&1
      "$ncu" --import "$out/ncu-full-$tag.ncu-rep" --page source --csv --print-source sass \
        > "$out/ncu-full-$tag-sass.csv" 2>&1
    fi
    grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Grid Size|Block Limit|Stall|One or More|No Eligible" \
      "$out/ncu-$tag.txt" | head -24
  done
fi

stamp "summary"
for f in "$out"/decode-*.txt; do
  echo "== $(basename "$f")"
  grep -vE "^\s*$" "$f" | tail -n 14
done
# One archive comes back from the device machine (it returns a few files):
# the rest moves out of $out.
(cd "$out" && tar czf /tmp/decode-all.tgz --exclude='*.ncu-rep' ./*.txt ./*.csv ./*.log base 2>/dev/null)
mkdir -p /tmp/decode-raw && mv "$out"/* /tmp/decode-raw/ 2>/dev/null
mv /tmp/decode-all.tgz "$out/"
stamp "done (failed=$failed)"
exit $failed
