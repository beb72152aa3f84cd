/* KV-cache steps on the host: the reference against the header's
 * definition written out, the descriptor check of every KV-cache field, the
 * argument checks of fa_forward_kvcache (through the reference device), the
 * plans of cache steps on described devices, and a few steps through the
 * reference backend (tests/kvcache_case.c). Every device present runs the
 * steps in tests/test_kvcache.c. */
#include "desc.h"
#include "harness.h"
#include "kvcache_case.h"
#include "planner.h"
#include "planner_decode.h"
#include "reference.h"
#include "test_util.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The reference against the definition, written out with packed layouts.  */

enum { NB = 2, NSQ = 2, NSN = 2, NCAP = 40, NP = 16, NHQ = 4, NHKV = 2, ND = 16, NRD = 8 };
#define NPPS ((NCAP + NP - 1) / NP)
#define NPAGES (NB * NPPS + 1)

typedef struct naive_problem {
    fa_attention_desc d;
    float slopes[NHQ];
    int32_t lens[NB], bt[NB * NPPS];
    float q[NB * NSQ * NHQ * ND], kn[NB * NSN * NHKV * ND], vn[NB * NSN * NHKV * ND];
    float kpool[NPAGES * NP * NHKV * ND], vpool[NPAGES * NP * NHKV * ND];
    float cos_t[NCAP * NRD / 2], sin_t[NCAP * NRD / 2];
} naive_problem;

static int pool_index(const naive_problem *p, int b, int t, int h) {
    return ((p->bt[b * NPPS + t / NP] * NP + t % NP) * NHKV + h) * ND;
}

/* Rotation of row (ND values) at position pos, in double. */
static void naive_rotate(const naive_problem *p, double *row, int pos) {
    for (int i = 0; i < NRD / 2; i++) {
        const int a = p->d.rotary_interleaved ? 2 * i : i, c = p->d.rotary_interleaved ? 2 * i + 1 : i + NRD / 2;
        const double co = p->cos_t[pos * NRD / 2 + i], si = p->sin_t[pos * NRD / 2 + i];
        const double x = row[a], y = row[c];
        row[a] = x * co - y * si;
        row[c] = x * si + y * co;
    }
}

static void naive_init(naive_problem *p, int interleaved, uint64_t seed) {
    memset(p, 0, sizeof *p);
    fa_attention_desc *d = &p->d;
    fa_attention_desc_init(d);
    d->batch = NB;
    d->seqlen_q = NSQ;
    d->seqlen_k = NCAP;
    d->heads_q = NHQ;
    d->heads_kv = NHKV;
    d->head_dim = ND;
    d->causal = 1;
    d->softcap = 3.0f;
    d->kv_cache = 1;
    d->page_size = NP;
    d->num_pages = NPAGES;
    d->seqlen_new = NSN;
    d->rotary_dim = NRD;
    d->rotary_interleaved = interleaved;
    for (int h = 0; h < NHQ; h++) p->slopes[h] = 0.25f / (float)(h + 1);
    d->alibi_slopes = p->slopes;
    p->lens[0] = 19;
    p->lens[1] = 5;
    /* Pages in reverse order, one left unused. */
    for (int i = 0; i < NB * NPPS; i++) p->bt[i] = NPAGES - 1 - i;
    fa_rng rng;
    fa_rng_seed(&rng, seed);
    for (size_t i = 0; i < sizeof p->q / sizeof p->q[0]; i++) p->q[i] = (float)fa_rng_normal(&rng);
    for (size_t i = 0; i < sizeof p->kn / sizeof p->kn[0]; i++) p->kn[i] = (float)fa_rng_normal(&rng);
    for (size_t i = 0; i < sizeof p->vn / sizeof p->vn[0]; i++) p->vn[i] = (float)fa_rng_normal(&rng);
    for (size_t i = 0; i < sizeof p->kpool / sizeof p->kpool[0]; i++) p->kpool[i] = (float)fa_rng_normal(&rng);
    for (size_t i = 0; i < sizeof p->vpool / sizeof p->vpool[0]; i++) p->vpool[i] = (float)fa_rng_normal(&rng);
    for (int pos = 0; pos < NCAP; pos++)
        for (int i = 0; i < NRD / 2; i++) {
            p->cos_t[pos * NRD / 2 + i] = (float)cos(0.3 * pos / (i + 1));
            p->sin_t[pos * NRD / 2 + i] = (float)sin(0.3 * pos / (i + 1));
        }
}

