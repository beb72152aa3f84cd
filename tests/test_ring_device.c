/* The ring's GPU pieces on the devices of this machine:
 * - the element-wise passes (rows, rows_merge) of the CUDA and HIP
 *   backends, called through the ops table as core does, against the host
 *   element for element: every dtype pair of copy and add bit for bit,
 *   strided views whose padding must stay untouched, an L view of dim 1,
 *   more lines than the grid holds, offsets and strides past 2^31
 *   elements, and the merge's four cases (either side without a key, NaN,
 *   both finite) within the rounding of expf and log1pf;
 * - with two GPUs or more, the NCCL transport between two contexts of one
 *   process (communicators from ncclCommInitAll, loaded through the
 *   library's loader; one thread a rank): transfers ordered after and
 *   before work on each context's queue with no host wait, two in flight
 *   and a third refused, agreement on maxima, and a communicator of
 *   another device refused.
 * Each case skips (77) with its reason where its backend, its devices or
 * NCCL are missing.
 *
 * fa-test-labels: device */
#include "harness.h"
#include "test_util.h"

#include "backend.h"
#include "collective.h"
#include "dtype.h"
#include "fa_internal.h"
#include "plan.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_skip[1024];

static const fa_backend gpu_backends[] = {FA_BACKEND_CUDA, FA_BACKEND_HIP};
static const fa_dtype all_dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

/* ------------------------------------------------------------------------ */
/* Views on the host and on the device                                       */

/* A view with its own buffer: the host's copy of every element of the
 * buffer, padding included, and the device's. */
typedef struct test_view {
    fa_rows_view v;
    int64_t elems; /* of the whole buffer */
    void *host;
    fa_buffer dev;
} test_view;

static int64_t index_of(const fa_rows_view *v, int64_t b, int64_t s, int64_t h, int64_t x) {
    return v->offset + b * v->stride_batch + s * v->stride_seq + h * v->stride_head + x;
}

/* [batch, rows, heads, dim] with pad elements after each head's row and
 * offset elements before the first: nothing packed. */
static fa_rows_view padded_view(const fa_rows_shape *sh, fa_dtype dtype, int64_t pad, int64_t offset) {
    fa_rows_view v;
    memset(&v, 0, sizeof v);
    v.dtype = dtype;
    v.offset = offset;
    v.stride_head = sh->dim + pad;
    v.stride_seq = sh->heads * v.stride_head + pad;
    v.stride_batch = sh->rows * v.stride_seq + pad;
    return v;
}

/* A log-sum-exp laid out [batch, heads, rows] (core/backend.h's L view). */
static fa_rows_view lse_view(const fa_rows_shape *sh, int64_t offset) {
    fa_rows_view v;
    memset(&v, 0, sizeof v);
    v.dtype = FA_DTYPE_F32;
    v.offset = offset;
    v.stride_seq = 1;
    v.stride_head = sh->rows;
    v.stride_batch = (int64_t)sh->heads * sh->rows;
    return v;
}

/* The buffer a view spans (dim elements a line), filled with random
 * values of its dtype and uploaded. */
static int view_make(fa_context ctx, const fa_rows_view *v, const fa_rows_shape *sh, int dim, fa_rng *rng,
                     test_view *out) {
    memset(out, 0, sizeof *out);
    out->v = *v;
    out->elems = index_of(v, sh->batch - 1, sh->rows - 1, sh->heads - 1, dim - 1) + 1;
    out->host = fa_test_random_tensor(rng, v->dtype, out->elems);
    const size_t bytes = (size_t)out->elems * fa_dtype_size(v->dtype);
    if (!out->host) return 0;
    fa_status st = fa_buffer_alloc(ctx, bytes, &out->dev);
    if (st == FA_SUCCESS) st = fa_buffer_upload(out->dev, 0, out->host, bytes);
    CHECK_MSG(st == FA_SUCCESS, "a %zu-byte view buffer: %s", bytes, fa_last_error());
    if (st != FA_SUCCESS) return 0;
    out->v.buf = out->dev->impl;
    return 1;
}

static void view_free(test_view *t) {
    if (t->dev) fa_buffer_free(t->dev);
    free(t->host);
    memset(t, 0, sizeof *t);
}

