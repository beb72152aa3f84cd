/* fa-bench: times fused (and standard) attention over a sweep of sequence
 * lengths at a fixed token budget (default: the FlashAttention-2 paper's 16k
 * tokens, hidden 2048). Per point: median device time over repeats after
 * warm-up, TFLOP/s, the IO model's predicted HBM bytes, effective bandwidth,
 * fraction of the roofline, and the device memory the call used. A table on
 * stdout, JSON lines to --json FILE, progress on stderr. */
#include "cli.h"
#include "planner.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_POINTS 32
#define MAX_SETS 4

typedef struct bench_opts {
    int seqlens[MAX_POINTS];
    int n_seqlens;
    long tokens;
    int hidden;
    int fwd, bwd;
    int fused, standard;
    int warmup;
    const char *json;
    const char *label;
} bench_opts;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Splits argv into this tool's options and those fa_cli_parse knows. */
static int parse_bench(bench_opts *o, int argc, char **argv, int *rest_argc, char **rest) {
    memset(o, 0, sizeof *o);
    o->tokens = 16384;
    o->hidden = 2048;
    o->fwd = o->bwd = 1;
    o->fused = 1;
    o->warmup = 3;
    const int defaults[] = {512, 1024, 2048, 4096, 8192, 16384};
    o->n_seqlens = 6;
    memcpy(o->seqlens, defaults, sizeof defaults);
    *rest_argc = 0;
    rest[(*rest_argc)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--seqlens") == 0 && v) {
            o->n_seqlens = 0;
            char *copy = strdup(v), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t && o->n_seqlens < MAX_POINTS; t = strtok_r(NULL, ",", &save))
                o->seqlens[o->n_seqlens++] = atoi(t);
            free(copy);
            i++;
        } else if (strcmp(a, "--tokens") == 0 && v) {
            o->tokens = atol(v);
            i++;
        } else if (strcmp(a, "--hidden") == 0 && v) {
            o->hidden = atoi(v);
            i++;
        } else if (strcmp(a, "--warmup") == 0 && v) {
            o->warmup = atoi(v);
            i++;
        } else if (strcmp(a, "--pass") == 0 && v) {
            o->fwd = strcmp(v, "bwd") != 0;
            o->bwd = strcmp(v, "fwd") != 0;
            i++;
        } else if (strcmp(a, "--algos") == 0 && v) {
            o->fused = strstr(v, "fused") != NULL;
            o->standard = strstr(v, "standard") != NULL;
            i++;
        } else if (strcmp(a, "--json") == 0 && v) {
            o->json = v;
            i++;
        } else if (strcmp(a, "--label") == 0 && v) {
            o->label = v;
            i++;
        } else {
            rest[(*rest_argc)++] = argv[i];
        }
    }
    return 0;
}

typedef struct point_result {
    int ok;
    char error[160];
    double fwd_ms, bwd_ms;
    fa_plan_info info;
    double device_bytes;
} point_result;

static fa_status alloc_upload(fa_context ctx, fa_rng *rng, fa_dtype dt, int64_t count, int random, fa_buffer *buf,
                              double *device_bytes) {
    size_t bytes = (size_t)count * fa_dtype_size(dt);
    fa_status st = fa_buffer_alloc(ctx, bytes, buf);
    if (st != FA_SUCCESS) return st;
    *device_bytes += (double)bytes;
    void *host = random ? fa_test_random_tensor(rng, dt, count) : malloc(bytes);
    if (!host) return FA_ERR_OUT_OF_MEMORY;
    if (!random) fa_test_poison(host, dt, count);
    st = fa_buffer_upload(*buf, 0, host, bytes);
    free(host);
    return st;
}

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

/* One point: plan, data (several sets when small, so repeats do not run
 * from the cache), forward timing, backward timing. */
