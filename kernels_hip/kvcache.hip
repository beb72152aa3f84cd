/* A KV-cache step (fa_forward_kvcache) on the FP32 pipes: the HIP twin of
 * kernels_cuda/kvcache_simt.cu (with kvcache.cuh), the same semantics and
 * the same arithmetic in the same order. Any dtype, any head_dim multiple
 * of 8. Built on common.h's tile (BR packed rows, BC keys, TR x TC
 * micro-tiles, WAVE) and masks, with the options core/kvcache_launch.c
 * derives from the descriptor:
 *   KV_CACHE                 the step reads its lengths from cache_seqlens
 *   PAGED=P                  K and V are pools of pages of P tokens (P a
 *                            multiple of 16), found through block_table
 *   APPEND                   seqlen_new > 0: k_new and v_new are written
 *                            into the cache and attended to
 *   ROTARY_DIM=R             rotary embedding of the first R dimensions
 *   ROTARY_INTERLEAVED       pairs (2i, 2i + 1), else (i, i + R / 2)
 *   SOFTCAP ALIBI            the score options
 *   SPLITK                   keys split; splitk.hip's fa_splitk_merge
 *                            combines the partials
 *
 * Kernels, in the order backends/hip/hip_attention.c launches them:
 *
 *   fa_kv_prepare   one block of FA_KV_PREP_THREADS per sequence: its
 *                   lengths, rotary positions and pages against the rules
 *                   (fa_kv_seq_of), status[b] = 1 where they hold; for such
 *                   a sequence the step's new keys (rotated, rounded once
 *                   as stored) and values written into the cache. The
 *                   launches after it read status, so a sequence that
 *                   breaks the rules appends nothing, gets NaN rows, and no
 *                   index is formed from its data.
 *   fa_kv_attend    one block per (row tile, KV head, sequence x key split):
 *                   the query rows of the KV head's GQA group packed (row =
 *                   token * group + head in the group), so the group's
 *                   heads and tokens share every K/V tile; fwd.hip's
 *                   forward otherwise (Q rotated and rounded to q's dtype
 *                   as it is loaded, the score options in the header's
 *                   order, online softmax in base 2). Dynamic local memory
 *                   of fa_plan_local_mem's SIMT forward size:
 *                   Qt [D][BR], Kt [D][BC], Vs [BC][D], Pt [BC][BR].
 *
 * Both take the step's second parameter block by value (struct
 * fa_kv_params, core/kvcache_launch.h's field for field). Sizes: packed
 * rows (group x seqlen_q) below INT_MAX / 2 (the host checks), key
 * positions below seqlen_k < 2^31; element indices in 64 bits. */

#if !defined(KV_CACHE) || defined(VARLEN) || defined(DROPOUT) || defined(BLOCK_MASK) || defined(BIAS)
#error "kvcache.hip: a KV-cache step (KV_CACHE), fixed-length batches, no dropout, block mask or bias"
#endif

#define FA_KV_PREP_THREADS 128 /* core/kvcache_launch.h's */
#define DPT ((HEAD_DIM + NTC - 1) / NTC)

#if HEAD_DIM % NTC == 0
#define DIM_OK(x) true
#else
#define DIM_OK(x) ((x) < HEAD_DIM)
#endif

#if defined(SOFTCAP) || defined(ALIBI)
#define FA_KV_SCORE_OPTIONS 1
#endif

struct fa_kv_params {
    const int *cache_seqlens; /* [batch]: tokens cached before the step */
    const int *block_table;   /* [batch][max_pages] (PAGED) */
    const store_t *k_new, *v_new; /* [batch, seqlen_new, heads_kv, head_dim] (APPEND) */
    const float *rot_cos, *rot_sin; /* [seqlen_k][ROTARY_DIM / 2] (ROTARY_DIM) */
    const float *alibi;       /* [heads_q] raw slopes (ALIBI) */
    int *status;              /* [batch]: 1 where the sequence keeps the rules */
    fa_long kn_off, kn_sb, kn_ss, kn_sh;
    fa_long vn_off, vn_sb, vn_ss, vn_sh;
    float softcap, softcap_inv; /* SOFTCAP: the cap and its inverse */
    int seqlen_new, num_pages, max_pages, reserved;
};

/* One element of the storage dtype, widened. */
FA_FN float fa_kv_load1(const store_t *p, fa_long i) {
#if defined(DTYPE_F32)
    return p[i];
#elif defined(DTYPE_F16)
    return fa_half_to_float(p[i]);
#else
    return fa_bf16_to_float(p[i]);
#endif
}

