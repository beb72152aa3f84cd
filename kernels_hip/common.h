/* Shared by every HIP attention program: its storage dtype (on the types
 * and conversions of dtype.h, which every program puts first), Philox4x32-10
 * dropout, masks, and the tile geometry that the build options fix. The
 * HIP twin of kernels_cl/common.h: the same algorithm and the same
 * semantics, in HIP C++ for hiprtc (and hipcc), with no header included so
 * that the same text compiles under hiprtc's built-in declarations, under
 * hipcc, and under NVRTC behind hip_nvidia_prelude.h.
 *
 * Build options (all set by backends/hip/hip_attention.c from the plan):
 *   HEAD_DIM BR BC TR TC          tile shape: a work-group holds a BR x BC
 *                                 score tile, each work-item a TR x TC
 *                                 micro-tile of it
 *   WAVE                          the target's wavefront (warp) width, from
 *                                 the device description: 64 on CDNA, 32 on
 *                                 RDNA and NVIDIA; never assumed
 *   DTYPE_F32 | DTYPE_F16 | DTYPE_BF16   storage dtype of Q, K, V, O and grads
 *   CAUSAL WINDOW BLOCK_MASK DROPOUT VARLEN   options present in the plan
 *   SOFTCAP ALIBI BIAS [BIAS_F32] score options present in the plan (the
 *                                 logit, below); BIAS_F32: the bias is
 *                                 fp32, else in the storage dtype
 *
 * Indexing conventions: a work-item is (tr, tc) with tc the fastest. Its
 * micro-tile of scores is rows tr * TR + i and columns tc * TC + j, read from
 * transposed local tiles as whole vectors; the output columns (head
 * dimensions) it accumulates are tc + u * NTC, so that neighbouring
 * work-items touch neighbouring words of V and of the outputs. */

#ifndef WAVE
#error "WAVE (the wavefront width of the target) must be defined"
#endif

#define NTR (BR / TR) /* work-items along the rows of a tile */
#define NTC (BC / TC) /* work-items along the columns of a tile */
#define WG_SIZE (NTR * NTC)
#define D8 (HEAD_DIM / 8)

/* Kernels keep C names (no mangling) so the host finds them by name; the
 * exact work-group size lets the compiler budget registers for it. With
 * score options on NVIDIA, one work-group per multiprocessor as the
 * occupancy asked: ptxas otherwise held the SIMT forward to 128 registers
 * and spilled the logit's temporaries. */
#if (defined(SOFTCAP) || defined(ALIBI) || defined(BIAS)) && defined(FA_HIP_ON_CUDA)
#define FA_KERNEL extern "C" __global__ __launch_bounds__(WG_SIZE, 1)
#else
#define FA_KERNEL extern "C" __global__ __launch_bounds__(WG_SIZE)
#endif
#define FA_KERNEL_ANY extern "C" __global__

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.69314718055994531f

FA_FN int fa_imin(int a, int b) { return a < b ? a : b; }
FA_FN int fa_imax(int a, int b) { return a > b ? a : b; }

/* Wide moves: 16 bytes per access where the address allows it. */
struct alignas(16) fa_f32x4 {
    float x, y, z, w;
};
struct alignas(8) fa_f32x2 {
    float x, y;
};
struct alignas(16) fa_u32x4 {
    fa_uint x, y, z, w;
};

/* ------------------------------------------------------------------------ */
/* Storage dtypes. Every load widens to fp32; every store rounds to nearest */
/* even. Chunks of 8 elements are one or two 16-byte accesses (offsets and  */
/* strides are multiples of 16 bytes and HEAD_DIM of 8).                   */
/* ------------------------------------------------------------------------ */

/* Eight 16-bit words of one 16-byte load, in memory order. */
FA_FN void fa_unpack16(fa_u32x4 w, fa_ushort out[8]) {
    const fa_uint words[4] = {w.x, w.y, w.z, w.w};
    for (int k = 0; k < 4; k++) {
        out[2 * k] = (fa_ushort)(words[k] & 0xffffu);
        out[2 * k + 1] = (fa_ushort)(words[k] >> 16);
    }
}

