/* Differential test: random problems drawn from a fixed seed, run on every
 * backend that has a device and compared with the fp64 reference, forward
 * and backward. A problem mixes every option of the descriptor: dtypes,
 * head_dim (odd multiples of 8 too), GQA, causal, window bounds anywhere in
 * INT_MIN..INT_MAX (extremes, values near the sequence lengths), block
 * masks, dropout, varlen batches with empty and one-token sequences,
 * seqlen 1, strided layouts with offsets, rows the masks leave no key, and
 * NaN, infinities or values beyond fp32's range of logits injected into
 * the inputs.
 *
 * What must hold is the header's rule for non-finite values (above
 * fa_forward in include/flashattn.h): a row is fully masked (L = -inf,
 * O = 0) exactly when the masks leave it no key; where the reference gives
 * NaN the backend gives NaN, where it gives an infinity the backend gives a
 * non-finite value; elsewhere the backend is finite and within the GUIDE's
 * tolerance, except for what a masked pair may carry (0 * NaN inside a
 * computed tile) and, where logits overflow fp32, anything but a row
 * reported masked.
 *
 * Environment:
 *   FA_DIFF_CASES   cases per backend (default 400)
 *   FA_DIFF_BUILDS  kernel builds per backend (default 14): a case whose
 *                   plan needs a build beyond them is drawn again, which
 *                   bounds the compile time on a CPU device
 *   FA_DIFF_SEED    the seed (default fixed); FA_DIFF_FIRST=n starts at case n
 *   FA_DIFF_HEAD_DIMS  a comma-separated list of head dims (multiples of 8
 *                   up to 256) the random cases take theirs from, to aim
 *                   them at some kernels (default: any)
 * The first cases are hand-picked extremes (extreme_case), the rest random.
 * Under ctest's mma-emulated runs (FLASHATTN_OPENCL_MMA_EMULATE, with
 * FA_TEST_HALF=1) the cases are fp16 and bf16, for the OpenCL matrix-unit
 * kernels, and fewer (60 cases, 6 builds, unless set): the emulated layer
 * is slow on a CPU.
 *
 * fa-test-labels: device
 * The other emulated layouts (Intel DPAS, AMD MFMA, AMD WMMA) run the
 * OpenCL case too.
 *
 * fa-test-mma-layouts: nvidia
 * fa-test-mma-subset-layouts: intel amd-mfma amd-wmma
 * fa-test-mma-subset-cases: opencl */
#include "attention_suite.h"
#include "harness.h"
#include "test_util.h"

#include "desc.h"
#include "dtype.h"
#include "flashattn.h"
#include "plan.h"
#include "planner.h"
#include "reference.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Settings                                                                  */

static long env_long(const char *name, long fallback, long lo, long hi) {
    const char *s = getenv(name);
    if (!s || !*s) return fallback;
    char *end = NULL;
    long v = strtol(s, &end, 0);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "  %s=%s ignored: want an integer in [%ld, %ld]\n", name, s, lo, hi);
        return fallback;
    }
    return v;
}

static uint64_t env_seed(void) {
    const char *s = getenv("FA_DIFF_SEED");
    return s && *s ? strtoull(s, NULL, 0) : 0x5eed0fd1ffull;
}

/* fp16 and bf16 only (FA_TEST_HALF=1): the matrix units' dtypes. */
static int half_only(void) {
    const char *s = getenv("FA_TEST_HALF");
    return s && strcmp(s, "1") == 0;
}

/* FA_DIFF_HEAD_DIMS's list into dims (at most cap); returns the count, 0
 * when unset. An entry that is not a multiple of 8 in [8, 256] is left
 * out with a message. */
