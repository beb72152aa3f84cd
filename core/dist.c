/* Ring attention over the ranks of a communicator (fa_dist_plan_create in
 * flashattn.h).
 *
 * Each rank keeps its queries and, forward, an fp32 accumulator of O and L;
 * the chunks of K and V travel around the ring, one step a rank, the
 * transfer of the next chunk running while the current one is computed.
 * A step's attention is cut into pieces that ordinary plans compute
 * (core/dist_split.c); each piece's O and L fold into the accumulator
 * through the log-sum-exp (the backend's rows_merge). Backward, K and V
 * travel again, and fp32 accumulators of dK and dV travel one transfer
 * behind them, each rank adding its queries' share, until they come home
 * after world transfers; dQ accumulates where it is. Every tensor the ring
 * touches is packed in buffers of its own, so pieces are offsets there
 * and transfers are single copies; the caller's layouts are read and
 * written once, at the start and the end.
 *
 * Dropout: each piece's plan draws its keep bits from the global positions
 * of its rows and keys (its dropout origin), so the ring drops exactly the
 * elements one device drops on the whole sequence with the same seed. The
 * merge is linear in each piece's O, and the piece's L is that of the
 * scores before dropout, as one device's is. */
#include "checked.h"
#include "comm.h"
#include "desc.h"
#include "dist_split.h"
#include "fa_internal.h"
#include "plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct dist_step {
    int source;
    fa_dist_piece *pieces;
    fa_plan *plans;
    int count;
} dist_step;

/* One of the ring's transfers to the next rank and from the previous, with
 * host staging where the transport wants host memory. */
typedef struct ring_link {
    void *host[2];
    void *pending;
    int active;
} ring_link;

struct fa_dist_plan_s {
    fa_context ctx;
    fa_comm comm;
    fa_cp_layout layout;
    int rank, world;
    /* The whole problem, with private copies of its arrays. */
    fa_attention_desc whole;
    uint8_t *block_mask;
    int32_t *cu_q, *cu_k;
    /* The rank's tensors as the caller lays them out. */
    fa_attention_desc local;
    int outer, hq, hk, d;
    int64_t lq, lk;          /* local tokens (per batch entry) */
    fa_dtype dtype;
    dist_step *steps;
    /* Forward: packed Q, two K|V chunks, a piece's O and L, accumulators. */
    fa_buffer qi, kv[2], ostep, lstep, acc_o, acc_l;
    /* Backward, made on its first call: packed O and dO, a piece's dQ and
     * dK|dV, the dQ accumulator and two travelling dK|dV accumulators. */
    fa_buffer oi, doi, dqstep, dkvstep, dq_acc, dkv[2];
    size_t q_elems, kv_elems; /* kv_elems: K alone; a K|V chunk holds two */
    ring_link kv_link, dkv_link;
};

/* ------------------------------------------------------------ views */

static fa_rows_view packed_view(fa_buffer buf, fa_dtype dtype, int64_t first_row, int64_t rows, int heads, int d,
                                int64_t base) {
    fa_rows_view v = {buf->impl, dtype, base + first_row * heads * d, rows * heads * d, (int64_t)heads * d, d};
    return v;
}

/* A log-sum-exp [outer, heads, rows] from row first_row on. */
static fa_rows_view lse_view(fa_buffer buf, int64_t first_row, int64_t rows, int heads) {
    fa_rows_view v = {buf->impl, FA_DTYPE_F32, first_row, heads * rows, 1, rows};
    return v;
}

/* A caller's tensor of the local descriptor. */
static fa_rows_view user_view(const struct fa_dist_plan_s *p, fa_buffer buf, fa_tensor_role role) {
    const fa_layout l = fa_desc_layout(&p->local, role);
    fa_rows_view v = {buf->impl, l.dtype, l.offset, l.stride_batch, l.stride_seq, l.stride_head};
    return v;
}

static fa_rows_shape shape_of(int outer, int64_t rows, int heads, int dim) {
    fa_rows_shape s = {outer, (int)rows, heads, dim};
    return s;
}

static fa_status rows_op(const struct fa_dist_plan_s *p, fa_rows_op op, fa_rows_shape shape, fa_rows_view dst,
                         const fa_rows_view *src, float value) {
    return p->ctx->ops->rows(p->ctx->impl, op, &shape, &dst, src, value);
}

/* ------------------------------------------------------------ transfers */

/* The library's words for a failed transport call, then the transport's
 * own (fa_set_last_error), where it left any. */
