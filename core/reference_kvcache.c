/* The CPU reference of a KV-cache step (include/flashattn.h, the
 * descriptor's kv_cache fields), on host arrays:
 *   1. sequences whose lengths or pages break the header's rules get O and
 *      L NaN and are neither appended to nor read;
 *   2. append: k_new rotated (rotary_dim > 0) in fp64 at positions
 *      cache_seqlens[b] + t and rounded once to the cache's dtype, v_new
 *      copied, into the cache (contiguous or through the block table);
 *   3. q rotated in fp64 at its positions and rounded once to q's dtype:
 *      the values a kernel that rotates in fp32 and keeps q in its storage
 *      dtype multiplies with (and the values the appended keys hold);
 *   4. attention over the len_k = cache_seqlens[b] + seqlen_new keys of
 *      each sequence, read back from the cache: the fp64 core of
 *      core/reference.c on a one-sequence problem of exactly those lengths,
 *      so masks, softcap, ALiBi and the rules for fully masked rows are the
 *      same code as everywhere. */
#include "reference.h"

#include "checked.h"
#include "dtype.h"
#include "fa_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* x rounded once to the storage dtype. */
static double round_to(fa_dtype dtype, double x) {
    union {
        double d;
        float f;
        uint16_t h;
    } u;
    fa_store_elem(&u, dtype, 0, x);
    return fa_load_elem(&u, dtype, 0);
}

/* The largest rotary position sequence b reads: its last appended key, or
 * its last query. */
static int64_t last_position(const fa_attention_desc *d, int64_t len) {
    int64_t last = len + d->seqlen_new - 1;
    if (d->rotary_dim > 0) {
        const int64_t q_last = len + (fa_desc_rotary_query_offsets(d) ? d->seqlen_q - 1 : 0);
        if (q_last > last) last = q_last;
    }
    return last;
}

int fa_ref_kvcache_seq_valid(const fa_attention_desc *d, const int32_t *cache_seqlens, const int32_t *block_table,
                             int b) {
    const int64_t len = cache_seqlens[b];
    if (len < 0 || len + d->seqlen_new > d->seqlen_k) return 0;
    if (d->rotary_dim > 0 && last_position(d, len) > (int64_t)d->seqlen_k - 1) return 0;
    if (d->page_size > 0) {
        const int64_t used = (len + d->seqlen_new + d->page_size - 1) / d->page_size;
        const int32_t *row = block_table + (int64_t)b * fa_desc_pages_per_seq(d);
        for (int64_t p = 0; p < used; p++)
            if (row[p] < 0 || row[p] >= d->num_pages) return 0;
    }
    return 1;
}

/* Element index of (token t of sequence b, kv head h, dim 0) in a cache
 * tensor (K or V) of a valid sequence. */
static int64_t cache_row(const fa_attention_desc *d, fa_tensor_role role, const int32_t *block_table, int b,
                         int64_t t, int h) {
    const fa_layout l = fa_desc_layout(d, role);
    if (d->page_size > 0) {
        const int64_t page = block_table[(int64_t)b * fa_desc_pages_per_seq(d) + t / d->page_size];
        return l.offset + page * l.stride_batch + (t % d->page_size) * l.stride_seq + (int64_t)h * l.stride_head;
    }
    return l.offset + (int64_t)b * l.stride_batch + t * l.stride_seq + (int64_t)h * l.stride_head;
}

/* Rotates the first rotary_dim entries of row (fp64) at position pos:
 * pairs (2i, 2i + 1) interleaved, else (i, i + rotary_dim / 2). */
static void rotate(const fa_attention_desc *d, const float *cos_t, const float *sin_t, int64_t pos, double *row) {
    const int half = d->rotary_dim / 2;
    for (int i = 0; i < half; i++) {
        const int a = d->rotary_interleaved ? 2 * i : i, c = d->rotary_interleaved ? 2 * i + 1 : i + half;
        const double co = cos_t[pos * half + i], si = sin_t[pos * half + i];
        const double x = row[a], y = row[c];
        row[a] = x * co - y * si;
        row[c] = x * si + y * co;
    }
}

static void nan_sequence(const fa_attention_desc *d, const fa_ref_kvcache_args *a, int b) {
    for (int i = 0; i < d->seqlen_q; i++)
        for (int h = 0; h < d->heads_q; h++) {
            const int64_t row = fa_ref_index(d, FA_TENSOR_O, b, i, h, 0);
            for (int x = 0; x < d->head_dim; x++) fa_store_elem(a->o, d->q.dtype, row + x, NAN);
            if (a->lse) a->lse[fa_ref_lse_index(d, b, h, i)] = NAN;
        }
}

