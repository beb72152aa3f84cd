/* The attention descriptor: defaults, derived quantities and the full
 * argument check every entry point relies on. */
#include "desc.h"

#include "checked.h"
#include "fa_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Token counts stay inside the int32 that cu_seqlens use. */
#define FA_MAX_TOKENS INT32_MAX
#define FA_MAX_HEAD_DIM 256

void fa_attention_desc_init(fa_attention_desc *desc) {
    if (!desc) return;
    memset(desc, 0, sizeof *desc);
    desc->q.dtype = desc->k.dtype = desc->v.dtype = desc->o.dtype = FA_DTYPE_F32;
    desc->window_left = -1;
    desc->window_right = -1;
    desc->algorithm = FA_ALGO_FUSED;
}

static int64_t total_tokens(const int32_t *cu, int batch, int seqlen) {
    if (!cu) return (int64_t)batch * seqlen;
    return (int64_t)cu[batch] - cu[0];
}

int64_t fa_attention_total_q(const fa_attention_desc *desc) {
    return desc ? total_tokens(desc->cu_seqlens_q, desc->batch, desc->seqlen_q) : 0;
}

int64_t fa_attention_total_k(const fa_attention_desc *desc) {
    return desc ? total_tokens(desc->cu_seqlens_k, desc->batch, desc->seqlen_k) : 0;
}

const fa_tensor_desc *fa_desc_tensor(const fa_attention_desc *desc, fa_tensor_role role) {
    switch (role) {
    case FA_TENSOR_Q: return &desc->q;
    case FA_TENSOR_K: return &desc->k;
    case FA_TENSOR_V: return &desc->v;
    case FA_TENSOR_K_NEW: return &desc->k_new;
    case FA_TENSOR_V_NEW: return &desc->v_new;
    default: return &desc->o;
    }
}

const char *fa_tensor_role_name(fa_tensor_role role) {
    static const char *const names[] = {"q", "k", "v", "o", "k_new", "v_new"};
    return names[role];
}

/* Packed strides of huge (unchecked) shapes saturate: the check then
 * refuses the layout instead of wrapping around. */
static int64_t mul_saturated(int64_t a, int64_t b) {
    int64_t r;
    return fa_ckd_mul_i64(&r, a, b) ? INT64_MAX : r;
}

/* Whether the role's tensor is a pool of pages (K and V of a paged KV
 * cache). */
static int paged_pool(const fa_attention_desc *desc, fa_tensor_role role) {
    return desc->kv_cache && desc->page_size > 0 && (role == FA_TENSOR_K || role == FA_TENSOR_V);
}

fa_layout fa_desc_layout(const fa_attention_desc *desc, fa_tensor_role role) {
    const fa_tensor_desc *t = fa_desc_tensor(desc, role);
    int is_query = role == FA_TENSOR_Q || role == FA_TENSOR_O;
    fa_layout l;
    l.dtype = t->dtype;
    l.heads = is_query ? desc->heads_q : desc->heads_kv;
    l.seqlen = is_query ? desc->seqlen_q : desc->seqlen_k;
    if (paged_pool(desc, role)) l.seqlen = desc->page_size;
    if (role == FA_TENSOR_K_NEW || role == FA_TENSOR_V_NEW) l.seqlen = desc->seqlen_new;
    l.offset = t->offset;
    l.stride_head = t->stride_head ? t->stride_head : desc->head_dim;
    l.stride_seq = t->stride_seq ? t->stride_seq : mul_saturated(l.heads, desc->head_dim);
    l.stride_batch =
        t->stride_batch ? t->stride_batch : mul_saturated(mul_saturated(l.seqlen, l.heads), desc->head_dim);
    return l;
}

void fa_desc_dims(const fa_attention_desc *desc, fa_tensor_role role, fa_dim dims[4]) {
    const fa_layout l = fa_desc_layout(desc, role);
    const int is_query = role == FA_TENSOR_Q || role == FA_TENSOR_O;
    dims[0] = (fa_dim){desc->head_dim, 1};
    dims[1] = (fa_dim){l.heads, l.stride_head};
    if (paged_pool(desc, role)) {
        dims[2] = (fa_dim){desc->page_size, l.stride_seq};
        dims[3] = (fa_dim){desc->num_pages, l.stride_batch};
    } else if (role == FA_TENSOR_K_NEW || role == FA_TENSOR_V_NEW) {
        dims[2] = (fa_dim){desc->seqlen_new, l.stride_seq};
        dims[3] = (fa_dim){desc->batch, l.stride_batch};
    } else if (desc->cu_seqlens_q) {
        dims[2] = (fa_dim){is_query ? fa_attention_total_q(desc) : fa_attention_total_k(desc), l.stride_seq};
        dims[3] = (fa_dim){1, l.stride_batch};
    } else {
        dims[2] = (fa_dim){l.seqlen, l.stride_seq};
        dims[3] = (fa_dim){desc->batch, l.stride_batch};
    }
}

