#!/usr/bin/env bash
# On an NVIDIA GPU machine: build, run the CUDA attention tests (with the
# long sequences), check small shapes under compute-sanitizer (memcheck,
# racecheck), time the tensor-core tile shapes the kernels take, and
# benchmark the CUDA backend beside PyTorch SDPA (FlashAttention-2 and
# cuDNN) on the same GPU in the same run. Logs and JSON lines go to $OUT
# (default ./gpu-out).
# Usage: bench/cuda_check.sh [tests|bench|tiles|sanitize|all]...
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
steps=${*:-all}
want() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }

fa_gpu_info
stamp "configure and build"
# Only what this check needs: other backends' files do not stop it. (Every
# switch is given: build-gpu keeps what other scripts configured.)
fa_gpu_build build-gpu "test_cuda_attention test_cuda_compile test_cuda_standard test_cuda_standard_compile test_cubin_info test_vendor_runtimes fa-bench fa-info fa-run" \
  -DFA_CUDA=ON -DFA_HIP=OFF -DFA_HIP_NVIDIA=OFF -DFA_OPENCL=OFF || exit 1

# A small program that times tile shapes the planner may pick: it rebuilds
# a plan's kernels for each shape (as the tests do) and reports the median
# device time of each pass at the FlashAttention-2 benchmark setting.
cat > /tmp/fa_tiles.c <<'CSRC'
#include "dtype.h"
#include "flashattn.h"
#include "plan.h"
#include "planner.h"
#include "backends/cuda/cuda_runtime_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static void fill(fa_buffer b, size_t n, fa_dtype t, unsigned seed) {
    size_t es = fa_dtype_size(t); unsigned char *h = malloc(n * es); unsigned s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u; float f = ((s >> 9) / 8388608.0f - 0.5f) * 2.0f;
        if (es == 4) memcpy(h + 4 * i, &f, 4);
        else { unsigned short x = t == FA_DTYPE_BF16 ? fa_f32_to_bf16(f) : fa_f32_to_f16(f); memcpy(h + 2 * i, &x, 2); }
    }
    fa_buffer_upload(b, 0, h, n * es); free(h);
}
typedef struct { fa_variant v; int br, bc, thr, tr, tc, st; } shape;
static double time_pass(fa_plan p, fa_buffer *t, int bwd) {
    double ms[12];
    for (int i = 0; i < 14; i++) {
        fa_status s = bwd ? fa_backward(p, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8])
                          : fa_forward(p, t[0], t[1], t[2], t[3], t[4]);
        if (s != FA_SUCCESS) { fprintf(stderr, "%s\n", fa_last_error()); return -1; }
        double m; fa_plan_last_time_ms(p, &m); if (i >= 2) ms[i - 2] = m;
    }
    qsort(ms, 12, sizeof ms[0], cmp); return ms[6];
}
int main(int argc, char **argv) {
    fa_dtype dt = argc > 1 && !strcmp(argv[1], "bf16") ? FA_DTYPE_BF16 : argc > 1 && !strcmp(argv[1], "tf32") ? FA_DTYPE_F32 : FA_DTYPE_F16;
    int dim = argc > 2 ? atoi(argv[2]) : 128, n = argc > 3 ? atoi(argv[3]) : 8192, causal = argc > 4 ? atoi(argv[4]) : 0;
    fa_context ctx; if (fa_context_create(FA_BACKEND_CUDA, -1, &ctx)) { fprintf(stderr, "%s\n", fa_last_error()); return 1; }
    fa_attention_desc d; fa_attention_desc_init(&d);
    d.batch = 16384 / n; d.seqlen_q = d.seqlen_k = n; d.heads_q = d.heads_kv = 2048 / dim; d.head_dim = dim; d.causal = causal;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dt; d.allow_tf32 = dt == FA_DTYPE_F32;
    size_t nq = (size_t)d.batch * n * d.heads_q * dim; fa_buffer t[9];
    for (int i = 0; i < 9; i++) { size_t c = i == 4 ? (size_t)d.batch * d.heads_q * n : nq;
        if (fa_buffer_alloc(ctx, c * (i == 4 ? 4 : fa_dtype_size(dt)), &t[i])) return 1;
        if (i != 4) fill(t[i], c, dt, 7u + (unsigned)i); }
    fa_plan p; if (fa_plan_create(ctx, &d, &p)) { fprintf(stderr, "%s\n", fa_last_error()); return 1; }
    double flops = fa_attention_flops(&d, FA_PASS_FORWARD);
    const fa_kernel_plan *pf = &p->info.forward, *pb = &p->info.backward;
    printf("%s d%d N%d causal%d planned: fwd %s %dx%d/%d s%d, bwd %s %dx%d/%d s%d\n", argc > 1 ? argv[1] : "fp16", dim, n, causal,
           fa_variant_name(pf->variant), pf->br, pf->bc, pf->work_group_size, pf->stages,
           fa_variant_name(pb->variant), pb->br, pb->bc, pb->work_group_size, pb->stages);
    double f0 = time_pass(p, t, 0), b0 = time_pass(p, t, 1);
    printf("  planned            fwd %8.3f ms %6.1f TF/s   bwd %8.3f ms %6.1f TF/s\n", f0, flops / f0 * 1e-9, b0, 2.5 * flops / b0 * 1e-9);
    shape fs[] = {{FA_VARIANT_MMA,128,128,128,1,1,1},{FA_VARIANT_MMA,128,128,128,1,1,2},{FA_VARIANT_MMA,128,64,128,1,1,1},
                  {FA_VARIANT_MMA,128,64,128,1,1,2},{FA_VARIANT_MMA,128,32,128,1,1,2},{FA_VARIANT_MMA,128,64,256,1,1,2},
                  {FA_VARIANT_MMA,128,128,256,1,1,1},{FA_VARIANT_MMA,64,64,128,1,1,2},{FA_VARIANT_MMA,256,64,256,1,1,1},
                  {FA_VARIANT_MMA,256,64,256,1,1,2},{FA_VARIANT_MMA,256,128,256,1,1,1}};
    shape bs[] = {{FA_VARIANT_WGMMA,64,128,256,16,2,2},{FA_VARIANT_WGMMA,64,128,256,16,2,1},{FA_VARIANT_WGMMA,64,64,128,16,2,2},
                  {FA_VARIANT_MMA,64,128,256,1,1,2},{FA_VARIANT_MMA,32,128,256,1,1,2},{FA_VARIANT_MMA,64,64,128,1,1,2},
                  {FA_VARIANT_MMA,32,128,128,1,1,2},{FA_VARIANT_MMA,128,64,128,1,1,1},{FA_VARIANT_MMA,64,128,256,1,1,1}};
    for (int pass = 0; pass < 2; pass++) {
        shape *sh = pass ? bs : fs; int ns = pass ? (int)(sizeof bs / sizeof bs[0]) : (int)(sizeof fs / sizeof fs[0]);
        for (int i = 0; i < ns; i++) {
            fa_kernel_plan *kp = pass ? &p->info.backward : &p->info.forward, keep = *kp;
            kp->variant = sh[i].v; kp->br = sh[i].br; kp->bc = sh[i].bc; kp->work_group_size = sh[i].thr;
            kp->thread_rows = sh[i].tr; kp->thread_cols = sh[i].tc; kp->stages = sh[i].st;
            kp->local_mem_bytes = fa_plan_local_mem(sh[i].v, pass ? FA_PASS_BACKWARD : FA_PASS_FORWARD, &d, sh[i].br, sh[i].bc, sh[i].st);
            fa_cuda_plan_release(ctx->impl, p->impl); p->impl = NULL;
            if (fa_cuda_plan_prepare(ctx->impl, p, &p->impl) != FA_SUCCESS) {
                printf("  %s %3dx%-3d/%3d s%d  refused: %.90s\n", pass ? "bwd" : "fwd", sh[i].br, sh[i].bc, sh[i].thr, sh[i].st, fa_last_error());
            } else {
                double ms = time_pass(p, t, pass);
                printf("  %s %3dx%-3d/%3d s%d  %8.3f ms %6.1f TF/s\n", pass ? "bwd" : "fwd", sh[i].br, sh[i].bc, sh[i].thr, sh[i].st, ms,
                       (pass ? 2.5 : 1.0) * flops / ms * 1e-9);
            }
            *kp = keep; fa_cuda_plan_release(ctx->impl, p->impl); p->impl = NULL;
            if (fa_cuda_plan_prepare(ctx->impl, p, &p->impl) != FA_SUCCESS) return 1;
        }
    }
    fa_plan_destroy(p); for (int i = 0; i < 9; i++) fa_buffer_free(t[i]); fa_context_destroy(ctx); return 0;
}
CSRC
gcc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -DFA_WITH_CUDA -Iinclude -Icore -I. /tmp/fa_tiles.c \
  build-gpu/libflashattn.a -ldl -lpthread -lm -o build-gpu/fa-tiles > "$out/tiles-build.log" 2>&1 \
  || cat "$out/tiles-build.log"

