/* fa-bench --ranks W: one attention over W ranks, each a thread of this
 * process with a context of its own, over NCCL (one GPU a rank: CUDA and
 * HIP devices) or over host memory between threads (any backend; several
 * ranks may then share one device). Per pass: the median wall time of the
 * ring (all ranks, from a common start to the last rank's end), its rate
 * per rank (the whole problem's useful FLOPs / W / time), and beside it the
 * rate of one device running the attention of one rank's tokens alone
 * (the work a rank does per step, without transfers or merges): the ring's
 * efficiency is the first over the second. */
#include "bench_ring.h"

#include "cli.h"
#include "ring_threads.h"
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RING_MAX 8

typedef struct ring_opts {
    int ranks;
    int nccl;              /* 1: NCCL, 0: threads over host memory */
    fa_cp_layout layout;
    int layout_given;
    int warmup;
    int fwd, bwd;
    const char *json;
} ring_opts;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char ring_usage[] =
    "fa-bench --ranks W (ring attention over W ranks of this process):\n"
    "  --ranks W           ranks, 1..8 (one GPU each with NCCL)\n"
    "  --transport T       nccl (CUDA/HIP, one device a rank; default where\n"
    "                      there are W such devices) or threads (host memory\n"
    "                      between threads; ranks may share a device)\n"
    "  --cp-layout L       zigzag (default with --causal) or contiguous\n"
    "  --pass P            fwd, bwd or both (default)\n"
    "  --warmup N          untimed runs first (default 1)\n"
    "  --json FILE         append one JSON object per pass\n"
    "--seqlen is the whole sequence (all ranks together).\n";

/* One of --ranks' own options; nonzero when refused. */
static int take_ring(void *ctx, const char *a, const char *v) {
    ring_opts *o = ctx;
    int bad = 0;
    if (strcmp(a, "--ranks") == 0)
        bad = fa_cli_int(v, 1, RING_MAX, &o->ranks);
    else if (strcmp(a, "--warmup") == 0)
        bad = fa_cli_int(v, 0, 1000, &o->warmup);
    else if (strcmp(a, "--transport") == 0) {
        o->nccl = strcmp(v, "nccl") == 0 ? 1 : strcmp(v, "threads") == 0 ? 0 : -2;
        bad = o->nccl == -2;
    } else if (strcmp(a, "--cp-layout") == 0) {
        o->layout = strcmp(v, "zigzag") == 0 ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS;
        bad = strcmp(v, "zigzag") != 0 && strcmp(v, "contiguous") != 0;
        o->layout_given = 1;
    } else if (strcmp(a, "--pass") == 0) {
        o->fwd = strcmp(v, "fwd") == 0 || strcmp(v, "both") == 0;
        o->bwd = strcmp(v, "bwd") == 0 || strcmp(v, "both") == 0;
        bad = !o->fwd && !o->bwd;
    } else
        o->json = v;
    if (bad) fprintf(stderr, "fa-bench: %s %s: not a valid value\n", a, v);
    return bad;
}

static int parse_ring(ring_opts *o, int argc, char **argv, int *rest_argc, char **rest) {
    *o = (ring_opts){0};
    o->warmup = 1;
    o->fwd = o->bwd = 1;
    o->nccl = -1;
    static const char *const own[] = {"--ranks", "--transport", "--cp-layout", "--pass", "--warmup", "--json"};
    return fa_cli_split_own(argc, argv, "fa-bench", own, (int)(sizeof own / sizeof own[0]), take_ring, o, rest_argc,
                            rest);
}

/* ------------------------------------------------------------------------ */

typedef struct ring_shared {
    const ring_opts *o;
    const fa_cli *cli;
    fa_attention_desc desc;  /* whole problem, packed local tensors */
    int repeats;
    void *nccl[RING_MAX];
    ring_hub *hub;
    pthread_barrier_t barrier;
    double t_fwd[RING_MAX][64], t_bwd[RING_MAX][64];
    fa_status status[RING_MAX];
    char message[RING_MAX][512];
    char plan_text[4096];
} ring_shared;

typedef struct rank_arg {
    ring_shared *sh;
    int rank;
} rank_arg;

