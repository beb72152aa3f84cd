#!/usr/bin/env bash
# On an NVIDIA GPU machine: times the OpenCL backend's kernel variants and
# tile shapes through NVIDIA's OpenCL, fp32, head_dim 64 and 128, N = 4096
# (16k tokens, hidden 2048: the bench/results/h200.md setting), so that one
# run shows whether the planner's choice is the fastest shape:
#   - the planner's plan for the device (fa_plan_create);
#   - the SIMT kernels' plan (what the planner chose before the streaming
#     kernels existed: the same device planned without them);
#   - other streaming tile shapes and micro-tiles, and the deterministic
#     streaming backward (dQ in a kernel of its own instead of atomics).
# Each shape is first checked against the fp64 CPU reference on a small
# problem, then timed (median of repeats after a warm-up, device events)
# beside the IO model's predicted roofline and the registers and spills
# NVIDIA's compiler reports for its kernels; the planner's shapes once more
# with registers capped at 128 (two work-groups per multiprocessor).
# PyTorch's SDPA memory-efficient backend runs on the same shapes in the
# same run where PyTorch is installed.
#
# Usage: bench/opencl_tiles.sh [SEQLEN] (default 4096). Environment: OUT
# (output folder, default ./gpu-out), REPEATS (default 10), DIMS (default
# "64 128"), TOKENS (batch x seqlen, default 16384). Writes
# $OUT/opencl-tiles.txt (the table), $OUT/opencl-tiles.jsonl,
# $OUT/opencl-tiles-regs128.txt/.jsonl and $OUT/opencl-tiles-peer.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
seqlen=${1:-4096}
repeats=${REPEATS:-10}
dims=${DIMS:-"64 128"}
tokens=${TOKENS:-16384}

fa_gpu_info
fa_nvidia_opencl || exit 1
stamp "building"
fa_gpu_build build-tiles "flashattn_static fa-info" -DFA_CUDA=OFF -DFA_HIP=OFF -DCMAKE_BUILD_TYPE=Release || exit 1

# The timing program: the public API, plus the plan internals the OpenCL
# tests use to run a tile shape other than the planner's.
src="$out/fa_tiles.c"
cat > "$src" <<'EOF'
#define _POSIX_C_SOURCE 200809L
#include "flashattn.h"
#include "plan.h"
#include "planner.h"
#include "reference.h"
#include "kernel_sources.h"
#include "backends/opencl/cl_backend.h"
#include "backends/opencl/cl_runtime_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FA_VARIANT_SIMT_STREAM
#define FA_VARIANT_SIMT_STREAM ((fa_variant)4)
#endif

typedef struct shape {
    fa_pass pass;
    fa_variant variant;
    int br, bc, tr, tc, deterministic;
    const char *what;
} shape;

static const char *vname(fa_variant v) { return v == FA_VARIANT_SIMT_STREAM ? "stream" : fa_variant_name(v); }

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / 16777216.0 * 2.0 - 1.0);
}

typedef struct tensors {
    fa_buffer b[9]; /* q k v o lse dout dq dk dv */
    float *h[9];
    size_t n[9];
} tensors;

static int tensors_make(fa_context ctx, const fa_attention_desc *d, tensors *t) {
    size_t nq = (size_t)d->batch * d->seqlen_q * d->heads_q * d->head_dim;
    size_t nk = (size_t)d->batch * d->seqlen_k * d->heads_kv * d->head_dim;
    size_t nl = (size_t)d->batch * d->heads_q * d->seqlen_q;
    size_t n[9] = {nq, nk, nk, nq, nl, nq, nq, nk, nk};
    for (int i = 0; i < 9; i++) {
        t->n[i] = n[i];
        t->h[i] = malloc(n[i] * sizeof(float));
        if (!t->h[i]) return 0;
        for (size_t j = 0; j < n[i]; j++) t->h[i][j] = i < 3 || i == 5 ? uniform() : NAN;
        if (fa_buffer_alloc(ctx, n[i] * sizeof(float), &t->b[i]) != FA_SUCCESS) return 0;
        if (fa_buffer_upload(t->b[i], 0, t->h[i], n[i] * sizeof(float)) != FA_SUCCESS) return 0;
    }
    return 1;
}