static fa_status transport_failed(fa_status st, const char *fmt, ...) FA_PRINTF(2, 3);
static fa_status transport_failed(fa_status st, const char *fmt, ...) {
    char why[512], head[256];
    snprintf(why, sizeof why, "%s", fa_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    return fa_fail(st, "%s%s%s", head, why[0] ? ": " : "", why);
}

static fa_status link_start(struct fa_dist_plan_s *p, ring_link *l, fa_buffer send, int send_slot, int host_current,
                            fa_buffer recv, int recv_slot, size_t bytes) {
    const fa_transport *t = &p->comm->t;
    const int to = (p->rank + 1) % p->world, from = (p->rank + p->world - 1) % p->world;
    void *queue = NULL, *src, *dst;
    if (t->device_memory) {
        FA_CHECK(fa_context_get_native(p->ctx, NULL, &queue));
        FA_CHECK(fa_buffer_get_native(send, &src));
        FA_CHECK(fa_buffer_get_native(recv, &dst));
    } else {
        if (!host_current) FA_CHECK(fa_buffer_download(send, 0, l->host[send_slot], bytes));
        src = l->host[send_slot];
        dst = l->host[recv_slot];
    }
    fa_clear_error();
    fa_status st = t->start(t->impl, queue, src, bytes, to, dst, bytes, from, &l->pending);
    if (st != FA_SUCCESS)
        return transport_failed(st, "ring transfer to rank %d and from rank %d (%zu bytes) did not start", to, from,
                                bytes);
    l->active = 1;
    return FA_SUCCESS;
}

static fa_status link_wait(struct fa_dist_plan_s *p, ring_link *l, fa_buffer recv, int recv_slot, size_t bytes) {
    const fa_transport *t = &p->comm->t;
    void *queue = NULL;
    if (!l->active) return FA_SUCCESS;
    l->active = 0;
    if (t->device_memory) FA_CHECK(fa_context_get_native(p->ctx, NULL, &queue));
    fa_clear_error();
    fa_status st = t->wait(t->impl, queue, l->pending);
    if (st != FA_SUCCESS) return transport_failed(st, "ring transfer of %zu bytes did not complete", bytes);
    if (!t->device_memory) FA_CHECK(fa_buffer_upload(recv, 0, l->host[recv_slot], bytes));
    return FA_SUCCESS;
}

/* ------------------------------------------------------------ agreement */

/* Every rank learns whether any failed: the one that did keeps its own
 * message, the others name it. */
static fa_status agree_status(fa_comm comm, fa_status mine, const char *what) {
    int64_t v[2] = {mine, mine != FA_SUCCESS ? comm->t.rank + 1 : 0};
    char message[512];
    snprintf(message, sizeof message, "%s", mine != FA_SUCCESS ? fa_last_error() : "");
    fa_status st = fa_comm_agree(comm, v, 2);
    if (st != FA_SUCCESS) return st;
    if (mine != FA_SUCCESS) return fa_fail(mine, "%s", message);
    if (v[0] != FA_SUCCESS)
        return fa_fail((fa_status)v[0], "%s: rank %lld failed (%s); see its message", what, (long long)(v[1] - 1),
                       fa_status_string((fa_status)v[0]));
    return FA_SUCCESS;
}

static uint64_t fnv(uint64_t h, const void *data, size_t bytes) {
    const unsigned char *c = data;
    for (size_t i = 0; i < bytes; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

/* What every rank must agree on: the whole problem, the layout and the
 * world (not the local tensor layouts, which are each rank's own). */
static uint64_t problem_hash(const fa_attention_desc *d, fa_cp_layout layout, int world) {
    uint64_t h = 1469598103934665603ull;
    const int ints[] = {d->batch,        d->seqlen_q,    d->seqlen_k,     d->heads_q, d->heads_kv,
                        d->head_dim,     (int)d->q.dtype, d->causal,      d->window_left,
                        d->window_right, d->block_q,     d->block_k,      (int)d->algorithm,
                        d->deterministic, d->allow_tf32,  (int)layout,     world,
                        d->block_mask != NULL, d->cu_seqlens_q != NULL};
    h = fnv(h, ints, sizeof ints);
    h = fnv(h, &d->softmax_scale, sizeof d->softmax_scale);
    h = fnv(h, &d->dropout_p, sizeof d->dropout_p);
    if (d->dropout_p > 0.0f) {
        /* Ranks with different seeds would draw a mask no device draws. */
        h = fnv(h, &d->dropout_seed, sizeof d->dropout_seed);
        h = fnv(h, &d->dropout_offset, sizeof d->dropout_offset);
    }
    if (d->block_mask) h = fnv(h, d->block_mask, d->block_mask_bytes);
    if (d->cu_seqlens_q) {
        h = fnv(h, d->cu_seqlens_q, sizeof(int32_t) * (size_t)(d->batch + 1));
        h = fnv(h, d->cu_seqlens_k, sizeof(int32_t) * (size_t)(d->batch + 1));
    }
    return h;
}

static fa_status agree_problem(struct fa_dist_plan_s *p, fa_status mine) {
    FA_CHECK(agree_status(p->comm, mine, "distributed plan"));
    const int64_t h = (int64_t)(problem_hash(&p->whole, p->layout, p->world) >> 2);
    int64_t v[2] = {h, -h};
    FA_CHECK(fa_comm_agree(p->comm, v, 2));
    if (v[0] != h || v[1] != -h)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "distributed plan: the ranks disagree on the problem (shape, dtype, masks, scale, options, "
                       "dropout seed, variable-length offsets, layout or world size differ between ranks)");
    return FA_SUCCESS;
}

/* ------------------------------------------------------------ creation */

static fa_status unsupported_options(const fa_attention_desc *d) {
    if (fa_desc_is_fp8(d))
        return fa_fail(FA_ERR_UNSUPPORTED, "distributed plan: q.dtype = %s is not supported (forward on one device only)",
                       fa_dtype_name(d->q.dtype));
    if (d->kv_cache)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "distributed plan: kv_cache: a KV-cache step runs on one device (fa_plan_create)");
    if (d->dropout_p > 0.0f && d->cu_seqlens_q)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "distributed plan: dropout with variable-length batches is not supported (a piece's rows "
                       "start at a different position in each sequence, and a plan takes one dropout origin)");
    const char *option = fa_desc_option_in_use(d);
    if (option) return fa_fail(FA_ERR_UNSUPPORTED, "distributed plan: %s is not supported", option);
    if (d->cu_seqlens_q) {
        if (fa_desc_has_window(d))
            return fa_fail(FA_ERR_UNSUPPORTED, "distributed plan: sliding windows with variable-length batches are "
                                               "not supported yet");
        if (d->block_mask)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "distributed plan: block masks with variable-length batches are not supported yet");
        if (d->causal && memcmp(d->cu_seqlens_q, d->cu_seqlens_k, sizeof(int32_t) * (size_t)(d->batch + 1)) != 0)
            return fa_fail(FA_ERR_UNSUPPORTED, "distributed plan: a causal mask with variable-length batches needs "
                                               "cu_seqlens_q equal to cu_seqlens_k");
    }
    return FA_SUCCESS;
}