#if defined(DTYPE_F32)
typedef float store_t;
FA_FN void fa_load8(const float *__restrict__ p, fa_long i, float out[8]) {
    const fa_f32x4 a = *(const fa_f32x4 *)(p + i);
    const fa_f32x4 b = *(const fa_f32x4 *)(p + i + 4);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
FA_FN void fa_store1(float *p, fa_long i, float val) { p[i] = val; }
#elif defined(DTYPE_F16)
typedef fa_ushort store_t;
FA_FN void fa_load8(const fa_ushort *__restrict__ p, fa_long i, float out[8]) {
    fa_ushort h[8];
    fa_unpack16(*(const fa_u32x4 *)(p + i), h);
    for (int k = 0; k < 8; k++) out[k] = fa_half_to_float(h[k]);
}
FA_FN void fa_store1(fa_ushort *p, fa_long i, float val) { p[i] = fa_float_to_half(val); }
#elif defined(DTYPE_BF16)
typedef fa_ushort store_t;
FA_FN void fa_load8(const fa_ushort *__restrict__ p, fa_long i, float out[8]) {
    fa_ushort h[8];
    fa_unpack16(*(const fa_u32x4 *)(p + i), h);
    for (int k = 0; k < 8; k++) out[k] = fa_bf16_to_float(h[k]);
}
FA_FN void fa_store1(fa_ushort *p, fa_long i, float val) { p[i] = fa_bf16_round(val); }
#else
#error "one of DTYPE_F32, DTYPE_F16, DTYPE_BF16 must be defined"
#endif

/* Scatter the 8 values of a chunk into a transposed local tile: element x of
 * row r goes to dst[x * ld + r]. */
FA_FN void fa_store8_t(float *dst, int ld, int x0, int r, const float val[8]) {
    for (int k = 0; k < 8; k++) dst[(x0 + k) * ld + r] = val[k];
}

/* Eight consecutive floats into a local tile (offset a multiple of 8). */
FA_FN void fa_store8(float *dst, const float val[8]) {
    fa_f32x4 a, b;
    a.x = val[0]; a.y = val[1]; a.z = val[2]; a.w = val[3];
    b.x = val[4]; b.y = val[5]; b.z = val[6]; b.w = val[7];
    *(fa_f32x4 *)dst = a;
    *(fa_f32x4 *)(dst + 4) = b;
}

/* Moves of n = 1, 2, 4 or 8 consecutive floats between a local tile and a
 * private array, as one wide access: the local offset is a multiple of n
 * and tiles are declared FA_LOCAL_ALIGN, so the vector is aligned. n is a
 * compile-time constant at every call (TR or TC), so only one branch
 * survives; other widths (a forced 3 or 6) move element by element. */
FA_FN void fa_lds_get(float *dst, const float *p, const int n) {
    if (n == 1) {
        dst[0] = p[0];
    } else if (n == 2) {
        const fa_f32x2 v = *(const fa_f32x2 *)p;
        dst[0] = v.x; dst[1] = v.y;
    } else if (n == 4 || n == 8) {
        for (int k = 0; k < n; k += 4) {
            const fa_f32x4 v = *(const fa_f32x4 *)(p + k);
            dst[k] = v.x; dst[k + 1] = v.y; dst[k + 2] = v.z; dst[k + 3] = v.w;
        }
    } else {
        for (int k = 0; k < n; k++) dst[k] = p[k];
    }
}

FA_FN void fa_lds_put(const float *src, float *p, const int n) {
    if (n == 1) {
        p[0] = src[0];
    } else if (n == 2) {
        fa_f32x2 v;
        v.x = src[0]; v.y = src[1];
        *(fa_f32x2 *)p = v;
    } else if (n == 4 || n == 8) {
        for (int k = 0; k < n; k += 4) {
            fa_f32x4 v;
            v.x = src[k]; v.y = src[k + 1]; v.z = src[k + 2]; v.w = src[k + 3];
            *(fa_f32x4 *)(p + k) = v;
        }
    } else {
        for (int k = 0; k < n; k++) p[k] = src[k];
    }
}

#define FA_LOCAL_ALIGN __attribute__((aligned(32)))

/* ------------------------------------------------------------------------ */
/* Row reductions across the NTC work-items that share a row of the tile.   */
/* They are lanes tr * NTC .. tr * NTC + NTC - 1 of one wavefront whenever  */
/* NTC is a power of two no wider than WAVE (work-items fill wavefronts in  */
/* order); then a butterfly of cross-lane exchanges replaces the round trip */
/* through local memory. Otherwise the kernels take the local-memory path.  */
/* ------------------------------------------------------------------------ */

#if (NTC & (NTC - 1)) == 0 && NTC <= WAVE
#define FA_ROW_EXCHANGE 1
#else
#define FA_ROW_EXCHANGE 0
#endif

#if FA_ROW_EXCHANGE
FA_FN float fa_row_max(float v) {
    for (int m = NTC / 2; m > 0; m /= 2) v = fmaxf(v, __shfl_xor(v, m, NTC));
    return v;
}
#endif

/* ------------------------------------------------------------------------ */
/* Sequences: where each tensor of one (batch, head) pair starts.           */
/* ------------------------------------------------------------------------ */

/* Element strides of one tensor, packed strides already resolved on the
 * host; 64-bit because tensors may exceed 2^31 elements. */
struct fa_layout {
    fa_long offset, stride_batch, stride_seq, stride_head;
};

/* Lengths of sequence b and the token index of its first element: with
 * VARLEN from the cumulative offsets, else b * seqlen. */
struct fa_seq {
    int len_q, len_k;
    fa_long start_q, start_k;
};

FA_FN fa_seq fa_seq_of(int b, int seqlen_q, int seqlen_k, const int *cu_q, const int *cu_k) {
    fa_seq s;
#ifdef VARLEN
    s.start_q = cu_q[b];
    s.len_q = cu_q[b + 1] - cu_q[b];
    s.start_k = cu_k[b];
    s.len_k = cu_k[b + 1] - cu_k[b];
#else
    (void)cu_q;
    (void)cu_k;
    s.start_q = (fa_long)b * seqlen_q;
    s.len_q = seqlen_q;
    s.start_k = (fa_long)b * seqlen_k;
    s.len_k = seqlen_k;
#endif
    return s;
}

/* Element index of (sequence b, token t, head h, dim 0). */
FA_FN fa_long fa_row_index(fa_layout l, int b, fa_long start, int t, int h) {
#ifdef VARLEN
    (void)b;
    return l.offset + (start + t) * l.stride_seq + (fa_long)h * l.stride_head;
#else
    (void)start;
    return l.offset + (fa_long)b * l.stride_batch + (fa_long)t * l.stride_seq + (fa_long)h * l.stride_head;
#endif
}

/* Index of L (and of the backward pass's D) for (b, h, t): [batch, heads,
 * seqlen] packed, or [heads, total_q] with VARLEN. */
FA_FN fa_long fa_lse_index(int b, int h, int t, int heads_q, int seqlen_q, fa_long start_q, fa_long total_q) {
#ifdef VARLEN
    (void)b;
    (void)seqlen_q;
    return (fa_long)h * total_q + start_q + t;
#else
    (void)start_q;
    (void)total_q;
    return ((fa_long)b * heads_q + h) * seqlen_q + t;
#endif
}

/* ------------------------------------------------------------------------ */
/* Masks (include/flashattn.h), on positions within one sequence.           */
/*                                                                          */
/* A position is a tile's first row or key (q0, k0: always inside the       */
/* sequence) plus an offset in the tile (r, c). q0 + r may pass INT_MAX on  */
/* the last tile of a sequence near 2^31 tokens, and window bounds take any */
/* int: every test below compares what is left of the sequence, or works   */
/* in 64 bits where it runs once per tile, so that no sum can overflow.     */
/* ------------------------------------------------------------------------ */

struct fa_mask {
    int len_q, len_k;
    int window_left, window_right; /* negative: unlimited */
    int block_q, block_k, block_cols;
};

FA_FN fa_long fa_lmin(fa_long a, fa_long b) { return a < b ? a : b; }
FA_FN fa_long fa_lmax(fa_long a, fa_long b) { return a > b ? a : b; }

/* Whether query q0 + r sees key k0 + c. Padding rows and keys (past their
 * sequence) see nothing: their results are never stored, and the block
 * mask has no entries for them. The causal and window masks look at the
 * distance of key j from query i's diagonal i + len_k - len_q,
 * d = (j - i) - (len_k - len_q): visible iff d <= 0 (causal),
 * d <= window_right and d >= -window_left. With i and j inside the
 * sequence, d lies in [1 - len_k, len_q - 1]: no step overflows, whatever
 * the window bounds. */
FA_FN bool fa_visible(const fa_mask &m, const fa_uchar *block_mask, int q0, int r, int k0, int c) {
    if (r >= m.len_q - q0 || c >= m.len_k - k0) return false;
    const int i = q0 + r, j = k0 + c;
    (void)i;
    (void)j;
    (void)block_mask;
#if defined(CAUSAL) || defined(WINDOW)
    const int d = (j - i) - (m.len_k - m.len_q);
#endif
#ifdef CAUSAL
    if (d > 0) return false;
#endif
#ifdef WINDOW
    if (m.window_left >= 0 && d < -m.window_left) return false;
    if (m.window_right >= 0 && d > m.window_right) return false;
#endif
#ifdef BLOCK_MASK
    if (!block_mask[(fa_long)(i / m.block_q) * m.block_cols + j / m.block_k]) return false;
#endif
    return true;
}

/* The key range [*lo, *hi) that rows [r0, r1] (inside the sequence) may
 * see under the causal and window masks (the block mask is handled per
 * tile). In 64 bits: r1 + off + window_right + 1 passes INT_MAX. */
FA_FN void fa_key_range(const fa_mask &m, int r0, int r1, int *lo, int *hi) {
    const fa_long off = (fa_long)m.len_k - m.len_q;
    fa_long a = 0, b = m.len_k;
    (void)off;
    (void)r0;
    (void)r1;
#ifdef CAUSAL
    b = fa_lmin(b, r1 + off + 1);
#endif
#ifdef WINDOW
    if (m.window_right >= 0) b = fa_lmin(b, r1 + off + m.window_right + 1);
    if (m.window_left >= 0) a = fa_lmax(a, r0 + off - m.window_left);
#endif
    /* 0 <= a < len_k (r0 < len_q) and b <= len_k: both fit an int. */
    *lo = (int)a;
    *hi = (int)fa_lmax(a, b);
}

/* The query range [*lo, *hi) that may see keys [c0, c1] (inside the
 * sequence). */
FA_FN void fa_query_range(const fa_mask &m, int c0, int c1, int *lo, int *hi) {
    const fa_long off = (fa_long)m.len_k - m.len_q;
    fa_long a = 0, b = m.len_q;
    (void)off;
    (void)c0;
    (void)c1;
#ifdef CAUSAL
    a = fa_lmax(a, c0 - off);
#endif
#ifdef WINDOW
    if (m.window_right >= 0) a = fa_lmax(a, c0 - off - m.window_right);
    if (m.window_left >= 0) b = fa_lmin(b, c1 - off + m.window_left + 1);
#endif
    /* 0 <= a < len_q (c0 < len_k) and b <= len_q: both fit an int. */
    *lo = (int)a;
    *hi = (int)fa_lmax(a, b);
}

/* The tiles of n a range [lo, hi) falls in: [*t0, *t1), empty for an empty
 * range. No hi + n - 1: hi may be INT_MAX. */
FA_FN void fa_tile_span(int lo, int hi, int n, int *t0, int *t1) {
    *t0 = lo / n;
    *t1 = hi > lo ? (hi - 1) / n + 1 : *t0;
}

/* The last row of a tile of n rows from q0 that lies inside a sequence of
 * len (q0 < len). */
FA_FN int fa_tile_last(int q0, int n, int len) { return q0 + fa_imin(n, len - q0) - 1; }

/* Tile classes: the host's tile map says, per (query tile, key tile), what
 * the block mask leaves of it (0 nothing, 1 part, 2 all). */
#define FA_TILE_SKIP 0
#define FA_TILE_PARTIAL 1
#define FA_TILE_FULL 2

/* Skipping a tile is part of the loop control (the next tile worth
 * computing), never a branch around barriers in the loop body: every
 * work-item of a group runs the same iterations. */

/* First key tile >= t (and < t_end) the block mask leaves anything of, for
 * the query tile starting at q0. */
FA_FN int fa_next_key_tile(const fa_uchar *tile_map, int tile_cols, int q0, int t, int t_end) {
#ifdef BLOCK_MASK
    const fa_long row = (fa_long)(q0 / BR) * tile_cols;
    while (t < t_end && tile_map[row + t] == FA_TILE_SKIP) t++;
#else
    (void)tile_map;
    (void)tile_cols;
    (void)q0;
    (void)t_end;
#endif
    return t;
}

/* First query tile >= t (and < t_end) the block mask leaves anything of,
 * for the key tile starting at k0. */
FA_FN int fa_next_query_tile(const fa_uchar *tile_map, int tile_cols, int k0, int t, int t_end) {
#ifdef BLOCK_MASK
    while (t < t_end && tile_map[(fa_long)t * tile_cols + k0 / BC] == FA_TILE_SKIP) t++;
#else
    (void)tile_map;
    (void)tile_cols;
    (void)k0;
    (void)t_end;
#endif
    return t;
}

/* Whether every element of the tile [q0, q0 + BR) x [k0, k0 + BC) is
 * visible (FA_TILE_FULL: no per-element test needed) or only some
 * (FA_TILE_PARTIAL). Rows past len_q count only with FA_ROWS_FEED_KEYS:
 * in the dK/dV kernels every row of a tile adds to the keys' sums, and a
 * padding row's zero query times a key holding inf would add NaN; elsewhere
 * they are padding whose results are never stored. */
#define FA_ROWS_STORED 0
#define FA_ROWS_FEED_KEYS 1
FA_FN int fa_tile_class(const fa_mask &m, const fa_uchar *tile_map, int tile_cols, int q0, int k0, int rows) {
#ifdef BLOCK_MASK
    if (tile_map[(fa_long)(q0 / BR) * tile_cols + k0 / BC] != FA_TILE_FULL) return FA_TILE_PARTIAL;
#else
    (void)tile_map;
    (void)tile_cols;
#endif
    if (BC > m.len_k - k0) return FA_TILE_PARTIAL;
    if (rows == FA_ROWS_FEED_KEYS && BR > m.len_q - q0) return FA_TILE_PARTIAL;
    const fa_long r1 = fa_tile_last(q0, BR, m.len_q), c1 = (fa_long)k0 + BC - 1;
    const fa_long off = (fa_long)m.len_k - m.len_q;
    (void)r1;
    (void)c1;
    (void)off;
#ifdef CAUSAL
    if (c1 > q0 + off) return FA_TILE_PARTIAL;
#endif
#ifdef WINDOW
    if (m.window_right >= 0 && c1 > q0 + off + m.window_right) return FA_TILE_PARTIAL;
    if (m.window_left >= 0 && k0 < r1 + off - m.window_left) return FA_TILE_PARTIAL;
#endif
    return FA_TILE_FULL;
}

/* ------------------------------------------------------------------------ */
/* Score options (include/flashattn.h, "Score options"). For query i and    */
/* key j of a sequence, head h, in the header's order:                      */
/*   s = scale q.k;  s = softcap tanh(s / softcap) (SOFTCAP);               */
/*   s += bias[b, h, i, j] (BIAS);  s -= slope[h] |i + len_k - len_q - j|   */
/*   (ALIBI)                                                                */
/* then the kernels' masks. The kernels work in base 2: fa_logit2 returns   */
/* s log2(e), from the natural-scale logit, so the cap bends the logit the  */
/* header defines; without an option it is the plain q.k scale log2(e) of  */
/* every kernel. Forward and backward form the logit with this one          */
/* function, so the backward's P is the forward's. The backward's dS takes  */
/* d(capped s) / d(scaled s) = 1 - tanh^2 (SOFTCAP); bias and ALiBi are     */
/* constants of the chain.                                                  */
/* ------------------------------------------------------------------------ */

#if defined(SOFTCAP) || defined(ALIBI) || defined(BIAS)
#define FA_SCORE_OPTS 1
#endif

/* The kernel arguments of the score options, last in every attention
 * kernel's list (passed whether or not the program uses them): the natural
 * softmax scale, scale / softcap and softcap, heads_q ALiBi slopes (fp32,
 * device memory), and the bias with its element offset and strides (a
 * broadcast dimension's stride 0). */
#define FA_SCORE_PARAMS                                                                    \
    float opt_scale, float opt_cap_in, float opt_cap, const float *__restrict__ opt_slopes, \
        const void *__restrict__ opt_bias, fa_long bias_off, fa_long bias_sb, fa_long bias_sh, fa_long bias_ss
#define FA_SCORE_ARGS opt_scale, opt_cap_in, opt_cap, opt_slopes, opt_bias, bias_off, bias_sb, bias_sh, bias_ss

#ifdef BIAS
#if defined(BIAS_F32) || defined(DTYPE_F32)
typedef float fa_bias_t;
FA_FN float fa_bias_load(const fa_bias_t *p, fa_long i) { return p[i]; }
#elif defined(DTYPE_F16)
typedef fa_ushort fa_bias_t;
FA_FN float fa_bias_load(const fa_bias_t *p, fa_long i) { return fa_half_to_float(p[i]); }
#else
typedef fa_ushort fa_bias_t;
FA_FN float fa_bias_load(const fa_bias_t *p, fa_long i) { return fa_bf16_to_float(p[i]); }
#endif
#endif

/* The logit's constants for one (sequence, query head). */
struct fa_score {
    float scale_log2;       /* without options: the whole logit is q.k scale_log2 */
    float scale;            /* natural scale */
    float cap_in, cap;      /* scale / softcap, softcap */
    float slope;            /* ALiBi slope of the head */
    int len_q, len_k;       /* the sequence's */
    const void *bias;       /* bias[b, h] (offset applied): (i, j) at i * bias_ss + j */
    fa_long bias_ss;
};

FA_FN fa_score fa_score_of(float scale_log2, FA_SCORE_PARAMS, int b, int h, const fa_seq &seq) {
    fa_score sc;
    sc.scale_log2 = scale_log2;
    sc.scale = opt_scale;
    sc.cap_in = opt_cap_in;
    sc.cap = opt_cap;
    sc.len_q = seq.len_q;
    sc.len_k = seq.len_k;
    sc.bias_ss = bias_ss;
#ifdef ALIBI
    sc.slope = opt_slopes[h];
#else
    (void)opt_slopes;
    sc.slope = 0.0f;
#endif
#ifdef BIAS
    /* No varlen with a bias (the descriptor check refuses it). */
    sc.bias = (const fa_bias_t *)opt_bias + (bias_off + (fa_long)b * bias_sb + (fa_long)h * bias_sh);
#else
    (void)opt_bias;
    (void)bias_off;
    (void)bias_sb;
    (void)bias_sh;
    (void)b;
    (void)h;
    sc.bias = 0;
#endif
    return sc;
}

#ifdef SOFTCAP
/* tanh on the compiler's exp2 (no device-library call: the matrix-core
 * kernels compile without one on some targets). |x| < 0.55: x + x^3 P(x^2),
 * P fitted at Chebyshev nodes (relative error within 1e-7 in fp32); else
 * (1 - e) / (1 + e), e = exp(-2 |x|) <= 1/3, so nothing cancels. Both are
 * formed and one selected: no branch in the unrolled element loops. An
 * infinite x gives +-1, a NaN stays NaN. */
FA_FN float fa_tanh(float x) {
#ifdef FA_HIP_ON_CUDA
    const float a = fabsf(x);
    const float e = exp2f(-2.0f * FA_LOG2E * a);
#else
    const float a = __builtin_fabsf(x);
    const float e = __builtin_exp2f(-2.0f * FA_LOG2E * a);
#endif
    const float u = x * x;
    float p = -6.610227749e-03f;
    p = fmaf(p, u, 2.130938880e-02f);
    p = fmaf(p, u, -5.390942842e-02f);
    p = fmaf(p, u, 1.333311349e-01f);
    p = fmaf(p, u, -3.333333135e-01f);
    const float near0 = fmaf(x * u, p, x);
    /* 1 + e lies in [1, 4/3]: a hardware reciprocal (1 ulp on AMD, the
     * approximate division on NVIDIA, 2 ulp) needs no correctly rounded
     * division's slow path. */
#ifdef FA_HIP_ON_CUDA
    const float far = __fdividef(1.0f - e, 1.0f + e);
#else
    const float far = (1.0f - e) * __builtin_amdgcn_rcpf(1.0f + e);
#endif
    return a < 0.55f ? near0 : x < 0.0f ? -far : far;
}
#endif

/* The logit of query q0 + r and key k0 + c, times log2(e), from their dot
 * product qk; *dcap: d(capped s) / d(scaled s), for the backward's dS (1
 * without SOFTCAP). Positions are a tile's first row or key plus an offset,
 * as fa_visible takes them: padding positions (past the sequence) read no
 * bias and get a finite ALiBi term; the masks or the stores drop them. The
 * ALiBi distance is |(k0 - len_k) + (len_q - q0) + (c - r)|: its first two
 * terms fit an int whatever the lengths, the sum is formed in fp32. */
FA_FN float fa_logit2(const fa_score &sc, float qk, int q0, int r, int k0, int c, float *dcap) {
#ifndef FA_SCORE_OPTS
    (void)q0;
    (void)r;
    (void)k0;
    (void)c;
    (void)dcap;
    return qk * sc.scale_log2;
#else
    float bv = 0.0f;
#ifdef BIAS
    if (r < sc.len_q - q0 && c < sc.len_k - k0)
        bv = fa_bias_load((const fa_bias_t *)sc.bias, (fa_long)(q0 + r) * sc.bias_ss + (k0 + c));
#endif
#ifdef SOFTCAP
    const float t = fa_tanh(qk * sc.cap_in);
    float s = fmaf(sc.cap, t, bv);
    *dcap = fmaf(-t, t, 1.0f);
#else
    float s = fmaf(qk, sc.scale, bv);
    *dcap = 1.0f;
#endif
#ifdef ALIBI
    const float dist = (float)((k0 - sc.len_k) + (sc.len_q - q0)) + (float)(c - r);
    s = fmaf(-sc.slope, dist < 0.0f ? -dist : dist, s);
#else
    (void)q0;
    (void)r;
    (void)k0;
    (void)c;
#endif
    return s * FA_LOG2E;
#endif
}

/* d(capped s) / d(scaled s) applied to a dS (SOFTCAP), else dS itself. */
#ifdef SOFTCAP
#define FA_CAP_GRAD(ds, g) ((ds) * (g))
#else
#define FA_CAP_GRAD(ds, g) (ds)
#endif

/* ------------------------------------------------------------------------ */
/* The end of a row's online softmax (the rules for NaN and infinities are   */
/* above fa_forward in include/flashattn.h).                                 */
/* ------------------------------------------------------------------------ */

/* Whether the masks leave query q0 + r (inside the sequence) any key: its
 * key range under the causal and window masks, then the block mask's
 * blocks over that range. A row's running maximum stays -inf when no key
 * is visible, but also when its visible scores were all NaN (max ignores
 * them) or -inf; values must never make a row look masked, so the masks
 * decide. Called at the end, for rows whose maximum stayed -inf only:
 * nothing is added per element or per tile. */
FA_FN bool fa_row_sees_key(const fa_mask &m, const fa_uchar *block_mask, int q0, int r) {
    if (r >= m.len_q - q0) return false; /* padding: never stored */
    const int i = q0 + r;
    int lo, hi;
    fa_key_range(m, i, i, &lo, &hi);
    if (hi <= lo) return false;
#ifdef BLOCK_MASK
    const fa_long row = (fa_long)(i / m.block_q) * m.block_cols;
    for (int c = lo / m.block_k; c <= (hi - 1) / m.block_k; c++)
        if (block_mask[row + c]) return true;
    return false;
#else
    (void)block_mask;
    return true;
#endif
}

/* L of a finished row that sees a key, from m and l = sum of exp2(s - m)
 * (base 2): NaN where a NaN met l, or where the visible scores were all
 * -inf (l = 0: the softmax is 0 / 0, and O, the accumulator over l, is
 * NaN too); else ln of the sum. A key split's partial row (SPLITK builds)
 * keeps -inf for l = 0 instead: no mass, which the merge weighs as nothing
 * and turns into NaN only if no split has any (splitk.hip). */
FA_FN float fa_row_lse(float m, float l) {
#ifndef SPLITK
    if (l == 0.0f) return FA_NAN;
#endif
    return (m + log2f(l)) * FA_LN2;
}

/* ------------------------------------------------------------------------ */
/* Dropout: Philox4x32-10 exactly as core/philox.h defines it.              */
/* ------------------------------------------------------------------------ */

struct fa_u4 {
    fa_uint x, y, z, w;
};

FA_FN fa_u4 fa_philox(fa_u4 c, fa_uint k0, fa_uint k1) {
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const fa_uint hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const fa_uint hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        fa_u4 n;
        n.x = hi1 ^ c.y ^ k0;
        n.y = lo1;
        n.z = hi0 ^ c.w ^ k1;
        n.w = lo0;
        c = n;
    }
    return c;
}

