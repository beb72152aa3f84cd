/* Standard (unfused) attention: the element-wise and row-wise steps between
 * the matrix products, which run in CLBlast (backends/opencl/cl_standard.c).
 * Built after common.h, whose dtype loads and stores, masks and Philox it
 * reuses; the tile geometry common.h asks for (BR, BC, TR, TC) is given
 * placeholder values, nothing here tiles.
 *
 * Build options beyond common.h's: STD_WG, the work-group size of the row
 * softmax (a power of two).
 *
 * The score matrices live in fp32 buffers ("chunks", several when one
 * buffer cannot hold them all), one [len_q][len_k] block per (sequence b,
 * query head h) pair, pair = b * heads_q + h, starting at pair_off[pair] in
 * its chunk. A launch covers the pairs [pair0, pair0 + its grid) of one
 * chunk. The products write fp32; the
 * values kept are rounded to the storage dtype where they are read or
 * written (std_round), so that the buffers hold exactly what fp16 or bf16
 * matrices would, which is the precision of unfused attention in that
 * dtype (core/reference.c, fa_ref_standard_forward). */

#ifndef STD_WG
#error "STD_WG must be defined"
#endif

/* x rounded to the storage dtype (nearest even) and widened back. The
 * fp16 rounding goes through vstore_half_rte into a private word: no
 * cl_khr_fp16 is needed for that. */
FA_FN float std_round(float x) {
#if defined(DTYPE_F16)
    ushort bits;
    vstore_half_rte(x, 0, (__private half *)&bits);
    return vload_half(0, (__private const half *)&bits);
#elif defined(DTYPE_BF16)
    return as_float((uint)bf16_round(x) << 16);
#else
    return x;
#endif
}

/* Row i of a pair's block in its chunk. */
FA_FN long std_row(__global const long *pair_off, int pair, const fa_seq *s, int i) {
    return pair_off[pair] + (long)i * s->len_k;
}

FA_FN fa_mask std_mask(const fa_seq *s, int window_left, int window_right, int block_q, int block_k,
                       int block_cols) {
    fa_mask m;
    m.len_q = s->len_q;
    m.len_k = s->len_k;
    m.window_left = window_left;
    m.window_right = window_right;
    m.block_q = block_q;
    m.block_k = block_k;
    m.block_cols = block_cols;
    return m;
}

/* The Philox words of keys j4 .. j4 + 3 (j4 a multiple of four) of row i:
 * one call serves the four, as core/philox.h defines the counter, with
 * the plan's dropout origin (col0 a multiple of 4) on top. */
FA_FN uint4 std_dropout_words(const fa_dropout *dp, int b, int h, int heads_q, int i, int j4) {
    uint bh = (uint)b * (uint)heads_q + (uint)h;
    return fa_philox((uint4)((dp->col0 + (uint)j4) >> 2, dp->row0 + (uint)i, bh, dp->offset_lo), dp->key0,
                     dp->key1);
}

FA_FN uint std_word(uint4 r, int c) { return c == 0 ? r.x : c == 1 ? r.y : c == 2 ? r.z : r.w; }

#define STD_SHAPE_PARAMS                                                        \
    int seqlen_q, int seqlen_k, int heads_q, __global const int *cu_q,          \
        __global const int *cu_k, __global const long *pair_off, int pair0
#define STD_MASK_PARAMS                                                         \
    int window_left, int window_right, __global const uchar *block_mask,        \
        int block_q, int block_k, int block_cols
#define STD_DROPOUT_PARAMS                                                      \
    uint key0, uint key1, uint offset_lo, uint threshold, float keep_scale, uint row0, uint col0

/* ------------------------------------------------------------------------ */
/* Layout and dtype changes                                                  */
/* ------------------------------------------------------------------------ */

/* Element index of token g (over the whole batch), head h, dim 0 of a
 * strided tensor. Without VARLEN, g = b * seqlen + t. */
FA_FN long std_token_row(long off, long sb, long ss, long sh, int seqlen, long g, int h) {
#ifdef VARLEN
    return off + g * ss + (long)h * sh;
#else
    long b = g / seqlen, t = g % seqlen;
    return off + b * sb + t * ss + (long)h * sh;
#endif
}

/* A strided tensor of the storage dtype to a packed fp32 [tokens][heads]
 * [HEAD_DIM] copy, the operand the fp32 products read. Grid: (HEAD_DIM / 8,
 * heads, tokens). */
__kernel void std_convert_in(__global const store_t *src, long off, long sb, long ss, long sh, int heads,
                             int seqlen, __global float *dst) {
    int x8 = get_global_id(0), h = get_global_id(1);
    long g = get_global_id(2);
    float8 v = LOAD8(src, std_token_row(off, sb, ss, sh, seqlen, g, h) + 8 * x8);
    vstore8(v, 0, dst + (g * heads + h) * HEAD_DIM + 8 * x8);
}

