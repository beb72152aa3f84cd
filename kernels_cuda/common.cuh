/* Shared by every CUDA attention program (compiled by NVRTC, no system
 * header): the program's storage dtype (dtype.cuh has the types and the
 * conversions), the kernels' parameter block, Philox4x32-10 dropout, masks
 * and sequence geometry.
 *
 * Compile-time options (backends/cuda/cuda_attention.c sets them from the
 * plan):
 *   HEAD_DIM                              head dimension
 *   IO_DIM                                the tensors' head dimension where
 *                                         it is less (a padded build: the
 *                                         warp-specialised backward); else
 *                                         HEAD_DIM
 *   DTYPE_F32 | DTYPE_F16 | DTYPE_BF16    storage dtype of Q, K, V, O, grads
 *   CAUSAL WINDOW BLOCK_MASK DROPOUT VARLEN   options present in the plan
 *   SOFTCAP ALIBI BIAS [BIAS_F32]         score options present (BIAS_F32:
 *                                         an fp32 bias beside 16-bit data)
 * and per kernel family the tile shape (see each file). */
#ifndef FA_CUDA_COMMON_CUH
#define FA_CUDA_COMMON_CUH

#include "dtype.cuh"

#ifndef IO_DIM
#define IO_DIM HEAD_DIM
#endif
#if IO_DIM > HEAD_DIM || IO_DIM % 8 != 0
#error "common.cuh: IO_DIM is a multiple of 8 up to HEAD_DIM"
#endif

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.69314718055994531f

/* ------------------------------------------------------------------------ */
/* The parameter block every kernel takes by value. The host mirrors it     */
/* field for field (cuda_attention.c, fa_cuda_params): 8-byte fields first, */
/* so both compilers lay it out without padding questions.                  */
/* ------------------------------------------------------------------------ */

struct fa_params {
    const void *q, *k, *v;
    void *o;
    float *lse;
    const void *dout;
    void *dq, *dk, *dv;
    float *dvec;     /* backward: D = rowsum(dO * O), laid out as L */
    float *dq_acc;   /* backward: fp32 dQ accumulator [heads_q][total_q][HEAD_DIM] (padded rows) */
    const int *cu_q, *cu_k;
    const u8 *block_mask;
    const u8 *tile_map; /* per (query tile, key tile) of this kernel's shape */
    float *part_o, *part_l;
    i64 q_off, q_sb, q_ss, q_sh;
    i64 k_off, k_sb, k_ss, k_sh;
    i64 v_off, v_sb, v_ss, v_sh;
    i64 o_off, o_sb, o_ss, o_sh;
    i64 total_q;
    int seqlen_q, seqlen_k, heads_q, group, batch;
    int window_left, window_right;
    int block_q, block_k, block_cols, tile_cols;
    u32 drop_key0, drop_key1, drop_offset_lo, drop_threshold;
    u32 drop_row0, drop_col0; /* the plan's dropout origin (core/plan.h) */
    float scale, scale_log2, drop_scale;
    int num_splits;
    /* The score options, after the rest so that its offsets stay what they
     * were (kernels without options compile to the same code); softcap_in
     * keeps the 8-byte fields aligned. */
    float softcap_in;                        /* SOFTCAP: scale / softcap */
    const void *bias;                        /* BIAS: the pass's bias buffer (elements of bias_t) */
    const float *alibi;                      /* ALIBI: heads_q slopes times log2 e */
    i64 bias_off, bias_sb, bias_ss, bias_sh; /* BIAS: elements; 0 where broadcast */
    float softcap_out;                       /* SOFTCAP: softcap log2 e */
    /* decode.cu SPLIT_MERGE_LAST: 1 where the launch is cooperative (every
     * block resident at once), so a group's splits meet and merge together
     * (meet_splits) instead of in the last to arrive. In the 8-byte
     * block's tail padding: the offsets above stay what they were. */
    int splits_meet;
};

/* ------------------------------------------------------------------------ */
/* Storage dtypes                                                            */
/* ------------------------------------------------------------------------ */

