#include "fuzz_gen.h"

#include "planner.h"

#include <stdlib.h>
#include <string.h>

/* Small shapes: a pass on the reference costs batch * heads * sq * sk * d. */
#define SMALL_BATCH 3
#define SMALL_SEQ 24
#define SMALL_HEADS 3
#define SMALL_DIM 64
/* Varlen offsets are only given for batches whose batch + 1 entries can be
 * allocated as the header asks. */
#define MAX_VARLEN_BATCH 64
/* Block masks larger than this are given the wrong size instead. */
#define MAX_MASK_BYTES 4096

static int64_t mul_or_zero(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? 0 : r;
}

static int64_t add_or_zero(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? 0 : r;
}

static fa_dtype read_dtype(fz_in *in) { return (fa_dtype)fz_int(in, 0, 3, 1); }

/* Offsets and strides in elements, multiples of 16 bytes when small. */
static void read_layout(fz_in *in, fa_tensor_desc *t, int heads, int seqlen, int d) {
    int64_t align = t->dtype == FA_DTYPE_F32 ? 4 : t->dtype == FA_DTYPE_FP8_E4M3 ? 16 : 8;
    t->offset = fz_i64(in, 0, 4 * align, align);
    t->stride_batch = t->stride_seq = t->stride_head = 0;
    switch (fz_choose(in, 4)) {
    case 0: /* packed */
        break;
    case 1: /* [batch, heads, seq, head_dim] */
        t->stride_seq = d;
        t->stride_head = mul_or_zero(seqlen, d);
        t->stride_batch = mul_or_zero(heads, t->stride_head);
        break;
    case 2: /* packed order with gaps */
        t->stride_head = add_or_zero(d, fz_i64(in, 0, 2 * align, align));
        t->stride_seq = add_or_zero(mul_or_zero(heads, t->stride_head), fz_i64(in, 0, 2 * align, align));
        t->stride_batch = add_or_zero(mul_or_zero(seqlen, t->stride_seq), fz_i64(in, 0, 2 * align, align));
        break;
    default: /* anything */
        t->stride_batch = fz_i64(in, 0, 64 * align, align);
        t->stride_seq = fz_i64(in, 0, 64 * align, align);
        t->stride_head = fz_i64(in, 0, 64 * align, align);
        break;
    }
}

/* batch + 1 cumulative offsets: increments up to the longest sequence, or
 * extremes (which make them decrease, wrap or exceed the longest). */
static int32_t *read_cu(fz_in *in, int batch, int longest) {
    int32_t *cu = malloc(((size_t)batch + 1) * sizeof *cu);
    if (!cu) return NULL;
    int64_t at = fz_int(in, 0, 0, 1);
    cu[0] = (int32_t)at;
    for (int b = 0; b < batch; b++) {
        at += fz_int(in, 0, longest < 0 ? 0 : longest < SMALL_SEQ ? longest : SMALL_SEQ, 1);
        cu[b + 1] = (int32_t)(uint32_t)(uint64_t)at; /* wraps on purpose */
    }
    return cu;
}

static void read_mask(fz_in *in, fz_desc *out) {
    fa_attention_desc *d = &out->d;
    d->block_q = fz_int(in, 1, 16, 1);
    d->block_k = fz_int(in, 1, 16, 1);
    size_t bytes = 0;
    if (d->block_q > 0 && d->block_k > 0 && d->seqlen_q > 0 && d->seqlen_k > 0) {
        size_t rows = ((size_t)d->seqlen_q + (size_t)d->block_q - 1) / (size_t)d->block_q;
        size_t cols = ((size_t)d->seqlen_k + (size_t)d->block_k - 1) / (size_t)d->block_k;
        if (rows <= MAX_MASK_BYTES && cols <= MAX_MASK_BYTES) bytes = rows * cols;
    }
    /* Mostly the size the check expects; sometimes another one. */
    if (fz_choose(in, 8) == 0 || bytes == 0 || bytes > MAX_MASK_BYTES) bytes = fz_size(in, 1, 64);
    if (bytes > MAX_MASK_BYTES) bytes = MAX_MASK_BYTES;
    out->mask = malloc(bytes);
    if (!out->mask) return;
    /* Density and pattern from two bytes: all open, all masked, or mixed. */
    unsigned density = fz_byte(in), state = fz_byte(in) | 1u;
    for (size_t i = 0; i < bytes; i++) {
        state = state * 1103515245u + 12345u;
        out->mask[i] = (uint8_t)(((state >> 16) & 0xff) < density);
    }
    d->block_mask = out->mask;
    d->block_mask_bytes = bytes;
}