static fa_status copy_arrays(struct fa_dist_plan_s *p, const fa_attention_desc *d) {
    p->whole = *d;
    if (d->block_mask) {
        p->block_mask = malloc(d->block_mask_bytes);
        if (!p->block_mask) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot copy the block mask");
        memcpy(p->block_mask, d->block_mask, d->block_mask_bytes);
        p->whole.block_mask = p->block_mask;
    }
    if (d->cu_seqlens_q) {
        const size_t bytes = sizeof(int32_t) * (size_t)(d->batch + 1);
        p->cu_q = malloc(bytes);
        p->cu_k = malloc(bytes);
        if (!p->cu_q || !p->cu_k) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot copy the sequence offsets");
        memcpy(p->cu_q, d->cu_seqlens_q, bytes);
        memcpy(p->cu_k, d->cu_seqlens_k, bytes);
        p->whole.cu_seqlens_q = p->cu_q;
        p->whole.cu_seqlens_k = p->cu_k;
    }
    return FA_SUCCESS;
}

/* The rank's tensors as a problem of their own: the local token counts, no
 * masks; its check is the layout check of the caller's tensors. */
static fa_status local_problem(struct fa_dist_plan_s *p) {
    const fa_attention_desc *d = &p->whole;
    const int varlen = d->cu_seqlens_q != NULL;
    const int64_t nq = varlen ? d->cu_seqlens_q[d->batch] : d->seqlen_q;
    const int64_t nk = varlen ? d->cu_seqlens_k[d->batch] : d->seqlen_k;
    int64_t start, len, local;
    FA_CHECK(fa_cp_part(p->layout, nq, p->world, p->rank, 0, &start, &len, &local));
    FA_CHECK(fa_cp_part(p->layout, nk, p->world, p->rank, 0, &start, &len, &local));
    p->lq = nq / p->world;
    p->lk = nk / p->world;
    p->outer = varlen ? 1 : d->batch;
    p->hq = d->heads_q;
    p->hk = d->heads_kv;
    p->d = d->head_dim;
    p->dtype = d->q.dtype;
    fa_attention_desc l = *d;
    l.seqlen_q = (int)p->lq;
    l.seqlen_k = (int)p->lk;
    l.causal = 0;
    l.window_left = l.window_right = -1;
    l.block_mask = NULL;
    l.block_mask_bytes = 0;
    l.cu_seqlens_q = l.cu_seqlens_k = NULL;
    if (varlen) l.batch = 1;
    FA_CHECK(fa_attention_desc_check(&l));
    p->local = l;
    return FA_SUCCESS;
}

/* A piece's plan draws dropout four keys a Philox call from its first key
 * on, which must therefore lie at a multiple of 4 in the whole sequence:
 * the pieces start their keys at such positions within a chunk, and every
 * chunk must start at one. */
static fa_status dropout_chunks(const struct fa_dist_plan_s *p) {
    const fa_attention_desc *d = &p->whole;
    if (!(d->dropout_p > 0.0f)) return FA_SUCCESS;
    const int parts = p->layout == FA_CP_ZIGZAG ? 2 : 1;
    for (int r = 0; r < p->world; r++)
        for (int part = 0; part < parts; part++) {
            int64_t start, len, local;
            FA_CHECK(fa_cp_part(p->layout, d->seqlen_k, p->world, r, part, &start, &len, &local));
            if (start % 4 != 0)
                return fa_fail(FA_ERR_UNSUPPORTED,
                               "distributed plan: dropout needs every chunk of keys to start at a multiple of 4 "
                               "tokens (its mask is drawn four keys at a time); seqlen_k = %d over %d ranks (%s "
                               "layout) gives chunks of %lld",
                               d->seqlen_k, p->world, p->layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous",
                               (long long)len);
        }
    return FA_SUCCESS;
}

