/* Forward pass (FlashAttention-2 work partitioning): one work-group per
 * (query tile of BR rows, query head, sequence [, key split]); each
 * work-item keeps a TR x TC micro-tile of the scores and its share of the
 * output accumulator in registers. Two kernels, chosen at build time:
 *
 * SIMT (default): the Q tile stays in local memory; K and V tiles stream
 * through it; local tiles are read as vectors of TR or TC. Local memory,
 * exactly fa_plan_local_mem's SIMT forward figure:
 *   Qt [HEAD_DIM][BR]   Q transposed (fp32)
 *   Kt [HEAD_DIM][BC]   K tile transposed
 *   Vs [BC][HEAD_DIM]   V tile
 *   Pt [BC][BR]         scores, then probabilities, transposed
 *
 * FA_STREAM: no operand tile over the whole head_dim in local memory (see
 * common.h): S = Q K^T in chunks of DC dimensions of Q and K, O += P V in
 * chunks of KV rows of V, beside the BC x BR tile of probabilities
 * (transposed, as Pt above); local memory is fa_plan_local_mem's streaming
 * forward figure.
 *
 * Softmax runs in base 2: scores are scaled by scale * log2(e) once, so
 * exp2 does the work of exp and L converts back to natural log at the end.
 * The score options (common.h) act where the scores are scaled
 * (FA_LOGIT2), before the masks.
 *
 * With SPLITK (SIMT only) the key range is cut into num_splits parts (grid
 * dimension 2 is sequence * num_splits + split); each work-group writes its
 * normalised partial output and log-sum-exp in fp32 to part_o / part_l,
 * which fa_splitk_merge (splitk.cl) combines. */

#ifndef FA_STREAM

/* Output columns per work-item: the NTC work-items of a row group share
 * the HEAD_DIM columns of its rows (column tc + u * NTC). */
#define DPT ((HEAD_DIM + NTC - 1) / NTC)

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
fa_forward(__global const store_t *q, __global const store_t *k, __global const store_t *v,
           __global store_t *o, __global float *lse, FA_FWD_PARAMS) {
    __local float Qt[HEAD_DIM * BR] FA_LOCAL_ALIGN;
    __local float Kt[HEAD_DIM * BC] FA_LOCAL_ALIGN;
    __local float Vs[BC * HEAD_DIM] FA_LOCAL_ALIGN;
    __local float Pt[BC * BR] FA_LOCAL_ALIGN;

    const int lid = get_local_id(0);
    const int tr = lid / NTC, tc = lid % NTC;
    const int q0 = FA_QUERY_TILE() * BR;
    const int h = get_group_id(1);
    const int b = get_group_id(2) / num_splits;
    const int split = get_group_id(2) % num_splits;
    const int hk = h / group;

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

    fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};
    fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh};
    const long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
    const long k_base = fa_row_index(lk, b, seq.start_k, 0, hk);
    const long v_base = fa_row_index(lv, b, seq.start_k, 0, hk);
    FA_SCORE_DECL(b, h, seq.len_q, seq.len_k);

#ifdef DROPOUT
    fa_dropout drop;
    drop.key0 = drop_key0;
    drop.key1 = drop_key1;
    drop.offset_lo = drop_offset_lo;
    drop.threshold = drop_threshold;
    drop.keep_scale = drop_scale;
    drop.row0 = drop_row0;
    drop.col0 = drop_col0;
