/* The CPU reference: gradients against finite differences, softmax and mask
 * semantics, all-masked rows, GQA/MQA, variable-length batches, strided
 * layouts and the storage-dtype wrappers. */
#include "dtype.h"
#include "harness.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Output elements outside a layout start as this and must stay so. */
#define GAP_VALUE 1234.5
#define FD_STEP 1e-6
#define FD_TOLERANCE 1e-6

enum { TQ = 0, TK = 1, TV = 2, TO = 3 };
static const char *const role_name[4] = {"q", "k", "v", "o"};

static void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size);
    if (!p) {
        fprintf(stderr, "test: out of host memory\n");
        exit(1);
    }
    return p;
}

static double *new_doubles(int64_t n) { return xcalloc((size_t)n, sizeof(double)); }

/* ------------------------------------------------------------------------ */
/* The layout rules, restated here from the public header (the spec), so    */
/* that the library's indexing is checked rather than trusted.              */
/* ------------------------------------------------------------------------ */

static const fa_tensor_desc *role_desc(const fa_attention_desc *d, int role) {
    return role == TQ ? &d->q : role == TK ? &d->k : role == TV ? &d->v : &d->o;
}

static int role_is_query(int role) { return role == TQ || role == TO; }

static int role_heads(const fa_attention_desc *d, int role) {
    return role_is_query(role) ? d->heads_q : d->heads_kv;
}

static int spec_len(const fa_attention_desc *d, int is_query, int b) {
    const int32_t *cu = is_query ? d->cu_seqlens_q : d->cu_seqlens_k;
    if (cu) return cu[b + 1] - cu[b];
    return is_query ? d->seqlen_q : d->seqlen_k;
}

static int64_t spec_index(const fa_attention_desc *d, int role, int b, int t, int h, int x) {
    const fa_tensor_desc *td = role_desc(d, role);
    int is_query = role_is_query(role);
    int64_t heads = role_heads(d, role);
    int64_t sh = td->stride_head ? td->stride_head : d->head_dim;
    int64_t ss = td->stride_seq ? td->stride_seq : heads * d->head_dim;
    const int32_t *cu = is_query ? d->cu_seqlens_q : d->cu_seqlens_k;
    if (cu) return td->offset + ((int64_t)cu[b] + t) * ss + h * sh + x;
    int64_t seqlen = is_query ? d->seqlen_q : d->seqlen_k;
    int64_t sb = td->stride_batch ? td->stride_batch : seqlen * heads * d->head_dim;
    return td->offset + b * sb + t * ss + h * sh + x;
}

static int64_t spec_total_q(const fa_attention_desc *d) {
    return d->cu_seqlens_q ? d->cu_seqlens_q[d->batch] : (int64_t)d->batch * d->seqlen_q;
}

static int64_t spec_lse_index(const fa_attention_desc *d, int b, int h, int t) {
    if (d->cu_seqlens_q) return h * spec_total_q(d) + d->cu_seqlens_q[b] + t;
    return ((int64_t)b * d->heads_q + h) * d->seqlen_q + t;
}

static double spec_scale(const fa_attention_desc *d) {
    return d->softmax_scale != 0.0f ? (double)d->softmax_scale : 1.0 / sqrt((double)d->head_dim);
}

/* Which elements of a buffer a tensor covers. */
typedef struct tensor_map {
    int64_t span;
    uint8_t *covered;
} tensor_map;

static tensor_map map_make(const fa_attention_desc *d, int role) {
    tensor_map m = {0, NULL};
    int is_query = role_is_query(role), heads = role_heads(d, role);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) m.covered = xcalloc((size_t)m.span, 1);
        for (int b = 0; b < d->batch; b++)
            for (int t = 0; t < spec_len(d, is_query, b); t++)
                for (int h = 0; h < heads; h++)
                    for (int x = 0; x < d->head_dim; x++) {
                        int64_t idx = spec_index(d, role, b, t, h, x);
                        if (pass == 0 && idx + 1 > m.span) m.span = idx + 1;
                        if (pass == 1) m.covered[idx] = 1;
                    }
    }
    return m;
}

/* ------------------------------------------------------------------------ */
/* A problem in fp64                                                        */
/* ------------------------------------------------------------------------ */

typedef struct problem {
    fa_attention_desc desc;
    tensor_map map[4];
    int64_t nl;
    double *in[4];          /* q, k, v and dO (in o's layout) */
    double *o, *lse;
    double *grad[3];        /* dq, dk, dv */
    double *o_tmp, *lse_tmp;
} problem;

static void prob_init(problem *p, const fa_attention_desc *desc, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->desc = *desc;
    CHECK_OK(fa_attention_desc_check(desc));
    fa_rng rng;
    fa_rng_seed(&rng, seed);
    for (int r = 0; r < 4; r++) {
        p->map[r] = map_make(desc, r);
        p->in[r] = new_doubles(p->map[r].span);
        /* Gaps hold NaN: reading one would show up in every result. */
        for (int64_t i = 0; i < p->map[r].span; i++)
            p->in[r][i] = p->map[r].covered[i] ? fa_rng_normal(&rng) : NAN;
    }
    p->nl = spec_total_q(desc) * desc->heads_q;
    p->o = new_doubles(p->map[TO].span);
    p->o_tmp = new_doubles(p->map[TO].span);
    p->lse = new_doubles(p->nl);
    p->lse_tmp = new_doubles(p->nl);
    for (int r = 0; r < 3; r++) p->grad[r] = new_doubles(p->map[r].span);
}

static void prob_free(problem *p) {
    for (int r = 0; r < 4; r++) {
        free(p->map[r].covered);
        free(p->in[r]);
    }
    for (int r = 0; r < 3; r++) free(p->grad[r]);
    free(p->o);
    free(p->o_tmp);
    free(p->lse);
    free(p->lse_tmp);
}

static void poison_output(double *a, const tensor_map *m) {
    for (int64_t i = 0; i < m->span; i++) a[i] = m->covered[i] ? NAN : GAP_VALUE;
}

/* Elements covered but NaN, or gaps that were written. */
static int64_t bad_output(const double *a, const tensor_map *m) {
    int64_t bad = 0;
    for (int64_t i = 0; i < m->span; i++) bad += m->covered[i] ? isnan(a[i]) != 0 : a[i] != GAP_VALUE;
    return bad;
}

static void prob_forward(problem *p) {
    poison_output(p->o, &p->map[TO]);
    for (int64_t i = 0; i < p->nl; i++) p->lse[i] = NAN;
    fa_ref_forward_f64(&p->desc, p->in[TQ], p->in[TK], p->in[TV], p->o, p->lse);
    CHECK_MSG(bad_output(p->o, &p->map[TO]) == 0, "O has NaN or written gaps");
    int64_t nan_lse = 0;
    for (int64_t i = 0; i < p->nl; i++) nan_lse += isnan(p->lse[i]) != 0;
    CHECK_MSG(nan_lse == 0, "%lld entries of L are NaN or unwritten", (long long)nan_lse);
}

static void prob_backward(problem *p) {
    for (int r = 0; r < 3; r++) poison_output(p->grad[r], &p->map[r]);
    fa_ref_backward_f64(&p->desc, p->in[TQ], p->in[TK], p->in[TV], p->o, p->lse, p->in[TO],
                        p->grad[TQ], p->grad[TK], p->grad[TV]);
    for (int r = 0; r < 3; r++)
        CHECK_MSG(bad_output(p->grad[r], &p->map[r]) == 0, "d%s has NaN or written gaps", role_name[r]);
}