FA_TEST(reference_matches_definition) {
    static naive_problem p;
    for (int interleaved = 0; interleaved < 2; interleaved++) {
        naive_init(&p, interleaved, 11u + (uint64_t)interleaved);
        CHECK_OK(fa_attention_desc_check(&p.d));
        static float kref[sizeof p.kpool / sizeof p.kpool[0]], vref[sizeof p.vpool / sizeof p.vpool[0]];
        memcpy(kref, p.kpool, sizeof kref);
        memcpy(vref, p.vpool, sizeof vref);
        float o[NB * NSQ * NHQ * ND], lse[NB * NHQ * NSQ];
        const fa_ref_kvcache_args a = {p.q, kref, vref, o, lse, p.lens, p.bt, p.kn, p.vn, p.cos_t, p.sin_t};
        CHECK_OK(fa_ref_forward_kvcache(&p.d, &a));

        double err_o = 0.0, err_l = 0.0, err_k = 0.0;
        int64_t moved = 0;
        for (int b = 0; b < NB; b++) {
            const int len = p.lens[b], lk = len + NSN;
            /* The cache after the append: the old keys, then k_new rotated
             * at len + t (rounded to fp32), v_new as is. */
            static double K[NCAP][NHKV][ND], V[NCAP][NHKV][ND];
            for (int t = 0; t < lk; t++)
                for (int h = 0; h < NHKV; h++) {
                    double row[ND];
                    for (int x = 0; x < ND; x++) {
                        row[x] = t < len ? p.kpool[pool_index(&p, b, t, h) + x]
                                         : p.kn[((b * NSN + t - len) * NHKV + h) * ND + x];
                        V[t][h][x] = t < len ? p.vpool[pool_index(&p, b, t, h) + x]
                                             : p.vn[((b * NSN + t - len) * NHKV + h) * ND + x];
                    }
                    if (t >= len) naive_rotate(&p, row, t);
                    for (int x = 0; x < ND; x++) {
                        K[t][h][x] = (float)row[x];
                        err_k = fmax(err_k, fabs(kref[pool_index(&p, b, t, h) + x] - K[t][h][x]));
                        err_k = fmax(err_k, fabs(vref[pool_index(&p, b, t, h) + x] - V[t][h][x]));
                    }
                }
            for (int i = 0; i < NSQ; i++)
                for (int h = 0; h < NHQ; h++) {
                    double qi[ND];
                    for (int x = 0; x < ND; x++) qi[x] = p.q[((b * NSQ + i) * NHQ + h) * ND + x];
                    naive_rotate(&p, qi, len + i); /* causal: query i at len + i */
                    for (int x = 0; x < ND; x++) qi[x] = (float)qi[x];
                    const int hk = h / (NHQ / NHKV);
                    double s[NCAP], m = -INFINITY, sum = 0.0;
                    for (int j = 0; j < lk; j++) {
                        double acc = 0.0;
                        for (int x = 0; x < ND; x++) acc += qi[x] * K[j][hk][x];
                        s[j] = acc / sqrt((double)ND);
                        s[j] = 3.0 * tanh(s[j] / 3.0);
                        s[j] -= p.slopes[h] * fabs((double)(i + lk - NSQ - j));
                        if (j > i + lk - NSQ) s[j] = -INFINITY;
                        m = fmax(m, s[j]);
                    }
                    for (int j = 0; j < lk; j++) sum += exp(s[j] - m);
                    err_l = fmax(err_l, fabs(lse[(b * NHQ + h) * NSQ + i] - (m + log(sum))));
                    for (int x = 0; x < ND; x++) {
                        double acc = 0.0;
                        for (int j = 0; j < lk; j++) acc += exp(s[j] - m) / sum * V[j][hk][x];
                        err_o = fmax(err_o, fabs(o[((b * NSQ + i) * NHQ + h) * ND + x] - acc));
                    }
                }
        }
        /* Pages no sequence writes to keep their values. */
        for (size_t i = 0; i < sizeof kref / sizeof kref[0]; i++) moved += kref[i] != p.kpool[i];
        CHECK_MSG(err_o < 1e-6 && err_l < 1e-5, "interleaved %d: O differs by %.3g, L by %.3g", interleaved, err_o,
                  err_l);
        CHECK_MSG(err_k < 1e-6, "interleaved %d: the caches differ from the definition by %.3g", interleaved, err_k);
        CHECK_MSG(moved <= (int64_t)NB * NSN * NHKV * ND, "interleaved %d: %lld key elements changed, at most %d may",
                  interleaved, (long long)moved, NB * NSN * NHKV * ND);
    }
}

