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
 * backend for the device's own architecture.
 *
 * --hip-bwd TILES times the HIP backward with other tiles beside the
 * planner's (a sweep: BRxBC/TRxTC/STAGES, comma-separated; the micro-tile
 * names the geometry as the planner's plans do, and a tile the kernels
 * cannot run on the device is refused), each against the same CUDA time;
 * --dims, --dtypes and --bwd-only narrow the points. */
#include "fa_internal.h"
#include "cli.h"
#include "flashattn.h"
#include "plan.h"
#include "planner.h"
#include "planner_hip_mma.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEQLENS 16
#define MAX_TILES 8
#define POOL_ELEMS ((int64_t)1 << 22)

/* A backward tile for the HIP side: br x bc, micro-tile tr x tc, stages;
 * br 0: the planner's. */
typedef struct bwd_tile {
    int br, bc, tr, tc, stages;
} bwd_tile;

typedef struct opts {
    int seqlens[MAX_SEQLENS], n_seqlens;
    int dims[4], n_dims;
    int dtypes[2], n_dtypes; /* 0 fp16, 1 bf16 */
    int repeats, warmup;
    int bwd_only;
    bwd_tile tiles[MAX_TILES]; /* tiles[0]: the planner's */
    int n_tiles;
    const char *json, *label;
} opts;

static int usage(void) {
    fprintf(stderr,
            "usage: fa-mma-compare [--seqlens N,N,...] [--dims D,D] [--dtypes fp16,bf16] [--bwd-only 1]\n"
            "                      [--hip-bwd BRxBC/TRxTC/STAGES,...] [--repeats N] [--warmup N] [--json FILE]\n"
            "                      [--label TEXT]\n"
            "  16k tokens (batch = 16384 / N), 2048 / head_dim heads, fp16 and bf16, head_dim 64 and 128,\n"
            "  causal and not; defaults: --seqlens 2048,4096,8192,16384 --dims 64,128 --repeats 10 --warmup 2;\n"
            "  --hip-bwd: HIP backward tiles timed beside the planner's (up to %d)\n",
            MAX_TILES - 1);
    return 2;
}

/* "BRxBC/TRxTC/STAGES,..." after the planner's entry; -1 when malformed. */
static int parse_tiles(const char *text, bwd_tile *out, int max) {
    int n = 0;
    const char *at = text;
    while (*at) {
        bwd_tile t;
        int used = 0;
        if (n >= max || sscanf(at, "%dx%d/%dx%d/%d%n", &t.br, &t.bc, &t.tr, &t.tc, &t.stages, &used) != 5 ||
            t.br <= 0 || t.bc <= 0 || t.tr <= 0 || t.tc <= 0 || t.br > 1024 || t.bc > 1024 || t.br % t.tr ||
            t.bc % t.tc || t.stages < 1 || t.stages > 2)
            return -1;
        out[n++] = t;
        at += used;
        if (*at == ',') at++;
        else if (*at) return -1;
    }
    return n;
}