#endif

    /* Q tile, rows past the sequence zero-filled. */
    for (int e = lid; e < BR * D8; e += WG_SIZE) {
        int r = e / D8, x0 = (e % D8) * 8;
        float8 val = (float8)(0.0f);
        if (r < seq.len_q - q0) val = LOAD8(q, q_base + (long)r * q_ss + x0);
        STORE8_T(Qt, BR, x0, r, val);
    }

    /* Key tiles this query tile can see, then this split's share of them. */
    const int r_last = q0 + min(BR, seq.len_q - q0) - 1;
    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(&mask, q0, r_last, &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
#ifdef SPLITK
    {
        int per = (t_end - t_begin + num_splits - 1) / num_splits;
        int s_begin = min(t_end, t_begin + split * per);
        t_end = min(t_end, s_begin + per);
        t_begin = s_begin;
    }
#endif

    float m[TR], l[TR], acc[TR][DPT];
    for (int i = 0; i < TR; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        for (int c = 0; c < DPT; c++) acc[i][c] = 0.0f;
    }

    for (int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end); t < t_end;
         t = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end)) {
        const int k0 = t * BC;
        const int cls = fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED);

        /* K transposed and V as is; keys past the sequence zero-filled. */
        for (int e = lid; e < BC * D8; e += WG_SIZE) {
            int c = e / D8, x0 = (e % D8) * 8;
            float8 kv = (float8)(0.0f), vv = (float8)(0.0f);
            if (c < seq.len_k - k0) {
                kv = LOAD8(k, k_base + ((long)k0 + c) * k_ss + x0);
                vv = LOAD8(v, v_base + ((long)k0 + c) * v_ss + x0);
            }
            STORE8_T(Kt, BC, x0, c, kv);
            vstore8(vv, 0, Vs + c * HEAD_DIM + x0);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* Scores of the micro-tile, in base 2. */
        float s[TR][TC];
        for (int i = 0; i < TR; i++)
            for (int j = 0; j < TC; j++) s[i][j] = 0.0f;
        for (int x = 0; x < HEAD_DIM; x++) {
            float a[TR], bk[TC];
            FA_VLOAD_TR(a, Qt + x * BR + tr * TR);
            FA_VLOAD_TC(bk, Kt + x * BC + tc * TC);
            for (int i = 0; i < TR; i++)
                for (int j = 0; j < TC; j++) s[i][j] = fma(a[i], bk[j], s[i][j]);
        }
        for (int j = 0; j < TC; j++) {
            float col[TR];
            for (int i = 0; i < TR; i++) {
                s[i][j] = FA_LOGIT2(s[i][j], q0, tr * TR + i, k0, tc * TC + j);
                if (cls == FA_TILE_PARTIAL && !fa_visible(&mask, block_mask, q0, tr * TR + i, k0, tc * TC + j))
                    s[i][j] = -INFINITY;
                col[i] = s[i][j];
            }
            FA_VSTORE_TR(col, Pt + (tc * TC + j) * BR + tr * TR);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* New running maxima over the whole rows; alpha rescales what was
         * accumulated under the old ones. A row that has seen no visible key
         * keeps m = -inf and exponentiates against 0 instead (no inf - inf). */
        float alpha[TR], m_use[TR], mx[TR];
        for (int i = 0; i < TR; i++) mx[i] = m[i];
        for (int c = 0; c < BC; c++) {
            float pc[TR];
            FA_VLOAD_TR(pc, Pt + c * BR + tr * TR);
            for (int i = 0; i < TR; i++) mx[i] = fmax(mx[i], pc[i]);
        }
        for (int i = 0; i < TR; i++) {
            m_use[i] = mx[i] == -INFINITY ? 0.0f : mx[i];
            alpha[i] = exp2(m[i] - m_use[i]);
            m[i] = mx[i];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int j = 0; j < TC; j++) {
            float col[TR];
            for (int i = 0; i < TR; i++) col[i] = exp2(s[i][j] - m_use[i]);
            FA_VSTORE_TR(col, Pt + (tc * TC + j) * BR + tr * TR);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#ifdef DROPOUT
        fa_dropout_mark(Pt, 1, BR, &drop, b, h, heads_q, q0, k0);
        barrier(CLK_LOCAL_MEM_FENCE);
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
                vv[u] = Vs[c * HEAD_DIM + min(tc + u * NTC, HEAD_DIM - 1)];
#endif
            }
            float pc[TR];
            FA_VLOAD_TR(pc, Pt + c * BR + tr * TR);
            for (int i = 0; i < TR; i++) {
                float p = pc[i];
#ifdef DROPOUT
                l[i] += fabs(p);
                p = fmax(p, 0.0f);
#else
                l[i] += p;
#endif
                for (int u = 0; u < DPT; u++) acc[i][u] = fma(p, vv[u], acc[i][u]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* Normalise once; a row the masks leave no key gives O = 0 (whatever
     * 0 * NaN its accumulator met) and L = -inf (fa_row_sees_key). */
    for (int i = 0; i < TR; i++) {
        if (tr * TR + i >= seq.len_q - q0) continue;
        const int r = q0 + tr * TR + i;
        const bool masked = m[i] == -INFINITY && !fa_row_sees_key(&mask, block_mask, q0, tr * TR + i);
        const float inv = drop_scale / l[i];
        const float lse_r = masked ? -INFINITY : fa_row_lse(m[i], l[i]);
#ifdef SPLITK
        const long row = (long)(split * heads_q + h) * total_q + seq.start_q + r;
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x < HEAD_DIM) part_o[row * HEAD_DIM + x] = masked ? 0.0f : acc[i][u] * inv;
        }
        if (tc == 0) part_l[row] = lse_r;
#else
        const long o_row = fa_row_index(lo, b, seq.start_q, r, h);
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x < HEAD_DIM) STORE1(o, o_row + x, masked ? 0.0f : acc[i][u] * inv);
        }
        if (tc == 0) lse[fa_lse_index(b, h, r, heads_q, seqlen_q, seq.start_q, total_q)] = lse_r;
#endif
    }
}

