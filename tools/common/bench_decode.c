/* fa-bench --decode: one decoding step (a few query tokens against a
 * KV cache) over a grid of batch sizes and cache lengths: a forward pass
 * over a contiguous cache (fa_forward), or with --kvcache, --page-size,
 * --append or --rotary a KV-cache step (fa_forward_kvcache: a contiguous or
 * paged cache, tokens appended, rotary embedding). Per point: the median
 * device time of the step, the bytes of K and V it must read (each KV
 * head's keys once), their rate, and that rate as a
 * fraction of the copy bandwidth measured in the same run (a device-to-device
 * copy of the same K and V, bytes read + written over its time, the way
 * the device's copy bandwidth is quoted), and beside it the rate of a
 * kernel that only reads the same K and V (kernels_cuda/stream_read.cu):
 * what no step can beat on this device, timed the same way. Every timed
 * run, copy, read or attention, starts with the last-level cache flushed
 * through a buffer larger than it, so small caches are not served from it:
 * by a copy (the default, as bench/decode_sdpa.py's fill: the cache is left
 * full of dirty lines that the timed run writes back as it reads) or, with
 * --flush read, by a read (the cache is left clean, as after the weight
 * reads of a model's other layers). */
#include "bench_decode.h"

#include "cli.h"
#include "desc.h"
#include "test_util.h"

#ifdef FA_WITH_CUDA
#include "backends/cuda/cuda_runtime_internal.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEC_MAX_POINTS 32
/* Host random values uploaded over and over to fill the cache. */
#define DEC_CHUNK_ELEMS ((int64_t)1 << 22)
/* The flush: larger than any last-level cache of the devices we run on. */
#define DEC_FLUSH_BYTES ((size_t)512 << 20)

typedef struct dec_opts {
    int batches[DEC_MAX_POINTS], n_batches;
    int caches[DEC_MAX_POINTS], n_caches;
    int seqlen_q_given;
    const char *csv;
    /* A KV-cache step (fa_forward_kvcache) instead of fa_forward. */
    int kvcache;
    int page_size, append, rotary;
    /* The flush before each timed run: a read instead of a copy. */
    int flush_read;
} dec_opts;

/* "1,8,64" into out; 0 on success. */
static int parse_list(const char *name, const char *v, int *out, int *n) {
    *n = 0;
    const char *p = v;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 1L << 30 || (*end != ',' && *end != '\0') || *n >= DEC_MAX_POINTS) {
            fprintf(stderr, "fa-bench --decode: %s %s: expected up to %d positive integers separated by commas\n",
                    name, v, DEC_MAX_POINTS);
            return -1;
        }
        out[(*n)++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) {
        fprintf(stderr, "fa-bench --decode: %s is empty\n", name);
        return -1;
    }
    return 0;
}

static const char dec_usage[] =
    "fa-bench --decode (one decoding step against a KV cache):\n"
    "  --batch LIST        sequences, e.g. 1,8,64 (default 1)\n"
    "  --cache LIST        cache lengths (keys in each cache before the step),\n"
    "                      e.g. 4096,16384 (default 4096)\n"
    "  --seqlen-q N        query tokens a step (default 1; with --append, N)\n"
    "  --heads H           query heads; --heads-kv H: KV heads (GQA groups)\n"
    "  --dim D, --dtype T  head_dim and dtype, as for the other tools\n"
    "  --kvcache           run fa_forward_kvcache on a contiguous cache (without\n"
    "                      it and the three below: fa_forward on K and V)\n"
    "  --page-size P       a paged cache of P-token pages (a multiple of 16 up to\n"
    "                      256), each sequence's pages scattered over the pool\n"
    "  --append N          N tokens appended to each cache in the step (the\n"
    "                      capacity is then the cache length + N)\n"
    "  --rotary D          rotary embedding of the first D dimensions (half-split)\n"
    "  --flush copy|read   how the last-level cache is flushed before each\n"
    "                      timed run: a copy (default; leaves it dirty) or a\n"
    "                      read (leaves it clean)\n"
    "  --csv FILE          append one CSV row per point\n"
    "Columns: ms = median device time of the step; KV GB = bytes of K and V\n"
    "a step must read (each KV head once, appended tokens included); GB/s =\n"
    "KV GB / ms; copy GB/s = a device-to-device copy of the same K and V,\n"
    "bytes read + written over its time (CUDA only); frac = GB/s / copy GB/s;\n"
    "read GB/s = a kernel that only reads the same K and V (CUDA only);\n"
    "rfrac = GB/s / read GB/s.\n";