static int env_head_dims(int *dims, int cap) {
    const char *s = getenv("FA_DIFF_HEAD_DIMS");
    int n = 0;
    while (s && *s && n < cap) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (end == s) break;
        if (v >= 8 && v <= 256 && v % 8 == 0)
            dims[n++] = (int)v;
        else
            fprintf(stderr, "  FA_DIFF_HEAD_DIMS: %ld ignored: want a multiple of 8 in [8, 256]\n", v);
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* The OpenCL matrix-unit kernels run emulated on this device. */
static int mma_emulated(void) {
    const char *s = getenv("FLASHATTN_OPENCL_MMA_EMULATE");
    return s && *s && strcmp(s, "off") != 0;
}

static int rnd_int(fa_rng *r, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(fa_rng_next(r) % (uint64_t)((int64_t)hi - lo + 1));
}

static int chance(fa_rng *r, double p) { return fa_rng_uniform(r, 0.0, 1.0) < p; }

/* ------------------------------------------------------------------------ */
/* Drawing a case                                                            */

/* What decides a plan's kernels: drawn first, and drawn again (or taken
 * from an earlier case) when its kernels would be a build too many. */
typedef struct skeleton {
    fa_dtype dtype;
    int head_dim, batch, heads_q, heads_kv, seqlen_q, seqlen_k;
    int causal, window, blocks, dropout, varlen, standard, deterministic, tf32;
    int stream; /* OpenCL: the planner's tiles in the streaming kernels */
    int split;  /* key splits (2..4) where the forward runs on the SIMT kernel */
} skeleton;

typedef enum inject_kind { INJ_NAN, INJ_POS_INF, INJ_NEG_INF } inject_kind;

typedef struct injection {
    fa_tensor_role role; /* FA_TENSOR_O: dO */
    int b, t, h, x;
    inject_kind kind;
} injection;

#define MAX_INJ 3

typedef struct diff_case {
    skeleton sk;
    fa_attention_desc d;
    int32_t *cu_q, *cu_k;
    uint8_t *block_mask;
    injection inj[MAX_INJ];
    int n_inj;
    int huge;          /* one row of Q and of K scaled past fp32's logits */
    int layouts[4];    /* layout kind per role, for the description */
    uint64_t input_seed;
} diff_case;

static void case_free(diff_case *c) {
    free(c->cu_q);
    free(c->cu_k);
    free(c->block_mask);
    c->cu_q = c->cu_k = NULL;
    c->block_mask = NULL;
}

static int draw_len(fa_rng *r) {
    double u = fa_rng_uniform(r, 0.0, 1.0);
    if (u < 0.12) return 1;
    if (u < 0.35) return rnd_int(r, 2, 16);
    if (u < 0.85) return rnd_int(r, 17, 96);
    return rnd_int(r, 97, 190);
}

static skeleton draw_skeleton(fa_rng *r, fa_backend backend) {
    skeleton s;
    memset(&s, 0, sizeof s);
    s.dtype = (fa_dtype)rnd_int(r, half_only() ? 1 : 0, 2);
    s.head_dim = chance(r, 0.7) ? 8 * rnd_int(r, 1, 16) : 8 * rnd_int(r, 17, 32);
    int dims[32];
    const int ndims = env_head_dims(dims, 32);
    if (ndims > 0) s.head_dim = dims[rnd_int(r, 0, ndims - 1)];
    s.batch = rnd_int(r, 1, 3);
    s.heads_kv = rnd_int(r, 1, 2);
    s.heads_q = s.heads_kv * rnd_int(r, 1, 3);
    s.seqlen_q = draw_len(r);
    s.seqlen_k = chance(r, 0.1) ? rnd_int(r, 200, 400) : draw_len(r); /* decoding shapes now and then */
    /* Keep the reference's plain loops quick. */
    while ((double)s.batch * s.heads_q * s.seqlen_q * s.seqlen_k * s.head_dim > 4e6) {
        if (s.seqlen_q >= s.seqlen_k) s.seqlen_q = (s.seqlen_q + 1) / 2;
        else s.seqlen_k = (s.seqlen_k + 1) / 2;
    }
    s.causal = chance(r, 0.4);
    s.window = chance(r, 0.35);
    s.blocks = chance(r, 0.25);
    s.dropout = chance(r, 0.25);
    s.varlen = chance(r, 0.25);
    s.standard = chance(r, 0.1);
    s.deterministic = chance(r, 0.5);
    s.tf32 = s.dtype == FA_DTYPE_F32 && chance(r, 0.3);
    /* A CPU device never gets them from the planner, a GPU from head_dim 96. */
    s.stream = backend == FA_BACKEND_OPENCL && !s.standard && chance(r, 0.35);
    s.split = !s.standard && chance(r, 0.15) ? rnd_int(r, 2, 4) : 0;
    return s;
}

/* A window bound: with on, >= 0 and often extreme or near the lengths;
 * else negative (unlimited), INT_MIN included. */
static int draw_window(fa_rng *r, int on, int len_q, int len_k) {
    if (!on) {
        switch (rnd_int(r, 0, 3)) {
        case 0: return INT_MIN;
        case 1: return -2 - rnd_int(r, 0, 1000);
        case 2: return -1 - (int)(fa_rng_next(r) % INT_MAX);
        default: return -1;
        }
    }
    const int gap = len_k > len_q ? len_k - len_q : len_q - len_k;
    const int near[] = {0, 1, len_k - 1, len_k, len_k + 1, len_q - 1, len_q, len_q + 1, gap - 1, gap, gap + 1};
    switch (rnd_int(r, 0, 6)) {
    case 0: return INT_MAX;
    case 1: return INT_MAX - rnd_int(r, 0, 300);
    case 2: return (int)(fa_rng_next(r) % ((uint64_t)INT_MAX + 1));
    case 3: return rnd_int(r, 0, 8);
    case 4: return rnd_int(r, 0, len_q + len_k);
    default: {
        int v = near[rnd_int(r, 0, (int)(sizeof near / sizeof near[0]) - 1)];
        return v < 0 ? 0 : v;
    }
    }
}

/* Cumulative lengths of one side of a varlen batch, none longer than max
 * and, now and then, empty or a single token. */
static int32_t *draw_cu(fa_rng *r, int batch, int max) {
    int32_t *cu = malloc(((size_t)batch + 1) * sizeof *cu);
    if (!cu) return NULL;
    cu[0] = 0;
    for (int b = 0; b < batch; b++) {
        int len = chance(r, 0.2) ? 0 : chance(r, 0.15) ? 1 : chance(r, 0.4) ? max : rnd_int(r, 1, max);
        if (len > max) len = max;
        cu[b + 1] = cu[b] + len;
    }
    return cu;
}

static uint8_t *draw_block_mask(fa_rng *r, fa_attention_desc *d) {
    d->block_q = chance(r, 0.5) ? rnd_int(r, 1, 20) : rnd_int(r, 16, d->seqlen_q + 16);
    d->block_k = chance(r, 0.5) ? rnd_int(r, 1, 20) : rnd_int(r, 16, d->seqlen_k + 16);
    const size_t rows = ((size_t)d->seqlen_q + d->block_q - 1) / d->block_q;
    const size_t cols = ((size_t)d->seqlen_k + d->block_k - 1) / d->block_k;
    uint8_t *m = malloc(rows * cols);
    if (!m) return NULL;
    const double keep[] = {0.0, 0.3, 0.7, 1.0};
    const double p = keep[rnd_int(r, 0, 3)];
    for (size_t i = 0; i < rows * cols; i++) m[i] = (uint8_t)chance(r, p);
    if (chance(r, 0.3)) memset(m + (size_t)rnd_int(r, 0, (int)rows - 1) * cols, 0, cols); /* a row of blocks off */
    d->block_mask = m;
    d->block_mask_bytes = rows * cols;
    return m;
}

/* Layout of one tensor: 0 packed, 1 packed with an offset, 2 [b, s, h, d]
 * with padding, 3 [b, h, s, d] with padding. Offsets and strides stay
 * multiples of 16 bytes. */
static void draw_layout(fa_rng *r, fa_tensor_desc *t, int kind, int heads, int seq, int dim, int varlen) {
    const int64_t align = 16 / (int64_t)fa_dtype_size(t->dtype);
    t->offset = kind == 0 ? 0 : align * rnd_int(r, 0, 5);
    t->stride_batch = t->stride_seq = t->stride_head = 0;
    if (kind < 2) return;
    const int64_t pad_in = align * rnd_int(r, 0, 2), pad_mid = align * rnd_int(r, 0, 3);
    const int64_t pad_out = align * rnd_int(r, 0, 2);
    if (kind == 2) {
        t->stride_head = dim + pad_in;
        t->stride_seq = heads * t->stride_head + pad_mid;
        t->stride_batch = seq * t->stride_seq + pad_out;
    } else {
        t->stride_seq = dim + pad_in;
        t->stride_head = seq * t->stride_seq + pad_mid;
        t->stride_batch = heads * t->stride_head + pad_out;
    }
    if (varlen) t->stride_batch = 0;
}

static int seq_len(const fa_attention_desc *d, int query_side, int b) {
    int64_t start;
    int len;
    if (query_side)
        fa_ref_seq_q(d, b, &start, &len);
    else
        fa_ref_seq_k(d, b, &start, &len);
    return len;
}

static void draw_injection(fa_rng *r, const fa_attention_desc *d, diff_case *c) {
    const fa_tensor_role roles[] = {FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V, FA_TENSOR_O};
    injection in;
    in.role = roles[rnd_int(r, 0, 3)];
    const int query_side = in.role == FA_TENSOR_Q || in.role == FA_TENSOR_O;
    in.b = rnd_int(r, 0, d->batch - 1);
    for (int tries = 0; tries < d->batch && seq_len(d, query_side, in.b) == 0; tries++) in.b = (in.b + 1) % d->batch;
    const int len = seq_len(d, query_side, in.b);
    if (len == 0) return;
    in.t = rnd_int(r, 0, len - 1);
    in.h = rnd_int(r, 0, (query_side ? d->heads_q : d->heads_kv) - 1);
    in.x = rnd_int(r, 0, d->head_dim - 1);
    in.kind = (inject_kind)rnd_int(r, 0, 2);
    c->inj[c->n_inj++] = in;
}

/* The rest of a case around its skeleton: everything that is an argument
 * of the kernels rather than part of their build. */
static int fill_case(fa_rng *r, const skeleton *sk, diff_case *c) {
    memset(c, 0, sizeof *c);
    c->sk = *sk;
    fa_attention_desc *d = &c->d;
    *d = suite_desc(sk->dtype, sk->batch, sk->seqlen_q, sk->seqlen_k, sk->heads_q, sk->heads_kv, sk->head_dim);
    d->causal = sk->causal;
    d->deterministic = sk->deterministic;
    d->allow_tf32 = sk->tf32;
    d->algorithm = sk->standard ? FA_ALGO_STANDARD : FA_ALGO_FUSED;
    if (sk->varlen) {
        c->cu_q = draw_cu(r, d->batch, d->seqlen_q);
        c->cu_k = draw_cu(r, d->batch, d->seqlen_k);
        if (!c->cu_q || !c->cu_k) return 0;
        d->cu_seqlens_q = c->cu_q;
        d->cu_seqlens_k = c->cu_k;
    }
    /* One side on at least (the WINDOW build), the other either way. */
    int left_on = sk->window && chance(r, 0.7), right_on = sk->window && (!left_on || chance(r, 0.6));
    d->window_left = draw_window(r, left_on, d->seqlen_q, d->seqlen_k);
    d->window_right = draw_window(r, right_on, d->seqlen_q, d->seqlen_k);
    if (sk->blocks && !draw_block_mask(r, d)) return 0;
    if (sk->dropout) {
        const float ps[] = {0.1f, 0.3f, 0.6f, 0.9f};
        d->dropout_p = ps[rnd_int(r, 0, 3)];
        d->dropout_seed = fa_rng_next(r);
        d->dropout_offset = fa_rng_next(r);
    }
    if (chance(r, 0.3)) d->softmax_scale = (float)fa_rng_uniform(r, 0.02, 1.0);
    const int64_t tq = fa_attention_total_q(d), tk = fa_attention_total_k(d);
    fa_tensor_desc *t[4] = {&d->q, &d->k, &d->v, &d->o};
    for (int i = 0; i < 4; i++) {
        c->layouts[i] = chance(r, 0.4) ? 0 : rnd_int(r, 1, 3);
        const int kv = i == 1 || i == 2;
        draw_layout(r, t[i], c->layouts[i], kv ? d->heads_kv : d->heads_q,
                    sk->varlen ? (int)(kv ? tk : tq) : (kv ? d->seqlen_k : d->seqlen_q), d->head_dim, sk->varlen);
    }
    if (chance(r, 0.35)) {
        const int n = rnd_int(r, 1, MAX_INJ);
        for (int i = 0; i < n; i++) draw_injection(r, d, c);
    }
    c->huge = chance(r, 0.06);
    c->input_seed = fa_rng_next(r);
    return fa_attention_desc_check(d) == FA_SUCCESS;
}

static void describe(const diff_case *c, char *out, size_t n) {
    const fa_attention_desc *d = &c->d;
    static const char *const kinds[] = {"NaN", "+inf", "-inf"};
    static const char *const roles[] = {"Q", "K", "V", "dO"};
    size_t at = (size_t)snprintf(out, n, "%s d%d b%d h%d/%d %dx%d%s window(%d,%d)", fa_dtype_name(d->q.dtype),
                                 d->head_dim, d->batch, d->heads_q, d->heads_kv, d->seqlen_q, d->seqlen_k,
                                 d->causal ? " causal" : "", d->window_left, d->window_right);
#define MORE(...)                                                                          \
    do {                                                                                   \
        if (at < n) at += (size_t)snprintf(out + at, n - at, __VA_ARGS__);               \
    } while (0)
    if (d->block_mask) MORE(" blocks %dx%d", d->block_q, d->block_k);
    if (d->dropout_p > 0.0f) MORE(" dropout %.1f", (double)d->dropout_p);
    if (d->cu_seqlens_q) {
        MORE(" varlen q[");
        for (int b = 0; b < d->batch; b++) MORE("%s%d", b ? "," : "", (int)(d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b]));
        MORE("] k[");
        for (int b = 0; b < d->batch; b++) MORE("%s%d", b ? "," : "", (int)(d->cu_seqlens_k[b + 1] - d->cu_seqlens_k[b]));
        MORE("]");
    }
    if (d->softmax_scale > 0.0f) MORE(" scale %.3g", (double)d->softmax_scale);
    MORE(" layouts %d%d%d%d", c->layouts[0], c->layouts[1], c->layouts[2], c->layouts[3]);
    for (int i = 0; i < c->n_inj; i++)
        MORE(" %s@%s[%d,%d,%d,%d]", kinds[c->inj[i].kind], roles[c->inj[i].role], c->inj[i].b, c->inj[i].t,
             c->inj[i].h, c->inj[i].x);
    if (c->huge) MORE(" huge");
    if (d->deterministic) MORE(" deterministic");
    if (d->allow_tf32) MORE(" tf32");
    if (d->algorithm == FA_ALGO_STANDARD) MORE(" standard");
    if (c->sk.stream) MORE(" stream");
    if (c->sk.split) MORE(" split %d", c->sk.split);
#undef MORE
}