static fa_status alloc(fa_context ctx, size_t elems, size_t elem_bytes, fa_buffer *buf) {
    size_t bytes;
    if (fa_ckd_mul_size(&bytes, elems, elem_bytes))
        return fa_fail(FA_ERR_INVALID_SIZE, "ring buffer of %zu elements does not fit in memory", elems);
    return fa_buffer_alloc(ctx, bytes ? bytes : 1, buf);
}

/* A piece's tensors are offsets into the packed buffers: Q, O, dO, dQ rows
 * of the rank's queries; K and V rows of the visiting chunk (V after K). */
static void piece_layouts(const struct fa_dist_plan_s *p, fa_dist_piece *pc) {
    fa_attention_desc *d = &pc->desc;
    const fa_tensor_desc q = {p->dtype, pc->row0 * p->hq * p->d, p->lq * p->hq * p->d, (int64_t)p->hq * p->d, p->d};
    fa_tensor_desc k = {p->dtype, pc->key0 * p->hk * p->d, p->lk * p->hk * p->d, (int64_t)p->hk * p->d, p->d};
    d->q = q;
    d->o = q;
    d->k = k;
    k.offset += (int64_t)p->kv_elems;
    d->v = k;
}

static fa_status make_steps(struct fa_dist_plan_s *p) {
    p->steps = calloc((size_t)p->world, sizeof *p->steps);
    if (!p->steps) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate the ring's steps");
    for (int t = 0; t < p->world; t++) {
        dist_step *st = &p->steps[t];
        st->source = (p->rank - t + p->world) % p->world;
        FA_CHECK(fa_dist_split(&p->whole, p->layout, p->world, p->rank, st->source, &st->pieces, &st->count));
        if (!st->count) continue;
        st->plans = calloc((size_t)st->count, sizeof *st->plans);
        if (!st->plans) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate the ring's plans");
        for (int i = 0; i < st->count; i++) {
            piece_layouts(p, &st->pieces[i]);
            FA_CHECK(fa_plan_create(p->ctx, &st->pieces[i].desc, &st->plans[i]));
            if (p->whole.dropout_p > 0.0f)
                FA_CHECK(fa_plan_set_dropout_origin(st->plans[i], st->pieces[i].drop_row0, st->pieces[i].drop_col0));
        }
    }
    return FA_SUCCESS;
}

static fa_status alloc_host(ring_link *l, size_t bytes) {
    for (int i = 0; i < 2; i++) {
        l->host[i] = malloc(bytes ? bytes : 1);
        if (!l->host[i]) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host staging", bytes);
    }
    return FA_SUCCESS;
}

static fa_status forward_buffers(struct fa_dist_plan_s *p) {
    const size_t es = fa_dtype_size(p->dtype);
    FA_CHECK(alloc(p->ctx, p->q_elems, es, &p->qi));
    for (int i = 0; i < 2; i++) FA_CHECK(alloc(p->ctx, 2 * p->kv_elems, es, &p->kv[i]));
    FA_CHECK(alloc(p->ctx, p->q_elems, es, &p->ostep));
    FA_CHECK(alloc(p->ctx, (size_t)p->outer * (size_t)p->hq * (size_t)p->lq, 4, &p->lstep));
    FA_CHECK(alloc(p->ctx, p->q_elems, 4, &p->acc_o));
    FA_CHECK(alloc(p->ctx, (size_t)p->outer * (size_t)p->hq * (size_t)p->lq, 4, &p->acc_l));
    if (!p->comm->t.device_memory && p->world > 1) FA_CHECK(alloc_host(&p->kv_link, 2 * p->kv_elems * es));
    return FA_SUCCESS;
}

static fa_status backward_buffers(struct fa_dist_plan_s *p) {
    if (p->dkv[1]) return FA_SUCCESS;
    const size_t es = fa_dtype_size(p->dtype);
    FA_CHECK(alloc(p->ctx, p->q_elems, es, &p->oi));
    FA_CHECK(alloc(p->ctx, p->q_elems, es, &p->doi));
    FA_CHECK(alloc(p->ctx, p->q_elems, es, &p->dqstep));
    FA_CHECK(alloc(p->ctx, 2 * p->kv_elems, es, &p->dkvstep));
    FA_CHECK(alloc(p->ctx, p->q_elems, 4, &p->dq_acc));
    if (!p->comm->t.device_memory && p->world > 1) FA_CHECK(alloc_host(&p->dkv_link, 2 * p->kv_elems * 4));
    FA_CHECK(alloc(p->ctx, 2 * p->kv_elems, 4, &p->dkv[0]));
    FA_CHECK(alloc(p->ctx, 2 * p->kv_elems, 4, &p->dkv[1]));
    return FA_SUCCESS;
}