/* loss = sum(O * G) with G = the dO of the problem. */
static double prob_loss(void *ctx) {
    problem *p = ctx;
    fa_ref_forward_f64(&p->desc, p->in[TQ], p->in[TK], p->in[TV], p->o_tmp, p->lse_tmp);
    double loss = 0.0;
    for (int64_t i = 0; i < p->map[TO].span; i++)
        if (p->map[TO].covered[i]) loss += p->o_tmp[i] * p->in[TO][i];
    return loss;
}

static double fd_error(problem *p, int role) {
    return fa_test_fd_error(p->in[role], p->grad[role], p->map[role].span, p->map[role].covered, FD_STEP, prob_loss,
                            p);
}

static void check_gradients(problem *p) {
    prob_forward(p);
    prob_backward(p);
    for (int r = 0; r < 3; r++) {
        double err = fd_error(p, r);
        CHECK_MSG(err < FD_TOLERANCE, "d%s: relative error %.3g against finite differences", role_name[r],
                  err);
    }
}

/* Restates the forward semantics row by row from the forward's own L:
 * returns the largest |sum_j p_ij - 1| over rows with a visible key and the
 * largest |o_i - sum_j p_ij z_ij / (1 - p) v_j|, with the dropout bit from
 * the public fa_dropout_keep. Counts rows whose L is -inf exactly when no
 * key is visible, and rows that break that. */
typedef struct row_stats {
    double sum_err, o_err;
    int masked_rows, inconsistent_rows, rows;
} row_stats;

static row_stats check_rows(const problem *p) {
    const fa_attention_desc *d = &p->desc;
    row_stats st = {0, 0, 0, 0, 0};
    double scale = spec_scale(d);
    int group = d->heads_q / d->heads_kv;
    double keep_scale = 1.0 / (1.0 - (double)d->dropout_p);
    for (int b = 0; b < d->batch; b++) {
        int sq = spec_len(d, 1, b), sk = spec_len(d, 0, b);
        for (int h = 0; h < d->heads_q; h++)
            for (int i = 0; i < sq; i++) {
                st.rows++;
                double L = p->lse[spec_lse_index(d, b, h, i)];
                int visible = 0;
                for (int j = 0; j < sk; j++) visible += fa_ref_visible(d, sq, sk, i, j);
                if ((L == -INFINITY) != (visible == 0)) st.inconsistent_rows++;
                double sum = 0.0;
                for (int x = 0; x < d->head_dim; x++) {
                    double expect = 0.0;
                    for (int j = 0; j < sk && visible; j++) {
                        if (!fa_ref_visible(d, sq, sk, i, j)) continue;
                        double s = 0.0;
                        for (int y = 0; y < d->head_dim; y++)
                            s += p->in[TQ][spec_index(d, TQ, b, i, h, y)] *
                                 p->in[TK][spec_index(d, TK, b, j, h / group, y)];
                        double pij = exp(scale * s - L);
                        if (x == 0) sum += pij;
                        if (d->dropout_p > 0.0f) {
                            if (!fa_dropout_keep(d->dropout_seed, d->dropout_offset, d->dropout_p, b, h,
                                                 d->heads_q, i, j))
                                continue;
                            pij *= keep_scale;
                        }
                        expect += pij * p->in[TV][spec_index(d, TV, b, j, h / group, x)];
                    }
                    double got = p->o[spec_index(d, TO, b, i, h, x)];
                    if (!(fabs(got - expect) <= st.o_err)) st.o_err = fabs(got - expect);
                }
                if (visible) {
                    if (!(fabs(sum - 1.0) <= st.sum_err)) st.sum_err = fabs(sum - 1.0);
                } else {
                    st.masked_rows++;
                }
            }
    }
    return st;
}

static fa_attention_desc make_desc(int batch, int sq, int sk, int hq, int hkv, int d) {
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.batch = batch;
    desc.seqlen_q = sq;
    desc.seqlen_k = sk;
    desc.heads_q = hq;
    desc.heads_kv = hkv;
    desc.head_dim = d;
    return desc;
}

/* Every gradient case also checks the forward's own semantics. */
static void gradient_case(const fa_attention_desc *desc, uint64_t seed) {
    problem p;
    prob_init(&p, desc, seed);
    check_gradients(&p);
    row_stats st = check_rows(&p);
    CHECK_MSG(st.sum_err < 1e-12, "rows of P sum to 1 within %.3g", st.sum_err);
    CHECK_MSG(st.o_err < 1e-12, "O differs from sum_j p_ij v_j by %.3g", st.o_err);
    CHECK(st.inconsistent_rows == 0);
    prob_free(&p);
}

/* ------------------------------------------------------------------------ */
/* Gradients against finite differences                                     */
/* ------------------------------------------------------------------------ */

FA_TEST(grad_plain) {
    fa_attention_desc d = make_desc(2, 5, 7, 2, 2, 8);
    gradient_case(&d, 101);
}

FA_TEST(grad_causal_q_shorter) {
    fa_attention_desc d = make_desc(2, 5, 8, 2, 2, 8);
    d.causal = 1;
    gradient_case(&d, 102);
}

FA_TEST(grad_causal_q_longer) {
    /* seqlen_q > seqlen_k: the first rows see no key at all. */
    fa_attention_desc d = make_desc(2, 8, 5, 2, 2, 8);
    d.causal = 1;
    gradient_case(&d, 103);
}

FA_TEST(grad_sliding_window) {
    fa_attention_desc d = make_desc(2, 8, 8, 2, 2, 8);
    d.window_left = 2;
    d.window_right = 1;
    gradient_case(&d, 104);
    d.causal = 1;
    d.window_right = -1;
    d.seqlen_k = 10;
    gradient_case(&d, 105);
}

FA_TEST(grad_block_sparse) {
    fa_attention_desc d = make_desc(2, 7, 8, 2, 2, 8);
    /* ceil(7/2) x ceil(8/3) blocks; block row 2 sees nothing. */
    static const uint8_t mask[4 * 3] = {1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 0};
    d.block_mask = mask;
    d.block_mask_bytes = sizeof mask;
    d.block_q = 2;
    d.block_k = 3;
    gradient_case(&d, 106);
}

FA_TEST(grad_gqa) {
    fa_attention_desc d = make_desc(2, 5, 6, 4, 2, 8);
    d.causal = 1;
    gradient_case(&d, 107);
}

FA_TEST(grad_mqa) {
    fa_attention_desc d = make_desc(2, 5, 6, 3, 1, 8);
    gradient_case(&d, 108);
}

FA_TEST(grad_dropout) {
    fa_attention_desc d = make_desc(2, 6, 9, 4, 2, 8);
    d.dropout_p = 0.3f;
    d.dropout_seed = 0x1234abcd5678ull;
    d.dropout_offset = 0x100000007ull;
    problem p;
    prob_init(&p, &d, 109);
    check_gradients(&p);
    row_stats st = check_rows(&p);
    CHECK_MSG(st.sum_err < 1e-12, "rows of the undropped P sum to 1 within %.3g", st.sum_err);
    CHECK_MSG(st.o_err < 1e-12, "O differs from the fa_dropout_keep mask by %.3g", st.o_err);

    /* L comes from the undropped softmax; O is really changed by dropout. */
    problem plain;
    fa_attention_desc nd = d;
    nd.dropout_p = 0.0f;
    prob_init(&plain, &nd, 109);
    prob_forward(&plain);
    double lse_diff = 0.0, o_diff = 0.0;
    for (int64_t i = 0; i < p.nl; i++) lse_diff = fmax(lse_diff, fabs(p.lse[i] - plain.lse[i]));
    for (int64_t i = 0; i < p.map[TO].span; i++) o_diff = fmax(o_diff, fabs(p.o[i] - plain.o[i]));
    CHECK(lse_diff == 0.0);
    CHECK(o_diff > 0.1);
    prob_free(&plain);
    prob_free(&p);
}

