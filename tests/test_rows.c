/* The ring's element-wise passes (core/backend.h: rows, rows_merge) on every
 * context this machine opens (the reference always, every OpenCL, CUDA and
 * HIP device present), called through the backend's ops table and checked
 * against a host model written here in fp32, as the specification above
 * `rows` in core/backend.h states it.
 *
 * Views are strided (offsets, padded head, token and batch strides, token
 * and head axes in either order) inside buffers filled with random bytes,
 * so that a write outside a view, or to the wrong element of it, shows.
 *
 * fa-test-labels: device
 *
 * A backend whose op is NULL is reported as not implemented and does not
 * count: a case skips, saying why, unless a device other than the
 * reference implemented and passed it (the reference's failures still
 * fail the case). */
#include "harness.h"
#include "test_util.h"

#include "backend.h"
#include "dtype.h"
#include "flashattn.h"
#include "plan.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 0x5eed0a11u
#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_REPORTED 5

static const fa_dtype dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

/* ------------------------------------------------------------------------ */
/* Host elements                                                             */

static float get(const void *img, fa_dtype t, int64_t i) {
    switch (t) {
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)img)[i]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)img)[i]);
    default: return ((const float *)img)[i];
    }
}

static void put(void *img, fa_dtype t, int64_t i, float v) {
    switch (t) {
    case FA_DTYPE_F16: ((uint16_t *)img)[i] = fa_f32_to_f16(v); break;
    case FA_DTYPE_BF16: ((uint16_t *)img)[i] = fa_f32_to_bf16(v); break;
    default: ((float *)img)[i] = v; break;
    }
}

static void put_bits(void *img, fa_dtype t, int64_t i, uint32_t bits) {
    if (t == FA_DTYPE_F32)
        ((uint32_t *)img)[i] = bits;
    else
        ((uint16_t *)img)[i] = (uint16_t)bits;
}

/* ------------------------------------------------------------------------ */
/* Strided tensors                                                           */

/* Where the axes go: [batch, rows, heads, dim] (TOKENS_INNER), the tokens
 * outside the batch [rows, batch, heads, dim] (TOKENS_OUTER), or the heads
 * outside the tokens [batch, heads, rows, dim] (HEADS_OUTER: with dim 1 the
 * log-sum-exp's layout). Each pad widens the stride of the axis named. */
typedef enum axis_order { TOKENS_INNER, TOKENS_OUTER, HEADS_OUTER } axis_order;

typedef struct layout {
    axis_order order;
    int64_t offset, pad_head, pad_seq, pad_batch;
} layout;

typedef struct tensor {
    fa_rows_view view;  /* buf: the backend's handle, once placed */
    fa_dtype dtype;
    int64_t elems;      /* of the whole buffer */
    uint8_t *in_view;   /* per element of the buffer */
    unsigned char *host; /* what was uploaded */
    fa_buffer buf;
} tensor;

static int64_t at(const fa_rows_view *v, int b, int r, int h, int x) {
    return v->offset + b * v->stride_batch + r * v->stride_seq + h * v->stride_head + x;
}

static fa_rows_view view_of(const fa_rows_shape *s, fa_dtype dtype, const layout *l) {
    fa_rows_view v = {NULL, dtype, l->offset, 0, 0, 0};
    switch (l->order) {
    case TOKENS_INNER:
        v.stride_head = s->dim + l->pad_head;
        v.stride_seq = s->heads * v.stride_head + l->pad_seq;
        v.stride_batch = s->rows * v.stride_seq + l->pad_batch;
        break;
    case TOKENS_OUTER:
        v.stride_head = s->dim + l->pad_head;
        v.stride_batch = s->heads * v.stride_head + l->pad_batch;
        v.stride_seq = s->batch * v.stride_batch + l->pad_seq;
        break;
    case HEADS_OUTER:
        v.stride_seq = s->dim + l->pad_seq;
        v.stride_head = s->rows * v.stride_seq + l->pad_head;
        v.stride_batch = s->heads * v.stride_head + l->pad_batch;
        break;
    }
    return v;
}

/* A buffer holding the view and a few elements past it, every byte random;
 * the view's elements drawn from N(0, 1) in dtype. */
