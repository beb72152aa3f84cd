#include "mpi_check.h"

#include "harness.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Tensors in the order the passes take them. */
enum { TQ, TK, TV, TDO, INPUTS };
enum { RO, RL, RDQ, RDK, RDV, RESULTS };
static const char *const result_name[RESULTS] = {"O", "L", "dQ", "dK", "dV"};

/* A tensor as the layouts cut it: [outer][n][token_bytes] whole, n / world
 * tokens a rank. */
typedef struct cut {
    int64_t outer, n;
    size_t token_bytes;
    fa_dtype dtype;
} cut;

static size_t whole_bytes(const cut *c) { return (size_t)c->outer * (size_t)c->n * c->token_bytes; }
static int64_t whole_elems(const cut *c) { return (int64_t)(whole_bytes(c) / fa_dtype_size(c->dtype)); }

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of host memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

double mpi_tolerance(fa_dtype dtype) {
    return dtype == FA_DTYPE_F32 ? 1e-5 : dtype == FA_DTYPE_F16 ? 2e-3 : 1.5e-2;
}

void mpi_problem_init(mpi_problem *p, const mpi_case *c, int world, int scale, uint64_t seed) {
    memset(p, 0, sizeof *p);
    fa_attention_desc *d = &p->desc;
    fa_attention_desc_init(d);
    d->batch = c->batch;
    d->seqlen_q = c->q_per_rank * scale * world;
    d->seqlen_k = c->k_per_rank * scale * world;
    d->heads_q = c->heads_q;
    d->heads_kv = c->heads_kv;
    d->head_dim = c->head_dim;
    d->q.dtype = d->k.dtype = d->v.dtype = d->o.dtype = c->dtype;
    d->causal = c->causal;
    d->dropout_p = c->dropout_p;
    d->dropout_seed = 2026;
    d->dropout_offset = 17;
    d->window_left = c->window_left;
    d->window_right = c->window_right;
    if (c->varlen) {
        static const int cycle[] = {5, 19, 12, 28, 3, 13};
        const int total = c->q_per_rank * scale * world;
        int seqs = 0, longest = 0;
        while (p->cu_seqlens[seqs] < total && seqs < MPI_CASE_MAX_SEQS) {
            int len = scale * cycle[seqs % (int)(sizeof cycle / sizeof cycle[0])];
            if (len > total - p->cu_seqlens[seqs] || seqs == MPI_CASE_MAX_SEQS - 1) len = total - p->cu_seqlens[seqs];
            p->cu_seqlens[seqs + 1] = p->cu_seqlens[seqs] + len;
            if (len > longest) longest = len;
            seqs++;
        }
        d->batch = seqs;
        d->seqlen_q = d->seqlen_k = longest;
        d->cu_seqlens_q = d->cu_seqlens_k = p->cu_seqlens;
    }
    if (c->block_q > 0) {
        const int rows = (d->seqlen_q + c->block_q - 1) / c->block_q;
        const int cols = (d->seqlen_k + c->block_k - 1) / c->block_k;
        p->block_mask = xmalloc((size_t)rows * (size_t)cols);
        fa_rng rng;
        fa_rng_seed(&rng, seed ^ 0x6d61736bu);
        /* Mostly visible, so that most rows see keys on several ranks. */
        for (int i = 0; i < rows * cols; i++) p->block_mask[i] = fa_rng_uniform(&rng, 0, 1) < 0.7;
        d->block_mask = p->block_mask;
        d->block_mask_bytes = (size_t)rows * (size_t)cols;
        d->block_q = c->block_q;
        d->block_k = c->block_k;
    }
}

void mpi_problem_free(mpi_problem *p) {
    free(p->block_mask);
    p->block_mask = NULL;
}

static cut input_cut(const fa_attention_desc *d, int tensor) {
    const int varlen = d->cu_seqlens_q != NULL, query = tensor == TQ || tensor == TDO;
    cut c;
    c.outer = varlen ? 1 : d->batch;
    c.n = varlen ? (query ? fa_attention_total_q(d) : fa_attention_total_k(d)) : (query ? d->seqlen_q : d->seqlen_k);
    c.dtype = d->q.dtype;
    c.token_bytes = (size_t)(query ? d->heads_q : d->heads_kv) * (size_t)d->head_dim * fa_dtype_size(c.dtype);
    return c;
}