FA_TEST(grad_varlen) {
    static const int32_t cu_q[4] = {0, 3, 8, 9};
    static const int32_t cu_k[4] = {0, 4, 6, 13};
    fa_attention_desc d = make_desc(3, 5, 7, 2, 1, 8);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.causal = 1;
    d.dropout_p = 0.2f;
    d.dropout_seed = 77;
    gradient_case(&d, 110);
}

/* Head-major [batch, heads, seq, dim] tensors, and one with padded strides. */
static void set_bhsd(fa_tensor_desc *t, int seqlen, int heads, int d) {
    t->stride_seq = d;
    t->stride_head = (int64_t)seqlen * d;
    t->stride_batch = (int64_t)heads * seqlen * d;
}

FA_TEST(grad_bhsd_strides) {
    fa_attention_desc d = make_desc(2, 5, 6, 4, 2, 8);
    set_bhsd(&d.q, 5, 4, 8);
    set_bhsd(&d.o, 5, 4, 8);
    set_bhsd(&d.k, 6, 2, 8);
    set_bhsd(&d.v, 6, 2, 8);
    d.causal = 1;
    gradient_case(&d, 111);
    /* Padded rows with an offset: gaps everywhere. */
    fa_attention_desc g = make_desc(2, 4, 5, 2, 2, 8);
    g.q.offset = 4;
    g.q.stride_seq = 2 * 8 + 4;
    g.q.stride_batch = 4 * 20 + 4;
    g.k.stride_head = 12;
    g.k.stride_seq = 28;
    g.k.stride_batch = 5 * 28 + 8;
    g.v.offset = 8;
    g.o.stride_batch = 4 * 16 + 4;
    gradient_case(&g, 112);
}

FA_TEST(grad_custom_scale) {
    fa_attention_desc d = make_desc(2, 5, 7, 2, 2, 8);
    d.softmax_scale = 0.61f;
    d.window_left = 3;
    gradient_case(&d, 113);
}

/* ------------------------------------------------------------------------ */
/* Semantics                                                                */
/* ------------------------------------------------------------------------ */

/* Visibility patterns written out by hand from the definitions in
 * flashattn.h: row i of each grid lists keys j as '1' visible, '0' masked. */
static int grid_matches(const fa_attention_desc *d, int sq, int sk, const char *const *rows) {
    int bad = 0;
    for (int i = 0; i < sq; i++)
        for (int j = 0; j < sk; j++) bad += fa_ref_visible(d, sq, sk, i, j) != (rows[i][j] == '1');
    return bad == 0;
}

FA_TEST(visibility_rules) {
    fa_attention_desc d = make_desc(1, 3, 5, 1, 1, 8);
    CHECK(grid_matches(&d, 3, 5, (const char *const[]){"11111", "11111", "11111"}));
    d.causal = 1; /* bottom-right aligned */
    CHECK(grid_matches(&d, 3, 5, (const char *const[]){"11100", "11110", "11111"}));
    d = make_desc(1, 5, 3, 1, 1, 8);
    d.causal = 1;
    CHECK(grid_matches(&d, 5, 3, (const char *const[]){"000", "000", "100", "110", "111"}));
    d = make_desc(1, 4, 4, 1, 1, 8);
    d.window_left = 1;
    d.window_right = 0;
    CHECK(grid_matches(&d, 4, 4, (const char *const[]){"1000", "1100", "0110", "0011"}));
    d.window_left = 2;
    d.window_right = -1;
    d.causal = 1;
    CHECK(grid_matches(&d, 4, 4, (const char *const[]){"1000", "1100", "1110", "0111"}));
    d = make_desc(1, 3, 5, 1, 1, 8);
    d.window_right = 1;
    CHECK(grid_matches(&d, 3, 5, (const char *const[]){"11110", "11111", "11111"}));
    d.window_right = -1;
    d.window_left = 0;
    CHECK(grid_matches(&d, 3, 5, (const char *const[]){"00111", "00011", "00001"}));
    /* Block-sparse, 2 x 2 blocks over 3 x 5: a 2 x 3 block grid. */
    static const uint8_t mask[6] = {1, 0, 1, 0, 1, 0};
    d = make_desc(1, 3, 5, 1, 1, 8);
    d.block_mask = mask;
    d.block_mask_bytes = 6;
    d.block_q = 2;
    d.block_k = 2;
    CHECK(grid_matches(&d, 3, 5, (const char *const[]){"11001", "11001", "00110"}));
    d.causal = 1; /* masks combine */
    CHECK(grid_matches(&d, 3, 5, (const char *const[]){"11000", "11000", "00110"}));
    /* A shorter sequence of a varlen batch indexes the mask by the longest
     * seqlen_k's block count. */
    d.causal = 0;
    CHECK(grid_matches(&d, 3, 3, (const char *const[]){"110", "110", "001"}));
}

