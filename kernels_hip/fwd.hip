/* Forward pass (FlashAttention-2 work partitioning): one work-group per
 * (query tile of BR rows, query head, sequence [, key split]). The Q tile
 * stays in local memory; K and V tiles stream through it; each work-item
 * keeps a TR x TC micro-tile of the scores and TR x DPT of the output
 * accumulator in registers; local tiles are read as vectors of TR or TC.
 * The HIP twin of kernels_cl/fwd.cl (same grid, same arguments, same
 * arithmetic in the same order).
 *
 * Local memory, exactly fa_plan_local_mem's SIMT forward figure:
 *   Qt [HEAD_DIM][BR]   Q transposed (fp32)
 *   Kt [HEAD_DIM][BC]   K tile transposed
 *   Vs [BC][HEAD_DIM]   V tile
 *   Pt [BC][BR]         scores, then probabilities, transposed
 *
 * The running row maximum: where the NTC work-items of a row share a
 * wavefront (FA_ROW_EXCHANGE, common.h) they combine their partial maxima
 * by cross-lane exchange; otherwise, as in the OpenCL kernel, the scores go
 * through Pt and every work-item reads its rows back. The maximum is exact
 * either way, so both paths give the same bits.
 *
 * Softmax runs in base 2: scores are scaled by scale * log2(e) once, so
 * exp2 does the work of exp and L converts back to natural log at the end;
 * with score options (common.h, fa_logit2) the logit is formed at natural
 * scale first and converted after.
 *
 * With SPLITK the key range is cut into num_splits parts (grid dimension z
 * is sequence * num_splits + split); each work-group writes its normalised
 * partial output and log-sum-exp in fp32 to part_o / part_l, which
 * fa_splitk_merge (splitk.hip) combines. */

/* Output columns per work-item: the NTC work-items of a row group share
 * the HEAD_DIM columns of its rows (column tc + u * NTC). */
#define DPT ((HEAD_DIM + NTC - 1) / NTC)

FA_KERNEL void fa_forward(const store_t *__restrict__ q, const store_t *__restrict__ k,
                          const store_t *__restrict__ v, store_t *__restrict__ o, float *__restrict__ lse,
                          fa_long q_off, fa_long q_sb, fa_long q_ss, fa_long q_sh,
                          fa_long k_off, fa_long k_sb, fa_long k_ss, fa_long k_sh,
                          fa_long v_off, fa_long v_sb, fa_long v_ss, fa_long v_sh,
                          fa_long o_off, fa_long o_sb, fa_long o_ss, fa_long o_sh,
                          int seqlen_q, int seqlen_k, int heads_q, int group, fa_long total_q, float scale_log2,
                          const int *cu_q, const int *cu_k,
                          int window_left, int window_right,
                          const fa_uchar *block_mask, int block_q, int block_k, int block_cols,
                          const fa_uchar *tile_map, int tile_cols,
                          fa_uint drop_key0, fa_uint drop_key1, fa_uint drop_offset_lo, fa_uint drop_threshold,
                          float drop_scale, fa_uint drop_row0, fa_uint drop_col0,
                          int num_splits, float *__restrict__ part_o, float *__restrict__ part_l,
                          FA_SCORE_PARAMS) {
    __shared__ FA_LOCAL_ALIGN float Qt[HEAD_DIM * BR];
    __shared__ FA_LOCAL_ALIGN float Kt[HEAD_DIM * BC];
    __shared__ FA_LOCAL_ALIGN float Vs[BC * HEAD_DIM];
    __shared__ FA_LOCAL_ALIGN float Pt[BC * BR];

    const int lid = (int)threadIdx.x;
    const int tr = lid / NTC, tc = lid % NTC;
    const int q0 = (int)blockIdx.x * BR;
    const int h = (int)blockIdx.y;
    const int b = (int)blockIdx.z / num_splits;
    const int split = (int)blockIdx.z % num_splits;
    const int hk = h / group;
    (void)split;
    (void)part_o;
    (void)part_l;
    (void)o;
    (void)lse;

    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (q0 >= seq.len_q) return; /* the whole work-group: no barrier missed */

    fa_mask mask;
    mask.len_q = seq.len_q;
    mask.len_k = seq.len_k;
    mask.window_left = window_left;
    mask.window_right = window_right;
    mask.block_q = block_q;
    mask.block_k = block_k;
    mask.block_cols = block_cols;
    const fa_score sc = fa_score_of(scale_log2, FA_SCORE_ARGS, b, h, seq);

    const fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};
    const fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh};
    (void)lo;
    const fa_long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
    const fa_long k_base = fa_row_index(lk, b, seq.start_k, 0, hk);
    const fa_long v_base = fa_row_index(lv, b, seq.start_k, 0, hk);