static cut result_cut(const fa_attention_desc *d, int result) {
    if (result == RL) {
        const int varlen = d->cu_seqlens_q != NULL;
        cut c = {varlen ? d->heads_q : (int64_t)d->batch * d->heads_q,
                 varlen ? fa_attention_total_q(d) : d->seqlen_q, sizeof(float), FA_DTYPE_F32};
        return c;
    }
    return input_cut(d, result == RO || result == RDQ ? TQ : result == RDK ? TK : TV);
}

static fa_buffer buffer_with(fa_context ctx, const void *data, size_t bytes) {
    fa_buffer buf = NULL;
    CHECK_OK(fa_buffer_alloc(ctx, bytes ? bytes : 16, &buf));
    if (buf && data && bytes) CHECK_OK(fa_buffer_upload(buf, 0, data, bytes));
    return buf;
}

/* An output buffer full of NaN: an element the pass does not write shows. */
static fa_buffer poisoned_buffer(fa_context ctx, const cut *c, size_t bytes) {
    void *nan = xmalloc(bytes);
    fa_test_poison(nan, c->dtype, (int64_t)(bytes / fa_dtype_size(c->dtype)));
    fa_buffer buf = buffer_with(ctx, nan, bytes);
    free(nan);
    return buf;
}

static void *downloaded(fa_buffer buf, size_t bytes) {
    void *host = xmalloc(bytes);
    memset(host, 0xff, bytes); /* NaN in every dtype, should the download fail */
    if (buf) CHECK_OK(fa_buffer_download(buf, 0, host, bytes));
    return host;
}

/* fa_forward and fa_backward of the whole problem on one process. */
static void run_whole(fa_context ctx, const fa_attention_desc *d, void *const in[INPUTS], void *out[RESULTS]) {
    fa_buffer b_in[INPUTS], b_out[RESULTS];
    for (int t = 0; t < INPUTS; t++) {
        cut c = input_cut(d, t);
        b_in[t] = buffer_with(ctx, in[t], whole_bytes(&c));
    }
    for (int r = 0; r < RESULTS; r++) {
        cut c = result_cut(d, r);
        b_out[r] = poisoned_buffer(ctx, &c, whole_bytes(&c));
    }
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, d, &plan));
    if (plan) {
        CHECK_OK(fa_forward(plan, b_in[TQ], b_in[TK], b_in[TV], b_out[RO], b_out[RL]));
        CHECK_OK(fa_backward(plan, b_in[TQ], b_in[TK], b_in[TV], b_out[RO], b_out[RL], b_in[TDO], b_out[RDQ],
                             b_out[RDK], b_out[RDV]));
        CHECK_OK(fa_plan_destroy(plan));
    }
    for (int r = 0; r < RESULTS; r++) {
        cut c = result_cut(d, r);
        out[r] = downloaded(b_out[r], whole_bytes(&c));
        fa_buffer_free(b_out[r]);
    }
    for (int t = 0; t < INPUTS; t++) fa_buffer_free(b_in[t]);
}

/* This rank's part of every tensor through fa_dist_forward and
 * fa_dist_backward; the results stay local. */
static void run_dist(const mpi_env *env, const mpi_problem *p, fa_cp_layout layout, void *const in[INPUTS],
                     void *out[RESULTS]) {
    const fa_attention_desc *d = &p->desc;
    fa_buffer b_in[INPUTS], b_out[RESULTS];
    for (int t = 0; t < INPUTS; t++) {
        cut c = input_cut(d, t);
        const size_t bytes = whole_bytes(&c) / (size_t)env->world;
        void *local = xmalloc(bytes);
        CHECK_OK(fa_cp_scatter(layout, env->world, env->rank, c.outer, c.n, c.token_bytes, in[t], local));
        b_in[t] = buffer_with(env->ctx, local, bytes);
        free(local);
    }
    for (int r = 0; r < RESULTS; r++) {
        cut c = result_cut(d, r);
        b_out[r] = poisoned_buffer(env->ctx, &c, whole_bytes(&c) / (size_t)env->world);
    }
    fa_dist_plan plan = NULL;
    CHECK_OK(fa_dist_plan_create(env->ctx, env->comm, d, layout, &plan));
    if (plan) {
        CHECK_OK(fa_dist_forward(plan, b_in[TQ], b_in[TK], b_in[TV], b_out[RO], b_out[RL]));
        CHECK_OK(fa_dist_backward(plan, b_in[TQ], b_in[TK], b_in[TV], b_out[RO], b_out[RL], b_in[TDO], b_out[RDQ],
                                  b_out[RDK], b_out[RDV]));
        CHECK_OK(fa_dist_plan_destroy(plan));
    }
    for (int r = 0; r < RESULTS; r++) {
        cut c = result_cut(d, r);
        out[r] = downloaded(b_out[r], whole_bytes(&c) / (size_t)env->world);
        fa_buffer_free(b_out[r]);
    }
    for (int t = 0; t < INPUTS; t++) fa_buffer_free(b_in[t]);
}