/* Rows that see no key: O = 0, L = -inf, dQ = 0, no NaN anywhere. */
static void check_masked_rows(const fa_attention_desc *desc, uint64_t seed) {
    problem p;
    prob_init(&p, desc, seed);
    prob_forward(&p);
    prob_backward(&p);
    const fa_attention_desc *d = &p.desc;
    int masked = 0, open = 0, bad_o = 0, bad_dq = 0;
    for (int b = 0; b < d->batch; b++) {
        int sq = spec_len(d, 1, b), sk = spec_len(d, 0, b);
        for (int h = 0; h < d->heads_q; h++)
            for (int i = 0; i < sq; i++) {
                int visible = 0;
                for (int j = 0; j < sk; j++) visible += fa_ref_visible(d, sq, sk, i, j);
                double L = p.lse[spec_lse_index(d, b, h, i)];
                if (visible) {
                    open++;
                    CHECK(isfinite(L));
                    continue;
                }
                masked++;
                CHECK(L == -INFINITY);
                for (int x = 0; x < d->head_dim; x++) {
                    bad_o += p.o[spec_index(d, TO, b, i, h, x)] != 0.0;
                    bad_dq += p.grad[TQ][spec_index(d, TQ, b, i, h, x)] != 0.0;
                }
            }
    }
    CHECK_MSG(masked > 0 && open > 0, "%d masked and %d open rows", masked, open);
    CHECK(bad_o == 0);
    CHECK(bad_dq == 0);
    /* The gradients of the open rows are still right. */
    for (int r = 0; r < 3; r++) {
        double err = fd_error(&p, r);
        CHECK_MSG(err < FD_TOLERANCE, "d%s: relative error %.3g", role_name[r], err);
    }

    /* The same through the storage wrappers, fp32 and fp16. */
    for (int dt = FA_DTYPE_F32; dt <= FA_DTYPE_F16; dt++) {
        fa_attention_desc sd = *d;
        sd.q.dtype = sd.k.dtype = sd.v.dtype = sd.o.dtype = (fa_dtype)dt;
        CHECK_OK(fa_attention_desc_check(&sd));
        size_t es = fa_dtype_size((fa_dtype)dt);
        void *buf[4], *out[4];
        for (int r = 0; r < 4; r++) {
            buf[r] = xcalloc((size_t)p.map[r].span, es);
            out[r] = xcalloc((size_t)p.map[r].span, es);
            for (int64_t i = 0; i < p.map[r].span; i++)
                fa_store_elem(buf[r], (fa_dtype)dt, i, p.map[r].covered[i] ? p.in[r][i] : 0.0);
            fa_test_poison(out[r], (fa_dtype)dt, p.map[r].span);
        }
        float *lse = xcalloc((size_t)p.nl, sizeof(float));
        for (int64_t i = 0; i < p.nl; i++) lse[i] = NAN;
        CHECK_OK(fa_ref_forward(&sd, buf[TQ], buf[TK], buf[TV], out[TO], lse));
        CHECK_OK(fa_ref_backward(&sd, buf[TQ], buf[TK], buf[TV], out[TO], lse, buf[TO], out[TQ], out[TK],
                                 out[TV]));
        int nan_count = 0, bad_l = 0;
        for (int r = 0; r < 4; r++)
            for (int64_t i = 0; i < p.map[r].span; i++)
                if (p.map[r].covered[i]) nan_count += isnan(fa_load_elem(out[r], (fa_dtype)dt, i)) != 0;
        for (int64_t i = 0; i < p.nl; i++)
            bad_l += isnan(lse[i]) || (p.lse[i] == -INFINITY) != (lse[i] == -INFINITY);
        CHECK_MSG(nan_count == 0, "%s: %d NaN outputs", fa_dtype_name((fa_dtype)dt), nan_count);
        CHECK_MSG(bad_l == 0, "%s: %d entries of L wrong", fa_dtype_name((fa_dtype)dt), bad_l);
        for (int r = 0; r < 4; r++) {
            free(buf[r]);
            free(out[r]);
        }
        free(lse);
    }
    prob_free(&p);
}

FA_TEST(all_masked_rows) {
    fa_attention_desc d = make_desc(2, 7, 4, 2, 1, 8);
    d.causal = 1;
    check_masked_rows(&d, 201);

    static const uint8_t mask[3 * 2] = {1, 1, 0, 0, 0, 1};
    fa_attention_desc m = make_desc(2, 6, 8, 2, 2, 8);
    m.block_mask = mask;
    m.block_mask_bytes = sizeof mask;
    m.block_q = 2;
    m.block_k = 4;
    check_masked_rows(&m, 202);

    /* A one-sided window above the diagonal, cut off by the sequence end:
     * with seqlen_q > seqlen_k the first rows' windows end before key 0. */
    fa_attention_desc w = make_desc(2, 6, 3, 2, 2, 8);
    w.window_left = 1;
    w.window_right = 0;
    check_masked_rows(&w, 203);
}

FA_TEST(rows_of_p_sum_to_one) {
    /* Scaled-up inputs make the softmax peaked: the max-subtraction matters. */
    fa_attention_desc d = make_desc(2, 9, 11, 4, 2, 16);
    d.softmax_scale = 2.5f;
    problem p;
    prob_init(&p, &d, 301);
    prob_forward(&p);
    row_stats st = check_rows(&p);
    CHECK_MSG(st.sum_err < 1e-12, "rows of P sum to 1 within %.3g", st.sum_err);
    CHECK_MSG(st.o_err < 1e-12, "O differs by %.3g", st.o_err);
    CHECK(st.inconsistent_rows == 0 && st.masked_rows == 0);

    /* From the fp32 L of the storage wrapper, to fp32 accuracy. */
    float *q = xcalloc((size_t)p.map[TQ].span, sizeof(float));
    float *k = xcalloc((size_t)p.map[TK].span, sizeof(float));
    float *v = xcalloc((size_t)p.map[TV].span, sizeof(float));
    float *o = xcalloc((size_t)p.map[TO].span, sizeof(float));
    float *lse = xcalloc((size_t)p.nl, sizeof(float));
    for (int64_t i = 0; i < p.map[TQ].span; i++) q[i] = (float)p.in[TQ][i];
    for (int64_t i = 0; i < p.map[TK].span; i++) k[i] = (float)p.in[TK][i];
    for (int64_t i = 0; i < p.map[TV].span; i++) v[i] = (float)p.in[TV][i];
    fa_test_poison(o, FA_DTYPE_F32, p.map[TO].span);
    fa_test_poison(lse, FA_DTYPE_F32, p.nl);
    CHECK_OK(fa_ref_forward(&d, q, k, v, o, lse));
    double worst = 0.0;
    for (int b = 0; b < d.batch; b++)
        for (int h = 0; h < d.heads_q; h++)
            for (int i = 0; i < d.seqlen_q; i++) {
                double sum = 0.0, L = lse[spec_lse_index(&d, b, h, i)];
                for (int j = 0; j < d.seqlen_k; j++) {
                    double s = 0.0;
                    for (int x = 0; x < d.head_dim; x++)
                        s += (double)q[spec_index(&d, TQ, b, i, h, x)] *
                             (double)k[spec_index(&d, TK, b, j, h / 2, x)];
                    sum += exp(2.5 * s - L);
                }
                worst = fmax(worst, fabs(sum - 1.0));
            }
    CHECK_MSG(worst < 1e-5, "rows sum to 1 within %.3g with the fp32 L", worst);
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    prob_free(&p);

    /* Masked and variable-length problems. */
    static const int32_t cu_q[3] = {0, 6, 8};
    static const int32_t cu_k[3] = {0, 2, 9};
    fa_attention_desc vd = make_desc(2, 6, 7, 2, 2, 8);
    vd.cu_seqlens_q = cu_q;
    vd.cu_seqlens_k = cu_k;
    vd.causal = 1;
    vd.window_left = 3;
    prob_init(&p, &vd, 302);
    prob_forward(&p);
    st = check_rows(&p);
    CHECK_MSG(st.sum_err < 1e-12 && st.o_err < 1e-12, "varlen: sums %.3g, O %.3g", st.sum_err, st.o_err);
    CHECK(st.inconsistent_rows == 0 && st.masked_rows > 0);
    prob_free(&p);
}

FA_TEST(default_scale_is_inverse_sqrt_head_dim) {
    fa_attention_desc d = make_desc(2, 4, 6, 2, 2, 16);
    fa_attention_desc e = d;
    e.softmax_scale = 0.25f; /* 1/sqrt(16), exact */
    problem p, q;
    prob_init(&p, &d, 401);
    prob_init(&q, &e, 401);
    prob_forward(&p);
    prob_forward(&q);
    prob_backward(&p);
    prob_backward(&q);
    CHECK(memcmp(p.o, q.o, (size_t)p.map[TO].span * sizeof(double)) == 0);
    CHECK(memcmp(p.lse, q.lse, (size_t)p.nl * sizeof(double)) == 0);
    CHECK(memcmp(p.grad[TQ], q.grad[TQ], (size_t)p.map[TQ].span * sizeof(double)) == 0);
    /* A different scale gives a different result. */
    e.softmax_scale = 0.3f;
    problem r;
    prob_init(&r, &e, 401);
    prob_forward(&r);
    CHECK(fabs(r.lse[0] - p.lse[0]) > 1e-6);
    prob_free(&p);
    prob_free(&q);
    prob_free(&r);
}