/* The device's buffer, downloaded; NULL on failure (reported). */
static void *view_download(const test_view *t) {
    const size_t bytes = (size_t)t->elems * fa_dtype_size(t->v.dtype);
    void *got = malloc(bytes);
    CHECK(got != NULL);
    if (!got) return NULL;
    fa_status st = fa_buffer_download(t->dev, 0, got, bytes);
    CHECK_MSG(st == FA_SUCCESS, "download: %s", fa_last_error());
    if (st != FA_SUCCESS) {
        free(got);
        return NULL;
    }
    return got;
}

/* Every element of got equals want's, bit for bit; reports the first
 * that does not. */
static void check_same(const char *what, const void *got, const void *want, fa_dtype dtype, int64_t elems) {
    const size_t es = fa_dtype_size(dtype);
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < elems; i++)
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0) {
            if (first < 0) first = i;
            wrong++;
        }
    CHECK_MSG(wrong == 0, "%s: %lld of %lld elements differ, first %lld: %.9g, expected %.9g", what, (long long)wrong,
              (long long)elems, (long long)first, first >= 0 ? fa_load_elem(got, dtype, first) : 0.0,
              first >= 0 ? fa_load_elem(want, dtype, first) : 0.0);
}

static float as_float(const void *data, fa_dtype dtype, int64_t i) { return (float)fa_load_elem(data, dtype, i); }

/* ------------------------------------------------------------------------ */
/* rows                                                                      */

/* What rows leaves in dst's buffer, computed on the host as the header
 * states it: fp32 arithmetic, one rounding to dst's dtype. */
static void rows_expected(fa_rows_op op, const fa_rows_shape *sh, const test_view *dst, const test_view *src,
                          float value, void *want) {
    for (int64_t b = 0; b < sh->batch; b++)
        for (int64_t s = 0; s < sh->rows; s++)
            for (int64_t h = 0; h < sh->heads; h++)
                for (int64_t x = 0; x < sh->dim; x++) {
                    const int64_t d = index_of(&dst->v, b, s, h, x);
                    float r = value;
                    if (op != FA_ROWS_FILL) r = as_float(src->host, src->v.dtype, index_of(&src->v, b, s, h, x));
                    if (op == FA_ROWS_ADD) r = as_float(dst->host, dst->v.dtype, d) + r;
                    fa_store_elem(want, dst->v.dtype, d, (double)r);
                }
}

static void rows_case(fa_context ctx, fa_rows_op op, const fa_rows_shape *sh, const fa_rows_view *dv,
                      const fa_rows_view *sv, float value, fa_rng *rng) {
    static const char *const op_names[] = {"copy", "add", "fill"};
    char what[160];
    snprintf(what, sizeof what, "%s %s %s <- %s, %d x %d x %d x %d", ctx->ops->name, op_names[op],
             fa_dtype_name(dv->dtype), op == FA_ROWS_FILL ? "value" : fa_dtype_name(sv->dtype), sh->batch, sh->rows,
             sh->heads, sh->dim);
    test_view dst, src;
    memset(&src, 0, sizeof src);
    if (!view_make(ctx, dv, sh, sh->dim, rng, &dst)) return;
    if (op != FA_ROWS_FILL && !view_make(ctx, sv, sh, sh->dim, rng, &src)) {
        view_free(&dst);
        return;
    }
    const size_t bytes = (size_t)dst.elems * fa_dtype_size(dv->dtype);
    void *want = malloc(bytes);
    CHECK(want != NULL);
    if (want) {
        memcpy(want, dst.host, bytes);
        rows_expected(op, sh, &dst, &src, value, want);
        fa_status st = ctx->ops->rows(ctx->impl, op, sh, &dst.v, op == FA_ROWS_FILL ? NULL : &src.v, value);
        CHECK_MSG(st == FA_SUCCESS, "%s: %s", what, fa_last_error());
        void *got = st == FA_SUCCESS ? view_download(&dst) : NULL;
        if (got) check_same(what, got, want, dv->dtype, dst.elems);
        free(got);
    }
    free(want);
    view_free(&src);
    view_free(&dst);
}

/* The backend's context on device index, or 0 with the reason appended
 * to g_skip. */
static int open_context(fa_backend backend, int index, fa_context *ctx) {
    *ctx = NULL;
    fa_status st = fa_context_create(backend, index, ctx);
    if (st == FA_SUCCESS) return 1;
    size_t used = strlen(g_skip);
    snprintf(g_skip + used, sizeof g_skip - used, "%s%s device %d: %s", used ? "; " : "", fa_backend_name(backend),
             index, fa_last_error());
    return 0;
}