/* The score options: softcap, ALiBi slopes (exactly heads_q floats, any
 * values) and an additive bias of any shape, dtype and layout. */
static void read_score_options(fz_in *in, fz_desc *out) {
    fa_attention_desc *d = &out->d;
    int which = fz_choose(in, 8);
    if (which & 1) d->softcap = fz_float(in, 0.0f, 8.0f);
    if ((which & 2) && d->heads_q >= 1 && d->heads_q <= MAX_VARLEN_BATCH) {
        out->slopes = malloc((size_t)d->heads_q * sizeof *out->slopes);
        if (out->slopes)
            for (int h = 0; h < d->heads_q; h++) out->slopes[h] = fz_float(in, 0.0f, 1.0f);
        d->alibi_slopes = out->slopes;
    }
    if (which & 4) {
        switch (fz_choose(in, 4)) {
        case 0: d->bias_batch = 1; break;
        case 1: d->bias_batch = d->batch; break;
        case 2: d->bias_batch = 0; break;
        default: d->bias_batch = fz_int(in, -1, SMALL_BATCH, 1); break;
        }
        d->bias_heads = fz_choose(in, 3) == 0 ? d->heads_q : fz_int(in, 0, SMALL_HEADS, 1);
        d->bias.dtype = read_dtype(in);
        /* Keys contiguous: the layout of a [bias_batch, bias_heads,
         * seqlen_q] tensor of rows seqlen_k long. */
        read_layout(in, &d->bias, d->bias_heads, d->seqlen_q, d->seqlen_k);
    }
}

/* The options a KV-cache step refuses (the header's list), cleared so that
 * most KV-cache descriptors get past the check to the step itself. */
static void clear_kvcache_exclusions(fz_desc *out) {
    fa_attention_desc *d = &out->d;
    free(out->mask);
    free(out->cu_q);
    free(out->cu_k);
    out->mask = NULL;
    out->cu_q = out->cu_k = NULL;
    d->block_mask = NULL;
    d->block_mask_bytes = 0;
    d->cu_seqlens_q = d->cu_seqlens_k = NULL;
    d->dropout_p = 0.0f;
    d->algorithm = FA_ALGO_FUSED;
    d->bias_batch = d->bias_heads = 0;
    memset(&d->bias, 0, sizeof d->bias);
    if (d->q.dtype == FA_DTYPE_FP8_E4M3) {
        d->q.dtype = d->k.dtype = d->v.dtype = d->o.dtype = FA_DTYPE_F16;
        d->descale_q = d->descale_k = d->descale_v = 0.0f;
    }
}

/* The KV-cache fields: a contiguous or paged cache (valid page sizes, or
 * ones the check must refuse: not multiples of 16, past 256, 0 or
 * negative with pages), pools of a few pages or absurd counts, appends from
 * none to past the capacity with k_new and v_new present or missing, and
 * rotary embeddings of any width. Mostly a descriptor the check accepts;
 * now and then the fields with kv_cache = 0, or with options the step
 * refuses. */