/* Rotary positions and validity at the edges of the rules. */
FA_TEST(reference_validity_rules) {
    static naive_problem p;
    naive_init(&p, 1, 3);
    fa_attention_desc *d = &p.d;
    const struct {
        int len, valid;
    } lens[] = {{-1, 0}, {0, 1}, {NCAP - NSN, 1}, {NCAP - NSN + 1, 0}, {INT_MAX, 0}, {INT_MIN, 0}};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        p.lens[0] = lens[i].len;
        CHECK_MSG(fa_ref_kvcache_seq_valid(d, p.lens, p.bt, 0) == lens[i].valid, "length %d", lens[i].len);
    }
    /* Without an append, a causal query at len + seqlen_q - 1 must lie in
     * the tables; without the causal mask every query is at len. */
    d->seqlen_new = 0;
    p.lens[0] = NCAP - NSQ + 1;
    CHECK(!fa_ref_kvcache_seq_valid(d, p.lens, p.bt, 0));
    d->causal = 0;
    CHECK(fa_ref_kvcache_seq_valid(d, p.lens, p.bt, 0));
    p.lens[0] = NCAP;
    CHECK(!fa_ref_kvcache_seq_valid(d, p.lens, p.bt, 0));
    d->rotary_dim = 0;
    CHECK(fa_ref_kvcache_seq_valid(d, p.lens, p.bt, 0));
    /* Pages: only those the sequence uses are read. */
    p.lens[0] = NP; /* one page */
    p.bt[1] = -5;
    CHECK(fa_ref_kvcache_seq_valid(d, p.lens, p.bt, 0));
    p.lens[0] = NP + 1;
    CHECK(!fa_ref_kvcache_seq_valid(d, p.lens, p.bt, 0));
    p.bt[1] = NPAGES;
    CHECK(!fa_ref_kvcache_seq_valid(d, p.lens, p.bt, 0));
    p.bt[1] = NPAGES - 1;
    CHECK(fa_ref_kvcache_seq_valid(d, p.lens, p.bt, 0));
    /* A window that cannot bind is none: every query at len. */
    d->window_left = NCAP;
    CHECK(!fa_desc_rotary_query_offsets(d));
    d->window_left = 3;
    CHECK(fa_desc_rotary_query_offsets(d));
}

/* ------------------------------------------------------------------------ */
/* Descriptor checks                                                         */

static fa_attention_desc valid_desc(void) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 2;
    d.seqlen_q = 1;
    d.seqlen_k = 100;
    d.heads_q = 4;
    d.heads_kv = 2;
    d.head_dim = 64;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F16;
    d.kv_cache = 1;
    d.page_size = 16;
    d.num_pages = 20;
    d.seqlen_new = 1;
    d.k_new.dtype = d.v_new.dtype = FA_DTYPE_F16;
    d.rotary_dim = 32;
    d.rotary_interleaved = 1;
    return d;
}

typedef void (*desc_edit)(fa_attention_desc *d);

static void e_kv2(fa_attention_desc *d) { d->kv_cache = 2; }
static void e_page8(fa_attention_desc *d) { d->page_size = 8; }
static void e_page24(fa_attention_desc *d) { d->page_size = 24; }
static void e_page272(fa_attention_desc *d) { d->page_size = 272; }
static void e_page_neg(fa_attention_desc *d) { d->page_size = -16; }
static void e_pages0(fa_attention_desc *d) { d->num_pages = 0; }
static void e_pages_contig(fa_attention_desc *d) { d->page_size = 0; }
static void e_new_neg(fa_attention_desc *d) { d->seqlen_new = -1; }
static void e_new_big(fa_attention_desc *d) { d->seqlen_new = 101; }
static void e_rot_odd(fa_attention_desc *d) { d->rotary_dim = 3; }
static void e_rot_big(fa_attention_desc *d) { d->rotary_dim = 72; }
static void e_rot_neg(fa_attention_desc *d) { d->rotary_dim = -2; }
static void e_inter2(fa_attention_desc *d) { d->rotary_interleaved = 2; }
static void e_bias(fa_attention_desc *d) {
    d->bias_batch = 1;
    d->bias_heads = 1;
}
static void e_dropout(fa_attention_desc *d) { d->dropout_p = 0.1f; }
static const uint8_t one_block[1] = {1};
static void e_blocks(fa_attention_desc *d) {
    d->block_mask = one_block;
    d->block_mask_bytes = 1;
    d->block_q = 1;
    d->block_k = 100;
}
static const int32_t cu_ok[3] = {0, 1, 2};
static const int32_t cu_k_ok[3] = {0, 100, 200};
static void e_varlen(fa_attention_desc *d) {
    d->cu_seqlens_q = cu_ok;
    d->cu_seqlens_k = cu_k_ok;
}
static void e_standard(fa_attention_desc *d) { d->algorithm = FA_ALGO_STANDARD; }
static void e_knew_dtype(fa_attention_desc *d) { d->k_new.dtype = FA_DTYPE_F32; }
static void e_vnew_dtype(fa_attention_desc *d) { d->v_new.dtype = FA_DTYPE_BF16; }
static void e_knew_unused(fa_attention_desc *d) { d->seqlen_new = 0; }
static void e_knew_misaligned(fa_attention_desc *d) { d->k_new.offset = 3; }
static void e_vnew_overlap(fa_attention_desc *d) {
    d->seqlen_new = 2;
    d->v_new.stride_seq = 8;
}
static void e_pool_overlap(fa_attention_desc *d) { d->k.stride_batch = 64; }
static void e_pool_huge(fa_attention_desc *d) {
    d->num_pages = INT_MAX;
    d->page_size = 256;
    d->heads_q = d->heads_kv = 1 << 20;
}
static void off_page(fa_attention_desc *d) {
    d->kv_cache = 0;
    d->page_size = 16;
    d->num_pages = 0;
    d->seqlen_new = 0;
    d->rotary_dim = 0;
    d->rotary_interleaved = 0;
    d->k_new.dtype = d->v_new.dtype = FA_DTYPE_F32;
}
static void off_pages(fa_attention_desc *d) {
    off_page(d);
    d->page_size = 0;
    d->num_pages = 4;
}
static void off_new(fa_attention_desc *d) {
    off_page(d);
    d->page_size = 0;
    d->seqlen_new = 1;
}
static void off_rot(fa_attention_desc *d) {
    off_page(d);
    d->page_size = 0;
    d->rotary_dim = 8;
}
static void off_inter(fa_attention_desc *d) {
    off_page(d);
    d->page_size = 0;
    d->rotary_interleaved = 1;
}
static void off_knew(fa_attention_desc *d) {
    off_page(d);
    d->page_size = 0;
    d->k_new.stride_seq = 128;
}
static void off_vnew(fa_attention_desc *d) {
    off_page(d);
    d->page_size = 0;
    d->v_new.dtype = FA_DTYPE_F16;
}