#ifdef DROPOUT
    fa_dropout drop;
    drop.key0 = drop_key0;
    drop.key1 = drop_key1;
    drop.offset_lo = drop_offset_lo;
    drop.threshold = drop_threshold;
    drop.keep_scale = drop_scale;
    drop.row0 = drop_row0;
    drop.col0 = drop_col0;
#else
    (void)drop_key0;
    (void)drop_key1;
    (void)drop_offset_lo;
    (void)drop_threshold;
    (void)drop_row0;
    (void)drop_col0;
#endif

    /* Q tile, rows past the sequence zero-filled. */
    for (int e = lid; e < BR * D8; e += WG_SIZE) {
        const int r = e / D8, x0 = (e % D8) * 8;
        float val[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (r < seq.len_q - q0) fa_load8(q, q_base + (fa_long)r * q_ss + x0, val);
        fa_store8_t(Qt, BR, x0, r, val);
    }

    /* Key tiles this query tile can see, then this split's share of them. */
    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(mask, q0, fa_tile_last(q0, BR, seq.len_q), &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
#ifdef SPLITK
    {
        const int per = (t_end - t_begin + num_splits - 1) / num_splits;
        const int s_begin = fa_imin(t_end, t_begin + split * per);
        t_end = fa_imin(t_end, s_begin + per);
        t_begin = s_begin;
    }
#endif

    float m[TR], l[TR], acc[TR][DPT];
    for (int i = 0; i < TR; i++) {
        m[i] = -FA_INF;
        l[i] = 0.0f;
        for (int c = 0; c < DPT; c++) acc[i][c] = 0.0f;
    }

    for (int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end); t < t_end;
         t = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end)) {
        const int k0 = t * BC;
        const int cls = fa_tile_class(mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED);

        /* K transposed and V as is; keys past the sequence zero-filled. */
        for (int e = lid; e < BC * D8; e += WG_SIZE) {
            const int c = e / D8, x0 = (e % D8) * 8;
            float kv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            float vv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (c < seq.len_k - k0) {
                fa_load8(k, k_base + ((fa_long)k0 + c) * k_ss + x0, kv);
                fa_load8(v, v_base + ((fa_long)k0 + c) * v_ss + x0, vv);
            }
            fa_store8_t(Kt, BC, x0, c, kv);
            fa_store8(Vs + c * HEAD_DIM + x0, vv);
        }
        __syncthreads();

        /* Scores of the micro-tile, in base 2. */
        float s[TR][TC];
        for (int i = 0; i < TR; i++)
            for (int j = 0; j < TC; j++) s[i][j] = 0.0f;
        for (int x = 0; x < HEAD_DIM; x++) {
            float a[TR], bk[TC];
            fa_lds_get(a, Qt + x * BR + tr * TR, TR);
            fa_lds_get(bk, Kt + x * BC + tc * TC, TC);
            for (int i = 0; i < TR; i++)
                for (int j = 0; j < TC; j++) s[i][j] = fmaf(a[i], bk[j], s[i][j]);
        }
        /* Unrolled by request: with every mask on, the body grows past
         * what NVRTC unrolls by itself, and s would move to local memory.
         * The logits (base 2) with the plan's score options, then the
         * masks. */
#pragma unroll
        for (int j = 0; j < TC; j++)
#pragma unroll
            for (int i = 0; i < TR; i++) {
                float dcap;
                s[i][j] = fa_logit2(sc, s[i][j], q0, tr * TR + i, k0, tc * TC + j, &dcap);
                if (cls == FA_TILE_PARTIAL && !fa_visible(mask, block_mask, q0, tr * TR + i, k0, tc * TC + j))
                    s[i][j] = -FA_INF;
            }

        /* New running maxima over the whole rows; alpha rescales what was
         * accumulated under the old ones. A row that has seen no visible key
         * keeps m = -inf and exponentiates against 0 instead (no inf - inf). */
        float alpha[TR], m_use[TR], mx[TR];
#if FA_ROW_EXCHANGE
        for (int i = 0; i < TR; i++) {
            float part = m[i];
            for (int j = 0; j < TC; j++) part = fmaxf(part, s[i][j]);
            mx[i] = fa_row_max(part);
        }
#else
        for (int j = 0; j < TC; j++) {
            float col[TR];
            for (int i = 0; i < TR; i++) col[i] = s[i][j];
            fa_lds_put(col, Pt + (tc * TC + j) * BR + tr * TR, TR);
        }
        __syncthreads();
        for (int i = 0; i < TR; i++) mx[i] = m[i];
        for (int c = 0; c < BC; c++) {
            float pc[TR];
            fa_lds_get(pc, Pt + c * BR + tr * TR, TR);
            for (int i = 0; i < TR; i++) mx[i] = fmaxf(mx[i], pc[i]);
        }
        __syncthreads();
#endif
        for (int i = 0; i < TR; i++) {
            m_use[i] = mx[i] == -FA_INF ? 0.0f : mx[i];
            alpha[i] = exp2f(m[i] - m_use[i]);
            m[i] = mx[i];
        }
        for (int j = 0; j < TC; j++) {
            float col[TR];
            for (int i = 0; i < TR; i++) col[i] = exp2f(s[i][j] - m_use[i]);
            fa_lds_put(col, Pt + (tc * TC + j) * BR + tr * TR, TR);
        }
        __syncthreads();
#ifdef DROPOUT
        fa_dropout_mark(Pt, 1, BR, drop, b, h, heads_q, q0, k0);
        __syncthreads();
#endif

        /* One rescale per key tile, then O += P V. The row sums l take the
         * probabilities before dropout (the sign only marks dropped ones). */
        for (int i = 0; i < TR; i++) {
            l[i] *= alpha[i];
            for (int c = 0; c < DPT; c++) acc[i][c] *= alpha[i];
        }
        for (int c = 0; c < BC; c++) {
            float vv[DPT];
            for (int u = 0; u < DPT; u++) {
#if HEAD_DIM % NTC == 0
                vv[u] = Vs[c * HEAD_DIM + tc + u * NTC];
#else
                vv[u] = Vs[c * HEAD_DIM + fa_imin(tc + u * NTC, HEAD_DIM - 1)];
#endif
            }
            float pc[TR];
            fa_lds_get(pc, Pt + c * BR + tr * TR, TR);
            for (int i = 0; i < TR; i++) {
                float p = pc[i];
#ifdef DROPOUT
                l[i] += fabsf(p);
                p = fmaxf(p, 0.0f);
#else
                l[i] += p;
#endif
                for (int u = 0; u < DPT; u++) acc[i][u] = fmaf(p, vv[u], acc[i][u]);
            }
        }
        __syncthreads();
    }

    /* Normalise once; a row the masks leave no key gives O = 0 (whatever
     * 0 * NaN its accumulator met) and L = -inf (fa_row_sees_key).
     * Unrolled by request: with the per-row exit NVRTC otherwise keeps
     * this loop, and the accumulators it indexes move to local memory. */
#pragma unroll
    for (int i = 0; i < TR; i++) {
        if (tr * TR + i >= seq.len_q - q0) continue;
        const int r = q0 + tr * TR + i;
        const bool masked = m[i] == -FA_INF && !fa_row_sees_key(mask, block_mask, q0, tr * TR + i);
        const float inv = drop_scale / l[i];
        const float lse_r = masked ? -FA_INF : fa_row_lse(m[i], l[i]);
#ifdef SPLITK
        const fa_long row = (fa_long)(split * heads_q + h) * total_q + seq.start_q + r;
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x < HEAD_DIM) part_o[row * HEAD_DIM + x] = masked ? 0.0f : acc[i][u] * inv;
        }
        if (tc == 0) part_l[row] = lse_r;
#else
        const fa_long o_row = fa_row_index(lo, b, seq.start_q, r, h);
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x < HEAD_DIM) fa_store1(o, o_row + x, masked ? 0.0f : acc[i][u] * inv);
        }
        if (tc == 0) lse[fa_lse_index(b, h, r, heads_q, seqlen_q, seq.start_q, total_q)] = lse_r;
#endif
    }
}