#if defined(DTYPE_F32)
typedef float elem_t;
#define ELEM_BYTES 4
FA_DEV float to_f32(float x) { return x; }
FA_DEV float from_f32(float x) { return x; }
#elif defined(DTYPE_F16)
typedef u16 elem_t;
#define ELEM_BYTES 2
FA_DEV float to_f32(u16 x) { return f16_to_f32(x); }
FA_DEV u16 from_f32(float x) { return f32_to_f16(x); }
#elif defined(DTYPE_BF16)
typedef u16 elem_t;
#define ELEM_BYTES 2
FA_DEV float to_f32(u16 x) { return bf16_to_f32(x); }
FA_DEV u16 from_f32(float x) { return f32_to_bf16(x); }
#else
#error "one of DTYPE_F32, DTYPE_F16, DTYPE_BF16 must be defined"
#endif

/* Elements in one 16-byte chunk, and chunks in a row of HEAD_DIM. */
#define CHUNK_ELEMS (16 / ELEM_BYTES)
#define ROW_CHUNKS (HEAD_DIM / CHUNK_ELEMS)

/* Eight consecutive elements (16-byte aligned: offsets and strides are
 * multiples of 16 bytes, HEAD_DIM of 8) widened to fp32. */
FA_DEV void load8(const elem_t *p, float out[8]) {
#if defined(DTYPE_F32)
    float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
#else
    uint4 w = *(const uint4 *)p;
    u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = to_f32((u16)(words[i] & 0xffffu));
        out[2 * i + 1] = to_f32((u16)(words[i] >> 16));
    }
#endif
}

FA_DEV void store8(elem_t *p, const float in[8]) {
#if defined(DTYPE_F32)
    *(float4 *)p = make_float4(in[0], in[1], in[2], in[3]);
    *(float4 *)(p + 4) = make_float4(in[4], in[5], in[6], in[7]);
#else
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = (u32)from_f32(in[2 * i]) | ((u32)from_f32(in[2 * i + 1]) << 16);
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
#endif
}

/* ------------------------------------------------------------------------ */
/* Fast special functions                                                    */
/* ------------------------------------------------------------------------ */

/* 2^x; exact 0 for -inf. */
FA_DEV float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* ------------------------------------------------------------------------ */
/* Sequences and layouts                                                     */
/* ------------------------------------------------------------------------ */

struct fa_seq {
    int len_q, len_k;
    i64 start_q, start_k;
};

FA_DEV fa_seq seq_of(const fa_params &p, int b) {
    fa_seq s;
#ifdef VARLEN
    s.start_q = p.cu_q[b];
    s.len_q = p.cu_q[b + 1] - p.cu_q[b];
    s.start_k = p.cu_k[b];
    s.len_k = p.cu_k[b + 1] - p.cu_k[b];
#else
    s.start_q = (i64)b * p.seqlen_q;
    s.len_q = p.seqlen_q;
    s.start_k = (i64)b * p.seqlen_k;
    s.len_k = p.seqlen_k;
#endif
    return s;
}

/* Element index of (sequence b, token t, head h, dim 0) in a layout. */
FA_DEV i64 row_index(i64 off, i64 sb, i64 ss, i64 sh, int b, i64 start, int t, int h) {
#ifdef VARLEN
    (void)sb;
    return off + (start + t) * ss + (i64)h * sh;
#else
    (void)start;
    return off + (i64)b * sb + (i64)t * ss + (i64)h * sh;
#endif
}

#define Q_ROW(p, b, s, t, h) row_index((p).q_off, (p).q_sb, (p).q_ss, (p).q_sh, b, (s).start_q, t, h)
#define K_ROW(p, b, s, t, h) row_index((p).k_off, (p).k_sb, (p).k_ss, (p).k_sh, b, (s).start_k, t, h)
#define V_ROW(p, b, s, t, h) row_index((p).v_off, (p).v_sb, (p).v_ss, (p).v_sh, b, (s).start_k, t, h)
#define O_ROW(p, b, s, t, h) row_index((p).o_off, (p).o_sb, (p).o_ss, (p).o_sh, b, (s).start_q, t, h)