FA_TEST(descriptor_checks) {
    fa_attention_desc d = valid_desc();
    CHECK_OK(fa_attention_desc_check(&d));
    CHECK(fa_desc_pages_per_seq(&d) == 7);
    CHECK(fa_desc_block_table_entries(&d) == 14);
    CHECK(fa_desc_rotary_table_bytes(&d) == 100 * 16 * 4);
    /* The pools: [num_pages, page_size, heads_kv, head_dim]. */
    CHECK(fa_desc_tensor_extent(&d, FA_TENSOR_K) == 20 * 16 * 2 * 64);
    CHECK(fa_desc_tensor_extent(&d, FA_TENSOR_K_NEW) == 2 * 1 * 2 * 64);
    d.page_size = 0;
    d.num_pages = 0;
    CHECK_OK(fa_attention_desc_check(&d));
    CHECK(fa_desc_tensor_extent(&d, FA_TENSOR_K) == 2 * 100 * 2 * 64);
    CHECK(fa_desc_block_table_entries(&d) == 0);

    const struct {
        desc_edit edit;
        fa_status status;
        const char *needle;
    } cases[] = {
        {e_kv2, FA_ERR_INVALID_ARGUMENT, "kv_cache"},
        {e_page8, FA_ERR_INVALID_ARGUMENT, "page_size"},
        {e_page24, FA_ERR_INVALID_ARGUMENT, "page_size"},
        {e_page272, FA_ERR_INVALID_ARGUMENT, "page_size"},
        {e_page_neg, FA_ERR_INVALID_ARGUMENT, "page_size"},
        {e_pages0, FA_ERR_INVALID_SIZE, "num_pages"},
        {e_pages_contig, FA_ERR_INVALID_ARGUMENT, "num_pages"},
        {e_new_neg, FA_ERR_INVALID_SIZE, "seqlen_new"},
        {e_new_big, FA_ERR_INVALID_SIZE, "seqlen_new"},
        {e_rot_odd, FA_ERR_INVALID_ARGUMENT, "rotary_dim"},
        {e_rot_big, FA_ERR_INVALID_ARGUMENT, "rotary_dim"},
        {e_rot_neg, FA_ERR_INVALID_ARGUMENT, "rotary_dim"},
        {e_inter2, FA_ERR_INVALID_ARGUMENT, "rotary_interleaved"},
        {e_bias, FA_ERR_INVALID_ARGUMENT, "bias"},
        {e_dropout, FA_ERR_INVALID_ARGUMENT, "dropout_p"},
        {e_blocks, FA_ERR_INVALID_ARGUMENT, "block_mask"},
        {e_varlen, FA_ERR_INVALID_ARGUMENT, "cu_seqlens"},
        {e_standard, FA_ERR_INVALID_ARGUMENT, "algorithm"},
        {e_knew_dtype, FA_ERR_DTYPE_MISMATCH, "k_new"},
        {e_vnew_dtype, FA_ERR_DTYPE_MISMATCH, "v_new"},
        {e_knew_unused, FA_ERR_INVALID_ARGUMENT, "k_new"},
        {e_knew_misaligned, FA_ERR_MISALIGNED, "k_new"},
        {e_vnew_overlap, FA_ERR_BAD_STRIDE, "v_new"},
        {e_pool_overlap, FA_ERR_BAD_STRIDE, "k strides overlap"},
        {e_pool_huge, FA_ERR_INVALID_SIZE, "k sizes"},
        {off_page, FA_ERR_INVALID_ARGUMENT, "page_size"},
        {off_pages, FA_ERR_INVALID_ARGUMENT, "num_pages"},
        {off_new, FA_ERR_INVALID_ARGUMENT, "seqlen_new"},
        {off_rot, FA_ERR_INVALID_ARGUMENT, "rotary_dim"},
        {off_inter, FA_ERR_INVALID_ARGUMENT, "rotary_interleaved"},
        {off_knew, FA_ERR_INVALID_ARGUMENT, "k_new"},
        {off_vnew, FA_ERR_INVALID_ARGUMENT, "v_new"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        d = valid_desc();
        cases[i].edit(&d);
        CHECK_FAILS(fa_attention_desc_check(&d), cases[i].status, cases[i].needle);
    }
    /* Without kv_cache and its fields, a plain descriptor is unchanged. */
    d = valid_desc();
    off_page(&d);
    d.page_size = 0;
    CHECK_OK(fa_attention_desc_check(&d));
}

/* ------------------------------------------------------------------------ */
/* fa_forward_kvcache's arguments, through the reference device             */

typedef struct arg_set {
    fa_context ctx;
    fa_attention_desc d;
    fa_plan plan;
    fa_buffer q, k, v, o, lse, lens, bt, kn, vn, cs, sn;
} arg_set;

static fa_buffer zeroed(fa_context ctx, size_t bytes) {
    fa_buffer b = NULL;
    CHECK_OK(fa_buffer_alloc(ctx, bytes, &b));
    void *z = calloc(1, bytes);
    if (b && z) CHECK_OK(fa_buffer_upload(b, 0, z, bytes));
    free(z);
    return b;
}

static void arg_set_init(arg_set *s) {
    memset(s, 0, sizeof *s);
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &s->ctx));
    s->d = valid_desc();
    CHECK_OK(fa_plan_create(s->ctx, &s->d, &s->plan));
    const fa_attention_desc *d = &s->d;
    s->q = zeroed(s->ctx, (size_t)fa_desc_tensor_bytes(d, FA_TENSOR_Q));
    s->k = zeroed(s->ctx, (size_t)fa_desc_tensor_bytes(d, FA_TENSOR_K));
    s->v = zeroed(s->ctx, (size_t)fa_desc_tensor_bytes(d, FA_TENSOR_V));
    s->o = zeroed(s->ctx, (size_t)fa_desc_tensor_bytes(d, FA_TENSOR_O));
    s->lse = zeroed(s->ctx, (size_t)fa_desc_lse_bytes(d));
    s->lens = zeroed(s->ctx, (size_t)d->batch * 4);
    s->bt = zeroed(s->ctx, (size_t)fa_desc_block_table_entries(d) * 4);
    s->kn = zeroed(s->ctx, (size_t)fa_desc_tensor_bytes(d, FA_TENSOR_K_NEW));
    s->vn = zeroed(s->ctx, (size_t)fa_desc_tensor_bytes(d, FA_TENSOR_V_NEW));
    s->cs = zeroed(s->ctx, (size_t)fa_desc_rotary_table_bytes(d));
    s->sn = zeroed(s->ctx, (size_t)fa_desc_rotary_table_bytes(d));
}

