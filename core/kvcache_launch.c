/* The host side of a KV-cache step shared by the CUDA and HIP backends
 * (kvcache_launch.h). */
#include "kvcache_launch.h"

#include "desc.h"
#include "fa_internal.h"
#include "plan_data.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* The largest page the kernels take: a 64-key tile spans at most four
 * pages of 16, and the decoding kernel's page ring and the FP32-pipe step's
 * index arithmetic were written for up to 256 tokens a page. */
#define FA_KV_MAX_PAGE 256
#define FA_KV_PAGE_ALIGN 16

static fa_status add_define(fa_kv_defines *out, const char *fmt, int value) {
    if (out->count >= FA_KV_MAX_DEFINES)
        return fa_fail(FA_ERR_INTERNAL, "KV-cache step: more than %d build options", FA_KV_MAX_DEFINES);
    const int n = snprintf(out->text[out->count], FA_KV_DEFINE_SIZE, fmt, value);
    if (n < 0 || n >= FA_KV_DEFINE_SIZE)
        return fa_fail(FA_ERR_INTERNAL, "KV-cache step: a build option does not fit in %d bytes", FA_KV_DEFINE_SIZE);
    out->count++;
    return FA_SUCCESS;
}

/* k_new or v_new: q's dtype, offset and strides in whole 16 bytes. */
static fa_status check_new_rows(const fa_attention_desc *d, const fa_tensor_desc *t, const char *name) {
    if (t->dtype != d->q.dtype)
        return fa_fail(FA_ERR_DTYPE_MISMATCH, "KV-cache step: %s.dtype is %s, q's %s", name, fa_dtype_name(t->dtype),
                       fa_dtype_name(d->q.dtype));
    const int64_t per16 = 16 / (int64_t)fa_dtype_size(t->dtype);
    const int64_t v[4] = {t->offset, t->stride_batch, t->stride_seq, t->stride_head};
    for (int k = 0; k < 4; k++)
        if (v[k] % per16 != 0)
            return fa_fail(FA_ERR_MISALIGNED,
                           "KV-cache step: %s's offset and strides must be multiples of 16 bytes (%lld elements)",
                           name, (long long)v[k]);
    return FA_SUCCESS;
}

fa_status fa_kvcache_defines(const fa_attention_desc *d, fa_kv_defines *out) {
    if (!d || !out) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !d ? "desc" : "out");
    memset(out, 0, sizeof *out);
    if (d->cu_seqlens_q || d->block_mask || d->dropout_p > 0.0f || d->bias_batch != 0)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "KV-cache step: variable-length batches, block masks, dropout and a bias do not apply");
    if (d->page_size < 0 || d->page_size > FA_KV_MAX_PAGE || d->page_size % FA_KV_PAGE_ALIGN)
        return fa_fail(FA_ERR_UNSUPPORTED, "KV-cache step: page_size %d (0, or a multiple of %d up to %d)",
                       d->page_size, FA_KV_PAGE_ALIGN, FA_KV_MAX_PAGE);
    if (d->seqlen_new < 0 || d->seqlen_new > d->seqlen_k)
        return fa_fail(FA_ERR_UNSUPPORTED, "KV-cache step: seqlen_new %d outside [0, seqlen_k = %d]", d->seqlen_new,
                       d->seqlen_k);
    if (d->rotary_dim < 0 || d->rotary_dim > d->head_dim || d->rotary_dim % 2)
        return fa_fail(FA_ERR_UNSUPPORTED, "KV-cache step: rotary_dim %d (even, up to head_dim %d)", d->rotary_dim,
                       d->head_dim);
    if (d->seqlen_new > 0) {
        FA_CHECK(check_new_rows(d, &d->k_new, "k_new"));
        FA_CHECK(check_new_rows(d, &d->v_new, "v_new"));
    }
    FA_CHECK(add_define(out, "-DKV_CACHE", 0));
    if (d->page_size > 0) FA_CHECK(add_define(out, "-DPAGED=%d", d->page_size));
    if (d->seqlen_new > 0) FA_CHECK(add_define(out, "-DAPPEND", 0));
    if (d->rotary_dim > 0) {
        FA_CHECK(add_define(out, "-DROTARY_DIM=%d", d->rotary_dim));
        if (d->rotary_interleaved) FA_CHECK(add_define(out, "-DROTARY_INTERLEAVED", 0));
    }
    return FA_SUCCESS;
}