/* Index of L (and of D, and of the row of the dQ accumulator) for (b, h, t):
 * [batch, heads, seqlen] packed, or [heads, total_q] with VARLEN. */
FA_DEV i64 lse_index(const fa_params &p, int b, int h, int t, i64 start_q) {
#ifdef VARLEN
    return (i64)h * p.total_q + start_q + t;
#else
    (void)start_q;
    return ((i64)b * p.heads_q + h) * p.seqlen_q + t;
#endif
}

/* ------------------------------------------------------------------------ */
/* Masks (include/flashattn.h), on positions within one sequence             */
/*                                                                          */
/* A position is a tile's first row or key (q0, k0: always inside the       */
/* sequence) plus an offset in the tile (r, c). q0 + r may pass INT_MAX on  */
/* the last tile of a sequence near 2^31 tokens, and window bounds take any */
/* int: every test below compares what is left of the sequence, or works   */
/* in 64 bits where it runs once per tile, so that no sum can overflow.     */
/* ------------------------------------------------------------------------ */

struct fa_mask {
    int len_q, len_k;
    int window_left, window_right;
    int block_q, block_k, block_cols;
    const u8 *block_mask;
};

FA_DEV fa_mask mask_of(const fa_params &p, const fa_seq &s) {
    fa_mask m;
    m.len_q = s.len_q;
    m.len_k = s.len_k;
    m.window_left = p.window_left;
    m.window_right = p.window_right;
    m.block_q = p.block_q;
    m.block_k = p.block_k;
    m.block_cols = p.block_cols;
    m.block_mask = p.block_mask;
    return m;
}

FA_DEV i64 min64(i64 a, i64 b) { return a < b ? a : b; }
FA_DEV i64 max64(i64 a, i64 b) { return a > b ? a : b; }

/* Whether the query rows_left rows before the end of its sequence sees the
 * key keys_left keys before the end of its. Padding rows and keys (past
 * their sequence: rows_left or keys_left <= 0) see nothing: their results
 * are never stored, and the block mask has no entries for them. The
 * causal and window masks look at the distance of key j from query i's
 * diagonal i + len_k - len_q, d = (j - i) - (len_k - len_q): visible iff
 * d <= 0 (causal), d <= window_right and d >= -window_left. With i and j
 * inside the sequence, d lies in [1 - len_k, len_q - 1]: no step
 * overflows, whatever the window bounds. Tight loops pass rows_left and
 * keys_left from per-tile values (fwd_mma.cu). */
FA_DEV bool visible_left(const fa_mask &m, int rows_left, int keys_left) {
    if (rows_left <= 0 || keys_left <= 0) return false;
    const int i = m.len_q - rows_left, j = m.len_k - keys_left;
    (void)i;
    (void)j;
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
    if (!m.block_mask[(i64)(i / m.block_q) * m.block_cols + j / m.block_k]) return false;
#endif
    return true;
}

/* Whether query q0 + r sees key k0 + c (q0 and k0 inside the sequence). */
FA_DEV bool visible(const fa_mask &m, int q0, int r, int k0, int c) {
    return visible_left(m, m.len_q - q0 - r, m.len_k - k0 - c);
}

/* Keys [*lo, *hi) that rows [r0, r1] (inside the sequence) may see under
 * the causal and window masks (the block mask is handled per tile). In 64
 * bits: r1 + off + window_right + 1 passes INT_MAX. */
FA_DEV void key_range(const fa_mask &m, int r0, int r1, int *lo, int *hi) {
    const i64 off = (i64)m.len_k - m.len_q;
    i64 a = 0, b = m.len_k;
    (void)off;
    (void)r0;
    (void)r1;
#ifdef CAUSAL
    b = min64(b, r1 + off + 1);
#endif
#ifdef WINDOW
    if (m.window_right >= 0) b = min64(b, r1 + off + m.window_right + 1);
    if (m.window_left >= 0) a = max64(a, r0 + off - m.window_left);
#endif
    /* 0 <= a < len_k (r0 < len_q) and b <= len_k: both fit an int. */
    *lo = (int)a;
    *hi = (int)max64(a, b);
}