static fa_kvcache_args args_of(const arg_set *s) {
    const fa_kvcache_args a = {s->q, s->k, s->v, s->o, s->lse, s->lens, s->bt, s->kn, s->vn, s->cs, s->sn};
    return a;
}

static void arg_set_free(arg_set *s) {
    fa_buffer b[] = {s->q, s->k, s->v, s->o, s->lse, s->lens, s->bt, s->kn, s->vn, s->cs, s->sn};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (b[i]) fa_buffer_free(b[i]);
    if (s->plan) fa_plan_destroy(s->plan);
    if (s->ctx) fa_context_destroy(s->ctx);
}

FA_TEST(argument_checks) {
    arg_set s;
    arg_set_init(&s);
    fa_kvcache_args a = args_of(&s);
    CHECK_OK(fa_forward_kvcache(s.plan, &a));
    a.lse = NULL;
    CHECK_OK(fa_forward_kvcache(s.plan, &a));

    CHECK_FAILS(fa_forward_kvcache(NULL, &a), FA_ERR_NULL_POINTER, "plan");
    CHECK_FAILS(fa_forward_kvcache(s.plan, NULL), FA_ERR_NULL_POINTER, "args");
#define EXPECT(field, value, status, needle)                                                                           \
    do {                                                                                                               \
        a = args_of(&s);                                                                                               \
        a.field = (value);                                                                                             \
        CHECK_FAILS(fa_forward_kvcache(s.plan, &a), status, needle);                                                   \
    } while (0)
    EXPECT(q, NULL, FA_ERR_NULL_POINTER, "q is NULL");
    EXPECT(k_cache, NULL, FA_ERR_NULL_POINTER, "k_cache is NULL");
    EXPECT(o, NULL, FA_ERR_NULL_POINTER, "o is NULL");
    EXPECT(cache_seqlens, NULL, FA_ERR_NULL_POINTER, "cache_seqlens");
    EXPECT(block_table, NULL, FA_ERR_NULL_POINTER, "block_table");
    EXPECT(k_new, NULL, FA_ERR_NULL_POINTER, "k_new");
    EXPECT(v_new, NULL, FA_ERR_NULL_POINTER, "v_new");
    EXPECT(rotary_sin, NULL, FA_ERR_NULL_POINTER, "rotary_sin");
    /* Too small: one element short each. */
    fa_buffer small_lens = zeroed(s.ctx, (size_t)s.d.batch * 4 - 4);
    fa_buffer small_bt = zeroed(s.ctx, (size_t)fa_desc_block_table_entries(&s.d) * 4 - 4);
    fa_buffer small_cos = zeroed(s.ctx, (size_t)fa_desc_rotary_table_bytes(&s.d) - 4);
    fa_buffer small_k = zeroed(s.ctx, (size_t)fa_desc_tensor_bytes(&s.d, FA_TENSOR_K) - 2);
    fa_buffer small_lse = zeroed(s.ctx, (size_t)fa_desc_lse_bytes(&s.d) - 4);
    EXPECT(cache_seqlens, small_lens, FA_ERR_OUT_OF_BOUNDS, "cache_seqlens");
    EXPECT(block_table, small_bt, FA_ERR_OUT_OF_BOUNDS, "block_table");
    EXPECT(rotary_cos, small_cos, FA_ERR_OUT_OF_BOUNDS, "rotary_cos");
    EXPECT(k_cache, small_k, FA_ERR_OUT_OF_BOUNDS, "k_cache");
    EXPECT(lse, small_lse, FA_ERR_OUT_OF_BOUNDS, "lse");
    /* Aliasing: outputs may not share bytes; the caches are outputs while
     * tokens are appended. */
    EXPECT(o, s.q, FA_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT(lse, s.bt, FA_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT(v_cache, s.k, FA_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT(k_new, s.k, FA_ERR_INVALID_ARGUMENT, "overlap");
    /* Inputs may share theirs. */
    a = args_of(&s);
    a.rotary_sin = a.rotary_cos;
    CHECK_OK(fa_forward_kvcache(s.plan, &a));
    /* Another context's buffer. */
    fa_context other = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &other));
    fa_buffer foreign = zeroed(other, (size_t)s.d.batch * 4);
    EXPECT(cache_seqlens, foreign, FA_ERR_FOREIGN_BUFFER, "cache_seqlens");
    fa_buffer_free(foreign);
    fa_context_destroy(other);
    fa_buffer smalls[] = {small_lens, small_bt, small_cos, small_k, small_lse};
    for (size_t i = 0; i < sizeof smalls / sizeof smalls[0]; i++) fa_buffer_free(smalls[i]);

    /* Only the buffers the descriptor asks for. */
    fa_attention_desc plain = s.d;
    plain.page_size = plain.num_pages = 0;
    plain.seqlen_new = 0;
    plain.k_new.dtype = plain.v_new.dtype = FA_DTYPE_F32;
    plain.rotary_dim = plain.rotary_interleaved = 0;
    fa_plan pp = NULL;
    CHECK_OK(fa_plan_create(s.ctx, &plain, &pp));
    fa_buffer kc = zeroed(s.ctx, (size_t)fa_desc_tensor_bytes(&plain, FA_TENSOR_K));
    fa_kvcache_args b = {s.q, kc, kc, s.o, s.lse, s.lens, NULL, NULL, NULL, NULL, NULL};
    /* Without an append the caches are inputs: K and V may be one tensor. */
    CHECK_OK(fa_forward_kvcache(pp, &b));
    b.block_table = s.bt;
    CHECK_FAILS(fa_forward_kvcache(pp, &b), FA_ERR_INVALID_ARGUMENT, "block_table");
    b.block_table = NULL;
    b.k_new = s.kn;
    CHECK_FAILS(fa_forward_kvcache(pp, &b), FA_ERR_INVALID_ARGUMENT, "k_new");
    b.k_new = NULL;
    b.rotary_cos = s.cs;
    CHECK_FAILS(fa_forward_kvcache(pp, &b), FA_ERR_INVALID_ARGUMENT, "rotary_cos");
    fa_buffer_free(kc);
    fa_plan_destroy(pp);

    /* A cache plan runs fa_forward_kvcache only, and only a cache plan
     * runs it. */
    CHECK_FAILS(fa_forward(s.plan, s.q, s.k, s.v, s.o, s.lse), FA_ERR_INVALID_ARGUMENT, "fa_forward_kvcache");
    CHECK_FAILS(fa_backward(s.plan, s.q, s.k, s.v, s.o, s.lse, s.o, s.q, s.k, s.v), FA_ERR_INVALID_ARGUMENT,
                "fa_forward_kvcache");
    fa_attention_desc none;
    fa_attention_desc_init(&none);
    none.batch = 1;
    none.seqlen_q = none.seqlen_k = 16;
    none.heads_q = none.heads_kv = 1;
    none.head_dim = 64;
    fa_plan np = NULL;
    CHECK_OK(fa_plan_create(s.ctx, &none, &np));
    a = args_of(&s);
    CHECK_FAILS(fa_forward_kvcache(np, &a), FA_ERR_INVALID_ARGUMENT, "kv_cache = 0");
    fa_plan_destroy(np);
    arg_set_free(&s);
#undef EXPECT
}

/* ------------------------------------------------------------------------ */
/* Plans on described devices                                               */

static fa_attention_desc decode_desc(fa_dtype t, int page_size, int batch, int cache) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = batch;
    d.seqlen_q = 1;
    d.seqlen_k = cache;
    d.heads_q = 32;
    d.heads_kv = 4;
    d.head_dim = 128;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t;
    d.kv_cache = 1;
    d.page_size = page_size;
    d.num_pages = page_size ? batch * (cache / page_size) : 0;
    d.seqlen_new = 1;
    d.k_new.dtype = d.v_new.dtype = t;
    return d;
}

