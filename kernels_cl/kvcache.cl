/* A KV-cache step (fa_forward_kvcache; include/flashattn.h, the
 * descriptor's kv_cache fields), built after common.h and before splitk.cl
 * (whose fa_splitk_merge combines the key splits). Four kernels, queued in
 * this order by backends/opencl/cl_kvcache.c:
 *
 *   fa_kv_check   one work-group per sequence: its length, rotary
 *                 positions and pages against the rules; status[b] = 1
 *                 where they hold. The other kernels read it, so a
 *                 sequence that breaks them appends nothing and gets O and
 *                 L NaN, and no index is formed from its data.
 *   fa_kv_append  one work-item per (pair of dimensions, token, KV head,
 *                 sequence): k_new rotated in fp32 and rounded once to the
 *                 cache's dtype, v_new copied, at cache_seqlens[b] + t.
 *   fa_kv_attend  one work-group per (row tile, KV head, sequence x key
 *                 split): the query rows of the KV head's GQA group, heads
 *                 times tokens packed (row r = token * group + head in the
 *                 group), so each KV head's keys are read once per row
 *                 tile. The SIMT forward's structure (fwd.cl): Q in local
 *                 memory (rotated and rounded to q's dtype as it is
 *                 loaded), K and V tiles through it, a TR x TC micro-tile
 *                 of scores per work-item, online softmax in base 2.
 *                 Keys are found through the block table (PAGED) or in the
 *                 sequence's contiguous cache. Local memory, as
 *                 fa_plan_local_mem's SIMT forward:
 *                   Qt [HEAD_DIM][BR], Kt [HEAD_DIM][BC], Vs [BC][HEAD_DIM],
 *                   Pt [BC][BR]
 *   fa_splitk_merge (splitk.cl) with SPLITK.
 *
 * Build options beyond common.h's: PAGED, ROTARY, ROTARY_INTERLEAVED,
 * SOFTCAP, ALIBI (CAUSAL, WINDOW and SPLITK as common.h says). The
 * score of query i and key j, in the header's order: s = scale q.k, then
 * softcap * tanh(s / softcap), then - slope[h] |i + len_k - len_q - j|.
 *
 * Sizes: the host refuses steps whose packed rows (group x seqlen_q) pass
 * INT_MAX / 2, so row indices fit an int; key positions stay below
 * seqlen_k < 2^31 and every element index is a long. */

#define KV_CHECK_WG 64

/* One element, widened to fp32; a value rounded once to the storage
 * dtype and widened back. */
#if defined(DTYPE_F32)
#define KV_LOAD1(p, i) ((p)[i])
FA_FN float kv_round(float x) { return x; }
#elif defined(DTYPE_F16)
#define KV_LOAD1(p, i) vload_half((i), (p))
FA_FN float kv_round(float x) {
    ushort bits;
    vstore_half_rte(x, 0, (half *)&bits);
    return vload_half(0, (const half *)&bits);
}
#else
#define KV_LOAD1(p, i) as_float((uint)(p)[i] << 16)
FA_FN float kv_round(float x) { return as_float((uint)bf16_round(x) << 16); }
#endif

/* Element index of (token j of sequence b, KV head hk, dim 0) in a cache
 * (K or V) of a sequence fa_kv_check passed. */
FA_FN long kv_cache_row(fa_layout l, __global const int *block_table, int b, long j, int hk, int page_size,
                        long pages_per_seq) {
#ifdef PAGED
    const long page = block_table[(long)b * pages_per_seq + j / page_size];
    return l.offset + page * l.stride_batch + (j % page_size) * l.stride_seq + (long)hk * l.stride_head;
#else
    (void)block_table;
    (void)page_size;
    (void)pages_per_seq;
    return l.offset + (long)b * l.stride_batch + j * l.stride_seq + (long)hk * l.stride_head;
#endif
}

/* ------------------------------------------------------------------------ */