/* Queries [*lo, *hi) that may see keys [c0, c1] (inside the sequence). */
FA_DEV void query_range(const fa_mask &m, int c0, int c1, int *lo, int *hi) {
    const i64 off = (i64)m.len_k - m.len_q;
    i64 a = 0, b = m.len_q;
    (void)off;
    (void)c0;
    (void)c1;
#ifdef CAUSAL
    a = max64(a, c0 - off);
#endif
#ifdef WINDOW
    if (m.window_right >= 0) a = max64(a, c0 - off - m.window_right);
    if (m.window_left >= 0) b = min64(b, c1 - off + m.window_left + 1);
#endif
    /* 0 <= a < len_q (c0 < len_k) and b <= len_q: both fit an int. */
    *lo = (int)a;
    *hi = (int)max64(a, b);
}

/* The tiles of n a range [lo, hi) falls in: [*t0, *t1), empty for an empty
 * range. No hi + n - 1: hi may be INT_MAX. */
FA_DEV void tile_span(int lo, int hi, int n, int *t0, int *t1) {
    *t0 = lo / n;
    *t1 = hi > lo ? (hi - 1) / n + 1 : *t0;
}

/* Split `split` of num_splits of the key tiles [*t0, *t1): equal runs in
 * order, the last ones empty where the tiles are fewer (the merge weighs an
 * empty split as no mass). */
FA_DEV void split_tiles(int split, int num_splits, int *t0, int *t1) {
    const int per = (*t1 - *t0 + num_splits - 1) / num_splits;
    const int begin = min(*t1, *t0 + split * per);
    *t1 = min(*t1, begin + per);
    *t0 = begin;
}

/* The last row of a tile of n rows from q0 that lies inside a sequence of
 * len (q0 < len). */
FA_DEV int tile_last(int q0, int n, int len) { return q0 + min(n, len - q0) - 1; }

/* What the block mask leaves of a (query tile, key tile): the host's tile
 * map (cuda_attention.c) holds 0 nothing, 1 part, 2 all. */
#define TILE_SKIP 0
#define TILE_PARTIAL 1
#define TILE_FULL 2

/* First key tile >= t (and < t_end) the block mask leaves anything of, for
 * query tile tq. */
FA_DEV int next_key_tile(const fa_params &p, int tq, int t, int t_end) {
#ifdef BLOCK_MASK
    const i64 row = (i64)tq * p.tile_cols;
    while (t < t_end && p.tile_map[row + t] == TILE_SKIP) t++;
#else
    (void)p;
    (void)tq;
#endif
    return t;
}

/* First query tile >= t (and < t_end) the block mask leaves anything of,
 * for key tile tk. */
FA_DEV int next_query_tile(const fa_params &p, int tk, int t, int t_end) {
#ifdef BLOCK_MASK
    while (t < t_end && p.tile_map[(i64)t * p.tile_cols + tk] == TILE_SKIP) t++;
#else
    (void)p;
    (void)tk;
#endif
    return t;
}

/* Whether every element of [q0, q0 + br) x [k0, k0 + bc) is visible (no
 * per-element test needed). Rows past len_q count only with
 * ROWS_FEED_KEYS: in the dK/dV kernels every row of a tile adds to the
 * keys' sums, and a padding row's zero query times a key holding inf would
 * add NaN; elsewhere they are padding whose results are never stored. */