/* A non-negative count option; 0 on success. */
static int parse_count(const char *name, const char *v, int lo, int hi, int *out) {
    char *end;
    const long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < lo || x > hi) {
        fprintf(stderr, "fa-bench --decode: %s %s: expected an integer in [%d, %d]\n", name, v, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* Takes the decode options out of argv; the rest goes to fa_cli_parse. */
static int parse_decode(dec_opts *o, int argc, char **argv, int *rest_argc, char **rest) {
    memset(o, 0, sizeof *o);
    o->batches[0] = 1;
    o->n_batches = 1;
    o->caches[0] = 4096;
    o->n_caches = 1;
    *rest_argc = 0;
    rest[(*rest_argc)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--decode") == 0) continue;
        if (strcmp(a, "--kvcache") == 0) {
            o->kvcache = 1;
            continue;
        }
        if (strcmp(a, "--flush") == 0) {
            if (!v || (strcmp(v, "copy") != 0 && strcmp(v, "read") != 0)) {
                fprintf(stderr, "fa-bench --decode: --flush takes copy or read\n");
                return -1;
            }
            o->flush_read = strcmp(v, "read") == 0;
            i++;
            continue;
        }
        const int counted = strcmp(a, "--page-size") == 0 || strcmp(a, "--append") == 0 || strcmp(a, "--rotary") == 0;
        if (counted) {
            if (!v) {
                fprintf(stderr, "fa-bench --decode: %s needs a value\n", a);
                return -1;
            }
            i++;
            o->kvcache = 1;
            /* The descriptor check says what a value may be; these bound the
             * parse. */
            if (strcmp(a, "--page-size") == 0 ? parse_count(a, v, 0, 256, &o->page_size)
                : strcmp(a, "--append") == 0  ? parse_count(a, v, 0, 1 << 20, &o->append)
                                              : parse_count(a, v, 0, 256, &o->rotary))
                return -1;
            continue;
        }
        if (strcmp(a, "--seqlen-q") == 0 || strcmp(a, "--seqlen") == 0) o->seqlen_q_given = 1;
        if (strcmp(a, "--seqlen-k") == 0 || strcmp(a, "--seqlen") == 0) {
            fprintf(stderr, "fa-bench --decode: give cache lengths with --cache, not %s\n", a);
            return -1;
        }
        const int ours = strcmp(a, "--batch") == 0 || strcmp(a, "--cache") == 0 || strcmp(a, "--csv") == 0;
        if (!ours) {
            rest[(*rest_argc)++] = argv[i];
            continue;
        }
        if (!v) {
            fprintf(stderr, "fa-bench --decode: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (strcmp(a, "--csv") == 0) o->csv = v;
        else if (parse_list(a, v, strcmp(a, "--batch") == 0 ? o->batches : o->caches,
                            strcmp(a, "--batch") == 0 ? &o->n_batches : &o->n_caches) != 0)
            return -1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Random values in every element of buf (count elements of dt). */
static fa_status fill_random(fa_buffer buf, fa_dtype dt, int64_t count, const void *chunk) {
    const size_t es = fa_dtype_size(dt);
    for (int64_t done = 0; done < count;) {
        const int64_t n = count - done < DEC_CHUNK_ELEMS ? count - done : DEC_CHUNK_ELEMS;
        fa_status st = fa_buffer_upload(buf, (size_t)done * es, chunk, (size_t)n * es);
        if (st != FA_SUCCESS) return st;
        done += n;
    }
    return FA_SUCCESS;
}

typedef struct dec_buffers {
    fa_buffer q, k, v, o, lse, scratch, flush_a, flush_b;
    int flush_read; /* dec_opts.flush_read */
    fa_buffer lens, table, k_new, v_new, cos_t, sin_t; /* a KV-cache step's */
} dec_buffers;

static void free_buffers(dec_buffers *b) {
    fa_buffer *all[] = {&b->q,       &b->k,       &b->v,    &b->o,     &b->lse,   &b->scratch, &b->flush_a,
                        &b->flush_b, &b->lens,    &b->table, &b->k_new, &b->v_new, &b->cos_t,   &b->sin_t};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (*all[i]) fa_buffer_free(*all[i]);
    memset(b, 0, sizeof *b);
}

/* An untimed copy (or read) through a buffer larger than the last-level
 * cache (CUDA only: where flush_a is NULL, nothing), left in flight: the timed launch
 * is queued behind it, so its start event is not recorded on an idle
 * device waiting for the host (as PyTorch's timings in
 * bench/decode_sdpa.py are not; a flush that waited for its copy added the
 * host's launch time, 5-8 us, to every step). */
static fa_status flush_cache(const dec_buffers *b) {
#ifdef FA_WITH_CUDA
    if (b->flush_a && b->flush_read) return fa_cuda_read_async(b->flush_a, DEC_FLUSH_BYTES);
    if (b->flush_a) return fa_cuda_copy_async(b->flush_b, b->flush_a, DEC_FLUSH_BYTES);
#else
    (void)b;
#endif
    return FA_SUCCESS;
}

typedef struct dec_point {
    double ms, copy_ms, read_ms, kv_bytes, read_bytes;
    int have_copy, have_read;
    fa_plan_info info;
} dec_point;

/* An int32 array of count entries, each from value(i, ctx). */
static fa_status upload_ints(fa_context ctx, int64_t count, int32_t (*value)(int64_t, const void *), const void *arg,
                             fa_buffer *buf) {
    int32_t *host = malloc((size_t)(count > 0 ? count : 1) * sizeof *host);
    if (!host) return FA_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < count; i++) host[i] = value(i, arg);
    fa_status st = fa_buffer_alloc(ctx, (size_t)(count > 0 ? count : 1) * sizeof *host, buf);
    if (st == FA_SUCCESS) st = fa_buffer_upload(*buf, 0, host, (size_t)count * sizeof *host);
    free(host);
    return st;
}

static int32_t cache_length(int64_t i, const void *arg) {
    (void)i;
    return *(const int32_t *)arg;
}

/* Sequence b's page p is pool page p * batch + b: every sequence's pages
 * scattered over the pool, as an allocator's are after a while. */
static int32_t scattered_page(int64_t i, const void *arg) {
    const fa_attention_desc *d = arg;
    const int64_t pps = ((int64_t)d->seqlen_k + d->page_size - 1) / d->page_size;
    return (int32_t)((i % pps) * d->batch + i / pps);
}

/* The rotary tables: fp32 [seqlen_k, rotary_dim / 2] of angles pos / 10000^(2i / D). */
static fa_status upload_table(fa_context ctx, const fa_attention_desc *d, int sine, fa_buffer *buf) {
    const int half = d->rotary_dim / 2;
    const size_t count = (size_t)d->seqlen_k * (size_t)half;
    float *host = malloc(count * sizeof *host);
    if (!host) return FA_ERR_OUT_OF_MEMORY;
    for (int64_t p = 0; p < d->seqlen_k; p++)
        for (int i = 0; i < half; i++) {
            const double a = (double)p / pow(10000.0, 2.0 * i / d->rotary_dim);
            host[p * half + i] = (float)(sine ? sin(a) : cos(a));
        }
    fa_status st = fa_buffer_alloc(ctx, count * sizeof *host, buf);
    if (st == FA_SUCCESS) st = fa_buffer_upload(*buf, 0, host, count * sizeof *host);
    free(host);
    return st;
}

/* A KV-cache step's own buffers: lengths, block table, appended tokens,
 * rotary tables. */
static fa_status kvcache_buffers(fa_context ctx, const fa_attention_desc *d, int32_t cache, const void *chunk,
                                 dec_buffers *b) {
    const fa_dtype dt = d->q.dtype;
    fa_status st = upload_ints(ctx, d->batch, cache_length, &cache, &b->lens);
    if (st == FA_SUCCESS && d->page_size > 0)
        st = upload_ints(ctx, fa_desc_block_table_entries(d), scattered_page, d, &b->table);
    if (st == FA_SUCCESS && d->seqlen_new > 0) {
        const int64_t nn = fa_desc_tensor_extent(d, FA_TENSOR_K_NEW);
        st = fa_buffer_alloc(ctx, (size_t)nn * fa_dtype_size(dt), &b->k_new);
        if (st == FA_SUCCESS) st = fa_buffer_alloc(ctx, (size_t)nn * fa_dtype_size(dt), &b->v_new);
        if (st == FA_SUCCESS) st = fill_random(b->k_new, dt, nn, chunk);
        if (st == FA_SUCCESS) st = fill_random(b->v_new, dt, nn, chunk);
    }
    if (st == FA_SUCCESS && d->rotary_dim > 0) st = upload_table(ctx, d, 0, &b->cos_t);
    if (st == FA_SUCCESS && d->rotary_dim > 0) st = upload_table(ctx, d, 1, &b->sin_t);
    return st;
}

static fa_status run_step(fa_plan plan, const fa_attention_desc *d, const dec_buffers *b) {
    if (!d->kv_cache) return fa_forward(plan, b->q, b->k, b->v, b->o, b->lse);
    const fa_kvcache_args a = {b->q, b->k, b->v, b->o, b->lse, b->lens, b->table, b->k_new, b->v_new, b->cos_t,
                               b->sin_t};
    return fa_forward_kvcache(plan, &a);
}

/* cache: keys in each cache before the step (d->seqlen_k without
 * kv_cache, d->seqlen_k - d->seqlen_new with it). */
static fa_status run_decode_point(fa_context ctx, const fa_attention_desc *d, int cache, int repeats,
                                  int flush_read, const void *chunk, dec_point *res, const char **why) {
    memset(res, 0, sizeof *res);
    const fa_dtype dt = d->q.dtype;
    const size_t es = fa_dtype_size(dt);
    const int64_t nq = fa_attention_total_q(d) * d->heads_q * d->head_dim;
    /* K and V: the whole cache (a pool of pages where paged). */
    const int64_t nk = d->kv_cache ? fa_desc_tensor_extent(d, FA_TENSOR_K)
                                   : fa_attention_total_k(d) * d->heads_kv * d->head_dim;
    const int64_t nl = fa_attention_total_q(d) * d->heads_q;
    /* What a step must read: each sequence's keys, once per KV head. */
    res->kv_bytes = 2.0 * (double)d->batch * (double)(cache + (d->kv_cache ? d->seqlen_new : 0)) *
                    (double)d->heads_kv * (double)d->head_dim * (double)es;
    dec_buffers b;
    memset(&b, 0, sizeof b);
    b.flush_read = flush_read;
    fa_plan plan = NULL;
    double *times = calloc((size_t)repeats, sizeof *times);
    fa_status st = times ? FA_SUCCESS : FA_ERR_OUT_OF_MEMORY;
    *why = times ? NULL : "no host memory for the timings";
    if (st == FA_SUCCESS) st = fa_buffer_alloc(ctx, (size_t)nq * es, &b.q);
    if (st == FA_SUCCESS) st = fa_buffer_alloc(ctx, (size_t)nk * es, &b.k);
    if (st == FA_SUCCESS) st = fa_buffer_alloc(ctx, (size_t)nk * es, &b.v);
    if (st == FA_SUCCESS) st = fa_buffer_alloc(ctx, (size_t)nq * es, &b.o);
    if (st == FA_SUCCESS) st = fa_buffer_alloc(ctx, (size_t)nl * sizeof(float), &b.lse);
    fa_device_info info;
    const int cuda = fa_context_get_info(ctx, &info) == FA_SUCCESS && info.backend == FA_BACKEND_CUDA;
    if (st == FA_SUCCESS && cuda) st = fa_buffer_alloc(ctx, DEC_FLUSH_BYTES, &b.flush_a);
    /* A copy's destination; a read flush needs none. */
    if (st == FA_SUCCESS && cuda && !flush_read) st = fa_buffer_alloc(ctx, DEC_FLUSH_BYTES, &b.flush_b);
    if (st == FA_SUCCESS) st = fill_random(b.q, dt, nq, chunk);
    if (st == FA_SUCCESS) st = fill_random(b.k, dt, nk, chunk);
    if (st == FA_SUCCESS) st = fill_random(b.v, dt, nk, chunk);
    if (st == FA_SUCCESS && d->kv_cache) st = kvcache_buffers(ctx, d, cache, chunk, &b);
    if (st == FA_SUCCESS) st = fa_plan_create(ctx, d, &plan);
    if (st == FA_SUCCESS) st = fa_plan_get_info(plan, &res->info);
    const int warmup = 3;
    for (int i = 0; i < warmup + repeats && st == FA_SUCCESS; i++) {
        st = flush_cache(&b);
        if (st == FA_SUCCESS) st = run_step(plan, d, &b);
        if (st == FA_SUCCESS) st = fa_context_synchronize(ctx);
        if (st == FA_SUCCESS && i >= warmup) st = fa_plan_last_time_ms(plan, &times[i - warmup]);
    }
    if (st == FA_SUCCESS) res->ms = median(times, repeats);
#ifdef FA_WITH_CUDA
    /* The copy: K then V into one scratch buffer, each after a flush. */
    if (st == FA_SUCCESS && cuda) {
        st = fa_buffer_alloc(ctx, (size_t)nk * es, &b.scratch);
        for (int i = 0; i < warmup + repeats && st == FA_SUCCESS; i++) {
            double tk = 0.0, tv = 0.0;
            st = flush_cache(&b);
            if (st == FA_SUCCESS) st = fa_cuda_time_copy(b.scratch, b.k, (size_t)nk * es, &tk);
            if (st == FA_SUCCESS) st = flush_cache(&b);
            if (st == FA_SUCCESS) st = fa_cuda_time_copy(b.scratch, b.v, (size_t)nk * es, &tv);
            if (i >= warmup) times[i - warmup] = tk + tv;
        }
        if (st == FA_SUCCESS) {
            res->copy_ms = median(times, repeats);
            res->have_copy = 1;
        }
        /* The read: K and V in one launch, after a flush (the whole pool
         * where paged: every page of it is some sequence's). */
        for (int i = 0; i < warmup + repeats && st == FA_SUCCESS; i++) {
            double t = 0.0;
            st = flush_cache(&b);
            if (st == FA_SUCCESS) st = fa_cuda_time_read(b.k, (size_t)nk * es, b.v, (size_t)nk * es, &t);
            if (i >= warmup) times[i - warmup] = t;
        }
        if (st == FA_SUCCESS) {
            res->read_ms = median(times, repeats);
            res->read_bytes = 2.0 * (double)nk * (double)es;
            res->have_read = 1;
        }
    }
#endif
    if (plan) fa_plan_destroy(plan);
    free_buffers(&b);
    free(times);
    return st;
}

int fa_bench_decode(int argc, char **argv) {
    dec_opts o;
    char **rest = calloc((size_t)argc + 1, sizeof(char *));
    if (!rest) return 2;
    int rest_argc = 0;
    if (parse_decode(&o, argc, argv, &rest_argc, rest) != 0) {
        free(rest);
        return 2;
    }
    fa_cli cli;
    int rc = fa_cli_parse(&cli, rest_argc, rest);
    if (rc != 0) {
        fa_cli_usage(argv[0], dec_usage);
        fa_cli_free(&cli);
        free(rest);
        return rc > 0 ? 0 : 2;
    }
    int bad = 0;
    if (cli.desc.block_mask || cli.desc.cu_seqlens_q)
        bad = fprintf(stderr, "fa-bench --decode: block masks and varlen batches are not benchmarked here\n");
    else if (cli.repeats < 1)
        bad = fprintf(stderr, "fa-bench --decode: --repeats %d must be at least 1\n", cli.repeats);
    fa_context ctx = NULL;
    if (!bad && fa_context_create(cli.backend, cli.device, &ctx) != FA_SUCCESS) {
        fprintf(stderr, "fa-bench --decode: %s\n", fa_last_error());
        bad = 1;
    }
    FILE *csv = NULL;
    if (!bad && o.csv) {
        csv = fopen(o.csv, "a");
        if (!csv) bad = fprintf(stderr, "fa-bench --decode: cannot open %s\n", o.csv);
        else if (fseek(csv, 0, SEEK_END) == 0 && ftell(csv) == 0)
            fprintf(csv, "device,dtype,d,batch,cache,seqlen_q,heads_q,heads_kv,variant,br,splits,ms,kv_bytes,"
                         "pred_read_bytes,gbs,copy_gbs,fraction,api,page_size,append,rotary,read_gbs,read_fraction,"
                         "flush\n");
    }
    void *chunk = NULL;
    if (!bad) {
        fa_rng rng;
        fa_rng_seed(&rng, 11);
        chunk = fa_test_random_tensor(&rng, cli.desc.q.dtype, DEC_CHUNK_ELEMS);
        if (!chunk) bad = fprintf(stderr, "fa-bench --decode: no host memory for the input data\n");
    }
    if (bad) {
        if (csv) fclose(csv);
        if (ctx) fa_context_destroy(ctx);
        fa_cli_free(&cli);
        free(rest);
        return 2;
    }
    fa_device_info info;
    fa_context_get_info(ctx, &info);
    const int sq = o.seqlen_q_given ? cli.desc.seqlen_q : o.append > 0 ? o.append : 1;
    char cache_kind[96];
    if (o.page_size > 0)
        snprintf(cache_kind, sizeof cache_kind, "paged cache (%d-token pages, scattered)", o.page_size);
    else
        snprintf(cache_kind, sizeof cache_kind, "contiguous cache");
    printf("device: %s (%s); decoding: seqlen_q %d, heads %d on %d KV heads, d%d, %s, %s, %s", info.desc.name,
           fa_backend_name(info.backend), sq, cli.desc.heads_q, cli.desc.heads_kv, cli.desc.head_dim,
           fa_dtype_name(cli.desc.q.dtype), cache_kind, o.kvcache ? "fa_forward_kvcache" : "fa_forward");
    if (o.append > 0) printf(", %d tokens appended", o.append);
    if (o.rotary > 0) printf(", rotary %d", o.rotary);
    printf("\n");
    printf("flush before each timed run: %s\n", o.flush_read ? "read (clean cache)" : "copy (dirty cache)");
    printf("%5s %7s | %-7s %4s %5s | %9s %8s %9s | %9s %6s | %9s %6s\n", "batch", "cache", "kernel", "rows", "split",
           "ms", "KV GB", "GB/s", "copy GB/s", "frac", "read GB/s", "rfrac");
    int failures = 0;
    for (int bi = 0; bi < o.n_batches; bi++)
        for (int ci = 0; ci < o.n_caches; ci++) {
            fa_attention_desc d = cli.desc;
            d.batch = o.batches[bi];
            d.seqlen_q = sq;
            d.seqlen_k = o.caches[ci];
            if (o.kvcache) {
                d.kv_cache = 1;
                d.seqlen_k = o.caches[ci] + o.append;
                d.page_size = o.page_size;
                d.seqlen_new = o.append;
                if (o.append > 0) d.k_new.dtype = d.v_new.dtype = d.q.dtype;
                d.rotary_dim = o.rotary;
                /* One pool page for each page of each sequence. */
                const int64_t pages = o.page_size > 0 ? fa_desc_block_table_entries(&d) : 0;
                if (pages > INT32_MAX) {
                    printf("%5d %7d | more than 2^31 - 1 pages: skipped\n", d.batch, o.caches[ci]);
                    continue;
                }
                d.num_pages = (int)pages;
            }
            printf("%5d %7d |", d.batch, o.caches[ci]);
            fflush(stdout);
            dec_point r;
            const char *why = NULL;
            fa_status st = run_decode_point(ctx, &d, o.caches[ci], cli.repeats, o.flush_read, chunk, &r, &why);
            if (st != FA_SUCCESS) {
                failures += st != FA_ERR_OUT_OF_MEMORY;
                printf(" %s: %s\n", fa_status_string(st), why ? why : fa_last_error());
                continue;
            }
            const fa_kernel_plan *f = &r.info.forward;
            const double gbs = r.kv_bytes / (r.ms * 1e-3) * 1e-9;
            const double copy_gbs = r.have_copy ? 2.0 * r.kv_bytes / (r.copy_ms * 1e-3) * 1e-9 : 0.0;
            printf(" %-7s %4d %5d | %9.4f %8.3f %9.1f |", fa_variant_name(f->variant), f->br, f->split_k, r.ms,
                   r.kv_bytes * 1e-9, gbs);
            const double read_gbs = r.have_read ? r.read_bytes / (r.read_ms * 1e-3) * 1e-9 : 0.0;
            if (r.have_copy) printf(" %9.1f %6.3f |", copy_gbs, gbs / copy_gbs);
            else printf(" %9s %6s |", "-", "-");
            if (r.have_read) printf(" %9.1f %6.3f\n", read_gbs, gbs / read_gbs);
            else printf(" %9s %6s\n", "-", "-");
            fflush(stdout);
            if (csv)
                fprintf(csv,
                        "\"%s\",%s,%d,%d,%d,%d,%d,%d,%s,%d,%d,%.6f,%.0f,%.0f,%.2f,%.2f,%.4f,%s,%d,%d,%d,%.2f,%.4f,%s\n",
                        info.desc.name, fa_dtype_name(d.q.dtype), d.head_dim, d.batch, o.caches[ci], d.seqlen_q,
                        d.heads_q, d.heads_kv, fa_variant_name(f->variant), f->br, f->split_k, r.ms, r.kv_bytes,
                        f->cost.hbm_read_bytes, gbs, copy_gbs, r.have_copy ? gbs / copy_gbs : 0.0,
                        o.kvcache ? "kvcache" : "forward", o.page_size, o.append, o.rotary, read_gbs,
                        r.have_read ? gbs / read_gbs : 0.0, o.flush_read ? "read" : "copy");
        }
    free(chunk);
    if (csv) fclose(csv);
    fa_context_destroy(ctx);
    fa_cli_free(&cli);
    free(rest);
    return failures ? 1 : 0;
}
