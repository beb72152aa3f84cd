/* One problem on one context and as a ring of threads (dist_check.h). */
#include "dist_check.h"

#include "harness.h"
#include "ring_threads.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dist_case dist_case_default(fa_backend backend, int world, fa_cp_layout layout) {
    dist_case c;
    memset(&c, 0, sizeof c);
    c.backend = backend;
    c.dtype = FA_DTYPE_F32;
    c.batch = 2;
    c.seqlen_q = c.seqlen_k = 48;
    c.heads_q = 2;
    c.heads_kv = 1;
    c.head_dim = 16;
    c.window_left = c.window_right = -1;
    c.layout = layout;
    c.world = world;
    c.backward = 1;
    return c;
}

double dist_check_tolerance(fa_dtype dtype) {
    return dtype == FA_DTYPE_F32 ? 2e-5 : dtype == FA_DTYPE_F16 ? 2e-3 : 1.5e-2;
}

/* The whole problem's sizes. */
typedef struct shape {
    int64_t outer, nq, nk;  /* outer: batch, or 1 with varlen; n: tokens */
    int64_t q, kv, lse;     /* elements */
    size_t es;
} shape;

static shape shape_of(const dist_case *c) {
    shape s;
    const int varlen = c->cu_q != NULL;
    s.outer = varlen ? 1 : c->batch;
    s.nq = varlen ? c->cu_q[c->batch] : c->seqlen_q;
    s.nk = varlen ? (c->cu_k ? c->cu_k : c->cu_q)[c->batch] : c->seqlen_k;
    s.q = s.outer * s.nq * c->heads_q * c->head_dim;
    s.kv = s.outer * s.nk * c->heads_kv * c->head_dim;
    s.lse = s.outer * c->heads_q * s.nq;
    s.es = fa_dtype_size(c->dtype);
    return s;
}

typedef struct tensors {
    void *q, *k, *v, *dout;              /* inputs */
    void *o, *dq, *dk, *dv;              /* outputs */
    float *lse;
} tensors;

static void tensors_alloc(tensors *t, const shape *s) {
    t->o = malloc((size_t)s->q * s->es);
    t->dq = malloc((size_t)s->q * s->es);
    t->dk = malloc((size_t)s->kv * s->es);
    t->dv = malloc((size_t)s->kv * s->es);
    t->lse = malloc((size_t)s->lse * sizeof(float));
}

static void tensors_free(tensors *t, int inputs) {
    if (inputs) {
        free(t->q);
        free(t->k);
        free(t->v);
        free(t->dout);
    }
    free(t->o);
    free(t->dq);
    free(t->dk);
    free(t->dv);
    free(t->lse);
}

/* The seed and offset a reseeded case moves to (offsets above 2^32 reach
 * the key as well as the counter). */
static const uint64_t reseed_seed = 0x0123456789abcdefull, reseed_offset = 0x0000000500000003ull;

static void make_desc(const dist_case *c, const uint8_t *mask, size_t mask_bytes, fa_attention_desc *d) {
    fa_attention_desc_init(d);
    d->batch = c->batch;
    d->seqlen_q = c->seqlen_q;
    d->seqlen_k = c->seqlen_k;
    d->heads_q = c->heads_q;
    d->heads_kv = c->heads_kv;
    d->head_dim = c->head_dim;
    d->q.dtype = d->k.dtype = d->v.dtype = d->o.dtype = c->dtype;
    d->causal = c->causal;
    d->window_left = c->window_left;
    d->window_right = c->window_right;
    d->block_mask = mask;
    d->block_mask_bytes = mask_bytes;
    d->block_q = c->block_q;
    d->block_k = c->block_k;
    d->cu_seqlens_q = c->cu_q;
    d->cu_seqlens_k = c->cu_k ? c->cu_k : c->cu_q;
    d->dropout_p = c->dropout_p;
    d->dropout_seed = 7;
}

/* Upload host arrays to new buffers, in order; NULL entries skipped. */
static fa_status upload(fa_context ctx, fa_buffer *bufs, void *const *host, const size_t *bytes, int n) {
    for (int i = 0; i < n; i++) {
        fa_status st = fa_buffer_alloc(ctx, bytes[i], &bufs[i]);
        if (st != FA_SUCCESS) return st;
        if (host[i] && (st = fa_buffer_upload(bufs[i], 0, host[i], bytes[i])) != FA_SUCCESS) return st;
    }
    return FA_SUCCESS;
}

static void free_buffers(fa_buffer *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
}