static int tensor_make(tensor *t, const fa_rows_shape *s, fa_dtype dtype, const layout *l, fa_rng *rng) {
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->view = view_of(s, dtype, l);
    const fa_rows_view *v = &t->view;
    const int empty = !s->batch || !s->rows || !s->heads || !s->dim;
    const int64_t last = empty ? v->offset : at(v, s->batch - 1, s->rows - 1, s->heads - 1, s->dim - 1);
    t->elems = last + 1 + 5;
    const size_t es = fa_dtype_size(dtype);
    t->host = malloc((size_t)t->elems * es);
    t->in_view = calloc((size_t)t->elems, 1);
    CHECK(t->host && t->in_view);
    if (!t->host || !t->in_view) return 0;
    for (size_t i = 0; i < (size_t)t->elems * es; i++) t->host[i] = (unsigned char)fa_rng_next(rng);
    int overlaps = 0;
    for (int b = 0; b < s->batch; b++)
        for (int r = 0; r < s->rows; r++)
            for (int h = 0; h < s->heads; h++)
                for (int x = 0; x < s->dim; x++) {
                    const int64_t i = at(v, b, r, h, x);
                    overlaps += t->in_view[i];
                    t->in_view[i] = 1;
                    put(t->host, dtype, i, (float)fa_rng_normal(rng));
                }
    CHECK_MSG(overlaps == 0, "the test's layout overlaps itself (%d elements)", overlaps);
    return overlaps == 0;
}

static void tensor_free(tensor *t) {
    if (t->buf) CHECK_OK(fa_buffer_free(t->buf));
    free(t->host);
    free(t->in_view);
    memset(t, 0, sizeof *t);
}

static size_t tensor_bytes(const tensor *t) { return (size_t)t->elems * fa_dtype_size(t->dtype); }

static int tensor_place(tensor *t, fa_context ctx) {
    fa_status st = fa_buffer_alloc(ctx, tensor_bytes(t), &t->buf);
    CHECK_MSG(st == FA_SUCCESS, "fa_buffer_alloc: %s", fa_last_error());
    if (st != FA_SUCCESS) return 0;
    st = fa_buffer_upload(t->buf, 0, t->host, tensor_bytes(t));
    CHECK_MSG(st == FA_SUCCESS, "fa_buffer_upload: %s", fa_last_error());
    t->view.buf = t->buf->impl;
    return st == FA_SUCCESS;
}

/* The buffer's bytes as the device left them; malloc'ed, NULL on failure. */
static unsigned char *tensor_fetch(const tensor *t) {
    unsigned char *got = malloc(tensor_bytes(t));
    CHECK(got != NULL);
    if (!got) return NULL;
    fa_status st = fa_context_synchronize(t->buf->ctx);
    if (st == FA_SUCCESS) st = fa_buffer_download(t->buf, 0, got, tensor_bytes(t));
    CHECK_MSG(st == FA_SUCCESS, "waiting for and downloading a result: %s", fa_last_error());
    if (st != FA_SUCCESS) {
        free(got);
        return NULL;
    }
    return got;
}

/* got against want over the whole buffer: bytes outside the view
 * identical; inside it, NaN where want is NaN, else the same bits, or
 * within tol[i] where tol is given and tol[i] >= 0. Returns the
 * mismatches, the first few printed. */
static int compare(const tensor *t, const unsigned char *got, const unsigned char *want, const float *tol,
                   const char *what) {
    const size_t es = fa_dtype_size(t->dtype);
    int bad = 0;
    for (int64_t i = 0; i < t->elems; i++) {
        const int same_bytes = memcmp(got + i * es, want + i * es, es) == 0;
        int ok = same_bytes;
        if (t->in_view[i]) {
            const float g = get(got, t->dtype, i), w = get(want, t->dtype, i);
            if (isnan(w))
                ok = isnan(g);
            else if (tol && tol[i] >= 0.0f && isfinite(w))
                ok = fabsf(g - w) <= tol[i];
        }
        if (ok) continue;
        if (bad++ < MAX_REPORTED) {
            if (t->in_view[i])
                fprintf(stderr, "    %s: element %lld is %.9g, expected %.9g (tolerance %g)\n", what, (long long)i,
                        (double)get(got, t->dtype, i), (double)get(want, t->dtype, i),
                        tol && tol[i] >= 0.0f ? (double)tol[i] : 0.0);
            else
                fprintf(stderr, "    %s: element %lld, outside the view, was written\n", what, (long long)i);
        }
    }
    return bad;
}

/* The device's copy of t must still be what was uploaded. */
static void check_unchanged(const tensor *t, const char *what) {
    unsigned char *got = tensor_fetch(t);
    if (!got) return;
    CHECK_MSG(memcmp(got, t->host, tensor_bytes(t)) == 0, "%s, an input, was written", what);
    free(got);
}

/* ------------------------------------------------------------------------ */
/* Contexts                                                                  */

typedef struct target {
    fa_context ctx;
    const fa_backend_ops *ops;
    fa_device_info info;
    char label[200];
} target;