static double max_abs_diff(const double *a, const double *b, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double diff = fabs(a[i] - b[i]);
        if (!(diff <= m)) m = diff;
    }
    return m;
}

/* GQA / MQA equal multi-head attention with K and V heads repeated by hand,
 * dK and dV being the sums over each group. */
static void check_gqa_as_mha(int hq, int hkv, uint64_t seed) {
    fa_attention_desc d = make_desc(2, 5, 7, hq, hkv, 8);
    d.causal = 1;
    d.dropout_p = 0.25f; /* the mask is per query head */
    d.dropout_seed = seed;
    fa_attention_desc m = d;
    m.heads_kv = hq;
    problem g, p;
    prob_init(&g, &d, seed);
    prob_init(&p, &m, seed + 1);
    int group = hq / hkv;
    for (int b = 0; b < d.batch; b++) {
        for (int t = 0; t < d.seqlen_q; t++)
            for (int h = 0; h < hq; h++)
                for (int x = 0; x < d.head_dim; x++) {
                    p.in[TQ][spec_index(&m, TQ, b, t, h, x)] = g.in[TQ][spec_index(&d, TQ, b, t, h, x)];
                    p.in[TO][spec_index(&m, TO, b, t, h, x)] = g.in[TO][spec_index(&d, TO, b, t, h, x)];
                }
        for (int t = 0; t < d.seqlen_k; t++)
            for (int h = 0; h < hq; h++)
                for (int x = 0; x < d.head_dim; x++) {
                    int hk = h / group;
                    p.in[TK][spec_index(&m, TK, b, t, h, x)] = g.in[TK][spec_index(&d, TK, b, t, hk, x)];
                    p.in[TV][spec_index(&m, TV, b, t, h, x)] = g.in[TV][spec_index(&d, TV, b, t, hk, x)];
                }
    }
    prob_forward(&g);
    prob_forward(&p);
    prob_backward(&g);
    prob_backward(&p);
    CHECK(max_abs_diff(g.o, p.o, g.map[TO].span) == 0.0);
    CHECK(max_abs_diff(g.lse, p.lse, g.nl) == 0.0);
    CHECK(max_abs_diff(g.grad[TQ], p.grad[TQ], g.map[TQ].span) == 0.0);
    double worst = 0.0, norm = 0.0;
    for (int r = TK; r <= TV; r++)
        for (int b = 0; b < d.batch; b++)
            for (int t = 0; t < d.seqlen_k; t++)
                for (int hk = 0; hk < hkv; hk++)
                    for (int x = 0; x < d.head_dim; x++) {
                        double sum = 0.0;
                        for (int h = hk * group; h < (hk + 1) * group; h++)
                            sum += p.grad[r][spec_index(&m, r, b, t, h, x)];
                        double got = g.grad[r][spec_index(&d, r, b, t, hk, x)];
                        worst = fmax(worst, fabs(got - sum));
                        norm = fmax(norm, fabs(sum));
                    }
    CHECK_MSG(worst <= 1e-13 * norm && norm > 0, "dK/dV differ from the group sums by %.3g", worst);
    prob_free(&g);
    prob_free(&p);
}

FA_TEST(gqa_equals_repeated_heads) {
    check_gqa_as_mha(4, 2, 501);
    check_gqa_as_mha(4, 1, 502);
    check_gqa_as_mha(6, 3, 503);
}

/* Copy the covered elements of one sequence between two problems. */
static void copy_sequence(problem *dst, int db, const problem *src, int sb_, int role, int len) {
    int heads = role_heads(&src->desc, role);
    for (int t = 0; t < len; t++)
        for (int h = 0; h < heads; h++)
            for (int x = 0; x < src->desc.head_dim; x++)
                dst->in[role][spec_index(&dst->desc, role, db, t, h, x)] =
                    src->in[role][spec_index(&src->desc, role, sb_, t, h, x)];
}

/* Largest difference of one sequence's outputs between two problems. */
static double sequence_diff(const problem *a, int ab, const problem *c, int cb) {
    const fa_attention_desc *d = &a->desc;
    int lq = spec_len(d, 1, ab), lk = spec_len(d, 0, ab);
    double worst = 0.0;
    for (int role = 0; role < 4; role++) {
        int len = role_is_query(role) ? lq : lk;
        const double *x = role == TO ? a->o : a->grad[role];
        const double *y = role == TO ? c->o : c->grad[role];
        for (int t = 0; t < len; t++)
            for (int h = 0; h < role_heads(d, role); h++)
                for (int e = 0; e < d->head_dim; e++)
                    worst = fmax(worst, fabs(x[spec_index(d, role, ab, t, h, e)] -
                                             y[spec_index(&c->desc, role, cb, t, h, e)]));
    }
    for (int h = 0; h < d->heads_q; h++)
        for (int t = 0; t < lq; t++) {
            double la = a->lse[spec_lse_index(d, ab, h, t)], lc = c->lse[spec_lse_index(&c->desc, cb, h, t)];
            if (la != lc) worst = fmax(worst, isinf(la) || isinf(lc) ? INFINITY : fabs(la - lc));
        }
    return worst;
}

/* With the score options on, each sequence's ALiBi distances are its own
 * (bottom-right aligned per sequence), as a separate run has them. */
static void varlen_split_case(int score_options) {
    static const float slopes[4] = {0.5f, 0.25f, 0.125f, 1.0f};
    static const int32_t cu_q[5] = {0, 3, 8, 9, 15};
    static const int32_t cu_k[5] = {0, 4, 6, 13, 14};
    fa_attention_desc d = make_desc(4, 6, 7, 4, 2, 8);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.causal = 1;
    d.window_left = 4;
    if (score_options) {
        d.softcap = 2.0f;
        d.alibi_slopes = slopes;
    }
    problem pv;
    prob_init(&pv, &d, 601);
    prob_forward(&pv);
    prob_backward(&pv);
    for (int b = 0; b < d.batch; b++) {
        int lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
        fa_attention_desc one = make_desc(1, lq, lk, 4, 2, 8);
        one.causal = 1;
        one.window_left = 4;
        one.softcap = d.softcap;
        one.alibi_slopes = d.alibi_slopes;
        problem p1;
        prob_init(&p1, &one, 602 + (uint64_t)b);
        for (int r = 0; r < 4; r++) copy_sequence(&p1, 0, &pv, b, r, role_is_query(r) ? lq : lk);
        prob_forward(&p1);
        prob_backward(&p1);
        double diff = sequence_diff(&pv, b, &p1, 0);
        CHECK_MSG(diff == 0.0, "sequence %d differs from its own run by %.3g", b, diff);
        prob_free(&p1);
    }
    if (score_options) check_gradients(&pv);
    prob_free(&pv);
}

