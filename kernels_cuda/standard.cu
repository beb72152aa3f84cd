/* Standard (unfused) attention: the element-wise and row-wise steps between
 * the matrix products, which run in cuBLAS (backends/cuda/cuda_standard.c).
 *
 * Compile-time options: those of common.cuh (DTYPE_*, CAUSAL, WINDOW,
 * BLOCK_MASK, DROPOUT, VARLEN); nothing here depends on the head dimension
 * or on a tile shape, so one program serves every head_dim.
 *
 * Score matrices. S, P, dP and dS are held in the storage dtype (the
 * products write them so, accumulating in fp32), one [len_q][ld] block per
 * (sequence b, query head h) pair, pair = b * heads_q + h, at element
 * pair_off[pair] of the allocation ("chunk") holding it; ld is len_k rounded
 * up to 16 bytes, so every row starts 16-byte aligned, as the tensor-core
 * products want. A launch of a score kernel covers the pairs [pair0, pair0 +
 * gridDim.y) of one chunk, one block per query row (blockIdx.x).
 *
 * The values are those of matrices held in the dtype: S as the product
 * rounded it, P = softmax(S) rounded once, and with dropout P * z / (1 - p)
 * rounded again, as core/reference.c's fa_ref_standard_forward computes. */
#include "common.cuh"

#define STD_THREADS 256
#define STD_WARPS (STD_THREADS / 32)
/* Elements per 16 bytes: the alignment of score rows. */
#define STD_ALIGN (16 / ELEM_BYTES)

/* What std_rows does. */
#define STD_ROWS_COPY 0  /* dst = src, both in the storage dtype */
#define STD_ROWS_F32 1   /* dst = src (fp32) rounded to the storage dtype */
#define STD_ROWS_ZERO 2  /* dst = 0 */

/* The parameter block of every kernel here; the host mirrors it field for
 * field (cuda_standard.c, std_params): 8-byte fields first, then 4-byte
 * ones in an even number, so neither compiler pads. */
struct std_params {
    const void *s;   /* score chunk: S */
    void *p;         /* P */
    const void *dp;  /* dP */
    void *ds;        /* dS */
    const i64 *pair_off;
    float *lse;
    float *dvec;     /* D = rowsum(dO * O), indexed as L */
    const int *cu_q, *cu_k;
    const u8 *block_mask;
    const void *src; /* std_rows */
    void *dst;
    const void *o, *dout; /* std_rowdot */
    i64 total_q;
    i64 src_off, src_sb, src_ss, src_sh;
    i64 dst_off, dst_sb, dst_ss, dst_sh;
    i64 o_off, o_sb, o_ss, o_sh;
    i64 tok0, rows;
    int seqlen_q, seqlen_k, heads_q, pair0;
    int window_left, window_right, block_q, block_k;
    int block_cols, dim, heads, seqlen;
    int mode, pad0;
    u32 drop_key0, drop_key1, drop_offset_lo, drop_threshold;
    u32 drop_row0, drop_col0; /* the plan's dropout origin (core/plan.h) */
    float drop_scale, pad1;
};

/* The host's copy has this size (cuda_standard.c checks its side). */
static_assert(sizeof(std_params) == 14 * 8 + 15 * 8 + 22 * 4, "std_params differs from the host's layout");

/* x rounded to the storage dtype and widened back. */
FA_DEV float std_round(float x) { return to_f32(from_f32(x)); }

/* One query row of one (sequence, head) pair, as a score kernel sees it. */
struct std_row {
    int b, h, i, len_q, len_k;
    i64 start_q;
    i64 at; /* element offset of the row in its chunk */
    fa_mask m;
};

/* The row of this block; false when the row lies past its sequence's end
 * (the grid covers the longest sequence of the launch). */