typedef void (*target_check)(const target *t, fa_rng *rng);

static char skip_reason[1024];

static void append(char *out, size_t size, const char *text) {
    const size_t used = strlen(out);
    if (used + 1 < size) snprintf(out + used, size - used, "%s", text);
}

/* Why no device of backend b took part: unavailable, or not implemented. */
static void note_backend(fa_backend b, const char *not_implemented) {
    char reason[400] = "";
    char line[600];
    if (fa_backend_get_status(b, reason, sizeof reason) != FA_SUCCESS)
        snprintf(line, sizeof line, "; %s: unavailable (%s)", fa_backend_name(b), reason);
    else if (strstr(not_implemented, fa_backend_name(b)))
        snprintf(line, sizeof line, "; %s: not implemented", fa_backend_name(b));
    else
        snprintf(line, sizeof line, "; %s: no device", fa_backend_name(b));
    append(skip_reason, sizeof skip_reason, line);
}

/* Runs check on every context that implements the op (rows, or rows_merge
 * with merge set), with the same random stream on each. */
static void on_every_context(const char *what, int merge, target_check check) {
    /* The passes need no bandwidth figure; the probe would cost seconds. */
    setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1);
    int count = 0;
    CHECK_OK(fa_device_count(&count));
    int device_passes = 0;
    char not_implemented[200] = "";
    for (int i = 0; i < count; i++) {
        target t;
        memset(&t, 0, sizeof t);
        CHECK_OK(fa_device_get_info(i, &t.info));
        fa_status st = fa_context_create(t.info.backend, t.info.index, &t.ctx);
        CHECK_MSG(st == FA_SUCCESS, "fa_context_create(%s, %d): %s", fa_backend_name(t.info.backend), t.info.index,
                  fa_last_error());
        if (st != FA_SUCCESS) continue;
        snprintf(t.label, sizeof t.label, "%s %d (%s)", fa_backend_name(t.info.backend), t.info.index,
                 t.info.desc.name);
        t.ops = fa_backend_ops_get(t.info.backend);
        CHECK_MSG(t.ops == t.ctx->ops, "%s: the context's ops are not its backend's table", t.label);
        if (merge ? !t.ops->rows_merge : !t.ops->rows) {
            printf("  %s on %s: not implemented\n", what, t.label);
            append(not_implemented, sizeof not_implemented, fa_backend_name(t.info.backend));
            append(not_implemented, sizeof not_implemented, " ");
            CHECK_OK(fa_context_destroy(t.ctx));
            continue;
        }
        const int failures = fa_test_failures;
        fa_rng rng;
        fa_rng_seed(&rng, SEED);
        check(&t, &rng);
        const int passed = fa_test_failures == failures;
        printf("  %s on %s: %s\n", what, t.label, passed ? "ok" : "FAILED");
        if (passed && t.info.backend != FA_BACKEND_REFERENCE) device_passes++;
        CHECK_OK(fa_context_destroy(t.ctx));
    }
    if (device_passes) return;
    snprintf(skip_reason, sizeof skip_reason, "%s ran on the reference only", what);
    note_backend(FA_BACKEND_OPENCL, not_implemented);
    note_backend(FA_BACKEND_CUDA, not_implemented);
    note_backend(FA_BACKEND_HIP, not_implemented);
    fa_test_skip_reason = skip_reason;
}

/* ------------------------------------------------------------------------ */
/* Shapes and layouts                                                        */

typedef struct view_case {
    fa_rows_shape shape;
    layout dst, src;
} view_case;

/* Odd sizes, dim 1 (the log-sum-exp) and 8 to 128, every axis order, gaps
 * after every axis and batch strides unlike rows * stride_seq. */
static const view_case view_cases[] = {
    {{2, 7, 3, 40}, {TOKENS_INNER, 5, 4, 8, 16}, {TOKENS_OUTER, 3, 8, 24, 1}},
    {{1, 1, 1, 8}, {TOKENS_INNER, 1, 0, 0, 0}, {TOKENS_INNER, 0, 0, 0, 0}},
    {{1, 33, 1, 128}, {TOKENS_INNER, 7, 0, 8, 0}, {HEADS_OUTER, 2, 3, 0, 0}},
    {{3, 33, 3, 8}, {HEADS_OUTER, 4, 5, 2, 9}, {TOKENS_INNER, 0, 8, 24, 40}},
    {{2, 7, 3, 1}, {HEADS_OUTER, 3, 2, 0, 1}, {HEADS_OUTER, 0, 0, 0, 0}},
    {{2, 33, 1, 1}, {TOKENS_INNER, 2, 0, 1, 3}, {TOKENS_OUTER, 1, 1, 2, 0}},
};