/* The ranks' parts of one tensor, put together on rank 0 (NULL elsewhere). */
static void *gather_whole(const mpi_env *env, fa_cp_layout layout, const cut *c, const void *local) {
    const size_t local_bytes = whole_bytes(c) / (size_t)env->world;
    void *parts = env->rank == 0 ? xmalloc(local_bytes * (size_t)env->world) : NULL;
    CHECK(MPI_Gather(local, (int)local_bytes, MPI_BYTE, parts, (int)local_bytes, MPI_BYTE, 0, env->mpi) ==
          MPI_SUCCESS);
    if (env->rank != 0) return NULL;
    void *whole = xmalloc(whole_bytes(c));
    for (int r = 0; r < env->world; r++)
        CHECK_OK(fa_cp_gather(layout, env->world, r, c->outer, c->n, c->token_bytes, (char *)parts + (size_t)r * local_bytes,
                              whole));
    free(parts);
    return whole;
}

/* Relative Frobenius error over the finite entries; non-finite entries of
 * the reference (L = -inf of fully masked rows) must match exactly. */
static double compare(const mpi_case *c, int result, const void *got, const void *ref, const cut *cc) {
    fa_test_diff diff = fa_test_compare(got, ref, cc->dtype, whole_elems(cc));
    const double rel = diff.ref_norm > 0 ? diff.diff_norm / diff.ref_norm : diff.diff_norm;
    const double tol = mpi_tolerance(result == RL ? FA_DTYPE_F32 : c->dtype);
    CHECK_MSG(diff.mismatched == 0 && rel <= tol,
              "%s %s: relative error %.3g (tolerance %.3g), %lld entries non-finite where the other is not", c->name,
              result_name[result], rel, tol, (long long)diff.mismatched);
    return rel;
}

void mpi_check_case(const mpi_env *env, const mpi_case *c, uint64_t seed) {
    mpi_problem p;
    mpi_problem_init(&p, c, env->world, env->scale, seed);
    const fa_attention_desc *d = &p.desc;
    fa_rng rng;
    fa_rng_seed(&rng, seed);
    void *in[INPUTS];
    for (int t = 0; t < INPUTS; t++) {
        cut cc = input_cut(d, t);
        in[t] = fa_test_random_tensor(&rng, c->dtype, whole_elems(&cc));
    }

    void *ref[RESULTS] = {NULL}, *local[RESULTS] = {NULL}, *got[RESULTS] = {NULL};
    if (env->rank == 0) run_whole(env->ctx, d, in, ref);
    run_dist(env, &p, c->layout, in, local);
    for (int r = 0; r < RESULTS; r++) {
        cut cc = result_cut(d, r);
        got[r] = gather_whole(env, c->layout, &cc, local[r]);
    }
    if (env->rank == 0) {
        double err[RESULTS];
        for (int r = 0; r < RESULTS; r++) {
            cut cc = result_cut(d, r);
            err[r] = compare(c, r, got[r], ref[r], &cc);
        }
        printf("  %-28s %s  O %.1e  L %.1e  dQ %.1e  dK %.1e  dV %.1e\n", c->name,
               fa_dtype_name(c->dtype), err[RO], err[RL], err[RDQ], err[RDK], err[RDV]);
    }
    for (int r = 0; r < RESULTS; r++) {
        free(ref[r]);
        free(local[r]);
        free(got[r]);
    }
    for (int t = 0; t < INPUTS; t++) free(in[t]);
    mpi_problem_free(&p);
}