/* The reverse: a packed fp32 result rounded into the caller's strided
 * tensor; the gaps between its rows are never written. */
__kernel void std_convert_out(__global const float *src, __global store_t *dst, long off, long sb, long ss,
                              long sh, int heads, int seqlen) {
    int x8 = get_global_id(0), h = get_global_id(1);
    long g = get_global_id(2);
    __global const float *from = src + (g * heads + h) * HEAD_DIM + 8 * x8;
    long to = std_token_row(off, sb, ss, sh, seqlen, g, h) + 8 * x8;
    for (int e = 0; e < 8; e++) STORE1(dst, to + e, from[e]);
}

/* Zeroes len rows (all heads) of an fp32 tensor from element base on: the
 * outputs of a sequence that has no keys (O, dQ) or no queries (dK, dV),
 * which no product writes. Grid: (HEAD_DIM, heads, len). */
__kernel void std_zero_rows(__global float *dst, long base, long ss, long sh) {
    int x = get_global_id(0), h = get_global_id(1);
    long t = get_global_id(2);
    dst[base + t * ss + (long)h * sh + x] = 0.0f;
}

/* Does nothing: enqueued first where a pass would otherwise begin with a
 * CLBlast product, so that the pass's timed span starts before the
 * product's own preparatory kernels. */
__kernel void std_begin(__global float *unused) {}

/* ------------------------------------------------------------------------ */
/* Forward: P = softmax(S) in place, and L                                   */
/* ------------------------------------------------------------------------ */

/* A row's running maximum starts at -inf, and every visible score raises
 * it to at least STD_SEEN, whatever its value (a NaN, which max ignores,
 * or -inf): -inf at the end means only that the masks left the row no key,
 * never that its values were strange. */
#define STD_SEEN (-FLT_MAX)

/* Max and sum of exp over a work-group: (m, l) pairs merged pairwise; -inf
 * on both sides means no visible key on either. */
FA_FN void std_merge(float *m, float *l, float m2, float l2) {
    float mm = fmax(*m, m2);
    if (mm == -INFINITY) return; /* both empty */
    *l = *l * exp(*m - mm) + l2 * exp(m2 - mm);
    *m = mm;
}

/* One work-group per query row (b, h, i). S is read rounded to the dtype;
 * P = exp(S - max) / sum, rounded; dropped elements become 0 and kept ones
 * round(P / (1 - p)); masked ones 0. L = max + log(sum): -inf for a row
 * that sees no key, NaN (and P too) where the visible scores are all -inf
 * (sum = 0) or a NaN met the sum (as fa_row_lse). Grid: (STD_WG *
 * seqlen_q, pairs). */