if want tests; then
  stamp "CUDA tests"
  FA_TEST_LARGE=1 ctest --test-dir build-gpu -R "cuda_" --output-on-failure -j16 --timeout 300 \
    > "$out/cuda-tests.log" 2>&1
  echo "cuda tests: exit $?"
  grep -E "tests passed|Failed|\*\*\*|Skipped" "$out/cuda-tests.log" | head -40
  grep -E "CHECK failed|error" "$out/cuda-tests.log" | head -30
  # The error of every run (ctest keeps a passing case's output to itself).
  for c in mma_dtypes mma_head_dims mma_shapes mma_masks mma_deterministic_backward dtypes head_dims causal; do
    build-gpu/test_cuda_attention $c >> "$out/cuda-errors.log" 2>&1
  done
  python3 - "$out/cuda-errors.log" <<'PY'
import re, sys
worst = {}
for line in open(sys.argv[1]):
    m = re.search(r" (fp16|bf16|fp32) .* O ([0-9.e+-]+)(?: \(unfused ([0-9.e+-]+)\))?(?: dQ ([0-9.e+-]+) dK ([0-9.e+-]+) dV ([0-9.e+-]+))?", line)
    if not m:
        continue
    key = m.group(1) + (" (tf32 allowed)" if "mma" in line and m.group(1) == "fp32" else "")
    w = worst.setdefault(key, [0.0, 0.0, 0.0, 0])
    w[0] = max(w[0], float(m.group(2)))
    if m.group(3):
        w[1] = max(w[1], float(m.group(2)) / float(m.group(3)))
    w[2] = max([w[2]] + [float(x) for x in m.groups()[3:] if x])
    w[3] += 1