__kernel __attribute__((reqd_work_group_size(KV_CHECK_WG, 1, 1))) void
fa_kv_check(__global const int *cache_seqlens, __global const int *block_table, __global int *status, int seqlen_k,
            int seqlen_q, int seqlen_new, int num_pages, int page_size, long pages_per_seq, int rotary_dim,
            int query_offsets) {
    __local int bad[KV_CHECK_WG];
    const int lid = get_local_id(0), b = get_group_id(0);
    const long len = cache_seqlens[b];
    bool ok = len >= 0 && len + seqlen_new <= seqlen_k;
    if (rotary_dim > 0) {
        /* The last rotary position read: an appended key's or a query's. */
        const long last = max(len + seqlen_new - 1, len + (query_offsets ? seqlen_q - 1 : 0));
        ok = ok && last <= (long)seqlen_k - 1;
    }
    int mine = 0;
#ifdef PAGED
    if (ok) {
        const long used = (len + seqlen_new + page_size - 1) / page_size;
        for (long p = lid; p < used; p += KV_CHECK_WG) {
            const int page = block_table[(long)b * pages_per_seq + p];
            if (page < 0 || page >= num_pages) mine = 1;
        }
    }
#else
    (void)block_table;
    (void)num_pages;
    (void)page_size;
    (void)pages_per_seq;
#endif
    bad[lid] = mine;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        int any = 0;
        for (int i = 0; i < KV_CHECK_WG; i++) any |= bad[i];
        status[b] = ok && !any ? 1 : 0;
    }
}

/* ------------------------------------------------------------------------ */

/* Work-item (u, t * heads_kv + hk, b): u < rotary_dim / 2 rotates the
 * pair (2u, 2u + 1) (ROTARY_INTERLEAVED) or (u, u + rotary_dim / 2) at
 * position cache_seqlens[b] + t; the others copy dimensions rotary_dim +
 * 2 (u - rotary_dim / 2) and the next. */
__kernel void fa_kv_append(__global const store_t *k_new, __global const store_t *v_new, __global store_t *k_cache,
                           __global store_t *v_cache, __global const int *cache_seqlens,
                           __global const int *block_table, __global const int *status,
                           __global const float *rot_cos, __global const float *rot_sin, long kn_off, long kn_sb,
                           long kn_ss, long kn_sh, long vn_off, long vn_sb, long vn_ss, long vn_sh, long k_off,
                           long k_sb, long k_ss, long k_sh, long v_off, long v_sb, long v_ss, long v_sh,
                           int seqlen_new, int heads_kv, int page_size, long pages_per_seq, int rotary_dim) {
    const int u = get_global_id(0), b = get_global_id(2);
    if (u >= HEAD_DIM / 2 || get_global_id(1) >= (size_t)seqlen_new * (size_t)heads_kv) return;
    if (!status[b]) return;
    const int t = (int)(get_global_id(1) / (size_t)heads_kv), hk = (int)(get_global_id(1) % (size_t)heads_kv);
    const long pos = (long)cache_seqlens[b] + t;
    const int half_r = rotary_dim / 2;
    int a, c;
    if (u < half_r) {
#ifdef ROTARY_INTERLEAVED
        a = 2 * u;
        c = 2 * u + 1;
#else
        a = u;
        c = u + half_r;
#endif
    } else {
        a = rotary_dim + 2 * (u - half_r);
        c = a + 1;
    }
    const fa_layout lkn = {kn_off, kn_sb, kn_ss, kn_sh}, lvn = {vn_off, vn_sb, vn_ss, vn_sh};
    const fa_layout lk = {k_off, k_sb, k_ss, k_sh}, lv = {v_off, v_sb, v_ss, v_sh};
    const long ks = fa_row_index(lkn, b, 0, t, hk), vs = fa_row_index(lvn, b, 0, t, hk);
    const long kd = kv_cache_row(lk, block_table, b, pos, hk, page_size, pages_per_seq);
    const long vd = kv_cache_row(lv, block_table, b, pos, hk, page_size, pages_per_seq);
    float x = KV_LOAD1(k_new, ks + a), y = KV_LOAD1(k_new, ks + c);
#ifdef ROTARY
    if (u < half_r) {
        const float co = rot_cos[pos * half_r + u], si = rot_sin[pos * half_r + u];
        const float rx = x * co - y * si, ry = x * si + y * co;
        x = rx;
        y = ry;
    }
#else
    (void)rot_cos;
    (void)rot_sin;
#endif
    STORE1(k_cache, kd + a, x);
    STORE1(k_cache, kd + c, y);
    STORE1(v_cache, vd + a, KV_LOAD1(v_new, vs + a));
    STORE1(v_cache, vd + c, KV_LOAD1(v_new, vs + c));
}