/* Device buffers of n elements filled with random values of the dtype. */
static fa_status random_buffer(fa_context ctx, fa_dtype dtype, int64_t n, fa_rng *rng, fa_buffer *out) {
    const size_t es = fa_dtype_size(dtype);
    fa_status st = fa_buffer_alloc(ctx, (size_t)n * es, out);
    if (st != FA_SUCCESS) return st;
    const int64_t chunk = n < ((int64_t)1 << 22) ? n : ((int64_t)1 << 22);
    void *pool = fa_test_random_tensor(rng, dtype, chunk);
    if (!pool) return FA_ERR_OUT_OF_MEMORY;
    for (int64_t at = 0; at < n && st == FA_SUCCESS; at += chunk) {
        const int64_t m = n - at < chunk ? n - at : chunk;
        st = fa_buffer_upload(*out, (size_t)at * es, pool, (size_t)m * es);
    }
    free(pool);
    return st;
}

static void fail(ring_shared *sh, int rank, fa_status st) {
    if (sh->status[rank] == FA_SUCCESS) {
        sh->status[rank] = st;
        snprintf(sh->message[rank], sizeof sh->message[rank], "%s", fa_last_error());
    }
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    ring_shared *sh = a->sh;
    const int r = a->rank, W = sh->o->ranks;
    const fa_attention_desc *d = &sh->desc;
    fa_context ctx = NULL;
    fa_comm comm = NULL;
    fa_dist_plan plan = NULL;
    fa_buffer b[9] = {0};
    fa_status st = fa_context_create(sh->cli->backend, sh->o->nccl ? r : (sh->cli->device < 0 ? -1 : sh->cli->device),
                                     &ctx);
    if (st == FA_SUCCESS) {
        if (sh->o->nccl)
            st = fa_comm_create_nccl(ctx, sh->nccl[r], &comm);
        else {
            const fa_transport t = ring_hub_transport(sh->hub, r);
            st = fa_comm_create(&t, &comm);
        }
    }
    const int64_t lq = (int64_t)d->batch * (d->seqlen_q / W) * d->heads_q * d->head_dim;
    const int64_t lk = (int64_t)d->batch * (d->seqlen_k / W) * d->heads_kv * d->head_dim;
    const int64_t ll = (int64_t)d->batch * d->heads_q * (d->seqlen_q / W);
    fa_rng rng;
    fa_rng_seed(&rng, 17 + (uint64_t)r);
    const int64_t n[9] = {lq, lk, lk, lq, lq, ll, lq, lk, lk};
    for (int i = 0; i < 9 && st == FA_SUCCESS; i++)
        st = i == 5 ? fa_buffer_alloc(ctx, (size_t)n[i] * 4, &b[i]) : random_buffer(ctx, d->q.dtype, n[i], &rng, &b[i]);
    if (st != FA_SUCCESS) fail(sh, r, st);
    /* Every rank creates its plan (a collective) unless its setup failed,
     * in which case the others would wait: then no rank goes on. */
    pthread_barrier_wait(&sh->barrier);
    int any_failed = 0;
    for (int k = 0; k < W; k++) any_failed |= sh->status[k] != FA_SUCCESS;
    if (!any_failed) {
        st = fa_dist_plan_create(ctx, comm, d, sh->o->layout, &plan);
        if (st != FA_SUCCESS) fail(sh, r, st);
        if (st == FA_SUCCESS && r == 0) fa_dist_plan_format(plan, sh->plan_text, sizeof sh->plan_text);
    }
    for (int pass = 0; pass < 2 && plan; pass++) {
        if ((pass == 0 && !sh->o->fwd) || (pass == 1 && !sh->o->bwd)) continue;
        for (int it = 0; it < sh->o->warmup + sh->repeats; it++) {
            pthread_barrier_wait(&sh->barrier);
            const double t0 = now_s();
            st = pass == 0 ? fa_dist_forward(plan, b[0], b[1], b[2], b[4], b[5])
                           : fa_dist_backward(plan, b[0], b[1], b[2], b[4], b[5], b[3], b[6], b[7], b[8]);
            if (st == FA_SUCCESS) st = fa_context_synchronize(ctx);
            if (st != FA_SUCCESS) fail(sh, r, st);
            pthread_barrier_wait(&sh->barrier);
            if (it >= sh->o->warmup) (pass ? sh->t_bwd : sh->t_fwd)[r][it - sh->o->warmup] = now_s() - t0;
        }
    }
    if (plan) fa_dist_plan_destroy(plan);
    for (int i = 0; i < 9; i++)
        if (b[i]) fa_buffer_free(b[i]);
    if (comm) fa_comm_destroy(comm);
    if (ctx) fa_context_destroy(ctx);
    return NULL;
}

