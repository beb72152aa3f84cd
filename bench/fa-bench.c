/* fa-bench: times fused (and standard) attention over a sweep of sequence
 * lengths, at a fixed token budget (default: the FlashAttention-2 paper's
 * 16k tokens, hidden 2048) or at a fixed batch and head count (--batch,
 * --heads: the long-sequence runs). Per point: median device time over
 * repeats after warm-up, TFLOP/s, the IO model's predicted HBM bytes of each
 * pass, effective bandwidth, fraction of the roofline, and the device memory
 * the call needs: its tensors plus the workspace the plan allocates. A table
 * on stdout, JSON lines (--json) and CSV rows (--csv) with the same fields,
 * progress on stderr.
 *
 * A point that does not fit in device memory is reported as "out of memory"
 * and the sweep goes on; any other failure is reported with its message and
 * makes the exit status 1. */
#include "bench_decode.h"
#include "bench_ring.h"
#include "cli.h"
#include "desc.h"
#include "planner.h"
#include "test_util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_POINTS 64
#define MAX_SETS 4
#define N_TENSORS 9
/* Host random data is drawn from a pool of at most this many elements:
 * drawing normals for every element of a 1M-token problem would take
 * minutes, and timing does not depend on the values. */
#define POOL_MAX_ELEMS ((int64_t)1 << 25)
#define UPLOAD_CHUNK_ELEMS ((int64_t)1 << 22)

enum { ALGO_FUSED = 0, ALGO_STANDARD = 1, N_ALGOS = 2 };
static const char *const algo_names[N_ALGOS] = {"fused", "standard"};

typedef struct bench_opts {
    int seqlens[MAX_POINTS];
    int n_seqlens;
    long long tokens;
    int hidden;
    int batch;    /* > 0: fixed batch instead of tokens / seqlen */
    int heads;    /* > 0: fixed query heads instead of hidden / dim */
    int heads_kv; /* > 0: grouped-query attention */
    int fwd, bwd; /* passes timed separately */
    int fwdbwd;   /* forward and backward timed back to back */
    const char *pass_name;
    int algos[N_ALGOS];
    int warmup;
    const char *json;
    const char *csv;
    const char *label;
} bench_opts;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */

/* The whole string, no leading space, within [lo, hi]. */
static int parse_long(const char *s, long long lo, long long hi, long long *out) {
    if (*s == '\0' || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_int_opt(const char *name, const char *v, int lo, int *out) {
    long long x = 0;
    if (parse_long(v, lo, 2147483647LL, &x) != 0) {
        fprintf(stderr, "fa-bench: %s %s: expected an integer >= %d\n", name, v, lo);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_seqlens(bench_opts *o, const char *v) {
    o->n_seqlens = 0;
    const char *p = v;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        long long n;
        if (len == 0 || len >= sizeof item) goto bad;
        memcpy(item, p, len);
        item[len] = '\0';
        if (parse_long(item, 1, 2147483647LL, &n) != 0) goto bad;
        if (o->n_seqlens == MAX_POINTS) {
            fprintf(stderr, "fa-bench: --seqlens: at most %d sequence lengths\n", MAX_POINTS);
            return -1;
        }
        o->seqlens[o->n_seqlens++] = (int)n;
        p += len;
        if (*p == ',') p++;
    }
    if (o->n_seqlens > 0) return 0;
bad:
    fprintf(stderr, "fa-bench: --seqlens %s: expected positive integers separated by commas\n", v);
    return -1;
}

static int parse_algos(bench_opts *o, const char *v) {
    memset(o->algos, 0, sizeof o->algos);
    const char *p = v;
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (int a = 0; a < N_ALGOS; a++)
            if (len == strlen(algo_names[a]) && strncmp(p, algo_names[a], len) == 0) o->algos[a] = found = 1;
        if (!found) {
            fprintf(stderr, "fa-bench: --algos %s: expected fused, standard or both separated by a comma\n", v);
            return -1;
        }
        p += len;
        if (*p == ',') p++;
    }
    return 0;
}

static int parse_pass(bench_opts *o, const char *v) {
    o->fwd = o->bwd = o->fwdbwd = 0;
    if (strcmp(v, "fwd") == 0) o->fwd = 1;
    else if (strcmp(v, "bwd") == 0) o->bwd = 1;
    else if (strcmp(v, "both") == 0) o->fwd = o->bwd = 1;
    else if (strcmp(v, "fwdbwd") == 0) o->fwdbwd = 1;
    else {
        fprintf(stderr, "fa-bench: --pass %s: expected fwd, bwd, both or fwdbwd\n", v);
        return -1;
    }
    o->pass_name = v;
    return 0;
}

/* One of fa-bench's own options (parse_bench); nonzero when refused. */
static int take_bench(void *ctx, const char *a, const char *v) {
    bench_opts *o = ctx;
    int bad = 0;
    long long x = 0;
    if (strcmp(a, "--seqlens") == 0) bad = parse_seqlens(o, v);
    else if (strcmp(a, "--tokens") == 0) {
        bad = parse_long(v, 1, 1LL << 40, &x);
        if (bad) fprintf(stderr, "fa-bench: --tokens %s: expected a positive integer\n", v);
        o->tokens = x;
    } else if (strcmp(a, "--hidden") == 0) bad = parse_int_opt(a, v, 8, &o->hidden);
    else if (strcmp(a, "--batch") == 0) bad = parse_int_opt(a, v, 1, &o->batch);
    else if (strcmp(a, "--heads") == 0) bad = parse_int_opt(a, v, 1, &o->heads);
    else if (strcmp(a, "--heads-kv") == 0) bad = parse_int_opt(a, v, 1, &o->heads_kv);
    else if (strcmp(a, "--warmup") == 0) bad = parse_int_opt(a, v, 0, &o->warmup);
    else if (strcmp(a, "--pass") == 0) bad = parse_pass(o, v);
    else if (strcmp(a, "--algos") == 0) bad = parse_algos(o, v);
    else if (strcmp(a, "--json") == 0) o->json = v;
    else if (strcmp(a, "--csv") == 0) o->csv = v;
    else o->label = v;
    return bad;
}

/* Takes this tool's options out of argv and leaves the rest (device and
 * problem options) to fa_cli_parse. --batch, --heads and --heads-kv are
 * taken here too: the sweep needs to know whether they were given. */
static int parse_bench(bench_opts *o, int argc, char **argv, int *rest_argc, char **rest) {
    memset(o, 0, sizeof *o);
    o->tokens = 16384;
    o->hidden = 2048;
    o->fwd = o->bwd = 1;
    o->pass_name = "both";
    o->algos[ALGO_FUSED] = 1;
    o->warmup = 3;
    const int defaults[] = {512, 1024, 2048, 4096, 8192, 16384};
    o->n_seqlens = (int)(sizeof defaults / sizeof defaults[0]);
    memcpy(o->seqlens, defaults, sizeof defaults);
    static const char *const own[] = {"--seqlens", "--tokens", "--hidden", "--batch", "--heads", "--heads-kv",
                                      "--warmup",  "--pass",   "--algos",  "--json",  "--csv",   "--label"};
    return fa_cli_split_own(argc, argv, "fa-bench", own, (int)(sizeof own / sizeof own[0]), take_bench, o, rest_argc,
                            rest);
}

static const char usage_text[] =
    "fa-bench (sweep; --seqlen, --batch and --heads of the problem options are\n"
    "replaced as described here):\n"
    "  --seqlens A,B,...   sequence lengths (default 512,1024,2048,4096,8192,16384)\n"
    "  --tokens T          batch = T / seqlen, at least 1 (default 16384)\n"
    "  --hidden H          query heads = H / dim (default 2048)\n"
    "  --batch B           fixed batch for every point (overrides --tokens)\n"
    "  --heads H           fixed query heads (overrides --hidden)\n"
    "  --heads-kv H        key/value heads (grouped-query; default: query heads)\n"
    "  --pass P            fwd, bwd, both (each timed on its own; default) or\n"
    "                      fwdbwd (forward then backward per repeat: fwd_ms,\n"
    "                      bwd_ms and their sum fwdbwd_ms, whose TFLOP/s count\n"
    "                      3.5x the forward FLOPs)\n"
    "  --algos LIST        fused,standard (default fused)\n"
    "  --repeats N         timed runs per pass, median reported (default 10)\n"
    "  --warmup N          untimed runs first (default 3)\n"
    "  --json FILE         append one JSON object per point\n"
    "  --csv FILE          append one CSV row per point (header when the file is empty)\n"
    "  --label TEXT        stored with each point\n"
    "  --decode            decoding steps against a KV cache instead (fa-bench --decode --help)\n"
    "  --ranks W           ring attention over W ranks instead (fa-bench --ranks 2 --help)\n"
    "memory: device_bytes (table: \"need MiB\") is the device memory the call\n"
    "needs: tensors + workspace allocated by the call. Tensors are Q, K, V, O\n"
    "and the log-sum-exp, plus dO, dQ, dK, dV when a backward pass runs; the\n"
    "workspace is what the plan reports (the larger of the two passes when the\n"
    "backward runs: its N x N matrices for standard attention). Extra input sets\n"
    "rotated between repeats at small sizes are not counted. A point that needs\n"
    "more than the device's global memory, or whose allocation or plan fails\n"
    "with FA_ERR_OUT_OF_MEMORY, is reported as out of memory (\"error\":\"oom\").\n"
    "exit status: 0 when every point ran or was out of memory, 1 otherwise.\n";

/* ------------------------------------------------------------------------ */
/* Records: one per point, written as JSON and CSV from one field table     */

typedef struct record {
    const char *label, *backend, *device, *algo, *dtype, *pass, *error;
    char options[96]; /* score options: "softcap=30 alibi bias=bf16", "" for none */
    char message[256];
    int d, n, b, h, h_kv, causal;
    double fwd_ms, bwd_ms, fwdbwd_ms, fwd_tflops, bwd_tflops, fwdbwd_tflops;
    double pred_fwd_bytes, pred_bwd_bytes, roofline_fwd_ms, roofline_bwd_ms;
    double pred_fwd_tile_bytes, pred_bwd_tile_bytes;
    double device_bytes, tensor_bytes, workspace_bytes;
    int br, bc, wg;
    int has_timing, has_fwdbwd, has_memory, has_error;
} record;

enum field_kind { K_STR, K_TEXT, K_INT, K_BOOL, K_MS, K_TFLOPS, K_BYTES };
enum field_group { G_ALWAYS, G_TIMING, G_FWDBWD, G_MEMORY, G_ERROR };

typedef struct field {
    const char *name;
    enum field_kind kind;
    enum field_group group;
    size_t offset;
} field;

#define F(name, kind, group) {#name, kind, group, offsetof(record, name)}
static const field fields[] = {
    F(label, K_STR, G_ALWAYS),
    F(backend, K_STR, G_ALWAYS),
    F(device, K_STR, G_ALWAYS),
    F(algo, K_STR, G_ALWAYS),
    F(dtype, K_STR, G_ALWAYS),
    F(d, K_INT, G_ALWAYS),
    F(n, K_INT, G_ALWAYS),
    F(b, K_INT, G_ALWAYS),
    F(h, K_INT, G_ALWAYS),
    F(h_kv, K_INT, G_ALWAYS),
    F(causal, K_BOOL, G_ALWAYS),
    F(options, K_TEXT, G_ALWAYS),
    F(pass, K_STR, G_ALWAYS),
    F(fwd_ms, K_MS, G_TIMING),
    F(bwd_ms, K_MS, G_TIMING),
    F(fwdbwd_ms, K_MS, G_FWDBWD),
    F(fwd_tflops, K_TFLOPS, G_TIMING),
    F(bwd_tflops, K_TFLOPS, G_TIMING),
    F(fwdbwd_tflops, K_TFLOPS, G_FWDBWD),
    F(pred_fwd_bytes, K_BYTES, G_TIMING),
    F(pred_bwd_bytes, K_BYTES, G_TIMING),
    F(pred_fwd_tile_bytes, K_BYTES, G_TIMING),
    F(pred_bwd_tile_bytes, K_BYTES, G_TIMING),
    F(roofline_fwd_ms, K_MS, G_TIMING),
    F(roofline_bwd_ms, K_MS, G_TIMING),
    F(device_bytes, K_BYTES, G_MEMORY),
    F(tensor_bytes, K_BYTES, G_MEMORY),
    F(workspace_bytes, K_BYTES, G_MEMORY),
    F(br, K_INT, G_TIMING),
    F(bc, K_INT, G_TIMING),
    F(wg, K_INT, G_TIMING),
    F(error, K_STR, G_ERROR),
    F(message, K_TEXT, G_ERROR),
};
#undef F
#define N_FIELDS (sizeof fields / sizeof fields[0])

static int field_present(const record *r, const field *f) {
    switch (f->group) {
    case G_TIMING: return r->has_timing;
    case G_FWDBWD: return r->has_fwdbwd;
    case G_MEMORY: return r->has_memory;
    case G_ERROR: return r->has_error;
    default: return 1;
    }
}

static const char *field_string(const record *r, const field *f) {
    const char *base = (const char *)r + f->offset;
    if (f->kind == K_TEXT) return base;
    const char *s = *(const char *const *)(const void *)base;
    return s ? s : "";
}

/* The value of a numeric field, as both writers print it. */
static void field_number(const record *r, const field *f, char *out, size_t size) {
    const char *base = (const char *)r + f->offset;
    int i;
    double x;
    switch (f->kind) {
    case K_INT:
        memcpy(&i, base, sizeof i);
        snprintf(out, size, "%d", i);
        break;
    case K_BOOL:
        memcpy(&i, base, sizeof i);
        snprintf(out, size, "%s", i ? "true" : "false");
        break;
    default:
        memcpy(&x, base, sizeof x);
        snprintf(out, size, f->kind == K_MS ? "%.6f" : f->kind == K_TFLOPS ? "%.4f" : "%.0f", x);
        break;
    }
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void write_json(FILE *f, const record *r) {
    int first = 1;
    for (size_t k = 0; k < N_FIELDS; k++) {
        const field *fd = &fields[k];
        if (!field_present(r, fd)) continue;
        fprintf(f, "%s\"%s\":", first ? "{" : ",", fd->name);
        first = 0;
        if (fd->kind == K_STR || fd->kind == K_TEXT) {
            json_string(f, field_string(r, fd));
        } else {
            char num[64];
            field_number(r, fd, num, sizeof num);
            fputs(num, f);
        }
    }
    fputs("}\n", f);
    fflush(f);
}

static void csv_string(FILE *f, const char *s) {
    if (strpbrk(s, ",\"\n\r") == NULL) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    }
    fputc('"', f);
}

static void write_csv_header(FILE *f) {
    for (size_t k = 0; k < N_FIELDS; k++) fprintf(f, "%s%s", k ? "," : "", fields[k].name);
    fputc('\n', f);
}

/* Same fields as the JSON line; absent ones are empty cells; booleans as
 * true/false. */
static void write_csv(FILE *f, const record *r) {
    for (size_t k = 0; k < N_FIELDS; k++) {
        const field *fd = &fields[k];
        if (k) fputc(',', f);
        if (!field_present(r, fd)) continue;
        if (fd->kind == K_STR || fd->kind == K_TEXT) {
            csv_string(f, field_string(r, fd));
        } else {
            char num[64];
            field_number(r, fd, num, sizeof num);
            fputs(num, f);
        }
    }
    fputc('\n', f);
    fflush(f);
}

/* ------------------------------------------------------------------------ */
/* Data                                                                     */

/* Normal samples, at most POOL_MAX_ELEMS, drawn once per sweep: each input
 * tensor takes the next window of the pool, wrapping around, so that the
 * tensors of one point hold different values while the pool is larger than
 * they are. */
typedef struct data_pool {
    void *random; /* pool_elems values of the inputs' dtype */
    int64_t pool_elems;
    void *poison; /* UPLOAD_CHUNK_ELEMS elements of 4 bytes or fewer, every bit set: NaN in any dtype */
    int64_t next;
    void *bias; /* UPLOAD_CHUNK_ELEMS random values of the bias dtype, repeated over the bias */
} data_pool;

static void pool_free(data_pool *p) {
    free(p->random);
    free(p->poison);
    free(p->bias);
    memset(p, 0, sizeof *p);
}

/* Makes the pool hold at least random_elems values (up to the cap). It is
 * kept across the points of a sweep: the dtype does not change within one,
 * and drawing tens of millions of normals per point would cost more than
 * timing it. */
static fa_status pool_reserve(data_pool *p, fa_dtype dt, int64_t random_elems) {
    int64_t want = random_elems < POOL_MAX_ELEMS ? random_elems : POOL_MAX_ELEMS;
    if (want < 1) want = 1;
    if (!p->poison) {
        p->poison = malloc((size_t)UPLOAD_CHUNK_ELEMS * sizeof(float));
        if (!p->poison) {
            pool_free(p);
            return FA_ERR_OUT_OF_MEMORY;
        }
        memset(p->poison, 0xff, (size_t)UPLOAD_CHUNK_ELEMS * sizeof(float));
    }
    if (p->random && p->pool_elems >= want) return FA_SUCCESS;
    free(p->random);
    fa_rng rng;
    fa_rng_seed(&rng, 7 + (uint64_t)want);
    p->random = fa_test_random_tensor(&rng, dt, want);
    p->pool_elems = p->random ? want : 0;
    return p->random ? FA_SUCCESS : FA_ERR_OUT_OF_MEMORY;
}

/* Uploads count elements in slices: random inputs from the pool, outputs
 * poisoned with NaN. */
static fa_status fill_buffer(data_pool *p, fa_buffer buf, fa_dtype dt, int64_t count, int random) {
    const size_t es = fa_dtype_size(dt);
    int64_t done = 0, pos = random ? p->next % p->pool_elems : 0;
    while (done < count) {
        int64_t n = count - done;
        const void *src;
        if (random) {
            if (n > p->pool_elems - pos) n = p->pool_elems - pos;
            src = (const char *)p->random + (size_t)pos * es;
            pos = (pos + n) % p->pool_elems;
        } else {
            if (n > UPLOAD_CHUNK_ELEMS) n = UPLOAD_CHUNK_ELEMS;
            src = p->poison;
        }
        fa_status st = fa_buffer_upload(buf, (size_t)done * es, src, (size_t)n * es);
        if (st != FA_SUCCESS) return st;
        done += n;
    }
    /* The next tensor starts where this one ended, shifted by an odd count
     * (rows are multiples of 8 elements), so that tensors sharing the pool do
     * not line up row for row. */
    if (random) p->next += count + 97;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* One point                                                                */

typedef struct point_result {
    int ok, oom;
    char error[256];
    double fwd_ms, bwd_ms, fwdbwd_ms;
    fa_plan_info info;
    int have_info;
    double tensor_bytes, workspace_bytes;
} point_result;

typedef struct tensor_set {
    fa_buffer b[N_TENSORS]; /* q k v o lse dout dq dk dv */
    fa_buffer bias;         /* the additive bias, where the problem has one */
} tensor_set;

/* Bytes of the problem's additive bias (0 without one). */
static double bias_bytes(const fa_attention_desc *d) {
    const int64_t n = fa_desc_bias_bytes(d);
    return n > 0 ? (double)n : 0.0;
}

static void tensor_counts(const fa_attention_desc *d, int64_t counts[N_TENSORS]) {
    const int64_t nq = fa_attention_total_q(d) * d->heads_q * d->head_dim;
    const int64_t nk = fa_attention_total_k(d) * d->heads_kv * d->head_dim;
    const int64_t nl = fa_attention_total_q(d) * d->heads_q;
    const int64_t c[N_TENSORS] = {nq, nk, nk, nq, nl, nq, nq, nk, nk};
    memcpy(counts, c, sizeof c);
}

static int tensor_used(int i, int with_backward) { return i < 5 || with_backward; }
static int tensor_random(int i) { return i < 3 || i == 5; }
/* L is fp32; O and dO have o's dtype (fp16 or bf16 beside fp8 inputs). */
static fa_dtype tensor_dtype(int i, const fa_attention_desc *d) {
    return i == 4 ? FA_DTYPE_F32 : i == 3 || i == 5 ? d->o.dtype : d->q.dtype;
}

static void free_set(tensor_set *s) {
    for (int i = 0; i < N_TENSORS; i++)
        if (s->b[i]) fa_buffer_free(s->b[i]);
    if (s->bias) fa_buffer_free(s->bias);
    memset(s, 0, sizeof *s);
}

/* The bias of a set: the pool's chunk of random values uploaded over its
 * whole span (timing does not depend on the values). */
static fa_status alloc_bias(fa_context ctx, data_pool *pool, const fa_attention_desc *d, tensor_set *s) {
    const size_t es = fa_dtype_size(d->bias.dtype), bytes = (size_t)bias_bytes(d);
    if (!pool->bias) {
        fa_rng rng;
        fa_rng_seed(&rng, 11);
        pool->bias = fa_test_random_tensor(&rng, d->bias.dtype, UPLOAD_CHUNK_ELEMS);
        if (!pool->bias) return FA_ERR_OUT_OF_MEMORY;
    }
    fa_status st = fa_buffer_alloc(ctx, bytes, &s->bias);
    for (size_t done = 0; st == FA_SUCCESS && done < bytes;) {
        size_t n = bytes - done;
        if (n > (size_t)UPLOAD_CHUNK_ELEMS * es) n = (size_t)UPLOAD_CHUNK_ELEMS * es;
        st = fa_buffer_upload(s->bias, done, pool->bias, n);
        done += n;
    }
    return st;
}

/* Test hook for the out-of-memory path: with FA_BENCH_FAIL_ALLOC=K in the
 * environment, the allocation after the K-th buffer of each point fails as
 * a full device would. */
static int fail_alloc_after = -1;
static int allocs_in_point;

static fa_status alloc_set(fa_context ctx, data_pool *pool, const fa_attention_desc *d, int with_backward,
                           tensor_set *s, const char **msg) {
    int64_t counts[N_TENSORS];
    tensor_counts(d, counts);
    memset(s, 0, sizeof *s);
    fa_status st = FA_SUCCESS;
    for (int i = 0; i < N_TENSORS && st == FA_SUCCESS; i++) {
        if (!tensor_used(i, with_backward)) continue;
        const fa_dtype t = tensor_dtype(i, d);
        if (fail_alloc_after >= 0 && allocs_in_point++ >= fail_alloc_after) {
            *msg = "allocation refused by FA_BENCH_FAIL_ALLOC";
            st = FA_ERR_OUT_OF_MEMORY;
            break;
        }
        st = fa_buffer_alloc(ctx, (size_t)counts[i] * fa_dtype_size(t), &s->b[i]);
        if (st == FA_SUCCESS) st = fill_buffer(pool, s->b[i], t, counts[i], tensor_random(i));
    }
    if (st == FA_SUCCESS && d->bias_batch > 0) st = alloc_bias(ctx, pool, d, s);
    if (st != FA_SUCCESS) free_set(s);
    return st;
}

static fa_status run_forward(fa_plan plan, const tensor_set *t) {
    const fa_buffer *b = t->b;
    const fa_pass_args a = {.q = b[0], .k = b[1], .v = b[2], .o = b[3], .lse = b[4], .bias = t->bias};
    return fa_forward_ex(plan, &a);
}

static fa_status run_backward(fa_plan plan, const tensor_set *t) {
    const fa_buffer *b = t->b;
    const fa_pass_args a = {.q = b[0],    .k = b[1],  .v = b[2],  .o = b[3],  .lse = b[4],
                            .dout = b[5], .dq = b[6], .dk = b[7], .dv = b[8], .bias = t->bias};
    return fa_backward_ex(plan, &a);
}

/* Times one pass alone: each repeat is synchronised, then its device time read. */
static fa_status time_pass(fa_context ctx, fa_plan plan, const tensor_set *sets, int n_sets, int backward,
                           int warmup, int repeats, double *times, double *median) {
    fa_status st = FA_SUCCESS;
    for (int i = 0; i < warmup + repeats && st == FA_SUCCESS; i++) {
        const tensor_set *t = &sets[i % n_sets];
        st = backward ? run_backward(plan, t) : run_forward(plan, t);
        if (st == FA_SUCCESS) st = fa_context_synchronize(ctx);
        if (st == FA_SUCCESS && i >= warmup) st = fa_plan_last_time_ms(plan, &times[i - warmup]);
    }
    if (st == FA_SUCCESS) *median = median_of(times, repeats);
    return st;
}

static void fail(point_result *r, fa_status st, const char *msg) {
    r->ok = 0;
    r->oom = st == FA_ERR_OUT_OF_MEMORY;
    snprintf(r->error, sizeof r->error, "%s: %s", r->oom ? "out of memory" : fa_status_string(st),
             msg && msg[0] ? msg : "(no message)");
}

/* One point: the planner's prediction of the memory the call needs (refused
 * as out of memory when the device cannot hold it), the plan, one set of
 * tensors (a few more to rotate between repeats when small, so that repeats
 * do not run from the cache), then the timed passes. */
static void run_point(fa_context ctx, const fa_device_info *dev, const fa_attention_desc *d, int repeats,
                      int warmup, const bench_opts *o, data_pool *pool, point_result *r) {
    memset(r, 0, sizeof *r);
    const int with_backward = o->bwd || o->fwdbwd;
    int64_t counts[N_TENSORS];
    tensor_counts(d, counts);
    for (int i = 0; i < N_TENSORS; i++)
        if (tensor_used(i, with_backward))
            r->tensor_bytes += (double)counts[i] * (double)fa_dtype_size(tensor_dtype(i, d));
    r->tensor_bytes += bias_bytes(d);

    fa_status st = fa_plan_for_device(&dev->desc, d, &r->info);
    if (st != FA_SUCCESS) {
        fail(r, st, fa_last_error());
        return;
    }
    r->have_info = 1;
    /* The backward pass needs its forward first, so both workspaces count. */
    const fa_plan_info *pi = &r->info;
    r->workspace_bytes = (double)pi->forward.workspace_bytes;
    if (with_backward && (double)pi->backward.workspace_bytes > r->workspace_bytes)
        r->workspace_bytes = (double)pi->backward.workspace_bytes;
    const double need = r->tensor_bytes + r->workspace_bytes;
    if (dev->desc.global_mem_bytes > 0 && need > (double)dev->desc.global_mem_bytes) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "the call needs %.2f GiB (tensors %.2f GiB + workspace %.2f GiB), more than the %.2f GiB of global "
                 "memory of the device",
                 need / 1073741824.0, r->tensor_bytes / 1073741824.0, r->workspace_bytes / 1073741824.0,
                 (double)dev->desc.global_mem_bytes / 1073741824.0);
        fail(r, FA_ERR_OUT_OF_MEMORY, msg);
        return;
    }

    fa_plan plan = NULL;
    tensor_set sets[MAX_SETS];
    memset(sets, 0, sizeof sets);
    int n_sets = 0;
    double *times = NULL, *times2 = NULL, *sums = NULL;
    const char *host_msg = NULL; /* failures of this file's own allocations */

    st = fa_plan_create(ctx, d, &plan);
    if (st == FA_SUCCESS) st = fa_plan_get_info(plan, &r->info);
    if (st == FA_SUCCESS) {
        r->workspace_bytes = (double)pi->forward.workspace_bytes;
        if (with_backward && (double)pi->backward.workspace_bytes > r->workspace_bytes)
            r->workspace_bytes = (double)pi->backward.workspace_bytes;
        int64_t random_elems = 0;
        for (int i = 0; i < N_TENSORS; i++)
            if (tensor_used(i, with_backward) && tensor_random(i)) random_elems += counts[i];
        const int want_sets = r->tensor_bytes < 256e6 ? MAX_SETS : 1;
        st = pool_reserve(pool, d->q.dtype, random_elems * want_sets);
        if (st != FA_SUCCESS) host_msg = "no host memory for the input data";
        allocs_in_point = 0;
        if (st == FA_SUCCESS) st = alloc_set(ctx, pool, d, with_backward, &sets[0], &host_msg);
        if (st == FA_SUCCESS) n_sets = 1;
        /* Extra sets are a nicety: a device short of memory times with fewer. */
        const char *ignored = NULL;
        while (st == FA_SUCCESS && n_sets < want_sets &&
               alloc_set(ctx, pool, d, with_backward, &sets[n_sets], &ignored) == FA_SUCCESS)
            n_sets++;
    }
    if (st == FA_SUCCESS) {
        times = malloc((size_t)repeats * sizeof *times);
        times2 = malloc((size_t)repeats * sizeof *times2);
        sums = malloc((size_t)repeats * sizeof *sums);
        if (!times || !times2 || !sums) {
            st = FA_ERR_OUT_OF_MEMORY;
            host_msg = "no host memory for the timings";
        }
    }
    if (st == FA_SUCCESS && o->fwd) st = time_pass(ctx, plan, sets, n_sets, 0, warmup, repeats, times, &r->fwd_ms);
    if (st == FA_SUCCESS && o->bwd) {
        /* O and L of every set come from a forward pass, as in training. */
        for (int s = 0; s < n_sets && st == FA_SUCCESS; s++) st = run_forward(plan, &sets[s]);
        if (st == FA_SUCCESS) st = fa_context_synchronize(ctx);
        if (st == FA_SUCCESS) st = time_pass(ctx, plan, sets, n_sets, 1, warmup, repeats, times, &r->bwd_ms);
    }
    if (st == FA_SUCCESS && o->fwdbwd) {
        /* The forward's device time is read (which waits for it) before the
         * backward is queued: the plan keeps the events of its last pass. */
        for (int i = 0; i < warmup + repeats && st == FA_SUCCESS; i++) {
            const tensor_set *t = &sets[i % n_sets];
            double f = 0.0, b = 0.0;
            st = run_forward(plan, t);
            if (st == FA_SUCCESS) st = fa_plan_last_time_ms(plan, &f);
            if (st == FA_SUCCESS) st = run_backward(plan, t);
            if (st == FA_SUCCESS) st = fa_context_synchronize(ctx);
            if (st == FA_SUCCESS) st = fa_plan_last_time_ms(plan, &b);
            if (st == FA_SUCCESS && i >= warmup) {
                times[i - warmup] = f;
                times2[i - warmup] = b;
                sums[i - warmup] = f + b;
            }
        }
        if (st == FA_SUCCESS) {
            r->fwd_ms = median_of(times, repeats);
            r->bwd_ms = median_of(times2, repeats);
            r->fwdbwd_ms = median_of(sums, repeats);
        }
    }
    if (st == FA_SUCCESS) r->ok = 1;
    else fail(r, st, host_msg ? host_msg : fa_last_error());
    free(times);
    free(times2);
    free(sums);
    for (int s = 0; s < MAX_SETS; s++) free_set(&sets[s]);
    if (plan) fa_plan_destroy(plan);
}

/* ------------------------------------------------------------------------ */

/* Appends to path; reports whether the file was empty (a CSV header is due). */
static FILE *open_append(const char *path, int *was_empty) {
    FILE *f = fopen(path, "a");
    if (!f) return NULL;
    if (was_empty) {
        fseek(f, 0, SEEK_END);
        *was_empty = ftell(f) == 0;
    }
    return f;
}

static void print_header(const bench_opts *o) {
    printf("%-8s %-5s %4s %7s %5s %5s |", "algo", "dtype", "d", "seqlen", "batch", "heads");
    printf(" %9s %8s %9s %8s |", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s");
    if (o->fwdbwd) printf(" %9s %8s |", "f+b ms", "TFLOP/s");
    printf(" %9s %9s %8s | %9s %6s | %9s\n", "pred fGB", "pred bGB", "fwd GB/s", "roof ms", "%roof", "need MiB");
}

/* A CPU device runs at GFLOP/s: TFLOP/s get more decimals there. */
static void print_ms(double ms, double tf, int ran) {
    if (ran) printf(tf >= 1.0 ? " %9.3f %8.2f" : " %9.3f %8.4f", ms, tf);
    else printf(" %9s %8s", "-", "-");
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--decode") == 0) return fa_bench_decode(argc, argv);
        if (strcmp(argv[i], "--ranks") == 0) return fa_bench_ring(argc, argv);
    }
    bench_opts o;
    char **rest = calloc((size_t)argc + 1, sizeof(char *));
    if (!rest) return 2;
    int rest_argc = 0;
    if (parse_bench(&o, argc, argv, &rest_argc, rest) != 0) {
        free(rest);
        return 2;
    }
    fa_cli cli;
    int rc = fa_cli_parse(&cli, rest_argc, rest);
    if (rc != 0) {
        fa_cli_usage(argv[0], usage_text);
        fa_cli_free(&cli);
        free(rest);
        return rc > 0 ? 0 : 2;
    }
    const int dim = cli.desc.head_dim;
    const int heads_q = o.heads > 0 ? o.heads : (dim > 0 ? o.hidden / dim : 0);
    const int heads_kv = o.heads_kv > 0 ? o.heads_kv : heads_q;
    int bad = 0;
    if (dim <= 0) bad = fprintf(stderr, "fa-bench: --dim %d must be positive\n", dim);
    else if (heads_q < 1)
        bad = fprintf(stderr, "fa-bench: --hidden %d is smaller than --dim %d (no heads)\n", o.hidden, dim);
    else if (heads_q % heads_kv != 0)
        bad = fprintf(stderr, "fa-bench: --heads-kv %d does not divide the %d query heads\n", heads_kv, heads_q);
    else if (cli.repeats < 1) bad = fprintf(stderr, "fa-bench: --repeats %d must be at least 1\n", cli.repeats);
    /* fp8 inputs run the forward only: --pass both (the default) times it
     * alone, bwd and fwdbwd are refused. */
    else if (cli.desc.q.dtype == FA_DTYPE_FP8_E4M3 && (o.fwdbwd || !o.fwd))
        bad = fprintf(stderr, "fa-bench: --dtype %s runs the forward only (--pass fwd)\n",
                      fa_dtype_name(cli.desc.q.dtype));
    else if (cli.desc.block_mask)
        bad = fprintf(stderr, "fa-bench: --block-sparse is not swept (the mask depends on the sequence length)\n");
    else if (!o.algos[ALGO_FUSED] && !o.algos[ALGO_STANDARD]) bad = fprintf(stderr, "fa-bench: --algos is empty\n");
    if (bad) {
        fa_cli_free(&cli);
        free(rest);
        return 2;
    }
    if (cli.desc.q.dtype == FA_DTYPE_FP8_E4M3) {
        o.bwd = 0;
        o.pass_name = "fwd";
    }

    fa_context ctx;
    if (fa_context_create(cli.backend, cli.device, &ctx) != FA_SUCCESS) {
        fprintf(stderr, "fa-bench: %s\n", fa_last_error());
        fa_cli_free(&cli);
        free(rest);
        return 1;
    }
    fa_device_info info;
    fa_context_get_info(ctx, &info);
    int csv_empty = 0;
    FILE *json = o.json ? open_append(o.json, NULL) : NULL;
    FILE *csv = o.csv ? open_append(o.csv, &csv_empty) : NULL;
    if ((o.json && !json) || (o.csv && !csv)) {
        fprintf(stderr, "fa-bench: cannot open %s\n", o.json && !json ? o.json : o.csv);
        if (json) fclose(json);
        fa_context_destroy(ctx);
        fa_cli_free(&cli);
        free(rest);
        return 1;
    }
    if (csv && csv_empty) write_csv_header(csv);

    printf("device: %s (%s), %.1f GiB global memory\n", info.desc.name, fa_backend_name(info.backend),
           (double)info.desc.global_mem_bytes / 1073741824.0);
    printf("pass: %s; need MiB = tensors + workspace allocated by the call; pred fGB/bGB = the IO model's HBM "
           "bytes of the forward/backward\n",
           o.pass_name);
    print_header(&o);
    fflush(stdout);

    const char *hook = getenv("FA_BENCH_FAIL_ALLOC");
    if (hook && hook[0]) fail_alloc_after = atoi(hook);
    const int tty = isatty(STDERR_FILENO);
    int total = 0, index = 0, failures = 0;
    for (int a = 0; a < N_ALGOS; a++) total += o.algos[a] ? o.n_seqlens : 0;
    data_pool pool;
    memset(&pool, 0, sizeof pool);
    /* ALiBi's slopes for the sweep's query heads (the shared options made
     * them for theirs). */
    float *slopes = NULL;
    if (cli.desc.alibi_slopes) {
        slopes = malloc((size_t)heads_q * sizeof *slopes);
        if (!slopes) {
            fprintf(stderr, "fa-bench: no memory for %d ALiBi slopes\n", heads_q);
            fa_context_destroy(ctx);
            fa_cli_free(&cli);
            free(rest);
            return 1;
        }
        fa_cli_alibi_slopes(heads_q, slopes);
    }
    const double t0 = now_s();
    for (int algo = 0; algo < N_ALGOS; algo++) {
        if (!o.algos[algo]) continue;
        for (int p = 0; p < o.n_seqlens; p++) {
            fa_attention_desc d = cli.desc;
            d.algorithm = algo == ALGO_STANDARD ? FA_ALGO_STANDARD : FA_ALGO_FUSED;
            d.seqlen_q = d.seqlen_k = o.seqlens[p];
            long long batch = o.batch > 0 ? o.batch : o.tokens / o.seqlens[p];
            d.batch = batch < 1 ? 1 : batch > 2147483647LL ? 2147483647 : (int)batch;
            d.heads_q = heads_q;
            d.heads_kv = heads_kv;
            if (d.alibi_slopes) d.alibi_slopes = slopes;
            if (d.bias_batch > 0) {
                d.bias_batch = d.batch;
                d.bias_heads = d.heads_q;
            }
            const char *algo_name = algo_names[algo];
            index++;
            fprintf(stderr, "%s[%d/%d] %s N=%d (batch %d, heads %d) ... %.1f s elapsed%s", tty ? "\r" : "", index,
                    total, algo_name, d.seqlen_q, d.batch, d.heads_q, now_s() - t0, tty ? "   " : "\n");
            fflush(stderr);

            point_result r;
            run_point(ctx, &info, &d, cli.repeats, o.warmup, &o, &pool, &r);

            record rec;
            memset(&rec, 0, sizeof rec);
            rec.label = o.label ? o.label : "";
            rec.backend = fa_backend_name(info.backend);
            rec.device = info.desc.name;
            rec.algo = algo_name;
            rec.dtype = fa_dtype_name(d.q.dtype);
            rec.pass = o.pass_name;
            rec.d = d.head_dim;
            rec.n = d.seqlen_q;
            rec.b = d.batch;
            rec.h = d.heads_q;
            rec.h_kv = d.heads_kv;
            rec.causal = d.causal != 0;
            {
                int n = 0;
                rec.options[0] = '\0';
                if (d.softcap > 0.0f)
                    n += snprintf(rec.options + n, sizeof rec.options - (size_t)n, "softcap=%g", (double)d.softcap);
                if (d.alibi_slopes && (size_t)n < sizeof rec.options)
                    n += snprintf(rec.options + n, sizeof rec.options - (size_t)n, "%salibi", n ? " " : "");
                if (d.bias_batch > 0 && (size_t)n < sizeof rec.options)
                    snprintf(rec.options + n, sizeof rec.options - (size_t)n, "%sbias=%s", n ? " " : "",
                             fa_dtype_name(d.bias.dtype));
            }
            rec.has_memory = r.have_info;
            rec.tensor_bytes = r.tensor_bytes;
            rec.workspace_bytes = r.workspace_bytes;
            rec.device_bytes = r.tensor_bytes + r.workspace_bytes;

            printf("%-8s %-5s %4d %7d %5d %5d |", algo_name, rec.dtype, d.head_dim, d.seqlen_q, d.batch, d.heads_q);
            if (!r.ok) {
                if (!r.oom) failures++;
                rec.has_error = 1;
                rec.error = r.oom ? "oom" : "failed";
                snprintf(rec.message, sizeof rec.message, "%s", r.error);
                if (r.have_info) printf(" %s (needs %.0f MiB)\n", r.error, rec.device_bytes / 1048576.0);
                else printf(" %s\n", r.error);
            } else {
                const double ff = fa_attention_flops(&d, FA_PASS_FORWARD), fb = fa_attention_flops(&d, FA_PASS_BACKWARD);
                const fa_cost *cf = &r.info.forward.cost, *cb = &r.info.backward.cost;
                rec.has_timing = 1;
                rec.has_fwdbwd = o.fwdbwd;
                rec.fwd_ms = r.fwd_ms;
                rec.bwd_ms = r.bwd_ms;
                rec.fwdbwd_ms = r.fwdbwd_ms;
                rec.fwd_tflops = r.fwd_ms > 0 ? ff / r.fwd_ms * 1e-9 : 0;
                rec.bwd_tflops = r.bwd_ms > 0 ? fb / r.bwd_ms * 1e-9 : 0;
                rec.fwdbwd_tflops = r.fwdbwd_ms > 0 ? (ff + fb) / r.fwdbwd_ms * 1e-9 : 0;
                /* DRAM bytes (re-reads the last-level cache serves left
                 * out), and every tile load (the traffic the tiles decide). */
                rec.pred_fwd_bytes = cf->dram_read_bytes + cf->dram_write_bytes;
                rec.pred_bwd_bytes = cb->dram_read_bytes + cb->dram_write_bytes;
                rec.pred_fwd_tile_bytes = cf->hbm_read_bytes + cf->hbm_write_bytes;
                rec.pred_bwd_tile_bytes = cb->hbm_read_bytes + cb->hbm_write_bytes;
                rec.roofline_fwd_ms = cf->roofline_ms;
                rec.roofline_bwd_ms = cb->roofline_ms;
                rec.br = r.info.forward.br;
                rec.bc = r.info.forward.bc;
                rec.wg = r.info.forward.work_group_size;
                const int ran_fwd = o.fwd || o.fwdbwd, ran_bwd = o.bwd || o.fwdbwd;
                print_ms(r.fwd_ms, rec.fwd_tflops, ran_fwd);
                print_ms(r.bwd_ms, rec.bwd_tflops, ran_bwd);
                printf(" |");
                if (o.fwdbwd) {
                    print_ms(r.fwdbwd_ms, rec.fwdbwd_tflops, 1);
                    printf(" |");
                }
                const double gbs = r.fwd_ms > 0 ? rec.pred_fwd_bytes / (r.fwd_ms * 1e-3) * 1e-9 : 0;
                printf(" %9.3f %9.3f", rec.pred_fwd_bytes * 1e-9, rec.pred_bwd_bytes * 1e-9);
                if (ran_fwd) printf(" %8.1f |", gbs);
                else printf(" %8s |", "-");
                if (ran_fwd) printf(" %9.3f %5.1f%% |", cf->roofline_ms, cf->roofline_ms / r.fwd_ms * 100);
                else printf(" %9s %6s |", "-", "-");
                printf(" %9.0f\n", rec.device_bytes / 1048576.0);
            }
            fflush(stdout);
            if (json) write_json(json, &rec);
            if (csv) write_csv(csv, &rec);
        }
    }
    fprintf(stderr, "%s%d points in %.1f s%s\n", tty ? "\r" : "", total, now_s() - t0, tty ? "                    " : "");
    pool_free(&pool);
    free(slopes);
    if (json) fclose(json);
    if (csv) fclose(csv);
    fa_context_destroy(ctx);
    fa_cli_free(&cli);
    free(rest);
    return failures ? 1 : 0;
}