/* Inputs that test rounding and the special values: ties to even in bf16
 * and fp16, fp16's overflow to infinity (65520) and its subnormals,
 * signed zero, infinities, NaN, bf16's overflow from FLT_MAX. */
static const uint32_t f32_specials[] = {0x3f808000u, 0x3f818000u, 0x3f801000u, 0x3f803000u, 0x477ff000u,
                                        0x477fef00u, 0x358637bdu, 0x33000001u, 0x80000000u, 0x7f800000u,
                                        0xff800000u, 0x7fc00000u, 0x7f7fffffu};
static const uint32_t f16_specials[] = {0x0001u, 0x03ffu, 0x7bffu, 0x7c00u, 0xfc00u, 0x8000u, 0x7e00u, 0x3c01u};
static const uint32_t bf16_specials[] = {0x0001u, 0x7f7fu, 0x7f80u, 0xff80u, 0x8000u, 0x7fc0u, 0x3f81u};

/* The first in-view elements of t become its dtype's special values. */
static void plant_specials(tensor *t) {
    const uint32_t *list = f32_specials;
    size_t n = COUNT_OF(f32_specials);
    if (t->dtype == FA_DTYPE_F16) {
        list = f16_specials;
        n = COUNT_OF(f16_specials);
    } else if (t->dtype == FA_DTYPE_BF16) {
        list = bf16_specials;
        n = COUNT_OF(bf16_specials);
    }
    size_t k = 0;
    for (int64_t i = 0; i < t->elems && k < n; i++)
        if (t->in_view[i]) put_bits(t->host, t->dtype, i, list[k++]);
}

/* ------------------------------------------------------------------------ */
/* COPY, ADD, FILL                                                           */

static void model_rows(fa_rows_op op, const fa_rows_shape *s, const tensor *dst, unsigned char *want,
                       const tensor *src, float value) {
    for (int b = 0; b < s->batch; b++)
        for (int r = 0; r < s->rows; r++)
            for (int h = 0; h < s->heads; h++)
                for (int x = 0; x < s->dim; x++) {
                    const int64_t d = at(&dst->view, b, r, h, x);
                    float v = value;
                    if (op != FA_ROWS_FILL) {
                        v = get(src->host, src->dtype, at(&src->view, b, r, h, x));
                        if (op == FA_ROWS_ADD) v = get(want, dst->dtype, d) + v;
                    }
                    put(want, dst->dtype, d, v);
                }
}

/* One pass of op on a view case, checked; src NULL for FILL. */
static void run_rows(const target *t, fa_rows_op op, const view_case *vc, fa_dtype dst_dtype, fa_dtype src_dtype,
                     float value, fa_rng *rng) {
    static const char *const op_names[] = {"COPY", "ADD", "FILL"};
    char what[300];
    snprintf(what, sizeof what, "%s %s <- %s [%d, %d, %d, %d] on %s", op_names[op], fa_dtype_name(dst_dtype),
             op == FA_ROWS_FILL ? "value" : fa_dtype_name(src_dtype), vc->shape.batch, vc->shape.rows,
             vc->shape.heads, vc->shape.dim, t->label);
    tensor dst, src;
    const int have_src = op != FA_ROWS_FILL;
    int ok = tensor_make(&dst, &vc->shape, dst_dtype, &vc->dst, rng);
    memset(&src, 0, sizeof src);
    if (ok && have_src) {
        ok = tensor_make(&src, &vc->shape, src_dtype, &vc->src, rng);
        if (ok) plant_specials(&src);
    }
    ok = ok && tensor_place(&dst, t->ctx) && (!have_src || tensor_place(&src, t->ctx));
    unsigned char *want = ok ? malloc(tensor_bytes(&dst)) : NULL;
    if (want) {
        memcpy(want, dst.host, tensor_bytes(&dst));
        model_rows(op, &vc->shape, &dst, want, have_src ? &src : NULL, value);
        fa_status st = t->ops->rows(t->ctx->impl, op, &vc->shape, &dst.view, have_src ? &src.view : NULL, value);
        CHECK_MSG(st == FA_SUCCESS, "%s: %s", what, fa_last_error());
        unsigned char *got = st == FA_SUCCESS ? tensor_fetch(&dst) : NULL;
        if (got) {
            const int bad = compare(&dst, got, want, NULL, what);
            CHECK_MSG(bad == 0, "%s: %d elements wrong", what, bad);
            if (have_src) check_unchanged(&src, what);
        }
        free(got);
    }
    free(want);
    tensor_free(&dst);
    tensor_free(&src);
}

