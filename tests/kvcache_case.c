/* One KV-cache step on a device against the CPU reference (kvcache_case.h). */
#include "kvcache_case.h"

#include "desc.h"
#include "dtype.h"
#include "harness.h"
#include "plan.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kv_case kv_case_default(const char *name) {
    kv_case c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.dtype = FA_DTYPE_F16;
    c.batch = 1;
    c.seqlen_q = 1;
    c.seqlen_k = 96;
    c.heads_q = 2;
    c.heads_kv = 1;
    c.head_dim = 64;
    c.seqlen_new = 1;
    c.window_left = c.window_right = -1;
    c.lens[0] = -1;
    c.seed = 1;
    return c;
}

fa_attention_desc kv_case_desc(const kv_case *c) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = c->batch;
    d.seqlen_q = c->seqlen_q;
    d.seqlen_k = c->seqlen_k;
    d.heads_q = c->heads_q;
    d.heads_kv = c->heads_kv;
    d.head_dim = c->head_dim;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = c->dtype;
    d.causal = c->causal;
    d.window_left = c->window_left;
    d.window_right = c->window_right;
    d.softcap = c->softcap;
    d.kv_cache = 1;
    d.page_size = c->page_size;
    d.seqlen_new = c->seqlen_new;
    if (c->seqlen_new > 0) d.k_new.dtype = d.v_new.dtype = c->dtype;
    d.rotary_dim = c->rotary_dim;
    d.rotary_interleaved = c->rotary_interleaved;
    if (c->strided) {
        /* q: rows padded by 8 elements; caches: token rows padded by 16
         * (pages by a row more); k_new and v_new head-major. */
        const int64_t dim = c->head_dim;
        d.q.stride_head = dim;
        d.q.stride_seq = c->heads_q * dim + 8;
        d.q.stride_batch = c->seqlen_q * d.q.stride_seq + 8;
        d.q.offset = 8;
        const int64_t rows = c->page_size > 0 ? c->page_size : c->seqlen_k;
        d.k.stride_head = d.v.stride_head = dim;
        d.k.stride_seq = d.v.stride_seq = c->heads_kv * dim + 16;
        d.k.stride_batch = d.v.stride_batch = (rows + 1) * d.k.stride_seq;
        d.v.offset = 16;
        if (c->seqlen_new > 0) {
            d.k_new.stride_seq = d.v_new.stride_seq = dim;
            d.k_new.stride_head = d.v_new.stride_head = c->seqlen_new * dim;
            d.k_new.stride_batch = d.v_new.stride_batch = c->heads_kv * c->seqlen_new * dim;
        }
    }
    return d;
}

/* Host arrays of one case. */
typedef struct kv_host {
    fa_attention_desc desc;
    float *slopes;
    int64_t n_q, n_k, n_v, n_o, n_l, n_kn, n_vn, n_bt, n_rot;
    void *q, *k, *v, *k0, *v0, *kn, *vn, *o, *o_ref, *k_ref, *v_ref;
    float *l, *l_ref, *cos_t, *sin_t;
    int32_t *lens, *bt;
    uint8_t *written_k, *written_v; /* appended elements, by the rules */
} kv_host;

static void host_free(kv_host *h) {
    void *p[] = {h->slopes, h->q, h->k, h->v, h->k0, h->v0, h->kn, h->vn, h->o, h->o_ref, h->k_ref, h->v_ref,
                 h->l, h->l_ref, h->cos_t, h->sin_t, h->lens, h->bt, h->written_k, h->written_v};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    memset(h, 0, sizeof *h);
}

static void *copy_of(const void *src, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p && bytes) memcpy(p, src, bytes);
    return p;
}

static size_t bytes_of(fa_dtype t, int64_t n) { return (size_t)n * fa_dtype_size(t); }

/* Pages a sequence of len_k tokens uses. */
static int64_t pages_for(const fa_attention_desc *d, int64_t len_k) {
    return (len_k + d->page_size - 1) / d->page_size;
}