/* Elements from the offset to one past the last element, 0 for a tensor of
 * no elements; nonzero when that does not fit int64. */
static int tensor_span(const fa_dim dims[4], int64_t *span) {
    int64_t last = 0;
    for (int i = 0; i < 4; i++) {
        if (dims[i].extent <= 0) {
            *span = 0;
            return 0;
        }
        int64_t step;
        if (fa_ckd_mul_i64(&step, dims[i].extent - 1, dims[i].stride) || fa_ckd_add_i64(&last, last, step)) return 1;
    }
    return fa_ckd_add_i64(span, last, 1);
}

int64_t fa_dims_extent(const fa_dim dims[4], int64_t offset) {
    int64_t span, extent;
    if (tensor_span(dims, &span)) return -1;
    if (span == 0) return 0;
    return fa_ckd_add_i64(&extent, offset, span) ? -1 : extent;
}

int64_t fa_desc_tensor_extent(const fa_attention_desc *desc, fa_tensor_role role) {
    fa_dim dims[4];
    fa_desc_dims(desc, role, dims);
    return fa_dims_extent(dims, fa_desc_tensor(desc, role)->offset);
}

int64_t fa_desc_tensor_bytes(const fa_attention_desc *desc, fa_tensor_role role) {
    int64_t extent = fa_desc_tensor_extent(desc, role), bytes;
    if (extent < 0) return -1;
    return fa_ckd_mul_i64(&bytes, extent, (int64_t)fa_dtype_size(fa_desc_tensor(desc, role)->dtype)) ? -1 : bytes;
}

int64_t fa_desc_lse_bytes(const fa_attention_desc *desc) {
    int64_t rows, bytes;
    if (fa_ckd_mul_i64(&rows, fa_attention_total_q(desc), desc->heads_q) ||
        fa_ckd_mul_i64(&bytes, rows, (int64_t)sizeof(float)))
        return -1;
    return bytes;
}

void fa_desc_normalize_windows(fa_attention_desc *d) {
    /* Key j is visible to query i when i + off - left <= j <= i + off + right
     * (off = len_k - len_q, i < len_q, j < len_k): i + off - j is at most
     * len_k - 1 and j - i - off at most len_q - 1, and no sequence is longer
     * than seqlen_k / seqlen_q. */
    if (d->window_left < 0 || (int64_t)d->window_left >= (int64_t)d->seqlen_k - 1) d->window_left = -1;
    if (d->window_right < 0 || (int64_t)d->window_right >= (int64_t)d->seqlen_q - 1) d->window_right = -1;
}

double fa_desc_scale(const fa_attention_desc *desc) {
    if (desc->softmax_scale != 0.0f) return (double)desc->softmax_scale;
    return 1.0 / sqrt((double)desc->head_dim);
}

static fa_status check_positive(int value, const char *name) {
    if (value <= 0) return fa_fail(FA_ERR_INVALID_SIZE, "%s is %d, must be > 0", name, value);
    return FA_SUCCESS;
}

static int dtype_valid(fa_dtype d) {
    return d == FA_DTYPE_F32 || d == FA_DTYPE_F16 || d == FA_DTYPE_BF16 || d == FA_DTYPE_FP8_E4M3;
}

int fa_desc_is_fp8(const fa_attention_desc *desc) { return desc->q.dtype == FA_DTYPE_FP8_E4M3; }

int fa_desc_has_window(const fa_attention_desc *desc) { return desc->window_left >= 0 || desc->window_right >= 0; }

double fa_desc_descale(float factor) { return factor == 0.0f ? 1.0 : (double)factor; }

fa_status fa_check_descale(float factor, const char *name) {
    if (!isfinite(factor) || factor < 0.0f)
        return fa_fail(FA_ERR_BAD_SCALE, "%s = %g: must be finite and > 0 (0 means 1)", name, (double)factor);
    return FA_SUCCESS;
}