/* The whole problem's check: its sizes, masks and options. Its layouts
 * are the rank's tensors', checked against the local sizes
 * (local_problem), never against the whole sequence's: explicit strides of
 * a rank's packed tensors with batch > 1 would overlap there. */
static fa_status check_whole(const fa_attention_desc *desc) {
    fa_attention_desc whole = *desc;
    fa_tensor_desc *layouts[] = {&whole.q, &whole.k, &whole.v, &whole.o};
    for (size_t i = 0; i < FA_ARRAY_SIZE(layouts); i++) {
        const fa_tensor_desc packed = {layouts[i]->dtype, 0, 0, 0, 0};
        *layouts[i] = packed;
    }
    return fa_attention_desc_check(&whole);
}

static fa_status create_local(struct fa_dist_plan_s *p, const fa_attention_desc *desc) {
    FA_CHECK(check_whole(desc));
    FA_CHECK(copy_arrays(p, desc));
    FA_CHECK(unsupported_options(&p->whole));
    if (!p->ctx->ops->rows || !p->ctx->ops->rows_merge)
        return fa_fail(FA_ERR_UNSUPPORTED, "distributed plan: the %s backend has no ring passes yet",
                       p->ctx->ops->name);
    if (p->comm->t.device_memory && p->ctx->info.backend != FA_BACKEND_CUDA && p->ctx->info.backend != FA_BACKEND_HIP)
        return fa_fail(FA_ERR_UNSUPPORTED, "distributed plan: a transport of device memory needs a CUDA or HIP "
                                           "context (this one is %s)", p->ctx->ops->name);
    FA_CHECK(local_problem(p));
    return dropout_chunks(p);
}

fa_status fa_dist_plan_create(fa_context ctx, fa_comm comm, const fa_attention_desc *desc, fa_cp_layout layout,
                              fa_dist_plan *plan) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    *plan = NULL;
    if (!comm) return fa_fail(FA_ERR_NULL_POINTER, "comm is NULL");
    struct fa_dist_plan_s *p = calloc(1, sizeof *p);
    fa_status mine = FA_SUCCESS;
    if (!p) {
        /* Still take part in the agreement, so that no rank waits. */
        fa_status st = fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate a distributed plan");
        return agree_status(comm, st, "distributed plan");
    }
    p->ctx = ctx;
    p->comm = comm;
    p->layout = layout;
    p->rank = comm->t.rank;
    p->world = comm->t.world;
    if (!ctx)
        mine = fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    else if (!desc)
        mine = fa_fail(FA_ERR_NULL_POINTER, "desc is NULL");
    else if (layout != FA_CP_CONTIGUOUS && layout != FA_CP_ZIGZAG)
        mine = fa_fail(FA_ERR_INVALID_ARGUMENT, "layout = %d is not a fa_cp_layout", (int)layout);
    else
        mine = create_local(p, desc);
    fa_status st = agree_problem(p, mine);
    if (st == FA_SUCCESS) {
        p->q_elems = (size_t)p->outer * (size_t)p->lq * (size_t)p->hq * (size_t)p->d;
        p->kv_elems = (size_t)p->outer * (size_t)p->lk * (size_t)p->hk * (size_t)p->d;
        mine = make_steps(p);
        if (mine == FA_SUCCESS) mine = forward_buffers(p);
        st = agree_status(comm, mine, "distributed plan");
    }
    if (st != FA_SUCCESS) {
        fa_dist_plan_destroy(p);
        return st;
    }
    *plan = p;
    return FA_SUCCESS;
}

static void buffer_free(fa_buffer *b) {
    if (*b) fa_buffer_free(*b);
    *b = NULL;
}

fa_status fa_dist_plan_set_dropout_seed(fa_dist_plan p, uint64_t seed, uint64_t offset) {
    if (!p) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    if (!(p->whole.dropout_p > 0.0f))
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "seed: the plan's descriptor has dropout_p = 0, so there is no dropout mask to seed");
    for (int t = 0; t < p->world; t++)
        for (int i = 0; i < p->steps[t].count; i++)
            FA_CHECK(fa_plan_set_dropout_seed(p->steps[t].plans[i], seed, offset));
    p->whole.dropout_seed = seed;
    p->whole.dropout_offset = offset;
    return FA_SUCCESS;
}

fa_status fa_dist_plan_destroy(fa_dist_plan p) {
    if (!p) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    if (p->steps)
        for (int t = 0; t < p->world; t++) {
            for (int i = 0; i < p->steps[t].count; i++)
                if (p->steps[t].plans && p->steps[t].plans[i]) fa_plan_destroy(p->steps[t].plans[i]);
            free(p->steps[t].plans);
            fa_dist_pieces_free(p->steps[t].pieces, p->steps[t].count);
        }
    free(p->steps);
    fa_buffer *bufs[] = {&p->qi, &p->kv[0], &p->kv[1], &p->ostep, &p->lstep, &p->acc_o, &p->acc_l, &p->oi,
                         &p->doi, &p->dqstep, &p->dkvstep, &p->dq_acc, &p->dkv[0], &p->dkv[1]};
    for (size_t i = 0; i < FA_ARRAY_SIZE(bufs); i++) buffer_free(bufs[i]);
    for (int i = 0; i < 2; i++) {
        free(p->kv_link.host[i]);
        free(p->dkv_link.host[i]);
    }
    free(p->block_mask);
    free(p->cu_q);
    free(p->cu_k);
    free(p);
    return FA_SUCCESS;
}

