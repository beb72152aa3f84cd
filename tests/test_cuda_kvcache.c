/* The CUDA KV-cache step (kernels_cuda/decode.cu built with KV_CACHE)
 * through fa_forward_kvcache on the best CUDA device, against a host oracle
 * of its own: each sequence's cache after the step's append (new keys
 * rotated and rounded to the dtype as the kernel stores them), its rotated
 * queries rounded the same way, then the fp64 reference (fa_ref_forward) on
 * that one sequence. Beyond the device-generic tests/test_kvcache.c it
 * looks at what these kernels do their own way (the tensor-core step for
 * fp16/bf16 at head dims that are multiples of 16, the FP32-pipe step,
 * kernels_cuda/kvcache_simt.cu, for the rest): key tiles that straddle pages
 * at page sizes that do and do not divide the 64-key tile, split merges
 * that meet a NaN partial (a bad page in one split's share of the page
 * check), block-table entries past a sequence's pages that hold garbage,
 * row tiles beside the one that appends, the whole cache after the step
 * (new rows where they belong, every other element untouched), repeated
 * steps on one plan, and nothing written for a sequence whose lengths break
 * the rules. Outputs are poisoned with a finite value first, so NaN rows
 * must be written, not left.
 *
 * fa-test-labels: device */
#include "harness.h"
#include "test_util.h"

#include "dtype.h"
#include "fa_internal.h"
#include "flashattn.h"
#include "plan.h"
#include "reference.h"

#ifdef FA_WITH_CUDA
#include "backends/cuda/cuda_runtime_internal.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fa_context g_ctx;
static char g_skip[512];

static fa_context test_context(void) {
#ifdef FA_WITH_CUDA
    if (g_ctx) return g_ctx;
    fa_status st = fa_context_create(FA_BACKEND_CUDA, -1, &g_ctx);
    if (st != FA_SUCCESS) {
        snprintf(g_skip, sizeof g_skip, "no CUDA device: %s (%s)", fa_status_string(st), fa_last_error());
        g_ctx = NULL;
        return NULL;
    }
    char why[256];
    if (!fa_cuda_nvrtc_available(why, sizeof why)) {
        snprintf(g_skip, sizeof g_skip, "a CUDA device but no NVRTC to compile kernels: %s", why);
        fa_context_destroy(g_ctx);
        g_ctx = NULL;
        return NULL;
    }
    fa_device_info info;
    int major = 0, minor = 0;
    if (fa_context_get_info(g_ctx, &info) != FA_SUCCESS || sscanf(info.desc.arch, "sm_%1d%d", &major, &minor) != 2 ||
        major < 8) {
        snprintf(g_skip, sizeof g_skip, "the KV-cache step runs on the tensor-core decoding kernel: sm_80 or later");
        fa_context_destroy(g_ctx);
        g_ctx = NULL;
    }
    return g_ctx;
#else
    snprintf(g_skip, sizeof g_skip, "the CUDA backend is not built into this library");
    return NULL;
#endif
}

#define REQUIRE_DEVICE()                                                                   \
    do {                                                                                   \
        if (!test_context()) FA_SKIP(g_skip);                                              \
    } while (0)

/* The value every output element holds before a step: finite, so a NaN
 * row the kernel must write cannot be a leftover. */
#define POISON 77.0

/* ------------------------------------------------------------------------ */
/* Cases                                                                     */

#define MAX_BATCH 64
#define NO_BAD (-1)

typedef struct kv_case {
    const char *name;
    fa_dtype dtype;
    int batch, seqlen_q, capacity, heads_q, heads_kv, dim;
    int page_size, seqlen_new;
    int rotary_dim, interleaved, causal, window_left, window_right;
    float softcap;
    int alibi;
    int lens[MAX_BATCH];     /* cache_seqlens */
    int bad_entry[MAX_BATCH]; /* a block-table entry of the sequence's pages set outside the pool; NO_BAD none */
    int no_lse;
    int steps;               /* steps on one plan, each after the last one's append */
    int min_splits;          /* the plan's key splits at least this many (0: any) */
    int meet;                /* CUDA: 1 the splits must meet (decode.cu meet_splits), 0 either */
} kv_case;

/* A case with every sequence's bad_entry NO_BAD and the given lengths
 * (n of them; the rest of the batch cycles through them). */
static kv_case base_case(const char *name, fa_dtype dt, int batch, int seqlen_q, int capacity, int heads_q,
                         int heads_kv, int dim, const int *lens, int n) {
    kv_case c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.dtype = dt;
    c.batch = batch;
    c.seqlen_q = seqlen_q;
    c.capacity = capacity;
    c.heads_q = heads_q;
    c.heads_kv = heads_kv;
    c.dim = dim;
    c.window_left = c.window_right = -1;
    c.steps = 1;
    for (int b = 0; b < batch && b < MAX_BATCH; b++) {
        c.lens[b] = lens[b % n];
        c.bad_entry[b] = NO_BAD;
    }
    return c;
}

static double tol_for(fa_dtype t) { return t == FA_DTYPE_F32 ? 2e-5 : t == FA_DTYPE_F16 ? 3e-3 : 2e-2; }

/* ------------------------------------------------------------------------ */
/* Host oracle                                                               */

