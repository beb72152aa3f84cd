#include "fuzz_oracle.h"

#include <string.h>

/* Element walks beyond this are skipped: a buffer of the fuzzer holds far
 * fewer, so a tensor with more elements has already failed the span test. */
#define MAX_WALK (1 << 22)

const char *fz_role_name(fz_role role) {
    static const char *const names[FZ_ROLE_COUNT] = {"q",     "k",     "v",      "o",     "lse",
                                                     "dout",  "dq",    "dk",     "dv",    "bias",
                                                     "k_new", "v_new", "cache_seqlens", "block_table",
                                                     "rotary_cos", "rotary_sin"};
    return (unsigned)role < FZ_ROLE_COUNT ? names[role] : "?";
}

/* A tensor as the header defines it, with zero strides resolved to the
 * packed [batch, seq, heads, head_dim] layout. */
typedef struct layout {
    fz_wide offset, sb, ss, sh;
    int64_t batch, seq, heads, dim;
    const int32_t *cu; /* token offsets with varlen, else NULL */
    int64_t elem;      /* bytes */
} layout;

static int64_t dtype_bytes(fa_dtype t) {
    switch (t) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16:
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_FP8_E4M3: return 1;
    default: return 0;
    }
}

/* The bias as a tensor of bias_batch x seqlen_q "tokens" of bias_heads
 * "heads" of seqlen_k contiguous elements; 0 batches without a bias. */
static int resolve_bias(const fa_attention_desc *d, layout *l) {
    const fa_tensor_desc *t = &d->bias;
    if (d->bias_batch == 0) return 1;
    if (d->bias_batch < 0 || d->bias_heads <= 0) return 0;
    l->elem = dtype_bytes(t->dtype);
    if (!l->elem) return 0;
    l->batch = d->bias_batch;
    l->seq = d->seqlen_q;
    l->heads = d->bias_heads;
    l->dim = d->seqlen_k;
    l->offset = t->offset;
    l->ss = t->stride_seq ? t->stride_seq : (fz_wide)d->seqlen_k;
    l->sh = t->stride_head ? t->stride_head : (fz_wide)d->seqlen_q * d->seqlen_k;
    l->sb = t->stride_batch ? t->stride_batch : (fz_wide)d->bias_heads * l->sh;
    return 1;
}

static int resolve(const fa_attention_desc *d, fz_role role, layout *l) {
    memset(l, 0, sizeof *l);
    if (d->batch <= 0 || d->seqlen_q <= 0 || d->seqlen_k <= 0 || d->heads_q <= 0 || d->heads_kv <= 0 ||
        d->head_dim <= 0)
        return 0;
    if (role == FZ_BIAS) return resolve_bias(d, l);
    /* A KV-cache step has no backward: no dO, dQ, dK or dV (dK laid out as
     * a paged pool over the capacity would span what no buffer holds). */
    const int gradient = role == FZ_DOUT || role == FZ_DQ || role == FZ_DK || role == FZ_DV;
    if (gradient && d->kv_cache == 1) return 1; /* none: nothing spanned */
    const int appended = role == FZ_K_NEW || role == FZ_V_NEW;
    if (appended && (d->kv_cache != 1 || d->seqlen_new == 0)) return 1; /* none: nothing spanned */
    if (appended && d->seqlen_new < 0) return 0;
    int query = role == FZ_Q || role == FZ_O || role == FZ_DOUT || role == FZ_DQ;
    const fa_tensor_desc *t = role == FZ_Q || role == FZ_DQ ? &d->q
                              : role == FZ_K || role == FZ_DK ? &d->k
                              : role == FZ_V || role == FZ_DV ? &d->v
                              : role == FZ_K_NEW              ? &d->k_new
                              : role == FZ_V_NEW              ? &d->v_new
                                                              : &d->o;
    /* O and dO are in o's dtype (q's, or fp16 / bf16 with fp8 inputs),
     * dQ in q's. */
    fa_dtype dtype = t->dtype;
    l->elem = dtype_bytes(dtype);
    if (!l->elem) return 0;
    l->batch = d->batch;
    l->seq = query ? d->seqlen_q : d->seqlen_k;
    l->heads = query ? d->heads_q : d->heads_kv;
    l->dim = d->head_dim;
    l->cu = query ? d->cu_seqlens_q : d->cu_seqlens_k;
    l->offset = t->offset;
    if (appended) l->seq = d->seqlen_new;
    if (d->kv_cache == 1 && d->page_size > 0 && (role == FZ_K || role == FZ_V)) {
        /* A paged cache: pools of num_pages pages of page_size tokens. */
        if (d->num_pages <= 0) return 0;
        l->batch = d->num_pages;
        l->seq = d->page_size;
    }
    l->sh = t->stride_head ? t->stride_head : l->dim;
    l->ss = t->stride_seq ? t->stride_seq : (fz_wide)l->heads * l->dim;
    l->sb = t->stride_batch ? t->stride_batch : (fz_wide)l->seq * l->heads * l->dim;
    return 1;
}