/* Hand-picked extremes, run before the random cases: the windows that
 * were once computed in 32 bits, NaN in a query, values past fp32's
 * logits, rows the masks empty, one-token and empty sequences, decoding. */
typedef enum extreme_input { PLAIN, NAN_QUERY, HUGE } extreme_input;

typedef struct extreme {
    fa_dtype dtype;
    int head_dim, batch, heads_q, heads_kv, seqlen_q, seqlen_k, causal, varlen;
    int window_left, window_right;
    extreme_input input;
    float dropout;
    int split, standard; /* skeleton's */
} extreme;

static const extreme extremes[] = {
    /* The windows (fp32, d64, one build for the first three). */
    {FA_DTYPE_F32, 64, 1, 2, 2, 70, 90, 1, 0, -1, INT_MAX, PLAIN, 0.0f, 0, 0},
    {FA_DTYPE_F32, 64, 1, 2, 2, 70, 90, 1, 0, INT_MAX, INT_MIN, NAN_QUERY, 0.0f, 0, 0},
    {FA_DTYPE_F32, 64, 1, 2, 2, 70, 90, 1, 0, 0, 0, HUGE, 0.0f, 0, 0},
    /* Decoding (key splits) with a NaN query and unlimited-by-size windows. */
    {FA_DTYPE_BF16, 64, 2, 4, 4, 1, 400, 0, 0, INT_MAX, INT_MAX, NAN_QUERY, 0.0f, 0, 0},
    /* More queries than keys: rows the window leaves nothing. */
    {FA_DTYPE_BF16, 32, 1, 2, 1, 90, 40, 0, 0, 0, 0, PLAIN, 0.0f, 0, 0},
    /* Varlen with empty and one-token sequences, causal rows with no key. */
    {FA_DTYPE_F16, 72, 4, 2, 1, 30, 30, 1, 1, 5, INT_MIN, PLAIN, 0.3f, 0, 0},
    /* One query, one key. */
    {FA_DTYPE_F32, 8, 1, 1, 1, 1, 1, 0, 0, -1, -1, PLAIN, 0.0f, 0, 0},
    /* Key splits with a NaN query and rows no split sees a key of. */
    {FA_DTYPE_F32, 32, 2, 2, 1, 20, 150, 1, 0, 3, INT_MAX, NAN_QUERY, 0.0f, 3, 0},
    /* Standard attention with windows near the lengths. */
    {FA_DTYPE_F16, 40, 1, 2, 2, 50, 70, 0, 0, 69, 49, NAN_QUERY, 0.2f, 0, 1},
};