FA_DEV bool std_row_of(const std_params &p, std_row &r) {
    const int pair = p.pair0 + (int)blockIdx.y;
    r.b = pair / p.heads_q;
    r.h = pair % p.heads_q;
    r.i = (int)blockIdx.x;
#ifdef VARLEN
    r.start_q = p.cu_q[r.b];
    r.len_q = p.cu_q[r.b + 1] - p.cu_q[r.b];
    r.len_k = p.cu_k[r.b + 1] - p.cu_k[r.b];
#else
    r.start_q = (i64)r.b * p.seqlen_q;
    r.len_q = p.seqlen_q;
    r.len_k = p.seqlen_k;
#endif
    if (r.i >= r.len_q) return false;
    const i64 ld = ((i64)r.len_k + STD_ALIGN - 1) / STD_ALIGN * STD_ALIGN;
    r.at = p.pair_off[pair] + (i64)r.i * ld;
    r.m.len_q = r.len_q;
    r.m.len_k = r.len_k;
    r.m.window_left = p.window_left;
    r.m.window_right = p.window_right;
    r.m.block_q = p.block_q;
    r.m.block_k = p.block_k;
    r.m.block_cols = p.block_cols;
    r.m.block_mask = p.block_mask;
    return true;
}

/* Index of L (and D) for row i of (b, h): [batch][heads][seqlen] packed,
 * or [heads][total_q] with VARLEN. */
FA_DEV i64 std_lse_index(const std_params &p, const std_row &r) {
#ifdef VARLEN
    return (i64)r.h * p.total_q + r.start_q + r.i;
#else
    return ((i64)r.b * p.heads_q + r.h) * p.seqlen_q + r.i;
#endif
}

#ifdef DROPOUT
/* The Philox words of keys j4 .. j4 + 3 (j4 a multiple of four) of the row,
 * as core/philox.h defines the counter: one call serves the four. The
 * plan's dropout origin (drop_col0 a multiple of 4) places them in the
 * larger problem whose mask the plan draws. */
FA_DEV uint4 std_words(const std_params &p, const std_row &r, u32 j4) {
    const u32 bh = (u32)r.b * (u32)p.heads_q + (u32)r.h;
    return philox(((u32)j4 + p.drop_col0) >> 2, (u32)r.i + p.drop_row0, bh, p.drop_offset_lo, p.drop_key0,
                  p.drop_key1);
}
#endif

/* A row's running maximum starts at -inf, and every visible score raises
 * it to at least STD_SEEN (-FLT_MAX), whatever its value (a NaN, which max
 * ignores, or -inf): -inf at the end means only that the masks left the
 * row no key, never that its values were strange. */
#define STD_SEEN (-3.402823466e+38f)

/* (max, sum of exp) pairs merged: both sides empty stays (-inf, 0). Lanes
 * of a butterfly may differ in the last bit (contracted multiply-adds);
 * only lane 0's result goes on, and every thread then merges the warps'
 * results in one order, so the whole block uses the same maximum and sum. */
FA_DEV void std_merge(float &m, float &l, float m2, float l2) {
    const float mm = fmaxf(m, m2);
    if (mm == -FA_INF) return;
    l = l * expf(m - mm) + l2 * expf(m2 - mm);
    m = mm;
}

/* ------------------------------------------------------------------------ */
/* Forward: P = softmax(S) and L                                             */
/* ------------------------------------------------------------------------ */

/* Masked elements of P are 0; a row that sees no key gets L = -inf and
 * P = 0 (so O = P V = 0); one whose visible scores are all -inf (sum 0) or
 * met a NaN gets NaN (as row_lse). Loops count unsigned: a row of a
 * sequence near 2^31 keys would pass INT_MAX. Grid: (longest len_q,
 * pairs). */