#else /* FA_STREAM */

#ifdef SPLITK
#error "the streaming forward runs without key splits"
#endif

/* Row sums: each work-item adds up the probabilities of its own TC columns
 * (partial[TR]) as it computes them; after the last key tile the NTC
 * partial sums of each row are added through local memory (`scratch`: NTC
 * x BR free words). The SIMT kernel above keeps a sum over whole rows in
 * its P V loop instead: PoCL 3.1 crashed on a barrier after its key loop
 * in the key-split build, with splits that see no key tile. */
#define FA_ROW_SUMS(partial, scratch)                                          \
    do {                                                                       \
        FA_VSTORE_TR(partial, (scratch) + tc * BR + tr * TR);                  \
        barrier(CLK_LOCAL_MEM_FENCE);                                          \
        for (int i_ = 0; i_ < TR; i_++) (partial)[i_] = 0.0f;                  \
        for (int w_ = 0; w_ < NTC; w_++) {                                     \
            float pl_[TR];                                                     \
            FA_VLOAD_TR(pl_, (scratch) + w_ * BR + tr * TR);                   \
            for (int i_ = 0; i_ < TR; i_++) (partial)[i_] += pl_[i_];          \
        }                                                                      \
    } while (0)

/* Keys per chunk of V (region R) and head dimensions per chunk of Q K^T
 * (region A): core/planner.c's stream_geom. */
#define KV FA_ROWS_OF(BC)
#define FA_R_WORDS (KV * HEAD_DIM)
#define FA_TR_WORDS (FA_T_WORDS + FA_R_WORDS)
#define FA_A_LIMIT FA_MAX(FA_TR_WORDS, 8192)
#if HEAD_DIM % 64 == 0 && 64 * (BR + BC) <= FA_A_LIMIT
#define DC 64
#elif HEAD_DIM % 32 == 0 && 32 * (BR + BC) <= FA_A_LIMIT
#define DC 32
#elif HEAD_DIM % 16 == 0 && 16 * (BR + BC) <= FA_A_LIMIT
#define DC 16
#else
#define DC 8
#endif
#define FA_A_WORDS (DC * (BR + BC))
#define NKC (HEAD_DIM / DC)         /* chunks of Q K^T per key tile */
#define NVC (BC / KV)               /* chunks of P V per key tile */
#define QN FA_COLS_ITEMS(BR, DC / 8) /* stage units of a chunk of Q, K, V */
#define KN FA_COLS_ITEMS(BC, DC / 8)
#define VN FA_ROWS_ITEMS(KV)
#define NST FA_MAX(QN + KN, VN)