static void run_point(fa_context ctx, fa_attention_desc *d, int repeats, int warmup, const bench_opts *o,
                      point_result *r) {
    memset(r, 0, sizeof *r);
    fa_plan plan = NULL;
    fa_buffer b[MAX_SETS][9];
    memset(b, 0, sizeof b);
    int sets = 0;
    fa_status st = fa_plan_create(ctx, d, &plan);
    if (st == FA_SUCCESS) st = fa_plan_get_info(plan, &r->info);
    fa_dtype dt = d->q.dtype;
    int64_t nq = fa_attention_total_q(d) * d->heads_q * d->head_dim;
    int64_t nk = fa_attention_total_k(d) * d->heads_kv * d->head_dim;
    int64_t nl = fa_attention_total_q(d) * d->heads_q;
    double set_bytes = (double)(3 * nq + 2 * nk) * (double)fa_dtype_size(dt) * 2;
    int want_sets = set_bytes < 256e6 ? MAX_SETS : 1;
    fa_rng rng;
    fa_rng_seed(&rng, 7);
    r->device_bytes = (double)r->info.forward.workspace_bytes;
    if (r->info.backward.workspace_bytes > r->info.forward.workspace_bytes)
        r->device_bytes = (double)r->info.backward.workspace_bytes;
    for (; st == FA_SUCCESS && sets < want_sets; sets++) {
        const int64_t counts[9] = {nq, nk, nk, nq, nl, nq, nq, nk, nk};
        for (int i = 0; i < 9 && st == FA_SUCCESS; i++)
            st = alloc_upload(ctx, &rng, i == 4 ? FA_DTYPE_F32 : dt, counts[i], i < 3 || i == 5, &b[sets][i],
                              &r->device_bytes);
    }
    if (st != FA_SUCCESS) sets = sets > 0 ? sets - 1 : 0;
    double times[256];
    if (repeats > 256) repeats = 256;
    if (st == FA_SUCCESS && o->fwd) {
        for (int i = 0; i < warmup + repeats && st == FA_SUCCESS; i++) {
            fa_buffer *t = b[i % sets];
            st = fa_forward(plan, t[0], t[1], t[2], t[3], t[4]);
            if (st == FA_SUCCESS) st = fa_context_synchronize(ctx);
            if (st == FA_SUCCESS && i >= warmup) st = fa_plan_last_time_ms(plan, &times[i - warmup]);
        }
        if (st == FA_SUCCESS) r->fwd_ms = median_of(times, repeats);
    }
    if (st == FA_SUCCESS && o->bwd) {
        for (int s = 0; s < sets && st == FA_SUCCESS; s++)
            st = fa_forward(plan, b[s][0], b[s][1], b[s][2], b[s][3], b[s][4]);
        for (int i = 0; i < warmup + repeats && st == FA_SUCCESS; i++) {
            fa_buffer *t = b[i % sets];
            st = fa_backward(plan, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
            if (st == FA_SUCCESS) st = fa_context_synchronize(ctx);
            if (st == FA_SUCCESS && i >= warmup) st = fa_plan_last_time_ms(plan, &times[i - warmup]);
        }
        if (st == FA_SUCCESS) r->bwd_ms = median_of(times, repeats);
    }
    r->ok = st == FA_SUCCESS;
    if (!r->ok)
        snprintf(r->error, sizeof r->error, "%s: %.120s",
                 st == FA_ERR_OUT_OF_MEMORY ? "out of memory" : fa_status_string(st), fa_last_error());
    for (int s = 0; s < MAX_SETS; s++)
        for (int i = 0; i < 9; i++)
            if (b[s][i]) fa_buffer_free(b[s][i]);
    if (plan) fa_plan_destroy(plan);
}

int main(int argc, char **argv) {
    bench_opts o;
    char **rest = calloc((size_t)argc + 1, sizeof(char *));
    int rest_argc = 0;
    parse_bench(&o, argc, argv, &rest_argc, rest);
    fa_cli cli;
    int rc = fa_cli_parse(&cli, rest_argc, rest);
    if (rc != 0) {
        fa_cli_usage(argv[0], "fa-bench:\n"
                              "  --seqlens A,B,...   sequence lengths (default 512..16384)\n"
                              "  --tokens T          batch = T / seqlen (default 16384)\n"
                              "  --hidden H          heads = H / dim (default 2048)\n"
                              "  --pass fwd|bwd|both (default both)\n"
                              "  --algos fused,standard (default fused)\n"
                              "  --repeats N, --warmup N\n"
                              "  --json FILE         append one JSON object per point\n"
                              "  --label TEXT        stored with each JSON point\n");
        return rc > 0 ? 0 : 2;
    }
    fa_context ctx;
    if (fa_context_create(cli.backend, cli.device, &ctx) != FA_SUCCESS) {
        fprintf(stderr, "fa-bench: %s\n", fa_last_error());
        return 1;
    }
    fa_device_info info;
    fa_context_get_info(ctx, &info);
    printf("device: %s (%s)\n", info.desc.name, fa_backend_name(info.backend));
    FILE *json = o.json ? fopen(o.json, "a") : NULL;
    if (o.json && !json) {
        fprintf(stderr, "fa-bench: cannot open %s\n", o.json);
        return 1;
    }
    printf("%-8s %-6s %4s %6s %5s %5s | %9s %8s %9s %8s | %9s %8s | %9s %7s %6s\n", "algo", "dtype", "d", "seqlen",
           "batch", "heads", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s", "pred GB", "GB/s", "roof ms", "%roof",
           "MiB");
    int failures = 0;
    for (int algo = 0; algo < 2; algo++) {
        if ((algo == 0 && !o.fused) || (algo == 1 && !o.standard)) continue;
        for (int p = 0; p < o.n_seqlens; p++) {
            fa_attention_desc d = cli.desc;
            d.algorithm = algo ? FA_ALGO_STANDARD : FA_ALGO_FUSED;
            d.seqlen_q = d.seqlen_k = o.seqlens[p];
            d.batch = (int)(o.tokens / o.seqlens[p]);
            if (d.batch < 1) d.batch = 1;
            d.heads_q = o.hidden / d.head_dim;
            if (d.heads_kv == cli.desc.heads_q || d.heads_q % d.heads_kv != 0) d.heads_kv = d.heads_q;
            d.block_mask = NULL;
            d.block_mask_bytes = 0;
            fprintf(stderr, "\r[%d/%d] %s seqlen %d ...", p + 1, o.n_seqlens, algo ? "standard" : "fused",
                    d.seqlen_q);
            fflush(stderr);
            point_result r;
            run_point(ctx, &d, cli.repeats, o.warmup, &o, &r);
            const char *algo_name = algo ? "standard" : "fused";
            if (!r.ok) {
                failures++;
                printf("%-8s %-6s %4d %6d %5d %5d | %s\n", algo_name, fa_dtype_name(d.q.dtype), d.head_dim,
                       d.seqlen_q, d.batch, d.heads_q, r.error);
                if (json)
                    fprintf(json,
                            "{\"label\":\"%s\",\"backend\":\"%s\",\"device\":\"%s\",\"algo\":\"%s\",\"dtype\":\"%s\","
                            "\"d\":%d,\"n\":%d,\"b\":%d,\"h\":%d,\"causal\":%s,\"error\":\"%s\"}\n",
                            o.label ? o.label : "", fa_backend_name(info.backend), info.desc.name, algo_name,
                            fa_dtype_name(d.q.dtype), d.head_dim, d.seqlen_q, d.batch, d.heads_q,
                            d.causal ? "true" : "false", r.error[0] == 'o' ? "oom" : "failed");
                continue;
            }
            double ff = fa_attention_flops(&d, FA_PASS_FORWARD), fb = fa_attention_flops(&d, FA_PASS_BACKWARD);
            const fa_cost *cf = &r.info.forward.cost, *cb = &r.info.backward.cost;
            double pred_gb = (cf->hbm_read_bytes + cf->hbm_write_bytes) * 1e-9;
            double fwd_tf = r.fwd_ms > 0 ? ff / r.fwd_ms * 1e-9 : 0, bwd_tf = r.bwd_ms > 0 ? fb / r.bwd_ms * 1e-9 : 0;
            double gbs = r.fwd_ms > 0 ? pred_gb / (r.fwd_ms * 1e-3) : 0;
            double roof = r.fwd_ms > 0 ? cf->roofline_ms / r.fwd_ms * 100 : 0;
            printf("%-8s %-6s %4d %6d %5d %5d | %9.3f %8.2f %9.3f %8.2f | %9.3f %8.1f | %9.3f %6.1f%% %6.0f\n",
                   algo_name, fa_dtype_name(d.q.dtype), d.head_dim, d.seqlen_q, d.batch, d.heads_q, r.fwd_ms, fwd_tf,
                   r.bwd_ms, bwd_tf, pred_gb, gbs, cf->roofline_ms, roof, r.device_bytes / (1 << 20));
            fflush(stdout);
            if (json)
                fprintf(json,
                        "{\"label\":\"%s\",\"backend\":\"%s\",\"device\":\"%s\",\"algo\":\"%s\",\"dtype\":\"%s\","
                        "\"d\":%d,\"n\":%d,\"b\":%d,\"h\":%d,\"causal\":%s,\"fwd_ms\":%.6f,\"bwd_ms\":%.6f,"
                        "\"fwd_tflops\":%.4f,\"bwd_tflops\":%.4f,\"pred_fwd_bytes\":%.0f,\"pred_bwd_bytes\":%.0f,"
                        "\"roofline_fwd_ms\":%.6f,\"roofline_bwd_ms\":%.6f,\"device_bytes\":%.0f,"
                        "\"br\":%d,\"bc\":%d,\"wg\":%d}\n",
                        o.label ? o.label : "", fa_backend_name(info.backend), info.desc.name, algo_name,
                        fa_dtype_name(d.q.dtype), d.head_dim, d.seqlen_q, d.batch, d.heads_q,
                        d.causal ? "true" : "false", r.fwd_ms, r.bwd_ms, fwd_tf, bwd_tf,
                        cf->hbm_read_bytes + cf->hbm_write_bytes, cb->hbm_read_bytes + cb->hbm_write_bytes,
                        cf->roofline_ms, cb->roofline_ms, r.device_bytes, r.info.forward.br, r.info.forward.bc,
                        r.info.forward.work_group_size);
        }
    }
    fprintf(stderr, "\r%60s\r", "");
    if (json) fclose(json);
    fa_context_destroy(ctx);
    fa_cli_free(&cli);
    free(rest);
    return failures ? 1 : 0;
}
