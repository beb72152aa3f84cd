#!/usr/bin/env bash
# On an NVIDIA GPU machine, from the repository root: the OpenCL backend's
# matrix-unit kernels (kernels_cl/fwd_mma.cl, bwd_mma.cl on mma.sync through
# inline PTX) through NVIDIA's OpenCL. Steps:
#
#   compile  builds the programs the planner picks for the benchmark shapes
#            (16k tokens, hidden 2048: the tiles do not depend on N there;
#            fp16 and bf16, d 64 and 128, causal and not, and the
#            deterministic backward's dQ kernel) with -cl-nv-verbose, and
#            lists each kernel's registers and spills ($OUT/mma-registers.txt;
#            the build logs in $OUT/cl-logs). A kernel that spills is
#            reported and fails the step.
#   tests    the OpenCL suite (test_opencl_attention) and the matrix-unit
#            cases (test_opencl_mma) on the GPU with FA_TEST_LARGE=1 (N up to
#            16k), after printing the plans (fp16 and bf16 must plan "mma").
#   bench    bench/compare_nvidia.sh with the OpenCL backend alone: fp16,
#            bf16 (and fp32, the FMA kernels), d 64 and 128, causal and not,
#            N 2048 .. 16384 at 16k tokens, beside PyTorch SDPA's
#            FLASH_ATTENTION (FlashAttention-2), CUDNN_ATTENTION and
#            EFFICIENT_ATTENTION in the same run; ratio tables in
#            $OUT/ratio.md.
#   check    the backward's check in one call: the planner's plans at
#            head_dim 128, then test_opencl_mma's backward cases and
#            test_opencl_attention's cases with every option, FA_TEST_LARGE=1
#            (at most FA_CHECK_TIMEOUT seconds, default 150; every program
#            they build logged, its registers and spills in
#            $OUT/test-registers.txt, forced tiles included), then bench's
#            ratio table for fp16 and bf16 against FlashAttention-2 alone,
#            with the registers and spills of the programs it built
#            ($OUT/bench-registers.txt), and the registers of fp16's
#            backward with dropout at head_dim 64 and 128. Not part of all.
#   sweep    bench/fa-cl-mma-sweep.c: fp16, d 64 and 128, causal and not,
#            N 4096 and 16384 at 16k tokens: the planner's tiles and the
#            candidates beside them (other tiles and sub-group counts, the
#            two-stage backward, V in registers, tuning macros), each with
#            TFLOP/s, its outputs' difference from the planner's and the
#            registers and spills NVIDIA's compiler reports; then PyTorch
#            SDPA's FlashAttention-2 on the same shapes and every row's
#            speed as a fraction of it ($OUT/sweep.txt, sweep-ratio.txt);
#            first the planner's tiles against the fp64 reference
#            (test_opencl_mma head_dims; and for the backward its tiles
#            with K and V packed, which only the sweep runs:
#            packed_keys_backward); those logs, SDPA's and the programs'
#            build logs in $OUT/sweep-logs.tar.gz.
#            Not part of all: at most 7 minutes on an H100, the build
#            included. A shorter sweep: FA_SWEEP_SEQLENS (default
#            4096,16384), FA_SWEEP_PASS (fwd or bwd; default both),
#            FA_SWEEP_CHECK=0 (no reference check first), FA_SWEEP_PEER=0
#            (no SDPA), FA_SWEEP_TILES=planner (only the rows on the
#            planner's tiles: its plain build and the tuning macros'),
#            FA_SWEEP_ROWS=I,J,... (only those rows of fa-cl-mma-sweep.c's
#            configs, beside the planner's plain ones).
#
# Usage: bench/opencl_mma_gpu.sh [compile|tests|bench|check|sweep|all]   (default
# all: compile, tests, bench; each step alone fits in 10 minutes on an H100
# or H200, the build included). Outputs in $OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
what=${1:-all}
case $what in
  compile|tests|bench|check|sweep|all) ;;
  -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "unknown step $what (try --help)" >&2; exit 2 ;;
esac

# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
fa_nvidia_opencl || exit 1
# NVIDIA's own cache of compiled programs would skip the compiler, and with
# it the -cl-nv-verbose report the register tables read.
export CUDA_CACHE_DISABLE=1
fa_gpu_info
build="build-gpu"
stamp "configure and build $build"
# Every switch is given: build-gpu keeps what other scripts configured.
if [ "$what" = sweep ]; then targets="fa-info fa-cl-mma-sweep test_opencl_mma"; else
  targets="fa-info fa-run fa-bench test_opencl_attention test_opencl_mma"; fi