/* Offsets and strides past 2^31 elements: a view whose first element lies
 * 2^31 + 64 fp16 elements into its buffer and whose second batch as far
 * again (8.6 GB). Only the spans around the view's lines travel. */
static void rows_far(fa_context ctx) {
    const int64_t far = ((int64_t)1 << 31) + 64, span = 3 * 128, margin = 256;
    const fa_rows_shape sh = {2, 3, 2, 64};
    fa_rows_view dv = {NULL, FA_DTYPE_F16, far, far, 128, 64};
    const int64_t elems = index_of(&dv, 1, 2, 1, 63) + 1 + margin;
    const size_t bytes = (size_t)elems * 2;
    if (ctx->info.desc.global_mem_bytes < 3 * bytes) {
        printf("%s: %zu bytes of device memory, too few for the view past 2^31 elements\n", ctx->ops->name,
               ctx->info.desc.global_mem_bytes);
        return;
    }
    fa_rng rng;
    fa_rng_seed(&rng, 11);
    test_view src;
    const fa_rows_view sv = padded_view(&sh, FA_DTYPE_F32, 0, 0);
    if (!view_make(ctx, &sv, &sh, sh.dim, &rng, &src)) return;
    fa_buffer dst = NULL;
    fa_status st = fa_buffer_alloc(ctx, bytes, &dst);
    CHECK_MSG(st == FA_SUCCESS, "%s: %zu bytes: %s", ctx->ops->name, bytes, fa_last_error());
    const int64_t len = span + 2 * margin;
    uint16_t *host = fa_test_random_tensor(&rng, FA_DTYPE_F16, 2 * len), *got = calloc((size_t)len, 2);
    CHECK(host && got);
    if (st == FA_SUCCESS && host && got) {
        dv.buf = dst->impl;
        for (int b = 0; b < 2; b++)
            CHECK_OK(fa_buffer_upload(dst, (size_t)(far + b * far - margin) * 2, host + b * len, (size_t)len * 2));
        CHECK_OK(ctx->ops->rows(ctx->impl, FA_ROWS_COPY, &sh, &dv, &src.v, 0.0f));
        for (int b = 0; b < 2; b++) {
            uint16_t *want = host + b * len;
            for (int64_t s = 0; s < sh.rows; s++)
                for (int64_t h = 0; h < sh.heads; h++)
                    for (int64_t x = 0; x < sh.dim; x++)
                        want[margin + s * 128 + h * 64 + x] =
                            fa_f32_to_f16(as_float(src.host, FA_DTYPE_F32, index_of(&src.v, b, s, h, x)));
            CHECK_OK(fa_buffer_download(dst, (size_t)(far + b * far - margin) * 2, got, (size_t)len * 2));
            check_same("copy past 2^31 elements", got, want, FA_DTYPE_F16, len);
        }
    }
    free(host);
    free(got);
    if (dst) fa_buffer_free(dst);
    view_free(&src);
}

static void rows_on(fa_context ctx) {
    fa_rng rng;
    fa_rng_seed(&rng, 7);
    /* Every dtype pair, head rows of 72 (a line of 32 lanes and a part),
     * padded views at odd offsets. */
    const fa_rows_shape sh = {2, 37, 3, 72};
    for (size_t d = 0; d < FA_ARRAY_SIZE(all_dtypes); d++) {
        const fa_rows_view dv = padded_view(&sh, all_dtypes[d], 8, 5);
        for (size_t s = 0; s < FA_ARRAY_SIZE(all_dtypes); s++) {
            const fa_rows_view sv = padded_view(&sh, all_dtypes[s], 24, 3);
            rows_case(ctx, FA_ROWS_COPY, &sh, &dv, &sv, 0.0f, &rng);
            rows_case(ctx, FA_ROWS_ADD, &sh, &dv, &sv, 0.0f, &rng);
        }
        rows_case(ctx, FA_ROWS_FILL, &sh, &dv, NULL, 1.0f / 3.0f, &rng);
        rows_case(ctx, FA_ROWS_FILL, &sh, &dv, NULL, -INFINITY, &rng);
    }
    /* Log-sum-exps: lines of one element, one a thread. */
    const fa_rows_shape lsh = {3, 301, 5, 1};
    const fa_rows_view l1 = lse_view(&lsh, 4), l2 = lse_view(&lsh, 0);
    rows_case(ctx, FA_ROWS_COPY, &lsh, &l1, &l2, 0.0f, &rng);
    rows_case(ctx, FA_ROWS_ADD, &lsh, &l1, &l2, 0.0f, &rng);
    /* More lines than FA_ROWS_MAX_BLOCKS blocks of eight hold: the blocks
     * go round. */
    const fa_rows_shape big = {2, 100000, 3, 40};
    const fa_rows_view bd = padded_view(&big, FA_DTYPE_F32, 0, 0), bs = padded_view(&big, FA_DTYPE_BF16, 0, 0);
    rows_case(ctx, FA_ROWS_COPY, &big, &bd, &bs, 0.0f, &rng);
    /* An empty shape launches nothing. */
    const fa_rows_shape none = {2, 0, 3, 64};
    CHECK_OK(ctx->ops->rows(ctx->impl, FA_ROWS_FILL, &none, NULL, NULL, 0.0f));
    rows_far(ctx);
}

