/* fa-mma-compare: the HIP backend's matrix-core kernels (through the
 * HIP-on-CUDA mapping on an NVIDIA GPU) beside the CUDA backend's mma.sync
 * kernels, on the same shapes in one run: the FlashAttention-2 paper's
 * setting (16k tokens, hidden 2048), fp16 and bf16, head_dim 64 and 128,
 * causal and not, forward and backward. Per point the median device time
 * of the repeats after warm-up, TFLOP/s (FLOPs as fa_attention_flops
 * counts them) and HIP / CUDA; a table on stdout and JSON lines (--json).
 *
 * The CUDA backend plans warpgroup kernels (wgmma) on sm_90; the
 * comparison is with its mma.sync kernels, the HIP path's instruction:
 * their plan is the one the planner makes for the same device without the
 * warpgroup path (described as a later architecture, where the mma.sync
 * rules of sm_90 hold and wgmma does not exist), prepared by the CUDA
 * backend for the device's own architecture. */
#include "fa_internal.h"
#include "cli.h"
#include "flashattn.h"
#include "plan.h"
#include "planner.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEQLENS 16
#define POOL_ELEMS ((int64_t)1 << 22)

typedef struct opts {
    int seqlens[MAX_SEQLENS], n_seqlens;
    int repeats, warmup;
    const char *json, *label;
} opts;

static int usage(void) {
    fprintf(stderr,
            "usage: fa-mma-compare [--seqlens N,N,...] [--repeats N] [--warmup N] [--json FILE] [--label TEXT]\n"
            "  16k tokens (batch = 16384 / N), 2048 / head_dim heads, fp16 and bf16, head_dim 64 and 128,\n"
            "  causal and not; defaults: --seqlens 2048,4096,8192,16384 --repeats 10 --warmup 2\n");
    return 2;
}

static int parse(opts *o, int argc, char **argv) {
    static const int dflt[] = {2048, 4096, 8192, 16384};
    memcpy(o->seqlens, dflt, sizeof dflt);
    o->n_seqlens = 4;
    o->repeats = 10;
    o->warmup = 2;
    o->json = NULL;
    o->label = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (strcmp(a, "--seqlens") == 0) {
            o->n_seqlens = fa_cli_int_list(v, 1, 16384, o->seqlens, MAX_SEQLENS);
            if (o->n_seqlens < 0) return usage();
            for (int k = 0; k < o->n_seqlens; k++)
                if (16384 % o->seqlens[k]) return usage();
        } else if (strcmp(a, "--repeats") == 0) {
            o->repeats = atoi(v);
        } else if (strcmp(a, "--warmup") == 0) {
            o->warmup = atoi(v);
        } else if (strcmp(a, "--json") == 0) {
            o->json = v;
        } else if (strcmp(a, "--label") == 0) {
            o->label = v;
        } else {
            return usage();
        }
        i++;
    }
    return o->repeats > 0 && o->repeats <= 1000 && o->warmup >= 0 && o->n_seqlens > 0 ? 0 : usage();
}

/* One backend's device and tensors. */
typedef struct side {
    const char *name;
    fa_context ctx;
    fa_buffer t[9]; /* q k v o dout dq dk dv lse */
} side;

static void free_tensors(side *s) {
    for (int i = 0; i < 9; i++)
        if (s->t[i]) fa_buffer_free(s->t[i]);
    memset(s->t, 0, sizeof s->t);
}

static fa_status fill(fa_buffer b, size_t bytes, const void *pool, size_t pool_bytes) {
    for (size_t at = 0; at < bytes; at += pool_bytes) {
        const size_t n = bytes - at < pool_bytes ? bytes - at : pool_bytes;
        FA_CHECK(fa_buffer_upload(b, at, pool, n));
    }
    return FA_SUCCESS;
}

static fa_status alloc_tensors(side *s, const fa_attention_desc *d, const void *pool, size_t pool_bytes) {
    const size_t e = d->q.dtype == FA_DTYPE_F32 ? 4 : 2;
    const size_t qn = (size_t)d->batch * (size_t)d->seqlen_q * (size_t)d->heads_q * (size_t)d->head_dim;
    const size_t kn = (size_t)d->batch * (size_t)d->seqlen_k * (size_t)d->heads_kv * (size_t)d->head_dim;
    const size_t bytes[9] = {qn * e, kn * e, kn * e, qn * e, qn * e, qn * e, kn * e, kn * e,
                             (size_t)d->batch * (size_t)d->heads_q * (size_t)d->seqlen_q * 4};
    for (int i = 0; i < 9; i++) {
        fa_status st = fa_buffer_alloc(s->ctx, bytes[i], &s->t[i]);
        if (st == FA_SUCCESS && (i < 3 || i == 4)) st = fill(s->t[i], bytes[i], pool, pool_bytes);
        if (st != FA_SUCCESS) return st;
    }
    return FA_SUCCESS;
}