/* Output dimensions of a work-item: OPT groups of OG (common.h). */
#if HEAD_DIM % (4 * NTC) == 0
#define OG 4
#elif HEAD_DIM % (2 * NTC) == 0
#define OG 2
#else
#define OG 1
#endif
#define OPT FA_GROUPS_OF(NTC, OG)
#define O_DIM(u, g) (((u) * NTC + tc) * OG + (g))
#if OPT * OG * NTC == HEAD_DIM
#define O_DIM_READ(x) (x)
#else
#define O_DIM_READ(x) min((x), HEAD_DIM - 1)
#endif

/* The stage: loads of the next chunk, and their stores to local memory. */
#define FWD_FETCH_QK(k0_, x0_)                                                             \
    do {                                                                                   \
        FA_UNROLL for (int s_ = 0; s_ < QN; s_++)                                          \
            st[s_] = fa_stream_load_cols(q, q_base, q_ss, BR, DC / 8, seq.len_q - q0, (x0_), lid, s_); \
        FA_UNROLL for (int s_ = 0; s_ < KN; s_++)                                          \
            st[QN + s_] = fa_stream_load_cols(k, k_base + (long)(k0_) * k_ss, k_ss, BC, DC / 8, seq.len_k - (k0_), \
                                              (x0_), lid, s_);                             \
    } while (0)
#define FWD_PUT_QK()                                                                       \
    do {                                                                                   \
        FA_UNROLL for (int s_ = 0; s_ < QN; s_++) fa_stream_store_cols(Qc, BR, DC / 8, lid, s_, st[s_]); \
        FA_UNROLL for (int s_ = 0; s_ < KN; s_++) fa_stream_store_cols(Kc, BC, DC / 8, lid, s_, st[QN + s_]); \
    } while (0)
#define FWD_FETCH_V(k0_, c_)                                                               \
    do {                                                                                   \
        FA_UNROLL for (int s_ = 0; s_ < VN; s_++)                                          \
            st[s_] = fa_stream_load_rows(v, v_base + ((long)(k0_) + (c_)) * v_ss, v_ss, KV, seq.len_k - (k0_) - (c_), \
                                         lid, s_);                                         \
    } while (0)
#define FWD_PUT_V()                                                                        \
    do {                                                                                   \
        FA_UNROLL for (int s_ = 0; s_ < VN; s_++) fa_stream_store_rows(Vr, KV, lid, s_, st[s_]); \
    } while (0)

/* The loads after chunk kc_ of Q K^T (the next chunk, or the first rows of
 * V) and after chunk vc_ of P V (the next rows of V, or the next key tile's
 * first chunk of Q K^T). */
#define FWD_NEXT_QK(kc_)                                                                   \
    do {                                                                                   \
        if ((kc_) + 1 < NKC)                                                               \
            FWD_FETCH_QK(k0, ((kc_) + 1) * DC);                                            \
        else                                                                               \
            FWD_FETCH_V(k0, 0);                                                            \
    } while (0)
#define FWD_NEXT_V(vc_)                                                                    \
    do {                                                                                   \
        if ((vc_) + 1 < NVC)                                                               \
            FWD_FETCH_V(k0, ((vc_) + 1) * KV);                                             \
        else if (t_next < t_end)                                                           \
            FWD_FETCH_QK(t_next * BC, 0);                                                  \
    } while (0)

/* O += P V over the KV keys of chunk vc_ (rows of V in Vr); a dropped
 * probability carries a minus sign (fa_dropout_mark) and counts as 0. */