static void read_kvcache(fz_in *in, fz_desc *out) {
    fa_attention_desc *d = &out->d;
    const int hostile = fz_choose(in, 8) == 0;
    d->kv_cache = hostile ? fz_int(in, 0, 2, 1) : 1;
    if (!hostile || fz_choose(in, 2)) clear_kvcache_exclusions(out);
    switch (fz_choose(in, 4)) {
    case 0: /* contiguous: k and v as read */
        if (hostile) d->num_pages = fz_int(in, 0, 4, 1);
        break;
    case 1: /* paged, hostile page sizes and pool sizes */
        d->page_size = fz_int(in, -16, 272, 8);
        d->num_pages = fz_int(in, -1, 8, 1);
        read_layout(in, &d->k, d->heads_kv, d->page_size, d->head_dim);
        read_layout(in, &d->v, d->heads_kv, d->page_size, d->head_dim);
        break;
    default: /* paged, valid: pools of a few small pages */
        d->page_size = fz_choose(in, 4) ? 16 : fz_int(in, 16, 64, 16);
        d->num_pages = fz_int(in, 1, 8, 1);
        read_layout(in, &d->k, d->heads_kv, d->page_size, d->head_dim);
        read_layout(in, &d->v, d->heads_kv, d->page_size, d->head_dim);
        break;
    }
    d->k.dtype = d->v.dtype = d->o.dtype = hostile && fz_choose(in, 4) == 0 ? read_dtype(in) : d->q.dtype;
    /* Appends up to the capacity (and past it, or negative, through the
     * pickers' extremes). */
    d->seqlen_new = fz_choose(in, 3) == 0 ? 0 : fz_int(in, 1, d->seqlen_k > 0 ? d->seqlen_k : 1, 1);
    const int given = d->seqlen_new != 0 ? fz_choose(in, 16) != 0 : fz_choose(in, 16) == 0;
    if (given) {
        fa_tensor_desc *news[2] = {&d->k_new, &d->v_new};
        for (int i = 0; i < 2; i++) {
            news[i]->dtype = fz_choose(in, 16) == 0 ? read_dtype(in) : d->q.dtype;
            read_layout(in, news[i], d->heads_kv, d->seqlen_new, d->head_dim);
        }
    }
    switch (fz_choose(in, 4)) {
    case 0: break;
    case 1: d->rotary_dim = fz_int(in, -3, 2 * SMALL_DIM + 8, 1); break; /* odd, too large, negative */
    default: d->rotary_dim = fz_int(in, 2, d->head_dim > 2 ? d->head_dim : 2, 2); break;
    }
    d->rotary_interleaved = fz_int(in, 0, 1, 1);
}

void fz_desc_read(fz_in *in, fz_desc *out) {
    memset(out, 0, sizeof *out);
    fa_attention_desc *d = &out->d;
    fa_attention_desc_init(d);
    d->batch = fz_int(in, 1, SMALL_BATCH, 1);
    d->seqlen_q = fz_int(in, 1, SMALL_SEQ, 1);
    d->seqlen_k = fz_int(in, 1, SMALL_SEQ, 1);
    d->heads_kv = fz_int(in, 1, SMALL_HEADS, 1);
    int group = fz_int(in, 1, SMALL_HEADS, 1);
    int64_t heads_q = mul_or_zero(d->heads_kv, group);
    d->heads_q = heads_q > 0 && heads_q <= 1 << 20 ? (int)heads_q : group;
    d->head_dim = fz_int(in, 8, SMALL_DIM, 8);

    d->q.dtype = read_dtype(in);
    fa_tensor_desc *others[3] = {&d->k, &d->v, &d->o};
    for (int i = 0; i < 3; i++) others[i]->dtype = fz_choose(in, 16) == 0 ? read_dtype(in) : d->q.dtype;
    /* fp8 inputs write O in fp16 or bf16: mostly a valid pair. */
    if (d->q.dtype == FA_DTYPE_FP8_E4M3 && d->o.dtype == d->q.dtype)
        d->o.dtype = fz_choose(in, 2) ? FA_DTYPE_BF16 : FA_DTYPE_F16;
    read_layout(in, &d->q, d->heads_q, d->seqlen_q, d->head_dim);
    read_layout(in, &d->k, d->heads_kv, d->seqlen_k, d->head_dim);
    read_layout(in, &d->v, d->heads_kv, d->seqlen_k, d->head_dim);
    read_layout(in, &d->o, d->heads_q, d->seqlen_q, d->head_dim);

    d->softmax_scale = fz_float(in, 0.0f, 2.0f);
    d->causal = fz_int(in, 0, 1, 1);
    d->window_left = fz_int(in, -1, SMALL_SEQ, 1);
    d->window_right = fz_int(in, -1, SMALL_SEQ, 1);

    uint8_t flags = fz_byte(in);
    if (flags & 1) read_mask(in, out);
    else if (flags & 2) d->block_mask_bytes = fz_size(in, 0, 16); /* without a mask: must be 0 */
    if (flags & 4) {
        d->dropout_p = fz_float(in, 0.0f, 0.9f);
        d->dropout_seed = (uint64_t)fz_i64(in, 0, 255, 1);
        d->dropout_offset = (uint64_t)fz_i64(in, 0, 255, 1);
    }
    if ((flags & 8) && d->batch >= 1 && d->batch <= MAX_VARLEN_BATCH) {
        out->cu_q = read_cu(in, d->batch, d->seqlen_q);
        out->cu_k = read_cu(in, d->batch, d->seqlen_k);
        /* One of the two alone is an error the check must name. */
        if (flags & 16) {
            free(out->cu_k);
            out->cu_k = NULL;
        }
        d->cu_seqlens_q = out->cu_q;
        d->cu_seqlens_k = out->cu_k;
    }
    if (flags & 32) {
        d->algorithm = (fa_algorithm)fz_int(in, 0, 1, 1);
        d->deterministic = fz_int(in, 0, 1, 1);
        d->allow_tf32 = fz_int(in, 0, 1, 1);
    }
    if (flags & 64) read_score_options(in, out);
    /* Descale factors: valid ones for fp8 inputs, now and then a value the
     * check must refuse (negative, or set for another dtype). */
    if (d->q.dtype == FA_DTYPE_FP8_E4M3 || fz_choose(in, 32) == 0) {
        d->descale_q = fz_float(in, -0.5f, 4.0f);
        d->descale_k = fz_float(in, 0.0f, 4.0f);
        d->descale_v = fz_float(in, 0.0f, 4.0f);
    }
    if (flags & 128) read_kvcache(in, out);
}

