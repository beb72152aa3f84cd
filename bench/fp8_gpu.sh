#!/usr/bin/env bash
# On an H100 or H200, from the repository root: the FP8 (e4m3) forward
# (kernels_cuda/fwd_tma.cu built with FP8, plan variant wgmma_tma). Steps:
#   smoke    fa-run --dtype fp8 against the CPU reference on small shapes
#            (head_dim 64, 128, 256; causal, windows, GQA, lengths off the
#            tiles, O in fp16, descale factors, each product schedule),
#            each under a time limit (a lost barrier phase hangs rather
#            than fails), and one option the kernel does not take, which
#            must be refused
#   tests    ctest: the fp8 device cases (cuda_attention.fp8_forward,
#            fp8_refusals), test_fp8, and the fp8 compile cases
#   bench    fa-bench's forward TFLOP/s, fp8 beside bf16 in the same run
#            (16k tokens, hidden 2048), at FP8_DIMS, causal and not, with
#            the ratio fp8 / bf16; FP8_SCHEDULES adds fp8 sweeps with each
#            FLASHATTN_TMA_SCHEDULE named (overlap, pingpong, both, plain);
#            then fa-tma-tiles: the planned fp8 tile beside FP8_TILES
#            (default 128x192/2,128x64/2) at head_dim 128
# Outputs in $OUT (default ./gpu-out): gpu.txt, cmake.log, build.log, then
# one file a step (smoke.txt, tests.txt, bench.txt and fp8.jsonl), a
# summary on stdout. Environment: FP8_STEPS (default "smoke tests bench"),
# FP8_DIMS (default "128 64"), FP8_SEQLENS (default 4096,8192,16384),
# FP8_SCHEDULES (default none), FP8_TESTS (the ctest regex of the tests
# step), FP8_OPTIONS (default none): kernel build options to try, as
# "label=-DA,-DB label2=..." in FLASHATTN_CUDA_OPTIONS: the bench step
# sweeps "fp8-label" and "bf16-label" beside the plain builds (their
# kernels compiled in parallel first, so that no timed run waits on NVRTC);
# FP8_TRANSPOSERS=1 adds the in-kernel V transposers beside the planned
# V^T pre-pass (FLASHATTN_FP8_VT=transposers): smoke runs at head_dim 64
# and 128 and a bench sweep "fp8-transposers";
# FP8_SMOKE_OPTIONS (default FP8_OPTIONS) those whose fp8 and bf16 shapes
# the smoke step runs against the reference, FP8_TILE_OPTIONS (default
# none) those fa-tma-tiles runs with. Exit status 1 when a step failed; the bench
# step also prints whether fp8 reached 1.4x bf16 at head_dim 128 from
# N = 4096.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
steps=${FP8_STEPS:-smoke tests bench}
want() { [[ " $steps " == *" $1 "* ]]; }
read -r -a dims <<< "${FP8_DIMS:-128 64}"
read -r -a schedules <<< "${FP8_SCHEDULES:-}"
seqlens=${FP8_SEQLENS:-4096,8192,16384}
read -r -a options <<< "${FP8_OPTIONS:-}"
read -r -a smoke_options <<< "${FP8_SMOKE_OPTIONS-${FP8_OPTIONS:-}}"
read -r -a tile_options <<< "${FP8_TILE_OPTIONS:-}"
# The NVRTC options of FP8_OPTIONS entry $1 ("label=-DA,-DB").
opt_flags() { local v=${1#*=}; echo "${v//,/ }"; }

stamp "configure and build"
fa_gpu_build_cuda "test_cuda_attention test_cuda_compile test_fp8 fa-bench fa-run fa-info fa-tma-tiles" || exit 1
failed=0

if want smoke; then
  stamp "smoke: fa-run --dtype fp8 against the reference (in parallel)"
  run() { fa_smoke_run --dtype fp8 "$@"; }
  for dim in 64 128 256; do
    run --dim "$dim" --batch 2 --heads 4 --seqlen 512
    run --dim "$dim" --batch 1 --heads 2 --seqlen 1000 --causal --descale 0.5,2,0.75
    run --dim "$dim" --batch 2 --heads 8 --heads-kv 2 --seqlen-q 300 --seqlen-k 777 --o-dtype fp16
    run --dim "$dim" --batch 1 --heads 4 --seqlen 1024 --window 100,50
    run --dim "$dim" --batch 1 --heads 2 --seqlen-q 4096 --seqlen-k 64 --causal
  done
  run --dim 192 --batch 1 --heads 4 --heads-kv 1 --seqlen 640 --causal
  for sched in overlap pingpong both plain; do
    FLASHATTN_TMA_SCHEDULE=$sched run --dim 128 --batch 1 --heads 2 --seqlen 1000 --causal
  done
  if [ "${FP8_TRANSPOSERS:-0}" = 1 ]; then
    for dim in 64 128; do
      FLASHATTN_FP8_VT=transposers run --dim "$dim" --batch 2 --heads 8 --heads-kv 2 --seqlen-q 300 --seqlen-k 777
      FLASHATTN_FP8_VT=transposers run --dim "$dim" --batch 1 --heads 2 --seqlen 1000 --causal --descale 0.5,2,0.75
    done
  fi
  for o in "${smoke_options[@]}"; do
    for dim in 64 128 256; do
      for dt in fp8 bf16; do
        FLASHATTN_CUDA_OPTIONS=$(opt_flags "$o") fa_smoke_run --dtype "$dt" --dim "$dim" --batch 2 --heads 4 --seqlen 700
        FLASHATTN_CUDA_OPTIONS=$(opt_flags "$o") fa_smoke_run --dtype "$dt" --dim "$dim" --batch 1 --heads 4 \
          --heads-kv 2 --seqlen 1000 --causal
        FLASHATTN_CUDA_OPTIONS=$(opt_flags "$o") fa_smoke_run --dtype "$dt" --dim "$dim" --batch 1 --heads 2 \
          --seqlen 1024 --window 100,50
      done
    done
  done
  fa_smoke_report || failed=1
  # What the kernel does not take: refused at plan creation, by name.
  timeout 60 build-gpu/fa-run --backend cuda --dtype fp8 --repeats 1 --dim 128 --seqlen 256 --dropout 0.1 \
    > "$out/refused.txt" 2>&1
  rc=$?
  if [ "$rc" != 0 ] && grep -q "dropout_p" "$out/refused.txt"; then
    echo "  refused as it should: $(grep -m1 -o "dropout_p.*" "$out/refused.txt")"
  else
    echo "  dropout with fp8 was not refused by name (rc $rc)"
    failed=1
  fi
  cat "$out/refused.txt" >> "$out/smoke.txt"
  rm -f "$out/refused.txt"
fi

if want tests; then
  stamp "tests: ctest (the fp8 cases)"
  ctest --test-dir build-gpu \
    -R "${FP8_TESTS:-^cuda_attention[.](fp8_forward|fp8_refusals|tma_shapes)$|^fp8[.]|^cuda_compile[.](h100_sm90_fp8_variants|fp8_refusals|h100_sm90_tma_variants)$}" \
    -j4 --timeout "${FP8_TEST_TIMEOUT:-600}" --output-on-failure -V > "$out/tests.txt" 2>&1
  rc=$?
  echo "  rc $rc: $(grep -E "tests passed" "$out/tests.txt")"
  grep -E "CHECK failed|Failed|Timeout|\*\*\*" "$out/tests.txt" | head -20
  # The largest O errors of the fp8 cases (exact inputs and random ones).
  grep -E " fp8 d.* O [0-9.e+-]+$" "$out/tests.txt" | awk '{print $NF "\t" $0}' | sort -g | tail -4 | cut -f2- |
    sed "s/^/  largest: /"
  [ "$rc" = 0 ] || failed=1
fi

if want bench; then
  json=$out/fp8.jsonl
  : > "$json"
  sweep() { fa_fwd_sweep "$json" "$1" "$2" "$3" "$4" "$seqlens" || failed=1; }
  if ((${#options[@]})); then
    stamp "compile the option builds (in parallel)"
    for o in "" "${options[@]}"; do
      for dim in "${dims[@]}"; do
        for causal in "" --causal; do
          for dt in bf16 fp8; do
            # shellcheck disable=SC2086  # $causal: no flag or one
            FLASHATTN_CUDA_OPTIONS=$(opt_flags "$o") timeout 300 build-gpu/fa-bench --backend cuda --dtype "$dt" \
              --dim "$dim" $causal --seqlens 1024 --tokens 4096 --hidden 2048 --pass fwd --repeats 1 --warmup 0 \
              > /dev/null 2>&1 &
          done
        done
      done
    done
    wait
  fi
  for dim in "${dims[@]}"; do
    for causal in 0 1; do
      stamp "bench d$dim causal $causal: bf16, fp8"
      sweep bf16 bf16 "$dim" "$causal"
      sweep fp8 fp8 "$dim" "$causal"
      for sched in "${schedules[@]}"; do FLASHATTN_TMA_SCHEDULE=$sched sweep "fp8-$sched" fp8 "$dim" "$causal"; done
      if [ "${FP8_TRANSPOSERS:-0}" = 1 ]; then FLASHATTN_FP8_VT=transposers sweep fp8-transposers fp8 "$dim" "$causal"; fi
      for o in "${options[@]}"; do
        FLASHATTN_CUDA_OPTIONS=$(opt_flags "$o") sweep "bf16-${o%%=*}" bf16 "$dim" "$causal"
        FLASHATTN_CUDA_OPTIONS=$(opt_flags "$o") sweep "fp8-${o%%=*}" fp8 "$dim" "$causal"
      done
    done
  done
  python3 - "$json" <<'PY' || failed=1
import json, sys, collections
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("error") or not r.get("fwd_tflops"): continue
    rows[(r["d"], int(r["causal"]), r["n"])][r["label"]] = r["fwd_tflops"]
cols = sorted({c for v in rows.values() for c in v}, key=lambda c: (c != "bf16", c))
print("TFLOP/s forward (fp8 / bf16)")
print("| d | causal | N | " + " | ".join(cols) + " |")
print("|" + "---|" * (3 + len(cols)))
bar_ok, bar_seen = True, False
for k in sorted(rows):
    ref = rows[k].get("bf16")
    def cell(c):
        t = rows[k][c]
        return "%.1f" % t + (" (%.2f)" % (t / ref) if ref and c != "bf16" else "")
    print("| %d | %d | %d | " % k + " | ".join(cell(c) if c in rows[k] else "-" for c in cols) + " |")
    if k[0] == 128 and k[2] >= 4096:
        bar_seen = True
        fp8 = rows[k].get("fp8")
        if not ref or not fp8 or fp8 / ref < 1.4: bar_ok = False
if bar_seen:
    print("fp8 at head_dim 128, N >= 4096: %s 1.4x bf16" % ("at least" if bar_ok else "BELOW"))
sys.exit(0 if bar_ok or not bar_seen else 1)
PY
  stamp "fa-tma-tiles fp8 d128: the planned tile beside ${FP8_TILES:-128x192/2,128x64/2}"
  timeout 200 build-gpu/fa-tma-tiles --dtype fp8 --dims 128 --seqlens "$seqlens" \
    --tiles "${FP8_TILES:-128x192/2,128x64/2}" 2>&1 | tee -a "$out/bench.txt"
  for o in "${tile_options[@]}"; do
    stamp "fa-tma-tiles fp8 d128 with ${o%%=*} ($(opt_flags "$o"))"
    FLASHATTN_CUDA_OPTIONS=$(opt_flags "$o") timeout 200 build-gpu/fa-tma-tiles --dtype fp8 --dims 128 \
      --seqlens "$seqlens" --tiles "${FP8_TILES:-128x192/2,128x64/2}" 2>&1 | tee -a "$out/bench.txt"
  done
fi
stamp "done"
exit $failed