int fa_kvcache_splits(const fa_kernel_plan *kp) {
    const int split = kp->variant == FA_VARIANT_SPLITK || kp->variant == FA_VARIANT_DECODE;
    return split && kp->split_k > 1 ? kp->split_k : 1;
}

/* Packed rows of a KV head: the GQA group's heads times the tokens. */
static int64_t packed_rows(const fa_attention_desc *d) { return (int64_t)(d->heads_q / d->heads_kv) * d->seqlen_q; }

fa_status fa_kvcache_grid(const fa_attention_desc *d, const fa_kernel_plan *kp, unsigned grid[3]) {
    if (!d || !kp || !grid) return fa_fail(FA_ERR_NULL_POINTER, "desc, plan or grid is NULL");
    if (d->heads_kv <= 0 || kp->br <= 0) return fa_fail(FA_ERR_INTERNAL, "KV-cache step: no rows or KV heads");
    /* Packed rows are ints in the kernels, with room for a tile past them. */
    const int64_t rows = packed_rows(d);
    if (rows > INT_MAX / 2)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "KV-cache step: %lld packed query rows per KV head (heads_q / heads_kv x seqlen_q) exceed the "
                       "kernels' %d",
                       (long long)rows, INT_MAX / 2);
    const int64_t z = (int64_t)d->batch * fa_kvcache_splits(kp);
    if (z > FA_KV_MAX_GRID_YZ || d->heads_kv > (int)FA_KV_MAX_GRID_YZ)
        return fa_fail(FA_ERR_UNSUPPORTED, "KV-cache step: batch * splits (%lld) and heads_kv (%d) must each be at most %u",
                       (long long)z, d->heads_kv, FA_KV_MAX_GRID_YZ);
    grid[0] = (unsigned)fa_tile_count(rows, kp->br);
    grid[1] = (unsigned)d->heads_kv;
    grid[2] = (unsigned)z;
    return FA_SUCCESS;
}

fa_status fa_kvcache_check_simt(const fa_attention_desc *d, const fa_kernel_plan *kp, const char *who) {
    if (!d || !kp) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !d ? "desc" : "plan");
    if (kp->variant != FA_VARIANT_SIMT && kp->variant != FA_VARIANT_SPLITK)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "KV-cache step: %s runs simt and splitk plans on the FP32 pipes, not forward variant %s", who,
                       fa_variant_name(kp->variant));
    if (kp->br <= 0 || kp->bc <= 0 || kp->thread_rows <= 0 || kp->thread_cols <= 0 || kp->br % kp->thread_rows ||
        kp->bc % kp->thread_cols ||
        kp->work_group_size != (kp->br / kp->thread_rows) * (kp->bc / kp->thread_cols) || kp->split_k < 1 ||
        (kp->variant == FA_VARIANT_SPLITK && kp->split_k < 2))
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "KV-cache step: tile %d x %d, micro-tile %d x %d, %d threads, %d splits (%s) is not one the "
                       "%s kernels run",
                       kp->br, kp->bc, kp->thread_rows, kp->thread_cols, kp->work_group_size, kp->split_k,
                       fa_variant_name(kp->variant), who);
    unsigned grid[3];
    return fa_kvcache_grid(d, kp, grid);
}

fa_status fa_kvcache_workspace(const fa_plan_s *plan, int splits, fa_kv_workspace *out) {
    if (!plan || !out) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !plan ? "plan" : "out");
    memset(out, 0, sizeof *out);
    const fa_attention_desc *d = &plan->desc;
    FA_CHECK(fa_workspace_bytes("the sequences' verdicts", (size_t[]){(size_t)d->batch, sizeof(int32_t)}, 2,
                                &out->status_bytes));
    if (splits <= 1) return FA_SUCCESS;
    const size_t s = (size_t)splits, heads = (size_t)d->heads_q, tokens = (size_t)plan->total_q,
                 dim = (size_t)d->head_dim;
    FA_CHECK(fa_workspace_bytes("split-K partial outputs", (size_t[]){s, heads, tokens, dim, sizeof(float)}, 5,
                                &out->part_o_bytes));
    return fa_workspace_bytes("split-K partial log-sum-exps", (size_t[]){s, heads, tokens, sizeof(float)}, 4,
                              &out->part_l_bytes);
}