/* q, k and v share one dtype and O is in it, except for fp8 inputs, whose
 * O is fp16 or bf16 (the header's rules under descale_q). */
static fa_status check_dtypes(const fa_attention_desc *d) {
    for (int r = FA_TENSOR_Q; r <= FA_TENSOR_O; r++)
        if (!dtype_valid(fa_desc_tensor(d, (fa_tensor_role)r)->dtype))
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.dtype = %d is not a fa_dtype",
                           fa_tensor_role_name((fa_tensor_role)r), (int)fa_desc_tensor(d, (fa_tensor_role)r)->dtype);
    const int fp8 = fa_desc_is_fp8(d);
    for (int r = FA_TENSOR_K; r <= FA_TENSOR_V; r++)
        if (fa_desc_tensor(d, (fa_tensor_role)r)->dtype != d->q.dtype)
            return fa_fail(FA_ERR_DTYPE_MISMATCH, "%s.dtype is %s but q.dtype is %s",
                           fa_tensor_role_name((fa_tensor_role)r),
                           fa_dtype_name(fa_desc_tensor(d, (fa_tensor_role)r)->dtype), fa_dtype_name(d->q.dtype));
    if (fp8 && d->o.dtype != FA_DTYPE_F16 && d->o.dtype != FA_DTYPE_BF16)
        return fa_fail(FA_ERR_DTYPE_MISMATCH, "o.dtype is %s: with %s inputs O is written in fp16 or bf16",
                       fa_dtype_name(d->o.dtype), fa_dtype_name(d->q.dtype));
    if (!fp8 && d->o.dtype != d->q.dtype)
        return fa_fail(FA_ERR_DTYPE_MISMATCH, "o.dtype is %s but q.dtype is %s", fa_dtype_name(d->o.dtype),
                       fa_dtype_name(d->q.dtype));
    const struct { float v; const char *name; } factors[] = {
        {d->descale_q, "descale_q"}, {d->descale_k, "descale_k"}, {d->descale_v, "descale_v"}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(factors); i++) {
        if (!fp8 && factors[i].v != 0.0f)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s = %g: descale factors apply to %s inputs only, q.dtype is %s",
                           factors[i].name, (double)factors[i].v, fa_dtype_name(FA_DTYPE_FP8_E4M3),
                           fa_dtype_name(d->q.dtype));
        FA_CHECK(fa_check_descale(factors[i].v, factors[i].name));
    }
    /* Packed rows are head_dim elements apart: 16 bytes at least for
     * every dtype once fp8 takes a multiple of 16. */
    if (fp8 && d->head_dim % 16 != 0)
        return fa_fail(FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim is %d: %s inputs take multiples of 16", d->head_dim,
                       fa_dtype_name(d->q.dtype));
    return FA_SUCCESS;
}

static fa_status check_seqlens(const fa_attention_desc *d) {
    if (!d->cu_seqlens_q != !d->cu_seqlens_k)
        return fa_fail(FA_ERR_BAD_SEQLENS, "cu_seqlens_q and cu_seqlens_k must both be set or both be NULL");
    if (!d->cu_seqlens_q) return FA_SUCCESS;
    const int32_t *cus[2] = {d->cu_seqlens_q, d->cu_seqlens_k};
    const char *names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
    const int maxlen[2] = {d->seqlen_q, d->seqlen_k};
    for (int which = 0; which < 2; which++) {
        const int32_t *cu = cus[which];
        if (cu[0] != 0)
            return fa_fail(FA_ERR_BAD_SEQLENS, "%s[0] is %d, must be 0", names[which], (int)cu[0]);
        for (int b = 0; b < d->batch; b++) {
            int64_t len = (int64_t)cu[b + 1] - cu[b];
            if (len < 0)
                return fa_fail(FA_ERR_BAD_SEQLENS, "%s decreases at index %d (%d then %d)", names[which],
                               b + 1, (int)cu[b], (int)cu[b + 1]);
            if (len > maxlen[which])
                return fa_fail(FA_ERR_BAD_SEQLENS,
                               "%s: sequence %d has %lld tokens, more than %s = %d", names[which], b,
                               (long long)len, which ? "seqlen_k" : "seqlen_q", maxlen[which]);
        }
    }
    return FA_SUCCESS;
}

/* Signs and 16-byte alignment here; overlap and reach in
 * fa_desc_check_dims. */