/* The CUDA backend's mma.sync plan for the device (see the top). */
static fa_status mma_sync_plan(fa_plan plan) {
    fa_device_desc dev = plan->ctx->info.desc;
    snprintf(dev.arch, sizeof dev.arch, "sm_100");
    fa_plan_info info;
    FA_CHECK(fa_plan_for_device(&dev, &plan->desc, &info));
    plan->ctx->ops->plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    plan->info = info;
    return plan->ctx->ops->plan_prepare(plan->ctx->impl, plan, &plan->impl);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of a pass over the repeats after warm-up. */
static fa_status time_pass(const opts *o, fa_plan plan, side *s, int backward, double *ms) {
    double times[1000];
    for (int i = 0; i < o->warmup + o->repeats; i++) {
        fa_status st = backward ? fa_backward(plan, s->t[0], s->t[1], s->t[2], s->t[3], s->t[8], s->t[4], s->t[5],
                                              s->t[6], s->t[7])
                                : fa_forward(plan, s->t[0], s->t[1], s->t[2], s->t[3], s->t[8]);
        if (st == FA_SUCCESS && i >= o->warmup) st = fa_plan_last_time_ms(plan, &times[i - o->warmup]);
        if (st != FA_SUCCESS) return st;
    }
    qsort(times, (size_t)o->repeats, sizeof times[0], cmp_double);
    *ms = o->repeats % 2 ? times[o->repeats / 2] : 0.5 * (times[o->repeats / 2 - 1] + times[o->repeats / 2]);
    return FA_SUCCESS;
}

typedef struct point {
    double ms[2];      /* forward, backward */
    char tile[2][48];  /* variant and tile per pass */
    int ok;
} point;

static void run_side(const opts *o, side *s, const fa_attention_desc *d, int cuda, point *p) {
    memset(p, 0, sizeof *p);
    fa_plan plan = NULL;
    fa_status st = fa_plan_create(s->ctx, d, &plan);
    if (st == FA_SUCCESS && cuda) st = mma_sync_plan(plan);
    for (int pass = 0; st == FA_SUCCESS && pass < 2; pass++) {
        st = time_pass(o, plan, s, pass, &p->ms[pass]);
        const fa_kernel_plan *kp = pass ? &plan->info.backward : &plan->info.forward;
        snprintf(p->tile[pass], sizeof p->tile[pass], "%s %dx%d/%dx%d wg%d", fa_variant_name(kp->variant), kp->br,
                 kp->bc, kp->thread_rows, kp->thread_cols, kp->work_group_size);
    }
    if (st != FA_SUCCESS)
        fprintf(stderr, "%s: %s: %s\n", s->name, fa_status_string(st), fa_last_error());
    p->ok = st == FA_SUCCESS;
    if (plan) fa_plan_destroy(plan);
}

int main(int argc, char **argv) {
    opts o;
    if (parse(&o, argc, argv)) return 2;
    side sides[2] = {{"hip", NULL, {NULL}}, {"cuda", NULL, {NULL}}};
    const fa_backend ids[2] = {FA_BACKEND_HIP, FA_BACKEND_CUDA};
    for (int i = 0; i < 2; i++)
        if (fa_context_create(ids[i], -1, &sides[i].ctx) != FA_SUCCESS) {
            fprintf(stderr, "fa-mma-compare: no %s device: %s\n", sides[i].name, fa_last_error());
            return 1;
        }
    fa_device_info info;
    if (fa_context_get_info(sides[0].ctx, &info) == FA_SUCCESS)
        printf("HIP device: %s (%s), CUDA device alike; TFLOP/s, median of %d after %d warm-up\n", info.desc.name,
               info.desc.arch, o.repeats, o.warmup);
    FILE *json = o.json ? fopen(o.json, "a") : NULL;
    fa_rng rng;
    fa_rng_seed(&rng, 7);
    void *pools[2] = {fa_test_random_tensor(&rng, FA_DTYPE_F16, POOL_ELEMS),
                      fa_test_random_tensor(&rng, FA_DTYPE_BF16, POOL_ELEMS)};
    if (!pools[0] || !pools[1] || (o.json && !json)) {
        fprintf(stderr, "fa-mma-compare: out of host memory or cannot open %s\n", o.json ? o.json : "");
        return 1;
    }
    printf("%-5s %4s %6s %6s | %8s %8s %6s | %8s %8s %6s | tiles hip fwd, bwd; cuda fwd, bwd\n", "dtype", "dim", "N",
           "causal", "hip fwd", "cuda fwd", "ratio", "hip bwd", "cuda bwd", "ratio");
    double log_sum[2] = {0, 0};
    int n_ratio[2] = {0, 0}, failed = 0;
    for (int t = 0; t < 2; t++)
        for (int dim = 64; dim <= 128; dim += 64)
            for (int i = 0; i < o.n_seqlens; i++)
                for (int causal = 0; causal < 2; causal++) {
                    const int n = o.seqlens[i];
                    fa_attention_desc d;
                    fa_attention_desc_init(&d);
                    d.batch = 16384 / n;
                    d.seqlen_q = d.seqlen_k = n;
                    d.heads_q = d.heads_kv = 2048 / dim;
                    d.head_dim = dim;
                    d.causal = causal;
                    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t ? FA_DTYPE_BF16 : FA_DTYPE_F16;
                    point p[2];
                    for (int s = 0; s < 2; s++) {
                        fa_status st = alloc_tensors(&sides[s], &d, pools[t], (size_t)POOL_ELEMS * 2);
                        if (st == FA_SUCCESS)
                            run_side(&o, &sides[s], &d, s == 1, &p[s]);
                        else {
                            fprintf(stderr, "%s: allocation: %s\n", sides[s].name, fa_last_error());
                            p[s].ok = 0;
                        }
                        free_tensors(&sides[s]);
                    }
                    double tf[2][2] = {{0, 0}, {0, 0}};
                    for (int s = 0; s < 2; s++)
                        for (int pass = 0; pass < 2; pass++)
                            if (p[s].ok)
                                tf[s][pass] = fa_attention_flops(&d, (fa_pass)pass) / (p[s].ms[pass] * 1e-3) / 1e12;
                    double ratio[2] = {0, 0};
                    for (int pass = 0; pass < 2; pass++)
                        if (p[0].ok && p[1].ok) {
                            ratio[pass] = tf[0][pass] / tf[1][pass];
                            log_sum[pass] += log(ratio[pass]);
                            n_ratio[pass]++;
                        }
                    failed += !p[0].ok || !p[1].ok;
                    printf("%-5s %4d %6d %6d | %8.1f %8.1f %6.2f | %8.1f %8.1f %6.2f | %s, %s; %s, %s\n",
                           fa_dtype_name(d.q.dtype), dim, n, causal, tf[0][0], tf[1][0], ratio[0], tf[0][1], tf[1][1],
                           ratio[1], p[0].tile[0], p[0].tile[1], p[1].tile[0], p[1].tile[1]);
                    fflush(stdout);
                    for (int s = 0; json && s < 2; s++)
                        for (int pass = 0; pass < 2 && p[s].ok; pass++)
                            fprintf(json,
                                    "{\"label\": \"%s\", \"backend\": \"%s\", \"kernels\": \"%s\", \"dtype\": \"%s\", "
                                    "\"head_dim\": %d, \"seqlen\": %d, \"batch\": %d, \"heads\": %d, \"causal\": %d, "
                                    "\"pass\": \"%s\", \"ms\": %.6f, \"tflops\": %.3f, \"plan\": \"%s\"}\n",
                                    o.label, sides[s].name, s ? "mma.sync" : "hip matrix cores", fa_dtype_name(d.q.dtype),
                                    dim, n, d.batch, d.heads_q, causal, pass ? "bwd" : "fwd", p[s].ms[pass],
                                    tf[s][pass], p[s].tile[pass]);
                }
    for (int pass = 0; pass < 2; pass++)
        if (n_ratio[pass])
            printf("%s: HIP / CUDA mma.sync geometric mean %.2f over %d points (bar: 0.7)\n", pass ? "backward" : "forward",
                   exp(log_sum[pass] / n_ratio[pass]), n_ratio[pass]);
    if (json) fclose(json);
    free(pools[0]);
    free(pools[1]);
    for (int i = 0; i < 2; i++) fa_context_destroy(sides[i].ctx);
    return failed ? 1 : 0;
}