void fa_kvcache_params(const fa_attention_desc *d, fa_kv_params *kv) {
    memset(kv, 0, sizeof *kv);
    if (d->seqlen_new > 0) {
        const fa_layout kn = fa_desc_layout(d, FA_TENSOR_K_NEW), vn = fa_desc_layout(d, FA_TENSOR_V_NEW);
        kv->kn_off = kn.offset, kv->kn_sb = kn.stride_batch, kv->kn_ss = kn.stride_seq, kv->kn_sh = kn.stride_head;
        kv->vn_off = vn.offset, kv->vn_sb = vn.stride_batch, kv->vn_ss = vn.stride_seq, kv->vn_sh = vn.stride_head;
    }
    kv->seqlen_new = d->seqlen_new;
    if (d->page_size > 0) {
        kv->num_pages = d->num_pages;
        /* ceil(seqlen_k / page_size) <= seqlen_k: an int. */
        kv->max_pages = (int32_t)fa_desc_pages_per_seq(d);
    }
    if (d->softcap > 0.0f) {
        kv->softcap = d->softcap;
        kv->softcap_inv = (float)(1.0 / (double)d->softcap);
    }
}

/* A buffer's device address; required 0 lets it be NULL (address 0). */
static fa_status address_of(void *buf, const char *name, int required, unsigned align, fa_kv_locate_fn locate,
                            uint64_t *out) {
    *out = 0;
    if (!buf) return required ? fa_fail(FA_ERR_NULL_POINTER, "KV-cache step: %s is NULL", name) : FA_SUCCESS;
    uint64_t address = 0;
    size_t bytes = 0;
    locate(buf, &address, &bytes);
    if (address % align)
        return fa_fail(FA_ERR_MISALIGNED, "%s: device address 0x%llx is not %u-byte aligned", name,
                       (unsigned long long)address, align);
    *out = address;
    return FA_SUCCESS;
}

fa_status fa_kvcache_bind(const fa_attention_desc *d, const fa_kvcache_call *a, fa_kv_locate_fn locate,
                          fa_kv_params *kv, fa_kv_tensors *t) {
    if (!d || !a || !locate || !kv || !t) return fa_fail(FA_ERR_NULL_POINTER, "a KV-cache step argument is NULL");
    memset(t, 0, sizeof *t);
    FA_CHECK(address_of(a->q, "q", 1, 16, locate, &t->q));
    FA_CHECK(address_of(a->k_cache, "k_cache", 1, 16, locate, &t->k_cache));
    FA_CHECK(address_of(a->v_cache, "v_cache", 1, 16, locate, &t->v_cache));
    FA_CHECK(address_of(a->o, "o", 1, 16, locate, &t->o));
    FA_CHECK(address_of(a->lse, "lse", 0, 16, locate, &t->lse));
    FA_CHECK(address_of(a->cache_seqlens, "cache_seqlens", 1, 4, locate, &kv->cache_seqlens));
    FA_CHECK(address_of(a->block_table, "block_table", d->page_size > 0, 4, locate, &kv->block_table));
    const int append = d->seqlen_new > 0, rotary = d->rotary_dim > 0;
    FA_CHECK(address_of(append ? a->k_new : NULL, "k_new", append, 16, locate, &kv->k_new));
    FA_CHECK(address_of(append ? a->v_new : NULL, "v_new", append, 16, locate, &kv->v_new));
    FA_CHECK(address_of(rotary ? a->rotary_cos : NULL, "rotary_cos", rotary, 4, locate, &kv->rot_cos));
    return address_of(rotary ? a->rotary_sin : NULL, "rotary_sin", rotary, 4, locate, &kv->rot_sin);
}