/* The one-context run: what the ring must reproduce. */
static fa_status run_whole(const dist_case *c, const fa_attention_desc *d, const shape *s, const tensors *in,
                           tensors *out) {
    fa_context ctx = NULL;
    fa_plan plan = NULL;
    fa_buffer b[10] = {0};
    fa_status st = fa_context_create(c->backend, -1, &ctx);
    if (st != FA_SUCCESS) return st;
    fa_attention_desc whole = *d;
    if (c->reseed) {
        whole.dropout_seed = reseed_seed;
        whole.dropout_offset = reseed_offset;
    }
    d = &whole;
    enum { Q, K, V, DO, O, L, DQ, DK, DV };
    void *host[] = {in->q, in->k, in->v, in->dout, NULL, NULL, NULL, NULL, NULL};
    const size_t bytes[] = {s->q * s->es, s->kv * s->es, s->kv * s->es, s->q * s->es, s->q * s->es,
                            s->lse * sizeof(float), s->q * s->es, s->kv * s->es, s->kv * s->es};
    if ((st = upload(ctx, b, host, bytes, 9)) == FA_SUCCESS && (st = fa_plan_create(ctx, d, &plan)) == FA_SUCCESS &&
        (st = fa_forward(plan, b[Q], b[K], b[V], b[O], b[L])) == FA_SUCCESS &&
        (st = fa_buffer_download(b[O], 0, out->o, bytes[O])) == FA_SUCCESS &&
        (st = fa_buffer_download(b[L], 0, out->lse, bytes[L])) == FA_SUCCESS && c->backward &&
        (st = fa_backward(plan, b[Q], b[K], b[V], b[O], b[L], b[DO], b[DQ], b[DK], b[DV])) == FA_SUCCESS &&
        (st = fa_buffer_download(b[DQ], 0, out->dq, bytes[DQ])) == FA_SUCCESS &&
        (st = fa_buffer_download(b[DK], 0, out->dk, bytes[DK])) == FA_SUCCESS)
        st = fa_buffer_download(b[DV], 0, out->dv, bytes[DV]);
    if (plan) fa_plan_destroy(plan);
    free_buffers(b, 9);
    fa_context_destroy(ctx);
    return st;
}

typedef struct rank_job {
    const dist_case *c;
    fa_attention_desc desc;
    const shape *s;
    const tensors *in;
    tensors *out;
    ring_hub *hub;
    void *nccl;
    fa_status plan_status, pass_status;
    char plan_message[512];
} rank_job;

/* This rank's part of each whole tensor, and back. */
static void *part_of(const rank_job *j, int rank, const void *whole, int64_t outer, int64_t n, size_t token_bytes) {
    void *local = malloc((size_t)(outer * (n / j->c->world)) * token_bytes);
    if (local && fa_cp_scatter(j->c->layout, j->c->world, rank, outer, n, token_bytes, whole, local) != FA_SUCCESS) {
        free(local);
        return NULL;
    }
    return local;
}

static fa_status ring_passes(rank_job *j, int rank, fa_context ctx, fa_dist_plan plan) {
    const dist_case *c = j->c;
    const shape *s = j->s;
    const int W = c->world;
    const size_t qt = (size_t)c->heads_q * c->head_dim * s->es, kt = (size_t)c->heads_kv * c->head_dim * s->es;
    void *host[4] = {part_of(j, rank, j->in->q, s->outer, s->nq, qt), part_of(j, rank, j->in->k, s->outer, s->nk, kt),
                     part_of(j, rank, j->in->v, s->outer, s->nk, kt),
                     part_of(j, rank, j->in->dout, s->outer, s->nq, qt)};
    const size_t qb = (size_t)(s->q / W) * s->es, kb = (size_t)(s->kv / W) * s->es, lb = (size_t)(s->lse / W) * 4;
    const size_t bytes[] = {qb, kb, kb, qb, qb, lb, qb, kb, kb};
    void *up[] = {host[0], host[1], host[2], host[3], NULL, NULL, NULL, NULL, NULL};
    void *got[] = {malloc(qb), malloc(lb), malloc(qb), malloc(kb), malloc(kb)};
    fa_buffer b[9] = {0};
    fa_status st = FA_ERR_OUT_OF_MEMORY;
    if (host[0] && host[1] && host[2] && host[3] && got[0] && got[1] && got[2] && got[3] && got[4])
        st = upload(ctx, b, up, bytes, 9);
    if (st == FA_SUCCESS) st = fa_dist_forward(plan, b[0], b[1], b[2], b[4], b[5]);
    if (st == FA_SUCCESS && (st = fa_buffer_download(b[4], 0, got[0], qb)) == FA_SUCCESS)
        st = fa_buffer_download(b[5], 0, got[1], lb);
    if (st == FA_SUCCESS) {
        fa_cp_gather(c->layout, W, rank, s->outer, s->nq, qt, got[0], j->out->o);
        fa_cp_gather(c->layout, W, rank, s->outer * c->heads_q, s->nq, 4, got[1], j->out->lse);
    }
    if (st == FA_SUCCESS && c->backward) {
        st = fa_dist_backward(plan, b[0], b[1], b[2], b[4], b[5], b[3], b[6], b[7], b[8]);
        if (st == FA_SUCCESS && (st = fa_buffer_download(b[6], 0, got[2], qb)) == FA_SUCCESS &&
            (st = fa_buffer_download(b[7], 0, got[3], kb)) == FA_SUCCESS)
            st = fa_buffer_download(b[8], 0, got[4], kb);
        if (st == FA_SUCCESS) {
            fa_cp_gather(c->layout, W, rank, s->outer, s->nq, qt, got[2], j->out->dq);
            fa_cp_gather(c->layout, W, rank, s->outer, s->nk, kt, got[3], j->out->dk);
            fa_cp_gather(c->layout, W, rank, s->outer, s->nk, kt, got[4], j->out->dv);
        }
    }
    free_buffers(b, 9);
    for (int i = 0; i < 4; i++) free(host[i]);
    for (int i = 0; i < 5; i++) free(got[i]);
    return st;
}