static int parse(opts *o, int argc, char **argv) {
    static const int dflt[] = {2048, 4096, 8192, 16384};
    memcpy(o->seqlens, dflt, sizeof dflt);
    o->n_seqlens = 4;
    o->dims[0] = 64;
    o->dims[1] = 128;
    o->n_dims = 2;
    o->dtypes[0] = 0;
    o->dtypes[1] = 1;
    o->n_dtypes = 2;
    o->bwd_only = 0;
    memset(o->tiles, 0, sizeof o->tiles);
    o->n_tiles = 1;
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
        } else if (strcmp(a, "--dims") == 0) {
            o->n_dims = fa_cli_int_list(v, 16, 256, o->dims, 4);
            if (o->n_dims < 0) return usage();
            for (int k = 0; k < o->n_dims; k++)
                if (2048 % o->dims[k]) return usage();
        } else if (strcmp(a, "--dtypes") == 0) {
            o->n_dtypes = 0;
            if (strstr(v, "fp16")) o->dtypes[o->n_dtypes++] = 0;
            if (strstr(v, "bf16")) o->dtypes[o->n_dtypes++] = 1;
            if (o->n_dtypes == 0) return usage();
        } else if (strcmp(a, "--bwd-only") == 0) {
            o->bwd_only = atoi(v) != 0;
        } else if (strcmp(a, "--hip-bwd") == 0) {
            const int n = parse_tiles(v, o->tiles + 1, MAX_TILES - 1);
            if (n < 0) return usage();
            o->n_tiles = 1 + n;
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

/* The HIP plan with its backward on another tile (the forward stays the
 * planner's), prepared again. */
static fa_status force_hip_bwd(fa_plan plan, const bwd_tile *t) {
    const fa_device_desc *dev = &plan->ctx->info.desc;
    fa_kernel_plan k = plan->info.backward;
    k.variant = FA_VARIANT_MMA;
    k.br = t->br;
    k.bc = t->bc;
    k.thread_rows = t->tr;
    k.thread_cols = t->tc;
    k.stages = t->stages;
    k.work_group_size = (t->br / t->tr) * (t->bc / t->tc);
    k.local_mem_bytes = fa_hip_mma_local_mem(dev, &plan->desc, FA_PASS_BACKWARD, &k);
    if (k.local_mem_bytes == 0)
        return fa_fail(FA_ERR_UNSUPPORTED, "HIP backward %dx%d/%dx%d/%d: the kernels cannot run it on this device", t->br,
                       t->bc, t->tr, t->tc, t->stages);
    plan->ctx->ops->plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    plan->info.backward = k;
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
    char tile[2][56];  /* variant and tile per pass */
    int ok;
} point;

/* One side's times at a point; tile: the HIP backward's, NULL or br 0 for
 * the planner's. With --bwd-only the forward runs once, untimed, for O and
 * L. */
static void run_side(const opts *o, side *s, const fa_attention_desc *d, int cuda, const bwd_tile *tile, point *p) {
    memset(p, 0, sizeof *p);
    fa_plan plan = NULL;
    fa_status st = fa_plan_create(s->ctx, d, &plan);
    if (st == FA_SUCCESS && cuda) st = mma_sync_plan(plan);
    if (st == FA_SUCCESS && !cuda && tile && tile->br > 0) st = force_hip_bwd(plan, tile);
    if (st == FA_SUCCESS && o->bwd_only) st = fa_forward(plan, s->t[0], s->t[1], s->t[2], s->t[3], s->t[8]);
    for (int pass = o->bwd_only; st == FA_SUCCESS && pass < 2; pass++) {
        st = time_pass(o, plan, s, pass, &p->ms[pass]);
        const fa_kernel_plan *kp = pass ? &plan->info.backward : &plan->info.forward;
        snprintf(p->tile[pass], sizeof p->tile[pass], "%s %dx%d/%dx%d wg%d st%d", fa_variant_name(kp->variant), kp->br,
                 kp->bc, kp->thread_rows, kp->thread_cols, kp->work_group_size, kp->stages);
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
    /* Per HIP backward tile (0: the planner's): the sum of log ratios, their
     * count and the worst ratio with its point; the forward's in fwd_*. */
    double log_sum[MAX_TILES] = {0}, worst[MAX_TILES], fwd_log_sum = 0;
    char worst_at[MAX_TILES][48];
    int n_ratio[MAX_TILES] = {0}, fwd_n = 0, failed = 0;
    for (int j = 0; j < MAX_TILES; j++) {
        worst[j] = INFINITY;
        worst_at[j][0] = '\0';
    }
    for (int ti = 0; ti < o.n_dtypes; ti++)
        for (int di = 0; di < o.n_dims; di++)
            for (int i = 0; i < o.n_seqlens; i++)
                for (int causal = 0; causal < 2; causal++) {
                    const int t = o.dtypes[ti], dim = o.dims[di], n = o.seqlens[i];
                    fa_attention_desc d;
                    fa_attention_desc_init(&d);
                    d.batch = 16384 / n;
                    d.seqlen_q = d.seqlen_k = n;
                    d.heads_q = d.heads_kv = 2048 / dim;
                    d.head_dim = dim;
                    d.causal = causal;
                    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t ? FA_DTYPE_BF16 : FA_DTYPE_F16;
                    /* p[0 .. n_tiles - 1]: HIP per backward tile; p[MAX_TILES]: CUDA. */
                    point p[MAX_TILES + 1];
                    for (int s = 1; s >= 0; s--) {
                        fa_status st = alloc_tensors(&sides[s], &d, pools[t], (size_t)POOL_ELEMS * 2);
                        for (int j = 0; j < (s ? 1 : o.n_tiles); j++) {
                            point *pt = s ? &p[MAX_TILES] : &p[j];
                            if (st == FA_SUCCESS) {
                                run_side(&o, &sides[s], &d, s == 1, s ? NULL : &o.tiles[j], pt);
                            } else {
                                fprintf(stderr, "%s: allocation: %s\n", sides[s].name, fa_last_error());
                                memset(pt, 0, sizeof *pt);
                            }
                        }
                        free_tensors(&sides[s]);
                    }
                    const point *cu = &p[MAX_TILES];
                    double tf[MAX_TILES + 1][2];
                    memset(tf, 0, sizeof tf);
                    for (int j = 0; j <= MAX_TILES; j++)
                        for (int pass = o.bwd_only; pass < 2; pass++)
                            if ((j < o.n_tiles || j == MAX_TILES) && p[j].ok)
                                tf[j][pass] = fa_attention_flops(&d, (fa_pass)pass) / (p[j].ms[pass] * 1e-3) / 1e12;
                    double ratio[MAX_TILES][2];
                    memset(ratio, 0, sizeof ratio);
                    for (int j = 0; j < o.n_tiles; j++) {
                        failed += !p[j].ok || !cu->ok;
                        if (!p[j].ok || !cu->ok) continue;
                        ratio[j][1] = tf[j][1] / tf[MAX_TILES][1];
                        log_sum[j] += log(ratio[j][1]);
                        n_ratio[j]++;
                        if (ratio[j][1] < worst[j]) {
                            worst[j] = ratio[j][1];
                            snprintf(worst_at[j], sizeof worst_at[j], "%s d%d N%d%s", fa_dtype_name(d.q.dtype), dim, n,
                                     causal ? " causal" : "");
                        }
                        if (j == 0 && !o.bwd_only) {
                            ratio[0][0] = tf[0][0] / tf[MAX_TILES][0];
                            fwd_log_sum += log(ratio[0][0]);
                            fwd_n++;
                        }
                    }
                    printf("%-5s %4d %6d %6d | %8.1f %8.1f %6.2f | %8.1f %8.1f %6.2f | %s, %s; %s, %s\n",
                           fa_dtype_name(d.q.dtype), dim, n, causal, tf[0][0], tf[MAX_TILES][0], ratio[0][0], tf[0][1],
                           tf[MAX_TILES][1], ratio[0][1], o.bwd_only ? "-" : p[0].tile[0], p[0].tile[1],
                           o.bwd_only ? "-" : cu->tile[0], cu->tile[1]);
                    for (int j = 1; j < o.n_tiles; j++)
                        printf("%-5s %4d %6d %6d |   sweep: hip bwd %-26s %8.1f %8.1f %6.2f\n", fa_dtype_name(d.q.dtype),
                               dim, n, causal, p[j].ok ? p[j].tile[1] : "(failed)", tf[j][1], tf[MAX_TILES][1],
                               ratio[j][1]);
                    fflush(stdout);
                    for (int j = 0; json && j <= MAX_TILES; j++) {
                        if (j >= o.n_tiles && j < MAX_TILES) continue;
                        const int s = j == MAX_TILES;
                        for (int pass = o.bwd_only; pass < 2 && p[j].ok; pass++) {
                            if (j > 0 && j < MAX_TILES && pass == 0) continue;
                            fprintf(json,
                                    "{\"label\": \"%s\", \"backend\": \"%s\", \"kernels\": \"%s\", \"dtype\": \"%s\", "
                                    "\"head_dim\": %d, \"seqlen\": %d, \"batch\": %d, \"heads\": %d, \"causal\": %d, "
                                    "\"pass\": \"%s\", \"ms\": %.6f, \"tflops\": %.3f, \"plan\": \"%s\", \"sweep\": %d}\n",
                                    o.label, sides[s].name, s ? "mma.sync" : "hip matrix cores", fa_dtype_name(d.q.dtype),
                                    dim, n, d.batch, d.heads_q, causal, pass ? "bwd" : "fwd", p[j].ms[pass],
                                    tf[j][pass], p[j].tile[pass], s ? 0 : j);
                        }
                    }
                }
    if (fwd_n)
        printf("forward: HIP / CUDA mma.sync geometric mean %.2f over %d points (bar: 0.7)\n", exp(fwd_log_sum / fwd_n),
               fwd_n);
    for (int j = 0; j < o.n_tiles; j++) {
        if (!n_ratio[j]) continue;
        if (j == 0)
            printf("backward: HIP / CUDA mma.sync geometric mean %.2f over %d points (bar: 0.7), worst %.2f (%s)\n",
                   exp(log_sum[0] / n_ratio[0]), n_ratio[0], worst[0], worst_at[0]);
        else
            printf("backward, sweep %dx%d/%dx%d/%d: geometric mean %.2f over %d points, worst %.2f (%s)\n", o.tiles[j].br,
                   o.tiles[j].bc, o.tiles[j].tr, o.tiles[j].tc, o.tiles[j].stages, exp(log_sum[j] / n_ratio[j]),
                   n_ratio[j], worst[j], worst_at[j]);
    }
    if (json) fclose(json);
    free(pools[0]);
    free(pools[1]);
    for (int i = 0; i < 2; i++) fa_context_destroy(sides[i].ctx);
    return failed ? 1 : 0;
}
