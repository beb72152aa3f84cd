/* fa-tma-tiles: the CUDA backend's warp-specialised forward (fwd_tma.cu)
 * in tile shapes the planner does not pick, beside the one it does, on the
 * FlashAttention-2 paper's setting (16k tokens, hidden 2048): per point
 * the planned forward and each forced tile's, median device time of the
 * repeats after two warm-ups, as TFLOP/s. The product schedule comes from
 * FLASHATTN_TMA_SCHEDULE as in the library. fp8: e4m3 inputs, O in bf16.
 *
 * With --pass bwd the same for the warp-specialised backward (bwd_mma.cu
 * built with TMA, as planned on sm_90 unless FLASHATTN_PLAN_TMA_BWD=0): BR
 * queries a step against BC keys in BC / 64 consumer warpgroups.
 *
 * Usage: fa-tma-tiles [--dtype fp16|bf16|fp8] [--dims 64,128]
 *        [--seqlens 2048,8192,16384] [--causal 0,1] [--repeats N]
 *        [--pass fwd|bwd] [--tiles BRxBC/STAGES,...]  (default forward
 *        128x128/2,128x128/3,192x128/2,128x64/3,64x128/2; backward
 *        64x128/2,128x128/2,64x64/2) */
#include "fa_internal.h"
#include "flashattn.h"
#include "plan.h"
#include "planner.h"
#include "test_util.h"
#ifdef FA_WITH_CUDA
#include "backends/cuda/cuda_runtime_internal.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 16

static int parse_list(const char *s, int *out) {
    int n = 0;
    while (s && *s && n < MAX_LIST) {
        out[n++] = atoi(s);
        s = strchr(s, ',');
        if (s) s++;
    }
    return n;
}

#ifdef FA_WITH_CUDA
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct tile {
    int br, bc, stages;
} tile;

/* Median time in ms of the pass (a backward after one forward for O and
 * L), over the repeats after two warm-ups; negative on failure. */
static double time_pass(fa_plan p, fa_buffer *t, fa_pass pass, int repeats) {
    double ms[64];
    if (repeats > 62) repeats = 62;
    if (pass == FA_PASS_BACKWARD && fa_forward(p, t[0], t[1], t[2], t[3], t[4]) != FA_SUCCESS) return -1.0;
    for (int i = 0; i < repeats + 2; i++) {
        const fa_status st = pass == FA_PASS_FORWARD
                                 ? fa_forward(p, t[0], t[1], t[2], t[3], t[4])
                                 : fa_backward(p, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
        double m = 0.0;
        if (st != FA_SUCCESS || fa_plan_last_time_ms(p, &m) != FA_SUCCESS) return -1.0;
        if (i >= 2) ms[i - 2] = m;
    }
    qsort(ms, (size_t)repeats, sizeof ms[0], cmp_double);
    return ms[repeats / 2];
}

/* A forced tile in the plan's pass. */
static void force(fa_plan p, const fa_attention_desc *d, fa_pass pass, const tile *t) {
    fa_kernel_plan *kp = pass == FA_PASS_FORWARD ? &p->info.forward : &p->info.backward;
    kp->variant = FA_VARIANT_WGMMA_TMA;
    kp->br = t->br;
    kp->bc = t->bc;
    kp->stages = t->stages;
    if (pass == FA_PASS_FORWARD) {
        kp->work_group_size = 128 * (t->br / 64 + 1);
        kp->thread_rows = 2;
        kp->thread_cols = t->bc / 4;
    } else {
        kp->work_group_size = 2 * t->bc + 128;
        kp->thread_rows = t->br / 4;
        kp->thread_cols = 2;
    }
    kp->local_mem_bytes = fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, pass, d, kp->br, kp->bc, kp->stages);
}