FA_TEST(varlen_equals_separate_sequences) {
    varlen_split_case(0);
    varlen_split_case(1);

    /* Equal lengths: a varlen batch is the fixed-length batch, dropout and
     * block mask included (both are indexed by positions in the sequence). */
    static const int32_t eq_q[4] = {0, 4, 8, 12};
    static const int32_t eq_k[4] = {0, 6, 12, 18};
    static const uint8_t mask[2 * 2] = {1, 1, 0, 1};
    fa_attention_desc fixed = make_desc(3, 4, 6, 2, 1, 8);
    fixed.dropout_p = 0.4f;
    fixed.dropout_seed = 99;
    fixed.dropout_offset = 5;
    fixed.block_mask = mask;
    fixed.block_mask_bytes = sizeof mask;
    fixed.block_q = 2;
    fixed.block_k = 3;
    fa_attention_desc var = fixed;
    var.cu_seqlens_q = eq_q;
    var.cu_seqlens_k = eq_k;
    problem pf, pw;
    prob_init(&pf, &fixed, 610);
    prob_init(&pw, &var, 611);
    for (int b = 0; b < 3; b++)
        for (int r = 0; r < 4; r++) copy_sequence(&pw, b, &pf, b, r, role_is_query(r) ? 4 : 6);
    prob_forward(&pf);
    prob_forward(&pw);
    prob_backward(&pf);
    prob_backward(&pw);
    for (int b = 0; b < 3; b++) {
        double diff = sequence_diff(&pw, b, &pf, b);
        CHECK_MSG(diff == 0.0, "sequence %d: varlen and fixed-length differ by %.3g", b, diff);
    }
    prob_free(&pf);
    prob_free(&pw);
}

/* The library's index helpers agree with the layout rules of the header. */
FA_TEST(index_helpers_follow_layout_rules) {
    static const int32_t cu_q[3] = {0, 2, 7};
    static const int32_t cu_k[3] = {0, 5, 6};
    for (int variant = 0; variant < 4; variant++) {
        fa_attention_desc d = make_desc(2, 5, 6, 4, 2, 8);
        if (variant == 1) {
            set_bhsd(&d.q, 5, 4, 8);
            set_bhsd(&d.o, 5, 4, 8);
            set_bhsd(&d.k, 6, 2, 8);
            set_bhsd(&d.v, 6, 2, 8);
            d.k.offset = 12;
        }
        if (variant == 2) {
            d.cu_seqlens_q = cu_q;
            d.cu_seqlens_k = cu_k;
            d.q.stride_seq = 40;
            d.v.stride_head = 12;
            d.v.stride_seq = 32;
        }
        if (variant == 3) {
            /* A head stride alone: the packed sequence stride stays
             * heads * head_dim, it does not follow stride_head. */
            d.q.stride_head = 256;
            d.q.stride_batch = 1024;
        }
        CHECK_OK(fa_attention_desc_check(&d));
        int bad = 0;
        for (int role = 0; role < 4; role++) {
            int heads = role_heads(&d, role), is_q = role_is_query(role);
            tensor_map m = map_make(&d, role);
            CHECK(fa_ref_tensor_span(&d, (fa_tensor_role)role) == m.span);
            free(m.covered);
            for (int b = 0; b < d.batch; b++)
                for (int t = 0; t < spec_len(&d, is_q, b); t++)
                    for (int h = 0; h < heads; h++)
                        for (int x = 0; x < d.head_dim; x += 3)
                            bad += fa_ref_index(&d, (fa_tensor_role)role, b, t, h, x) !=
                                   spec_index(&d, role, b, t, h, x);
        }
        for (int b = 0; b < d.batch; b++) {
            int64_t start;
            int len;
            fa_ref_seq_q(&d, b, &start, &len);
            bad += len != spec_len(&d, 1, b);
            bad += start != (d.cu_seqlens_q ? cu_q[b] : (int64_t)b * d.seqlen_q);
            fa_ref_seq_k(&d, b, &start, &len);
            bad += len != spec_len(&d, 0, b);
            bad += start != (d.cu_seqlens_k ? cu_k[b] : (int64_t)b * d.seqlen_k);
            for (int h = 0; h < d.heads_q; h++)
                for (int t = 0; t < spec_len(&d, 1, b); t++)
                    bad += fa_ref_lse_index(&d, b, h, t) != spec_lse_index(&d, b, h, t);
        }
        CHECK_MSG(bad == 0, "layout variant %d: %d index mismatches", variant, bad);
    }
}

/* ------------------------------------------------------------------------ */
/* Storage-dtype wrappers                                                   */
/* ------------------------------------------------------------------------ */

static double *load_all(const void *src, fa_dtype dt, int64_t n) {
    double *out = new_doubles(n);
    for (int64_t i = 0; i < n; i++) out[i] = fa_load_elem(src, dt, i);
    return out;
}

/* ||a - ref|| / ||ref|| for a in dtype dt; INFINITY if a has a non-finite
 * element where ref is finite. */