static fa_status check_layout(const fa_attention_desc *d, fa_tensor_role role) {
    const fa_tensor_desc *t = fa_desc_tensor(d, role);
    const char *name = fa_tensor_role_name(role);
    if (t->offset < 0) return fa_fail(FA_ERR_BAD_STRIDE, "%s.offset is %lld, must be >= 0", name, (long long)t->offset);
    if (t->stride_batch < 0 || t->stride_seq < 0 || t->stride_head < 0)
        return fa_fail(FA_ERR_BAD_STRIDE, "%s has a negative stride", name);
    const int64_t elem = (int64_t)fa_dtype_size(t->dtype);
    /* Packed strides (0) are multiples of head_dim, so of 8 elements. */
    const struct { int64_t v; const char *field; } aligned[] = {
        {t->offset, "offset"}, {t->stride_batch, "stride_batch"}, {t->stride_seq, "stride_seq"},
        {t->stride_head, "stride_head"}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(aligned); i++) {
        if (i == 1 && d->cu_seqlens_q) continue; /* stride_batch unused with varlen */
        /* v * elem is a multiple of 16 exactly when v is one of 16 / elem
         * (elem divides 16): no product that could overflow. */
        if (aligned[i].v % (16 / elem) != 0)
            return fa_fail(FA_ERR_MISALIGNED, "%s.%s = %lld elements (of %lld bytes) is not a multiple of 16 bytes",
                           name, aligned[i].field, (long long)aligned[i].v, (long long)elem);
    }
    fa_dim dims[4];
    fa_desc_dims(d, role, dims);
    const int explicit_strides = t->stride_batch || t->stride_seq || t->stride_head;
    return fa_desc_check_dims(name, dims, t->offset, elem, explicit_strides);
}

/* dims[0] is the contiguous dimension (stride 1). Strides must describe
 * distinct elements: sorted by stride, each outer dimension must step past
 * everything the smaller ones reach. Then the whole tensor, offset
 * included, must end within FA_MAX_TENSOR_BYTES of the buffer start. */
fa_status fa_desc_check_dims(const char *name, const fa_dim dims[4], int64_t offset, int64_t elem,
                             int explicit_strides) {
    /* Insertion sort of the three outer dimensions by stride. */
    fa_dim sorted[4] = {dims[0], dims[1], dims[2], dims[3]};
    for (int i = 2; i < 4; i++)
        for (int j = i; j > 1 && sorted[j].stride < sorted[j - 1].stride; j--) {
            fa_dim tmp = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = tmp;
        }
    int64_t reach = dims[0].extent - 1; /* largest offset reached so far */
    for (int i = 1; i < 4; i++) {
        if (sorted[i].extent <= 1) continue;
        if (sorted[i].stride <= reach)
            return fa_fail(FA_ERR_BAD_STRIDE,
                           "%s strides overlap: a stride of %lld elements steps inside the %llu elements "
                           "the smaller dimensions span",
                           name, (long long)sorted[i].stride, (unsigned long long)reach + 1u);
        int64_t step;
        if (fa_ckd_mul_i64(&step, sorted[i].stride, sorted[i].extent - 1) || fa_ckd_add_i64(&reach, reach, step))
            return fa_fail(explicit_strides ? FA_ERR_BAD_STRIDE : FA_ERR_INVALID_SIZE,
                           "%s %s span more than 2^63 elements", name, explicit_strides ? "strides" : "sizes");
    }
    /* The span (reach + 1 elements) and the offset in bytes, each bounded
     * before they are added. */
    int64_t span_bytes = 0, offset_bytes = 0;
    const int64_t limit = FA_MAX_TENSOR_BYTES;
    if (fa_ckd_add_i64(&reach, reach, 1) || fa_ckd_mul_i64(&span_bytes, reach, elem) || span_bytes > limit)
        return fa_fail(explicit_strides ? FA_ERR_BAD_STRIDE : FA_ERR_INVALID_SIZE,
                       "%s %s span more than the 2^62 bytes a tensor may reach", name,
                       explicit_strides ? "strides" : "sizes (batch, seqlen, heads, head_dim)");
    if (fa_ckd_mul_i64(&offset_bytes, offset, elem) || offset_bytes > limit - span_bytes)
        return fa_fail(FA_ERR_BAD_STRIDE,
                       "%s.offset = %lld elements puts the tensor's last byte past the 2^62 bytes a tensor may "
                       "reach (it spans %lld bytes)",
                       name, (long long)offset, (long long)span_bytes);
    return FA_SUCCESS;
}