FA_TEST(plans) {
    for (int i = 0; i < fa_described_device_count(); i++) {
        const fa_described_device *dev = fa_described_device_get(i);
        for (int t = 0; t < 3; t++) {
            const fa_dtype dt = (fa_dtype)t;
            const fa_attention_desc d = decode_desc(dt, 64, 1, 65536);
            fa_plan_info a, b;
            CHECK_OK(fa_plan_for_device(&dev->desc, &d, &a));
            CHECK_OK(fa_plan_for_device(&dev->desc, &d, &b));
            CHECK_MSG(memcmp(&a, &b, sizeof a) == 0, "%s: the same step planned twice differs", dev->key);
            CHECK(a.kv_cache == 1);
            const fa_kernel_plan *f = &a.forward;
            /* The variant: CUDA's decoding kernel on its matrix units for
             * fp16 / bf16, packed SIMT tiles elsewhere. */
            const int cuda_mma = dev->desc.backend == FA_BACKEND_CUDA && dev->desc.matrix_m == 16 && dt != FA_DTYPE_F32;
            if (cuda_mma)
                CHECK_MSG(f->variant == FA_VARIANT_DECODE, "%s %s: variant %s", dev->key, fa_dtype_name(dt),
                          fa_variant_name(f->variant));
            else
                CHECK_MSG(f->variant == FA_VARIANT_SPLITK || f->variant == FA_VARIANT_SIMT, "%s %s: variant %s",
                          dev->key, fa_dtype_name(dt), fa_variant_name(f->variant));
            /* Batch 1 fills the device: the KV heads alone give 4
             * work-groups, the key splits the rest. */
            const int64_t unsplit = (int64_t)d.batch * d.heads_kv * fa_kvcache_row_tiles(&d, f->br);
            CHECK_MSG((unsplit >= dev->desc.compute_units || f->split_k > 1) &&
                          2 * f->num_work_groups >= dev->desc.compute_units,
                      "%s %s: %d splits, %d work-groups on %d compute units", dev->key, fa_dtype_name(dt), f->split_k,
                      f->num_work_groups, dev->desc.compute_units);
            CHECK(f->num_work_groups == d.batch * d.heads_kv * fa_kvcache_row_tiles(&d, f->br) * f->split_k);
            /* K and V once per KV head: the cache's bytes, and not the
             * eight times more that reading them per query head takes. */
            const double e = (double)fa_dtype_size(dt);
            const double cache_bytes = 2.0 * d.heads_kv * (double)d.seqlen_k * d.head_dim * e;
            CHECK_MSG(f->cost.hbm_read_bytes >= cache_bytes && f->cost.hbm_read_bytes < 1.1 * cache_bytes,
                      "%s %s: %.3g bytes read for a cache of %.3g", dev->key, fa_dtype_name(dt),
                      f->cost.hbm_read_bytes, cache_bytes);
            /* Pages change no bytes but the block table's. */
            fa_attention_desc c = d;
            c.page_size = c.num_pages = 0;
            fa_plan_info pc;
            CHECK_OK(fa_plan_for_device(&dev->desc, &c, &pc));
            CHECK(pc.forward.variant == f->variant && pc.forward.split_k == f->split_k);
            CHECK_NEAR(f->cost.hbm_read_bytes - pc.forward.cost.hbm_read_bytes,
                       4.0 * (double)fa_desc_block_table_entries(&d), 1e-6);
            CHECK(f->cost.hbm_write_bytes == pc.forward.cost.hbm_write_bytes);
            char text[2048];
            fa_plan_info_format(&a, text, sizeof text);
            CHECK_MSG(strstr(text, "KV-cache") && strstr(text, fa_variant_name(f->variant)), "%s", text);
        }
    }
    /* A cache plan's rows are the group's: 4 queries of 8 heads a KV head
     * take 32 rows, in one tile where the tiles allow. */
    const fa_described_device *h100 = fa_described_device_find("h100");
    CHECK(h100 != NULL);
    if (h100) {
        fa_attention_desc d = decode_desc(FA_DTYPE_BF16, 0, 8, 4096);
        d.seqlen_q = d.seqlen_new = 4;
        d.causal = 1;
        fa_plan_info a;
        CHECK_OK(fa_plan_for_device(&h100->desc, &d, &a));
        CHECK(a.forward.variant == FA_VARIANT_DECODE && a.forward.br >= 32);
        /* A plain decoding descriptor (no cache) keeps its own choice. */
        fa_attention_desc p = d;
        p.kv_cache = 0;
        p.seqlen_new = 0;
        p.k_new.dtype = p.v_new.dtype = FA_DTYPE_F32;
        fa_plan_info b;
        CHECK_OK(fa_plan_for_device(&h100->desc, &p, &b));
        CHECK(b.kv_cache == 0 && b.backward.br > 0);
    }
}