/* x rounded to the storage dtype once, back in fp32. */
FA_FN float fa_kv_round(float x) {
#if defined(DTYPE_F32)
    return x;
#elif defined(DTYPE_F16)
    return fa_half_to_float(fa_float_to_half(x));
#else
    return fa_bf16_to_float(fa_bf16_round(x));
#endif
}

FA_FN void fa_kv_store8(store_t *p, fa_long i, const float v[8]) {
#pragma unroll
    for (int e = 0; e < 8; e++) fa_store1(p, i + e, v[e]);
}

/* The lengths of sequence b's step, read from device memory: cs tokens in
 * its cache before the step, len_k = cs + seqlen_new keys. bad where the
 * lengths break the descriptor's rules (a negative length, an append past
 * the capacity seqlen_k, or, with rotary embedding, a query position, cs
 * or cs + i, past the cos/sin tables' seqlen_k rows); the kernels then
 * read and write no K, V or table row of the sequence, and its outputs are
 * NaN. seqlen_k - seqlen_new >= 0 (the host checked). */
struct fa_kv_seq {
    int cs, len_k;
    bool bad;
};

FA_FN fa_kv_seq fa_kv_seq_of(const fa_kv_params &kv, int b, int seqlen_q, int seqlen_k) {
    fa_kv_seq s;
    s.cs = kv.cache_seqlens[b];
    s.bad = s.cs < 0 || s.cs > seqlen_k - kv.seqlen_new;
#if defined(ROTARY_DIM) && (defined(CAUSAL) || defined(WINDOW))
    /* The last query's position cs + seqlen_q - 1 must be a table row. */
    s.bad |= s.cs > seqlen_k - seqlen_q;
#elif defined(ROTARY_DIM)
    /* Every query at position cs: a table row (cs = seqlen_k is a full
     * cache with nothing appended). */
    (void)seqlen_q;
    s.bad |= s.cs > seqlen_k - 1;
#else
    (void)seqlen_q;
#endif
    s.len_k = s.bad ? 0 : s.cs + kv.seqlen_new;
    return s;
}

#ifdef PAGED
#if PAGED % 16 != 0 || PAGED <= 0
#error "PAGED: a page holds a positive multiple of 16 tokens"
#endif
/* The page of sequence b's token j (j below the sequence's length, so
 * below seqlen_k: inside the table's row), unchecked: fa_kv_prepare
 * checked every page the sequence's length reaches. */
FA_FN int fa_kv_page(const fa_kv_params &kv, int b, int j) { return kv.block_table[(fa_long)b * kv.max_pages + j / PAGED]; }

FA_FN bool fa_kv_page_ok(const fa_kv_params &kv, int pg) { return pg >= 0 && pg < kv.num_pages; }
#endif

/* Element index of token j, head h, dimension 0 of a cache tensor (K or V)
 * of sequence b that keeps the rules: in its page of the pool (PAGED), or
 * in its rows of the contiguous cache. */
FA_FN fa_long fa_kv_cache_row(const fa_layout &l, const fa_kv_params &kv, int b, int j, int h) {
#ifdef PAGED
    const int pg = fa_kv_page(kv, b, j);
    return l.offset + (fa_long)pg * l.stride_batch + (fa_long)(j % PAGED) * l.stride_seq + (fa_long)h * l.stride_head;
#else
    (void)kv;
    return l.offset + (fa_long)b * l.stride_batch + (fa_long)j * l.stride_seq + (fa_long)h * l.stride_head;
#endif
}

#ifdef ROTARY_DIM
#if ROTARY_DIM % 2 != 0 || ROTARY_DIM <= 0 || ROTARY_DIM > HEAD_DIM
#error "ROTARY_DIM: even, in (0, HEAD_DIM]"
#endif
#define ROT_HALF (ROTARY_DIM / 2)
/* Eight elements from dimension x0 (a multiple of 8) of the row at index
 * row (dimension 0) of p, in fp32, rotated at position pos where x <
 * ROTARY_DIM: pair (a, b) with angle index i becomes (a cos - b sin, a sin
 * + b cos), cos and sin from row pos of the fp32 tables [seqlen_k]
 * [ROTARY_DIM / 2]. Interleaved pairs are (2i, 2i + 1); otherwise (i, i +
 * ROTARY_DIM / 2), whose partner lies in another chunk and is read on its
 * own. */