__kernel __attribute__((reqd_work_group_size(STD_WG, 1, 1))) void std_softmax(
    __global float *s, __global float *lse, long total_q, STD_SHAPE_PARAMS, STD_MASK_PARAMS,
    STD_DROPOUT_PARAMS) {
    __local float red_m[STD_WG], red_l[STD_WG];
    const int i = get_group_id(0), pair = pair0 + (int)get_global_id(1), lid = get_local_id(0);
    const int b = pair / heads_q, h = pair % heads_q;
    const fa_seq sq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (i >= sq.len_q) return; /* the whole work-group: i is its row */
    const fa_mask m = std_mask(&sq, window_left, window_right, block_q, block_k, block_cols);
    __global float *row = s + std_row(pair_off, pair, &sq, i);

    /* Keys count in 64 bits: j + STD_WG would pass INT_MAX on a sequence
     * near 2^31 keys. */
    float mx = -INFINITY, sum = 0.0f;
    for (long j = lid; j < sq.len_k; j += STD_WG) {
        if (!fa_visible(&m, block_mask, i, 0, (int)j, 0)) continue;
        const float v = std_round(row[j]), seen = fmax(v, STD_SEEN);
        if (seen > mx) {
            sum = sum * exp(mx - seen) + exp(v - seen);
            mx = seen;
        } else {
            sum += exp(v - mx);
        }
    }
    red_m[lid] = mx;
    red_l[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int half_n = STD_WG / 2; half_n > 0; half_n /= 2) {
        if (lid < half_n) {
            float m1 = red_m[lid], l1 = red_l[lid];
            std_merge(&m1, &l1, red_m[lid + half_n], red_l[lid + half_n]);
            red_m[lid] = m1;
            red_l[lid] = l1;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    mx = red_m[0];
    sum = red_l[0];
    if (lid == 0)
        lse[fa_lse_index(b, h, i, heads_q, seqlen_q, sq.start_q, total_q)] =
            mx == -INFINITY ? -INFINITY : sum == 0.0f ? NAN : mx + log(sum);

#ifdef DROPOUT
    const fa_dropout dp = {key0, key1, offset_lo, threshold, keep_scale, row0, col0};
#endif
    /* Four neighbouring keys per work-item and step: one Philox call. */
    for (long j4 = 4 * lid; j4 < sq.len_k; j4 += 4 * STD_WG) {
#ifdef DROPOUT
        const uint4 rnd = std_dropout_words(&dp, b, h, heads_q, i, (int)j4);
#endif
        for (int c = 0; c < 4 && c < sq.len_k - j4; c++) {
            const int j = (int)j4 + c;
            float p = 0.0f;
            if (mx != -INFINITY && fa_visible(&m, block_mask, i, 0, j, 0)) {
                p = std_round(exp(std_round(row[j]) - mx) / sum);
#ifdef DROPOUT
                /* Multiplied, not selected: a NaN stays NaN when dropped. */
                p = std_round(p * (std_word(rnd, c) < threshold ? 0.0f : keep_scale));
#endif
            }
            row[j] = p;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                  */
/* ------------------------------------------------------------------------ */

/* D = rowsum(dO * O), fp32, indexed as L. Grid: (seqlen_q, heads_q, batch). */
__kernel void std_rowdot(__global const store_t *o, __global const store_t *dout, long off, long sb, long ss,
                         long sh, __global float *dvec, long total_q, int seqlen_q, int heads_q,
                         __global const int *cu_q) {
    const int i = get_global_id(0), h = get_global_id(1), b = get_global_id(2);
    const fa_seq sq = fa_seq_of(b, seqlen_q, seqlen_q, cu_q, cu_q);
    if (i >= sq.len_q) return;
    const fa_layout l = {off, sb, ss, sh};
    const long r = fa_row_index(l, b, sq.start_q, i, h);
    float acc = 0.0f;
    for (int x = 0; x < HEAD_DIM; x += 8) {
        float8 prod = LOAD8(o, r + x) * LOAD8(dout, r + x);
        acc += prod.s0 + prod.s1 + prod.s2 + prod.s3 + prod.s4 + prod.s5 + prod.s6 + prod.s7;
    }
    dvec[fa_lse_index(b, h, i, heads_q, seqlen_q, sq.start_q, total_q)] = acc;
}

/* The element-wise kernels below cover four keys of one row per work-item.
 * Grid: (ceil(seqlen_k / 4), seqlen_q, pairs). */
#define STD_ELEMENT_PROLOGUE                                                    \
    const int j4 = 4 * (int)get_global_id(0), i = get_global_id(1);             \
    const int pair = pair0 + (int)get_global_id(2), b = pair / heads_q, h = pair % heads_q; \
    const fa_seq sq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);             \
    if (i >= sq.len_q || j4 >= sq.len_k) return;                                \
    const fa_mask m = std_mask(&sq, window_left, window_right, block_q, block_k, block_cols); \
    const long row = std_row(pair_off, pair, &sq, i)

/* P = exp(S - L) in place, from the forward pass's L: rounded to the dtype,
 * 0 where masked and on rows that see no key (L = -inf). */
__kernel void std_probs(__global float *s, __global const float *lse, long total_q, STD_SHAPE_PARAMS,
                        STD_MASK_PARAMS) {
    STD_ELEMENT_PROLOGUE;
    const float li = lse[fa_lse_index(b, h, i, heads_q, seqlen_q, sq.start_q, total_q)];
    for (int c = 0; c < 4 && c < sq.len_k - j4; c++) {
        const int j = j4 + c;
        float p = 0.0f;
        if (li != -INFINITY && fa_visible(&m, block_mask, i, 0, j, 0)) p = std_round(exp(std_round(s[row + j]) - li));
        s[row + j] = p;
    }
}

/* dS = P * (Z dP / (1 - p) - D) into dP's buffer; with dropout also
 * P <- Z P / (1 - p) in place, the matrix dV = P^T dO needs. Masked
 * elements have P = 0 and so dS = 0. */
__kernel void std_dscores(__global float *p, __global float *dp, __global const float *dvec, long total_q,
                          STD_SHAPE_PARAMS, STD_MASK_PARAMS, STD_DROPOUT_PARAMS) {
    STD_ELEMENT_PROLOGUE;
    (void)m;
    const float di = dvec[fa_lse_index(b, h, i, heads_q, seqlen_q, sq.start_q, total_q)];
#ifdef DROPOUT
    const fa_dropout drop = {key0, key1, offset_lo, threshold, keep_scale, row0, col0};
    const uint4 rnd = std_dropout_words(&drop, b, h, heads_q, i, j4);
#endif
    for (int c = 0; c < 4 && c < sq.len_k - j4; c++) {
        const long e = row + j4 + c;
        const float pv = p[e];
        float dpv = std_round(dp[e]);
#ifdef DROPOUT
        /* Multiplied, not selected: a NaN stays NaN when dropped. */
        const float z = std_word(rnd, c) >= threshold ? keep_scale : 0.0f;
        dpv *= z;
        p[e] = std_round(pv * z);
#endif
        dp[e] = std_round(pv * (dpv - di));
    }
}