static void rank_main(int rank, void *arg) {
    rank_job *j = arg;
    fa_context ctx = NULL;
    fa_comm comm = NULL;
    fa_dist_plan plan = NULL;
    j->plan_status = j->pass_status = FA_ERR_INTERNAL;
    fa_status st = fa_context_create(j->c->backend, j->c->nccl ? rank : -1, &ctx);
    if (st == FA_SUCCESS && j->c->nccl) {
        st = fa_comm_create_nccl(ctx, j->nccl, &comm);
    } else if (st == FA_SUCCESS) {
        const fa_transport t = ring_hub_transport(j->hub, rank);
        st = fa_comm_create(&t, &comm);
    }
    if (st != FA_SUCCESS) {
        snprintf(j->plan_message, sizeof j->plan_message, "%s", fa_last_error());
        if (ctx) fa_context_destroy(ctx);
        return;
    }
    j->plan_status = fa_dist_plan_create(ctx, comm, &j->desc, j->c->layout, &plan);
    /* Every rank reseeds alike, so all fail here or none: no rank waits. */
    if (j->plan_status == FA_SUCCESS && j->c->reseed)
        j->plan_status = fa_dist_plan_set_dropout_seed(plan, reseed_seed, reseed_offset);
    snprintf(j->plan_message, sizeof j->plan_message, "%s", j->plan_status == FA_SUCCESS ? "" : fa_last_error());
    if (j->plan_status == FA_SUCCESS) {
        j->pass_status = ring_passes(j, rank, ctx, plan);
        if (j->pass_status != FA_SUCCESS)
            fprintf(stderr, "rank %d: %s: %s\n", rank, fa_status_string(j->pass_status), fa_last_error());
    }
    if (plan) fa_dist_plan_destroy(plan);
    fa_comm_destroy(comm);
    fa_context_destroy(ctx);
}

static double error_of(const void *got, const void *ref, fa_dtype dtype, int64_t n, int *mismatch) {
    const fa_test_diff d = fa_test_compare(got, ref, dtype, n);
    if (d.mismatched) {
        if (mismatch) *mismatch += (int)d.mismatched;
        return INFINITY;
    }
    return d.diff_norm / (d.ref_norm + sqrt((double)(d.finite ? d.finite : 1)));
}