/* A described device may claim any positive SIMD width: the step's
 * planner compares work-group sizes with four SIMD groups of it, which
 * overflowed int (UBSan) for widths past INT_MAX / 4. It plans, as the
 * attention planner does, or refuses the device with a message. */
FA_TEST(plans_on_extreme_simd_widths) {
    const fa_described_device *base = fa_described_device_find("h100");
    CHECK(base != NULL);
    if (!base) return;
    const int widths[] = {INT_MAX / 4 + 1, 1869152255, INT_MAX};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        fa_device_desc dev = base->desc;
        dev.simd_width = widths[i];
        const fa_attention_desc d = decode_desc(FA_DTYPE_F32, 16, 2, 64);
        fa_plan_info info;
        const fa_status st = fa_plan_for_device(&dev, &d, &info);
        CHECK_MSG(st == FA_SUCCESS || (st != FA_ERR_INTERNAL && fa_last_error()[0] != '\0'),
                  "simd_width %d: %s (%s)", widths[i], fa_status_string(st), fa_last_error());
    }
}

/* CUDA's decoding kernel runs blocks of FA_DECODE_WARPS warps: on a
 * described CUDA device that allows fewer threads a block, a step (and a
 * plain decoding forward) planned it anyway, a work-group past the
 * device's limit. They take tiles within the limit instead. */