struct fa_dropout {
    fa_uint key0, key1, offset_lo, threshold;
    float keep_scale; /* 1 / (1 - p) */
    /* The plan's dropout origin (core/plan.h): added to every row and key
     * the counter takes, so a plan of part of a larger problem draws that
     * problem's mask. col0 is a multiple of 4: groups of four stay whole. */
    fa_uint row0, col0;
};

/* The kernels' dropout state from their arguments. */
FA_FN fa_dropout fa_dropout_of(fa_uint key0, fa_uint key1, fa_uint offset_lo, fa_uint threshold, float keep_scale,
                               fa_uint row0, fa_uint col0) {
    fa_dropout d;
    d.key0 = key0;
    d.key1 = key1;
    d.offset_lo = offset_lo;
    d.threshold = threshold;
    d.keep_scale = keep_scale;
    d.row0 = row0;
    d.col0 = col0;
    return d;
}

FA_FN bool fa_signbit(float v) { return (__float_as_uint(v) >> 31) != 0u; }

/* Marks the dropped elements of a local tile by flipping their sign bit
 * (values are probabilities, so >= 0; a dropped 0 becomes -0). Element
 * (r, c) lives at tile[r * rs + c * cs] and stands for query q0 + r, key
 * k0 + c of sequence b, head h. One Philox call covers four neighbouring
 * keys, and the work-group shares the calls: BR * BC / 4 of them per tile
 * whatever the micro-tiling. Barriers are the caller's. */
