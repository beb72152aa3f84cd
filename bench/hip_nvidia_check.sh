#!/usr/bin/env bash
# On an NVIDIA GPU machine: build with the HIP backend running on CUDA
# through libfa_hip_on_cuda (FA_HIP_NVIDIA=ON), run the HIP tests with
# sequences up to 16k (FA_TEST_LARGE=1), then time the HIP matrix-core
# kernels beside the CUDA backend's mma.sync kernels on the same shapes in
# the same run (bench/fa-mma-compare.c: 16k tokens, hidden 2048, fp16 and
# bf16, head_dim 64 and 128, causal and not), and, with "all", the HIP,
# OpenCL and CUDA backends' planned kernels with fa-bench. Logs, tables
# and JSON lines go to $OUT (default ./gpu-out).
#
# The machine has no HIP headers: Debian's are unpacked into .deps first
# (mkdir -p .deps && cd .deps && apt-get download libamdhip64-dev &&
#  dpkg -x libamdhip64-dev_*.deb hip) and carried along.
#
# Usage: bench/hip_nvidia_check.sh [tests|check|compare|sweep|bench|all] [extra ctest args]
#   tests    the HIP device tests (the suite, the matrix-core cases), the
#            layout and NVRTC compile checks of the matrix-core kernels
#   check    the HIP device suite and the layout cases (FA_TEST_LARGE=1),
#            then compare: one run of a few minutes (the NVRTC sweep runs
#            in CI)
#   compare  fa-mma-compare: HIP matrix cores / CUDA mma.sync, ratio tables
#   sweep    check, then the HIP backward on other tiles beside the
#            planner's, per head_dim, each against the same CUDA time
#            (fa-mma-compare --hip-bwd; the lists in FA_SWEEP_D64 and
#            FA_SWEEP_D128, BRxBC/TRxTC/STAGES, comma-separated; sequence
#            lengths in FA_SWEEP_SEQLENS)
#   bench    fa-bench on the HIP, OpenCL and CUDA backends' own plans
#   all      tests, compare and bench (default)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
what=${1:-all}
shift || true
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
build=build-hip
hip_include=${FA_HIP_INCLUDE:-$PWD/.deps/hip/usr/include}
[ -e "$hip_include/hip/hip_runtime_api.h" ] || { echo "no HIP headers at $hip_include" >&2; exit 1; }

fa_gpu_info
fa_nvidia_opencl || echo "no NVIDIA OpenCL: the OpenCL column of fa-bench is left out"

targets="fa_hip_on_cuda test_hip_attention test_hip_compile test_hip_mma_layouts fa-bench fa-info fa-mma-compare"
hip_opts=(-DFA_HIP_NVIDIA=ON -DFA_HIP_INCLUDE="$hip_include" -DCMAKE_BUILD_TYPE=Release)
# What this check needs, no more: the rest of the tree is built (warnings
# as errors) wherever the tree is tested, and the GPU machine's minutes are
# better spent on the runs.
stamp "configure and build $build: $targets"
fa_gpu_build "$build" "$targets" "${hip_opts[@]}" -DFA_CUDA=AUTO || exit 1
# The backend's own default list names the AMD runtime; the mapping is
# named explicitly for the tools (the HIP tests get it from CMake).
mapping=$PWD/$build/libfa_hip_on_cuda.so
FLASHATTN_HIP_LIBRARY=$mapping "$build"/fa-info --backend hip --seqlen 4096 --dim 128 --dtype fp16 2>&1 | tee "$out/fa-info.txt"
commit=$(fa_commit_label)
status=0

# The HIP ctest cases matching $1, with sequences up to 16k, each within
# $2 seconds; the summary lines to the terminal.
hip_ctest() {
  stamp "HIP tests ($1), FA_TEST_LARGE=1"
  FA_TEST_LARGE=1 ctest --test-dir "$build" -R "$1" --output-on-failure -j4 --timeout "$2" "${@:3}" \
    > "$out/hip-tests.log" 2>&1
  local rc=$?
  echo "hip tests: exit $rc"
  [ "$rc" = 0 ] || status=1
  grep -E "tests passed|tests failed|\*\*\*|Failed|Skipped|Not Run" "$out/hip-tests.log" | head -60
  grep -E "HIP device:|private bytes|geometry runs" "$out/hip-tests.log" | sort | uniq | head -20
}

if [ "$what" = check ] || [ "$what" = sweep ]; then
  hip_ctest "hip_attention|hip_mma_layouts" 300 "$@"
fi

if [ "$what" = tests ] || [ "$what" = all ]; then
  hip_ctest "hip_attention|hip_mma_layouts|hip_compile.nvidia" 600 "$@"
  # Every case's errors against the reference, for the results file.
  FA_TEST_LARGE=1 FLASHATTN_HIP_LIBRARY=$mapping "$build"/test_hip_attention > "$out/hip-suite.log" 2>&1
  echo "test_hip_attention (all cases, one process): exit $?"
  tail -3 "$out/hip-suite.log"
  FLASHATTN_HIP_LIBRARY=$mapping "$build"/test_hip_compile nvidia_mma_variants > "$out/nvrtc-mma.txt" 2>&1
  tail -1 "$out/nvrtc-mma.txt"
fi

if [ "$what" = compare ] || [ "$what" = check ] || [ "$what" = sweep ] || [ "$what" = all ]; then
  stamp "HIP matrix cores beside CUDA mma.sync"
  FLASHATTN_HIP_LIBRARY=$mapping "$build"/fa-mma-compare --json "$out/mma-compare.jsonl" --label "$commit" \
    2>&1 | tee "$out/mma-compare.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ "$what" = sweep ]; then
  for dim in 64 128; do
    stamp "HIP backward tiles at head_dim $dim beside the planner's"
    list_var=FA_SWEEP_D$dim
    default_tiles=64x128/16x2/2,32x128/8x4/1,64x64/16x2/2,16x128/4x4/2
    [ "$dim" = 128 ] && default_tiles=16x128/4x2/2,32x128/8x2/2,64x64/16x2/2,64x64/16x2/1
    FLASHATTN_HIP_LIBRARY=$mapping "$build"/fa-mma-compare --dims "$dim" --bwd-only 1 \
      --seqlens "${FA_SWEEP_SEQLENS:-4096,16384}" --hip-bwd "${!list_var:-$default_tiles}" \
      --json "$out/mma-sweep.jsonl" --label "$commit" 2>&1 | tee -a "$out/mma-sweep.txt"
  done
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
  stamp "fa-bench: hip, opencl, cuda"
  json="$out/bench.jsonl"
  for backend in hip opencl cuda; do
    for dtype in fp16 bf16; do
      FLASHATTN_HIP_LIBRARY=$mapping "$build"/fa-bench --backend "$backend" --dtype "$dtype" --dim 128 \
        --seqlens 2048,8192 --repeats 10 --json "$json" --label "$commit-$backend" 2>&1 | tee -a "$out/bench.txt"
    done
  done
fi
stamp "done"
exit $status