typedef struct kv_host {
    int pages_total;       /* pool pages (paged) */
    int max_pages;         /* block-table row */
    size_t es;             /* element bytes */
    int64_t q_n, pool_n, new_n, o_n, l_n, tab_n, rot_n;
    void *q, *k_pool, *v_pool, *k_new, *v_new;
    int32_t *lens, *table;
    float *cos_t, *sin_t;
    float *slopes;
} kv_host;

static int64_t row_elems(const kv_case *c) { return (int64_t)c->heads_kv * c->dim; }

/* Element index of (sequence b, token j, KV head h, dim 0) in the cache
 * (through the block table), or -1 where the page is outside the pool. */
static int64_t cache_index(const kv_case *c, const kv_host *h, int b, int j, int kh) {
    if (c->page_size == 0) return ((int64_t)b * c->capacity + j) * row_elems(c) + (int64_t)kh * c->dim;
    const int32_t pg = h->table[(int64_t)b * h->max_pages + j / c->page_size];
    if (pg < 0 || pg >= h->pages_total) return -1;
    return ((int64_t)pg * c->page_size + j % c->page_size) * row_elems(c) + (int64_t)kh * c->dim;
}

/* The kernel's rotation (kvcache.cuh rotary8), in fp32 with its fused
 * multiply-adds, of row src (dim elements) at position pos, rounded to the
 * dtype into dst at index di. */
static void rotate_row(const kv_case *c, const kv_host *h, const void *src, int64_t si, void *dst, int64_t di,
                       int pos) {
    const int rd = c->rotary_dim, half = rd / 2;
    for (int x = 0; x < c->dim; x++) {
        const float own = (float)fa_load_elem(src, c->dtype, si + x);
        float r = own;
        if (x < rd) {
            if (c->interleaved) {
                const int i = x / 2;
                const float cs = h->cos_t[(int64_t)pos * half + i], sn = h->sin_t[(int64_t)pos * half + i];
                if (x % 2 == 0) {
                    const float b = (float)fa_load_elem(src, c->dtype, si + x + 1);
                    r = fmaf(own, cs, -(b * sn));
                } else {
                    const float a = (float)fa_load_elem(src, c->dtype, si + x - 1);
                    r = fmaf(a, sn, own * cs);
                }
            } else {
                const int first = x < half, i = first ? x : x - half;
                const float cs = h->cos_t[(int64_t)pos * half + i], sn = h->sin_t[(int64_t)pos * half + i];
                const float other = (float)fa_load_elem(src, c->dtype, si + (first ? x + half : i));
                r = first ? fmaf(own, cs, -(other * sn)) : fmaf(other, sn, own * cs);
            }
        }
        fa_store_elem(dst, c->dtype, di + x, (double)r);
    }
}

static int rot_pos_ok(const kv_case *c, int cs) {
    if (c->rotary_dim == 0) return 1;
    const int last = c->causal || c->window_left >= 0 || c->window_right >= 0 ? cs + c->seqlen_q - 1 : cs;
    return last < c->capacity;
}

static int lengths_ok(const kv_case *c, int cs) {
    return cs >= 0 && cs <= c->capacity - c->seqlen_new && rot_pos_ok(c, cs);
}

static int pages_ok(const kv_case *c, const kv_host *h, int b, int len_k) {
    if (c->page_size == 0) return 1;
    const int npg = (len_k + c->page_size - 1) / c->page_size;
    for (int i = 0; i < npg; i++) {
        const int32_t pg = h->table[(int64_t)b * h->max_pages + i];
        if (pg < 0 || pg >= h->pages_total) return 0;
    }
    return 1;
}

/* The cache after a step: the new rows written for every sequence that
 * keeps the rules (one that breaks them appends nothing). */
static void append_expected(const kv_case *c, const kv_host *h, void *k_pool, void *v_pool) {
    for (int b = 0; b < c->batch; b++) {
        const int cs = h->lens[b];
        if (!lengths_ok(c, cs) || !pages_ok(c, h, b, cs + c->seqlen_new)) continue;
        for (int n = 0; n < c->seqlen_new; n++)
            for (int kh = 0; kh < c->heads_kv; kh++) {
                const int64_t dst = cache_index(c, h, b, cs + n, kh);
                const int64_t src = ((int64_t)b * c->seqlen_new + n) * row_elems(c) + (int64_t)kh * c->dim;
                if (c->rotary_dim > 0)
                    rotate_row(c, h, h->k_new, src, k_pool, dst, cs + n);
                else
                    memcpy((char *)k_pool + dst * h->es, (const char *)h->k_new + src * h->es, (size_t)c->dim * h->es);
                memcpy((char *)v_pool + dst * h->es, (const char *)h->v_new + src * h->es, (size_t)c->dim * h->es);
            }
    }
}

/* Sequence b's expected O [seqlen_q, heads_q, dim] and L [heads_q,
 * seqlen_q] from the cache after the step (k_pool, v_pool). */
