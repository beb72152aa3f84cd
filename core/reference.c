/* The CPU reference. Plain loops and fp64 accumulation: it is the
 * definition every kernel is measured against, so clarity wins over speed
 * everywhere except in the one place it matters (no quadratic scratch). */
#include "reference.h"

#include "desc.h"

#include "dtype.h"
#include "fa_internal.h"
#include "philox.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* A tensor layout (core/desc.c resolves packed strides) with the token
 * ranges of its side, queries or keys, attached. */
typedef struct ref_layout {
    int64_t offset, stride_batch, stride_seq, stride_head;
    int heads;
    int seqlen;            /* per sequence; the longest one with varlen */
    const int32_t *cu;     /* NULL: fixed-length batch */
} ref_layout;

static ref_layout resolve_layout(const fa_attention_desc *desc, fa_tensor_role role) {
    fa_layout r = fa_desc_layout(desc, role);
    int is_query = role == FA_TENSOR_Q || role == FA_TENSOR_O;
    ref_layout l;
    l.offset = r.offset;
    l.stride_batch = r.stride_batch;
    l.stride_seq = r.stride_seq;
    l.stride_head = r.stride_head;
    l.heads = r.heads;
    l.seqlen = r.seqlen;
    l.cu = is_query ? desc->cu_seqlens_q : desc->cu_seqlens_k;
    return l;
}

/* Element index of (b, t, h, 0); head_dim is contiguous from there. */
static int64_t layout_row(const ref_layout *l, int b, int t, int h) {
    if (l->cu) return l->offset + ((int64_t)l->cu[b] + t) * l->stride_seq + (int64_t)h * l->stride_head;
    return l->offset + (int64_t)b * l->stride_batch + (int64_t)t * l->stride_seq +
           (int64_t)h * l->stride_head;
}

static int layout_seq_len(const ref_layout *l, int b) {
    return l->cu ? (int)(l->cu[b + 1] - l->cu[b]) : l->seqlen;
}

/* The four tensors of a call; the gradients share their layouts (dQ with
 * Q, dK with K, dV with V, dO with O). */
typedef struct ref_layouts {
    ref_layout q, k, v, o;
} ref_layouts;

static ref_layouts resolve_all(const fa_attention_desc *desc) {
    ref_layouts r;
    r.q = resolve_layout(desc, FA_TENSOR_Q);
    r.k = resolve_layout(desc, FA_TENSOR_K);
    r.v = resolve_layout(desc, FA_TENSOR_V);
    r.o = resolve_layout(desc, FA_TENSOR_O);
    return r;
}

static int64_t lse_count(const fa_attention_desc *desc) { return fa_attention_total_q(desc) * desc->heads_q; }

static int max_seq_k(const fa_attention_desc *desc) {
    if (!desc->cu_seqlens_k) return desc->seqlen_k;
    int longest = 0;
    for (int b = 0; b < desc->batch; b++) {
        int len = (int)(desc->cu_seqlens_k[b + 1] - desc->cu_seqlens_k[b]);
        if (len > longest) longest = len;
    }
    return longest;
}

static double dot(const double *a, const double *b, int n) {
    double acc = 0.0;
    for (int x = 0; x < n; x++) acc += a[x] * b[x];
    return acc;
}

/* ------------------------------------------------------------------------ */
/* Masks and indexing                                                       */
/* ------------------------------------------------------------------------ */

int fa_ref_visible(const fa_attention_desc *desc, int sq, int sk, int i, int j) {
    /* The diagonal is bottom-right aligned: the last query sees the last key. */
    int64_t diag = (int64_t)i + sk - sq;
    if (desc->causal && j > diag) return 0;
    if (desc->window_left >= 0 && j < diag - desc->window_left) return 0;
    if (desc->window_right >= 0 && j > diag + desc->window_right) return 0;
    if (desc->block_mask) {
        int64_t nbk = ((int64_t)desc->seqlen_k + desc->block_k - 1) / desc->block_k;
        if (!desc->block_mask[(int64_t)(i / desc->block_q) * nbk + j / desc->block_k]) return 0;
    }
    return 1;
}