fa_gpu_build "$build" "$targets" -DFA_OPENCL=ON \
  -DFA_CUDA=AUTO -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF -DCMAKE_BUILD_TYPE=Release || exit 1
failed=0

# The benchmark's shapes: d, N -> batch and heads at 16k tokens, hidden 2048.
shape_args() { echo "--dim $1 --seqlen $2 --batch $(( 16384 / $2 )) --heads $(( 2048 / $1 ))"; }

# register_table LOGS OUTFILE: one line per matrix-unit kernel built with
# -cl-nv-verbose into the log folder LOGS (the build's tile options,
# registers, spills) into OUTFILE; returns 1 when a kernel spills or none
# was built.
register_table() {
  python3 - "$1" > "$2" <<'EOF'
import os, re, sys
rows, spilled = [], 0
for name in sorted(os.listdir(sys.argv[1])):
    text = open(os.path.join(sys.argv[1], name), errors="replace").read()
    opts = text.splitlines()[0] if text else ""
    if "FA_MMA_" not in opts:
        continue
    keep = [w for w in opts.split() if w.startswith("-D") and w.split("=")[0] in
            ("-DHEAD_DIM", "-DBR", "-DBC", "-DWARPS", "-DDTYPE_F16", "-DDTYPE_BF16", "-DQREG", "-DDQ_ATOMIC",
             "-DFA_BWD_DQ", "-DFA_DQ_UNIT", "-DDQ_UNIT", "-DFA_FWD_WGMMA", "-DFA_BWD_WGMMA", "-DCAUSAL", "-DSPLITK", "-DVREG", "-DQC", "-DSTAGES", "-DDROPOUT", "-DWINDOW", "-DBLOCK_MASK", "-DVARLEN",
             "-DSOFTCAP", "-DALIBI", "-DBIAS", "-DFA_BWD_ROTATE")]
    # ptxas reports an entry's spills and registers after its name, in
    # either order.
    cur = None
    for line in text.splitlines() + ["entry function '(end)'"]:
        m = re.search(r"entry function '(\w+|\(end\))'", line)
        if m:
            if cur and cur[1] is not None:
                rows.append(cur)
            cur = [m.group(1), None, 0, 0, " ".join(keep)]
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            cur[1] = int(m.group(1))
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            cur[2], cur[3] = int(m.group(1)), int(m.group(2))
for r in rows:
    spilled += r[2] + r[3] > 0
    print("%-20s %4d registers  spill %5d/%-5d  %s" % tuple(r))
print("%d kernels, %d spilling" % (len(rows), spilled))
sys.exit(1 if spilled or not rows else 0)
EOF
}

if [ "$what" = compile ] || [ "$what" = all ]; then
  stamp "compile: the planned matrix-unit programs with -cl-nv-verbose"
  logs="$out/cl-logs"
  rm -rf "$logs"
  mkdir -p "$logs"
  # A cache of its own: each distinct program is compiled (and logged) once.
  rm -rf "$out/cl-cache-compile"
  for dtype in fp16 bf16; do
    for dim in 64 128; do
      for flags in "" --causal --deterministic "--dropout 0.1"; do
        [ "$flags" != "" ] && [ "$flags" != --causal ] && [ "$dtype" = bf16 ] && continue
        # shellcheck disable=SC2046,SC2086  # the shape's and the flags' words
        FLASHATTN_CACHE_DIR="$out/cl-cache-compile" FLASHATTN_OPENCL_LOG_DIR="$logs" \
          FLASHATTN_OPENCL_OPTIONS=-cl-nv-verbose \
          "$build/fa-run" --backend opencl --dtype "$dtype" $(shape_args "$dim" 16384) $flags \
          --repeats 1 --no-check >> "$out/compile-runs.txt" 2>&1 ||
          { echo "  fa-run $dtype d$dim $flags failed (see compile-runs.txt)"; failed=1; }
        stamp "  $dtype d$dim $flags"
      done
    done
  done
  register_table "$logs" "$out/mma-registers.txt"
  rc=$?
  cat "$out/mma-registers.txt"
  [ "$rc" = 0 ] || { echo "compile: spills, or no matrix-unit kernel was built (see $out/mma-registers.txt)"; failed=1; }
fi