static void append(const fa_attention_desc *d, const fa_ref_kvcache_args *a, int b, double *row) {
    const int64_t len = a->cache_seqlens[b];
    const fa_dtype dt = d->q.dtype;
    for (int t = 0; t < d->seqlen_new; t++)
        for (int h = 0; h < d->heads_kv; h++) {
            const int64_t kn = fa_ref_index(d, FA_TENSOR_K_NEW, b, t, h, 0);
            const int64_t vn = fa_ref_index(d, FA_TENSOR_V_NEW, b, t, h, 0);
            const int64_t kc = cache_row(d, FA_TENSOR_K, a->block_table, b, len + t, h);
            const int64_t vc = cache_row(d, FA_TENSOR_V, a->block_table, b, len + t, h);
            for (int x = 0; x < d->head_dim; x++) row[x] = fa_load_elem(a->k_new, dt, kn + x);
            if (d->rotary_dim > 0) rotate(d, a->rotary_cos, a->rotary_sin, len + t, row);
            for (int x = 0; x < d->head_dim; x++) {
                fa_store_elem(a->k_cache, dt, kc + x, row[x]);
                fa_store_elem(a->v_cache, dt, vc + x, fa_load_elem(a->v_new, dt, vn + x));
            }
        }
}

/* Sequence b of a valid step: its attention on a problem of one sequence
 * of exactly its lengths (packed fp64 arrays qd, kd, vd, od, ld). */
static void attend(const fa_attention_desc *d, const fa_ref_kvcache_args *a, int b, double *qd, double *kd,
                   double *vd, double *od, double *ld) {
    const int sq = d->seqlen_q, hq = d->heads_q, hkv = d->heads_kv, dim = d->head_dim;
    const fa_dtype dt = d->q.dtype;
    const int64_t len = a->cache_seqlens[b], len_k = len + d->seqlen_new;
    const int offsets = fa_desc_rotary_query_offsets(d);
    for (int i = 0; i < sq; i++)
        for (int h = 0; h < hq; h++) {
            double *row = qd + ((int64_t)i * hq + h) * dim;
            const int64_t src = fa_ref_index(d, FA_TENSOR_Q, b, i, h, 0);
            for (int x = 0; x < dim; x++) row[x] = fa_load_elem(a->q, dt, src + x);
            if (d->rotary_dim > 0) {
                rotate(d, a->rotary_cos, a->rotary_sin, len + (offsets ? i : 0), row);
                for (int x = 0; x < d->rotary_dim; x++) row[x] = round_to(dt, row[x]);
            }
        }
    for (int64_t t = 0; t < len_k; t++)
        for (int h = 0; h < hkv; h++) {
            const int64_t kc = cache_row(d, FA_TENSOR_K, a->block_table, b, t, h);
            const int64_t vc = cache_row(d, FA_TENSOR_V, a->block_table, b, t, h);
            for (int x = 0; x < dim; x++) {
                kd[(t * hkv + h) * dim + x] = fa_load_elem(a->k_cache, dt, kc + x);
                vd[(t * hkv + h) * dim + x] = fa_load_elem(a->v_cache, dt, vc + x);
            }
        }
    if (len_k == 0) {
        /* No key at all: every row is fully masked. */
        for (int64_t e = 0; e < (int64_t)sq * hq * dim; e++) od[e] = 0.0;
        for (int64_t e = 0; e < (int64_t)hq * sq; e++) ld[e] = -INFINITY;
    } else {
        fa_attention_desc one;
        fa_attention_desc_init(&one);
        one.batch = 1;
        one.seqlen_q = sq;
        one.seqlen_k = (int)len_k;
        one.heads_q = hq;
        one.heads_kv = hkv;
        one.head_dim = dim;
        one.softmax_scale = (float)fa_desc_scale(d);
        one.causal = d->causal;
        one.window_left = d->window_left;
        one.window_right = d->window_right;
        one.softcap = d->softcap;
        one.alibi_slopes = d->alibi_slopes;
        fa_ref_forward_f64_ex(&one, NULL, qd, kd, vd, od, ld);
    }
    for (int i = 0; i < sq; i++)
        for (int h = 0; h < hq; h++) {
            const int64_t dst = fa_ref_index(d, FA_TENSOR_O, b, i, h, 0);
            const double *row = od + ((int64_t)i * hq + h) * dim;
            for (int x = 0; x < dim; x++) fa_store_elem(a->o, dt, dst + x, row[x]);
            if (a->lse) a->lse[fa_ref_lse_index(d, b, h, i)] = (float)ld[(int64_t)h * sq + i];
        }
}