/* [lo, hi] of k * stride over k in [0, n - 1], n >= 1. */
static void dim_range(fz_wide n, fz_wide stride, fz_wide *lo, fz_wide *hi) {
    fz_wide far = (n - 1) * stride;
    *lo = far < 0 ? far : 0;
    *hi = far > 0 ? far : 0;
}

/* The KV-cache step's int32 and fp32 arrays: their element count, -1 when
 * a field they depend on is out of its domain. */
static fz_wide array_elements(const fa_attention_desc *d, fz_role role) {
    if (d->kv_cache != 1) return 0;
    if (d->batch <= 0 || d->seqlen_k <= 0) return -1;
    switch (role) {
    case FZ_SEQLENS: return d->batch;
    case FZ_BLOCK_TABLE:
        if (d->page_size < 0) return -1;
        return d->page_size ? (fz_wide)d->batch * (((fz_wide)d->seqlen_k + d->page_size - 1) / d->page_size) : 0;
    default: /* the rotary tables */
        if (d->rotary_dim < 0) return -1;
        return (fz_wide)d->seqlen_k * (d->rotary_dim / 2);
    }
}

static int is_array(fz_role role) { return role == FZ_LSE || role >= FZ_SEQLENS; }

int fz_tensor_span(const fa_attention_desc *d, fz_role role, fz_span *span) {
    memset(span, 0, sizeof *span);
    if (role >= FZ_SEQLENS) {
        fz_wide n = array_elements(d, role);
        if (n < 0) return 0;
        span->elements = n;
        span->end = n * 4;
        return 1;
    }
    if (role == FZ_LSE) {
        if (d->batch <= 0 || d->heads_q <= 0 || d->seqlen_q <= 0) return 0;
        fz_wide tokens = d->cu_seqlens_q ? (fz_wide)d->cu_seqlens_q[d->batch] - d->cu_seqlens_q[0]
                                          : (fz_wide)d->batch * d->seqlen_q;
        if (tokens < 0) return 0;
        span->elements = tokens * d->heads_q;
        span->end = span->elements * 4;
        return 1;
    }
    layout l;
    if (!resolve(d, role, &l)) return 0;
    if (l.batch == 0) return 1; /* no bias: nothing spanned */
    /* Element index = offset + token part + h * sh + x. */
    fz_wide lo = l.offset, hi = l.offset, a, b;
    dim_range(l.heads, l.sh, &a, &b);
    lo += a, hi += b;
    hi += l.dim - 1;
    fz_wide tokens = 0, tok_lo = 0, tok_hi = 0;
    if (l.cu) {
        int any = 0;
        for (int64_t i = 0; i < l.batch; i++) {
            fz_wide len = (fz_wide)l.cu[i + 1] - l.cu[i];
            if (len <= 0) continue;
            tokens += len;
            fz_wide p = (fz_wide)l.cu[i] * l.ss, q = ((fz_wide)l.cu[i + 1] - 1) * l.ss;
            fz_wide plo = p < q ? p : q, phi = p < q ? q : p;
            if (!any || plo < tok_lo) tok_lo = plo;
            if (!any || phi > tok_hi) tok_hi = phi;
            any = 1;
        }
        if (!any) return 1; /* no token: nothing spanned */
    } else {
        tokens = (fz_wide)l.batch * l.seq;
        fz_wide s_lo, s_hi;
        dim_range(l.batch, l.sb, &tok_lo, &tok_hi);
        dim_range(l.seq, l.ss, &s_lo, &s_hi);
        tok_lo += s_lo, tok_hi += s_hi;
    }
    lo += tok_lo, hi += tok_hi;
    span->elements = tokens * l.heads * l.dim;
    span->first = lo * l.elem;
    span->end = (hi + 1) * l.elem;
    return 1;
}