static void tensors_free(tensors *t) {
    for (int i = 0; i < 9; i++) {
        if (t->b[i]) fa_buffer_free(t->b[i]);
        free(t->h[i]);
    }
    memset(t, 0, sizeof *t);
}

/* The plan's kernels for a pass rebuilt for a shape (as tests/test_opencl_attention.c). */
static fa_status force(fa_plan plan, const shape *s) {
    fa_kernel_plan *kp = s->pass == FA_PASS_FORWARD ? &plan->info.forward : &plan->info.backward;
    fa_cl_plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    kp->variant = s->variant;
    kp->br = s->br;
    kp->bc = s->bc;
    kp->thread_rows = s->tr;
    kp->thread_cols = s->tc;
    kp->work_group_size = (s->br / s->tr) * (s->bc / s->tc);
    kp->split_k = 1;
    kp->stages = 1;
    kp->local_mem_bytes = fa_plan_local_mem(s->variant, s->pass, &plan->desc, s->br, s->bc, 1);
    kp->num_work_groups = s->pass == FA_PASS_FORWARD
                              ? plan->desc.batch * plan->desc.heads_q * ((plan->desc.seqlen_q + s->br - 1) / s->br)
                              : plan->desc.batch * plan->desc.heads_kv * ((plan->desc.seqlen_k + s->bc - 1) / s->bc);
    return fa_cl_plan_prepare(plan->ctx->impl, plan, &plan->impl);
}

static fa_status run(fa_plan plan, const tensors *t, fa_pass pass) {
    if (pass == FA_PASS_FORWARD) return fa_forward(plan, t->b[0], t->b[1], t->b[2], t->b[3], t->b[4]);
    return fa_backward(plan, t->b[0], t->b[1], t->b[2], t->b[3], t->b[4], t->b[5], t->b[6], t->b[7], t->b[8]);
}