fa_status fa_attention_desc_check(const fa_attention_desc *d) {
    if (!d) return fa_fail(FA_ERR_NULL_POINTER, "desc is NULL");
    FA_CHECK(check_positive(d->batch, "batch"));
    FA_CHECK(check_positive(d->seqlen_q, "seqlen_q"));
    FA_CHECK(check_positive(d->seqlen_k, "seqlen_k"));
    FA_CHECK(check_positive(d->heads_q, "heads_q"));
    FA_CHECK(check_positive(d->heads_kv, "heads_kv"));
    FA_CHECK(check_positive(d->head_dim, "head_dim"));
    if (d->head_dim % 8 != 0 || d->head_dim > FA_MAX_HEAD_DIM)
        return fa_fail(FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim is %d: supported are multiples of 8 up to %d",
                       d->head_dim, FA_MAX_HEAD_DIM);
    if (d->heads_q % d->heads_kv != 0)
        return fa_fail(FA_ERR_HEADS_MISMATCH, "heads_q = %d is not a multiple of heads_kv = %d", d->heads_q,
                       d->heads_kv);
    FA_CHECK(check_seqlens(d));
    if (fa_attention_total_q(d) > FA_MAX_TOKENS || fa_attention_total_k(d) > FA_MAX_TOKENS)
        return fa_fail(FA_ERR_INVALID_SIZE, "more than %d tokens in the batch", FA_MAX_TOKENS);
    FA_CHECK(check_dtypes(d));
    /* The KV-cache fields first: they decide the K and V layouts (pools of
     * pages), and the options they exclude are named before anything of
     * the excluded option's own is checked. */
    FA_CHECK(fa_desc_check_kvcache(d));
    for (int r = FA_TENSOR_Q; r <= FA_TENSOR_O; r++) FA_CHECK(check_layout(d, (fa_tensor_role)r));
    if (d->kv_cache && d->seqlen_new > 0)
        for (int r = FA_TENSOR_K_NEW; r <= FA_TENSOR_V_NEW; r++) FA_CHECK(check_layout(d, (fa_tensor_role)r));
    if (!isfinite(d->softmax_scale) || d->softmax_scale < 0.0f)
        return fa_fail(FA_ERR_BAD_SCALE, "softmax_scale = %g: must be finite and > 0 (0 selects 1/sqrt(head_dim))",
                       (double)d->softmax_scale);
    if (d->causal != 0 && d->causal != 1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "causal = %d, must be 0 or 1", d->causal);
    if (d->block_mask) {
        if (d->block_q <= 0 || d->block_k <= 0)
            return fa_fail(FA_ERR_BAD_MASK, "block_q = %d and block_k = %d must be > 0 with a block mask", d->block_q,
                           d->block_k);
        /* Block counts in int64: seqlen + block - 1 overflows int at INT_MAX. */
        const int64_t rows = ((int64_t)d->seqlen_q + d->block_q - 1) / d->block_q;
        const int64_t cols = ((int64_t)d->seqlen_k + d->block_k - 1) / d->block_k;
        int64_t blocks;
        if (fa_ckd_mul_i64(&blocks, rows, cols) || (uint64_t)blocks != (uint64_t)d->block_mask_bytes)
            return fa_fail(FA_ERR_BAD_MASK, "block_mask_bytes is %zu, expected %lld x %lld blocks", d->block_mask_bytes,
                           (long long)rows, (long long)cols);
    } else if (d->block_mask_bytes != 0) {
        return fa_fail(FA_ERR_BAD_MASK, "block_mask is NULL but block_mask_bytes is %zu", d->block_mask_bytes);
    }
    if (!isfinite(d->dropout_p) || d->dropout_p < 0.0f || d->dropout_p >= 1.0f)
        return fa_fail(FA_ERR_BAD_DROPOUT, "dropout_p = %g, must be in [0, 1)", (double)d->dropout_p);
    if (d->algorithm != FA_ALGO_FUSED && d->algorithm != FA_ALGO_STANDARD)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "algorithm = %d is not a fa_algorithm", (int)d->algorithm);
    if (d->deterministic != 0 && d->deterministic != 1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "deterministic = %d, must be 0 or 1", d->deterministic);
    if (d->allow_tf32 != 0 && d->allow_tf32 != 1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "allow_tf32 = %d, must be 0 or 1", d->allow_tf32);
    return fa_desc_check_options(d);
}