fa_status fa_ref_forward_kvcache(const fa_attention_desc *desc, const fa_ref_kvcache_args *a) {
    static const char fn[] = "fa_ref_forward_kvcache";
    if (!desc) return fa_fail(FA_ERR_NULL_POINTER, "%s: desc is NULL", fn);
    if (!a) return fa_fail(FA_ERR_NULL_POINTER, "%s: args is NULL", fn);
    if (!desc->kv_cache) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s: desc has kv_cache = 0", fn);
    if (fa_desc_is_fp8(desc))
        return fa_fail(FA_ERR_UNSUPPORTED, "%s: kv_cache: a KV-cache step with %s inputs is not supported", fn,
                       fa_dtype_name(desc->q.dtype));
    const struct {
        const void *p;
        int needed;
        const char *name;
    } ptrs[] = {{a->q, 1, "q"},
                {a->k_cache, 1, "k_cache"},
                {a->v_cache, 1, "v_cache"},
                {a->o, 1, "o"},
                {a->cache_seqlens, 1, "cache_seqlens"},
                {a->block_table, desc->page_size > 0, "block_table"},
                {a->k_new, desc->seqlen_new > 0, "k_new"},
                {a->v_new, desc->seqlen_new > 0, "v_new"},
                {a->rotary_cos, desc->rotary_dim > 0, "rotary_cos"},
                {a->rotary_sin, desc->rotary_dim > 0, "rotary_sin"}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(ptrs); i++)
        if (ptrs[i].needed && !ptrs[i].p) return fa_fail(FA_ERR_NULL_POINTER, "%s: %s is NULL", fn, ptrs[i].name);

    /* Which sequences run, and the most keys one of them has. Every
     * append happens before any attention, as on a device (the kernels
     * append first): sequences whose block tables share a page see each
     * other's appended tokens alike. */
    uint8_t *valid = malloc((size_t)desc->batch);
    if (!valid) return fa_fail(FA_ERR_OUT_OF_MEMORY, "%s: cannot allocate %d flags", fn, desc->batch);
    int64_t longest = 0;
    for (int b = 0; b < desc->batch; b++) {
        valid[b] = (uint8_t)fa_ref_kvcache_seq_valid(desc, a->cache_seqlens, a->block_table, b);
        const int64_t len_k = valid[b] ? (int64_t)a->cache_seqlens[b] + desc->seqlen_new : 0;
        if (len_k > longest) longest = len_k;
    }
    /* Scratch for one sequence: its queries, its keys and values, a row.
     * Query counts are bounded by the checked tensor q; keys by the
     * capacity, whose product with the heads is checked here. */
    const int64_t dim = desc->head_dim;
    int64_t nq, nk, nl;
    size_t q_bytes = 0, k_bytes = 0, l_bytes = 0;
    const int too_large =
        fa_ckd_mul_i64(&nq, (int64_t)desc->seqlen_q * desc->heads_q, dim) ||
        fa_ckd_mul_i64(&nk, longest > 0 ? longest : 1, (int64_t)desc->heads_kv * dim) ||
        fa_ckd_mul_i64(&nl, desc->seqlen_q, desc->heads_q) || fa_ckd_size_of_i64(&q_bytes, nq) ||
        fa_ckd_mul_size(&q_bytes, q_bytes, sizeof(double)) || fa_ckd_size_of_i64(&k_bytes, nk) ||
        fa_ckd_mul_size(&k_bytes, k_bytes, sizeof(double)) || fa_ckd_size_of_i64(&l_bytes, nl) ||
        fa_ckd_mul_size(&l_bytes, l_bytes, sizeof(double));
    double *qd = too_large ? NULL : malloc(q_bytes), *od = too_large ? NULL : malloc(q_bytes);
    double *kd = too_large ? NULL : malloc(k_bytes), *vd = too_large ? NULL : malloc(k_bytes);
    double *ld = too_large ? NULL : malloc(l_bytes);
    double *row = malloc((size_t)dim * sizeof *row);
    fa_status st = FA_SUCCESS;
    if (!qd || !od || !kd || !vd || !ld || !row) {
        st = fa_fail(FA_ERR_OUT_OF_MEMORY, "%s: cannot allocate the fp64 copies of a sequence", fn);
    } else {
        for (int b = 0; b < desc->batch; b++)
            if (valid[b] && desc->seqlen_new > 0) append(desc, a, b, row);
        for (int b = 0; b < desc->batch; b++) {
            if (valid[b])
                attend(desc, a, b, qd, kd, vd, od, ld);
            else
                nan_sequence(desc, a, b);
        }
    }
    free(valid);
    free(qd);
    free(od);
    free(kd);
    free(vd);
    free(ld);
    free(row);
    return st;
}
