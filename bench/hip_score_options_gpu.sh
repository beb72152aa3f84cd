#!/usr/bin/env bash
# On an NVIDIA GPU machine: the HIP backend's score options (softcap, ALiBi,
# the additive bias) through the HIP-on-CUDA mapping (FA_HIP_NVIDIA=ON),
# against the fp64 reference. Builds the mapping and the HIP tests into
# build-hip, then runs at once (one GPU, several processes):
#   test_hip_attention score_options             the suite's case (every
#       option alone and together, GQA, causal, windows, strided bias,
#       decoding), on the planner's own plans
#   test_hip_attention score_option_tiles_simt   each option set on forced
#       SIMT tiles (forward, backward) and the split-K forward
#   test_hip_attention score_option_tiles_mma    each option set on the
#       matrix-core forward, backward (dQ by atomics) and deterministic
#       backward, on the device's smallest and largest tiles
#   ctest: every other test_hip_attention case and the matrix-core layout
#       checks (the whole HIP suite)
# Logs to $OUT (default ./gpu-out): one log per score case, hip-suite.log;
# a few minutes on an H100.
#
# The machine has no HIP headers: Debian's are unpacked into .deps first
# (mkdir -p .deps && cd .deps && apt-get download libamdhip64-dev &&
#  dpkg -x libamdhip64-dev_*.deb hip) and carried along.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
build="build-hip"
hip_include=${FA_HIP_INCLUDE:-$PWD/.deps/hip/usr/include}
[ -e "$hip_include/hip/hip_runtime_api.h" ] || { echo "no HIP headers at $hip_include" >&2; exit 1; }

fa_gpu_info
stamp "configure and build $build (the mapping, the HIP tests)"
fa_gpu_build "$build" "fa_hip_on_cuda test_hip_attention test_hip_mma_layouts" -DFA_HIP_NVIDIA=ON \
  -DFA_HIP_INCLUDE="$hip_include" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=AUTO || exit 1
mapping=$PWD/$build/libfa_hip_on_cuda.so
commit=$(fa_commit_label)
echo "commit $commit" | tee "$out/commit.txt"

# Each case within $limit seconds; the whole script stays under six minutes.
limit=${FA_CASE_LIMIT:-270}
cases=(score_options score_option_tiles_simt score_option_tiles_mma)
pids=()
stamp "score-option cases and the rest of the HIP suite, side by side"
for c in "${cases[@]}"; do
  FLASHATTN_HIP_LIBRARY=$mapping timeout "$limit" "$build"/test_hip_attention "$c" > "$out/$c.log" 2>&1 &
  pids+=($!)
done
ctest --test-dir "$build" -R '^(hip_attention|hip_mma_layouts)\.' -E 'score_option' --output-on-failure -j4 \
  --timeout "$limit" > "$out/hip-suite.log" 2>&1
suite_rc=$?

status=0
for i in "${!cases[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  c=${cases[$i]}
  echo "test_hip_attention $c: exit $rc$([ "$rc" = 124 ] && echo " (timed out after $limit s)")"
  [ "$rc" = 0 ] || status=1
  # The verdict, any failed check, and a few of the cases' error lines.
  grep -E "^(ok|FAIL|SKIP) |CHECK failed|inputs from seed" "$out/$c.log" | head -20
  grep -E "^  (simt|split-K|mma|softcap|alibi|bias|all|decoding)" "$out/$c.log" | head -4
done
echo "ctest, the rest of the HIP suite: exit $suite_rc"
[ "$suite_rc" = 0 ] || status=1
grep -E "tests passed|tests failed|\*\*\*|Failed|Not Run" "$out/hip-suite.log" | head -30
grep -E "HIP device:|private bytes" "$out"/*.log | sort | uniq | head -10
stamp "done"
exit $status