for k, (o, ratio, g, n) in sorted(worst.items()):
    print(f"{k}: {n} runs, worst O error {o:.2e} (at most {ratio:.2f}x unfused), worst gradient error {g:.2e}")
PY
fi

if want bench; then
  stamp "benchmark"
  json="$out/bench.jsonl"
  for dtype in fp16 bf16; do
    for dim in 64 128; do
      build-gpu/fa-bench --backend cuda --dtype "$dtype" --dim "$dim" --seqlens 4096,8192 --repeats 10 \
        --json "$json" --label cuda 2>/dev/null | grep fused | tee -a "$out/bench.txt"
    done
  done
  build-gpu/fa-bench --backend cuda --dtype fp16 --dim 128 --causal --seqlens 4096,8192 --repeats 10 \
    --json "$json" --label cuda-causal 2>/dev/null | grep fused | sed 's/^/causal /' | tee -a "$out/bench.txt"
  build-gpu/fa-bench --backend cuda --dtype fp32 --dim 128 --seqlens 4096 --repeats 5 \
    --json "$json" --label cuda-fp32 2>/dev/null | grep fused | tee -a "$out/bench.txt"
  python3 bench/sdpa_peer.py --dtypes fp16,bf16 --dims 64,128 --seqlens 4096,8192 --causal 0 \
    --backends flash,cudnn --json "$out/peer.jsonl" > "$out/peer.log" 2>&1
  python3 bench/sdpa_peer.py --dtypes fp16 --dims 128 --seqlens 4096,8192 --causal 1 \
    --backends flash --json "$out/peer.jsonl" >> "$out/peer.log" 2>&1
  python3 - "$out/peer.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "error" in r:
        print(r["algo"], r["dtype"], r["d"], r["n"], "error:", r["error"])
        continue
    print(f'{r["algo"]:6} {r["dtype"]:5} d{r["d"]:<4} N{r["n"]:<6} causal {int(r["causal"])} '
          f'fwd {r["fwd_ms"]:8.3f} ms {r["fwd_tflops"]:6.1f} TF/s  bwd {r["bwd_ms"]:8.3f} ms {r["bwd_tflops"]:6.1f} TF/s')