static void copy_and_add_checks(const target *t, fa_rng *rng, fa_rows_op op) {
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 3; s++)
            for (size_t c = 0; c < COUNT_OF(view_cases); c++)
                run_rows(t, op, &view_cases[c], dtypes[d], dtypes[s], 0.0f, rng);
}

static void copy_checks(const target *t, fa_rng *rng) { copy_and_add_checks(t, rng, FA_ROWS_COPY); }
static void add_checks(const target *t, fa_rng *rng) { copy_and_add_checks(t, rng, FA_ROWS_ADD); }

static void fill_checks(const target *t, fa_rng *rng) {
    /* 0.1 rounds in every dtype; 65520 overflows fp16. */
    static const float values[] = {0.0f, -INFINITY, 0.1f, -2.5f, 65520.0f, NAN};
    for (int d = 0; d < 3; d++)
        for (size_t v = 0; v < COUNT_OF(values); v++)
            for (size_t c = 0; c < COUNT_OF(view_cases); c++)
                if (c % 2 == v % 2) run_rows(t, FA_ROWS_FILL, &view_cases[c], dtypes[d], dtypes[d], values[v], rng);
}

FA_TEST(copy_every_dtype_pair) { on_every_context("rows COPY", 0, copy_checks); }
FA_TEST(add_every_dtype_pair) { on_every_context("rows ADD", 0, add_checks); }
FA_TEST(fill_values) { on_every_context("rows FILL", 0, fill_checks); }

/* ------------------------------------------------------------------------ */
/* MERGE                                                                     */

/* The L views of a view case: dim 1, the log-sum-exp's layout with gaps. */
static const layout l_layouts[2] = {{HEADS_OUTER, 3, 2, 0, 1}, {TOKENS_INNER, 1, 0, 2, 5}};

typedef struct merge_set {
    fa_rows_shape shape, lines;
    tensor acc_o, acc_l, part_o, part_l;
} merge_set;

/* The spec's fold in fp32 (NaN first: a NaN in either L makes the row
 * NaN, whatever the other is). want and tol cover acc_o and acc_l; tol -1
 * asks for the exact bits. A blended O is a sum of two weighted terms that
 * may cancel, so its tolerance is relative to the terms, not to the sum;
 * and the weights move with the merged L, whose rounding (|L| 2^-23) the
 * device may make the other way after an ulp of exp or log1p. L itself is
 * the sum of m and a term below log 2, which may cancel too. */
static void model_merge(const merge_set *m, unsigned char *want_o, float *tol_o, unsigned char *want_l,
                        float *tol_l) {
    const fa_rows_shape *s = &m->shape;
    for (int64_t i = 0; i < m->acc_o.elems; i++) tol_o[i] = -1.0f;
    for (int64_t i = 0; i < m->acc_l.elems; i++) tol_l[i] = -1.0f;
    for (int b = 0; b < s->batch; b++)
        for (int r = 0; r < s->rows; r++)
            for (int h = 0; h < s->heads; h++) {
                const int64_t ial = at(&m->acc_l.view, b, r, h, 0);
                const float la = get(m->acc_l.host, FA_DTYPE_F32, ial);
                const float lp = get(m->part_l.host, FA_DTYPE_F32, at(&m->part_l.view, b, r, h, 0));
                const int poisoned = isnan(la) || isnan(lp);
                if (!poisoned && lp == -INFINITY) continue;
                const int take = !poisoned && la == -INFINITY;
                float l = NAN, wa = NAN, wp = NAN;
                if (take) {
                    l = lp;
                } else if (!poisoned) {
                    const float mx = la > lp ? la : lp;
                    l = mx + log1pf(expf(-fabsf(la - lp)));
                    wa = expf(la - l);
                    wp = expf(lp - l);
                    tol_l[ial] = 1e-6f * (1.0f + fabsf(l));
                }
                put(want_l, FA_DTYPE_F32, ial, l);
                for (int x = 0; x < s->dim; x++) {
                    const int64_t io = at(&m->acc_o.view, b, r, h, x);
                    const float a = get(m->acc_o.host, FA_DTYPE_F32, io);
                    const float p = get(m->part_o.host, m->part_o.dtype, at(&m->part_o.view, b, r, h, x));
                    put(want_o, FA_DTYPE_F32, io, take ? p : a * wa + p * wp);
                    if (!take && !poisoned)
                        tol_o[io] = (fabsf(a) * wa + fabsf(p) * wp) * (1e-6f + fabsf(l) * FLT_EPSILON);
                }
            }
}

/* Rows cycle through the special cases; a third of them draw both L at
 * random. A taken row's old O is NaN and a kept row's part is NaN, so that
 * reading what the fold must ignore shows. */