if [ "$what" = tests ] || [ "$what" = all ]; then
  stamp "tests: the plans, then the OpenCL suite and the matrix-unit cases (FA_TEST_LARGE=1)"
  for dtype in fp16 bf16 fp32; do
    # shellcheck disable=SC2046
    "$build/fa-info" --backend opencl --dtype "$dtype" $(shape_args 128 8192) 2>&1 | grep -E "^(forward|backward):"
  done | tee "$out/plans.txt"
  grep -q "^forward: mma" "$out/plans.txt" || { echo "tests: fp16/bf16 did not plan the matrix units"; failed=1; }
  FA_TEST_LARGE=1 ctest --test-dir "$build" -R '^opencl_(attention|mma)\.' --output-on-failure -j4 --timeout 900 \
    > "$out/opencl-mma-tests.log" 2>&1 || failed=1
  grep -E "tests passed|FAILED|Failed|\(Skipped\)" "$out/opencl-mma-tests.log" | head -40
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
  stamp "bench: compare_nvidia.sh with the OpenCL backend"
  FA_BUILD_DIR=$build FA_BACKENDS=opencl FA_SEQLENS=2048,4096,8192,16384 FA_PEERS=flash,cudnn,efficient \
    bash bench/compare_nvidia.sh || failed=1
fi
if [ "$what" = check ]; then
  stamp "check: plans, then the matrix-unit cases and the suite's options on the GPU (FA_TEST_LARGE=1)"
  for dtype in fp16 bf16; do
    # shellcheck disable=SC2046
    "$build/fa-info" --backend opencl --dtype "$dtype" $(shape_args 128 8192) 2>&1 | grep -E "^(forward|backward):"
  done | tee "$out/plans.txt"
  # The suite's programs (every option it runs: windows, block masks,
  # varlen, score options) built afresh and logged, so that their registers
  # and spills are tabled too.
  # (ctest gives each test its cache under the build, emptied here).
  rm -rf "$out/test-logs" "$build"/kernel-cache-*
  mkdir -p "$out/test-logs"
  FLASHATTN_OPENCL_LOG_DIR="$out/test-logs" \
    FLASHATTN_OPENCL_OPTIONS=-cl-nv-verbose \
    FA_TEST_LARGE=1 timeout "${FA_CHECK_TIMEOUT:-150}" ctest --test-dir "$build" --output-on-failure -j4 --timeout 140 \
    -R '^opencl_(mma[.](work_group_shapes|head_dims|pipelined_backward|one_stage_v_in_registers)|attention[.](causal|sliding_window|block_sparse|dropout|gqa_mqa|varlen|score_options|dtypes|deterministic_backward|described_devices))$' \
    > "$out/opencl-mma-tests.log" 2>&1 || failed=1
  grep -E "tests passed|FAILED|Failed|\(Skipped\)|Timeout" "$out/opencl-mma-tests.log" | head -40
  # Reported, not failed: the suite also forces tiles the planner never
  # picks on NVIDIA (the compile step holds the planned programs to no spill).
  register_table "$out/test-logs" "$out/test-registers.txt" ||
    echo "check: a kernel the suite built spills (test-registers.txt; forced tiles included)"
  grep -E "spill +[1-9]|spilling" "$out/test-registers.txt"
  tar -czf "$out/test-logs.tar.gz" -C "$out" test-logs && rm -rf "$out/test-logs"
  stamp "check: compare_nvidia.sh, OpenCL fp16 and bf16 against FlashAttention-2, build logs kept"
  rm -rf "$out/bench-logs" "$out/cl-cache-check"
  mkdir -p "$out/bench-logs"
  # A cache of its own, so that every program the benchmark runs is built
  # (and logged) here, not taken from an earlier step's cache.
  export FLASHATTN_CACHE_DIR="$out/cl-cache-check"
  FLASHATTN_OPENCL_LOG_DIR="$out/bench-logs" FLASHATTN_OPENCL_OPTIONS=-cl-nv-verbose FA_BUILD_DIR=$build \
    FA_BACKENDS=opencl FA_DTYPES="fp16 bf16" FA_SEQLENS=2048,4096,8192,16384 FA_PEERS=flash \
    bash bench/compare_nvidia.sh || failed=1
  for dim in 64 128; do
    # shellcheck disable=SC2046
    FLASHATTN_OPENCL_LOG_DIR="$out/bench-logs" FLASHATTN_OPENCL_OPTIONS=-cl-nv-verbose \
      "$build/fa-run" --backend opencl --dtype fp16 $(shape_args "$dim" 16384) --dropout 0.1 --repeats 1 \
      --no-check >> "$out/compile-runs.txt" 2>&1 || { echo "  fa-run fp16 d$dim --dropout failed"; failed=1; }
  done
  register_table "$out/bench-logs" "$out/bench-registers.txt" || echo "check: a kernel spills (bench-registers.txt)"
  grep -E "fa_bwd_dkdv|fa_forward|spilling" "$out/bench-registers.txt"
  tar -czf "$out/bench-logs.tar.gz" -C "$out" bench-logs && rm -rf "$out/bench-logs" "$out/cl-cache-check"