/* ------------------------------------------------------------------------ */
/* rows_merge                                                                */

static void view_upload(test_view *t) {
    CHECK_OK(fa_buffer_upload(t->dev, 0, t->host, (size_t)t->elems * fa_dtype_size(t->v.dtype)));
}

/* got against want (fp32): NaN where want is, the same infinities, finite
 * values within tol relative (and tol absolute near 0). */
static void check_close(const char *what, const float *got, const float *want, int64_t elems, double tol) {
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < elems; i++) {
        const double g = got[i], w = want[i];
        const int ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : fabs(g - w) <= tol * (fabs(w) + 1.0);
        if (!ok && first < 0) first = i;
        wrong += !ok;
    }
    CHECK_MSG(wrong == 0, "%s: %lld of %lld elements off, first %lld: %.9g, expected %.9g", what, (long long)wrong,
              (long long)elems, (long long)first, first >= 0 ? got[first] : 0.0, first >= 0 ? want[first] : 0.0);
}

/* The L of line (b, s, h) of each side: every case of the header's rule
 * in turn, then finite values of either order. */
static void merge_inputs(int64_t line, fa_rng *rng, float *la, float *lp) {
    *la = (float)(4.0 * fa_rng_normal(rng));
    *lp = (float)(4.0 * fa_rng_normal(rng));
    switch (line % 7) {
    case 0: *la = -INFINITY; break;
    case 1: *lp = -INFINITY; break;
    case 2: *la = NAN; break;
    case 3: *lp = NAN; break;
    case 4: *la = *lp = -INFINITY; break;
    default: break;
    }
}