dist_result dist_check_run(const dist_case *c, int mutate_rank, void (*mutate)(fa_attention_desc *)) {
    dist_result r;
    memset(&r, 0, sizeof r);
    const shape s = shape_of(c);
    fa_rng rng;
    fa_rng_seed(&rng, 1234 + (uint64_t)c->seqlen_q * 31 + (uint64_t)c->world);
    tensors in = {0}, ref = {0}, ring = {0};
    in.q = fa_test_random_tensor(&rng, c->dtype, s.q);
    in.k = fa_test_random_tensor(&rng, c->dtype, s.kv);
    in.v = fa_test_random_tensor(&rng, c->dtype, s.kv);
    in.dout = fa_test_random_tensor(&rng, c->dtype, s.q);
    tensors_alloc(&ref, &s);
    tensors_alloc(&ring, &s);
    uint8_t *mask = NULL;
    size_t mask_bytes = 0;
    if (c->block_q > 0) {
        mask_bytes = (size_t)((c->seqlen_q + c->block_q - 1) / c->block_q) *
                     (size_t)((c->seqlen_k + c->block_k - 1) / c->block_k);
        mask = malloc(mask_bytes);
        for (size_t i = 0; i < mask_bytes; i++) mask[i] = fa_rng_uniform(&rng, 0, 1) < 0.7;
    }
    fa_attention_desc d;
    make_desc(c, mask, mask_bytes, &d);
    r.ran = run_whole(c, &d, &s, &in, &ref) == FA_SUCCESS;
    if (!r.ran) fprintf(stderr, "one-context run: %s\n", fa_last_error());
    const int W = c->world;
    rank_job jobs[8];
    void *args[8];
    ring_hub *hub = ring_hub_create(W);
    void *nccl[8] = {0};
    char why[256] = "";
    if (c->nccl && ring_nccl_comms(W, nccl, why, sizeof why) != FA_SUCCESS) fprintf(stderr, "NCCL: %s\n", why);
    fa_test_poison(ring.o, c->dtype, s.q);
    fa_test_poison(ring.lse, FA_DTYPE_F32, s.lse);
    for (int k = 0; k < W; k++) {
        jobs[k] = (rank_job){c, d, &s, &in, &ring, hub, nccl[k], FA_SUCCESS, FA_SUCCESS, ""};
        if (k == mutate_rank && mutate) mutate(&jobs[k].desc);
        args[k] = &jobs[k];
    }
    ring_threads_run(W, rank_main, args);
    ring_hub_destroy(hub);
    for (int k = 0; k < W && c->nccl; k++) ring_nccl_destroy(nccl[k]);
    int all_ok = r.ran;
    for (int k = 0; k < W; k++) {
        r.plan_status[k] = jobs[k].plan_status;
        r.pass_status[k] = jobs[k].pass_status;
        memcpy(r.plan_message[k], jobs[k].plan_message, sizeof r.plan_message[k]);
        all_ok &= jobs[k].plan_status == FA_SUCCESS && jobs[k].pass_status == FA_SUCCESS;
    }
    r.err_o = r.err_lse = r.err_dq = r.err_dk = r.err_dv = INFINITY;
    if (all_ok) {
        r.err_o = error_of(ring.o, ref.o, c->dtype, s.q, NULL);
        r.err_lse = error_of(ring.lse, ref.lse, FA_DTYPE_F32, s.lse, &r.lse_mismatch);
        if (c->backward) {
            r.err_dq = error_of(ring.dq, ref.dq, c->dtype, s.q, NULL);
            r.err_dk = error_of(ring.dk, ref.dk, c->dtype, s.kv, NULL);
            r.err_dv = error_of(ring.dv, ref.dv, c->dtype, s.kv, NULL);
        } else {
            r.err_dq = r.err_dk = r.err_dv = 0;
        }
    }
    free(mask);
    tensors_free(&in, 1);
    tensors_free(&ref, 0);
    tensors_free(&ring, 0);
    return r;
}

void dist_check_expect(const char *what, const dist_case *c) {
    const dist_result r = dist_check_run(c, -1, NULL);
    const double tol = dist_check_tolerance(c->dtype);
    CHECK_MSG(r.ran, "%s: the one-context run failed", what);
    for (int k = 0; k < c->world; k++)
        CHECK_MSG(r.plan_status[k] == FA_SUCCESS && r.pass_status[k] == FA_SUCCESS, "%s: rank %d: %s / %s: %s", what,
                  k, fa_status_string(r.plan_status[k]), fa_status_string(r.pass_status[k]), r.plan_message[k]);
    CHECK_MSG(r.err_o <= tol && r.err_lse <= tol && r.lse_mismatch == 0,
              "%s: O error %.3g, L error %.3g (%d mismatched), tolerance %.3g", what, r.err_o, r.err_lse,
              r.lse_mismatch, tol);
    CHECK_MSG(r.err_dq <= tol && r.err_dk <= tol && r.err_dv <= tol, "%s: dQ %.3g, dK %.3g, dV %.3g, tolerance %.3g",
              what, r.err_dq, r.err_dk, r.err_dv, tol);
    printf("%-8s %-6s %-44s world %d %-10s O %.2e L %.2e dQ %.2e dK %.2e dV %.2e\n", fa_backend_name(c->backend),
           c->nccl ? "nccl" : "thread", what, c->world, c->layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous", r.err_o,
           r.err_lse, r.err_dq, r.err_dk, r.err_dv);
}