/* One device alone on a rank's tokens: the same heads, seqlen / W queries
 * and keys, the whole problem's masks. */
static int single_device(const fa_cli *cli, const fa_attention_desc *whole, int W, int repeats, int warmup,
                         double *fwd_tflops, double *bwd_tflops) {
    fa_attention_desc d = *whole;
    d.seqlen_q /= W;
    d.seqlen_k /= W;
    fa_context ctx = NULL;
    fa_plan plan = NULL;
    fa_buffer b[9] = {0};
    fa_rng rng;
    fa_rng_seed(&rng, 5);
    fa_status st = fa_context_create(cli->backend, cli->device, &ctx);
    const int64_t lq = (int64_t)d.batch * d.seqlen_q * d.heads_q * d.head_dim;
    const int64_t lk = (int64_t)d.batch * d.seqlen_k * d.heads_kv * d.head_dim;
    const int64_t n[9] = {lq, lk, lk, lq, lq, (int64_t)d.batch * d.heads_q * d.seqlen_q, lq, lk, lk};
    for (int i = 0; i < 9 && st == FA_SUCCESS; i++)
        st = i == 5 ? fa_buffer_alloc(ctx, (size_t)n[i] * 4, &b[i]) : random_buffer(ctx, d.q.dtype, n[i], &rng, &b[i]);
    if (st == FA_SUCCESS) st = fa_plan_create(ctx, &d, &plan);
    fa_plan_info info;
    if (st == FA_SUCCESS) st = fa_plan_get_info(plan, &info);
    double times[2][64];
    for (int pass = 0; pass < 2 && st == FA_SUCCESS; pass++)
        for (int it = 0; it < warmup + repeats && st == FA_SUCCESS; it++) {
            st = pass == 0 ? fa_forward(plan, b[0], b[1], b[2], b[4], b[5])
                           : fa_backward(plan, b[0], b[1], b[2], b[4], b[5], b[3], b[6], b[7], b[8]);
            double ms = 0;
            if (st == FA_SUCCESS) st = fa_context_synchronize(ctx);
            if (st == FA_SUCCESS) st = fa_plan_last_time_ms(plan, &ms);
            if (it >= warmup) times[pass][it - warmup] = ms * 1e-3;
        }
    if (st == FA_SUCCESS) {
        *fwd_tflops = info.fused_forward.flops / median(times[0], repeats) * 1e-12;
        *bwd_tflops = info.fused_backward.flops / median(times[1], repeats) * 1e-12;
    } else {
        fprintf(stderr, "fa-bench: one device: %s: %s\n", fa_status_string(st), fa_last_error());
    }
    if (plan) fa_plan_destroy(plan);
    for (int i = 0; i < 9; i++)
        if (b[i]) fa_buffer_free(b[i]);
    if (ctx) fa_context_destroy(ctx);
    return st == FA_SUCCESS ? 0 : 1;
}