FA_FN void fa_kv_rotary8(const store_t *p, fa_long row, int x0, int pos, const fa_kv_params &kv, float v[8]) {
    fa_load8(p, row + x0, v);
    if (x0 >= ROTARY_DIM) return;
    const float *cs = kv.rot_cos + (fa_long)pos * ROT_HALF, *sn = kv.rot_sin + (fa_long)pos * ROT_HALF;
#ifdef ROTARY_INTERLEAVED
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
        const int x = x0 + e;
        if (x < ROTARY_DIM) {
            const float c = cs[x >> 1], s = sn[x >> 1], a = v[e], bb = v[e + 1];
            v[e] = fmaf(a, c, -bb * s);
            v[e + 1] = fmaf(a, s, bb * c);
        }
    }
#else
    float r[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const int x = x0 + e;
        r[e] = v[e];
        if (x < ROTARY_DIM) {
            const bool first = x < ROT_HALF;
            const int i = first ? x : x - ROT_HALF;
            const float c = cs[i], s = sn[i];
            const float other = fa_kv_load1(p, row + (first ? x + ROT_HALF : i));
            /* first half: a cos - b sin (a = own); second: a sin + b cos
             * (a = the first half's element, b = own) */
            r[e] = first ? fmaf(v[e], c, -other * s) : fmaf(other, s, v[e] * c);
        }
    }
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = r[e];
#endif
}
#endif

/* Whether every element of rows of tokens [tok_lo, tok_hi] (inside the
 * sequence) and keys [k0, k0 + BC) is visible: no per-element test needed.
 * Padding rows of the packed tile are never stored. */
FA_FN bool fa_kv_tile_full(const fa_mask &m, int tok_lo, int tok_hi, int k0) {
    if (BC > m.len_k - k0) return false;
    const fa_long c1 = (fa_long)k0 + BC - 1, off = (fa_long)m.len_k - m.len_q;
    (void)tok_lo;
    (void)tok_hi;
    (void)c1;
    (void)off;
#ifdef CAUSAL
    if (c1 > tok_lo + off) return false;
#endif
#ifdef WINDOW
    if (m.window_right >= 0 && c1 > tok_lo + off + m.window_right) return false;
    if (m.window_left >= 0 && k0 < tok_hi + off - m.window_left) return false;
#endif
    return true;
}

extern "C" __global__ __launch_bounds__(FA_KV_PREP_THREADS) void
fa_kv_prepare(store_t *__restrict__ k, store_t *__restrict__ v, fa_long k_off, fa_long k_sb, fa_long k_ss,
              fa_long k_sh, fa_long v_off, fa_long v_sb, fa_long v_ss, fa_long v_sh, int seqlen_q, int seqlen_k,
              int heads_kv, const fa_kv_params kv) {
    const int b = (int)blockIdx.x, tid = (int)threadIdx.x;
    const fa_kv_seq s = fa_kv_seq_of(kv, b, seqlen_q, seqlen_k);
    bool bad = s.bad; /* the same for the whole block */
#ifdef PAGED
    /* Whether any thread found a page outside the pool: every thread that
     * does writes the same 1 (no __syncthreads_or: hiprtc's headers and
     * the mapping's need not agree on it). */
    __shared__ int any_bad;
    if (tid == 0) any_bad = 0;
    __syncthreads();
    if (!bad) {
        const int npg = s.len_k / PAGED + (s.len_k % PAGED != 0);
        const int *row = kv.block_table + (fa_long)b * kv.max_pages;
        bool mine = false;
        for (int i = tid; i < npg; i += FA_KV_PREP_THREADS) mine |= !fa_kv_page_ok(kv, row[i]);
        if (mine) any_bad = 1;
    }
    __syncthreads();
    bad = bad || any_bad != 0;
#endif
    if (tid == 0) kv.status[b] = bad ? 0 : 1;
#ifdef APPEND
    if (bad) return;
    const fa_layout lk = {k_off, k_sb, k_ss, k_sh}, lv = {v_off, v_sb, v_ss, v_sh};
    const fa_long groups = (fa_long)kv.seqlen_new * heads_kv * D8;
    for (fa_long e = tid; e < groups; e += FA_KV_PREP_THREADS) {
        const int x0 = (int)(e % D8) * 8;
        const fa_long th = e / D8;
        const int hk = (int)(th % heads_kv), n = (int)(th / heads_kv), j = s.cs + n;
        const fa_long krow = kv.kn_off + (fa_long)b * kv.kn_sb + (fa_long)n * kv.kn_ss + (fa_long)hk * kv.kn_sh;
        const fa_long vrow = kv.vn_off + (fa_long)b * kv.vn_sb + (fa_long)n * kv.vn_ss + (fa_long)hk * kv.vn_sh;
        float val[8];
#ifdef ROTARY_DIM
        fa_kv_rotary8(kv.k_new, krow, x0, j, kv, val);
#else
        fa_load8(kv.k_new, krow + x0, val);
#endif
        fa_kv_store8(k, fa_kv_cache_row(lk, kv, b, j, hk) + x0, val);
        fa_load8(kv.v_new, vrow + x0, val);
        fa_kv_store8(v, fa_kv_cache_row(lv, kv, b, j, hk) + x0, val);
    }
#else
    (void)k;
    (void)v;
    (void)k_off;
    (void)k_sb;
    (void)k_ss;
    (void)k_sh;
    (void)v_off;
    (void)v_sb;
    (void)v_ss;
    (void)v_sh;
    (void)heads_kv;
#endif
}