static int point(fa_context ctx, fa_dtype dt, fa_pass pass, int dim, int n, int causal, const tile *tiles, int ntiles,
                 int repeats) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 16384 / n > 0 ? 16384 / n : 1;
    d.seqlen_q = d.seqlen_k = n;
    d.heads_q = d.heads_kv = 2048 / dim;
    d.head_dim = dim;
    d.causal = causal;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dt;
    if (dt == FA_DTYPE_FP8_E4M3) d.o.dtype = FA_DTYPE_BF16;
    const int64_t elems = (int64_t)d.batch * n * d.heads_q * dim;
    /* q, k, v, o, lse, then dO, dQ, dK, dV */
    fa_buffer t[9] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    fa_rng rng;
    fa_rng_seed(&rng, 7);
    int rc = 1;
    const int nbuf = pass == FA_PASS_FORWARD ? 5 : 9;
    for (int i = 0; i < nbuf; i++) {
        const size_t bytes = i == 4 ? (size_t)d.batch * d.heads_q * n * 4
                                    : (size_t)elems * fa_dtype_size(i == 3 ? d.o.dtype : dt);
        if (fa_buffer_alloc(ctx, bytes, &t[i]) != FA_SUCCESS) goto done;
        if (i < 3 || i == 5) {
            void *h = fa_test_random_tensor(&rng, dt, elems);
            const fa_status st = h ? fa_buffer_upload(t[i], 0, h, bytes) : FA_ERR_OUT_OF_MEMORY;
            free(h);
            if (st != FA_SUCCESS) goto done;
        }
    }
    fa_plan p = NULL;
    if (fa_plan_create(ctx, &d, &p) != FA_SUCCESS) goto done;
    const double flops = fa_attention_flops(&d, pass);
    fa_kernel_plan *const kp = pass == FA_PASS_FORWARD ? &p->info.forward : &p->info.backward;
    const fa_kernel_plan keep = *kp;
    const double planned = time_pass(p, t, pass, repeats);
    printf("%s %s d%-3d N%-6d causal %d  planned %s %dx%d/%d: %6.1f TF/s |", pass == FA_PASS_FORWARD ? "fwd" : "bwd",
           fa_dtype_name(dt), dim, n, causal, fa_variant_name(keep.variant), keep.br, keep.bc, keep.stages,
           planned > 0 ? flops / planned * 1e-9 : 0.0);
    for (int i = 0; i < ntiles; i++) {
        force(p, &d, pass, &tiles[i]);
        fa_cuda_plan_release(ctx->impl, p->impl);
        p->impl = NULL;
        if (fa_cuda_plan_prepare(ctx->impl, p, &p->impl) != FA_SUCCESS) {
            printf(" %dx%d/%d refused |", tiles[i].br, tiles[i].bc, tiles[i].stages);
            fprintf(stderr, "%dx%d/%d: %s\n", tiles[i].br, tiles[i].bc, tiles[i].stages, fa_last_error());
        } else {
            const double ms = time_pass(p, t, pass, repeats);
            printf(" %dx%d/%d %6.1f |", tiles[i].br, tiles[i].bc, tiles[i].stages, ms > 0 ? flops / ms * 1e-9 : 0.0);
        }
        fflush(stdout);
        *kp = keep;
        fa_cuda_plan_release(ctx->impl, p->impl);
        p->impl = NULL;
        if (fa_cuda_plan_prepare(ctx->impl, p, &p->impl) != FA_SUCCESS) break;
    }
    printf("\n");
    fa_plan_destroy(p);
    rc = 0;
done:
    if (rc) fprintf(stderr, "d%d N%d: %s\n", dim, n, fa_last_error());
    for (int i = 0; i < 9; i++)
        if (t[i]) fa_buffer_free(t[i]);
    return rc;
}
#endif

int main(int argc, char **argv) {
    fa_dtype dt = FA_DTYPE_F16;
    int dims[MAX_LIST] = {64, 128}, ndims = 2, seqlens[MAX_LIST] = {2048, 8192, 16384}, nseq = 3;
    int causals[MAX_LIST] = {0, 1}, ncausal = 2, repeats = 10;
    const char *tiles_arg = NULL;
    fa_pass pass = FA_PASS_FORWARD;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dtype") == 0)
            dt = strcmp(argv[i + 1], "bf16") == 0  ? FA_DTYPE_BF16
                 : strcmp(argv[i + 1], "fp8") == 0 ? FA_DTYPE_FP8_E4M3
                                                   : FA_DTYPE_F16;
        else if (strcmp(argv[i], "--dims") == 0) ndims = parse_list(argv[i + 1], dims);
        else if (strcmp(argv[i], "--seqlens") == 0) nseq = parse_list(argv[i + 1], seqlens);
        else if (strcmp(argv[i], "--causal") == 0) ncausal = parse_list(argv[i + 1], causals);
        else if (strcmp(argv[i], "--repeats") == 0) repeats = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--tiles") == 0) tiles_arg = argv[i + 1];
        else if (strcmp(argv[i], "--pass") == 0) pass = strcmp(argv[i + 1], "bwd") == 0 ? FA_PASS_BACKWARD : FA_PASS_FORWARD;
        else {
            fprintf(stderr, "fa-tma-tiles: unknown option %s (see the comment at the top of bench/fa-tma-tiles.c)\n",
                    argv[i]);
            return 2;
        }
    }
    if (repeats < 1) repeats = 1;
    if (!tiles_arg)
        tiles_arg = pass == FA_PASS_FORWARD ? "128x128/2,128x128/3,192x128/2,128x64/3,64x128/2" : "64x128/2,128x128/2,64x64/2";
#ifdef FA_WITH_CUDA
    tile tiles[MAX_LIST];
    int ntiles = 0;
    for (const char *s = tiles_arg; s && *s && ntiles < MAX_LIST; ntiles++) {
        if (sscanf(s, "%dx%d/%d", &tiles[ntiles].br, &tiles[ntiles].bc, &tiles[ntiles].stages) != 3) {
            fprintf(stderr, "fa-tma-tiles: --tiles takes BRxBC/STAGES,...\n");
            return 2;
        }
        s = strchr(s, ',');
        if (s) s++;
    }
    fa_context ctx = NULL;
    if (fa_context_create(FA_BACKEND_CUDA, -1, &ctx) != FA_SUCCESS) {
        fprintf(stderr, "fa-tma-tiles: no CUDA device: %s\n", fa_last_error());
        return 1;
    }
    int rc = 0;
    for (int a = 0; a < ndims; a++)
        for (int c = 0; c < ncausal; c++)
            for (int s = 0; s < nseq; s++)
                rc |= point(ctx, dt, pass, dims[a], seqlens[s], causals[c], tiles, ntiles, repeats);
    fa_context_destroy(ctx);
    return rc;
#else
    (void)dt;
    (void)dims;
    (void)ndims;
    (void)seqlens;
    (void)nseq;
    (void)causals;
    (void)ncausal;
    (void)tiles_arg;
    (void)pass;
    fprintf(stderr, "fa-tma-tiles: this build has no CUDA backend\n");
    return 1;
#endif
}