static void expected_sequence(const kv_case *c, const kv_host *h, const void *k_pool, const void *v_pool, int b,
                              void *o, float *l) {
    const int sq = c->seqlen_q, hq = c->heads_q, dim = c->dim, cs = h->lens[b];
    const int64_t on = (int64_t)sq * hq * dim, ln = (int64_t)hq * sq;
    const int valid = lengths_ok(c, cs) && pages_ok(c, h, b, cs + c->seqlen_new);
    if (!valid) {
        for (int64_t i = 0; i < on; i++) fa_store_elem(o, c->dtype, i, NAN);
        for (int64_t i = 0; i < ln; i++) l[i] = NAN;
        return;
    }
    const int len_k = cs + c->seqlen_new;
    if (len_k == 0) {
        for (int64_t i = 0; i < on; i++) fa_store_elem(o, c->dtype, i, 0.0);
        for (int64_t i = 0; i < ln; i++) l[i] = -INFINITY;
        return;
    }
    void *q = malloc((size_t)on * h->es), *k = malloc((size_t)len_k * row_elems(c) * h->es),
         *v = malloc((size_t)len_k * row_elems(c) * h->es);
    CHECK(q && k && v);
    if (q && k && v) {
        const int64_t q0 = (int64_t)b * on;
        const int rope_causal = c->causal || c->window_left >= 0 || c->window_right >= 0;
        for (int i = 0; i < sq; i++)
            for (int head = 0; head < hq; head++) {
                const int64_t at = ((int64_t)i * hq + head) * dim;
                if (c->rotary_dim > 0)
                    rotate_row(c, h, h->q, q0 + at, q, at, rope_causal ? cs + i : cs);
                else
                    memcpy((char *)q + at * h->es, (const char *)h->q + (q0 + at) * h->es, (size_t)dim * h->es);
            }
        for (int j = 0; j < len_k; j++)
            for (int kh = 0; kh < c->heads_kv; kh++) {
                const int64_t src = cache_index(c, h, b, j, kh), at = (int64_t)j * row_elems(c) + (int64_t)kh * dim;
                memcpy((char *)k + at * h->es, (const char *)k_pool + src * h->es, (size_t)dim * h->es);
                memcpy((char *)v + at * h->es, (const char *)v_pool + src * h->es, (size_t)dim * h->es);
            }
        fa_attention_desc d;
        fa_attention_desc_init(&d);
        d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = c->dtype;
        d.batch = 1;
        d.seqlen_q = sq;
        d.seqlen_k = len_k;
        d.heads_q = hq;
        d.heads_kv = c->heads_kv;
        d.head_dim = dim;
        d.causal = c->causal;
        d.window_left = c->window_left;
        d.window_right = c->window_right;
        d.softcap = c->softcap;
        d.alibi_slopes = c->alibi ? h->slopes : NULL;
        CHECK_OK(fa_ref_forward(&d, q, k, v, o, l));
    }
    free(q);
    free(k);
    free(v);
}

/* ------------------------------------------------------------------------ */
/* One case                                                                  */

static void fill_random(fa_rng *rng, fa_dtype dt, void *dst, int64_t n) {
    void *r = fa_test_random_tensor(rng, dt, n);
    CHECK(r != NULL);
    if (r) memcpy(dst, r, (size_t)n * fa_dtype_size(dt));
    free(r);
}

static int64_t elem_bits(const void *p, size_t es, int64_t i) {
    return es == 2 ? ((const uint16_t *)p)[i] : (int64_t)((const uint32_t *)p)[i];
}

/* got against want over a cache pool: V (exact = 0) bit for bit, K within
 * one unit in the last place (exact = 0: a rotated key may round its fp32
 * products differently from the host's). Returns the elements that differ
 * beyond that. */
static int64_t pool_diff(const kv_case *c, const void *got, const void *want, int64_t n, int exact) {
    const size_t es = fa_dtype_size(c->dtype);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (elem_bits(got, es, i) == elem_bits(want, es, i)) continue;
        if (exact) {
            bad++;
            continue;
        }
        const double g = fa_load_elem(got, c->dtype, i), w = fa_load_elem(want, c->dtype, i);
        const double ulp = ldexp(fabs(w), c->dtype == FA_DTYPE_F32 ? -22 : c->dtype == FA_DTYPE_F16 ? -10 : -7);
        if (!(fabs(g - w) <= ulp)) bad++;
    }
    return bad;
}