static void *dup_bytes(const void *p, size_t n) {
    if (!p) return NULL;
    void *c = malloc(n ? n : 1);
    if (c) memcpy(c, p, n);
    return c;
}

int fz_desc_copy(fz_desc *out, const fz_desc *src) {
    *out = *src;
    size_t cu_bytes = ((size_t)src->d.batch + 1) * sizeof(int32_t);
    out->cu_q = src->cu_q ? dup_bytes(src->cu_q, cu_bytes) : NULL;
    out->cu_k = src->cu_k ? dup_bytes(src->cu_k, cu_bytes) : NULL;
    out->mask = src->mask ? dup_bytes(src->mask, src->d.block_mask_bytes) : NULL;
    out->slopes = src->slopes ? dup_bytes(src->slopes, (size_t)src->d.heads_q * sizeof(float)) : NULL;
    out->d.cu_seqlens_q = out->cu_q;
    out->d.cu_seqlens_k = out->cu_k;
    out->d.alibi_slopes = out->slopes;
    if (src->d.block_mask) out->d.block_mask = out->mask;
    if ((src->cu_q && !out->cu_q) || (src->cu_k && !out->cu_k) || (src->mask && !out->mask) ||
        (src->slopes && !out->slopes)) {
        fz_desc_free(out);
        return 0;
    }
    return 1;
}

void fz_desc_free(fz_desc *d) {
    free(d->cu_q);
    free(d->cu_k);
    free(d->mask);
    free(d->slopes);
    memset(d, 0, sizeof *d);
}

static void print_tensor(FILE *f, const char *name, const fa_tensor_desc *t) {
    fprintf(f, "    %s: dtype %d offset %lld strides batch %lld seq %lld head %lld\n", name, (int)t->dtype,
            (long long)t->offset, (long long)t->stride_batch, (long long)t->stride_seq, (long long)t->stride_head);
}

static void print_cu(FILE *f, const char *name, const int32_t *cu, int batch) {
    if (!cu) return;
    fprintf(f, "    %s:", name);
    for (int b = 0; b <= batch; b++) fprintf(f, " %d", (int)cu[b]);
    fputc('\n', f);
}