/* ------------------------------------------------------------ passes */

/* The first failure of a pass, kept while the ring goes on: a rank that
 * stopped would leave its neighbours waiting. */
typedef struct pass_error {
    fa_status status;
    char message[512];
} pass_error;

static void note(pass_error *e, fa_status st) {
    if (st == FA_SUCCESS || e->status != FA_SUCCESS) return;
    e->status = st;
    snprintf(e->message, sizeof e->message, "%s", fa_last_error());
}

static fa_status pass_end(struct fa_dist_plan_s *p, pass_error *e, const char *what) {
    if (e->status != FA_SUCCESS) fa_fail(e->status, "%s", e->message);
    return agree_status(p->comm, e->status, what);
}

static fa_status pack_kv(struct fa_dist_plan_s *p, fa_buffer dst, fa_buffer k, fa_buffer v) {
    const fa_rows_shape sh = shape_of(p->outer, p->lk, p->hk, p->d);
    fa_rows_view src = user_view(p, k, FA_TENSOR_K);
    FA_CHECK(rows_op(p, FA_ROWS_COPY, sh, packed_view(dst, p->dtype, 0, p->lk, p->hk, p->d, 0), &src, 0));
    src = user_view(p, v, FA_TENSOR_V);
    return rows_op(p, FA_ROWS_COPY, sh, packed_view(dst, p->dtype, 0, p->lk, p->hk, p->d, (int64_t)p->kv_elems),
                   &src, 0);
}

static fa_status pack_q(struct fa_dist_plan_s *p, fa_buffer dst, fa_buffer user, fa_tensor_role role) {
    const fa_rows_view src = user_view(p, user, role);
    return rows_op(p, FA_ROWS_COPY, shape_of(p->outer, p->lq, p->hq, p->d),
                   packed_view(dst, p->dtype, 0, p->lq, p->hq, p->d, 0), &src, 0);
}

static fa_status forward_piece(struct fa_dist_plan_s *p, const fa_dist_piece *pc, fa_plan plan, fa_buffer kv) {
    FA_CHECK(fa_forward(plan, p->qi, kv, kv, p->ostep, p->lstep));
    const fa_rows_shape sh = shape_of(p->outer, pc->nrows, p->hq, p->d);
    const fa_rows_view acc_o = packed_view(p->acc_o, FA_DTYPE_F32, pc->row0, p->lq, p->hq, p->d, 0);
    const fa_rows_view part_o = packed_view(p->ostep, p->dtype, pc->row0, p->lq, p->hq, p->d, 0);
    const fa_rows_view acc_l = lse_view(p->acc_l, pc->row0, p->lq, p->hq);
    const fa_rows_view part_l = lse_view(p->lstep, 0, pc->nrows, p->hq);
    return p->ctx->ops->rows_merge(p->ctx->impl, &sh, &acc_o, &acc_l, &part_o, &part_l);
}

static fa_status forward_begin(struct fa_dist_plan_s *p, fa_buffer q, fa_buffer k, fa_buffer v) {
    FA_CHECK(pack_q(p, p->qi, q, FA_TENSOR_Q));
    FA_CHECK(pack_kv(p, p->kv[0], k, v));
    FA_CHECK(rows_op(p, FA_ROWS_FILL, shape_of(p->outer, p->lq, p->hq, p->d),
                     packed_view(p->acc_o, FA_DTYPE_F32, 0, p->lq, p->hq, p->d, 0), NULL, 0.0f));
    return rows_op(p, FA_ROWS_FILL, shape_of(p->outer, p->lq, p->hq, 1), lse_view(p->acc_l, 0, p->lq, p->hq), NULL,
                   -INFINITY);
}

static fa_status forward_end(struct fa_dist_plan_s *p, fa_buffer o, fa_buffer lse) {
    fa_rows_view src = packed_view(p->acc_o, FA_DTYPE_F32, 0, p->lq, p->hq, p->d, 0);
    FA_CHECK(rows_op(p, FA_ROWS_COPY, shape_of(p->outer, p->lq, p->hq, p->d), user_view(p, o, FA_TENSOR_O), &src, 0));
    src = lse_view(p->acc_l, 0, p->lq, p->hq);
    return rows_op(p, FA_ROWS_COPY, shape_of(p->outer, p->lq, p->hq, 1), lse_view(lse, 0, p->lq, p->hq), &src, 0);
}