static void plant_merge_rows(merge_set *m, fa_rng *rng) {
    const fa_rows_shape *s = &m->shape;
    int line = 0;
    for (int b = 0; b < s->batch; b++)
        for (int r = 0; r < s->rows; r++)
            for (int h = 0; h < s->heads; h++, line++) {
                float la = (float)fa_rng_uniform(rng, -2.0, 2.0), lp = (float)fa_rng_uniform(rng, -2.0, 2.0);
                switch (line % 15) {
                case 0: lp = -INFINITY; break;
                case 1: la = -INFINITY; break;
                case 2: la = lp = -INFINITY; break;
                case 3: la = NAN; break;
                case 4: lp = NAN; break;
                case 5: la = NAN, lp = -INFINITY; break;
                case 6: la = -INFINITY, lp = NAN; break;
                case 7: la = lp = NAN; break;
                case 8: la = lp + 1e4f; break;
                case 9: lp = la + 1e4f; break;
                default: break;
                }
                put(m->acc_l.host, FA_DTYPE_F32, at(&m->acc_l.view, b, r, h, 0), la);
                put(m->part_l.host, FA_DTYPE_F32, at(&m->part_l.view, b, r, h, 0), lp);
                for (int x = 0; x < s->dim; x++) {
                    if (la == -INFINITY && !isnan(lp))
                        put(m->acc_o.host, FA_DTYPE_F32, at(&m->acc_o.view, b, r, h, x), NAN);
                    if (lp == -INFINITY && !isnan(la))
                        put(m->part_o.host, m->part_o.dtype, at(&m->part_o.view, b, r, h, x), NAN);
                }
            }
}

static void merge_set_free(merge_set *m) {
    tensor_free(&m->acc_o);
    tensor_free(&m->acc_l);
    tensor_free(&m->part_o);
    tensor_free(&m->part_l);
}

static void run_merge(const target *t, const view_case *vc, int which, fa_dtype part_dtype, fa_rng *rng) {
    char what[300];
    snprintf(what, sizeof what, "MERGE fp32 <- %s [%d, %d, %d, %d] on %s", fa_dtype_name(part_dtype),
             vc->shape.batch, vc->shape.rows, vc->shape.heads, vc->shape.dim, t->label);
    merge_set m;
    memset(&m, 0, sizeof m);
    m.shape = vc->shape;
    m.lines = vc->shape;
    m.lines.dim = 1;
    int ok = tensor_make(&m.acc_o, &m.shape, FA_DTYPE_F32, &vc->dst, rng) &&
             tensor_make(&m.part_o, &m.shape, part_dtype, &vc->src, rng) &&
             tensor_make(&m.acc_l, &m.lines, FA_DTYPE_F32, &l_layouts[which], rng) &&
             tensor_make(&m.part_l, &m.lines, FA_DTYPE_F32, &l_layouts[1 - which], rng);
    if (ok) plant_merge_rows(&m, rng);
    ok = ok && tensor_place(&m.acc_o, t->ctx) && tensor_place(&m.part_o, t->ctx) && tensor_place(&m.acc_l, t->ctx) &&
         tensor_place(&m.part_l, t->ctx);
    unsigned char *want_o = ok ? malloc(tensor_bytes(&m.acc_o)) : NULL;
    unsigned char *want_l = ok ? malloc(tensor_bytes(&m.acc_l)) : NULL;
    float *tol_o = ok ? malloc((size_t)m.acc_o.elems * sizeof *tol_o) : NULL;
    float *tol_l = ok ? malloc((size_t)m.acc_l.elems * sizeof *tol_l) : NULL;
    if (want_o && want_l && tol_o && tol_l) {
        memcpy(want_o, m.acc_o.host, tensor_bytes(&m.acc_o));
        memcpy(want_l, m.acc_l.host, tensor_bytes(&m.acc_l));
        model_merge(&m, want_o, tol_o, want_l, tol_l);
        fa_status st = t->ops->rows_merge(t->ctx->impl, &m.shape, &m.acc_o.view, &m.acc_l.view, &m.part_o.view,
                                          &m.part_l.view);
        CHECK_MSG(st == FA_SUCCESS, "%s: %s", what, fa_last_error());
        unsigned char *got_o = st == FA_SUCCESS ? tensor_fetch(&m.acc_o) : NULL;
        unsigned char *got_l = st == FA_SUCCESS ? tensor_fetch(&m.acc_l) : NULL;
        if (got_o && got_l) {
            const int bad_o = compare(&m.acc_o, got_o, want_o, tol_o, what);
            const int bad_l = compare(&m.acc_l, got_l, want_l, tol_l, what);
            CHECK_MSG(bad_o == 0 && bad_l == 0, "%s: %d elements of O and %d of L wrong", what, bad_o, bad_l);
            check_unchanged(&m.part_o, what);
            check_unchanged(&m.part_l, what);
        }
        free(got_o);
        free(got_l);
    } else {
        CHECK(!ok);
    }
    free(want_o);
    free(want_l);
    free(tol_o);
    free(tol_l);
    merge_set_free(&m);
}