void fa_ref_seq_q(const fa_attention_desc *desc, int b, int64_t *start, int *len) {
    if (desc->cu_seqlens_q) {
        *start = desc->cu_seqlens_q[b];
        *len = (int)(desc->cu_seqlens_q[b + 1] - desc->cu_seqlens_q[b]);
    } else {
        *start = (int64_t)b * desc->seqlen_q;
        *len = desc->seqlen_q;
    }
}

void fa_ref_seq_k(const fa_attention_desc *desc, int b, int64_t *start, int *len) {
    if (desc->cu_seqlens_k) {
        *start = desc->cu_seqlens_k[b];
        *len = (int)(desc->cu_seqlens_k[b + 1] - desc->cu_seqlens_k[b]);
    } else {
        *start = (int64_t)b * desc->seqlen_k;
        *len = desc->seqlen_k;
    }
}

int64_t fa_ref_index(const fa_attention_desc *desc, fa_tensor_role role, int b, int t, int h, int x) {
    ref_layout l = resolve_layout(desc, role);
    return layout_row(&l, b, t, h) + x;
}

int64_t fa_ref_lse_index(const fa_attention_desc *desc, int b, int h, int t) {
    if (desc->cu_seqlens_q) return (int64_t)h * fa_attention_total_q(desc) + desc->cu_seqlens_q[b] + t;
    return ((int64_t)b * desc->heads_q + h) * desc->seqlen_q + t;
}

/* Strides are non-negative (the descriptor check), so each sequence's last
 * element is its last token's last head's last dim. */
static int64_t layout_span(const fa_attention_desc *desc, const ref_layout *l) {
    int64_t span = 0;
    for (int b = 0; b < desc->batch; b++) {
        int len = layout_seq_len(l, b);
        if (len <= 0 || l->heads <= 0) continue;
        int64_t end = layout_row(l, b, len - 1, l->heads - 1) + desc->head_dim;
        if (end > span) span = end;
    }
    return span;
}

int64_t fa_ref_tensor_span(const fa_attention_desc *desc, fa_tensor_role role) {
    ref_layout l = resolve_layout(desc, role);
    return layout_span(desc, &l);
}

/* ------------------------------------------------------------------------ */
/* The fp64 core                                                            */
/* ------------------------------------------------------------------------ */

static const fa_ref_dropout_origin no_origin = {0, 0};

typedef struct ref_dropout {
    int on;
    uint32_t threshold;
    double keep_scale; /* 1 / (1 - p) */
    /* Added to row and column, modulo 2^32 as the kernels add them. */
    uint32_t row0, col0;
} ref_dropout;

static ref_dropout dropout_setup(const fa_attention_desc *desc, fa_ref_dropout_origin origin) {
    ref_dropout d;
    d.on = desc->dropout_p > 0.0f;
    d.threshold = fa_dropout_threshold(desc->dropout_p);
    d.keep_scale = d.on ? 1.0 / (1.0 - (double)desc->dropout_p) : 1.0;
    d.row0 = (uint32_t)origin.row0;
    d.col0 = (uint32_t)origin.col0;
    return d;
}

/* z_ij / (1 - p): 0 for a dropped element. */
static double dropout_factor(const fa_attention_desc *desc, const ref_dropout *drop, int b, int h,
                             int i, int j) {
    if (!drop->on) return 1.0;
    uint32_t r = fa_dropout_random(desc->dropout_seed, desc->dropout_offset, b, h, desc->heads_q,
                                   drop->row0 + (uint32_t)i, drop->col0 + (uint32_t)j);
    return r >= drop->threshold ? drop->keep_scale : 0.0;
}

static void zero_tensor(const fa_attention_desc *desc, const ref_layout *l, double *data) {
    for (int b = 0; b < desc->batch; b++) {
        int len = layout_seq_len(l, b);
        for (int t = 0; t < len; t++)
            for (int h = 0; h < l->heads; h++) {
                double *row = data + layout_row(l, b, t, h);
                for (int x = 0; x < desc->head_dim; x++) row[x] = 0.0;
            }
    }
}

