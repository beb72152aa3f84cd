/* The KV-cache fields of a descriptor (include/flashattn.h, kv_cache and
 * after): their argument check and the sizes derived from them. The K and
 * V layouts of a paged cache (pools of pages) are core/desc.c's
 * (fa_desc_dims), checked with the other tensors after this. */
#include "desc.h"

#include "checked.h"
#include "fa_internal.h"

#define FA_PAGE_ALIGN 16
#define FA_MAX_PAGE_SIZE 256

static int tensor_desc_unset(const fa_tensor_desc *t) {
    return t->dtype == FA_DTYPE_F32 && t->offset == 0 && t->stride_batch == 0 && t->stride_seq == 0 &&
           t->stride_head == 0;
}

/* With kv_cache 0 every other field of the cache must be unset: a field
 * given without it would be silently ignored. */
static fa_status check_unset(const fa_attention_desc *d) {
    const struct {
        int value;
        const char *name;
    } ints[] = {{d->page_size, "page_size"},   {d->num_pages, "num_pages"},   {d->seqlen_new, "seqlen_new"},
                {d->rotary_dim, "rotary_dim"}, {d->rotary_interleaved, "rotary_interleaved"}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(ints); i++)
        if (ints[i].value != 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s = %d with kv_cache = 0: the KV-cache fields need kv_cache = 1",
                           ints[i].name, ints[i].value);
    if (!tensor_desc_unset(&d->k_new))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "k_new is set with kv_cache = 0: the KV-cache fields need kv_cache = 1");
    if (!tensor_desc_unset(&d->v_new))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "v_new is set with kv_cache = 0: the KV-cache fields need kv_cache = 1");
    return FA_SUCCESS;
}

/* The options a KV-cache step does not take (the header's list). */
static fa_status check_excluded(const fa_attention_desc *d) {
    if (d->bias_batch != 0 || d->bias_heads != 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "bias (bias_batch = %d) is not available with kv_cache = 1",
                       d->bias_batch);
    if (d->dropout_p != 0.0f)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "dropout_p = %g: dropout is not available with kv_cache = 1 (a forward "
                                                "for inference)",
                       (double)d->dropout_p);
    if (d->block_mask || d->block_mask_bytes)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "block_mask: block-sparse masks are not available with kv_cache = 1");
    if (d->cu_seqlens_q || d->cu_seqlens_k)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "cu_seqlens_q / cu_seqlens_k: variable-length batches are not available with kv_cache = 1 "
                       "(the cache lengths are fa_kvcache_args.cache_seqlens)");
    if (d->algorithm != FA_ALGO_FUSED)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "algorithm = %d: a KV-cache step runs the fused algorithm only",
                       (int)d->algorithm);
    return FA_SUCCESS;
}

static fa_status check_pages(const fa_attention_desc *d) {
    if (d->page_size == 0) {
        if (d->num_pages != 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "num_pages = %d with page_size = 0 (a contiguous cache): must be 0",
                           d->num_pages);
        return FA_SUCCESS;
    }
    if (d->page_size < FA_PAGE_ALIGN || d->page_size > FA_MAX_PAGE_SIZE || d->page_size % FA_PAGE_ALIGN != 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "page_size = %d: must be 0 (contiguous) or a multiple of %d in [%d, %d]",
                       d->page_size, FA_PAGE_ALIGN, FA_PAGE_ALIGN, FA_MAX_PAGE_SIZE);
    if (d->num_pages <= 0)
        return fa_fail(FA_ERR_INVALID_SIZE, "num_pages = %d: a paged cache (page_size = %d) needs num_pages > 0",
                       d->num_pages, d->page_size);
    /* The block table: int32 entries, within the bound every tensor keeps. */
    const int64_t entries = fa_desc_block_table_entries(d);
    int64_t bytes;
    if (entries < 0 || fa_ckd_mul_i64(&bytes, entries, (int64_t)sizeof(int32_t)) || bytes > FA_MAX_TENSOR_BYTES)
        return fa_fail(FA_ERR_INVALID_SIZE,
                       "the block table (batch = %d x ceil(seqlen_k / page_size) = %lld int32) spans more than 2^62 "
                       "bytes",
                       d->batch, (long long)fa_desc_pages_per_seq(d));
    return FA_SUCCESS;
}

static fa_status check_new_tokens(const fa_attention_desc *d) {
    if (d->seqlen_new < 0)
        return fa_fail(FA_ERR_INVALID_SIZE, "seqlen_new = %d: must be >= 0", d->seqlen_new);
    if (d->seqlen_new > d->seqlen_k)
        return fa_fail(FA_ERR_INVALID_SIZE, "seqlen_new = %d exceeds seqlen_k = %d, the cache's capacity",
                       d->seqlen_new, d->seqlen_k);
    const fa_tensor_desc *news[2] = {&d->k_new, &d->v_new};
    const char *names[2] = {"k_new", "v_new"};
    for (int i = 0; i < 2; i++) {
        if (d->seqlen_new == 0) {
            if (!tensor_desc_unset(news[i]))
                return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s is set but seqlen_new = 0 (nothing is appended)",
                               names[i]);
            continue;
        }
        if (news[i]->dtype != d->q.dtype)
            return fa_fail(FA_ERR_DTYPE_MISMATCH, "%s.dtype = %d but q.dtype is %s: appended tokens are in q's dtype",
                           names[i], (int)news[i]->dtype, fa_dtype_name(d->q.dtype));
    }
    /* Their layouts (signs, alignment, overlap, reach) are checked with
     * the other tensors (core/desc.c). */
    return FA_SUCCESS;
}

static fa_status check_rotary(const fa_attention_desc *d) {
    if (d->rotary_interleaved != 0 && d->rotary_interleaved != 1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "rotary_interleaved = %d, must be 0 or 1", d->rotary_interleaved);
    if (d->rotary_dim < 0 || d->rotary_dim % 2 != 0 || d->rotary_dim > d->head_dim)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "rotary_dim = %d: must be even, in [0, head_dim = %d]", d->rotary_dim,
                       d->head_dim);
    return FA_SUCCESS;
}

fa_status fa_desc_check_kvcache(const fa_attention_desc *d) {
    if (d->kv_cache == 0) return check_unset(d);
    if (d->kv_cache != 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "kv_cache = %d, must be 0 or 1", d->kv_cache);
    FA_CHECK(check_excluded(d));
    FA_CHECK(check_pages(d));
    FA_CHECK(check_new_tokens(d));
    return check_rotary(d);
}

int64_t fa_desc_pages_per_seq(const fa_attention_desc *d) {
    if (!d->kv_cache || d->page_size <= 0) return 0;
    return ((int64_t)d->seqlen_k + d->page_size - 1) / d->page_size;
}

int64_t fa_desc_block_table_entries(const fa_attention_desc *d) {
    int64_t n;
    return fa_ckd_mul_i64(&n, d->batch, fa_desc_pages_per_seq(d)) ? -1 : n;
}

int64_t fa_desc_rotary_table_bytes(const fa_attention_desc *d) {
    if (!d->kv_cache || d->rotary_dim <= 0) return 0;
    /* seqlen_k < 2^31 and rotary_dim / 2 <= 128: no overflow. */
    return (int64_t)d->seqlen_k * (d->rotary_dim / 2) * (int64_t)sizeof(float);
}

int fa_desc_rotary_query_offsets(const fa_attention_desc *d) {
    fa_attention_desc n = *d;
    fa_desc_normalize_windows(&n);
    return n.causal || fa_desc_has_window(&n);
}