#ifdef DROPOUT
#define FWD_KEPT(p_) ((p_) = fmax((p_), 0.0f))
#else
#define FWD_KEPT(p_) ((void)0)
#endif
#define FWD_PV(vc_)                                                                        \
    do {                                                                                   \
        FA_UNROLL_STEPS for (int c = 0; c < KV; c++) {                                     \
            float pc[TR], vv[OPT * OG];                                                    \
            FA_VLOAD_TR(pc, Pt + ((vc_) * KV + c) * BR + tr * TR);                         \
            FA_UNROLL for (int u = 0; u < OPT; u++)                                        \
                FA_VLOAD(OG, vv + u * OG, Vr + c * HEAD_DIM + O_DIM_READ(O_DIM(u, 0)));    \
            FA_UNROLL for (int i = 0; i < TR; i++) {                                       \
                float p = pc[i];                                                           \
                FWD_KEPT(p);                                                               \
                FA_UNROLL for (int x = 0; x < OPT * OG; x++) acc[i][x] = fma(p, vv[x], acc[i][x]); \
            }                                                                              \
        }                                                                                  \
    } while (0)

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
fa_forward(__global const store_t *q, __global const store_t *k, __global const store_t *v,
           __global store_t *o, __global float *lse, FA_FWD_PARAMS) {
    /* Region A (Q and K chunks) shares its words with regions T (the
     * probabilities) and R (rows of V): never live together. */
    __local float smem[FA_MAX(FA_A_WORDS, FA_TR_WORDS)] FA_LOCAL_ALIGN;
    __local float *const Qc = smem;              /* [DC][BR] */
    __local float *const Kc = smem + DC * BR;    /* [DC][BC] */
    __local float *const Pt = smem;              /* [BC][BR] */
    __local float *const Vr = smem + FA_T_WORDS; /* [KV][HEAD_DIM] */
    (void)num_splits;
    (void)part_o;
    (void)part_l;

    const int lid = get_local_id(0);
    const int tr = lid / NTC, tc = lid % NTC;
    const int q0 = FA_QUERY_TILE() * BR;
    const int h = get_group_id(1);
    const int b = get_group_id(2);
    const int hk = h / group;

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

    fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};
    fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh};
    const long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
    const long k_base = fa_row_index(lk, b, seq.start_k, 0, hk);
    const long v_base = fa_row_index(lv, b, seq.start_k, 0, hk);
    FA_SCORE_DECL(b, h, seq.len_q, seq.len_k);

#ifdef DROPOUT
    fa_dropout drop;
    drop.key0 = drop_key0;
    drop.key1 = drop_key1;
    drop.offset_lo = drop_offset_lo;
    drop.threshold = drop_threshold;
    drop.keep_scale = drop_scale;
    drop.row0 = drop_row0;
    drop.col0 = drop_col0;