/* The logit of (i, j) from q_i . k_j, in the header's order: scale,
 * softcap, bias, ALiBi. *dcap: d(softcapped s) / d(scaled s), the factor
 * the backward's dS takes (1 without softcap). */
static double logit(const fa_attention_desc *desc, const double *bias, double scale, double qk, int b,
                    int h, int i, int j, int sq, int sk, double *dcap) {
    double s = scale * qk, g = 1.0;
    if (desc->softcap > 0.0f) {
        const double cap = (double)desc->softcap, t = tanh(s / cap);
        s = cap * t;
        g = 1.0 - t * t;
    }
    if (bias) s += bias[fa_desc_bias_index(desc, b, h, i, j)];
    if (desc->alibi_slopes) s -= (double)desc->alibi_slopes[h] * fabs((double)i + sk - sq - j);
    if (dcap) *dcap = g;
    return s;
}

static void forward_f64(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const double *bias,
                        const double *q, const double *k, const double *v, double *o, double *lse);

void fa_ref_forward_f64(const fa_attention_desc *desc, const double *q, const double *k,
                        const double *v, double *o, double *lse) {
    forward_f64(desc, no_origin, NULL, q, k, v, o, lse);
}

void fa_ref_forward_f64_ex(const fa_attention_desc *desc, const double *bias, const double *q,
                           const double *k, const double *v, double *o, double *lse) {
    forward_f64(desc, no_origin, bias, q, k, v, o, lse);
}

static void forward_f64(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const double *bias,
                        const double *q, const double *k, const double *v, double *o, double *lse) {
    ref_layouts L = resolve_all(desc);
    const int d = desc->head_dim;
    const int group = desc->heads_q / desc->heads_kv;
    /* fp8's descale factors (1 for other dtypes): on the logits before the
     * score options, and on O, the header's formulas. */
    const double scale = fa_desc_descale(desc->descale_q) * fa_desc_descale(desc->descale_k) * fa_desc_scale(desc);
    const double descale_v = fa_desc_descale(desc->descale_v);
    const ref_dropout drop = dropout_setup(desc, origin);
    /* Scores of one row. Should the allocation fail, the scores are
     * recomputed instead: same numbers, more time. */
    int longest = max_seq_k(desc);
    double *scores = longest > 0 ? malloc((size_t)longest * sizeof *scores) : NULL;

    for (int b = 0; b < desc->batch; b++) {
        int sq = layout_seq_len(&L.q, b), sk = layout_seq_len(&L.k, b);
        for (int h = 0; h < desc->heads_q; h++) {
            int hk = h / group;
            for (int i = 0; i < sq; i++) {
                const double *qi = q + layout_row(&L.q, b, i, h);
                double *oi = o + layout_row(&L.o, b, i, h);
                double *li = lse + fa_ref_lse_index(desc, b, h, i);
                for (int x = 0; x < d; x++) oi[x] = 0.0;

                /* Only the masks make a row fully masked. Past them the
                 * arithmetic is IEEE's with no case of its own: m ignores a
                 * NaN score, whose exp then makes the sum NaN; a +inf score
                 * gives exp(inf - inf), scores all -inf exp(-inf + inf),
                 * NaN both, as softmax is there (include/flashattn.h). */
                double m = -INFINITY;
                int visible = 0;
                for (int j = 0; j < sk; j++) {
                    if (!fa_ref_visible(desc, sq, sk, i, j)) continue;
                    double s = logit(desc, bias, scale, dot(qi, k + layout_row(&L.k, b, j, hk), d), b, h, i, j, sq, sk, NULL);
                    if (scores) scores[j] = s;
                    if (s > m) m = s;
                    visible++;
                }
                if (!visible) {
                    *li = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int j = 0; j < sk; j++) {
                    if (!fa_ref_visible(desc, sq, sk, i, j)) continue;
                    double s = scores ? scores[j]
                                      : logit(desc, bias, scale, dot(qi, k + layout_row(&L.k, b, j, hk), d), b, h,
                                              i, j, sq, sk, NULL);
                    sum += exp(s - m);
                }
                double lse_i = m + log(sum);
                *li = lse_i;
                /* Dropout multiplies: a dropped key's NaN or inf in V still
                 * makes NaN (0 * NaN), as dropout(P) V does. */
                for (int j = 0; j < sk; j++) {
                    if (!fa_ref_visible(desc, sq, sk, i, j)) continue;
                    double zf = dropout_factor(desc, &drop, b, h, i, j);
                    double s = scores ? scores[j]
                                      : logit(desc, bias, scale, dot(qi, k + layout_row(&L.k, b, j, hk), d), b, h,
                                              i, j, sq, sk, NULL);
                    double p = exp(s - lse_i) * zf;
                    const double *vj = v + layout_row(&L.v, b, j, hk);
                    for (int x = 0; x < d; x++) oi[x] += p * vj[x];
                }
                if (descale_v != 1.0)
                    for (int x = 0; x < d; x++) oi[x] *= descale_v;
            }
        }
    }
    free(scores);
}