int fa_bench_ring(int argc, char **argv) {
    ring_opts o;
    char *rest[256];
    int rest_argc = 0;
    if (argc > 250 || parse_ring(&o, argc, argv, &rest_argc, rest) != 0) return 2;
    fa_cli cli;
    const int pr = fa_cli_parse(&cli, rest_argc, rest);
    if (pr != 0) {
        if (pr > 0) {
            fa_cli_usage(argv[0], ring_usage);
            return 0;
        }
        return 2;
    }
    const int W = o.ranks;
    if (W < 1) {
        fprintf(stderr, "fa-bench: --ranks is required\n");
        fa_cli_free(&cli);
        return 2;
    }
    if (!o.layout_given) o.layout = cli.desc.causal ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS;
    if (cli.repeats > 64) cli.repeats = 64;
    if (o.nccl < 0) o.nccl = cli.backend == FA_BACKEND_CUDA || cli.backend == FA_BACKEND_HIP;
    ring_shared *sh = calloc(1, sizeof *sh);
    sh->o = &o;
    sh->cli = &cli;
    sh->desc = cli.desc;
    sh->repeats = cli.repeats;
    int rc = 0;
    char why[512] = "";
    if (o.nccl) {
        if (ring_nccl_comms(W, sh->nccl, why, sizeof why) != FA_SUCCESS) {
            fprintf(stderr, "fa-bench: NCCL communicators: %s\n", why);
            rc = 1;
        }
    } else {
        sh->hub = ring_hub_create(W);
    }
    double one_fwd = NAN, one_bwd = NAN;
    if (rc == 0 && single_device(&cli, &cli.desc, W, cli.repeats, o.warmup, &one_fwd, &one_bwd) != 0) rc = 1;
    if (rc == 0) {
        pthread_barrier_init(&sh->barrier, NULL, (unsigned)W);
        pthread_t threads[RING_MAX];
        rank_arg args[RING_MAX];
        for (int r = 0; r < W; r++) {
            args[r] = (rank_arg){sh, r};
            pthread_create(&threads[r], NULL, rank_main, &args[r]);
        }
        for (int r = 0; r < W; r++) pthread_join(threads[r], NULL);
        pthread_barrier_destroy(&sh->barrier);
        for (int r = 0; r < W; r++)
            if (sh->status[r] != FA_SUCCESS) {
                fprintf(stderr, "fa-bench: rank %d: %s: %s\n", r, fa_status_string(sh->status[r]), sh->message[r]);
                rc = 1;
            }
    }
    if (rc == 0) {
        fa_device_info info;
        fa_plan_info whole;
        fa_context ctx0;
        if (fa_context_create(cli.backend, cli.device, &ctx0) == FA_SUCCESS) {
            fa_context_get_info(ctx0, &info);
            fa_context_destroy(ctx0);
        } else {
            memset(&info, 0, sizeof info);
        }
        fa_plan_for_device(&info.desc, &cli.desc, &whole);
        char problem[256];
        fa_cli_describe_problem(&cli.desc, problem, sizeof problem);
        printf("%s", sh->plan_text);
        printf("ring of %d ranks over %s on %s: %s, %s layout\n", W, o.nccl ? "NCCL" : "threads (host memory)",
               info.desc.name, problem, o.layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous");
        for (int pass = 0; pass < 2; pass++) {
            if ((pass == 0 && !o.fwd) || (pass == 1 && !o.bwd)) continue;
            /* The ring's time is its slowest rank's. */
            double t[64];
            for (int it = 0; it < cli.repeats; it++) {
                t[it] = 0;
                for (int r = 0; r < W; r++) {
                    const double x = (pass ? sh->t_bwd : sh->t_fwd)[r][it];
                    t[it] = x > t[it] ? x : t[it];
                }
            }
            const double sec = median(t, cli.repeats);
            const double flops = pass ? whole.fused_backward.flops : whole.fused_forward.flops;
            const double per_rank = flops / W / sec * 1e-12, one = pass ? one_bwd : one_fwd;
            printf("  %s: %.3f ms, %.4g TFLOP/s a rank; one device on a rank's tokens %.4g TFLOP/s; "
                   "efficiency %.3f\n",
                   pass ? "backward" : "forward", sec * 1e3, per_rank, one, per_rank / one);
            if (o.json) {
                FILE *f = fopen(o.json, "a");
                if (f) {
                    fprintf(f,
                            "{\"ranks\": %d, \"transport\": \"%s\", \"layout\": \"%s\", \"device\": \"%s\", "
                            "\"problem\": \"%s\", \"pass\": \"%s\", \"ms\": %.4f, \"tflops_per_rank\": %.2f, "
                            "\"one_device_tflops\": %.2f, \"efficiency\": %.4f}\n",
                            W, o.nccl ? "nccl" : "threads", o.layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous",
                            info.desc.name, problem, pass ? "bwd" : "fwd", sec * 1e3, per_rank, one, per_rank / one);
                    fclose(f);
                }
            }
        }
    }
    for (int r = 0; r < W && o.nccl; r++) ring_nccl_destroy(sh->nccl[r]);
    if (sh->hub) ring_hub_destroy(sh->hub);
    free(sh);
    fa_cli_free(&cli);
    return rc;
}
