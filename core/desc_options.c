/* The score options of a descriptor (softcap, ALiBi, additive bias): their
 * argument check and the bias layout the reference indexes with. */
#include "desc.h"

#include "checked.h"
#include "dtype.h"
#include "fa_internal.h"

#include <math.h>

/* Packed bias strides of huge shapes saturate, so that the layout check
 * refuses them instead of wrapping around. */
static int64_t packed(int64_t a, int64_t b) {
    int64_t r;
    return fa_ckd_mul_i64(&r, a, b) ? INT64_MAX : r;
}

void fa_desc_bias_dims(const fa_attention_desc *d, fa_dim dims[4]) {
    const fa_tensor_desc *t = &d->bias;
    const int64_t seq = t->stride_seq ? t->stride_seq : d->seqlen_k;
    const int64_t head = t->stride_head ? t->stride_head : packed(d->seqlen_q, d->seqlen_k);
    const int64_t batch = t->stride_batch ? t->stride_batch : packed(d->bias_heads, head);
    dims[0] = (fa_dim){d->seqlen_k, 1};
    dims[1] = (fa_dim){d->seqlen_q, seq};
    dims[2] = (fa_dim){d->bias_heads, head};
    dims[3] = (fa_dim){d->bias_batch, batch};
}

int64_t fa_desc_bias_index(const fa_attention_desc *d, int b, int h, int i, int j) {
    fa_dim dims[4];
    fa_desc_bias_dims(d, dims);
    const int64_t bb = d->bias_batch == 1 ? 0 : b, hh = d->bias_heads == 1 ? 0 : h;
    return d->bias.offset + bb * dims[3].stride + hh * dims[2].stride + (int64_t)i * dims[1].stride + j;
}

int64_t fa_desc_bias_extent(const fa_attention_desc *d) {
    if (d->bias_batch == 0) return 0;
    fa_dim dims[4];
    fa_desc_bias_dims(d, dims);
    return fa_dims_extent(dims, d->bias.offset);
}

int64_t fa_desc_bias_bytes(const fa_attention_desc *d) {
    const int64_t extent = fa_desc_bias_extent(d);
    int64_t bytes;
    if (extent < 0 || fa_ckd_mul_i64(&bytes, extent, (int64_t)fa_dtype_size(d->bias.dtype))) return -1;
    return bytes;
}

const char *fa_desc_option_in_use(const fa_attention_desc *d) {
    if (d->softcap != 0.0f) return "softcap";
    if (d->alibi_slopes) return "alibi_slopes";
    if (d->bias_batch != 0) return "bias";
    return NULL;
}

static fa_status check_bias(const fa_attention_desc *d) {
    if (d->bias_batch == 0) {
        if (d->bias_heads != 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "bias_heads = %d with bias_batch = 0 (no bias): must be 0",
                           d->bias_heads);
        return FA_SUCCESS;
    }
    if (d->bias_batch != 1 && d->bias_batch != d->batch)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "bias_batch = %d: must be 0 (no bias), 1 or batch = %d",
                       d->bias_batch, d->batch);
    if (d->bias_heads != 1 && d->bias_heads != d->heads_q)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "bias_heads = %d: must be 1 or heads_q = %d", d->bias_heads,
                       d->heads_q);
    /* Sequences of a varlen batch have their own lengths: a bias laid out
     * on the longest would be ambiguous, and FlashAttention has none. */
    if (d->cu_seqlens_q)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "bias is not available with variable-length batches (cu_seqlens_q)");
    const fa_tensor_desc *t = &d->bias;
    /* o's dtype is q's, or fp16 / bf16 with fp8 inputs. */
    if (t->dtype != FA_DTYPE_F32 && t->dtype != d->o.dtype)
        return fa_fail(FA_ERR_DTYPE_MISMATCH, "bias.dtype = %d: must be f32 or o's dtype (%s)", (int)t->dtype,
                       fa_dtype_name(d->o.dtype));
    if (t->offset < 0)
        return fa_fail(FA_ERR_BAD_STRIDE, "bias.offset is %lld, must be >= 0", (long long)t->offset);
    if (t->stride_batch < 0 || t->stride_seq < 0 || t->stride_head < 0)
        return fa_fail(FA_ERR_BAD_STRIDE, "bias has a negative stride");
    fa_dim dims[4];
    fa_desc_bias_dims(d, dims);
    const int explicit_strides = t->stride_batch || t->stride_seq || t->stride_head;
    return fa_desc_check_dims("bias", dims, t->offset, (int64_t)fa_dtype_size(t->dtype), explicit_strides);
}

fa_status fa_desc_check_options(const fa_attention_desc *d) {
    if (!isfinite(d->softcap) || d->softcap < 0.0f)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "softcap = %g: must be finite and >= 0 (0: off)", (double)d->softcap);
    if (d->alibi_slopes)
        for (int h = 0; h < d->heads_q; h++)
            if (!isfinite(d->alibi_slopes[h]))
                return fa_fail(FA_ERR_INVALID_ARGUMENT, "alibi_slopes[%d] = %g: must be finite", h,
                               (double)d->alibi_slopes[h]);
    return check_bias(d);
}