FA_KERNEL void fa_kv_attend(const store_t *__restrict__ q, const store_t *__restrict__ k,
                            const store_t *__restrict__ v, store_t *__restrict__ o, float *__restrict__ lse,
                            fa_long q_off, fa_long q_sb, fa_long q_ss, fa_long q_sh,
                            fa_long k_off, fa_long k_sb, fa_long k_ss, fa_long k_sh,
                            fa_long v_off, fa_long v_sb, fa_long v_ss, fa_long v_sh,
                            fa_long o_off, fa_long o_sb, fa_long o_ss, fa_long o_sh,
                            int seqlen_q, int heads_q, int group, fa_long total_q, float scale, float scale_log2,
                            int window_left, int window_right, int num_splits, float *__restrict__ part_o,
                            float *__restrict__ part_l, const fa_kv_params kv) {
    extern __shared__ __attribute__((aligned(16))) float fa_kv_smem[];
    float *Qt = fa_kv_smem, *Kt = Qt + HEAD_DIM * BR, *Vs = Kt + HEAD_DIM * BC, *Pt = Vs + BC * HEAD_DIM;

    const int lid = (int)threadIdx.x, tr = lid / NTC, tc = lid % NTC;
    const int hk = (int)blockIdx.y;
    const int b = (int)blockIdx.z / num_splits, split = (int)blockIdx.z % num_splits;
    (void)split;
    (void)part_o;
    (void)part_l;
    (void)o;
    (void)lse;
    const int rows_total = group * seqlen_q, pr0 = (int)blockIdx.x * BR;
    if (pr0 >= rows_total) return; /* the whole block: no barrier missed */
    const fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};
    const fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh};
    (void)lo;
    const fa_long start_q = (fa_long)b * seqlen_q;

    /* This thread's rows: token (-1 for padding) and query head. */
    int row_tok[TR], row_h[TR];