PY
fi

if want tiles; then
  stamp "tile shapes"
  for cfg in "fp16 128 8192 0" "bf16 64 8192 0" "fp16 128 8192 1"; do
    build-gpu/fa-tiles $cfg 2>&1 | tee -a "$out/tiles.txt"
  done
fi

if want sanitize; then
  stamp "compute-sanitizer"
  san=/usr/local/cuda/bin/compute-sanitizer
  command -v compute-sanitizer > /dev/null && san=$(command -v compute-sanitizer)
  "$san" --tool memcheck --error-exitcode 9 build-gpu/test_cuda_attention mma_dtypes > "$out/memcheck.log" 2>&1
  echo "memcheck (mma_dtypes): exit $?"; grep -E "ERROR SUMMARY" "$out/memcheck.log" | tail -1
  "$san" --tool memcheck --error-exitcode 9 build-gpu/test_cuda_attention varlen >> "$out/memcheck.log" 2>&1
  echo "memcheck (varlen, FP32 pipes): exit $?"; grep -E "ERROR SUMMARY" "$out/memcheck.log" | tail -1
  "$san" --tool memcheck --error-exitcode 9 build-gpu/test_cuda_attention wgmma_shapes >> "$out/memcheck.log" 2>&1
  echo "memcheck (wgmma_shapes): exit $?"; grep -E "ERROR SUMMARY" "$out/memcheck.log" | tail -1
  "$san" --tool racecheck --error-exitcode 9 build-gpu/fa-run --backend cuda --dtype fp16 --batch 1 --seqlen 200 \
    --heads 2 --dim 64 --causal > "$out/racecheck.log" 2>&1
  echo "racecheck (fa-run fp16 d64 causal): exit $?"; grep -E "RACECHECK SUMMARY" "$out/racecheck.log" | tail -1
  "$san" --tool racecheck --error-exitcode 9 build-gpu/fa-run --backend cuda --dtype fp16 --batch 1 --seqlen 300 \
    --heads 2 --dim 128 >> "$out/racecheck.log" 2>&1
  echo "racecheck (fa-run fp16 d128, warpgroup backward): exit $?"; grep -E "RACECHECK SUMMARY" "$out/racecheck.log" | tail -1
  "$san" --tool racecheck --error-exitcode 9 build-gpu/fa-run --backend cuda --dtype bf16 --batch 1 --seqlen 150 \
    --heads 4 --heads-kv 2 --dim 128 --dropout 0.2 --deterministic >> "$out/racecheck.log" 2>&1
  echo "racecheck (fa-run bf16 d128 gqa dropout deterministic): exit $?"; grep -E "RACECHECK SUMMARY" "$out/racecheck.log" | tail -1
  "$san" --tool racecheck --error-exitcode 9 build-gpu/fa-run --backend cuda --dtype fp32 --batch 1 --seqlen 130 \
    --heads 2 --dim 40 --dropout 0.2 >> "$out/racecheck.log" 2>&1
  echo "racecheck (fa-run fp32 d40 dropout, FP32 pipes): exit $?"; grep -E "RACECHECK SUMMARY" "$out/racecheck.log" | tail -1
fi
stamp "done"