void fz_desc_print(FILE *f, const fz_desc *x) {
    const fa_attention_desc *d = &x->d;
    fprintf(f, "    batch %d seqlen_q %d seqlen_k %d heads_q %d heads_kv %d head_dim %d\n", d->batch, d->seqlen_q,
            d->seqlen_k, d->heads_q, d->heads_kv, d->head_dim);
    print_tensor(f, "q", &d->q);
    print_tensor(f, "k", &d->k);
    print_tensor(f, "v", &d->v);
    print_tensor(f, "o", &d->o);
    fprintf(f, "    scale %g causal %d window %d,%d mask %s (%zu bytes, blocks %d x %d)\n", (double)d->softmax_scale,
            d->causal, d->window_left, d->window_right, d->block_mask ? "on" : "off", d->block_mask_bytes,
            d->block_q, d->block_k);
    fprintf(f, "    dropout %g seed %llu offset %llu algorithm %d deterministic %d allow_tf32 %d\n",
            (double)d->dropout_p, (unsigned long long)d->dropout_seed, (unsigned long long)d->dropout_offset,
            (int)d->algorithm, d->deterministic, d->allow_tf32);
    print_cu(f, "cu_seqlens_q", d->cu_seqlens_q, d->batch);
    print_cu(f, "cu_seqlens_k", d->cu_seqlens_k, d->batch);
    fprintf(f, "    softcap %g alibi %s bias batch %d heads %d\n", (double)d->softcap, d->alibi_slopes ? "on" : "off",
            d->bias_batch, d->bias_heads);
    if (d->bias_batch) print_tensor(f, "bias", &d->bias);
    if (!d->kv_cache && !d->page_size && !d->num_pages && !d->seqlen_new && !d->rotary_dim) return;
    fprintf(f, "    kv_cache %d page_size %d num_pages %d seqlen_new %d rotary_dim %d interleaved %d\n", d->kv_cache,
            d->page_size, d->num_pages, d->seqlen_new, d->rotary_dim, d->rotary_interleaved);
    print_tensor(f, "k_new", &d->k_new);
    print_tensor(f, "v_new", &d->v_new);
}

static void read_text(fz_in *in, char *out, size_t cap) {
    size_t len = (size_t)fz_choose(in, (int)cap);
    for (size_t i = 0; i < len; i++) out[i] = (char)(fz_byte(in) | 1); /* no NUL inside */
    out[len] = '\0';
}

void fz_device_read(fz_in *in, fa_device_desc *out) {
    int base = fz_choose(in, fa_described_device_count() + 1);
    const fa_described_device *dd = fa_described_device_get(base);
    if (dd) *out = dd->desc;
    else memset(out, 0, sizeof *out);
    int changes = fz_choose(in, 4);
    for (int c = 0; c < changes; c++) {
        switch (fz_choose(in, 18)) {
        case 0: out->local_mem_bytes = fz_size(in, 1, 256 << 10); break;
        case 1: out->max_work_group_size = fz_int(in, 32, 1024, 32); break;
        case 2: out->simd_width = fz_int(in, 1, 64, 1); break;
        case 3: out->compute_units = fz_int(in, 1, 256, 1); break;
        case 4: out->clock_mhz = fz_int(in, 100, 3000, 100); break;
        case 5: out->bandwidth_gbs = fz_double(in, 0.0, 5000.0); break;
        case 6: out->fp32_flops_per_clock_cu = fz_double(in, 0.0, 512.0); break;
        case 7: out->matrix_flops_per_clock_cu = fz_double(in, 0.0, 8192.0); break;
        case 8: out->matrix_m = fz_int(in, 0, 64, 8); break;
        case 9: out->matrix_n = fz_int(in, 0, 64, 8); break;
        case 10: out->matrix_k = fz_int(in, 0, 64, 8); break;
        case 11: out->l2_cache_bytes = fz_size(in, 0, 64 << 10); break;
        case 12: out->global_mem_bytes = fz_size(in, 0, 64 << 10); break;
        case 13: out->backend = (fa_backend)fz_int(in, 0, 3, 1); break;
        case 14: out->type = (fa_device_type)fz_int(in, 0, 2, 1); break;
        case 15: read_text(in, out->arch, sizeof out->arch); break;
        case 16: read_text(in, out->name, sizeof out->name); break;
        default: out->bandwidth_measured = fz_int(in, 0, 1, 1); break;
        }
    }
}

void fz_device_print(FILE *f, const fa_device_desc *d) {
    fprintf(f, "    device \"%s\" arch \"%s\" backend %d type %d local %zu wg %d simd %d cu %d clock %d\n", d->name,
            d->arch, (int)d->backend, (int)d->type, d->local_mem_bytes, d->max_work_group_size, d->simd_width,
            d->compute_units, d->clock_mhz);
    fprintf(f, "    bandwidth %g (measured %d) global %zu fp32 %g matrix %g (%d x %d x %d) l2 %zu\n", d->bandwidth_gbs,
            d->bandwidth_measured, d->global_mem_bytes, d->fp32_flops_per_clock_cu, d->matrix_flops_per_clock_cu,
            d->matrix_m, d->matrix_n, d->matrix_k, d->l2_cache_bytes);
}