fa_status fa_dist_forward(fa_dist_plan p, fa_buffer q, fa_buffer k, fa_buffer v, fa_buffer o, fa_buffer lse) {
    if (!p) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    FA_CHECK(agree_status(p->comm, fa_check_forward_args(p->ctx, &p->local, q, k, v, o, lse), "fa_dist_forward"));
    pass_error e = {FA_SUCCESS, ""};
    const size_t bytes = 2 * p->kv_elems * fa_dtype_size(p->dtype);
    note(&e, forward_begin(p, q, k, v));
    int cur = 0;
    for (int t = 0; t < p->world; t++) {
        const int more = t + 1 < p->world;
        if (more) note(&e, link_start(p, &p->kv_link, p->kv[cur], cur, t > 0, p->kv[1 - cur], 1 - cur, bytes));
        const dist_step *st = &p->steps[t];
        for (int i = 0; i < st->count && e.status == FA_SUCCESS; i++)
            note(&e, forward_piece(p, &st->pieces[i], st->plans[i], p->kv[cur]));
        if (more) {
            note(&e, link_wait(p, &p->kv_link, p->kv[1 - cur], 1 - cur, bytes));
            cur = 1 - cur;
        }
    }
    if (e.status == FA_SUCCESS) note(&e, forward_end(p, o, lse));
    return pass_end(p, &e, "fa_dist_forward");
}

static fa_status backward_piece(struct fa_dist_plan_s *p, const fa_dist_piece *pc, fa_plan plan, fa_buffer kv,
                                fa_buffer lse, fa_buffer dkv) {
    /* The piece's rows of L, packed as its plan reads them. */
    const fa_rows_view l_rows = lse_view(lse, pc->row0, p->lq, p->hq);
    FA_CHECK(rows_op(p, FA_ROWS_COPY, shape_of(p->outer, pc->nrows, p->hq, 1), lse_view(p->lstep, 0, pc->nrows, p->hq),
                     &l_rows, 0));
    FA_CHECK(fa_backward(plan, p->qi, kv, kv, p->oi, p->lstep, p->doi, p->dqstep, p->dkvstep, p->dkvstep));
    const fa_rows_view dq = packed_view(p->dqstep, p->dtype, pc->row0, p->lq, p->hq, p->d, 0);
    FA_CHECK(rows_op(p, FA_ROWS_ADD, shape_of(p->outer, pc->nrows, p->hq, p->d),
                     packed_view(p->dq_acc, FA_DTYPE_F32, pc->row0, p->lq, p->hq, p->d, 0), &dq, 0));
    const fa_rows_shape sh = shape_of(p->outer, pc->nkeys, p->hk, p->d);
    for (int half = 0; half < 2; half++) {
        const int64_t base = half ? (int64_t)p->kv_elems : 0;
        const fa_rows_view part = packed_view(p->dkvstep, p->dtype, pc->key0, p->lk, p->hk, p->d, base);
        FA_CHECK(rows_op(p, FA_ROWS_ADD, sh, packed_view(dkv, FA_DTYPE_F32, pc->key0, p->lk, p->hk, p->d, base),
                         &part, 0));
    }
    return FA_SUCCESS;
}

static fa_status backward_begin(struct fa_dist_plan_s *p, fa_buffer q, fa_buffer k, fa_buffer v, fa_buffer o,
                                fa_buffer dout) {
    FA_CHECK(backward_buffers(p));
    FA_CHECK(pack_q(p, p->qi, q, FA_TENSOR_Q));
    FA_CHECK(pack_q(p, p->oi, o, FA_TENSOR_O));
    FA_CHECK(pack_q(p, p->doi, dout, FA_TENSOR_O));
    FA_CHECK(pack_kv(p, p->kv[0], k, v));
    FA_CHECK(rows_op(p, FA_ROWS_FILL, shape_of(p->outer, p->lq, p->hq, p->d),
                     packed_view(p->dq_acc, FA_DTYPE_F32, 0, p->lq, p->hq, p->d, 0), NULL, 0.0f));
    return rows_op(p, FA_ROWS_FILL, shape_of(p->outer, 2 * p->lk, p->hk, p->d),
                   packed_view(p->dkv[0], FA_DTYPE_F32, 0, 2 * p->lk, p->hk, p->d, 0), NULL, 0.0f);
}

static fa_status backward_end(struct fa_dist_plan_s *p, fa_buffer dkv, fa_buffer dq, fa_buffer dk, fa_buffer dv) {
    fa_rows_view src = packed_view(p->dq_acc, FA_DTYPE_F32, 0, p->lq, p->hq, p->d, 0);
    FA_CHECK(rows_op(p, FA_ROWS_COPY, shape_of(p->outer, p->lq, p->hq, p->d), user_view(p, dq, FA_TENSOR_Q), &src, 0));
    const fa_rows_shape sh = shape_of(p->outer, p->lk, p->hk, p->d);
    src = packed_view(dkv, FA_DTYPE_F32, 0, p->lk, p->hk, p->d, 0);
    FA_CHECK(rows_op(p, FA_ROWS_COPY, sh, user_view(p, dk, FA_TENSOR_K), &src, 0));
    src = packed_view(dkv, FA_DTYPE_F32, 0, p->lk, p->hk, p->d, (int64_t)p->kv_elems);
    return rows_op(p, FA_ROWS_COPY, sh, user_view(p, dv, FA_TENSOR_V), &src, 0);
}