#define ROWS_STORED 0
#define ROWS_FEED_KEYS 1
FA_DEV bool tile_full(const fa_params &p, const fa_mask &m, int tq, int tk, int q0, int k0, int br, int bc,
                      int rows) {
#ifdef BLOCK_MASK
    if (p.tile_map[(i64)tq * p.tile_cols + tk] != TILE_FULL) return false;
#else
    (void)p;
    (void)tq;
    (void)tk;
#endif
    if (bc > m.len_k - k0) return false;
    if (rows == ROWS_FEED_KEYS && br > m.len_q - q0) return false;
#if defined(CAUSAL) || defined(WINDOW)
    const i64 r1 = tile_last(q0, br, m.len_q), c1 = (i64)k0 + bc - 1, off = (i64)m.len_k - m.len_q;
    (void)r1;
#endif
#ifdef CAUSAL
    /* c1 > q0 + off, in ints: k0 + bc <= len_k above, so the partial sums
     * lie in [1, len_k], [-len_k, -1] and [len_q - len_k, len_q - 1] (one
     * 64-bit pair less kept across the backward's steps, which spilled). */
    (void)c1;
    (void)off;
    if (k0 + bc - 1 - m.len_k + m.len_q > q0) return false;
#endif
#ifdef WINDOW
    if (m.window_right >= 0 && c1 > q0 + off + m.window_right) return false;
    if (m.window_left >= 0 && k0 < r1 + off - m.window_left) return false;
#endif
    return true;
}

/* ------------------------------------------------------------------------ */
/* Score options (include/flashattn.h): softcap, additive bias, ALiBi        */
/*                                                                          */
/* Builds with any of them take each raw product s = q . k through          */
/* score_log2, which returns the logit in log2 units (what exp2 takes):     */
/*   softcap log2 e * tanh(s * scale / softcap)   or   s * scale log2 e,    */
/*   + bias log2 e, - slope log2 e * |i + len_k - len_q - j|,               */
/* in the header's order, the cap on the natural-scale logit. The kernels   */
/* then keep their softmax in log2 units with a factor of 1 (SCORE_SL2),    */
/* and the backward recomputes P by the same function. Kernels built       */
/* without options call none of it: their code is what it was.              */
/* ------------------------------------------------------------------------ */

#if defined(SOFTCAP) || defined(ALIBI) || defined(BIAS)
#define SCORE_OPTIONS
#endif

#ifdef BIAS
#if defined(BIAS_F32) || defined(DTYPE_F32)
typedef float bias_t;
FA_DEV float bias_to_f32(float x) { return x; }
#else
typedef elem_t bias_t;
FA_DEV float bias_to_f32(elem_t x) { return to_f32(x); }
#endif
#endif

/* tanh from one ex2 and one fast division: 1 - 2 / (e^(2x) + 1). Its
 * error is absolute, a few units of 1e-7 (the softmax is shift-invariant:
 * an absolute error in a logit is what it feels); +-1 for +-inf (and for
 * |x| > 44, where e^(2x) passes fp32's range), NaN for NaN. */
FA_DEV float fa_tanh(float x) {
    const float e = fa_exp2(x * (2.0f * FA_LOG2E));
    return 1.0f - __fdividef(2.0f, e + 1.0f);
}

/* What the options need of one (sequence, query head). */
struct fa_score {
    float sl2; /* scale log2 e */
#ifdef SOFTCAP
    float cap_in, cap_out; /* scale / softcap, softcap log2 e */
#endif
#ifdef ALIBI
    float slope; /* the head's slope times log2 e */
#endif
#ifdef BIAS
    const bias_t *bias; /* bias[b, h, 0, 0] */
    i64 bias_ss;        /* between query rows */
#endif
};

/* b: the batch index (no varlen with a bias); h: the query head. */
FA_DEV fa_score score_of(const fa_params &p, int b, int h) {
    fa_score sc;
    sc.sl2 = p.scale_log2;
#ifdef SOFTCAP
    sc.cap_in = p.softcap_in;
    sc.cap_out = p.softcap_out;
#endif
#ifdef ALIBI
    sc.slope = p.alibi[h];
#endif
#ifdef BIAS
    sc.bias = (const bias_t *)p.bias + p.bias_off + (i64)b * p.bias_sb + (i64)h * p.bias_sh;
    sc.bias_ss = p.bias_ss;
#endif
    (void)p;
    (void)b;
    (void)h;
    return sc;
}

/* Asks L2 for the bias of a tile to come, rows [r0, r0 + ROWS) and keys
 * [c0, c0 + COLS) of (sequence b, query head h), the block's NTHREADS
 * threads sharing its 128-byte lines; rows and keys past the sequence's
 * ends are left out (r0 and c0 lie inside). A hint that takes no
 * registers beyond its own: the loads of that tile then come from L2. */