static double rel_error(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        num += e * e;
        den += b[i] * b[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* The shape on a small problem against the fp64 reference: the largest
 * relative error of the pass's outputs (NaN where it did not run). */
static double check(fa_context ctx, const fa_attention_desc *big, const shape *s) {
    fa_attention_desc d = *big;
    d.batch = 1;
    d.seqlen_q = d.seqlen_k = 333;
    d.heads_q = d.heads_kv = 2;
    fa_plan plan = NULL;
    tensors t;
    memset(&t, 0, sizeof t);
    double err = NAN;
    if (fa_plan_create(ctx, &d, &plan) != FA_SUCCESS || force(plan, s) != FA_SUCCESS || !tensors_make(ctx, &d, &t))
        goto out;
    if (run(plan, &t, FA_PASS_FORWARD) != FA_SUCCESS) goto out;
    if (s->pass == FA_PASS_BACKWARD && run(plan, &t, FA_PASS_BACKWARD) != FA_SUCCESS) goto out;
    for (int i = 3; i < 9; i++)
        if (fa_buffer_download(t.b[i], 0, t.h[i], t.n[i] * sizeof(float)) != FA_SUCCESS) goto out;
    double *x[9] = {0};
    for (int i = 0; i < 9; i++) {
        x[i] = malloc(t.n[i] * sizeof(double));
        if (!x[i]) goto free_x;
        for (size_t j = 0; j < t.n[i]; j++) x[i][j] = t.h[i][j];
    }
    if (s->pass == FA_PASS_FORWARD) {
        double *o = malloc(t.n[3] * sizeof(double)), *l = malloc(t.n[4] * sizeof(double));
        if (o && l) {
            fa_ref_forward_f64(&d, x[0], x[1], x[2], o, l);
            err = rel_error(t.h[3], o, t.n[3]);
        }
        free(o);
        free(l);
    } else {
        double *g[3] = {malloc(t.n[6] * sizeof(double)), malloc(t.n[7] * sizeof(double)), malloc(t.n[8] * sizeof(double))};
        if (g[0] && g[1] && g[2]) {
            /* From the device's O and L, as the kernels. */
            fa_ref_backward_f64(&d, x[0], x[1], x[2], x[3], x[4], x[5], g[0], g[1], g[2]);
            err = 0.0;
            for (int i = 0; i < 3; i++) err = fmax(err, rel_error(t.h[6 + i], g[i], t.n[6 + i]));
        }
        for (int i = 0; i < 3; i++) free(g[i]);
    }
free_x:
    for (int i = 0; i < 9; i++) free(x[i]);
out:
    tensors_free(&t);
    if (plan) fa_plan_destroy(plan);
    return err;
}

/* NVIDIA's compiler report (-cl-nv-verbose) for a shape's kernels, built
 * as cl_attention.c builds them: registers, spills, stack per kernel. */
static void compiler_report(fa_context ctx, const fa_attention_desc *d, const shape *s, char *out, size_t size) {
    out[0] = '\0';
    fa_cl_context *cl = ctx->impl;
    const int fwd = s->pass == FA_PASS_FORWARD;
    const char *paths[3] = {"kernels_cl/common.h", fwd ? "kernels_cl/fwd.cl" : "kernels_cl/bwd_common.cl", "kernels_cl/bwd.cl"};
    const int stream = s->variant == FA_VARIANT_SIMT_STREAM;
    char options[512];
    snprintf(options, sizeof options, "-DBR=%d -DBC=%d -DTR=%d -DTC=%d -DHEAD_DIM=%d -DDTYPE_F32%s%s -cl-nv-verbose",
             s->br, s->bc, s->tr, s->tc, d->head_dim, stream ? " -DFA_GPU -DFA_STREAM" : "",
             stream && s->pass == FA_PASS_BACKWARD && !s->deterministic ? " -DDQ_ATOMIC -DFA_NV_PTX" : "");
    const char *env = getenv("FLASHATTN_OPENCL_OPTIONS");
    if (env && env[0]) {
        strncat(options, " ", sizeof options - strlen(options) - 1);
        strncat(options, env, sizeof options - strlen(options) - 1);
    }
    const int wg = (s->br / s->tr) * (s->bc / s->tc);
    if (wg > 256) {
        char regs[48];
        snprintf(regs, sizeof regs, " -cl-nv-maxrregcount=%d", 65536 / wg / 8 * 8);
        strncat(options, regs, sizeof options - strlen(options) - 1);
    }
    const int count = fwd ? 2 : 3;
    size_t total = 0;
    const fa_kernel_source *src[3];
    for (int i = 0; i < count; i++) {
        src[i] = fa_kernel_source_find(paths[i]);
        if (!src[i]) return;
        total += src[i]->size + 1;
    }
    char *text = malloc(total + 1);
    if (!text) return;
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        memcpy(text + at, src[i]->text, src[i]->size);
        at += src[i]->size;
        text[at++] = '\n';
    }
    cl_program program = NULL;
    if (fa_cl_build_text(cl, text, at, options, 0, &program, NULL) == FA_SUCCESS) {
        size_t n = 0;
        fa_cl.clGetProgramBuildInfo(program, cl->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
        char *log = malloc(n + 1);
        if (log && fa_cl.clGetProgramBuildInfo(program, cl->device, CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS) {
            log[n] = '\0';
            /* "Compiling entry function 'fa_x'", then its stack/spill and
             * register lines: one "name regs/spill" entry per kernel. */
            const char *name = NULL;
            for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
                char *q;
                int regs = 0, spill = 0;
                if ((q = strstr(line, "entry function '"))) name = q + 16;
                if ((q = strstr(line, "bytes spill stores")) != NULL) {
                    while (q > line && q[-1] == ' ') q--;
                    while (q > line && q[-1] >= '0' && q[-1] <= '9') q--;
                    spill = atoi(q);
                    if (spill) {
                        size_t len = strlen(out);
                        snprintf(out + len, size - len, " spill %d B", spill);
                    }
                }
                if ((q = strstr(line, "Used ")) && sscanf(q, "Used %d registers", &regs) == 1 && name) {
                    const char *end = strchr(name, '\'');
                    size_t len = strlen(out);
                    snprintf(out + len, size - len, "%s%.*s %d", len ? ", " : "", (int)(end ? end - name : 8), name,
                             regs);
                }
            }
        }
        free(log);
        fa_cl.clReleaseProgram(program);
    }
    free(text);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    /* seqlen repeats json tokens dims... */
    const int n = argc > 1 ? atoi(argv[1]) : 4096, repeats = argc > 2 ? atoi(argv[2]) : 10;
    const char *json = argc > 3 ? argv[3] : NULL;
    const int tokens = argc > 4 ? atoi(argv[4]) : 16384;
    FILE *jf = json ? fopen(json, "a") : NULL;
    fa_context ctx;
    if (fa_context_create(FA_BACKEND_OPENCL, -1, &ctx) != FA_SUCCESS) {
        fprintf(stderr, "no OpenCL device: %s\n", fa_last_error());
        return 1;
    }
    fa_device_info info;
    fa_context_get_info(ctx, &info);
    printf("device: %s (driver %s), %zu bytes of local memory, work-groups <= %d\n", info.desc.name,
           info.driver_version, info.desc.local_mem_bytes, info.desc.max_work_group_size);
    const int nvidia = strstr(info.desc.vendor, "NVIDIA") != NULL;
    for (int ai = 5; ai < argc; ai++) {
        const int dim = atoi(argv[ai]);
        fa_attention_desc d;
        fa_attention_desc_init(&d);
        d.batch = tokens / n > 0 ? tokens / n : 1;
        d.seqlen_q = d.seqlen_k = n;
        d.heads_q = d.heads_kv = 2048 / dim;
        d.head_dim = dim;
        d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F32;
        fa_plan_info mine, simt;
        fa_device_desc simt_dev = info.desc;
        simt_dev.backend = FA_BACKEND_HIP; /* a backend without the streaming kernels */
        if (fa_plan_for_device(&info.desc, &d, &mine) != FA_SUCCESS ||
            fa_plan_for_device(&simt_dev, &d, &simt) != FA_SUCCESS) {
            fprintf(stderr, "planning d %d: %s\n", dim, fa_last_error());
            return 1;
        }
        shape shapes[40];
        int count = 0;
        /* FA_TILES_PLANNER_ONLY: the planner's shapes (and the SIMT plan) only. */
        const int planner_only = getenv("FA_TILES_PLANNER_ONLY") != NULL;
        for (int pass = 0; pass < 2; pass++) {
            const fa_kernel_plan *a = pass ? &mine.backward : &mine.forward, *b = pass ? &simt.backward : &simt.forward;
            shapes[count++] = (shape){(fa_pass)pass, a->variant, a->br, a->bc, a->thread_rows, a->thread_cols, 0, "planner"};
            shapes[count++] = (shape){(fa_pass)pass, b->variant, b->br, b->bc, b->thread_rows, b->thread_cols, 0, "simt plan"};
            if (pass == FA_PASS_BACKWARD && a->variant == FA_VARIANT_SIMT_STREAM)
                shapes[count++] = (shape){(fa_pass)pass, a->variant, a->br, a->bc, a->thread_rows, a->thread_cols, 1,
                                          "planner, deterministic"};
        }
        static const int fwd_tiles[][4] = {{128, 64, 8, 4}, {128, 64, 4, 8}, {128, 64, 4, 4}, {128, 32, 8, 4},
                                           {128, 32, 4, 4}, {64, 64, 4, 4}, {64, 64, 8, 4}, {64, 64, 4, 8}};
        static const int bwd_tiles[][4] = {{64, 64, 4, 4}, {128, 64, 8, 4}, {128, 64, 4, 4}, {32, 128, 4, 4},
                                           {64, 128, 4, 4}, {64, 64, 8, 4}, {64, 64, 4, 8}, {32, 64, 4, 4}};
        for (size_t i = 0; i < sizeof fwd_tiles / sizeof fwd_tiles[0] && !planner_only; i++)
            shapes[count++] = (shape){FA_PASS_FORWARD, FA_VARIANT_SIMT_STREAM, fwd_tiles[i][0], fwd_tiles[i][1],
                                      fwd_tiles[i][2], fwd_tiles[i][3], 0, "stream"};
        for (size_t i = 0; i < sizeof bwd_tiles / sizeof bwd_tiles[0] && !planner_only; i++)
            shapes[count++] = (shape){FA_PASS_BACKWARD, FA_VARIANT_SIMT_STREAM, bwd_tiles[i][0], bwd_tiles[i][1],
                                      bwd_tiles[i][2], bwd_tiles[i][3], 0, "stream"};

        tensors t;
        memset(&t, 0, sizeof t);
        if (!tensors_make(ctx, &d, &t)) {
            fprintf(stderr, "allocating d %d: %s\n", dim, fa_last_error());
            return 1;
        }
        printf("\nbatch %d, seqlen %d, heads %d, head_dim %d, fp32\n", d.batch, n, d.heads_q, dim);
        printf("%-4s %-7s %-9s %-6s %5s %9s %9s %9s %9s  %s\n", "pass", "variant", "tile", "micro", "wg", "ms",
               "TFLOP/s", "model ms", "error", "(kernel registers, from NVIDIA's compiler)");
        for (int i = 0; i < count; i++) {
            const shape *s = &shapes[i];
            int dup = 0;
            for (int j = 0; j < i; j++)
                dup |= shapes[j].pass == s->pass && shapes[j].variant == s->variant && shapes[j].br == s->br &&
                       shapes[j].bc == s->bc && shapes[j].tr == s->tr && shapes[j].tc == s->tc &&
                       shapes[j].deterministic == s->deterministic;
            if (dup) continue;
            const int wg = (s->br / s->tr) * (s->bc / s->tc);
            const char *pass = s->pass == FA_PASS_FORWARD ? "fwd" : "bwd";
            char tile[32], micro[16];
            snprintf(tile, sizeof tile, "%dx%d", s->br, s->bc);
            snprintf(micro, sizeof micro, "%dx%d", s->tr, s->tc);
            fa_attention_desc dd = d;
            dd.deterministic = s->deterministic;
            size_t local = fa_plan_local_mem(s->variant, s->pass, &dd, s->br, s->bc, 1);
            if (wg > info.desc.max_work_group_size || local > info.desc.local_mem_bytes) {
                printf("%-4s %-7s %-9s %-6s %5d  does not fit (%zu bytes of local memory)\n", pass, vname(s->variant),
                       tile, micro, wg, local);
                continue;
            }
            double err = check(ctx, &dd, s);
            fa_plan plan = NULL;
            double ms = NAN;
            fa_cost model;
            memset(&model, 0, sizeof model);
            if (fa_plan_create(ctx, &dd, &plan) == FA_SUCCESS && force(plan, s) == FA_SUCCESS) {
                const fa_kernel_plan *kp = s->pass == FA_PASS_FORWARD ? &plan->info.forward : &plan->info.backward;
                model = fa_io_fused(&info.desc, &dd, s->pass, kp);
                double times[101];
                int r = repeats < 1 ? 1 : repeats > 100 ? 100 : repeats, ok = 1;
                if (s->pass == FA_PASS_BACKWARD) ok &= run(plan, &t, FA_PASS_FORWARD) == FA_SUCCESS;
                for (int k = -2; k < r && ok; k++) {
                    ok &= run(plan, &t, s->pass) == FA_SUCCESS && fa_context_synchronize(ctx) == FA_SUCCESS;
                    double tm = NAN;
                    ok &= fa_plan_last_time_ms(plan, &tm) == FA_SUCCESS;
                    if (k >= 0) times[k] = tm;
                }
                if (ok) {
                    qsort(times, (size_t)r, sizeof(double), cmp);
                    ms = times[r / 2];
                }
            }
            const char *why = isnan(ms) ? fa_last_error() : "";
            const double tflops = fa_attention_flops(&dd, s->pass) / ms * 1e-9;
            char regs[256] = "";
            if (nvidia) compiler_report(ctx, &dd, s, regs, sizeof regs);
            printf("%-4s %-7s %-9s %-6s %5d %9.3f %9.2f %9.3f %9.2e  %s%s%s%s%s%s\n", pass, vname(s->variant), tile,
                   micro, wg, ms, tflops, model.roofline_ms, err, s->what, why[0] ? ": " : "", why, regs[0] ? " (" : "",
                   regs, regs[0] ? ")" : "");
            fflush(stdout);
            if (jf)
                fprintf(jf,
                        "{\"seqlen\": %d, \"dim\": %d, \"pass\": \"%s\", \"variant\": \"%s\", \"br\": %d, \"bc\": %d, "
                        "\"tr\": %d, \"tc\": %d, \"wg\": %d, \"deterministic\": %d, \"what\": \"%s\", \"ms\": %.6g, "
                        "\"tflops\": %.6g, \"model_ms\": %.6g, \"error\": %.3g}\n",
                        n, dim, pass, vname(s->variant), s->br, s->bc, s->tr, s->tc, wg, s->deterministic, s->what,
                        isnan(ms) ? -1.0 : ms, isnan(ms) ? -1.0 : tflops, model.roofline_ms, isnan(err) ? -1.0 : err);
            if (plan) fa_plan_destroy(plan);
        }
        tensors_free(&t);
    }
    if (jf) fclose(jf);
    fa_context_destroy(ctx);
    return 0;
}
EOF
cc -std=c11 -O2 -Iinclude -Icore -I. "$src" build-tiles/libflashattn.a -ldl -lm -lpthread -o "$out/fa-tiles" \
  > "$out/fa-tiles-build.log" 2>&1 || { cat "$out/fa-tiles-build.log"; exit 1; }

build-tiles/fa-info --backend opencl --seqlen "$seqlen" --dim 128 --dtype fp32 > "$out/fa-info-tiles.txt" 2>&1
rm -f "$out/opencl-tiles.jsonl"
stamp "timing"
# shellcheck disable=SC2086  # dims is a list
"$out/fa-tiles" "$seqlen" "$repeats" "$out/opencl-tiles.jsonl" "$tokens" $dims | tee "$out/opencl-tiles.txt"

# The planner's shapes again with registers capped at 128 a work-item: two
# 256-item work-groups per multiprocessor instead of one, at the price of
# the spills the compiler reports (FLASHATTN_OPENCL_OPTIONS: cl_attention.c).
stamp "timing the planner's shapes with -cl-nv-maxrregcount=128"
# shellcheck disable=SC2086
FA_TILES_PLANNER_ONLY=1 FLASHATTN_OPENCL_OPTIONS="-cl-nv-maxrregcount=128" \
  "$out/fa-tiles" "$seqlen" "$repeats" "$out/opencl-tiles-regs128.jsonl" "$tokens" $dims \
  | tee "$out/opencl-tiles-regs128.txt"

if python3 -c "import torch" > /dev/null 2>&1; then
  stamp "PyTorch SDPA on the same shapes"
  python3 bench/sdpa_peer.py --dtypes fp32 --dims "$(echo "$dims" | tr ' ' ,)" --seqlens "$seqlen" --causal 0 \
    --tokens "$tokens" --backends efficient --json "$out/opencl-tiles-peer.jsonl" > "$out/opencl-tiles-peer.log" 2>&1
  tail -20 "$out/opencl-tiles-peer.log"
fi
stamp "done: $out/opencl-tiles.txt"