/* ------------------------------------------------------------------------ */

/* Output columns per work-item, as in fwd.cl: column tc + u * NTC. */
#define DPT ((HEAD_DIM + NTC - 1) / NTC)

/* q[b, i, h, x] rotated at position pos and rounded to q's dtype (ROTARY,
 * x < rotary_dim), else as stored. */
FA_FN float kv_query(__global const store_t *q, long base, int x, long pos, __global const float *rot_cos,
                     __global const float *rot_sin, int rotary_dim) {
    const float val = KV_LOAD1(q, base + x);
#ifdef ROTARY
    if (x < rotary_dim) {
        const int half_r = rotary_dim / 2;
#ifdef ROTARY_INTERLEAVED
        const int pair = x / 2, first = x % 2 == 0, other = first ? x + 1 : x - 1;
#else
        const int first = x < half_r, pair = first ? x : x - half_r, other = first ? x + half_r : x - half_r;
#endif
        const float co = rot_cos[pos * half_r + pair], si = rot_sin[pos * half_r + pair];
        const float y = KV_LOAD1(q, base + other);
        return kv_round(first ? val * co - y * si : y * si + val * co);
    }
#else
    (void)pos;
    (void)rot_cos;
    (void)rot_sin;
    (void)rotary_dim;
#endif
    return val;
}

/* Where row r of this work-item's tile goes: its token, query head and
 * index among the split partials (SPLITK) or in o and L. */