template <int ROWS, int COLS, int NTHREADS>
FA_DEV void bias_prefetch(const fa_params &p, const fa_mask &m, int b, int h, int r0, int c0, int tid) {
#ifdef BIAS
    constexpr int LINE = 128 / (int)sizeof(bias_t);
    constexpr int PER_ROW = (COLS + LINE - 1) / LINE + 1; /* an unaligned row touches one line more */
    const bias_t *base = (const bias_t *)p.bias + p.bias_off + (i64)b * p.bias_sb + (i64)h * p.bias_sh;
#pragma unroll 1
    for (int e = tid; e < ROWS * PER_ROW; e += NTHREADS) {
        const int r = e / PER_ROW, c = min((e % PER_ROW) * LINE, COLS - 1);
        if (r < m.len_q - r0 && c < m.len_k - c0)
            asm volatile("prefetch.L2 [%0];" ::"l"(base + (i64)(r0 + r) * p.bias_ss + (c0 + c)));
    }
#else
    (void)p;
    (void)m;
    (void)b;
    (void)h;
    (void)r0;
    (void)c0;
    (void)tid;
#endif
}

/* The factor kernels put between their scores and exp2: the scores are in
 * log2 units already with options, raw products without. */
#ifdef SCORE_OPTIONS
#define SCORE_SL2(p) 1.0f
#else
#define SCORE_SL2(p) ((p).scale_log2)
#endif

/* The logit of a raw product s in log2 units. bv: bias[b, h, i, j] as
 * fp32 (BIAS); dist: i + len_k - len_q - j, any sign (ALIBI); *t: the
 * tanh the cap took (SOFTCAP; else 0), whose 1 - t^2 the backward's dS
 * takes (score_dcap). */
FA_DEV float score_log2(const fa_score &sc, float s, float bv, float dist, float *t) {
    (void)bv;
    (void)dist;
#ifdef SOFTCAP
    *t = fa_tanh(s * sc.cap_in);
    s = sc.cap_out * *t;
#else
    *t = 0.0f;
    s *= sc.sl2;
#endif
#ifdef BIAS
    s = fmaf(bv, FA_LOG2E, s);
#endif
#ifdef ALIBI
    s = fmaf(-sc.slope, fabsf(dist), s);
#endif
    return s;
}

/* d(capped logit) / d(scaled logit) from score_log2's t. */
FA_DEV float score_dcap(float t) {
#ifdef SOFTCAP
    return fmaf(-t, t, 1.0f);
#else
    (void)t;
    return 1.0f;
#endif
}

/* The ALiBi distance i + len_k - len_q - j of the query rows_left rows and
 * the key keys_left keys before the ends of their sequences (as
 * visible_left counts them), in fp32 (exact below 2^24). */
FA_DEV float alibi_dist_left(int rows_left, int keys_left) { return (float)((i64)keys_left - rows_left); }

/* A thread's origin for the elements it holds: the query rows0 rows and
 * the key keys0 keys before the ends of the sequence; an element is at
 * offsets (r, c) from it, constants in the kernels' unrolled loops, so
 * the per-element work is an add and a load from a per-row address. */
struct fa_score_at {
    int rows0, keys0;
#ifdef ALIBI
    float dbase; /* the origin's distance */
#endif
#ifdef BIAS
    const bias_t *b0; /* the bias at the origin (read only inside the sequence) */
#endif
};

FA_DEV fa_score_at score_at(const fa_score &sc, const fa_mask &m, int rows0, int keys0) {
    fa_score_at o;
    o.rows0 = rows0;
    o.keys0 = keys0;
#ifdef ALIBI
    o.dbase = alibi_dist_left(rows0, keys0);
#endif
#ifdef BIAS
    o.b0 = sc.bias + (i64)(m.len_q - rows0) * sc.bias_ss + (m.len_k - keys0);
#endif
    (void)sc;
    (void)m;
    return o;
}