/* Builds the case's inputs; 0 when it could not. */
static int host_init(kv_host *h, const kv_case *c) {
    memset(h, 0, sizeof *h);
    fa_attention_desc *d = &h->desc;
    *d = kv_case_desc(c);
    fa_rng rng;
    fa_rng_seed(&rng, c->seed * 7919u + 17u);
    const int B = c->batch;
    h->lens = malloc((size_t)B * sizeof *h->lens);
    if (!h->lens) return 0;
    /* Lengths: given, or random with room for the append; every sequence
     * valid unless marked. */
    const int room = c->seqlen_k - c->seqlen_new;
    const int q_room = c->rotary_dim > 0 ? c->seqlen_k - (fa_desc_rotary_query_offsets(d) ? c->seqlen_q : 1) : room;
    const int most = room < q_room ? room : q_room;
    for (int b = 0; b < B; b++) {
        h->lens[b] = c->lens[0] < 0 ? (int)(fa_rng_next(&rng) % (uint64_t)(most + 1)) : c->lens[b];
        if (c->invalid >> b & 1u) {
            switch (b % 4) {
            case 0: h->lens[b] = -3; break;
            case 1: h->lens[b] = room + 1; break;
            case 2: break; /* a page outside the pool (below), or a length past the capacity */
            default: h->lens[b] = c->rotary_dim > 0 ? q_room + 1 : room + 2; break;
            }
            if (b % 4 == 2 && c->page_size == 0) h->lens[b] = c->seqlen_k + 5;
        }
    }
    if (c->alibi) {
        h->slopes = malloc((size_t)c->heads_q * sizeof *h->slopes);
        if (!h->slopes) return 0;
        for (int i = 0; i < c->heads_q; i++) h->slopes[i] = (float)pow(2.0, -8.0 * (i + 1) / c->heads_q);
        d->alibi_slopes = h->slopes;
    }
    /* Pages: each sequence's in a shuffled order from one pool, with spare
     * pages no sequence uses; table entries past a sequence's pages -1. */
    if (c->page_size > 0) {
        const int64_t pps = fa_desc_pages_per_seq(d);
        h->n_bt = B * pps;
        h->bt = malloc((size_t)h->n_bt * sizeof *h->bt);
        int64_t total = 0;
        for (int b = 0; b < B; b++) {
            const int64_t len_k = (int64_t)h->lens[b] + c->seqlen_new;
            total += len_k > 0 && len_k <= c->seqlen_k ? pages_for(d, len_k) : pps;
        }
        d->num_pages = (int)total + 3;
        int32_t *perm = malloc((size_t)d->num_pages * sizeof *perm);
        if (!h->bt || !perm) {
            free(perm);
            return 0;
        }
        for (int i = 0; i < d->num_pages; i++) perm[i] = i;
        for (int i = d->num_pages - 1; i > 0; i--) {
            const int j = (int)(fa_rng_next(&rng) % (uint64_t)(i + 1));
            const int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        int next = 0;
        for (int b = 0; b < B; b++) {
            const int64_t len_k = (int64_t)h->lens[b] + c->seqlen_new;
            const int64_t used = len_k > 0 && len_k <= c->seqlen_k ? pages_for(d, len_k) : pps;
            for (int64_t p = 0; p < pps; p++) h->bt[b * pps + p] = p < used ? perm[next++] : -1;
            if ((c->invalid >> b & 1u) && b % 4 == 2) h->bt[b * pps + (used > 1 ? used - 1 : 0)] = d->num_pages;
        }
        free(perm);
    }
    if (fa_attention_desc_check(d) != FA_SUCCESS) {
        CHECK_MSG(0, "%s: the case's descriptor is refused: %s", c->name, fa_last_error());
        return 0;
    }
    h->n_q = fa_desc_tensor_extent(d, FA_TENSOR_Q);
    h->n_k = fa_desc_tensor_extent(d, FA_TENSOR_K);
    h->n_v = fa_desc_tensor_extent(d, FA_TENSOR_V);
    h->n_o = fa_desc_tensor_extent(d, FA_TENSOR_O);
    h->n_l = (int64_t)B * c->heads_q * c->seqlen_q;
    h->n_kn = c->seqlen_new > 0 ? fa_desc_tensor_extent(d, FA_TENSOR_K_NEW) : 0;
    h->n_vn = c->seqlen_new > 0 ? fa_desc_tensor_extent(d, FA_TENSOR_V_NEW) : 0;
    h->n_rot = (int64_t)c->seqlen_k * (c->rotary_dim / 2);
    const fa_dtype t = c->dtype;
    h->q = fa_test_random_tensor(&rng, t, h->n_q);
    h->k = fa_test_random_tensor(&rng, t, h->n_k);
    h->v = fa_test_random_tensor(&rng, t, h->n_v);
    h->kn = h->n_kn ? fa_test_random_tensor(&rng, t, h->n_kn) : NULL;
    h->vn = h->n_vn ? fa_test_random_tensor(&rng, t, h->n_vn) : NULL;
    h->k0 = copy_of(h->k, bytes_of(t, h->n_k));
    h->v0 = copy_of(h->v, bytes_of(t, h->n_v));
    h->k_ref = copy_of(h->k, bytes_of(t, h->n_k));
    h->v_ref = copy_of(h->v, bytes_of(t, h->n_v));
    h->o = malloc(bytes_of(t, h->n_o));
    h->o_ref = malloc(bytes_of(t, h->n_o));
    h->l = malloc((size_t)h->n_l * sizeof(float));
    h->l_ref = malloc((size_t)h->n_l * sizeof(float));
    h->written_k = calloc((size_t)h->n_k, 1);
    h->written_v = calloc((size_t)h->n_v, 1);
    if (c->rotary_dim > 0) {
        /* FlashAttention's tables: angle pos / 10000^(2i / rotary_dim). */
        h->cos_t = malloc((size_t)h->n_rot * sizeof(float));
        h->sin_t = malloc((size_t)h->n_rot * sizeof(float));
        if (!h->cos_t || !h->sin_t) return 0;
        const int half = c->rotary_dim / 2;
        for (int64_t p = 0; p < c->seqlen_k; p++)
            for (int i = 0; i < half; i++) {
                const double a = (double)p / pow(10000.0, 2.0 * i / c->rotary_dim);
                h->cos_t[p * half + i] = (float)cos(a);
                h->sin_t[p * half + i] = (float)sin(a);
            }
    }
    if (!h->q || !h->k || !h->v || (c->seqlen_new > 0 && (!h->kn || !h->vn)) || !h->k0 || !h->v0 || !h->k_ref ||
        !h->v_ref || !h->o || !h->o_ref || !h->l || !h->l_ref || !h->written_k || !h->written_v)
        return 0;
    fa_test_poison(h->o_ref, t, h->n_o);
    for (int64_t i = 0; i < h->n_l; i++) h->l_ref[i] = NAN;
    /* What the rules let the step write. */
    for (int b = 0; b < B; b++) {
        if (!fa_ref_kvcache_seq_valid(d, h->lens, h->bt, b)) continue;
        for (int tk = 0; tk < c->seqlen_new; tk++)
            for (int hk = 0; hk < c->heads_kv; hk++)
                for (int r = 0; r < 2; r++) {
                    const fa_layout l = fa_desc_layout(d, r ? FA_TENSOR_V : FA_TENSOR_K);
                    const int64_t pos = (int64_t)h->lens[b] + tk;
                    const int64_t row = c->page_size > 0
                                            ? l.offset + (int64_t)h->bt[b * fa_desc_pages_per_seq(d) + pos / c->page_size] *
                                                             l.stride_batch +
                                                  (pos % c->page_size) * l.stride_seq + (int64_t)hk * l.stride_head
                                            : l.offset + (int64_t)b * l.stride_batch + pos * l.stride_seq +
                                                  (int64_t)hk * l.stride_head;
                    uint8_t *w = r ? h->written_v : h->written_k;
                    memset(w + row, 1, (size_t)c->head_dim);
                }
    }
    return 1;
}

/* A device buffer holding bytes of host data (NULL data: uninitialised). */
static fa_status upload(fa_context ctx, const void *data, size_t bytes, fa_buffer *buf) {
    *buf = NULL;
    fa_status st = fa_buffer_alloc(ctx, bytes ? bytes : 16, buf);
    if (st == FA_SUCCESS && data && bytes) st = fa_buffer_upload(*buf, 0, data, bytes);
    return st;
}

/* Re-prepares a plan with split key splits (0: as planned) and the case's
 * forced tile (a backend-generic test hook: the backend builds what the
 * changed plan says). */
static fa_status force_plan(fa_plan plan, const kv_case *c) {
    fa_context ctx = plan->ctx;
    if (plan->impl) ctx->ops->plan_release(ctx->impl, plan->impl);
    plan->impl = NULL;
    fa_kernel_plan *kp = &plan->info.forward;
    const int split = c->force_split > 0 ? c->force_split : kp->split_k;
    if (c->force_tile.br > 0 && (kp->variant == FA_VARIANT_SIMT || kp->variant == FA_VARIANT_SPLITK)) {
        kp->br = c->force_tile.br;
        kp->bc = c->force_tile.bc;
        kp->thread_rows = c->force_tile.tr;
        kp->thread_cols = c->force_tile.tc;
        kp->work_group_size = (kp->br / kp->thread_rows) * (kp->bc / kp->thread_cols);
    }
    kp->split_k = split;
    if (kp->variant == FA_VARIANT_SIMT && split > 1) kp->variant = FA_VARIANT_SPLITK;
    if (kp->variant == FA_VARIANT_SPLITK && split == 1) kp->variant = FA_VARIANT_SIMT;
    return ctx->ops->plan_prepare(ctx->impl, plan, &plan->impl);
}

/* Element tolerance of a rotated key: one rounding of the dtype apart,
 * beside fp32's error in x cos - y sin (a few 2^-24 of operands of unit
 * scale), which decides the rounding of results near zero. */
static double ulp_rel(fa_dtype t) {
    return t == FA_DTYPE_F32 ? 1e-6 : t == FA_DTYPE_F16 ? 1.0 / 1024.0 : 1.0 / 128.0;
}
#define ROTATION_ABS 4e-6

static double o_tolerance(fa_dtype t) { return t == FA_DTYPE_F32 ? 2e-5 : t == FA_DTYPE_F16 ? 2e-3 : 2e-2; }

/* Compares one pool after the step: appended elements against the
 * reference, every other element bit-identical to the original. */
static void check_pool(const kv_case *c, const char *dev, const char *which, const void *got, const void *ref,
                       const void *orig, const uint8_t *written, int64_t n) {
    const size_t e = fa_dtype_size(c->dtype);
    int64_t changed = 0, off = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!written[i]) {
            changed += memcmp((const char *)got + i * (int64_t)e, (const char *)orig + i * (int64_t)e, e) != 0;
            continue;
        }
        const double a = fa_load_elem(got, c->dtype, i), b = fa_load_elem(ref, c->dtype, i);
        const double err = fabs(a - b) / (fabs(b) + 1e-30);
        if (!(fabs(a - b) <= ulp_rel(c->dtype) * fabs(b) + ROTATION_ABS)) off++;
        if (err > worst || isnan(err)) worst = err;
    }
    CHECK_MSG(changed == 0, "%s on %s: %lld elements of the %s pool outside the appended tokens changed", c->name,
              dev, (long long)changed, which);
    CHECK_MSG(off == 0, "%s on %s: %lld appended elements of the %s pool differ from the reference by more than a "
                        "rounding (worst %.3g relative)",
              c->name, dev, (long long)off, which, worst);
}