FA_TEST(plans_within_work_group_limit) {
    const fa_described_device *base = fa_described_device_find("h100");
    CHECK(base != NULL);
    if (!base) return;
    for (int limit = 32; limit <= 256; limit *= 2) {
        fa_device_desc dev = base->desc;
        dev.max_work_group_size = limit;
        for (int kv = 0; kv < 2; kv++) {
            fa_attention_desc d = decode_desc(FA_DTYPE_F16, 16, 1, 4096);
            if (!kv) {
                d.kv_cache = d.page_size = d.num_pages = d.seqlen_new = 0;
                d.k_new.dtype = d.v_new.dtype = FA_DTYPE_F32;
            }
            fa_plan_info info;
            CHECK_OK(fa_plan_for_device(&dev, &d, &info));
            CHECK_MSG(info.forward.work_group_size <= limit, "%s, limit %d: %s work-group of %d",
                      kv ? "step" : "decoding", limit, fa_variant_name(info.forward.variant),
                      info.forward.work_group_size);
            if (limit >= FA_DECODE_WARPS * 32) CHECK(info.forward.variant == FA_VARIANT_DECODE);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Steps through the reference backend (every device: test_kvcache.c)       */

FA_TEST(reference_backend_steps) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    kv_case c[3];
    c[0] = kv_case_default("paged 16, rotary 16, causal, GQA 2:1, three tokens, bf16");
    c[0].dtype = FA_DTYPE_BF16;
    c[0].page_size = 16;
    c[0].seqlen_k = 70;
    c[0].rotary_dim = 16;
    c[0].causal = 1;
    c[0].seqlen_q = c[0].seqlen_new = 3;
    c[0].batch = 3;
    c[1] = kv_case_default("invalid lengths and pages among valid sequences");
    c[1].page_size = 16;
    c[1].seqlen_k = 64;
    c[1].batch = 4;
    c[1].lens[0] = 3;
    c[1].lens[1] = 9;
    c[1].lens[2] = 40;
    c[1].lens[3] = 10;
    c[1].invalid = 0x7u;
    c[2] = kv_case_default("strided, softcap and ALiBi, no lse, fp32");
    c[2].dtype = FA_DTYPE_F32;
    c[2].strided = 1;
    c[2].softcap = 4.0f;
    c[2].alibi = 1;
    c[2].no_lse = 1;
    c[2].batch = 2;
    for (int i = 0; i < 3; i++) CHECK(kv_case_run(ctx, &c[i]) == KV_PASSED);
    fa_context_destroy(ctx);
}

FA_TEST_MAIN(FA_CASE(reference_matches_definition), FA_CASE(reference_validity_rules), FA_CASE(descriptor_checks),
             FA_CASE(argument_checks), FA_CASE(plans), FA_CASE(plans_on_extreme_simd_widths),
             FA_CASE(plans_within_work_group_limit),
             FA_CASE(reference_backend_steps))