extern "C" __global__ void __launch_bounds__(STD_THREADS) std_softmax(const std_params p) {
    std_row r;
    if (!std_row_of(p, r)) return;
    const elem_t *s = (const elem_t *)p.s + r.at;
    elem_t *pr = (elem_t *)p.p + r.at;

    float mx = -FA_INF, sum = 0.0f;
    for (u32 j = threadIdx.x; j < (u32)r.len_k; j += STD_THREADS) {
        if (!visible(r.m, r.i, 0, (int)j, 0)) continue;
        const float v = to_f32(s[j]), seen = fmaxf(v, STD_SEEN);
        if (seen > mx) {
            sum = sum * expf(mx - seen) + expf(v - seen);
            mx = seen;
        } else {
            sum += expf(v - mx);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, mx, off), l2 = __shfl_xor_sync(0xffffffffu, sum, off);
        std_merge(mx, sum, m2, l2);
    }
    __shared__ float warp_m[STD_WARPS], warp_l[STD_WARPS];
    if ((threadIdx.x & 31) == 0) {
        warp_m[threadIdx.x >> 5] = mx;
        warp_l[threadIdx.x >> 5] = sum;
    }
    __syncthreads();
    mx = warp_m[0];
    sum = warp_l[0];
    for (int w = 1; w < STD_WARPS; w++) std_merge(mx, sum, warp_m[w], warp_l[w]);
    if (threadIdx.x == 0) p.lse[std_lse_index(p, r)] = mx == -FA_INF ? -FA_INF : sum == 0.0f ? FA_NAN : mx + logf(sum);

    for (u32 j4 = 4 * threadIdx.x; j4 < (u32)r.len_k; j4 += 4 * STD_THREADS) {
#ifdef DROPOUT
        const uint4 words = std_words(p, r, j4);
#endif
        for (u32 c = 0; c < 4 && j4 + c < (u32)r.len_k; c++) {
            const u32 j = j4 + c;
            float v = 0.0f;
            if (mx != -FA_INF && visible(r.m, r.i, 0, (int)j, 0)) {
                v = std_round(expf(to_f32(s[j]) - mx) / sum);
#ifdef DROPOUT
                /* Multiplied, not selected: a NaN stays NaN when dropped. */
                v *= word_of(words, (int)c) >= p.drop_threshold ? p.drop_scale : 0.0f;
#endif
            }
            pr[j] = from_f32(v);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                  */
/* ------------------------------------------------------------------------ */

/* P = exp(S - L) from the forward pass's L, rounded to the dtype; 0 where
 * masked and on rows that see no key (L = -inf). Grid: (longest len_q,
 * pairs). */
extern "C" __global__ void __launch_bounds__(STD_THREADS) std_probs(const std_params p) {
    std_row r;
    if (!std_row_of(p, r)) return;
    const float li = p.lse[std_lse_index(p, r)];
    const elem_t *s = (const elem_t *)p.s + r.at;
    elem_t *pr = (elem_t *)p.p + r.at;
    for (u32 j = threadIdx.x; j < (u32)r.len_k; j += STD_THREADS) {
        float v = 0.0f;
        if (li != -FA_INF && visible(r.m, r.i, 0, (int)j, 0)) v = expf(to_f32(s[j]) - li);
        pr[j] = from_f32(v);
    }
}

/* dS = P * (Z dP / (1 - p) - D), rounded; with dropout also P <- Z P /
 * (1 - p) in place, the matrix dV = P^T dO needs. Masked elements have
 * P = 0 and so dS = 0. Grid: (longest len_q, pairs). */
extern "C" __global__ void __launch_bounds__(STD_THREADS) std_dscores(const std_params p) {
    std_row r;
    if (!std_row_of(p, r)) return;
    const float di = p.dvec[std_lse_index(p, r)];
    elem_t *pr = (elem_t *)p.p + r.at;
    const elem_t *dp = (const elem_t *)p.dp + r.at;
    elem_t *ds = (elem_t *)p.ds + r.at;
    for (u32 j4 = 4 * threadIdx.x; j4 < (u32)r.len_k; j4 += 4 * STD_THREADS) {
#ifdef DROPOUT
        const uint4 words = std_words(p, r, j4);
#endif
        for (u32 c = 0; c < 4 && j4 + c < (u32)r.len_k; c++) {
            const u32 j = j4 + c;
            const float pv = to_f32(pr[j]);
            float dpv = to_f32(dp[j]);
#ifdef DROPOUT
            /* Multiplied, not selected: a NaN stays NaN when dropped. */
            const float z = word_of(words, (int)c) >= p.drop_threshold ? p.drop_scale : 0.0f;
            dpv *= z;
            pr[j] = from_f32(pv * z);
#endif
            ds[j] = from_f32(pv * (dpv - di));
        }
    }
}

/* D = rowsum(dO * O) of the values as stored, fp32, one warp per row r of
 * L's index space (rows = heads_q * total_q). Grid: ceil(rows / STD_WARPS). */
extern "C" __global__ void __launch_bounds__(STD_THREADS) std_rowdot(const std_params p) {
    const int lane = threadIdx.x & 31;
    const i64 r = (i64)blockIdx.x * STD_WARPS + (threadIdx.x >> 5);
    if (r >= p.rows) return; /* the whole warp */
#ifdef VARLEN
    const i64 h = r / p.total_q, g = r % p.total_q;
    const i64 row = p.o_off + g * p.o_ss + h * p.o_sh;
#else
    const i64 t = r % p.seqlen_q, bh = r / p.seqlen_q, h = bh % p.heads_q, b = bh / p.heads_q;
    const i64 row = p.o_off + b * p.o_sb + t * p.o_ss + h * p.o_sh;
#endif
    const elem_t *o = (const elem_t *)p.o + row, *g_o = (const elem_t *)p.dout + row;
    float acc = 0.0f;
    for (int x = lane; x < p.dim; x += 32) acc = fmaf(to_f32(o[x]), to_f32(g_o[x]), acc);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) p.dvec[r] = acc;
}

/* ------------------------------------------------------------------------ */
/* Layout changes                                                            */
/* ------------------------------------------------------------------------ */

/* Element index of (token g over the whole batch, head h, dim 0) in a
 * layout. Without VARLEN, g = b * seqlen + t. */
FA_DEV i64 std_index(i64 off, i64 sb, i64 ss, i64 sh, int seqlen, i64 g, int h) {
#ifdef VARLEN
    (void)sb;
    (void)seqlen;
    return off + g * ss + (i64)h * sh;
#else
    return off + (g / seqlen) * sb + (g % seqlen) * ss + (i64)h * sh;
#endif
}

/* Rows (token, head) of tokens [tok0, tok0 + rows / heads), one warp each:
 * a tensor to or from its packed copy, the fp32 sum of a GQA group's dK or
 * dV into the caller's tensor, or zeros into rows no product writes.
 * Grid: ceil(rows / STD_WARPS). */
extern "C" __global__ void __launch_bounds__(STD_THREADS) std_rows(const std_params p) {
    const int lane = threadIdx.x & 31;
    const i64 r = (i64)blockIdx.x * STD_WARPS + (threadIdx.x >> 5);
    if (r >= p.rows) return;
    const i64 g = p.tok0 + r / p.heads;
    const int h = (int)(r % p.heads);
    elem_t *dst = (elem_t *)p.dst + std_index(p.dst_off, p.dst_sb, p.dst_ss, p.dst_sh, p.seqlen, g, h);
    if (p.mode == STD_ROWS_COPY) {
        const elem_t *src = (const elem_t *)p.src + std_index(p.src_off, p.src_sb, p.src_ss, p.src_sh, p.seqlen, g, h);
        for (int x = lane; x < p.dim; x += 32) dst[x] = src[x];
    } else if (p.mode == STD_ROWS_F32) {
        const float *src = (const float *)p.src + std_index(p.src_off, p.src_sb, p.src_ss, p.src_sh, p.seqlen, g, h);
        for (int x = lane; x < p.dim; x += 32) dst[x] = from_f32(src[x]);
    } else {
        for (int x = lane; x < p.dim; x += 32) dst[x] = from_f32(0.0f);
    }
}