#pragma unroll
    for (int i = 0; i < TR; i++) {
        const int pr = pr0 + tr * TR + i;
        const int tok = pr < rows_total ? pr / group : -1;
        row_tok[i] = tok;
        row_h[i] = hk * group + (pr < rows_total ? pr - tok * group : 0);
    }

    /* A sequence that breaks the rules: NaN rows, nothing read (the whole
     * block leaves here: no barrier is missed). */
    if (!kv.status[b]) {
#pragma unroll
        for (int i = 0; i < TR; i++) {
            if (row_tok[i] < 0) continue;
#ifdef SPLITK
            const fa_long row = (fa_long)(split * heads_q + row_h[i]) * total_q + start_q + row_tok[i];
#pragma unroll
            for (int u = 0; u < DPT; u++) {
                const int x = tc + u * NTC;
                if (DIM_OK(x)) part_o[row * HEAD_DIM + x] = FA_NAN;
            }
            if (tc == 0) part_l[row] = FA_NAN;
#else
            const fa_long orow = fa_row_index(lo, b, start_q, row_tok[i], row_h[i]);
#pragma unroll
            for (int u = 0; u < DPT; u++) {
                const int x = tc + u * NTC;
                if (DIM_OK(x)) fa_store1(o, orow + x, FA_NAN);
            }
            if (tc == 0 && lse) lse[fa_lse_index(b, row_h[i], row_tok[i], heads_q, seqlen_q, start_q, total_q)] = FA_NAN;
#endif
        }
        return;
    }
    const int cs = kv.cache_seqlens[b];
    fa_mask mask;
    mask.len_q = seqlen_q;
    mask.len_k = cs + kv.seqlen_new;
    mask.window_left = window_left;
    mask.window_right = window_right;
    mask.block_q = mask.block_k = 1;
    mask.block_cols = 0;

    /* Q rows, rotated at cs + token (a causal mask or a window) or cs, and
     * rounded once to q's dtype as CUDA's tensor-core step rounds them. */
    for (int e = lid; e < BR * D8; e += WG_SIZE) {
        const int r = e / D8, x0 = (e % D8) * 8, pr = pr0 + r;
        float val[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (pr < rows_total) {
            const int tok = pr / group, gh = pr - tok * group;
            const fa_long qrow = fa_row_index(lq, b, start_q, tok, hk * group + gh);
#ifdef ROTARY_DIM
#if defined(CAUSAL) || defined(WINDOW)
            fa_kv_rotary8(q, qrow, x0, cs + tok, kv, val);
#else
            fa_kv_rotary8(q, qrow, x0, cs, kv, val);
#endif
            if (x0 < ROTARY_DIM)
#pragma unroll
                for (int i = 0; i < 8; i++) val[i] = fa_kv_round(val[i]);
#else
            fa_load8(q, qrow + x0, val);
#endif
        }
        fa_store8_t(Qt, BR, x0, r, val);
    }

    const int tok_lo = pr0 / group, tok_hi = (fa_imin(pr0 + BR, rows_total) - 1) / group;
    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(mask, tok_lo, tok_hi, &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
#ifdef SPLITK
    {
        const int per = (t_end - t_begin + num_splits - 1) / num_splits;
        const int s_begin = fa_imin(t_end, t_begin + split * per);
        t_end = fa_imin(t_end, s_begin + per);
        t_begin = s_begin;
    }
#endif

#ifdef FA_KV_SCORE_OPTIONS
    const float sl2 = FA_LOG2E;
    (void)scale_log2;
#else
    const float sl2 = scale_log2;
    (void)scale;
#endif
#ifdef ALIBI
    /* Per row: its head's slope and the key on its diagonal, tok + len_k -
     * len_q (distances |diag - key|, bottom-right aligned). */
    float slope[TR];
    int diag[TR];
#pragma unroll
    for (int i = 0; i < TR; i++) {
        slope[i] = row_tok[i] >= 0 ? kv.alibi[row_h[i]] : 0.0f;
        diag[i] = row_tok[i] >= 0 ? (mask.len_k - mask.len_q) + row_tok[i] : 0;
    }
#endif

    float m[TR], l[TR], acc[TR][DPT];
#pragma unroll
    for (int i = 0; i < TR; i++) {
        m[i] = -FA_INF;
        l[i] = 0.0f;
#pragma unroll
        for (int u = 0; u < DPT; u++) acc[i][u] = 0.0f;
    }

    for (int t = t_begin; t < t_end; t++) {
        const int k0 = t * BC;
        for (int e = lid; e < BC * D8; e += WG_SIZE) {
            const int c = e / D8, x0 = (e % D8) * 8;
            float kk[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            float vv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (c < mask.len_k - k0) {
                const int j = k0 + c;
                fa_load8(k, fa_kv_cache_row(lk, kv, b, j, hk) + x0, kk);
                fa_load8(v, fa_kv_cache_row(lv, kv, b, j, hk) + x0, vv);
            }
            fa_store8_t(Kt, BC, x0, c, kk);
            fa_store8(Vs + c * HEAD_DIM + x0, vv);
        }
        __syncthreads();

        float s[TR][TC];
#pragma unroll
        for (int i = 0; i < TR; i++)
#pragma unroll
            for (int j = 0; j < TC; j++) s[i][j] = 0.0f;
#pragma unroll 4
        for (int x = 0; x < HEAD_DIM; x++) {
            float a[TR], bk[TC];
            fa_lds_get(a, Qt + x * BR + tr * TR, TR);
            fa_lds_get(bk, Kt + x * BC + tc * TC, TC);
#pragma unroll
            for (int i = 0; i < TR; i++)
#pragma unroll
                for (int j = 0; j < TC; j++) s[i][j] = fmaf(a[i], bk[j], s[i][j]);
        }
        /* The score options in the header's order, then the masks; the
         * softmax in base 2. Padding rows are never stored. */
        const bool full = fa_kv_tile_full(mask, tok_lo, tok_hi, k0);
#pragma unroll
        for (int j = 0; j < TC; j++) {
            const int c = tc * TC + j;
            float col[TR];
#pragma unroll
            for (int i = 0; i < TR; i++) {
#ifdef FA_KV_SCORE_OPTIONS
                float x = s[i][j] * scale;
#ifdef SOFTCAP
                x = kv.softcap * fa_tanh(x * kv.softcap_inv);
#endif
#ifdef ALIBI
                x = fmaf(-slope[i], fabsf((float)((diag[i] - k0) - c)), x);
#endif
                x *= sl2;
#else
                float x = s[i][j] * sl2;
#endif
                if (!full && (row_tok[i] < 0 || !fa_visible(mask, 0, 0, row_tok[i], k0, c))) x = -FA_INF;
                s[i][j] = x;
                col[i] = x;
            }
            fa_lds_put(col, Pt + c * BR + tr * TR, TR);
        }
        __syncthreads();

        /* Row maxima over the whole tile; a row that has seen no visible key
         * keeps m = -inf and exponentiates against 0 (no inf - inf). */
        float alpha[TR], m_use[TR], mx[TR];
#pragma unroll
        for (int i = 0; i < TR; i++) mx[i] = m[i];
        for (int c = 0; c < BC; c++) {
            float pc[TR];
            fa_lds_get(pc, Pt + c * BR + tr * TR, TR);
#pragma unroll
            for (int i = 0; i < TR; i++) mx[i] = fmaxf(mx[i], pc[i]);
        }
#pragma unroll
        for (int i = 0; i < TR; i++) {
            m_use[i] = mx[i] == -FA_INF ? 0.0f : mx[i];
            alpha[i] = exp2f(m[i] - m_use[i]);
            m[i] = mx[i];
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < TC; j++) {
            float col[TR];
#pragma unroll
            for (int i = 0; i < TR; i++) col[i] = exp2f(s[i][j] - m_use[i]);
            fa_lds_put(col, Pt + (tc * TC + j) * BR + tr * TR, TR);
        }
        __syncthreads();

#pragma unroll
        for (int i = 0; i < TR; i++) {
            l[i] *= alpha[i];
#pragma unroll
            for (int u = 0; u < DPT; u++) acc[i][u] *= alpha[i];
        }
        for (int c = 0; c < BC; c++) {
            float vv[DPT];
#pragma unroll
            for (int u = 0; u < DPT; u++) {
                const int x = tc + u * NTC;
                vv[u] = DIM_OK(x) ? Vs[c * HEAD_DIM + x] : 0.0f;
            }
            float pc[TR];
            fa_lds_get(pc, Pt + c * BR + tr * TR, TR);
#pragma unroll
            for (int i = 0; i < TR; i++) {
                l[i] += pc[i];
#pragma unroll
                for (int u = 0; u < DPT; u++) acc[i][u] = fmaf(pc[i], vv[u], acc[i][u]);
            }
        }
        __syncthreads();
    }

    /* Normalise once; a row the masks leave no key gives O = 0 and L = -inf
     * (fa_row_sees_key). */
#pragma unroll
    for (int i = 0; i < TR; i++) {
        if (row_tok[i] < 0) continue;
        const int tok = row_tok[i], h = row_h[i];
        const bool masked = m[i] == -FA_INF && !fa_row_sees_key(mask, 0, 0, tok);
        const float inv = 1.0f / l[i];
        const float lse_r = masked ? -FA_INF : fa_row_lse(m[i], l[i]);
#ifdef SPLITK
        const fa_long row = (fa_long)(split * heads_q + h) * total_q + start_q + tok;
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (DIM_OK(x)) part_o[row * HEAD_DIM + x] = masked ? 0.0f : acc[i][u] * inv;
        }
        if (tc == 0) part_l[row] = lse_r;
#else
        const fa_long orow = fa_row_index(lo, b, start_q, tok, h);
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (DIM_OK(x)) fa_store1(o, orow + x, masked ? 0.0f : acc[i][u] * inv);
        }
        if (tc == 0 && lse) lse[fa_lse_index(b, h, tok, heads_q, seqlen_q, start_q, total_q)] = lse_r;
#endif
    }
}