#define N_EXTREMES ((int)(sizeof extremes / sizeof extremes[0]))

/* Extreme n as a case: its other arguments (layouts, varlen lengths) drawn
 * as for any case, then its own window, inputs and dropout. */
static int extreme_case(fa_rng *r, int n, diff_case *c) {
    const extreme *x = &extremes[n];
    skeleton sk;
    memset(&sk, 0, sizeof sk);
    sk.dtype = half_only() && x->dtype == FA_DTYPE_F32 ? FA_DTYPE_F16 : x->dtype;
    sk.head_dim = x->head_dim;
    sk.batch = x->batch;
    sk.heads_q = x->heads_q;
    sk.heads_kv = x->heads_kv;
    sk.seqlen_q = x->seqlen_q;
    sk.seqlen_k = x->seqlen_k;
    sk.causal = x->causal;
    sk.window = x->window_left >= 0 || x->window_right >= 0;
    sk.dropout = x->dropout > 0.0f;
    sk.varlen = x->varlen;
    sk.split = x->split;
    sk.standard = x->standard;
    if (!fill_case(r, &sk, c)) return 0;
    fa_attention_desc *d = &c->d;
    d->window_left = x->window_left;
    d->window_right = x->window_right;
    d->dropout_p = x->dropout;
    d->softmax_scale = 0.0f;
    c->n_inj = 0;
    c->huge = x->input == HUGE;
    if (x->input == NAN_QUERY) {
        injection *in = &c->inj[c->n_inj];
        for (in->b = 0; in->b < d->batch && seq_len(d, 1, in->b) == 0; in->b++) continue;
        if (in->b < d->batch) {
            in->role = FA_TENSOR_Q;
            in->t = seq_len(d, 1, in->b) / 2;
            in->h = d->heads_q - 1;
            in->x = 3;
            in->kind = INJ_NAN;
            c->n_inj++;
        }
    }
    return fa_attention_desc_check(d) == FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Kernel builds                                                             */

/* The builds a case's plan needs, as a string: the options that enter the
 * kernels' build and the tiles of both passes. */
static void build_key(const fa_device_desc *dev, const diff_case *c, char *key, size_t n) {
    const skeleton *s = &c->sk;
    fa_plan_info info;
    fa_status st = fa_plan_for_device(dev, &c->d, &info);
    const fa_kernel_plan *f = &info.forward, *b = &info.backward;
    snprintf(key, n, "%d/%d/%d%d%d%d%d%d%d%d%d%d|%d:%d,%d,%d,%d,%d,%d,%d|%d:%d,%d,%d,%d,%d,%d,%d", (int)s->dtype,
             s->head_dim, s->causal, c->d.window_left >= 0 || c->d.window_right >= 0, s->blocks, s->dropout,
             s->varlen, s->standard, s->deterministic, s->tf32, s->stream, s->split,
             st == FA_SUCCESS ? (int)f->variant : -1, f->br,
             f->bc, f->work_group_size, f->thread_rows, f->thread_cols, f->split_k, f->stages, (int)b->variant,
             b->br, b->bc, b->work_group_size, b->thread_rows, b->thread_cols, b->split_k, b->stages);
}

#define MAX_BUILDS 1024
#define KEY_LEN 160

typedef struct builds {
    char keys[MAX_BUILDS][KEY_LEN];
    int n, budget;
    skeleton kept[MAX_BUILDS]; /* skeletons of accepted cases, to draw again */
    int n_kept;
} builds;

static int builds_find(const builds *bs, const char *key) {
    for (int i = 0; i < bs->n; i++)
        if (strcmp(bs->keys[i], key) == 0) return i;
    return -1;
}

/* Notes the builds of an accepted case and keeps its skeleton. */
static void builds_note(builds *bs, const fa_device_info *dev, const diff_case *c) {
    char key[KEY_LEN];
    build_key(&dev->desc, c, key, sizeof key);
    if (builds_find(bs, key) < 0 && bs->n < MAX_BUILDS) snprintf(bs->keys[bs->n++], KEY_LEN, "%s", key);
    if (bs->n_kept < MAX_BUILDS) bs->kept[bs->n_kept++] = c->sk;
}

/* Draws a case: fresh skeletons while their builds fit the budget, then
 * skeletons of earlier cases with fresh arguments. */
static int draw_case(fa_rng *r, builds *bs, const fa_device_info *dev, diff_case *c) {
    char key[KEY_LEN];
    for (int attempt = 0; attempt < 60; attempt++) {
        skeleton sk = attempt < 20 || bs->n_kept == 0 ? draw_skeleton(r, dev->backend)
                                                       : bs->kept[rnd_int(r, 0, bs->n_kept - 1)];
        if (!fill_case(r, &sk, c)) {
            case_free(c);
            continue;
        }
        build_key(&dev->desc, c, key, sizeof key);
        if (builds_find(bs, key) < 0 && bs->n >= bs->budget && attempt < 59) {
            case_free(c);
            continue;
        }
        builds_note(bs, dev, c);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Tensors of a case                                                         */

enum { T_Q, T_K, T_V, T_O, T_DO, T_DQ, T_DK, T_DV, T_COUNT };

static const fa_tensor_role tensor_role[T_COUNT] = {FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V, FA_TENSOR_O,
                                                    FA_TENSOR_O, FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V};

typedef struct tensors {
    int64_t count[T_COUNT];
    void *host[T_COUNT];   /* inputs; outputs as the device wrote them */
    void *ref[T_COUNT];    /* the reference's O, dQ, dK, dV */
    void *poison[T_COUNT]; /* what every output held before a run */
    fa_buffer dev[T_COUNT];
    float *lse, *lse_ref;
    fa_buffer lse_dev;
    int64_t nl;
} tensors;

static void tensors_free(tensors *t) {
    for (int i = 0; i < T_COUNT; i++) {
        free(t->host[i]);
        free(t->ref[i]);
        free(t->poison[i]);
        if (t->dev[i]) fa_buffer_free(t->dev[i]);
    }
    free(t->lse);
    free(t->lse_ref);
    if (t->lse_dev) fa_buffer_free(t->lse_dev);
    memset(t, 0, sizeof *t);
}

static double big_value(fa_dtype dt) {
    /* Products of two such values pass fp32's range; fp16 cannot get there,
     * its logits only lose the precision fp32 gives them. */
    return dt == FA_DTYPE_F16 ? 60000.0 : 1e30;
}

static void inject(const diff_case *c, tensors *t) {
    const fa_attention_desc *d = &c->d;
    const fa_dtype dt = d->q.dtype;
    for (int i = 0; i < c->n_inj; i++) {
        const injection *in = &c->inj[i];
        const double v = in->kind == INJ_NAN ? NAN : in->kind == INJ_POS_INF ? INFINITY : -INFINITY;
        const int which = in->role == FA_TENSOR_Q ? T_Q : in->role == FA_TENSOR_K ? T_K : in->role == FA_TENSOR_V ? T_V : T_DO;
        fa_store_elem(t->host[which], dt, fa_ref_index(d, in->role, in->b, in->t, in->h, in->x), v);
    }
    if (c->huge) {
        /* The first query of the first non-empty sequence and every key of
         * it, all heads: logits around big^2 * head_dim. */
        for (int b = 0; b < d->batch; b++) {
            if (seq_len(d, 1, b) == 0 || seq_len(d, 0, b) == 0) continue;
            const double big = big_value(dt);
            for (int h = 0; h < d->heads_q; h++)
                for (int x = 0; x < d->head_dim; x++)
                    fa_store_elem(t->host[T_Q], dt, fa_ref_index(d, FA_TENSOR_Q, b, 0, h, x), x % 2 ? big : -big);
            for (int j = 0; j < seq_len(d, 0, b); j++)
                for (int h = 0; h < d->heads_kv; h++)
                    for (int x = 0; x < d->head_dim; x++)
                        fa_store_elem(t->host[T_K], dt, fa_ref_index(d, FA_TENSOR_K, b, j, h, x), (x + j) % 3 ? big : -big);
            break;
        }
    }
}

static int tensors_init(tensors *t, fa_context ctx, const diff_case *c) {
    const fa_attention_desc *d = &c->d;
    const fa_dtype dt = d->q.dtype;
    const size_t es = fa_dtype_size(dt);
    memset(t, 0, sizeof *t);
    fa_rng r;
    fa_rng_seed(&r, c->input_seed);
    int ok = 1;
    for (int i = 0; i < T_COUNT && ok; i++) {
        t->count[i] = fa_desc_tensor_extent(d, tensor_role[i]);
        const int64_t n = t->count[i] > 0 ? t->count[i] : 1;
        if (i <= T_V || i == T_DO) {
            t->host[i] = fa_test_random_tensor(&r, dt, n);
        } else {
            t->host[i] = malloc((size_t)n * es);
            t->ref[i] = malloc((size_t)n * es);
            t->poison[i] = malloc((size_t)n * es);
            ok = t->ref[i] && t->poison[i];
            if (ok) fa_test_poison(t->poison[i], dt, n);
        }
        ok = ok && t->host[i] && fa_buffer_alloc(ctx, (size_t)n * es, &t->dev[i]) == FA_SUCCESS;
    }
    t->nl = fa_attention_total_q(d) * d->heads_q;
    const size_t lb = (size_t)(t->nl > 0 ? t->nl : 1) * sizeof(float);
    t->lse = malloc(lb);
    t->lse_ref = malloc(lb);
    ok = ok && t->lse && t->lse_ref && fa_buffer_alloc(ctx, lb, &t->lse_dev) == FA_SUCCESS;
    if (ok) inject(c, t);
    return ok;
}

static size_t tensor_bytes(const tensors *t, const diff_case *c, int i) {
    return (size_t)(t->count[i] > 0 ? t->count[i] : 1) * fa_dtype_size(c->d.q.dtype);
}

/* ------------------------------------------------------------------------ */
/* What the rule expects                                                     */

static int row_bad(const fa_attention_desc *d, fa_tensor_role role, const void *data, int b, int t, int h) {
    for (int x = 0; x < d->head_dim; x++)
        if (!isfinite(fa_load_elem(data, d->q.dtype, fa_ref_index(d, role, b, t, h, x)))) return 1;
    return 0;
}

/* Per row of each output: whether it is fully masked, and whether a pair
 * the masks hide may carry a NaN into it (the header's last rule: inside a
 * computed tile a hidden pair enters the products as an exact 0). */
typedef struct expect {
    int max_q, max_k;
    unsigned char *masked;  /* [b][i]: the masks leave row i no key */
    unsigned char *leak_o;  /* [b][h][i] */
    unsigned char *leak_dq; /* [b][h][i] */
    unsigned char *leak_dkv; /* [b][hk][j] */
} expect;

static void expect_free(expect *e) {
    free(e->masked);
    free(e->leak_o);
    free(e->leak_dq);
    free(e->leak_dkv);
    memset(e, 0, sizeof *e);
}

static int expect_init(expect *e, const diff_case *c, const tensors *t) {
    const fa_attention_desc *d = &c->d;
    memset(e, 0, sizeof *e);
    for (int b = 0; b < d->batch; b++) {
        if (seq_len(d, 1, b) > e->max_q) e->max_q = seq_len(d, 1, b);
        if (seq_len(d, 0, b) > e->max_k) e->max_k = seq_len(d, 0, b);
    }
    const size_t nq = (size_t)d->batch * e->max_q + 1, nk = (size_t)d->batch * e->max_k + 1;
    e->masked = calloc(nq, 1);
    e->leak_o = calloc(nq * d->heads_q, 1);
    e->leak_dq = calloc(nq * d->heads_q, 1);
    e->leak_dkv = calloc(nk * d->heads_kv, 1);
    unsigned char *qbad = calloc(nq * d->heads_q, 1), *kbad = calloc(nk * d->heads_kv, 1);
    unsigned char *vbad = calloc(nk * d->heads_kv, 1);
    int ok = e->masked && e->leak_o && e->leak_dq && e->leak_dkv && qbad && kbad && vbad;
    const int group = d->heads_q / d->heads_kv;
    for (int b = 0; ok && b < d->batch; b++) {
        const int sq = seq_len(d, 1, b), sk = seq_len(d, 0, b);
        for (int h = 0; h < d->heads_q; h++)
            for (int i = 0; i < sq; i++) {
                const size_t at = ((size_t)b * d->heads_q + h) * e->max_q + i;
                /* The backward pass's row inputs: Q, dO, and the reference's O and L. */
                qbad[at] = (unsigned char)(row_bad(d, FA_TENSOR_Q, t->host[T_Q], b, i, h) ||
                                           row_bad(d, FA_TENSOR_O, t->host[T_DO], b, i, h) ||
                                           row_bad(d, FA_TENSOR_O, t->ref[T_O], b, i, h) ||
                                           isnan(t->lse_ref[fa_ref_lse_index(d, b, h, i)]));
            }
        for (int h = 0; h < d->heads_kv; h++)
            for (int j = 0; j < sk; j++) {
                const size_t at = ((size_t)b * d->heads_kv + h) * e->max_k + j;
                kbad[at] = (unsigned char)row_bad(d, FA_TENSOR_K, t->host[T_K], b, j, h);
                vbad[at] = (unsigned char)row_bad(d, FA_TENSOR_V, t->host[T_V], b, j, h);
            }
        for (int i = 0; i < sq; i++) {
            int seen = 0;
            for (int j = 0; j < sk; j++) {
                if (fa_ref_visible(d, sq, sk, i, j)) {
                    seen = 1;
                    continue;
                }
                for (int h = 0; h < d->heads_q; h++) {
                    const int hk = h / group;
                    const size_t qi = ((size_t)b * d->heads_q + h) * e->max_q + i;
                    const size_t kj = ((size_t)b * d->heads_kv + hk) * e->max_k + j;
                    if (vbad[kj]) e->leak_o[qi] = 1;
                    if (qbad[qi] || kbad[kj] || vbad[kj]) e->leak_dq[qi] = e->leak_dkv[kj] = 1;
                }
            }
            e->masked[(size_t)b * e->max_q + i] = (unsigned char)!seen;
        }
    }
    free(qbad);
    free(kbad);
    free(vbad);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* Comparisons                                                               */

typedef struct verdict {
    int failed;
    char first[320]; /* the first failure, for the report */
} verdict;

static void fail(verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(verdict *v, const char *fmt, ...) {
    if (!v->failed++) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(v->first, sizeof v->first, fmt, ap);
        va_end(ap);
    }
}

/* Accumulates ||got - ref|| and ||ref|| over the elements both give finite
 * and counts the elements whose finiteness breaks the rule. A gradient row
 * that cancels (a query that sees one key: dS = P (dP - D) = 0) has no
 * relative error to speak of; such rows are measured apart, against the
 * size of what cancels, dot products of head_dim unit-scale values. */
typedef struct tally {
    double num, den, cancelled; /* cancelled: the worst such row's error */
    int64_t nan_lost, inf_lost, spurious;
    int64_t at; /* the first bad element */
} tally;

static void tally_row(tally *ty, const double *ref, const double *got, int n, int may_leak, int64_t index0,
                      double cancel_scale) {
    double num = 0.0, den = 0.0;
    int finite = 0;
    for (int x = 0; x < n; x++) {
        int64_t *bad = NULL;
        if (isnan(ref[x])) {
            if (!isnan(got[x])) bad = &ty->nan_lost;
        } else if (isinf(ref[x])) {
            if (isfinite(got[x])) bad = &ty->inf_lost;
        } else if (!isfinite(got[x])) {
            if (!(may_leak && isnan(got[x]))) bad = &ty->spurious;
        } else {
            num += (got[x] - ref[x]) * (got[x] - ref[x]);
            den += ref[x] * ref[x];
            finite++;
        }
        if (!bad) continue;
        if (ty->nan_lost + ty->inf_lost + ty->spurious == 0) ty->at = index0 + x;
        (*bad)++;
    }
    if (finite && den < finite * (1e-4 * cancel_scale) * (1e-4 * cancel_scale)) {
        const double err = sqrt(num / finite) / cancel_scale;
        if (err > ty->cancelled) ty->cancelled = err;
        return;
    }
    ty->num += num;
    ty->den += den;
}

static void tally_judge(verdict *v, const tally *ty, const char *what, double tol) {
    if (ty->nan_lost || ty->inf_lost || ty->spurious)
        fail(v, "%s: %lld NaN lost, %lld infinities lost, %lld spurious non-finite (first at element %lld)", what,
             (long long)ty->nan_lost, (long long)ty->inf_lost, (long long)ty->spurious, (long long)ty->at);
    const double err = ty->den > 0.0 ? sqrt(ty->num / ty->den) : sqrt(ty->num);
    if (!(err < tol)) fail(v, "%s: relative error %.3g (limit %.1g)", what, err, tol);
    if (!(ty->cancelled < tol)) fail(v, "%s: error %.3g in rows that cancel (limit %.1g)", what, ty->cancelled, tol);
}

/* Row (b, s, h) of a tensor, widened. */
static void load_row(const fa_attention_desc *d, fa_tensor_role role, const void *data, int b, int s, int h,
                     double *out) {
    for (int x = 0; x < d->head_dim; x++) out[x] = fa_load_elem(data, d->q.dtype, fa_ref_index(d, role, b, s, h, x));
}

/* The elements outside a tensor's layout must still hold the poison. */
static void check_gaps(verdict *v, const diff_case *c, const tensors *t, int i, const char *what) {
    const fa_attention_desc *d = &c->d;
    const size_t es = fa_dtype_size(d->q.dtype);
    unsigned char *in = calloc((size_t)t->count[i] + 1, 1);
    if (!in) {
        fail(v, "%s: out of memory", what);
        return;
    }
    const int query_side = tensor_role[i] == FA_TENSOR_Q || tensor_role[i] == FA_TENSOR_O;
    const int heads = query_side ? d->heads_q : d->heads_kv;
    for (int b = 0; b < d->batch; b++)
        for (int s = 0; s < seq_len(d, query_side, b); s++)
            for (int h = 0; h < heads; h++)
                memset(in + fa_ref_index(d, tensor_role[i], b, s, h, 0), 1, (size_t)d->head_dim);
    int64_t touched = 0;
    for (int64_t e = 0; e < t->count[i]; e++)
        if (!in[e] && memcmp((const char *)t->host[i] + e * (int64_t)es, (const char *)t->poison[i] + e * (int64_t)es, es))
            touched++;
    if (touched) fail(v, "%s: %lld elements outside the layout were written", what, (long long)touched);
    free(in);
}

/* The GUIDE's tolerance of the case's dtype. */
static double guide_tolerance(const diff_case *c) {
    switch (c->d.q.dtype) {
    case FA_DTYPE_F16: return 3e-3;
    case FA_DTYPE_BF16: return 2e-2;
    default: return c->d.allow_tf32 ? 5e-3 : 1e-5;
    }
}

/* For O and the gradients. Unfused attention rounds S, P, dP and dS to a
 * 16-bit dtype between its products, and with large scales its gradients
 * land near the fused kernels' limit (seen at 2.4e-2 in bf16): it gets
 * twice that, the margin the GUIDE allows fused kernels over it. */
static double tolerance(const diff_case *c) {
    const int unfused16 = c->d.algorithm == FA_ALGO_STANDARD && c->d.q.dtype != FA_DTYPE_F32;
    return guide_tolerance(c) * (unfused16 ? 2.0 : 1.0);
}

static void check_forward(verdict *v, const diff_case *c, const tensors *t, const expect *e) {
    const fa_attention_desc *d = &c->d;
    const double tol = tolerance(c);
    /* Unfused attention rounds S and P to the dtype, and TF32 products (fused
     * or not) round Q and K to 10-bit mantissas: L is only that close. */
    const int rounded_logits = (d->algorithm == FA_ALGO_STANDARD && d->q.dtype != FA_DTYPE_F32) || d->allow_tf32;
    const double l_tol = rounded_logits ? guide_tolerance(c) / 4 : 1e-5;
    tally o = {0}, l = {0};
    int64_t false_masked = 0, lost_mask = 0, o_not_zero = 0;
    double ref[256], got[256];
    for (int b = 0; b < d->batch; b++)
        for (int h = 0; h < d->heads_q; h++)
            for (int i = 0; i < seq_len(d, 1, b); i++) {
                const int64_t li = fa_ref_lse_index(d, b, h, i);
                const double lg = t->lse[li], lr = t->lse_ref[li];
                const int leak = e->leak_o[((size_t)b * d->heads_q + h) * e->max_q + i];
                load_row(d, FA_TENSOR_O, t->ref[T_O], b, i, h, ref);
                load_row(d, FA_TENSOR_O, t->host[T_O], b, i, h, got);
                if (e->masked[(size_t)b * e->max_q + i]) {
                    if (!(isinf(lg) && lg < 0)) lost_mask++;
                    for (int x = 0; x < d->head_dim; x++)
                        if (got[x] != 0.0 && !(leak && isnan(got[x]))) o_not_zero++;
                    continue;
                }
                if (isinf(lg) && lg < 0) false_masked++;
                if (c->huge) continue;
                tally_row(&l, &lr, &lg, 1, 0, li, 0.0);
                tally_row(&o, ref, got, d->head_dim, leak, fa_ref_index(d, FA_TENSOR_O, b, i, h, 0), 0.0);
            }
    if (lost_mask) fail(v, "forward: %lld rows the masks leave no key did not get L = -inf", (long long)lost_mask);
    if (o_not_zero) fail(v, "forward: %lld elements of O in fully masked rows are not 0", (long long)o_not_zero);
    if (false_masked) fail(v, "forward: %lld rows that see keys got L = -inf (reported masked)", (long long)false_masked);
    if (!c->huge) {
        tally_judge(v, &o, "O", tol);
        tally_judge(v, &l, "L", l_tol);
    }
    check_gaps(v, c, t, T_O, "O");
}

static void check_backward(verdict *v, const diff_case *c, const tensors *t, const expect *e) {
    const fa_attention_desc *d = &c->d;
    static const char *const names[3] = {"dQ", "dK", "dV"};
    const int which[3] = {T_DQ, T_DK, T_DV};
    double ref[256], got[256];
    for (int g = 0; g < 3; g++) {
        const int i = which[g];
        const int query_side = g == 0;
        const int heads = query_side ? d->heads_q : d->heads_kv;
        const int max = query_side ? e->max_q : e->max_k;
        const unsigned char *leak = query_side ? e->leak_dq : e->leak_dkv;
        tally ty = {0};
        for (int b = 0; b < d->batch && !c->huge; b++)
            for (int h = 0; h < heads; h++)
                for (int s = 0; s < seq_len(d, query_side, b); s++) {
                    load_row(d, tensor_role[i], t->ref[i], b, s, h, ref);
                    load_row(d, tensor_role[i], t->host[i], b, s, h, got);
                    tally_row(&ty, ref, got, d->head_dim, leak[((size_t)b * heads + h) * max + s],
                              fa_ref_index(d, tensor_role[i], b, s, h, 0), sqrt((double)d->head_dim));
                }
        if (!c->huge) tally_judge(v, &ty, names[g], tolerance(c));
        check_gaps(v, c, t, i, names[g]);
    }
}

/* ------------------------------------------------------------------------ */
/* One case on one backend                                                   */

typedef enum outcome { CASE_PASSED, CASE_FAILED, CASE_UNSUPPORTED } outcome;

/* Cases per kernel variant of each pass, for the summary: which kernels
 * the cases reached. */
#define N_VARIANTS 8
typedef struct variant_tally {
    int fwd[N_VARIANTS], bwd[N_VARIANTS];
} variant_tally;

static void tally_variants(variant_tally *vt, fa_plan plan) {
    const int f = (int)plan->info.forward.variant, b = (int)plan->info.backward.variant;
    if (f >= 0 && f < N_VARIANTS) vt->fwd[f]++;
    if (b >= 0 && b < N_VARIANTS) vt->bwd[b]++;
}

static void print_variants(const char *pass, const int *n) {
    fprintf(stderr, "  %s:", pass);
    for (int v = 0; v < N_VARIANTS; v++)
        if (n[v]) fprintf(stderr, " %s %d", fa_variant_name((fa_variant)v), n[v]);
    fputc('\n', stderr);
}

/* The plan rebuilt as the case wants it, standing in for fa_plan_create as
 * the attention suite does. fa_plan_create turns window bounds that cannot
 * bind into -1; the kernels must get every int right all the same (they
 * did not, in 32 bits), so they get the bounds as drawn. With sk.split, a
 * forward on the SIMT kernel splits its keys (the split-K merge's cases
 * arise on every device so); with sk.stream, the plan's SIMT tiles run in
 * OpenCL's streaming kernels (which have no key splits). */
static fa_status rebuild_plan(fa_plan plan, const diff_case *c) {
    const int windows = plan->desc.window_left != c->d.window_left || plan->desc.window_right != c->d.window_right;
    fa_kernel_plan *fwd = &plan->info.forward;
    const int split = c->sk.split && fwd->variant == FA_VARIANT_SIMT;
    if (!windows && !c->sk.stream && !split) return FA_SUCCESS;
    plan->ctx->ops->plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    plan->desc.window_left = c->d.window_left;
    plan->desc.window_right = c->d.window_right;
    if (split) {
        fwd->variant = FA_VARIANT_SPLITK;
        fwd->split_k = c->sk.split;
    }
    for (int pass = 0; pass < 2 && c->sk.stream; pass++) {
        fa_kernel_plan *kp = pass ? &plan->info.backward : &plan->info.forward;
        if (kp->variant != FA_VARIANT_SIMT && kp->variant != FA_VARIANT_SIMT_STREAM) continue;
        kp->variant = FA_VARIANT_SIMT_STREAM;
        kp->local_mem_bytes = fa_plan_local_mem(FA_VARIANT_SIMT_STREAM, (fa_pass)pass, &plan->desc, kp->br, kp->bc, 1);
    }
    return plan->ctx->ops->plan_prepare(plan->ctx->impl, plan, &plan->impl);
}

#define UPLOAD(i) CALL(fa_buffer_upload(t.dev[i], 0, t.host[i], tensor_bytes(&t, c, i)))
#define DOWNLOAD(i) CALL(fa_buffer_download(t.dev[i], 0, t.host[i], tensor_bytes(&t, c, i)))
#define POISON(i) CALL(fa_buffer_upload(t.dev[i], 0, t.poison[i], tensor_bytes(&t, c, i)))
#define CALL(expr)                                                                         \
    do {                                                                                   \
        fa_status st_ = (expr);                                                            \
        if (st_ != FA_SUCCESS) {                                                           \
            fail(&v, "%s: %s (%s)", #expr, fa_status_string(st_), fa_last_error());        \
            goto done;                                                                     \
        }                                                                                  \
    } while (0)

static outcome run_case(fa_context ctx, const diff_case *c, variant_tally *vt, verdict *vout) {
    verdict v = {0, ""};
    tensors t;
    expect e;
    memset(&e, 0, sizeof e);
    fa_plan plan = NULL;
    const fa_attention_desc *d = &c->d;
    fa_status st = fa_plan_create(ctx, d, &plan);
    if (st == FA_ERR_UNSUPPORTED) return CASE_UNSUPPORTED;
    if (st != FA_SUCCESS) {
        fail(vout, "fa_plan_create: %s (%s)", fa_status_string(st), fa_last_error());
        return CASE_FAILED;
    }
    memset(&t, 0, sizeof t);
    CALL(rebuild_plan(plan, c));
    tally_variants(vt, plan);
    if (!tensors_init(&t, ctx, c)) {
        fail(&v, "cannot allocate the tensors");
        goto done;
    }
    const size_t lb = (size_t)(t.nl > 0 ? t.nl : 1) * sizeof(float);

    /* Forward. */
    memcpy(t.ref[T_O], t.poison[T_O], tensor_bytes(&t, c, T_O));
    CALL(fa_ref_forward(d, t.host[T_Q], t.host[T_K], t.host[T_V], t.ref[T_O], t.lse_ref));
    UPLOAD(T_Q);
    UPLOAD(T_K);
    UPLOAD(T_V);
    POISON(T_O);
    fa_test_poison(t.lse, FA_DTYPE_F32, t.nl);
    CALL(fa_buffer_upload(t.lse_dev, 0, t.lse, lb));
    CALL(fa_forward(plan, t.dev[T_Q], t.dev[T_K], t.dev[T_V], t.dev[T_O], t.lse_dev));
    DOWNLOAD(T_O);
    CALL(fa_buffer_download(t.lse_dev, 0, t.lse, lb));
    if (!expect_init(&e, c, &t)) {
        fail(&v, "out of memory");
        goto done;
    }
    check_forward(&v, c, &t, &e);

    /* Backward, from the reference's O and L on both sides. */
    for (int i = T_DQ; i <= T_DV; i++) memcpy(t.ref[i], t.poison[i], tensor_bytes(&t, c, i));
    CALL(fa_ref_backward(d, t.host[T_Q], t.host[T_K], t.host[T_V], t.ref[T_O], t.lse_ref, t.host[T_DO], t.ref[T_DQ],
                         t.ref[T_DK], t.ref[T_DV]));
    CALL(fa_buffer_upload(t.dev[T_O], 0, t.ref[T_O], tensor_bytes(&t, c, T_O)));
    CALL(fa_buffer_upload(t.lse_dev, 0, t.lse_ref, lb));
    UPLOAD(T_DO);
    POISON(T_DQ);
    POISON(T_DK);
    POISON(T_DV);
    CALL(fa_backward(plan, t.dev[T_Q], t.dev[T_K], t.dev[T_V], t.dev[T_O], t.lse_dev, t.dev[T_DO], t.dev[T_DQ],
                     t.dev[T_DK], t.dev[T_DV]));
    DOWNLOAD(T_DQ);
    DOWNLOAD(T_DK);
    DOWNLOAD(T_DV);
    check_backward(&v, c, &t, &e);

done:
    expect_free(&e);
    tensors_free(&t);
    fa_plan_destroy(plan);
    *vout = v;
    return v.failed ? CASE_FAILED : CASE_PASSED;
}

#undef CALL
#undef UPLOAD
#undef DOWNLOAD
#undef POISON

/* ------------------------------------------------------------------------ */
/* One backend                                                               */

static void differential(fa_backend backend, const char *name) {
    fa_context ctx = NULL;
    fa_status st = fa_context_create(backend, -1, &ctx);
    if (st != FA_SUCCESS) {
        static char why[320];
        snprintf(why, sizeof why, "no %s device: %s (%s)", name, fa_status_string(st), fa_last_error());
        FA_SKIP(why);
    }
    fa_device_info info;
    CHECK_OK(fa_context_get_info(ctx, &info));
    const int emulated = backend == FA_BACKEND_OPENCL && mma_emulated();
    const int cases = (int)env_long("FA_DIFF_CASES", emulated ? 60 : 400, 1, 10000000);
    const int first = (int)env_long("FA_DIFF_FIRST", 0, 0, 10000000);
    static builds bs;
    memset(&bs, 0, sizeof bs);
    bs.budget = (int)env_long("FA_DIFF_BUILDS", emulated ? 6 : 14, 1, MAX_BUILDS);
    variant_tally vt;
    memset(&vt, 0, sizeof vt);
    const uint64_t seed = env_seed();
    fprintf(stderr, "  %s on %s: %d cases from seed 0x%llx, at most %d kernel builds\n", name, info.desc.name, cases,
            (unsigned long long)seed, bs.budget);

    fa_rng r;
    fa_rng_seed(&r, seed ^ ((uint64_t)backend * 0x9e3779b97f4a7c15ull));
    int passed = 0, failed = 0, unsupported = 0, undrawn = 0;
    for (int n = 0; n < first + cases; n++) {
        diff_case c;
        const int drawn = n < N_EXTREMES ? extreme_case(&r, n, &c) : draw_case(&r, &bs, &info, &c);
        if (!drawn) {
            undrawn++;
            case_free(&c);
            continue;
        }
        if (n < N_EXTREMES) builds_note(&bs, &info, &c);
        if (n < first) {
            case_free(&c);
            continue;
        }
        verdict v = {0, ""};
        outcome out = run_case(ctx, &c, &vt, &v);
        if (out == CASE_PASSED) passed++;
        if (out == CASE_UNSUPPORTED) unsupported++;
        if (out == CASE_FAILED) {
            char what[1024];
            describe(&c, what, sizeof what);
            if (failed++ < 25)
                fprintf(stderr, "  case %d%s FAILED (%d problems): %s\n    %s\n", n, n < N_EXTREMES ? " (extreme)" : "",
                        v.failed, what, v.first);
        }
        case_free(&c);
    }
    fa_context_destroy(ctx);
    if (failed > 25) fprintf(stderr, "  ... and %d more failed cases, not shown\n", failed - 25);
    print_variants("forward", vt.fwd);
    print_variants("backward", vt.bwd);
    fprintf(stderr, "differential: %s%s %d cases, %d failed, %d unsupported (%d kernel builds)\n", name,
            emulated ? " (matrix units emulated)" : "", passed + failed, failed, unsupported, bs.n);
    CHECK_MSG(undrawn == 0, "%d cases could not be drawn", undrawn);
    CHECK_MSG(failed == 0, "%s: %d of %d cases failed", name, failed, passed + failed);
    CHECK_MSG(passed > 0, "%s: no case ran", name);
}

FA_TEST(opencl) { differential(FA_BACKEND_OPENCL, "opencl"); }
FA_TEST(cuda) { differential(FA_BACKEND_CUDA, "cuda"); }
FA_TEST(hip) { differential(FA_BACKEND_HIP, "hip"); }

FA_TEST_MAIN(FA_CASE(opencl), FA_CASE(cuda), FA_CASE(hip))