static void check_lse(const kv_case *c, const char *dev, const float *got, const float *ref, int64_t n) {
    int64_t bad = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double a = got[i], b = ref[i];
        if (!isfinite(b)) {
            bad += !(a == b || (isnan(a) && isnan(b)));
            continue;
        }
        const double err = fabs(a - b);
        if (!(err <= 1e-3 + 1e-4 * fabs(b))) bad++;
        if (err > worst || isnan(err)) worst = err;
    }
    CHECK_MSG(bad == 0, "%s on %s: %lld of %lld entries of L differ from the reference (worst %.3g)", c->name, dev,
              (long long)bad, (long long)n, worst);
}

kv_outcome kv_case_run(fa_context ctx, const kv_case *c) {
    fa_device_info info;
    CHECK_OK(fa_context_get_info(ctx, &info));
    char dev[192];
    snprintf(dev, sizeof dev, "%s (%s)", fa_backend_name(info.backend), info.desc.name);
    kv_host h;
    if (!host_init(&h, c)) {
        CHECK_MSG(0, "%s: host setup failed", c->name);
        host_free(&h);
        return KV_FAILED;
    }
    const fa_attention_desc *d = &h.desc;
    const fa_dtype t = c->dtype;
    const int failures0 = fa_test_failures;

    /* The sequences the case marks invalid are, by the rules, and only
     * those. */
    for (int b = 0; b < c->batch; b++)
        CHECK_MSG(fa_ref_kvcache_seq_valid(d, h.lens, h.bt, b) == !(c->invalid >> b & 1u),
                  "%s: sequence %d is %s by the rules, the case meant it %s", c->name, b,
                  fa_ref_kvcache_seq_valid(d, h.lens, h.bt, b) ? "valid" : "invalid",
                  c->invalid >> b & 1u ? "invalid" : "valid");

    /* The reference on host copies. */
    const fa_ref_kvcache_args ra = {h.q,      h.k_ref,  h.v_ref,  h.o_ref, c->no_lse ? NULL : h.l_ref,
                                    h.lens,   h.bt,     h.kn,     h.vn,    h.cos_t,
                                    h.sin_t};
    CHECK_OK(fa_ref_forward_kvcache(d, &ra));

    fa_plan plan = NULL;
    fa_status st = fa_plan_create(ctx, d, &plan);
    if (st == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "kv_cache")) {
        host_free(&h);
        return KV_REFUSED;
    }
    CHECK_MSG(st == FA_SUCCESS, "%s on %s: fa_plan_create: %s (%s)", c->name, dev, fa_status_string(st),
              fa_last_error());
    if (st != FA_SUCCESS) {
        host_free(&h);
        return KV_FAILED;
    }
    fa_plan_info pi;
    CHECK_OK(fa_plan_get_info(plan, &pi));
    CHECK(pi.kv_cache == 1);
    if (c->force_split > 0 || c->force_tile.br > 0) {
        st = force_plan(plan, c);
        CHECK_MSG(st == FA_SUCCESS, "%s on %s: re-preparing with %d splits, tile %d x %d: %s", c->name, dev,
                  plan->info.forward.split_k, plan->info.forward.br, plan->info.forward.bc, fa_last_error());
        if (c->force_split > 0) CHECK(plan->info.forward.split_k == c->force_split);
    }

    fa_buffer bq = NULL, bk = NULL, bv = NULL, bo = NULL, bl = NULL, blens = NULL, bbt = NULL, bkn = NULL,
              bvn = NULL, bcos = NULL, bsin = NULL;
    fa_test_poison(h.o, t, h.n_o);
    for (int64_t i = 0; i < h.n_l; i++) h.l[i] = NAN;
    if (st == FA_SUCCESS) st = upload(ctx, h.q, bytes_of(t, h.n_q), &bq);
    if (st == FA_SUCCESS) st = upload(ctx, h.k, bytes_of(t, h.n_k), &bk);
    if (st == FA_SUCCESS) st = upload(ctx, h.v, bytes_of(t, h.n_v), &bv);
    if (st == FA_SUCCESS) st = upload(ctx, h.o, bytes_of(t, h.n_o), &bo);
    if (st == FA_SUCCESS && !c->no_lse) st = upload(ctx, h.l, (size_t)h.n_l * sizeof(float), &bl);
    if (st == FA_SUCCESS) st = upload(ctx, h.lens, (size_t)c->batch * sizeof(int32_t), &blens);
    if (st == FA_SUCCESS && c->page_size > 0) st = upload(ctx, h.bt, (size_t)h.n_bt * sizeof(int32_t), &bbt);
    if (st == FA_SUCCESS && c->seqlen_new > 0) st = upload(ctx, h.kn, bytes_of(t, h.n_kn), &bkn);
    if (st == FA_SUCCESS && c->seqlen_new > 0) st = upload(ctx, h.vn, bytes_of(t, h.n_vn), &bvn);
    if (st == FA_SUCCESS && c->rotary_dim > 0) st = upload(ctx, h.cos_t, (size_t)h.n_rot * sizeof(float), &bcos);
    if (st == FA_SUCCESS && c->rotary_dim > 0) st = upload(ctx, h.sin_t, (size_t)h.n_rot * sizeof(float), &bsin);
    CHECK_MSG(st == FA_SUCCESS, "%s on %s: buffers: %s", c->name, dev, fa_last_error());
    if (st == FA_SUCCESS) {
        const fa_kvcache_args a = {bq, bk, bv, bo, bl, blens, bbt, bkn, bvn, bcos, bsin};
        st = fa_forward_kvcache(plan, &a);
        CHECK_MSG(st == FA_SUCCESS, "%s on %s: fa_forward_kvcache: %s (%s)", c->name, dev, fa_status_string(st),
                  fa_last_error());
    }
    if (st == FA_SUCCESS) {
        CHECK_OK(fa_buffer_download(bo, 0, h.o, bytes_of(t, h.n_o)));
        if (!c->no_lse) CHECK_OK(fa_buffer_download(bl, 0, h.l, (size_t)h.n_l * sizeof(float)));
        CHECK_OK(fa_buffer_download(bk, 0, h.k, bytes_of(t, h.n_k)));
        CHECK_OK(fa_buffer_download(bv, 0, h.v, bytes_of(t, h.n_v)));
        const fa_test_diff diff = fa_test_compare(h.o, h.o_ref, t, h.n_o);
        CHECK_MSG(fa_test_within(&diff, o_tolerance(t)),
                  "%s on %s: O: %lld mismatched (NaN or finite where the reference is not), relative error %.3g "
                  "(tolerance %.1g)",
                  c->name, dev, (long long)diff.mismatched, diff.diff_norm / (diff.ref_norm + 1e-300),
                  o_tolerance(t));
        if (!c->no_lse) check_lse(c, dev, h.l, h.l_ref, h.n_l);
        check_pool(c, dev, "K", h.k, h.k_ref, h.k0, h.written_k, h.n_k);
        check_pool(c, dev, "V", h.v, h.v_ref, h.v0, h.written_v, h.n_v);
    }
    fa_buffer bufs[] = {bq, bk, bv, bo, bl, blens, bbt, bkn, bvn, bcos, bsin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
    fa_plan_destroy(plan);
    host_free(&h);
    return fa_test_failures == failures0 ? KV_PASSED : KV_FAILED;
}