static void mark(unsigned char *allowed, size_t bytes, fz_wide first, fz_wide count) {
    if (first < 0) {
        count += first;
        first = 0;
    }
    if (count <= 0 || first >= (fz_wide)bytes) return;
    if (first + count > (fz_wide)bytes) count = (fz_wide)bytes - first;
    memset(allowed + (size_t)first, 1, (size_t)count);
}

int fz_mark_elements(const fa_attention_desc *d, fz_role role, unsigned char *allowed, size_t bytes) {
    fz_span span;
    if (!fz_tensor_span(d, role, &span)) return 0;
    if (span.elements > MAX_WALK) return 0;
    if (is_array(role)) {
        mark(allowed, bytes, 0, span.end);
        return 1;
    }
    layout l;
    resolve(d, role, &l);
    for (int64_t b = 0; b < l.batch; b++) {
        int64_t len = l.cu ? (int64_t)l.cu[b + 1] - l.cu[b] : l.seq;
        for (int64_t t = 0; t < len; t++) {
            fz_wide token = l.cu ? ((fz_wide)l.cu[b] + t) * l.ss : b * l.sb + t * l.ss;
            for (int64_t h = 0; h < l.heads; h++) {
                fz_wide row = l.offset + token + h * l.sh;
                mark(allowed, bytes, row * l.elem, (fz_wide)l.dim * l.elem);
            }
        }
    }
    return 1;
}

fz_wide fz_element(const fa_attention_desc *d, fz_role role, int64_t b, int64_t t, int64_t h) {
    layout l;
    if (!resolve(d, role, &l) || l.batch == 0) return -1;
    return l.offset + b * l.sb + t * l.ss + h * l.sh;
}

/* Queries sit at cache_seqlens[b] + i under a causal mask or a window that
 * can bind for the shape, else all at cache_seqlens[b]. */
static int query_offsets(const fa_attention_desc *d) {
    return d->causal || (d->window_left >= 0 && (int64_t)d->window_left < (int64_t)d->seqlen_k - 1) ||
           (d->window_right >= 0 && (int64_t)d->window_right < (int64_t)d->seqlen_q - 1);
}

int fz_kv_seq_valid(const fa_attention_desc *d, const int32_t *cache_seqlens, const int32_t *block_table, int b) {
    const int64_t len = cache_seqlens[b], len_k = len + d->seqlen_new;
    if (len < 0 || len_k > d->seqlen_k) return 0;
    if (d->rotary_dim > 0 && len + (query_offsets(d) ? d->seqlen_q - 1 : 0) > (int64_t)d->seqlen_k - 1) return 0;
    if (d->page_size > 0) {
        const int64_t per_seq = ((int64_t)d->seqlen_k + d->page_size - 1) / d->page_size;
        for (int64_t p = 0; p < (len_k + d->page_size - 1) / d->page_size; p++) {
            const int32_t page = block_table[b * per_seq + p];
            if (page < 0 || page >= d->num_pages) return 0;
        }
    }
    return 1;
}

void fz_mark_appended(const fa_attention_desc *d, fz_role role, const int32_t *cache_seqlens,
                      const int32_t *block_table, unsigned char *allowed, size_t bytes) {
    layout l;
    if (!resolve(d, role, &l) || l.batch == 0) return;
    const int64_t per_seq = d->page_size > 0 ? ((int64_t)d->seqlen_k + d->page_size - 1) / d->page_size : 0;
    for (int b = 0; b < d->batch; b++) {
        if (!fz_kv_seq_valid(d, cache_seqlens, block_table, b)) continue;
        for (int64_t t = 0; t < d->seqlen_new; t++) {
            const int64_t pos = (int64_t)cache_seqlens[b] + t;
            const fz_wide token = d->page_size > 0
                                      ? block_table[b * per_seq + pos / d->page_size] * l.sb + (pos % d->page_size) * l.ss
                                      : b * l.sb + pos * l.ss;
            for (int64_t h = 0; h < l.heads; h++)
                mark(allowed, bytes, (l.offset + token + h * l.sh) * l.elem, (fz_wide)l.dim * l.elem);
        }
    }
}