static void run_kv_case(const kv_case *c) {
    fa_context ctx = g_ctx;
    const fa_dtype dt = c->dtype;
    fa_rng rng;
    uint64_t seed = 1469598103934665603ull;
    for (const char *s = c->name; *s; s++) seed = (seed ^ (uint8_t)*s) * 1099511628211ull;
    fa_rng_seed(&rng, seed);

    kv_host h;
    memset(&h, 0, sizeof h);
    h.es = fa_dtype_size(dt);
    const int P = c->page_size;
    h.max_pages = P ? (c->capacity + P - 1) / P : 0;
    /* Every sequence's pages over all steps, and some the table never names. */
    h.pages_total = P ? c->batch * h.max_pages + 7 : 0;
    h.q_n = (int64_t)c->batch * c->seqlen_q * c->heads_q * c->dim;
    h.pool_n = P ? (int64_t)h.pages_total * P * row_elems(c) : (int64_t)c->batch * c->capacity * row_elems(c);
    h.new_n = (int64_t)c->batch * c->seqlen_new * row_elems(c);
    h.o_n = h.q_n;
    h.l_n = (int64_t)c->batch * c->heads_q * c->seqlen_q;
    h.tab_n = P ? (int64_t)c->batch * h.max_pages : 1;
    h.rot_n = c->rotary_dim ? (int64_t)c->capacity * (c->rotary_dim / 2) : 1;
    const size_t qb = (size_t)h.q_n * h.es, pb = (size_t)h.pool_n * h.es, nb = (size_t)(h.new_n ? h.new_n : 1) * h.es;
    h.q = malloc(qb);
    h.k_pool = malloc(pb);
    h.v_pool = malloc(pb);
    h.k_new = malloc(nb);
    h.v_new = malloc(nb);
    h.lens = malloc((size_t)c->batch * sizeof(int32_t));
    h.table = malloc((size_t)h.tab_n * sizeof(int32_t));
    h.cos_t = malloc((size_t)h.rot_n * sizeof(float));
    h.sin_t = malloc((size_t)h.rot_n * sizeof(float));
    h.slopes = malloc((size_t)c->heads_q * sizeof(float));
    void *o = malloc(qb), *o_want = malloc(qb), *k_got = malloc(pb), *v_got = malloc(pb), *k_want = malloc(pb),
         *v_want = malloc(pb);
    float *l = malloc((size_t)h.l_n * sizeof(float)), *l_want = malloc((size_t)h.l_n * sizeof(float));
    int ok = h.q && h.k_pool && h.v_pool && h.k_new && h.v_new && h.lens && h.table && h.cos_t && h.sin_t &&
             h.slopes && o && o_want && k_got && v_got && k_want && v_want && l && l_want;
    CHECK_MSG(ok, "%s: host allocation failed", c->name);

    fa_buffer bq = NULL, bk = NULL, bv = NULL, bo = NULL, bl = NULL, blen = NULL, btab = NULL, bkn = NULL,
              bvn = NULL, bcos = NULL, bsin = NULL;
    fa_plan plan = NULL;
    if (!ok) goto done;

    /* Inputs: random tensors; pages handed out shuffled; table entries
     * past a sequence's pages set to garbage (they must not matter). */
    fill_random(&rng, dt, h.q, h.q_n);
    fill_random(&rng, dt, h.k_pool, h.pool_n);
    fill_random(&rng, dt, h.v_pool, h.pool_n);
    for (int b = 0; b < c->batch; b++) h.lens[b] = c->lens[b];
    if (P) {
        int32_t *perm = malloc((size_t)h.pages_total * sizeof(int32_t));
        CHECK(perm != NULL);
        if (!perm) goto done;
        for (int i = 0; i < h.pages_total; i++) perm[i] = i;
        for (int i = h.pages_total - 1; i > 0; i--) {
            const int j = (int)(fa_rng_next(&rng) % (uint64_t)(i + 1));
            const int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        int next = 0;
        for (int b = 0; b < c->batch; b++) {
            /* Pages for every step's tokens; garbage past them. */
            const int cs = c->lens[b] > 0 ? c->lens[b] : 0;
            int64_t last = (int64_t)cs + (int64_t)c->steps * c->seqlen_new;
            if (last > c->capacity) last = c->capacity;
            const int need = (int)((last + P - 1) / P);
            for (int i = 0; i < h.max_pages; i++)
                h.table[(int64_t)b * h.max_pages + i] = i < need ? perm[next++] : (i % 2 ? -1 : h.pages_total + 1000);
            if (c->bad_entry[b] != NO_BAD)
                h.table[(int64_t)b * h.max_pages + c->bad_entry[b]] = c->bad_entry[b] % 2 ? -3 : h.pages_total;
        }
        free(perm);
    }
    if (c->rotary_dim) {
        const int half = c->rotary_dim / 2;
        for (int pos = 0; pos < c->capacity; pos++)
            for (int i = 0; i < half; i++) {
                const double a = pos * pow(10000.0, -2.0 * i / c->rotary_dim);
                h.cos_t[(int64_t)pos * half + i] = (float)cos(a);
                h.sin_t[(int64_t)pos * half + i] = (float)sin(a);
            }
    }
    for (int i = 0; i < c->heads_q; i++) h.slopes[i] = (float)pow(2.0, -8.0 * (i + 1) / c->heads_q);

    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dt;
    if (c->seqlen_new > 0) d.k_new.dtype = d.v_new.dtype = dt; /* unset where nothing is appended */
    d.batch = c->batch;
    d.seqlen_q = c->seqlen_q;
    d.seqlen_k = c->capacity;
    d.heads_q = c->heads_q;
    d.heads_kv = c->heads_kv;
    d.head_dim = c->dim;
    d.causal = c->causal;
    d.window_left = c->window_left;
    d.window_right = c->window_right;
    d.softcap = c->softcap;
    d.alibi_slopes = c->alibi ? h.slopes : NULL;
    d.kv_cache = 1;
    d.page_size = P;
    d.num_pages = h.pages_total;
    d.seqlen_new = c->seqlen_new;
    d.rotary_dim = c->rotary_dim;
    d.rotary_interleaved = c->interleaved;
    fa_status st = fa_plan_create(ctx, &d, &plan);
    CHECK_MSG(st == FA_SUCCESS, "%s: fa_plan_create: %s (%s)", c->name, fa_status_string(st), fa_last_error());
    if (st != FA_SUCCESS) goto done;
    fa_plan_info info;
    CHECK_OK(fa_plan_get_info(plan, &info));
    const int tensor_cores = dt != FA_DTYPE_F32 && c->dim % 16 == 0;
    CHECK_MSG((info.forward.variant == FA_VARIANT_DECODE) == tensor_cores, "%s: the cache step planned on %s",
              c->name, fa_variant_name(info.forward.variant));
    printf("%-44s %s, %d x %d tile, %d stages, %d splits\n", c->name, fa_variant_name(info.forward.variant),
           info.forward.br, info.forward.bc, info.forward.stages, info.forward.split_k);
    CHECK_MSG(info.forward.split_k >= c->min_splits, "%s: %d splits, expected at least %d", c->name,
              info.forward.split_k, c->min_splits);
#ifdef FA_WITH_CUDA
    if (c->meet)
        CHECK_MSG(fa_cuda_plan_splits_meet(plan->impl) == 1, "%s: the splits do not meet", c->name);
#endif

    ok = fa_buffer_alloc(ctx, qb, &bq) == FA_SUCCESS && fa_buffer_alloc(ctx, pb, &bk) == FA_SUCCESS &&
         fa_buffer_alloc(ctx, pb, &bv) == FA_SUCCESS && fa_buffer_alloc(ctx, qb, &bo) == FA_SUCCESS &&
         fa_buffer_alloc(ctx, (size_t)h.l_n * sizeof(float), &bl) == FA_SUCCESS &&
         fa_buffer_alloc(ctx, (size_t)c->batch * sizeof(int32_t), &blen) == FA_SUCCESS;
    if (ok && P) ok = fa_buffer_alloc(ctx, (size_t)h.tab_n * sizeof(int32_t), &btab) == FA_SUCCESS;
    if (ok && c->seqlen_new)
        ok = fa_buffer_alloc(ctx, nb, &bkn) == FA_SUCCESS && fa_buffer_alloc(ctx, nb, &bvn) == FA_SUCCESS;
    if (ok && c->rotary_dim)
        ok = fa_buffer_alloc(ctx, (size_t)h.rot_n * sizeof(float), &bcos) == FA_SUCCESS &&
             fa_buffer_alloc(ctx, (size_t)h.rot_n * sizeof(float), &bsin) == FA_SUCCESS;
    CHECK_MSG(ok, "%s: device allocation failed (%s)", c->name, fa_last_error());
    if (!ok) goto done;
    CHECK_OK(fa_buffer_upload(bq, 0, h.q, qb));
    CHECK_OK(fa_buffer_upload(bk, 0, h.k_pool, pb));
    CHECK_OK(fa_buffer_upload(bv, 0, h.v_pool, pb));
    if (btab) CHECK_OK(fa_buffer_upload(btab, 0, h.table, (size_t)h.tab_n * sizeof(int32_t)));
    if (bcos) {
        CHECK_OK(fa_buffer_upload(bcos, 0, h.cos_t, (size_t)h.rot_n * sizeof(float)));
        CHECK_OK(fa_buffer_upload(bsin, 0, h.sin_t, (size_t)h.rot_n * sizeof(float)));
    }
    memcpy(k_want, h.k_pool, pb);
    memcpy(v_want, h.v_pool, pb);

    for (int step = 0; step < c->steps; step++) {
        char what[160];
        /* This step's new tokens and lengths. */
        if (c->seqlen_new) {
            fill_random(&rng, dt, h.k_new, h.new_n);
            fill_random(&rng, dt, h.v_new, h.new_n);
            CHECK_OK(fa_buffer_upload(bkn, 0, h.k_new, nb));
            CHECK_OK(fa_buffer_upload(bvn, 0, h.v_new, nb));
        }
        CHECK_OK(fa_buffer_upload(blen, 0, h.lens, (size_t)c->batch * sizeof(int32_t)));
        for (int64_t i = 0; i < h.o_n; i++) fa_store_elem(o, dt, i, POISON);
        for (int64_t i = 0; i < h.l_n; i++) l[i] = (float)POISON;
        CHECK_OK(fa_buffer_upload(bo, 0, o, qb));
        CHECK_OK(fa_buffer_upload(bl, 0, l, (size_t)h.l_n * sizeof(float)));
        const fa_kvcache_args args = {.q = bq,
                                      .k_cache = bk,
                                      .v_cache = bv,
                                      .o = bo,
                                      .lse = c->no_lse ? NULL : bl,
                                      .cache_seqlens = blen,
                                      .block_table = btab,
                                      .k_new = bkn,
                                      .v_new = bvn,
                                      .rotary_cos = bcos,
                                      .rotary_sin = bsin};
        st = fa_forward_kvcache(plan, &args);
        CHECK_MSG(st == FA_SUCCESS, "%s step %d: fa_forward_kvcache: %s (%s)", c->name, step, fa_status_string(st),
                  fa_last_error());
        if (st != FA_SUCCESS) break;
        CHECK_OK(fa_context_synchronize(ctx));
        CHECK_OK(fa_buffer_download(bo, 0, o, qb));
        CHECK_OK(fa_buffer_download(bl, 0, l, (size_t)h.l_n * sizeof(float)));
        CHECK_OK(fa_buffer_download(bk, 0, k_got, pb));
        CHECK_OK(fa_buffer_download(bv, 0, v_got, pb));

        /* The cache: the new rows where they belong, nothing else moved. */
        append_expected(c, &h, k_want, v_want);
        const int64_t kd = pool_diff(c, k_got, k_want, h.pool_n, 0), vd = pool_diff(c, v_got, v_want, h.pool_n, 1);
        CHECK_MSG(kd == 0 && vd == 0, "%s step %d: %lld K and %lld V cache elements differ from the expected cache",
                  c->name, step, (long long)kd, (long long)vd);

        /* Each sequence against the oracle on the expected cache. */
        const int64_t on = (int64_t)c->seqlen_q * c->heads_q * c->dim, ln = (int64_t)c->heads_q * c->seqlen_q;
        for (int b = 0; b < c->batch; b++) {
            expected_sequence(c, &h, k_want, v_want, b, (char *)o_want + (size_t)(b * on) * h.es, l_want + b * ln);
            const fa_test_diff od = fa_test_compare((char *)o + (size_t)(b * on) * h.es,
                                                    (char *)o_want + (size_t)(b * on) * h.es, dt, on);
            snprintf(what, sizeof what, "%s step %d sequence %d (cache %d, %s)", c->name, step, b, h.lens[b],
                     lengths_ok(c, h.lens[b]) && pages_ok(c, &h, b, h.lens[b] + c->seqlen_new) ? "valid"
                                                                                               : "breaks the rules");
            CHECK_MSG(fa_test_within(&od, tol_for(dt)),
                      "%s: O %lld elements mismatched (NaN, inf or left poisoned), error %.3g of %.3g", what,
                      (long long)od.mismatched, od.diff_norm, od.ref_norm);
            if (c->no_lse) continue;
            int64_t lbad = 0;
            for (int64_t i = 0; i < ln; i++) {
                const float g = l[b * ln + i], w = l_want[b * ln + i];
                if (isnan(w) ? !isnan(g) : isinf(w) ? g != w : !(fabs((double)g - w) <= tol_for(dt) * (1.0 + fabs(w))))
                    lbad++;
            }
            CHECK_MSG(lbad == 0, "%s: %lld of %lld L values differ", what, (long long)lbad, (long long)ln);
        }
        if (c->no_lse) {
            /* lse NULL: the L buffer is not the step's and keeps its values. */
            int64_t touched = 0;
            for (int64_t i = 0; i < h.l_n; i++) touched += l[i] != (float)POISON;
            CHECK_MSG(touched == 0, "%s step %d: %lld L values written without an lse buffer", c->name, step,
                      (long long)touched);
        }
        /* The next step starts where this one's append ended. */
        for (int b = 0; b < c->batch; b++)
            if (lengths_ok(c, h.lens[b]) && h.lens[b] + 2 * c->seqlen_new <= c->capacity) h.lens[b] += c->seqlen_new;
    }

done:
    if (plan) fa_plan_destroy(plan);
    fa_buffer bufs[] = {bq, bk, bv, bo, bl, blen, btab, bkn, bvn, bcos, bsin};
    for (size_t i = 0; i < FA_ARRAY_SIZE(bufs); i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
    free(h.q);
    free(h.k_pool);
    free(h.v_pool);
    free(h.k_new);
    free(h.v_new);
    free(h.lens);
    free(h.table);
    free(h.cos_t);
    free(h.sin_t);
    free(h.slopes);
    free(o);
    free(o_want);
    free(k_got);
    free(v_got);
    free(k_want);
    free(v_want);
    free(l);
    free(l_want);
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                     */

/* Contiguous caches, split and not, with and without an append: empty
 * caches, lengths at the 64-key tile's edges, a full cache. */
FA_TEST(contiguous) {
    REQUIRE_DEVICE();
    static const int lens0[] = {1, 63, 64, 700, 1100};
    static const int lens1[] = {0, 63, 64, 65, 1099};
    kv_case c = base_case("contiguous bf16 d128 g8", FA_DTYPE_BF16, 5, 1, 1100, 32, 4, 128, lens0, 5);
    run_kv_case(&c);
    c = base_case("contiguous bf16 d128 g8 append", FA_DTYPE_BF16, 5, 1, 1100, 32, 4, 128, lens1, 5);
    c.seqlen_new = 1;
    run_kv_case(&c);
    c = base_case("contiguous fp16 d64 g4 sq3 append causal", FA_DTYPE_F16, 5, 3, 1100, 8, 2, 64, lens1, 5);
    c.seqlen_new = 3;
    c.lens[4] = 1097;
    c.causal = 1;
    run_kv_case(&c);
    /* 64 sequences: no room to split. */
    static const int lens64[] = {0, 63, 64, 65, 299};
    c = base_case("contiguous fp16 d128 b64 append", FA_DTYPE_F16, 64, 1, 300, 8, 1, 128, lens64, 5);
    c.seqlen_new = 1;
    run_kv_case(&c);
}

/* Page sizes that divide the 64-key tile (16, 32, 64), that a tile
 * straddles unevenly (48, 80), and larger ones (128, 256): lengths that end
 * inside a page, on a page's edge, inside a tile of several pages. */
FA_TEST(paged_sizes) {
    REQUIRE_DEVICE();
    static const int sizes[] = {16, 32, 48, 64, 80, 128, 256};
    for (size_t i = 0; i < FA_ARRAY_SIZE(sizes); i++) {
        const int P = sizes[i];
        const int lens[] = {0, P - 2, 3 * P - 1, 1400 - 2};
        char name[64];
        snprintf(name, sizeof name, "paged %d bf16 d128 g8 sq2 append causal", P);
        kv_case c = base_case(name, FA_DTYPE_BF16, 4, 2, 1400, 16, 2, 128, lens, 4);
        c.page_size = P;
        c.seqlen_new = 2;
        c.causal = 1;
        run_kv_case(&c);
    }
    static const int lens[] = {5, 333, 1000};
    kv_case c = base_case("paged 16 fp16 d96 g4 no append", FA_DTYPE_F16, 3, 1, 1024, 8, 2, 96, lens, 3);
    c.page_size = 16;
    run_kv_case(&c);
    c = base_case("paged 256 fp16 d256 g1", FA_DTYPE_F16, 3, 1, 1024, 2, 2, 256, lens, 3);
    c.page_size = 256;
    c.seqlen_new = 1;
    run_kv_case(&c);
}

/* Rotary embedding of the queries and the new keys: both layouts, the
 * whole head or part of it (76 rotates half of one 8-dimension chunk; 40
 * at head_dim 80 pairs dimensions across chunks), queries at cs + i under
 * a causal mask or a window, else all at cs. */
FA_TEST(rotary) {
    REQUIRE_DEVICE();
    static const int lens[] = {0, 17, 600, 997};
    const struct {
        int dim, rd, inter, causal, window, page;
    } v[] = {{128, 128, 0, 1, 0, 64}, {128, 128, 1, 0, 0, 0},  {128, 64, 1, 1, 0, 48},
             {128, 76, 0, 0, 1, 16},  {80, 40, 0, 1, 0, 0},     {64, 64, 0, 0, 0, 256}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(v); i++) {
        char name[96];
        snprintf(name, sizeof name, "rotary %d of d%d %s%s%s pages %d", v[i].rd, v[i].dim,
                 v[i].inter ? "interleaved" : "halves", v[i].causal ? " causal" : "", v[i].window ? " window" : "",
                 v[i].page);
        kv_case c = base_case(name, i % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 4, 3, 1000, 16, 2, v[i].dim, lens, 4);
        c.page_size = v[i].page;
        c.seqlen_new = 3;
        c.rotary_dim = v[i].rd;
        c.interleaved = v[i].inter;
        c.causal = v[i].causal;
        if (v[i].window) {
            c.window_left = 90;
            c.window_right = 1;
        }
        run_kv_case(&c);
    }
}

/* Softcap and ALiBi (bottom-right aligned, each sequence on its own
 * length), alone and together, with masks. */
FA_TEST(score_options) {
    REQUIRE_DEVICE();
    static const int lens[] = {3, 250, 1001};
    for (int opt = 0; opt < 4; opt++) {
        char name[96];
        snprintf(name, sizeof name, "score options %s%s%s", opt & 1 ? "softcap " : "", opt & 2 ? "alibi " : "",
                 opt == 3 ? "window" : opt == 0 ? "(none) causal" : "causal");
        kv_case c = base_case(name, opt % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 3, 2, 1024, 16, 4, 128, lens, 3);
        c.page_size = opt % 2 ? 32 : 0;
        c.seqlen_new = 2;
        c.softcap = opt & 1 ? 12.0f : 0.0f;
        c.alibi = (opt & 2) != 0;
        if (opt == 3) {
            c.window_left = 300;
            c.window_right = 0;
        } else {
            c.causal = 1;
        }
        run_kv_case(&c);
    }
}

/* Sequences that break the rules beside ones that keep them: a negative
 * length, an append past the capacity, a page outside the pool among the
 * first, the middle and the last pages (each in another split's share of
 * the check, while the new tokens' page is valid for the first two), a
 * full cache with nothing appended whose query position would be past the
 * rotary tables; their rows NaN, nothing appended for any of them, every
 * other sequence right. Also with lse NULL. */
FA_TEST(invalid_data) {
    REQUIRE_DEVICE();
    static const int lens[] = {-1, 1999, 900, 900, 900, 600, 0};
    kv_case c = base_case("invalid data paged 16", FA_DTYPE_BF16, 7, 1, 2000, 32, 4, 128, lens, 7);
    c.page_size = 16;
    c.seqlen_new = 2;
    c.bad_entry[2] = 0;  /* past the pool */
    c.bad_entry[3] = 31; /* negative */
    c.bad_entry[4] = 56; /* past the pool: the last of 902 tokens' 57 pages */
    run_kv_case(&c);
    c.name = "invalid data paged 16 no lse";
    c.no_lse = 1;
    run_kv_case(&c);
    static const int lens_c[] = {-5, 1999, 1998, 0};
    c = base_case("invalid data contiguous", FA_DTYPE_F16, 4, 1, 2000, 16, 2, 64, lens_c, 4);
    c.seqlen_new = 2;
    run_kv_case(&c);
    /* Nothing appended, a full cache, rotary queries at cs = capacity:
     * past the tables' rows. */
    static const int lens_r[] = {1000, 999, 0};
    c = base_case("invalid data rotary position", FA_DTYPE_BF16, 3, 1, 1000, 8, 2, 128, lens_r, 3);
    c.rotary_dim = 128;
    run_kv_case(&c);
}

/* 128 packed rows (a group of 16 heads, 8 tokens): several row tiles, only
 * the first of which appends; causal and rotary. */
FA_TEST(row_tiles) {
    REQUIRE_DEVICE();
    static const int lens[] = {0, 100, 1500};
    kv_case c = base_case("row tiles g16 sq8 paged 64 append rotary causal", FA_DTYPE_BF16, 3, 8, 1600, 32, 2, 64,
                          lens, 3);
    c.page_size = 64;
    c.seqlen_new = 8;
    c.rotary_dim = 64;
    c.causal = 1;
    run_kv_case(&c);
}

/* Three steps on one plan, each reading what the last one appended (the
 * split arrival counts wrap back to zero between steps). */
FA_TEST(repeated_steps) {
    REQUIRE_DEVICE();
    static const int lens[] = {0, 47, 500};
    kv_case c = base_case("steps paged 48 rotary", FA_DTYPE_BF16, 3, 1, 800, 32, 4, 128, lens, 3);
    c.page_size = 48;
    c.seqlen_new = 1;
    c.rotary_dim = 128;
    c.steps = 3;
    run_kv_case(&c);
    c = base_case("steps contiguous sq2 causal alibi", FA_DTYPE_F16, 3, 2, 800, 32, 4, 128, lens, 3);
    c.seqlen_new = 2;
    c.causal = 1;
    c.alibi = 1;
    c.steps = 3;
    run_kv_case(&c);
}

/* Batch 1 on a long cache, 32 splits that meet (decode.cu meet_splits:
 * split 0 of the group reads the flag word and appends): two steps of a
 * valid sequence on one plan (the counts and generations back where the
 * next step needs them), then one with a page outside the pool in the
 * middle of its pages. */
FA_TEST(splits_meet) {
    REQUIRE_DEVICE();
    static const int lens[] = {4000};
    kv_case c = base_case("meet paged 64 rotary", FA_DTYPE_BF16, 1, 1, 4100, 32, 4, 128, lens, 1);
    c.page_size = 64;
    c.seqlen_new = 1;
    c.rotary_dim = 128;
    c.steps = 2;
    c.min_splits = 16;
    c.meet = 1;
    run_kv_case(&c);
    c.name = "meet paged 64 bad page";
    c.steps = 1;
    c.bad_entry[0] = 31; /* negative */
    run_kv_case(&c);
}

/* The FP32-pipe step: fp32 and head dims the tensor-core step does not
 * take, contiguous and paged, every option, invalid sequences, two
 * steps. */
FA_TEST(fp32_pipes) {
    REQUIRE_DEVICE();
    static const int lens[] = {0, 63, 640, 997};
    kv_case c = base_case("fp32 pipes fp32 d128 g8 contiguous append", FA_DTYPE_F32, 4, 1, 1000, 16, 2, 128, lens, 4);
    c.seqlen_new = 3;
    run_kv_case(&c);
    c = base_case("fp32 pipes fp32 d64 g2 sq3 paged 48 rotary causal", FA_DTYPE_F32, 4, 3, 1000, 4, 2, 64, lens, 4);
    c.page_size = 48;
    c.seqlen_new = 3;
    c.rotary_dim = 64;
    c.causal = 1;
    c.steps = 2;
    c.lens[3] = 994;
    run_kv_case(&c);
    c = base_case("fp32 pipes fp16 d40 g4 paged 16 everything", FA_DTYPE_F16, 4, 2, 1000, 8, 2, 40, lens, 4);
    c.page_size = 16;
    c.seqlen_new = 2;
    c.rotary_dim = 24;
    c.interleaved = 1;
    c.softcap = 9.0f;
    c.alibi = 1;
    c.window_left = 200;
    c.window_right = 0;
    c.lens[3] = 998;
    run_kv_case(&c);
    static const int bad_lens[] = {-2, 999, 500, 300};
    c = base_case("fp32 pipes bf16 d72 paged 32 invalid data", FA_DTYPE_BF16, 4, 1, 1000, 4, 2, 72, bad_lens, 4);
    c.page_size = 32;
    c.seqlen_new = 2;
    c.bad_entry[2] = 7;
    c.no_lse = 1;
    run_kv_case(&c);
}

FA_TEST_MAIN(FA_CASE(contiguous), FA_CASE(paged_sizes), FA_CASE(rotary), FA_CASE(score_options),
             FA_CASE(invalid_data), FA_CASE(row_tiles), FA_CASE(repeated_steps), FA_CASE(fp32_pipes),
             FA_CASE(splits_meet))