FA_FN void kv_row_of(int pr, int group, int hk, int *i, int *h) {
    *i = pr / group;
    *h = hk * group + pr % group;
}

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
fa_kv_attend(__global const store_t *q, __global const store_t *k, __global const store_t *v, __global store_t *o,
             __global float *lse, __global const int *cache_seqlens, __global const int *block_table,
             __global const int *status, __global const float *rot_cos, __global const float *rot_sin,
             __global const float *alibi, __global float *part_o, __global float *part_l, long q_off, long q_sb,
             long q_ss, long q_sh, long k_off, long k_sb, long k_ss, long k_sh, long v_off, long v_sb, long v_ss,
             long v_sh, long o_off, long o_sb, long o_ss, long o_sh, int seqlen_q, int seqlen_new, int heads_q,
             int group, int num_splits, float scale, float softcap, int window_left, int window_right, int page_size,
             long pages_per_seq, int rotary_dim, int query_offsets, int has_lse) {
    __local float Qt[HEAD_DIM * BR] FA_LOCAL_ALIGN;
    __local float Kt[HEAD_DIM * BC] FA_LOCAL_ALIGN;
    __local float Vs[BC * HEAD_DIM] FA_LOCAL_ALIGN;
    __local float Pt[BC * BR] FA_LOCAL_ALIGN;

    const int lid = get_local_id(0);
    const int tr = lid / NTC, tc = lid % NTC;
    const int pr0 = (int)get_group_id(0) * BR;
    const int hk = get_group_id(1);
    const int b = get_group_id(2) / num_splits, split = get_group_id(2) % num_splits;
    const int rows = group * seqlen_q;
    const long total_q = (long)get_num_groups(2) / num_splits * seqlen_q;
    const fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};
    const fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh};
    (void)part_o;
    (void)part_l;
    (void)lse;
    (void)has_lse;
    (void)total_q;

    /* A sequence that breaks the rules: NaN for its rows, nothing read. */
    if (!status[b]) {
        for (int ii = 0; ii < TR; ii++) {
            const int pr = pr0 + tr * TR + ii;
            if (pr >= rows) continue;
            int i, h;
            kv_row_of(pr, group, hk, &i, &h);
#ifdef SPLITK
            const long row = ((long)split * heads_q + h) * total_q + (long)b * seqlen_q + i;
            for (int u = 0; u < DPT; u++)
                if (tc + u * NTC < HEAD_DIM) part_o[row * HEAD_DIM + tc + u * NTC] = NAN;
            if (tc == 0) part_l[row] = NAN;
#else
            const long o_row = fa_row_index(lo, b, 0, i, h);
            for (int u = 0; u < DPT; u++)
                if (tc + u * NTC < HEAD_DIM) STORE1(o, o_row + tc + u * NTC, NAN);
            if (tc == 0 && has_lse) lse[((long)b * heads_q + h) * seqlen_q + i] = NAN;
#endif
        }
        return; /* the whole work-group: no barrier missed */
    }

    const long len = cache_seqlens[b];
    fa_mask mask;
    mask.len_q = seqlen_q;
    mask.len_k = (int)(len + seqlen_new);
    mask.window_left = window_left;
    mask.window_right = window_right;
    mask.block_q = mask.block_k = mask.block_cols = 1;
    __global const uchar *no_blocks = 0;

    /* Q tile: packed rows past the group's zero-filled. */
    for (int e = lid; e < BR * HEAD_DIM; e += WG_SIZE) {
        const int r = e / HEAD_DIM, x = e % HEAD_DIM, pr = pr0 + r;
        float val = 0.0f;
        if (pr < rows) {
            int i, h;
            kv_row_of(pr, group, hk, &i, &h);
            val = kv_query(q, fa_row_index(lq, b, 0, i, h), x, len + (query_offsets ? i : 0), rot_cos, rot_sin,
                           rotary_dim);
        }
        Qt[x * BR + r] = val;
    }

    /* This work-item's rows: token, head, and ALiBi slope. */
    int row_i[TR], row_h[TR];
    float slope[TR];
    for (int ii = 0; ii < TR; ii++) {
        const int pr = pr0 + tr * TR + ii;
        row_i[ii] = -1;
        row_h[ii] = 0;
        if (pr < rows) kv_row_of(pr, group, hk, &row_i[ii], &row_h[ii]);
#ifdef ALIBI
        slope[ii] = row_i[ii] >= 0 ? alibi[row_h[ii]] : 0.0f;
#else
        slope[ii] = 0.0f;
#endif
    }
    (void)alibi;
    (void)slope;
    (void)softcap;

    /* Key tiles the tile's tokens can see, then this split's share. */
    const int i_first = pr0 / group, i_last = (min(pr0 + BR, rows) - 1) / group;
    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(&mask, i_first, i_last, &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
#ifdef SPLITK
    {
        const int per = (t_end - t_begin + num_splits - 1) / num_splits;
        const int s_begin = min(t_end, t_begin + split * per);
        t_end = min(t_end, s_begin + per);
        t_begin = s_begin;
    }
#endif
    const long off_k = (long)mask.len_k - mask.len_q;
    (void)off_k;

    float m[TR], l[TR], acc[TR][DPT];
    for (int ii = 0; ii < TR; ii++) {
        m[ii] = -INFINITY;
        l[ii] = 0.0f;
        for (int c = 0; c < DPT; c++) acc[ii][c] = 0.0f;
    }
    const float log2e = FA_LOG2E, scale_log2 = scale * FA_LOG2E;
    (void)log2e;
    (void)scale_log2;

    for (int t = t_begin; t < t_end; t++) {
        const int k0 = t * BC;
        /* K transposed and V as is; keys past the sequence zero-filled. */
        for (int e = lid; e < BC * D8; e += WG_SIZE) {
            const int c = e / D8, x0 = (e % D8) * 8;
            float8 kv = (float8)(0.0f), vv = (float8)(0.0f);
            if (c < mask.len_k - k0) {
                const long j = (long)k0 + c;
                kv = LOAD8(k, kv_cache_row(lk, block_table, b, j, hk, page_size, pages_per_seq) + x0);
                vv = LOAD8(v, kv_cache_row(lv, block_table, b, j, hk, page_size, pages_per_seq) + x0);
            }
            STORE8_T(Kt, BC, x0, c, kv);
            vstore8(vv, 0, Vs + c * HEAD_DIM + x0);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[TR][TC];
        for (int ii = 0; ii < TR; ii++)
            for (int j = 0; j < TC; j++) s[ii][j] = 0.0f;
        for (int x = 0; x < HEAD_DIM; x++) {
            float a[TR], bk[TC];
            FA_VLOAD_TR(a, Qt + x * BR + tr * TR);
            FA_VLOAD_TC(bk, Kt + x * BC + tc * TC);
            for (int ii = 0; ii < TR; ii++)
                for (int j = 0; j < TC; j++) s[ii][j] = fma(a[ii], bk[j], s[ii][j]);
        }
        /* The score options in natural units, then base 2; hidden keys and
         * padding rows -inf. */
        for (int j = 0; j < TC; j++) {
            float col[TR];
            const int c = tc * TC + j;
            for (int ii = 0; ii < TR; ii++) {
                float sc;
#if defined(SOFTCAP) || defined(ALIBI)
                sc = scale * s[ii][j];
#ifdef SOFTCAP
                sc = softcap * tanh(sc / softcap);
#endif
#ifdef ALIBI
                sc -= slope[ii] * (float)fabs((float)((long)row_i[ii] + off_k - ((long)k0 + c)));
#endif
                sc *= log2e;
#else
                sc = s[ii][j] * scale_log2;
#endif
                if (row_i[ii] < 0 || !fa_visible(&mask, no_blocks, row_i[ii], 0, k0, c)) sc = -INFINITY;
                s[ii][j] = sc;
                col[ii] = sc;
            }
            FA_VSTORE_TR(col, Pt + c * BR + tr * TR);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* New running maxima; a row that has seen no visible key keeps
         * m = -inf and exponentiates against 0 (no inf - inf). */
        float alpha[TR], m_use[TR], mx[TR];
        for (int ii = 0; ii < TR; ii++) mx[ii] = m[ii];
        for (int c = 0; c < BC; c++) {
            float pc[TR];
            FA_VLOAD_TR(pc, Pt + c * BR + tr * TR);
            for (int ii = 0; ii < TR; ii++) mx[ii] = fmax(mx[ii], pc[ii]);
        }
        for (int ii = 0; ii < TR; ii++) {
            m_use[ii] = mx[ii] == -INFINITY ? 0.0f : mx[ii];
            alpha[ii] = exp2(m[ii] - m_use[ii]);
            m[ii] = mx[ii];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int j = 0; j < TC; j++) {
            float col[TR];
            for (int ii = 0; ii < TR; ii++) col[ii] = exp2(s[ii][j] - m_use[ii]);
            FA_VSTORE_TR(col, Pt + (tc * TC + j) * BR + tr * TR);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int ii = 0; ii < TR; ii++) {
            l[ii] *= alpha[ii];
            for (int c = 0; c < DPT; c++) acc[ii][c] *= alpha[ii];
        }
        for (int c = 0; c < BC; c++) {
            float vv[DPT];
            for (int u = 0; u < DPT; u++) {
#if HEAD_DIM % NTC == 0
                vv[u] = Vs[c * HEAD_DIM + tc + u * NTC];
#else
                vv[u] = Vs[c * HEAD_DIM + min(tc + u * NTC, HEAD_DIM - 1)];
#endif
            }
            float pc[TR];
            FA_VLOAD_TR(pc, Pt + c * BR + tr * TR);
            for (int ii = 0; ii < TR; ii++) {
                l[ii] += pc[ii];
                for (int u = 0; u < DPT; u++) acc[ii][u] = fma(pc[ii], vv[u], acc[ii][u]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* Normalise once; a row the masks leave no key gives O = 0 and
     * L = -inf, whatever its values. */
    for (int ii = 0; ii < TR; ii++) {
        if (row_i[ii] < 0) continue;
        const int i = row_i[ii], h = row_h[ii];
        const bool masked = m[ii] == -INFINITY && !fa_row_sees_key(&mask, no_blocks, i, 0);
        const float inv = 1.0f / l[ii];
        const float lse_r = masked ? -INFINITY : fa_row_lse(m[ii], l[ii]);
#ifdef SPLITK
        const long row = ((long)split * heads_q + h) * total_q + (long)b * seqlen_q + i;
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x < HEAD_DIM) part_o[row * HEAD_DIM + x] = masked ? 0.0f : acc[ii][u] * inv;
        }
        if (tc == 0) part_l[row] = lse_r;
#else
        const long o_row = fa_row_index(lo, b, 0, i, h);
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x < HEAD_DIM) STORE1(o, o_row + x, masked ? 0.0f : acc[ii][u] * inv);
        }
        if (tc == 0 && has_lse) lse[((long)b * heads_q + h) * seqlen_q + i] = lse_r;
#endif
    }
}