static void merge_checks(const target *t, fa_rng *rng) {
    for (int d = 0; d < 3; d++)
        for (size_t c = 0; c < COUNT_OF(view_cases); c++) run_merge(t, &view_cases[c], (int)(c % 2), dtypes[d], rng);
}

FA_TEST(merge_random_and_special_rows) { on_every_context("rows_merge", 1, merge_checks); }

/* ------------------------------------------------------------------------ */
/* Merging a split softmax gives the whole one                               */

#define SPLIT_MAX_PARTS 4
#define SPLIT_MAX_KEYS 40
#define SPLIT_DIM 8

/* O and L of keys [k0, k1) of one row, in double; an empty range has no
 * mass (L = -inf) and an O that the merge must not read (NaN). */
static void softmax_range(const double *s, const double *v, int k0, int k1, double *o, double *l) {
    if (k0 == k1) {
        *l = -INFINITY;
        for (int x = 0; x < SPLIT_DIM; x++) o[x] = NAN;
        return;
    }
    double mx = -INFINITY, sum = 0.0;
    for (int j = k0; j < k1; j++) mx = s[j] > mx ? s[j] : mx;
    for (int x = 0; x < SPLIT_DIM; x++) o[x] = 0.0;
    for (int j = k0; j < k1; j++) {
        const double p = exp(s[j] - mx);
        sum += p;
        for (int x = 0; x < SPLIT_DIM; x++) o[x] += p * v[j * SPLIT_DIM + x];
    }
    for (int x = 0; x < SPLIT_DIM; x++) o[x] /= sum;
    *l = mx + log(sum);
}