FA_FN void fa_dropout_mark(float *tile, int rs, int cs, const fa_dropout &dp, int b, int h, int heads_q, int q0,
                           int k0) {
    const fa_uint bh = (fa_uint)b * (fa_uint)heads_q + (fa_uint)h;
#if BC % 4 == 0
    for (int e = (int)threadIdx.x; e < BR * (BC / 4); e += WG_SIZE) {
        const int r = e % BR, g = e / BR;
        const fa_uint col = dp.col0 + (fa_uint)k0 + 4u * (fa_uint)g;
        fa_u4 ctr;
        ctr.x = col >> 2;
        ctr.y = dp.row0 + (fa_uint)q0 + (fa_uint)r;
        ctr.z = bh;
        ctr.w = dp.offset_lo;
        const fa_u4 rnd = fa_philox(ctr, dp.key0, dp.key1);
        float *t = tile + r * rs + 4 * g * cs;
        if (rnd.x < dp.threshold) t[0] = -t[0];
        if (rnd.y < dp.threshold) t[cs] = -t[cs];
        if (rnd.z < dp.threshold) t[2 * cs] = -t[2 * cs];
        if (rnd.w < dp.threshold) t[3 * cs] = -t[3 * cs];
    }
#else
    for (int e = (int)threadIdx.x; e < BR * BC; e += WG_SIZE) {
        const int r = e % BR, c = e / BR;
        const fa_uint col = dp.col0 + (fa_uint)k0 + (fa_uint)c;
        fa_u4 ctr;
        ctr.x = col >> 2;
        ctr.y = dp.row0 + (fa_uint)q0 + (fa_uint)r;
        ctr.z = bh;
        ctr.w = dp.offset_lo;
        const fa_u4 rnd = fa_philox(ctr, dp.key0, dp.key1);
        const fa_uint sel = col & 3u;
        const fa_uint w = sel == 0u ? rnd.x : sel == 1u ? rnd.y : sel == 2u ? rnd.z : rnd.w;
        if (w < dp.threshold) tile[r * rs + c * cs] = -tile[r * rs + c * cs];
    }
#endif
}