#endif

    const int r_last = q0 + min(BR, seq.len_q - q0) - 1;
    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(&mask, q0, r_last, &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);

    float m[TR], l[TR], acc[TR][OPT * OG];
    FA_UNROLL for (int i = 0; i < TR; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        FA_UNROLL for (int x = 0; x < OPT * OG; x++) acc[i][x] = 0.0f;
    }

    float8 st[NST];
    int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end);
    if (t < t_end) FWD_FETCH_QK(t * BC, 0);
    while (t < t_end) {
        const int k0 = t * BC;
        const int t_next = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end);
        const int cls = fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED);

        /* S = Q K^T, DC dimensions at a time; the loads of the last chunk's
         * successor are the first rows of V (FA_LOADS_*: common.h). */
        float s[TR][TC];
        FA_UNROLL for (int i = 0; i < TR; i++)
            FA_UNROLL for (int j = 0; j < TC; j++) s[i][j] = 0.0f;
        for (int kc = 0; kc < NKC; kc++) {
            FWD_PUT_QK();
            FA_LOADS_BEFORE(FWD_NEXT_QK(kc));
            barrier(CLK_LOCAL_MEM_FENCE);
            FA_LOADS_AFTER(FWD_NEXT_QK(kc));
            FA_UNROLL_STEPS for (int x = 0; x < DC; x++) {
                float a[TR], bk[TC];
                FA_VLOAD_TR(a, Qc + x * BR + tr * TR);
                FA_VLOAD_TC(bk, Kc + x * BC + tc * TC);
                FA_UNROLL for (int i = 0; i < TR; i++)
                    FA_UNROLL for (int j = 0; j < TC; j++) s[i][j] = fma(a[i], bk[j], s[i][j]);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }

        /* Row maxima: each work-item leaves the maxima of its TC columns in
         * the first of them, reads its rows' NTC partial maxima, and only
         * then (a barrier later) overwrites its cells with probabilities. */
        float mx[TR];
        FA_UNROLL for (int i = 0; i < TR; i++) {
            mx[i] = -INFINITY;
            FA_UNROLL for (int j = 0; j < TC; j++) {
                s[i][j] = FA_LOGIT2(s[i][j], q0, tr * TR + i, k0, tc * TC + j);
                if (cls == FA_TILE_PARTIAL && !fa_visible(&mask, block_mask, q0, tr * TR + i, k0, tc * TC + j))
                    s[i][j] = -INFINITY;
                mx[i] = fmax(mx[i], s[i][j]);
            }
        }
        FA_VSTORE_TR(mx, Pt + tc * TC * BR + tr * TR);
        barrier(CLK_LOCAL_MEM_FENCE);
        FA_UNROLL for (int i = 0; i < TR; i++) mx[i] = m[i];
        for (int w = 0; w < NTC; w++) {
            float pm[TR];
            FA_VLOAD_TR(pm, Pt + w * TC * BR + tr * TR);
            FA_UNROLL for (int i = 0; i < TR; i++) mx[i] = fmax(mx[i], pm[i]);
        }
        /* A row that has seen no visible key keeps m = -inf and exponentiates
         * against 0 instead (no inf - inf). */
        float alpha[TR], m_use[TR];
        FA_UNROLL for (int i = 0; i < TR; i++) {
            m_use[i] = mx[i] == -INFINITY ? 0.0f : mx[i];
            alpha[i] = exp2(m[i] - m_use[i]);
            m[i] = mx[i];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* l: this work-item's columns only, before dropout (FA_ROW_SUMS). */
        FA_UNROLL for (int i = 0; i < TR; i++) l[i] *= alpha[i];
        FA_UNROLL for (int j = 0; j < TC; j++) {
            float col[TR];
            FA_UNROLL for (int i = 0; i < TR; i++) {
                col[i] = exp2(s[i][j] - m_use[i]);
                l[i] += col[i];
            }
            FA_VSTORE_TR(col, Pt + (tc * TC + j) * BR + tr * TR);
        }
#ifdef DROPOUT
        barrier(CLK_LOCAL_MEM_FENCE);
        fa_dropout_mark(Pt, 1, BR, &drop, b, h, heads_q, q0, k0);
#endif

        /* One rescale per key tile, then O += P V, KV rows of V at a time
         * (the loads of the first were issued with the last chunk of K). */
        FA_UNROLL for (int i = 0; i < TR; i++)
            FA_UNROLL for (int x = 0; x < OPT * OG; x++) acc[i][x] *= alpha[i];
        for (int vc = 0; vc < NVC; vc++) {
            FWD_PUT_V();
            FA_LOADS_BEFORE(FWD_NEXT_V(vc));
            barrier(CLK_LOCAL_MEM_FENCE);
            FA_LOADS_AFTER(FWD_NEXT_V(vc));
            FWD_PV(vc);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        t = t_next;
    }
    FA_ROW_SUMS(l, Pt);

    /* Normalise once; a row the masks leave no key gives O = 0 (whatever
     * 0 * NaN its accumulator met) and L = -inf (fa_row_sees_key). */
    FA_UNROLL for (int i = 0; i < TR; i++) {
        if (tr * TR + i >= seq.len_q - q0) continue;
        const int r = q0 + tr * TR + i;
        const bool masked = m[i] == -INFINITY && !fa_row_sees_key(&mask, block_mask, q0, tr * TR + i);
        const float inv = drop_scale / l[i];
        const float lse_r = masked ? -INFINITY : fa_row_lse(m[i], l[i]);
        const long o_row = fa_row_index(lo, b, seq.start_q, r, h);
        FA_UNROLL for (int u = 0; u < OPT; u++)
            FA_UNROLL for (int g = 0; g < OG; g++) {
                const int x = O_DIM(u, g);
                if (x < HEAD_DIM) STORE1(o, o_row + x, masked ? 0.0f : acc[i][u * OG + g] * inv);
            }
        if (tc == 0) lse[fa_lse_index(b, h, r, heads_q, seqlen_q, seq.start_q, total_q)] = lse_r;
    }
}

#endif /* FA_STREAM */