static void merge_on(fa_context ctx, fa_dtype part_dtype) {
    char what[96];
    snprintf(what, sizeof what, "%s merge of an %s part", ctx->ops->name, fa_dtype_name(part_dtype));
    fa_rng rng;
    fa_rng_seed(&rng, 5 + (uint64_t)part_dtype);
    const fa_rows_shape sh = {2, 29, 3, 40};
    const fa_rows_view ao = padded_view(&sh, FA_DTYPE_F32, 4, 2), po = padded_view(&sh, part_dtype, 8, 1);
    const fa_rows_view al = lse_view(&sh, 3);
    /* The part's L laid out [batch, rows, heads]: any view will do. */
    const fa_rows_view pl = {NULL, FA_DTYPE_F32, 5, (int64_t)sh.rows * sh.heads, sh.heads, 1};
    test_view acc_o, part_o, acc_l, part_l;
    int made = view_make(ctx, &ao, &sh, sh.dim, &rng, &acc_o);
    made &= view_make(ctx, &po, &sh, sh.dim, &rng, &part_o);
    made &= view_make(ctx, &al, &sh, 1, &rng, &acc_l);
    made &= view_make(ctx, &pl, &sh, 1, &rng, &part_l);
    float *want_o = made ? malloc((size_t)acc_o.elems * sizeof(float)) : NULL;
    float *want_l = made ? malloc((size_t)acc_l.elems * sizeof(float)) : NULL;
    if (want_o && want_l) {
        float *o = acc_o.host, *la_all = acc_l.host, *lp_all = part_l.host;
        for (int64_t b = 0; b < sh.batch; b++)
            for (int64_t s = 0; s < sh.rows; s++)
                for (int64_t h = 0; h < sh.heads; h++) {
                    const int64_t ia = index_of(&al, b, s, h, 0), ip = index_of(&pl, b, s, h, 0);
                    merge_inputs((b * sh.rows + s) * sh.heads + h, &rng, &la_all[ia], &lp_all[ip]);
                    /* An accumulator without a key holds anything: it is
                     * replaced, never weighed. */
                    if (la_all[ia] == -INFINITY)
                        for (int64_t x = 0; x < sh.dim; x++) o[index_of(&ao, b, s, h, x)] = NAN;
                }
        view_upload(&acc_o);
        view_upload(&acc_l);
        view_upload(&part_l);
        memcpy(want_o, acc_o.host, (size_t)acc_o.elems * sizeof(float));
        memcpy(want_l, acc_l.host, (size_t)acc_l.elems * sizeof(float));
        for (int64_t b = 0; b < sh.batch; b++)
            for (int64_t s = 0; s < sh.rows; s++)
                for (int64_t h = 0; h < sh.heads; h++) {
                    const int64_t ia = index_of(&al, b, s, h, 0);
                    const float la = la_all[ia], lp = lp_all[index_of(&pl, b, s, h, 0)];
                    const int nan = isnan(la) || isnan(lp);
                    if (!nan && lp == -INFINITY) continue;
                    float l = lp, wa = 0.0f, wp = 1.0f;
                    if (nan) {
                        l = wa = wp = NAN;
                    } else if (la != -INFINITY) {
                        const float m = la > lp ? la : lp;
                        l = m + log1pf(expf(-fabsf(la - lp)));
                        wa = expf(la - l);
                        wp = expf(lp - l);
                    }
                    want_l[ia] = l;
                    for (int64_t x = 0; x < sh.dim; x++) {
                        const int64_t io = index_of(&ao, b, s, h, x);
                        const float part = as_float(part_o.host, part_dtype, index_of(&po, b, s, h, x));
                        want_o[io] = !nan && la == -INFINITY ? part : o[io] * wa + part * wp;
                    }
                }
        fa_status st = ctx->ops->rows_merge(ctx->impl, &sh, &acc_o.v, &acc_l.v, &part_o.v, &part_l.v);
        CHECK_MSG(st == FA_SUCCESS, "%s: %s", what, fa_last_error());
        float *got_o = st == FA_SUCCESS ? view_download(&acc_o) : NULL;
        float *got_l = st == FA_SUCCESS ? view_download(&acc_l) : NULL;
        char part[128];
        snprintf(part, sizeof part, "%s: O", what);
        if (got_o) check_close(part, got_o, want_o, acc_o.elems, 1e-5);
        snprintf(part, sizeof part, "%s: L", what);
        if (got_l) check_close(part, got_l, want_l, acc_l.elems, 1e-6);
        free(got_o);
        free(got_l);
    }
    free(want_o);
    free(want_l);
    view_free(&acc_o);
    view_free(&part_o);
    view_free(&acc_l);
    view_free(&part_l);
}

FA_TEST(rows_ops) {
    g_skip[0] = '\0';
    int ran = 0;
    for (size_t b = 0; b < FA_ARRAY_SIZE(gpu_backends); b++) {
        fa_context ctx = NULL;
        if (!open_context(gpu_backends[b], 0, &ctx)) continue;
        printf("%s: %s (%s)\n", ctx->ops->name, ctx->info.desc.name, ctx->info.desc.arch);
        rows_on(ctx);
        for (size_t d = 0; d < FA_ARRAY_SIZE(all_dtypes); d++) merge_on(ctx, all_dtypes[d]);
        fa_context_destroy(ctx);
        ran++;
    }
    if (!ran) FA_SKIP(g_skip);
    if (g_skip[0]) printf("not run: %s\n", g_skip);
}

/* ------------------------------------------------------------------------ */
/* The NCCL transport between two contexts of one process                    */

typedef struct rank_run {
    fa_context ctx;
    fa_transport t;
    int rank, peer;
    size_t floats;
    fa_buffer send, send2, recv, recv2, seen;
    int64_t agreed[3];
    fa_status status;
    char error[1024];
} rank_run;

static int rank_ok(rank_run *r, fa_status st, const char *what) {
    if (st == FA_SUCCESS) return 1;
    r->status = st;
    snprintf(r->error, sizeof r->error, "rank %d: %s: %s", r->rank, what, fa_last_error());
    return 0;
}