fa_status fa_dist_backward(fa_dist_plan p, fa_buffer q, fa_buffer k, fa_buffer v, fa_buffer o, fa_buffer lse,
                           fa_buffer dout, fa_buffer dq, fa_buffer dk, fa_buffer dv) {
    if (!p) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    FA_CHECK(agree_status(p->comm, fa_check_backward_args(p->ctx, &p->local, q, k, v, o, lse, dout, dq, dk, dv),
                          "fa_dist_backward"));
    pass_error e = {FA_SUCCESS, ""};
    const size_t kv_bytes = 2 * p->kv_elems * fa_dtype_size(p->dtype), dkv_bytes = 2 * p->kv_elems * 4;
    /* A rank without its backward buffers could not even pass the others'
     * data on: all learn of it before anything is sent. */
    note(&e, backward_begin(p, q, k, v, o, dout));
    FA_CHECK(agree_status(p->comm, e.status, "fa_dist_backward"));
    int cur = 0, dcur = 0;
    for (int t = 0; t < p->world; t++) {
        const int more = t + 1 < p->world;
        if (more) note(&e, link_start(p, &p->kv_link, p->kv[cur], cur, t > 0, p->kv[1 - cur], 1 - cur, kv_bytes));
        /* dK|dV of this step's source arrive from the previous rank. */
        note(&e, link_wait(p, &p->dkv_link, p->dkv[dcur], dcur, dkv_bytes));
        const dist_step *st = &p->steps[t];
        for (int i = 0; i < st->count && e.status == FA_SUCCESS; i++)
            note(&e, backward_piece(p, &st->pieces[i], st->plans[i], p->kv[cur], lse, p->dkv[dcur]));
        if (p->world > 1) {
            note(&e, link_start(p, &p->dkv_link, p->dkv[dcur], dcur, 0, p->dkv[1 - dcur], 1 - dcur, dkv_bytes));
            dcur = 1 - dcur;
        }
        if (more) {
            note(&e, link_wait(p, &p->kv_link, p->kv[1 - cur], 1 - cur, kv_bytes));
            cur = 1 - cur;
        }
    }
    /* The last transfer brings this rank's own dK|dV home. */
    note(&e, link_wait(p, &p->dkv_link, p->dkv[dcur], dcur, dkv_bytes));
    if (e.status == FA_SUCCESS) note(&e, backward_end(p, p->dkv[dcur], dq, dk, dv));
    return pass_end(p, &e, "fa_dist_backward");
}

size_t fa_dist_plan_format(fa_dist_plan p, char *out, size_t out_size) {
    if (!p) return 0;
    size_t need = 0;
    char line[256];
#define APPEND(...)                                                                                \
    do {                                                                                           \
        int n_ = snprintf(line, sizeof line, __VA_ARGS__);                                         \
        if (n_ > 0) {                                                                              \
            if (out && need < out_size) snprintf(out + need, out_size - need, "%s", line);         \
            need += (size_t)n_;                                                                    \
        }                                                                                          \
    } while (0)
    const size_t es = fa_dtype_size(p->dtype);
    APPEND("ring attention: rank %d of %d, %s layout, %lld query and %lld key tokens a rank\n", p->rank, p->world,
           p->layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous", (long long)p->lq, (long long)p->lk);
    APPEND("  bytes a step: forward %zu (K, V), backward %zu (K, V) + %zu (dK, dV fp32); transport: %s memory\n",
           2 * p->kv_elems * es, 2 * p->kv_elems * es, 2 * p->kv_elems * 4,
           p->comm->t.device_memory ? "device" : "host (staged)");
    for (int t = 0; t < p->world; t++) {
        const dist_step *st = &p->steps[t];
        APPEND("  step %d: keys of rank %d, %d piece%s\n", t, st->source, st->count, st->count == 1 ? "" : "s");
        for (int i = 0; i < st->count; i++) {
            const fa_dist_piece *pc = &st->pieces[i];
            const fa_attention_desc *d = &pc->desc;
            APPEND("    rows [%lld, %lld) x keys [%lld, %lld)%s%s", (long long)pc->row0, (long long)(pc->row0 + pc->nrows),
                   (long long)pc->key0, (long long)(pc->key0 + pc->nkeys), d->causal ? " causal" : "",
                   d->block_mask ? " block-mask" : "");
            if (fa_desc_has_window(d)) APPEND(" window (%d, %d)", d->window_left, d->window_right);
            if (d->cu_seqlens_q) APPEND(" varlen");
            if (d->dropout_p > 0.0f)
                APPEND(" dropout from (%lld, %lld)", (long long)pc->drop_row0, (long long)pc->drop_col0);
            APPEND("\n");
        }
    }
#undef APPEND
    if (out && out_size) out[need < out_size ? need : out_size - 1] = '\0';
    return need;
}