static void split_checks(const target *t, fa_rng *rng) {
    const fa_rows_shape shape = {2, 16, 2, SPLIT_DIM}, lines = {2, 16, 2, 1};
    const layout packed = {TOKENS_INNER, 0, 0, 0, 0}, lse = {HEADS_OUTER, 0, 0, 0, 0};
    const int nlines = shape.batch * shape.rows * shape.heads;
    tensor acc_o, acc_l, part_o[SPLIT_MAX_PARTS], part_l[SPLIT_MAX_PARTS];
    memset(&acc_o, 0, sizeof acc_o);
    memset(&acc_l, 0, sizeof acc_l);
    memset(part_o, 0, sizeof part_o);
    memset(part_l, 0, sizeof part_l);
    unsigned char *got_o = NULL, *got_l = NULL;
    double *whole_o = malloc((size_t)nlines * SPLIT_DIM * sizeof *whole_o);
    double *whole_l = malloc((size_t)nlines * sizeof *whole_l);
    double *vmax = malloc((size_t)nlines * sizeof *vmax);
    int ok = whole_o && whole_l && vmax && tensor_make(&acc_o, &shape, FA_DTYPE_F32, &packed, rng) &&
             tensor_make(&acc_l, &lines, FA_DTYPE_F32, &lse, rng);
    for (int p = 0; p < SPLIT_MAX_PARTS && ok; p++)
        ok = tensor_make(&part_o[p], &shape, FA_DTYPE_F32, &packed, rng) &&
             tensor_make(&part_l[p], &lines, FA_DTYPE_F32, &lse, rng);
    CHECK(ok);
    if (!ok) goto done;

    /* Row by row: 1 to 40 keys, cut in 2 to 4 ranges (some empty); the
     * ranges past a row's count are empty too. The accumulator starts
     * empty, its O NaN: the first merge must take the part whole. */
    for (int line = 0; line < nlines; line++) {
        double s[SPLIT_MAX_KEYS], v[SPLIT_MAX_KEYS * SPLIT_DIM], o[SPLIT_DIM], l;
        const int keys = 1 + (int)(fa_rng_next(rng) % SPLIT_MAX_KEYS);
        const int parts = 2 + (int)(fa_rng_next(rng) % (SPLIT_MAX_PARTS - 1));
        vmax[line] = 0.0;
        for (int j = 0; j < keys; j++) {
            s[j] = 3.0 * fa_rng_normal(rng);
            for (int x = 0; x < SPLIT_DIM; x++) {
                v[j * SPLIT_DIM + x] = fa_rng_normal(rng);
                vmax[line] = fmax(vmax[line], fabs(v[j * SPLIT_DIM + x]));
            }
        }
        int cuts[SPLIT_MAX_PARTS + 1];
        cuts[0] = 0;
        cuts[parts] = keys;
        for (int p = 1; p < parts; p++) cuts[p] = (int)(fa_rng_next(rng) % (uint64_t)(keys + 1));
        for (int p = 1; p < parts; p++) /* sort the inner cuts */
            for (int q = p + 1; q < parts; q++)
                if (cuts[q] < cuts[p]) {
                    const int c = cuts[p];
                    cuts[p] = cuts[q];
                    cuts[q] = c;
                }
        softmax_range(s, v, 0, keys, &whole_o[line * SPLIT_DIM], &whole_l[line]);
        const int b = line / (shape.rows * shape.heads), r = line / shape.heads % shape.rows, h = line % shape.heads;
        put(acc_l.host, FA_DTYPE_F32, at(&acc_l.view, b, r, h, 0), -INFINITY);
        for (int x = 0; x < SPLIT_DIM; x++) put(acc_o.host, FA_DTYPE_F32, at(&acc_o.view, b, r, h, x), NAN);
        for (int p = 0; p < SPLIT_MAX_PARTS; p++) {
            softmax_range(s, v, p < parts ? cuts[p] : keys, p < parts ? cuts[p + 1] : keys, o, &l);
            put(part_l[p].host, FA_DTYPE_F32, at(&part_l[p].view, b, r, h, 0), (float)l);
            for (int x = 0; x < SPLIT_DIM; x++)
                put(part_o[p].host, FA_DTYPE_F32, at(&part_o[p].view, b, r, h, x), (float)o[x]);
        }
    }

    ok = tensor_place(&acc_o, t->ctx) && tensor_place(&acc_l, t->ctx);
    for (int p = 0; p < SPLIT_MAX_PARTS && ok; p++) {
        ok = tensor_place(&part_o[p], t->ctx) && tensor_place(&part_l[p], t->ctx);
        fa_status st = ok ? t->ops->rows_merge(t->ctx->impl, &shape, &acc_o.view, &acc_l.view, &part_o[p].view,
                                               &part_l[p].view)
                          : FA_ERR_INTERNAL;
        CHECK_MSG(st == FA_SUCCESS, "merging part %d on %s: %s", p, t->label, fa_last_error());
        ok = ok && st == FA_SUCCESS;
    }
    got_o = ok ? tensor_fetch(&acc_o) : NULL;
    got_l = ok ? tensor_fetch(&acc_l) : NULL;
    if (got_o && got_l) {
        /* Parts rounded to fp32, then up to four merges of a few ulps each. */
        int bad = 0;
        for (int line = 0; line < nlines; line++) {
            const int b = line / (shape.rows * shape.heads), r = line / shape.heads % shape.rows,
                      h = line % shape.heads;
            const double gl = get(got_l, FA_DTYPE_F32, at(&acc_l.view, b, r, h, 0));
            int row_ok = fabs(gl - whole_l[line]) <= 1e-5 * (1.0 + fabs(whole_l[line]));
            for (int x = 0; x < SPLIT_DIM; x++) {
                const double go = get(got_o, FA_DTYPE_F32, at(&acc_o.view, b, r, h, x));
                row_ok = row_ok && fabs(go - whole_o[line * SPLIT_DIM + x]) <= 1e-5 * vmax[line];
            }
            if (!row_ok && bad++ < MAX_REPORTED)
                fprintf(stderr, "    split softmax on %s: row %d has L %.9g, the whole row's is %.9g\n", t->label, line,
                        gl, whole_l[line]);
        }
        CHECK_MSG(bad == 0, "split softmax on %s: %d of %d rows differ from the whole row's", t->label, bad, nlines);
    }
done:
    free(got_o);
    free(got_l);
    tensor_free(&acc_o);
    tensor_free(&acc_l);
    for (int p = 0; p < SPLIT_MAX_PARTS; p++) {
        tensor_free(&part_o[p]);
        tensor_free(&part_l[p]);
    }
    free(whole_o);
    free(whole_l);
    free(vmax);
}

FA_TEST(merge_reproduces_split_softmax) { on_every_context("rows_merge of a split softmax", 1, split_checks); }

FA_TEST_MAIN(FA_CASE(copy_every_dtype_pair), FA_CASE(add_every_dtype_pair), FA_CASE(fill_values),
             FA_CASE(merge_random_and_special_rows), FA_CASE(merge_reproduces_split_softmax))