fi
if [ "$what" = sweep ]; then
  sweep_seqlens=${FA_SWEEP_SEQLENS:-4096,16384}
  sweep_pass=(--tiles "${FA_SWEEP_TILES:-all}")
  [ -n "${FA_SWEEP_PASS:-}" ] && sweep_pass+=(--pass "$FA_SWEEP_PASS")
  [ -n "${FA_SWEEP_ROWS:-}" ] && sweep_pass+=(--rows "$FA_SWEEP_ROWS")
  # The sweep compares every configuration with the planner's outputs; the
  # planner's own tiles (ldmatrix, ex2 and mma.sync as NVIDIA runs them,
  # which PoCL's emulation does not) against the fp64 reference first.
  if [ "${FA_SWEEP_CHECK:-1}" = 1 ]; then
    stamp "sweep: the planner's matrix-unit tiles against the reference (test_opencl_mma head_dims)"
    timeout 75 "$build/test_opencl_mma" head_dims > "$out/sweep-check.log" 2>&1 || failed=1
    tail -3 "$out/sweep-check.log"
    # The packed K and V the sweep forces (not planned yet) likewise.
    if [ "${FA_SWEEP_PASS:-bwd}" = bwd ]; then
      stamp "sweep: K and V packed against the reference (test_opencl_mma packed_keys_backward)"
      timeout 90 "$build/test_opencl_mma" packed_keys_backward > "$out/sweep-check-packed.log" 2>&1 || failed=1
      tail -3 "$out/sweep-check-packed.log"
    fi
  fi
  stamp "sweep: matrix-unit configurations beside the planner's (fp16, 16k tokens, hidden 2048)"
  # A fresh cache, so that every program is built and its log (registers,
  # spills) kept in the configuration's folder.
  rm -rf "$out/cl-cache-sweep" "$out/sweep-logs" "$out/sweep.jsonl" "$out/sweep-peer.jsonl"
  mkdir -p "$out/sweep-logs"
  FLASHATTN_CACHE_DIR="$out/cl-cache-sweep" FLASHATTN_OPENCL_LOG_DIR="$out/sweep-logs" \
    FLASHATTN_OPENCL_OPTIONS=-cl-nv-verbose timeout 270 "$build/fa-cl-mma-sweep" --seqlens "$sweep_seqlens" \
    "${sweep_pass[@]}" --repeats 5 --warmup 1 --json "$out/sweep.jsonl" | tee "$out/sweep.txt" || failed=1
  rm -rf "$out/cl-cache-sweep"
  if [ "${FA_SWEEP_PEER:-1}" = 1 ]; then
    stamp "sweep: PyTorch SDPA FlashAttention-2 on the same shapes"
    python3 bench/sdpa_peer.py --dtypes fp16 --dims 64,128 --seqlens "$sweep_seqlens" --causal 0,1 --backends flash \
      --repeats 10 --warmup 2 --json "$out/sweep-peer.jsonl" > "$out/sweep-peer.log" 2>&1 || failed=1
  else
    : > "$out/sweep-peer.jsonl"
  fi
  # Every row's speed as a fraction of FlashAttention-2's (time ratio on
  # the same work).
  python3 - "$out/sweep.jsonl" "$out/sweep-peer.jsonl" <<'EOF' | tee "$out/sweep-ratio.txt"
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peer = {}
for l in open(sys.argv[2]):
    r = json.loads(l)
    if "fwd_ms" in r:
        peer[(r["d"], int(r["causal"]), r["n"])] = (r["fwd_ms"], r["bwd_ms"])
print("%-4s %4s %6s %6s  %-44s %8s %8s %6s  %s" % ("pass", "d", "causal", "N", "configuration", "TFLOP/s", "diff",
                                                    "xFA2", "registers"))
for r in ours:
    p = peer.get((r["dim"], r["causal"], r["seqlen"]))
    ratio = (p[0] if r["pass"] == "fwd" else p[1]) / r["ms"] if p else float("nan")
    print("%-4s %4d %6s %6d  %-44s %8.1f %8.1e %6.2f  %s" % (r["pass"], r["dim"], "yes" if r["causal"] else "no",
          r["seqlen"], r["config"], r["tflops"], r["diff"], ratio, r["registers"]))
EOF
  # The build logs are many small files, and a device call brings back
  # only a few: the logs in one archive, beside the tables and JSON lines.
  (cd "$out" && tar -czf sweep-logs.tar.gz sweep-logs sweep-check.log sweep-check-packed.log sweep-peer.log \
    2>/dev/null; rm -rf sweep-logs sweep-check.log sweep-check-packed.log sweep-peer.log)
fi
stamp "done (exit $failed)"
exit "$failed"