static double rel_error(const void *a, fa_dtype dt, const double *ref, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double x = fa_load_elem(a, dt, i);
        if (!isfinite(x)) return INFINITY;
        num += (x - ref[i]) * (x - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

static double rel_error_lse(const float *a, const double *ref, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(ref[i])) {
            if (a[i] != ref[i]) return INFINITY;
            continue;
        }
        if (!isfinite(a[i])) return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : 0.0;
}

typedef struct dtype_bounds {
    fa_dtype dt;
    double lo, hi;          /* error of a single rounding of the outputs */
    double std_lo, std_hi;  /* error of unfused attention in the dtype */
} dtype_bounds;

static void check_storage_dtype(const dtype_bounds *bd, uint64_t seed) {
    fa_dtype dt = bd->dt;
    const char *name = fa_dtype_name(dt);
    fa_attention_desc d = make_desc(2, 32, 40, 4, 2, 64);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dt;
    d.causal = 1;
    CHECK_OK(fa_attention_desc_check(&d));
    int64_t n[4];
    for (int r = 0; r < 4; r++)
        n[r] = fa_ref_tensor_span(&d, (fa_tensor_role)r);
    int64_t nl = spec_total_q(&d) * d.heads_q;
    fa_rng rng;
    fa_rng_seed(&rng, seed);
    void *in[4], *out[4], *std_o;
    for (int r = 0; r < 4; r++) {
        in[r] = fa_test_random_tensor(&rng, dt, n[r]); /* in[TO] is dO */
        out[r] = xcalloc((size_t)n[r], fa_dtype_size(dt));
        fa_test_poison(out[r], dt, n[r]);
    }
    std_o = xcalloc((size_t)n[TO], fa_dtype_size(dt));
    fa_test_poison(std_o, dt, n[TO]);
    float *lse = xcalloc((size_t)nl, sizeof(float));
    float *std_lse = xcalloc((size_t)nl, sizeof(float));
    fa_test_poison(lse, FA_DTYPE_F32, nl);
    fa_test_poison(std_lse, FA_DTYPE_F32, nl);

    CHECK_OK(fa_ref_forward(&d, in[TQ], in[TK], in[TV], out[TO], lse));
    CHECK_OK(fa_ref_standard_forward(&d, in[TQ], in[TK], in[TV], std_o, std_lse));

    /* fp64 on the very same (already rounded) inputs. */
    double *q = load_all(in[TQ], dt, n[TQ]), *k = load_all(in[TK], dt, n[TK]);
    double *v = load_all(in[TV], dt, n[TV]), *g = load_all(in[TO], dt, n[TO]);
    double *o64 = new_doubles(n[TO]), *l64 = new_doubles(nl);
    fa_ref_forward_f64(&d, q, k, v, o64, l64);
    double err_o = rel_error(out[TO], dt, o64, n[TO]);
    double err_l = rel_error_lse(lse, l64, nl);
    double err_std = rel_error(std_o, dt, o64, n[TO]);
    double err_std_l = rel_error_lse(std_lse, l64, nl);
    CHECK_MSG(err_o >= bd->lo && err_o < bd->hi, "%s: O relative error %.3g outside [%.3g, %.3g)", name,
              err_o, bd->lo, bd->hi);
    CHECK_MSG(err_l < 1e-6, "%s: L relative error %.3g", name, err_l);
    CHECK_MSG(err_std >= bd->std_lo && err_std < bd->std_hi,
              "%s: standard attention error %.3g outside [%.3g, %.3g)", name, err_std, bd->std_lo,
              bd->std_hi);
    CHECK_MSG(err_std >= err_o, "%s: unfused error %.3g below a single rounding's %.3g", name, err_std,
              err_o);
    CHECK_MSG(err_std_l < 1e-3, "%s: standard attention L relative error %.3g", name, err_std_l);

    /* Backward from the stored O and fp32 L, against fp64 on those same values. */
    CHECK_OK(fa_ref_backward(&d, in[TQ], in[TK], in[TV], out[TO], lse, in[TO], out[TQ], out[TK],
                             out[TV]));
    double *o_stored = load_all(out[TO], dt, n[TO]);
    double *l_stored = new_doubles(nl);
    for (int64_t i = 0; i < nl; i++) l_stored[i] = (double)lse[i];
    double *grad[3];
    for (int r = 0; r < 3; r++) grad[r] = new_doubles(n[r]);
    fa_ref_backward_f64(&d, q, k, v, o_stored, l_stored, g, grad[TQ], grad[TK], grad[TV]);
    for (int r = 0; r < 3; r++) {
        double err = rel_error(out[r], dt, grad[r], n[r]);
        CHECK_MSG(err >= bd->lo && err < bd->hi, "%s: d%s relative error %.3g outside [%.3g, %.3g)", name,
                  role_name[r], err, bd->lo, bd->hi);
        free(grad[r]);
    }

    for (int r = 0; r < 4; r++) {
        free(in[r]);
        free(out[r]);
    }
    free(std_o);
    free(lse);
    free(std_lse);
    free(q);
    free(k);
    free(v);
    free(g);
    free(o64);
    free(l64);
    free(o_stored);
    free(l_stored);
}

/* Unfused attention rounds S and P to the dtype as well as O, so its error
 * is a known multiple of one rounding of O: about 2x with the default scale,
 * and larger when scores are big (S rounded at a coarser ulp). */
static void check_standard_ratio(fa_dtype dt, float scale, double ratio_lo, double ratio_hi, uint64_t seed) {
    fa_attention_desc d = make_desc(2, 32, 40, 4, 2, 64);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dt;
    d.softmax_scale = scale;
    d.causal = 1;
    CHECK_OK(fa_attention_desc_check(&d));
    int64_t nq = (int64_t)2 * 32 * 4 * 64, nk = (int64_t)2 * 40 * 2 * 64, nl = (int64_t)2 * 32 * 4;
    fa_rng rng;
    fa_rng_seed(&rng, seed);
    void *q = fa_test_random_tensor(&rng, dt, nq), *k = fa_test_random_tensor(&rng, dt, nk);
    void *v = fa_test_random_tensor(&rng, dt, nk);
    void *o = xcalloc((size_t)nq, fa_dtype_size(dt)), *so = xcalloc((size_t)nq, fa_dtype_size(dt));
    float *lse = xcalloc((size_t)nl, sizeof(float));
    fa_test_poison(o, dt, nq);
    fa_test_poison(so, dt, nq);
    CHECK_OK(fa_ref_forward(&d, q, k, v, o, lse));
    CHECK_OK(fa_ref_standard_forward(&d, q, k, v, so, NULL));
    double *qd = load_all(q, dt, nq), *kd = load_all(k, dt, nk), *vd = load_all(v, dt, nk);
    double *od = new_doubles(nq), *ld = new_doubles(nl);
    fa_ref_forward_f64(&d, qd, kd, vd, od, ld);
    double fused = rel_error(o, dt, od, nq), standard = rel_error(so, dt, od, nq);
    double ratio = standard / fused;
    CHECK_MSG(ratio >= ratio_lo && ratio < ratio_hi,
              "%s, scale %g: unfused error %.3g is %.3g x the fused %.3g, expected [%g, %g)",
              fa_dtype_name(dt), (double)scale, standard, ratio, fused, ratio_lo, ratio_hi);
    free(q);
    free(k);
    free(v);
    free(o);
    free(so);
    free(lse);
    free(qd);
    free(kd);
    free(vd);
    free(od);
    free(ld);
}

FA_TEST(storage_fp32) {
    const dtype_bounds b = {FA_DTYPE_F32, 0.0, 1e-6, 0.0, 1e-5};
    check_storage_dtype(&b, 701);
}

FA_TEST(storage_fp16) {
    /* One rounding to 11 significant bits: about 2^-11 / sqrt(3) RMS. */
    const dtype_bounds b = {FA_DTYPE_F16, 5e-5, 1e-3, 2e-4, 3e-3};
    check_storage_dtype(&b, 702);
    check_standard_ratio(FA_DTYPE_F16, 0.0f, 1.6, 3.0, 704);
    check_standard_ratio(FA_DTYPE_F16, 1.0f, 2.5, 6.0, 705);
}

FA_TEST(storage_bf16) {
    /* 8 significant bits: about 2^-8 / sqrt(3) RMS. */
    const dtype_bounds b = {FA_DTYPE_BF16, 5e-4, 1e-2, 2e-3, 2e-2};
    check_storage_dtype(&b, 703);
    check_standard_ratio(FA_DTYPE_BF16, 0.0f, 1.6, 3.0, 706);
    check_standard_ratio(FA_DTYPE_BF16, 1.0f, 2.5, 6.0, 707);
}

/* Strided views inside bigger buffers: outputs touch only their elements,
 * and equal those of the packed layout bit for bit. */
static void set_padded(fa_tensor_desc *t, int64_t offset, int seqlen, int heads, int d) {
    t->offset = offset;
    t->stride_head = d + 8;
    t->stride_seq = (int64_t)heads * (d + 8) + 8;
    t->stride_batch = (int64_t)seqlen * t->stride_seq + 16;
}

FA_TEST(strided_views_leave_gaps_untouched) {
    const uint16_t sentinel = 0x3e00; /* 1.5 in fp16 */
    fa_attention_desc packed = make_desc(2, 5, 7, 4, 2, 16);
    packed.q.dtype = packed.k.dtype = packed.v.dtype = packed.o.dtype = FA_DTYPE_F16;
    packed.causal = 1;
    packed.dropout_p = 0.1f;
    packed.dropout_seed = 5;
    fa_attention_desc view = packed;
    set_padded(&view.q, 8, 5, 4, 16);
    set_padded(&view.k, 16, 7, 2, 16);
    set_padded(&view.v, 24, 7, 2, 16);
    set_padded(&view.o, 8, 5, 4, 16);
    view.v.stride_seq += 8;
    view.v.stride_batch += 64;
    CHECK_OK(fa_attention_desc_check(&packed));
    CHECK_OK(fa_attention_desc_check(&view));

    fa_rng rng;
    fa_rng_seed(&rng, 801);
    tensor_map mp[4], mv[4];
    uint16_t *pin[4], *vin[4], *pout[4], *vout[4];
    const int64_t extra = 24; /* room after the view's last element */
    for (int r = 0; r < 4; r++) {
        mp[r] = map_make(&packed, r);
        mv[r] = map_make(&view, r);
        int64_t nv = mv[r].span + extra;
        pin[r] = xcalloc((size_t)mp[r].span, 2);
        pout[r] = xcalloc((size_t)mp[r].span, 2);
        vin[r] = xcalloc((size_t)nv, 2);
        vout[r] = xcalloc((size_t)nv, 2);
        fa_test_poison(vin[r], FA_DTYPE_F16, nv);
        fa_test_poison(pout[r], FA_DTYPE_F16, mp[r].span);
        for (int64_t i = 0; i < nv; i++) vout[r][i] = i < mv[r].span && mv[r].covered[i] ? 0x7e00 : sentinel;
        int is_q = role_is_query(r);
        for (int b = 0; b < packed.batch; b++)
            for (int t = 0; t < spec_len(&packed, is_q, b); t++)
                for (int h = 0; h < role_heads(&packed, r); h++)
                    for (int x = 0; x < packed.head_dim; x++) {
                        uint16_t val = fa_f32_to_f16((float)fa_rng_normal(&rng));
                        pin[r][spec_index(&packed, r, b, t, h, x)] = val;
                        vin[r][spec_index(&view, r, b, t, h, x)] = val;
                    }
    }
    int64_t nl = spec_total_q(&packed) * packed.heads_q;
    float *lp = xcalloc((size_t)nl, sizeof(float)), *lv = xcalloc((size_t)nl, sizeof(float));
    fa_test_poison(lp, FA_DTYPE_F32, nl);
    fa_test_poison(lv, FA_DTYPE_F32, nl);

    CHECK_OK(fa_ref_forward(&packed, pin[TQ], pin[TK], pin[TV], pout[TO], lp));
    CHECK_OK(fa_ref_forward(&view, vin[TQ], vin[TK], vin[TV], vout[TO], lv));
    CHECK_OK(fa_ref_backward(&packed, pin[TQ], pin[TK], pin[TV], pout[TO], lp, pin[TO], pout[TQ], pout[TK],
                             pout[TV]));
    CHECK_OK(fa_ref_backward(&view, vin[TQ], vin[TK], vin[TV], vout[TO], lv, vin[TO], vout[TQ], vout[TK],
                             vout[TV]));
    CHECK(memcmp(lp, lv, (size_t)nl * sizeof(float)) == 0);
    for (int r = 0; r < 4; r++) {
        int64_t nv = mv[r].span + extra;
        int gaps_written = 0, mismatch = 0, nans = 0;
        for (int64_t i = 0; i < nv; i++)
            if (!(i < mv[r].span && mv[r].covered[i])) gaps_written += vout[r][i] != sentinel;
        int is_q = role_is_query(r);
        for (int b = 0; b < packed.batch; b++)
            for (int t = 0; t < spec_len(&packed, is_q, b); t++)
                for (int h = 0; h < role_heads(&packed, r); h++)
                    for (int x = 0; x < packed.head_dim; x++) {
                        uint16_t a = pout[r][spec_index(&packed, r, b, t, h, x)];
                        uint16_t c = vout[r][spec_index(&view, r, b, t, h, x)];
                        mismatch += a != c;
                        nans += isnan(fa_f16_to_f32(c)) != 0;
                    }
        const char *what = r == TO ? "O" : role_name[r];
        CHECK_MSG(gaps_written == 0, "%s%s: %d gap elements written", r == TO ? "" : "d", what, gaps_written);
        CHECK_MSG(mismatch == 0 && nans == 0, "%s%s: %d differ from the packed run, %d NaN",
                  r == TO ? "" : "d", what, mismatch, nans);
        free(mp[r].covered);
        free(mv[r].covered);
        free(pin[r]);
        free(vin[r]);
        free(pout[r]);
        free(vout[r]);
    }
    free(lp);
    free(lv);
}

FA_TEST(null_arguments) {
    fa_attention_desc d = make_desc(1, 2, 2, 1, 1, 8);
    float q[16] = {0}, k[16] = {0}, v[16] = {0}, o[16] = {0}, g[16] = {0}, lse[2] = {0};
    float dq[16], dk[16], dv[16];
    const void *fwd[5] = {q, k, v, o, lse};
    const char *fwd_names[5] = {": q is", ": k is", ": v is", ": o is", ": lse is"};
    for (int miss = 0; miss < 5; miss++) {
        const void *a[5];
        memcpy(a, fwd, sizeof a);
        a[miss] = NULL;
        CHECK_STATUS(fa_ref_forward(&d, a[0], a[1], a[2], (void *)a[3], (float *)a[4]), FA_ERR_NULL_POINTER);
        CHECK_MSG(strstr(fa_last_error(), fwd_names[miss]) != NULL, "message \"%s\"", fa_last_error());
        if (miss < 4) {
            CHECK_STATUS(fa_ref_standard_forward(&d, a[0], a[1], a[2], (void *)a[3], NULL),
                         FA_ERR_NULL_POINTER);
            CHECK_MSG(strstr(fa_last_error(), fwd_names[miss]) != NULL, "message \"%s\"", fa_last_error());
        }
    }
    const void *bwd[9] = {q, k, v, o, lse, g, dq, dk, dv};
    const char *bwd_names[9] = {": q is", ": k is", ": v is", ": o is", ": lse is",
                                ": dout is", ": dq is", ": dk is", ": dv is"};
    for (int miss = 0; miss < 9; miss++) {
        const void *a[9];
        memcpy(a, bwd, sizeof a);
        a[miss] = NULL;
        CHECK_STATUS(fa_ref_backward(&d, a[0], a[1], a[2], a[3], (const float *)a[4], a[5], (void *)a[6],
                                     (void *)a[7], (void *)a[8]),
                     FA_ERR_NULL_POINTER);
        CHECK_MSG(strstr(fa_last_error(), bwd_names[miss]) != NULL, "message \"%s\"", fa_last_error());
    }
    CHECK_STATUS(fa_ref_forward(NULL, q, k, v, o, lse), FA_ERR_NULL_POINTER);
    CHECK_STATUS(fa_ref_backward(NULL, q, k, v, o, lse, g, dq, dk, dv), FA_ERR_NULL_POINTER);
    CHECK_STATUS(fa_ref_standard_forward(NULL, q, k, v, o, lse), FA_ERR_NULL_POINTER);
    /* L is optional for unfused attention only. */
    CHECK_OK(fa_ref_standard_forward(&d, q, k, v, o, NULL));
}

FA_TEST_MAIN(FA_CASE(grad_plain), FA_CASE(grad_causal_q_shorter), FA_CASE(grad_causal_q_longer),
             FA_CASE(grad_sliding_window), FA_CASE(grad_block_sparse), FA_CASE(grad_gqa), FA_CASE(grad_mqa),
             FA_CASE(grad_dropout), FA_CASE(grad_varlen), FA_CASE(grad_bhsd_strides),
             FA_CASE(grad_custom_scale), FA_CASE(visibility_rules), FA_CASE(all_masked_rows),
             FA_CASE(rows_of_p_sum_to_one), FA_CASE(default_scale_is_inverse_sqrt_head_dim),
             FA_CASE(gqa_equals_repeated_heads), FA_CASE(varlen_equals_separate_sequences),
             FA_CASE(index_helpers_follow_layout_rules), FA_CASE(storage_fp32), FA_CASE(storage_fp16),
             FA_CASE(storage_bf16), FA_CASE(strided_views_leave_gaps_untouched), FA_CASE(null_arguments))