/* score_log2 of the raw product s of element (r, c) from the origin. With
 * GUARD, an element past the end of either sequence reads no bias (it is
 * masked, or a padding row never stored); without, every element lies
 * inside (whole tiles). */
template <bool GUARD>
FA_DEV float score_elem(const fa_score &sc, const fa_score_at &o, float s, int r, int c, float *t) {
    float bv = 0.0f, dist = 0.0f;
#ifdef BIAS
    if (!GUARD || (r < o.rows0 && c < o.keys0)) bv = bias_to_f32(o.b0[(i64)r * sc.bias_ss + c]);
#endif
#ifdef ALIBI
    dist = o.dbase + (float)(r - c);
#endif
    (void)o;
    (void)r;
    (void)c;
    return score_log2(sc, s, bv, dist, t);
}

/* ------------------------------------------------------------------------ */
/* The end of a row's online softmax (the rules for NaN and infinities are   */
/* above fa_forward in include/flashattn.h)                                  */
/* ------------------------------------------------------------------------ */

/* Whether the masks leave query q0 + r (inside the sequence) any key: its
 * key range under the causal and window masks, then the block mask's
 * blocks over that range. A row's running maximum stays -inf when no key
 * is visible, but also when its visible scores were all NaN (max ignores
 * them) or -inf; values must never make a row look masked, so the masks
 * decide. Called at the end, for rows whose maximum stayed -inf only:
 * nothing is added per element or per tile. */
FA_DEV bool row_sees_key(const fa_mask &m, int q0, int r) {
    if (r >= m.len_q - q0) return false; /* padding: never stored */
    const int i = q0 + r;
    int lo, hi;
    key_range(m, i, i, &lo, &hi);
    if (hi <= lo) return false;
#ifdef BLOCK_MASK
    const i64 row = (i64)(i / m.block_q) * m.block_cols;
    for (int c = lo / m.block_k; c <= (hi - 1) / m.block_k; c++)
        if (m.block_mask[row + c]) return true;
    return false;
#else
    return true;
#endif
}

/* L of a finished row that sees a key, from m and l = sum of exp2(s - m)
 * (base 2): NaN where a NaN met l, or where the visible scores were all
 * -inf (l = 0: the softmax is 0 / 0, and O, the accumulator over l, is
 * NaN too); else ln of the sum. A key split's partial row (SPLITK builds)
 * keeps -inf for l = 0 instead: no mass, which the merge weighs as nothing
 * and turns into NaN only if no split has any (rowwise.cuh). */
FA_DEV float row_lse(float m, float l) {
#ifndef SPLITK
    if (l == 0.0f) return FA_NAN;
#endif
    return (m + log2f(l)) * FA_LN2;
}

/* ------------------------------------------------------------------------ */
/* Dropout: Philox4x32-10 exactly as core/philox.h defines it                */
/* ------------------------------------------------------------------------ */

FA_DEV uint4 philox(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
#pragma unroll
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    return make_uint4(c0, c1, c2, c3);
}

/* The four random words of (row, columns 4g .. 4g + 3) of one (sequence,
 * head): bh = batch * heads_q + head. Positions are unsigned: a padding
 * row's q0 + r may pass INT_MAX, and wraps harmlessly here. The plan's
 * dropout origin moves them to where they lie in the larger problem whose
 * mask the plan draws (a ring's piece); drop_col0 is a multiple of 4, so
 * the group of four stays whole and every caller's col & 3 stays right. */
FA_DEV uint4 dropout_words(const fa_params &p, u32 bh, u32 row, u32 col4) {
    return philox((col4 + p.drop_col0) >> 2, row + p.drop_row0, bh, p.drop_offset_lo, p.drop_key0, p.drop_key1);
}

FA_DEV u32 word_of(uint4 w, int i) {
    return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}

/* Whether element (row, col) is kept. */
FA_DEV bool dropout_keep(const fa_params &p, u32 bh, u32 row, u32 col) {
    return word_of(dropout_words(p, bh, row, col & ~3u), (int)(col & 3u)) >= p.drop_threshold;
}

#endif