static void backward_f64(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const double *bias,
                         const double *q, const double *k, const double *v, const double *o,
                         const double *lse, const double *dout, double *dq, double *dk, double *dv);

void fa_ref_backward_f64(const fa_attention_desc *desc, const double *q, const double *k,
                         const double *v, const double *o, const double *lse,
                         const double *dout, double *dq, double *dk, double *dv) {
    backward_f64(desc, no_origin, NULL, q, k, v, o, lse, dout, dq, dk, dv);
}

void fa_ref_backward_f64_ex(const fa_attention_desc *desc, const double *bias, const double *q,
                            const double *k, const double *v, const double *o, const double *lse,
                            const double *dout, double *dq, double *dk, double *dv) {
    backward_f64(desc, no_origin, bias, q, k, v, o, lse, dout, dq, dk, dv);
}

static void backward_f64(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const double *bias,
                         const double *q, const double *k, const double *v, const double *o,
                         const double *lse, const double *dout, double *dq, double *dk, double *dv) {
    ref_layouts L = resolve_all(desc);
    const int d = desc->head_dim;
    const int group = desc->heads_q / desc->heads_kv;
    const double scale = fa_desc_scale(desc);
    const ref_dropout drop = dropout_setup(desc, origin);

    zero_tensor(desc, &L.k, dk);
    zero_tensor(desc, &L.v, dv);
    for (int b = 0; b < desc->batch; b++) {
        int sq = layout_seq_len(&L.q, b), sk = layout_seq_len(&L.k, b);
        for (int h = 0; h < desc->heads_q; h++) {
            int hk = h / group;
            for (int i = 0; i < sq; i++) {
                const double *qi = q + layout_row(&L.q, b, i, h);
                const double *oi = o + layout_row(&L.o, b, i, h);
                const double *doi = dout + layout_row(&L.o, b, i, h);
                double *dqi = dq + layout_row(&L.q, b, i, h);
                double lse_i = lse[fa_ref_lse_index(desc, b, h, i)];
                for (int x = 0; x < d; x++) dqi[x] = 0.0;
                /* A row that sees no key has no softmax to differentiate. */
                if (lse_i == -INFINITY) continue;

                double D = dot(doi, oi, d);
                for (int j = 0; j < sk; j++) {
                    if (!fa_ref_visible(desc, sq, sk, i, j)) continue;
                    const double *kj = k + layout_row(&L.k, b, j, hk);
                    const double *vj = v + layout_row(&L.v, b, j, hk);
                    double *dkj = dk + layout_row(&L.k, b, j, hk);
                    double *dvj = dv + layout_row(&L.v, b, j, hk);
                    double dcap;
                    double p = exp(logit(desc, bias, scale, dot(qi, kj, d), b, h, i, j, sq, sk, &dcap) - lse_i);
                    double zf = dropout_factor(desc, &drop, b, h, i, j);
                    double dp = zf * dot(doi, vj, d);
                    /* Bias and ALiBi are constants of the chain; softcap
                     * scales dS by its tanh's derivative. */
                    double ds = p * (dp - D) * dcap;
                    for (int x = 0; x < d; x++) {
                        dqi[x] += scale * ds * kj[x];
                        dkj[x] += scale * ds * qi[x];
                        dvj[x] += p * zf * doi[x];
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Storage-dtype wrappers                                                   */
/* ------------------------------------------------------------------------ */

static double *alloc_doubles(int64_t count) {
    if (count < 0 || (uint64_t)count > SIZE_MAX / sizeof(double)) return NULL;
    /* calloc: elements outside the layout (gaps) are defined zeros. */
    return calloc(count > 0 ? (size_t)count : 1, sizeof(double));
}

/* Only the elements the layout covers are read or written: a tensor may be
 * a strided view inside a bigger buffer whose gaps belong to someone else. */
static void load_tensor(const fa_attention_desc *desc, const ref_layout *l, const void *src,
                        fa_dtype dtype, double *dst) {
    for (int b = 0; b < desc->batch; b++) {
        int len = layout_seq_len(l, b);
        for (int t = 0; t < len; t++)
            for (int h = 0; h < l->heads; h++) {
                int64_t row = layout_row(l, b, t, h);
                for (int x = 0; x < desc->head_dim; x++) dst[row + x] = fa_load_elem(src, dtype, row + x);
            }
    }
}

static void store_tensor(const fa_attention_desc *desc, const ref_layout *l, const double *src,
                         void *dst, fa_dtype dtype) {
    for (int b = 0; b < desc->batch; b++) {
        int len = layout_seq_len(l, b);
        for (int t = 0; t < len; t++)
            for (int h = 0; h < l->heads; h++) {
                int64_t row = layout_row(l, b, t, h);
                for (int x = 0; x < desc->head_dim; x++) fa_store_elem(dst, dtype, row + x, src[row + x]);
            }
    }
}

#define REF_MAX_ARRAYS 12

/* Frees every array of a call in one place, whatever path it leaves by. */
typedef struct ref_arrays {
    double *p[REF_MAX_ARRAYS];
    int n;
} ref_arrays;

static double *ref_arrays_add(ref_arrays *a, int64_t count) {
    double *p = alloc_doubles(count);
    if (p) a->p[a->n++] = p;
    return p;
}

static void ref_arrays_free(ref_arrays *a) {
    for (int i = 0; i < a->n; i++) free(a->p[i]);
    a->n = 0;
}

static fa_status out_of_memory(ref_arrays *a, const char *fn) {
    ref_arrays_free(a);
    return fa_fail(FA_ERR_OUT_OF_MEMORY, "%s: cannot allocate the fp64 copies of the tensors", fn);
}

fa_status fa_ref_forward(const fa_attention_desc *desc, const void *q, const void *k,
                         const void *v, void *o, float *lse) {
    return fa_ref_forward_at(desc, no_origin, NULL, q, k, v, o, lse);
}

/* The bias as doubles at the indices fa_desc_bias_index gives (broadcast
 * dimensions stored once); NULL with *status set when it cannot. */
static double *load_bias(const fa_attention_desc *desc, const void *bias, const char *fn, ref_arrays *arrays,
                         fa_status *status) {
    *status = FA_SUCCESS;
    if (desc->bias_batch == 0) return NULL;
    if (!bias) {
        *status = fa_fail(FA_ERR_NULL_POINTER, "%s: bias is NULL but the descriptor has bias_batch = %d", fn,
                          desc->bias_batch);
        return NULL;
    }
    const int64_t count = fa_desc_bias_extent(desc);
    double *out = count < 0 ? NULL : ref_arrays_add(arrays, count > 0 ? count : 1);
    if (!out) {
        *status = out_of_memory(arrays, fn);
        return NULL;
    }
    const int bb = desc->bias_batch, bh = desc->bias_heads;
    for (int b = 0; b < bb; b++)
        for (int h = 0; h < bh; h++)
            for (int i = 0; i < desc->seqlen_q; i++) {
                const int64_t row = fa_desc_bias_index(desc, b, h, i, 0);
                for (int j = 0; j < desc->seqlen_k; j++) out[row + j] = fa_load_elem(bias, desc->bias.dtype, row + j);
            }
    return out;
}

fa_status fa_ref_forward_at(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const void *bias,
                            const void *q, const void *k, const void *v, void *o, float *lse) {
    static const char fn[] = "fa_ref_forward";
    if (!desc) return fa_fail(FA_ERR_NULL_POINTER, "%s: desc is NULL", fn);
    if (!q) return fa_fail(FA_ERR_NULL_POINTER, "%s: q is NULL", fn);
    if (!k) return fa_fail(FA_ERR_NULL_POINTER, "%s: k is NULL", fn);
    if (!v) return fa_fail(FA_ERR_NULL_POINTER, "%s: v is NULL", fn);
    if (!o) return fa_fail(FA_ERR_NULL_POINTER, "%s: o is NULL", fn);
    if (!lse) return fa_fail(FA_ERR_NULL_POINTER, "%s: lse is NULL", fn);

    ref_layouts L = resolve_all(desc);
    int64_t nl = lse_count(desc);
    ref_arrays arrays = {{NULL}, 0};
    double *qd = ref_arrays_add(&arrays, layout_span(desc, &L.q));
    double *kd = ref_arrays_add(&arrays, layout_span(desc, &L.k));
    double *vd = ref_arrays_add(&arrays, layout_span(desc, &L.v));
    double *od = ref_arrays_add(&arrays, layout_span(desc, &L.o));
    double *ld = ref_arrays_add(&arrays, nl);
    if (!qd || !kd || !vd || !od || !ld) return out_of_memory(&arrays, fn);
    fa_status st;
    const double *bd = load_bias(desc, bias, fn, &arrays, &st);
    if (st != FA_SUCCESS) {
        ref_arrays_free(&arrays); /* a missing bias leaves the copies allocated */
        return st;
    }

    load_tensor(desc, &L.q, q, desc->q.dtype, qd);
    load_tensor(desc, &L.k, k, desc->k.dtype, kd);
    load_tensor(desc, &L.v, v, desc->v.dtype, vd);
    forward_f64(desc, origin, bd, qd, kd, vd, od, ld);
    /* O is stored in o's dtype: q's, or fp16 / bf16 for fp8 inputs (the
     * public header's rule). */
    store_tensor(desc, &L.o, od, o, desc->o.dtype);
    for (int64_t i = 0; i < nl; i++) lse[i] = (float)ld[i];
    ref_arrays_free(&arrays);
    return FA_SUCCESS;
}

fa_status fa_ref_backward(const fa_attention_desc *desc, const void *q, const void *k,
                          const void *v, const void *o, const float *lse, const void *dout,
                          void *dq, void *dk, void *dv) {
    return fa_ref_backward_at(desc, no_origin, NULL, q, k, v, o, lse, dout, dq, dk, dv);
}

fa_status fa_ref_backward_at(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const void *bias,
                             const void *q, const void *k, const void *v, const void *o, const float *lse,
                             const void *dout, void *dq, void *dk, void *dv) {
    static const char fn[] = "fa_ref_backward";
    if (!desc) return fa_fail(FA_ERR_NULL_POINTER, "%s: desc is NULL", fn);
    if (!q) return fa_fail(FA_ERR_NULL_POINTER, "%s: q is NULL", fn);
    if (!k) return fa_fail(FA_ERR_NULL_POINTER, "%s: k is NULL", fn);
    if (!v) return fa_fail(FA_ERR_NULL_POINTER, "%s: v is NULL", fn);
    if (!o) return fa_fail(FA_ERR_NULL_POINTER, "%s: o is NULL", fn);
    if (!lse) return fa_fail(FA_ERR_NULL_POINTER, "%s: lse is NULL", fn);
    if (!dout) return fa_fail(FA_ERR_NULL_POINTER, "%s: dout is NULL", fn);
    if (!dq) return fa_fail(FA_ERR_NULL_POINTER, "%s: dq is NULL", fn);
    if (!dk) return fa_fail(FA_ERR_NULL_POINTER, "%s: dk is NULL", fn);
    if (!dv) return fa_fail(FA_ERR_NULL_POINTER, "%s: dv is NULL", fn);
    if (fa_desc_is_fp8(desc))
        return fa_fail(FA_ERR_UNSUPPORTED, "%s: q.dtype = %s: fp8 inputs run the forward only", fn,
                       fa_dtype_name(desc->q.dtype));

    ref_layouts L = resolve_all(desc);
    int64_t nq = layout_span(desc, &L.q), nk = layout_span(desc, &L.k);
    int64_t nv = layout_span(desc, &L.v), no = layout_span(desc, &L.o);
    int64_t nl = lse_count(desc);
    ref_arrays arrays = {{NULL}, 0};
    double *qd = ref_arrays_add(&arrays, nq);
    double *kd = ref_arrays_add(&arrays, nk);
    double *vd = ref_arrays_add(&arrays, nv);
    double *od = ref_arrays_add(&arrays, no);
    double *ld = ref_arrays_add(&arrays, nl);
    double *dod = ref_arrays_add(&arrays, no);
    double *dqd = ref_arrays_add(&arrays, nq);
    double *dkd = ref_arrays_add(&arrays, nk);
    double *dvd = ref_arrays_add(&arrays, nv);
    if (!qd || !kd || !vd || !od || !ld || !dod || !dqd || !dkd || !dvd) return out_of_memory(&arrays, fn);
    fa_status st;
    const double *bd = load_bias(desc, bias, fn, &arrays, &st);
    if (st != FA_SUCCESS) {
        ref_arrays_free(&arrays); /* a missing bias leaves the copies allocated */
        return st;
    }

    load_tensor(desc, &L.q, q, desc->q.dtype, qd);
    load_tensor(desc, &L.k, k, desc->k.dtype, kd);
    load_tensor(desc, &L.v, v, desc->v.dtype, vd);
    load_tensor(desc, &L.o, o, desc->q.dtype, od);
    load_tensor(desc, &L.o, dout, desc->q.dtype, dod);
    for (int64_t i = 0; i < nl; i++) ld[i] = (double)lse[i];
    backward_f64(desc, origin, bd, qd, kd, vd, od, ld, dod, dqd, dkd, dvd);
    store_tensor(desc, &L.q, dqd, dq, desc->q.dtype);
    store_tensor(desc, &L.k, dkd, dk, desc->k.dtype);
    store_tensor(desc, &L.v, dvd, dv, desc->v.dtype);
    ref_arrays_free(&arrays);
    return FA_SUCCESS;
}

/* x rounded to the storage dtype and back, in float. */
static float round_to(fa_dtype dtype, float x) {
    switch (dtype) {
    case FA_DTYPE_F16: return fa_f16_to_f32(fa_f32_to_f16(x));
    case FA_DTYPE_BF16: return fa_bf16_to_f32(fa_f32_to_bf16(x));
    default: return x;
    }
}

/* Emulates S = QK^T, P = softmax(S), O = PV as three separate products in
 * the storage dtype (fp32 accumulation inside each, a rounding to the dtype
 * between them), which is what an unfused implementation computes. lse may
 * be NULL: unfused attention has no use for it. */
fa_status fa_ref_standard_forward(const fa_attention_desc *desc, const void *q, const void *k,
                                  const void *v, void *o, float *lse) {
    return fa_ref_standard_forward_at(desc, no_origin, q, k, v, o, lse);
}

fa_status fa_ref_standard_forward_at(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const void *q,
                                     const void *k, const void *v, void *o, float *lse) {
    static const char fn[] = "fa_ref_standard_forward";
    if (!desc) return fa_fail(FA_ERR_NULL_POINTER, "%s: desc is NULL", fn);
    /* Unfused attention has no score options yet: no backend runs them. */
    const char *option = fa_desc_option_in_use(desc);
    if (option) return fa_fail(FA_ERR_UNSUPPORTED, "%s: %s is not implemented in standard attention", fn, option);
    if (fa_desc_is_fp8(desc))
        return fa_fail(FA_ERR_UNSUPPORTED, "%s: q.dtype = %s is not implemented in standard attention", fn,
                       fa_dtype_name(desc->q.dtype));
    if (!q) return fa_fail(FA_ERR_NULL_POINTER, "%s: q is NULL", fn);
    if (!k) return fa_fail(FA_ERR_NULL_POINTER, "%s: k is NULL", fn);
    if (!v) return fa_fail(FA_ERR_NULL_POINTER, "%s: v is NULL", fn);
    if (!o) return fa_fail(FA_ERR_NULL_POINTER, "%s: o is NULL", fn);

    ref_layouts L = resolve_all(desc);
    const int d = desc->head_dim;
    const int group = desc->heads_q / desc->heads_kv;
    const fa_dtype dt = desc->q.dtype;
    const float scale = (float)fa_desc_scale(desc);
    const ref_dropout drop = dropout_setup(desc, origin);
    const float keep_scale = (float)drop.keep_scale;
    int longest = max_seq_k(desc);

    ref_arrays arrays = {{NULL}, 0};
    double *qd = ref_arrays_add(&arrays, layout_span(desc, &L.q));
    double *kd = ref_arrays_add(&arrays, layout_span(desc, &L.k));
    double *vd = ref_arrays_add(&arrays, layout_span(desc, &L.v));
    double *srow = ref_arrays_add(&arrays, longest);
    float *orow = malloc((size_t)d * sizeof *orow);
    if (!qd || !kd || !vd || !srow || !orow) {
        free(orow);
        return out_of_memory(&arrays, fn);
    }
    load_tensor(desc, &L.q, q, desc->q.dtype, qd);
    load_tensor(desc, &L.k, k, desc->k.dtype, kd);
    load_tensor(desc, &L.v, v, desc->v.dtype, vd);

    for (int b = 0; b < desc->batch; b++) {
        int sq = layout_seq_len(&L.q, b), sk = layout_seq_len(&L.k, b);
        for (int h = 0; h < desc->heads_q; h++) {
            int hk = h / group;
            for (int i = 0; i < sq; i++) {
                const double *qi = qd + layout_row(&L.q, b, i, h);
                int64_t orow_index = layout_row(&L.o, b, i, h);
                float m = -INFINITY;
                int visible = 0;
                /* S: one dtype value per visible key (kept as double only
                 * because the scratch is shared; every value is a float). */
                for (int j = 0; j < sk; j++) {
                    if (!fa_ref_visible(desc, sq, sk, i, j)) continue;
                    const double *kj = kd + layout_row(&L.k, b, j, hk);
                    float acc = 0.0f;
                    for (int x = 0; x < d; x++) acc += (float)qi[x] * (float)kj[x];
                    float s = round_to(dt, scale * acc);
                    srow[j] = s;
                    if (s > m) m = s;
                    visible++;
                }
                for (int x = 0; x < d; x++) orow[x] = 0.0f;
                float lse_i = -INFINITY;
                if (visible) {
                    float sum = 0.0f;
                    for (int j = 0; j < sk; j++)
                        if (fa_ref_visible(desc, sq, sk, i, j)) sum += expf((float)srow[j] - m);
                    lse_i = m + logf(sum);
                    for (int j = 0; j < sk; j++) {
                        if (!fa_ref_visible(desc, sq, sk, i, j)) continue;
                        float p = round_to(dt, expf((float)srow[j] - m) / sum);
                        double zf = dropout_factor(desc, &drop, b, h, i, j);
                        if (drop.on) p = round_to(dt, p * (zf == 0.0 ? 0.0f : keep_scale));
                        const double *vj = vd + layout_row(&L.v, b, j, hk);
                        for (int x = 0; x < d; x++) orow[x] += p * (float)vj[x];
                    }
                }
                for (int x = 0; x < d; x++) fa_store_elem(o, dt, orow_index + x, (double)orow[x]);
                if (lse) lse[fa_ref_lse_index(desc, b, h, i)] = lse_i;
            }
        }
    }
    free(orow);
    ref_arrays_free(&arrays);
    return FA_SUCCESS;
}