#define RANK_TRY(r, expr)                                                                  \
    do {                                                                                   \
        if (!rank_ok((r), (expr), #expr)) return NULL;                                     \
    } while (0)

/* A buffer of floats as rows' view: lines of 256. */
static fa_rows_view flat_view(fa_buffer buf, size_t floats) {
    fa_rows_view v = {buf->impl, FA_DTYPE_F32, 0, (int64_t)floats, 256, 256};
    return v;
}

static void *native(fa_buffer b) {
    void *p = NULL;
    return fa_buffer_get_native(b, &p) == FA_SUCCESS ? p : NULL;
}

/* One rank: its work goes on its context's queue, and nothing waits on the
 * host until the end, so that only the transport's events order the
 * transfers with the passes around them. */
static void *rank_main(void *arg) {
    rank_run *r = arg;
    fa_context ctx = r->ctx;
    const fa_transport *t = &r->t;
    void *queue = NULL;
    RANK_TRY(r, fa_context_get_native(ctx, NULL, &queue));
    const size_t bytes = r->floats * sizeof(float);
    const fa_rows_shape sh = {1, (int)(r->floats / 256), 1, 256};
    const fa_rows_view send = flat_view(r->send, r->floats), send2 = flat_view(r->send2, r->floats);
    const fa_rows_view recv = flat_view(r->recv, r->floats), seen = flat_view(r->seen, r->floats);
    /* Written just before the transfer: it must send this. */
    RANK_TRY(r, ctx->ops->rows(ctx->impl, FA_ROWS_FILL, &sh, &send, NULL, (float)(r->rank + 1)));
    void *p1 = NULL, *p2 = NULL, *p3 = NULL;
    RANK_TRY(r, t->start(t->impl, queue, native(r->send), bytes, r->peer, native(r->recv), bytes, r->peer, &p1));
    RANK_TRY(r, t->wait(t->impl, queue, p1));
    /* Read just after: it must see what arrived. */
    RANK_TRY(r, ctx->ops->rows(ctx->impl, FA_ROWS_COPY, &sh, &seen, &recv, 0.0f));
    /* Two in flight, waited for in the other order; a third is refused. */
    RANK_TRY(r, ctx->ops->rows(ctx->impl, FA_ROWS_FILL, &sh, &send2, NULL, (float)(r->rank + 11)));
    RANK_TRY(r, t->start(t->impl, queue, native(r->send2), bytes / 2, r->peer, native(r->recv2), bytes / 2, r->peer,
                         &p1));
    RANK_TRY(r, t->start(t->impl, queue, native(r->send), bytes, r->peer, native(r->recv), bytes, r->peer, &p2));
    const fa_status third =
        t->start(t->impl, queue, native(r->send), bytes, r->peer, native(r->recv), bytes, r->peer, &p3);
    if (third != FA_ERR_INVALID_ARGUMENT) {
        rank_ok(r, third == FA_SUCCESS ? FA_ERR_INTERNAL : third, "a third transfer in flight was not refused");
        return NULL;
    }
    RANK_TRY(r, t->wait(t->impl, queue, p2));
    RANK_TRY(r, t->wait(t->impl, queue, p1));
    r->agreed[0] = r->rank + 1;
    r->agreed[1] = 100 - r->rank;
    r->agreed[2] = -5;
    RANK_TRY(r, t->agree(t->impl, r->agreed, 3));
    RANK_TRY(r, fa_context_synchronize(ctx));
    return NULL;
}

static void expect_floats(fa_buffer buf, size_t floats, float value, const char *what) {
    float *got = malloc(floats * sizeof(float));
    CHECK(got != NULL);
    if (!got) return;
    CHECK_OK(fa_buffer_download(buf, 0, got, floats * sizeof(float)));
    size_t wrong = 0;
    for (size_t i = 0; i < floats; i++) wrong += got[i] != value;
    CHECK_MSG(wrong == 0, "%s: %zu of %zu floats are not %g (first: %g)", what, wrong, floats, (double)value,
              (double)got[0]);
    free(got);
}

static void pair_over(fa_backend backend) {
    g_skip[0] = '\0';
    fa_context ctx[2] = {NULL, NULL};
    if (!open_context(backend, 0, &ctx[0]) || !open_context(backend, 1, &ctx[1])) {
        for (int i = 0; i < 2; i++)
            if (ctx[i]) fa_context_destroy(ctx[i]);
        size_t used = strlen(g_skip);
        snprintf(g_skip + used, sizeof g_skip - used, " (two devices are needed)");
        FA_SKIP(g_skip);
    }
    const int nvidia = backend == FA_BACKEND_CUDA || strncmp(ctx[0]->info.desc.arch, "sm_", 3) == 0;
    const fa_nccl_api *nccl = NULL;
    fa_status st = fa_nccl_load(nvidia ? FA_COLLECTIVE_NCCL : FA_COLLECTIVE_RCCL, &nccl);
    if (st != FA_SUCCESS || !nccl->ncclCommInitAll) {
        snprintf(g_skip, sizeof g_skip, "%s", st != FA_SUCCESS ? fa_last_error() : "the library lacks ncclCommInitAll");
        fa_context_destroy(ctx[0]);
        fa_context_destroy(ctx[1]);
        FA_SKIP(g_skip);
    }
    void *comms[2] = {NULL, NULL};
    const int devices[2] = {0, 1};
    CHECK_OK(fa_nccl_error(nccl, nccl->ncclCommInitAll(comms, 2, devices), "ncclCommInitAll"));
    rank_run runs[2];
    memset(runs, 0, sizeof runs);
    int ready = comms[0] && comms[1];
    if (ready && nccl->ncclCommCuDevice) {
        fa_transport other;
        CHECK_FAILS(fa_nccl_transport(ctx[0], comms[1], &other), FA_ERR_INVALID_ARGUMENT, "device 1");
    }
    for (int i = 0; i < 2 && ready; i++) {
        rank_run *r = &runs[i];
        r->ctx = ctx[i];
        r->rank = i;
        r->peer = 1 - i;
        r->floats = (size_t)1 << 22;
        const size_t bytes = r->floats * sizeof(float);
        st = fa_nccl_transport(ctx[i], comms[i], &r->t);
        CHECK_MSG(st == FA_SUCCESS, "rank %d: %s", i, fa_last_error());
        ready &= st == FA_SUCCESS;
        if (st != FA_SUCCESS) break;
        CHECK(r->t.rank == i && r->t.world == 2 && r->t.device_memory == 1);
        fa_buffer *bufs[] = {&r->send, &r->send2, &r->recv, &r->recv2, &r->seen};
        for (size_t k = 0; k < FA_ARRAY_SIZE(bufs); k++) {
            st = fa_buffer_alloc(ctx[i], bytes, bufs[k]);
            CHECK_MSG(st == FA_SUCCESS, "rank %d: %s", i, fa_last_error());
            ready &= st == FA_SUCCESS;
        }
    }
    if (ready) {
        pthread_t threads[2];
        for (int i = 0; i < 2; i++) CHECK(pthread_create(&threads[i], NULL, rank_main, &runs[i]) == 0);
        for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
        for (int i = 0; i < 2; i++) {
            rank_run *r = &runs[i];
            CHECK_MSG(r->status == FA_SUCCESS, "%s", r->error);
            if (r->status != FA_SUCCESS) continue;
            expect_floats(r->seen, r->floats, (float)(r->peer + 1), "read on the queue right after wait");
            expect_floats(r->recv, r->floats, (float)(r->peer + 1), "received");
            expect_floats(r->recv2, r->floats / 2, (float)(r->peer + 11), "received, second of two in flight");
            CHECK_MSG(r->agreed[0] == 2 && r->agreed[1] == 100 && r->agreed[2] == -5,
                      "rank %d agreed on %lld, %lld, %lld", i, (long long)r->agreed[0], (long long)r->agreed[1],
                      (long long)r->agreed[2]);
        }
    }
    for (int i = 0; i < 2; i++) {
        rank_run *r = &runs[i];
        if (r->t.release) r->t.release(r->t.impl);
        fa_buffer bufs[] = {r->send, r->send2, r->recv, r->recv2, r->seen};
        for (size_t k = 0; k < FA_ARRAY_SIZE(bufs); k++)
            if (bufs[k]) fa_buffer_free(bufs[k]);
        if (comms[i] && nccl->ncclCommDestroy) (void)nccl->ncclCommDestroy(comms[i]);
        fa_context_destroy(ctx[i]);
    }
}

FA_TEST(nccl_pair_cuda) { pair_over(FA_BACKEND_CUDA); }

/* HIP contexts: RCCL on AMD GPUs, NCCL on NVIDIA ones through the mapping. */
FA_TEST(nccl_pair_hip) { pair_over(FA_BACKEND_HIP); }

FA_TEST_MAIN(FA_CASE(rows_ops), FA_CASE(nccl_pair_cuda), FA_CASE(nccl_pair_hip))
