/* Backward pass: dQ, dK, dV from Q, K, V, O, L and dO, recomputing P on chip
 * from L. Three kernels, run in this order:
 *
 *   fa_bwd_dot   D = rowsum(dO * O), one value per (row, head), laid out as L
 *   fa_bwd_dkdv  one work-group per (key tile of BC keys, kv head, sequence):
 *                K and V stay in local memory while the work-group loops over
 *                the query heads that share the kv head and the query tiles
 *                that can see the keys; dK and dV are summed in registers, so
 *                GQA needs no atomics
 *   fa_bwd_dq    one work-group per (query tile, query head, sequence), looping
 *                over key tiles and recomputing P and dS
 *
 * Every sum has a fixed order, so results are bit-identical run to run.
 *
 * With s = q.k (scaled), P = exp(s - L), dropout keep bit z and
 * keep_scale = 1 / (1 - p):
 *   dP = z * keep_scale * dO.v,   dS = P * (dP - D)
 *   dV += P * z * keep_scale * dO,   dK += scale * dS * q,   dQ += scale * dS * k
 * A row with L = -inf (no visible key) takes L = +inf here, which makes its
 * P exactly 0 instead of exp(-inf + inf). */

#define DPT ((HEAD_DIM + NTC - 1) / NTC)
/* Keys of the dK/dV accumulators per work-item (key tr + j * NTR). */
#define KPT ((BC + NTR - 1) / NTR)

/* The dQ kernel reads its K tile along keys (scores) and along dimensions
 * (dQ += dS K). Transposed, the second read would put neighbouring
 * work-items on one bank; XOR-ing the key index with a multiple of TC that
 * depends on the dimension spreads them, and keeps each work-item's TC keys
 * one aligned vector. Powers of two only (the XOR must stay in the tile). */
#if (BC & (BC - 1)) == 0 && (TC & (TC - 1)) == 0
#define KSW_N ((BC < 32 ? BC : 32) / TC)
#define KSW(x) (((x) % KSW_N) * TC)
#else
#define KSW(x) 0
#endif

#if HEAD_DIM % NTC == 0
#define DIM_CLAMP(x) (x)
#else
#define DIM_CLAMP(x) min((x), HEAD_DIM - 1)
#endif
#if BC % NTR == 0
#define KEY_CLAMP(c) (c)
#else
#define KEY_CLAMP(c) min((c), BC - 1)
#endif

/* The arguments every backward kernel shares after its tensors. */
#define FA_BWD_PARAMS                                                                      \
    long q_off, long q_sb, long q_ss, long q_sh,                                           \
    long k_off, long k_sb, long k_ss, long k_sh,                                           \
    long v_off, long v_sb, long v_ss, long v_sh,                                           \
    long o_off, long o_sb, long o_ss, long o_sh,                                           \
    int seqlen_q, int seqlen_k, int heads_q, int group, long total_q, float scale_log2,    \
    float scale, __global const int *cu_q, __global const int *cu_k,                       \
    int window_left, int window_right,                                                     \
    __global const uchar *block_mask, int block_q, int block_k, int block_cols,            \
    __global const uchar *tile_map, int tile_cols,                                         \
    uint drop_key0, uint drop_key1, uint drop_offset_lo, uint drop_threshold,              \
    float drop_scale

#define FA_BWD_SETUP()                                                                     \
    fa_mask mask;                                                                          \
    mask.len_q = seq.len_q;                                                                \
    mask.len_k = seq.len_k;                                                                \
    mask.window_left = window_left;                                                        \
    mask.window_right = window_right;                                                      \
    mask.block_q = block_q;                                                                \
    mask.block_k = block_k;                                                                \
    mask.block_cols = block_cols;                                                          \
    fa_dropout drop;                                                                       \
    drop.key0 = drop_key0;                                                                 \
    drop.key1 = drop_key1;                                                                 \
    drop.offset_lo = drop_offset_lo;                                                       \
    drop.threshold = drop_threshold;                                                       \
    drop.keep_scale = drop_scale;                                                          \
    fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};              \
    fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh}

/* ------------------------------------------------------------------------ */

__kernel void fa_bwd_dot(__global const store_t *o, __global const store_t *dout,
                         __global float *dvec, long o_off, long o_sb, long o_ss, long o_sh,
                         int seqlen_q, int heads_q, long total_q, __global const int *cu_q) {
    const int t = get_global_id(0);
    const int b = get_global_id(1) / heads_q, h = get_global_id(1) % heads_q;
#ifdef VARLEN
    const long start_q = cu_q[b];
    const int len_q = cu_q[b + 1] - cu_q[b];
#else
    const long start_q = (long)b * seqlen_q;
    const int len_q = seqlen_q;
#endif
    if (t >= len_q) return;
    fa_layout lo = {o_off, o_sb, o_ss, o_sh};
    const long row = fa_row_index(lo, b, start_q, t, h);
    float8 acc = (float8)(0.0f);
    for (int x0 = 0; x0 < HEAD_DIM; x0 += 8)
        acc = fma(LOAD8(o, row + x0), LOAD8(dout, row + x0), acc);
    float4 a4 = acc.lo + acc.hi;
    float2 a2 = a4.lo + a4.hi;
    dvec[fa_lse_index(b, h, t, heads_q, seqlen_q, start_q, total_q)] = a2.x + a2.y;
}

/* P (before dropout) and dP of a work-item's micro-tile, for rows stored at
 * Ls/Ds[r], from dot products already in s and dp; then dropout and dS.
 * On return p holds P * z * keep_scale and dp holds dS. */
#define FA_BWD_SOFTMAX_GRAD(ROW, COL, PTILE, RS, CS)                                       \
    do {                                                                                   \
        for (int i = 0; i < TR; i++)                                                       \
            for (int j = 0; j < TC; j++) {                                                 \
                const int r_ = (ROW), c_ = (COL);                                          \
                float pv = exp2(s[i][j] * scale_log2 - Ls[r_]);                            \
                if (cls == FA_TILE_PARTIAL && !fa_visible(&mask, block_mask, q0 + r_, k0 + c_)) \
                    pv = 0.0f;                                                             \
                s[i][j] = pv;                                                              \
                DROPOUT_STORE(PTILE[r_ * (RS) + c_ * (CS)] = pv);                          \
            }                                                                              \
        DROPOUT_MARK(PTILE, RS, CS);                                                       \
        for (int i = 0; i < TR; i++)                                                       \
            for (int j = 0; j < TC; j++) {                                                 \
                const int r_ = (ROW), c_ = (COL);                                          \
                float z_ = DROPOUT_KEEP(PTILE[r_ * (RS) + c_ * (CS)]) ? drop_scale : 0.0f; \
                float pv = s[i][j];                                                        \
                s[i][j] = pv * z_;                                                         \
                dp[i][j] = pv * (dp[i][j] * z_ - Ds[r_]);                                  \
            }                                                                              \
    } while (0)

#ifdef DROPOUT
#define DROPOUT_STORE(stmt) stmt
#define DROPOUT_MARK(tile, rs, cs)                                                         \
    do {                                                                                   \
        barrier(CLK_LOCAL_MEM_FENCE);                                                      \
        fa_dropout_mark(tile, rs, cs, &drop, b, h, heads_q, q0, k0);                       \
        barrier(CLK_LOCAL_MEM_FENCE);                                                      \
    } while (0)
#define DROPOUT_KEEP(val) (!signbit(val))
#else
#define DROPOUT_STORE(stmt) ((void)0)
#define DROPOUT_MARK(tile, rs, cs) ((void)0)
#define DROPOUT_KEEP(val) 1
#endif

/* ------------------------------------------------------------------------ */

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
fa_bwd_dkdv(__global const store_t *q, __global const store_t *k, __global const store_t *v,
            __global const float *lse, __global const store_t *dout, __global const float *dvec,
            __global store_t *dk, __global store_t *dv, FA_BWD_PARAMS) {
    /* fa_plan_local_mem's SIMT backward figure exactly. */
    __local float Kt[HEAD_DIM * BC] FA_LOCAL_ALIGN; /* transposed: [x][key] */
    __local float Vt[HEAD_DIM * BC] FA_LOCAL_ALIGN;
    __local float Qs[BR * HEAD_DIM] FA_LOCAL_ALIGN; /* row-major: [row][x] */
    __local float dOs[BR * HEAD_DIM] FA_LOCAL_ALIGN;
    __local float Ps[BR * BC] FA_LOCAL_ALIGN;       /* row-major: [row][key] */
    __local float dSs[BR * BC] FA_LOCAL_ALIGN;
    __local float Ls[BR], Ds[BR];

    const int lid = get_local_id(0);
    const int tr = lid / NTC, tc = lid % NTC;
    const int k0 = get_group_id(0) * BC;
    const int hk = get_group_id(1);
    const int b = get_group_id(2);
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (k0 >= seq.len_k) return;
    FA_BWD_SETUP();
    (void)lo;

    const long k_base = fa_row_index(lk, b, seq.start_k, k0, hk);
    const long v_base = fa_row_index(lv, b, seq.start_k, k0, hk);
    for (int e = lid; e < BC * D8; e += WG_SIZE) {
        int c = e / D8, x0 = (e % D8) * 8;
        float8 kv = (float8)(0.0f), vv = (float8)(0.0f);
        if (k0 + c < seq.len_k) {
            kv = LOAD8(k, k_base + (long)c * k_ss + x0);
            vv = LOAD8(v, v_base + (long)c * v_ss + x0);
        }
        STORE8_T(Kt, BC, x0, c, kv);
        STORE8_T(Vt, BC, x0, c, vv);
    }

    float acc_k[KPT][DPT], acc_v[KPT][DPT];
    for (int j = 0; j < KPT; j++)
        for (int u = 0; u < DPT; u++) acc_k[j][u] = acc_v[j][u] = 0.0f;

    int r_lo, r_hi;
    fa_query_range(&mask, k0, min(k0 + BC, seq.len_k) - 1, &r_lo, &r_hi);
    const int t_begin = r_lo / BR, t_end = r_hi > r_lo ? (r_hi + BR - 1) / BR : t_begin;

    for (int hh = 0; hh < group; hh++) {
        const int h = hk * group + hh;
        for (int t = fa_next_query_tile(tile_map, tile_cols, k0, t_begin, t_end); t < t_end;
             t = fa_next_query_tile(tile_map, tile_cols, k0, t + 1, t_end)) {
            const int q0 = t * BR;
            const int cls = fa_tile_class(&mask, tile_map, tile_cols, q0, k0);

            const long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
            const long o_base = fa_row_index(lo, b, seq.start_q, q0, h);
            for (int e = lid; e < BR * D8; e += WG_SIZE) {
                int r = e / D8, x0 = (e % D8) * 8;
                float8 qv = (float8)(0.0f), gv = (float8)(0.0f);
                if (q0 + r < seq.len_q) {
                    qv = LOAD8(q, q_base + (long)r * q_ss + x0);
                    gv = LOAD8(dout, o_base + (long)r * o_ss + x0);
                }
                vstore8(qv, 0, Qs + r * HEAD_DIM + x0);
                vstore8(gv, 0, dOs + r * HEAD_DIM + x0);
            }
            for (int r = lid; r < BR; r += WG_SIZE) {
                float lv_ = INFINITY, dv_ = 0.0f;
                if (q0 + r < seq.len_q) {
                    long li = fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q);
                    float L = lse[li];
                    lv_ = L == -INFINITY ? INFINITY : L * FA_LOG2E;
                    dv_ = dvec[li];
                }
                Ls[r] = lv_;
                Ds[r] = dv_;
            }
            barrier(CLK_LOCAL_MEM_FENCE);

            float s[TR][TC], dp[TR][TC];
            for (int i = 0; i < TR; i++)
                for (int j = 0; j < TC; j++) s[i][j] = dp[i][j] = 0.0f;
            /* Q and dO rows are read four dimensions at a time: the
             * work-items of one row group share the address, so the wide
             * loads do not conflict. */
            for (int x = 0; x < HEAD_DIM; x += 4) {
                float a[TR][4], g[TR][4];
                for (int i = 0; i < TR; i++) {
                    vstore4(*(__local const float4 *)(Qs + (tr * TR + i) * HEAD_DIM + x), 0, a[i]);
                    vstore4(*(__local const float4 *)(dOs + (tr * TR + i) * HEAD_DIM + x), 0, g[i]);
                }
                for (int e = 0; e < 4; e++) {
                    float kk[TC], vv[TC];
                    FA_VLOAD_TC(kk, Kt + (x + e) * BC + tc * TC);
                    FA_VLOAD_TC(vv, Vt + (x + e) * BC + tc * TC);
                    for (int i = 0; i < TR; i++)
                        for (int j = 0; j < TC; j++) {
                            s[i][j] = fma(a[i][e], kk[j], s[i][j]);
                            dp[i][j] = fma(g[i][e], vv[j], dp[i][j]);
                        }
                }
            }
            FA_BWD_SOFTMAX_GRAD(tr * TR + i, tc * TC + j, Ps, BC, 1);
            for (int i = 0; i < TR; i++) {
                FA_VSTORE_TC(s[i], Ps + (tr * TR + i) * BC + tc * TC);
                FA_VSTORE_TC(dp[i], dSs + (tr * TR + i) * BC + tc * TC);
            }
            barrier(CLK_LOCAL_MEM_FENCE);

            /* dV += P^T dO, dK += dS^T Q over the tile's rows. */
            for (int r = 0; r < BR; r++) {
                float pr[KPT], dsr[KPT], qr[DPT], gr[DPT];
                for (int j = 0; j < KPT; j++) {
                    pr[j] = Ps[r * BC + KEY_CLAMP(tr + j * NTR)];
                    dsr[j] = dSs[r * BC + KEY_CLAMP(tr + j * NTR)];
                }
                for (int u = 0; u < DPT; u++) {
                    qr[u] = Qs[r * HEAD_DIM + DIM_CLAMP(tc + u * NTC)];
                    gr[u] = dOs[r * HEAD_DIM + DIM_CLAMP(tc + u * NTC)];
                }
                for (int j = 0; j < KPT; j++)
                    for (int u = 0; u < DPT; u++) {
                        acc_v[j][u] = fma(pr[j], gr[u], acc_v[j][u]);
                        acc_k[j][u] = fma(dsr[j], qr[u], acc_k[j][u]);
                    }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }

    const long dk_base = fa_row_index(lk, b, seq.start_k, k0, hk);
    const long dv_base = fa_row_index(lv, b, seq.start_k, k0, hk);
    for (int j = 0; j < KPT; j++) {
        const int c = tr + j * NTR;
        if (c >= BC || k0 + c >= seq.len_k) continue;
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x >= HEAD_DIM) continue;
            STORE1(dk, dk_base + (long)c * k_ss + x, acc_k[j][u] * scale);
            STORE1(dv, dv_base + (long)c * v_ss + x, acc_v[j][u]);
        }
    }
}

/* ------------------------------------------------------------------------ */

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
fa_bwd_dq(__global const store_t *q, __global const store_t *k, __global const store_t *v,
          __global const float *lse, __global const store_t *dout, __global const float *dvec,
          __global store_t *dq, FA_BWD_PARAMS) {
    /* Within fa_plan_local_mem's SIMT backward figure (no P tile needed). */
    __local float Qt[HEAD_DIM * BR] FA_LOCAL_ALIGN; /* transposed: [x][row] */
    __local float dOt[HEAD_DIM * BR] FA_LOCAL_ALIGN;
    __local float Kt[HEAD_DIM * BC] FA_LOCAL_ALIGN; /* transposed: [x][key] */
    __local float Vt[HEAD_DIM * BC] FA_LOCAL_ALIGN;
    __local float dSt[BC * BR] FA_LOCAL_ALIGN;      /* transposed: [key][row] */
    __local float Ls[BR], Ds[BR];

    const int lid = get_local_id(0);
    const int tr = lid / NTC, tc = lid % NTC;
    const int q0 = get_group_id(0) * BR;
    const int h = get_group_id(1);
    const int b = get_group_id(2);
    const int hk = h / group;
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (q0 >= seq.len_q) return;
    FA_BWD_SETUP();

    const long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
    const long o_base = fa_row_index(lo, b, seq.start_q, q0, h);
    for (int e = lid; e < BR * D8; e += WG_SIZE) {
        int r = e / D8, x0 = (e % D8) * 8;
        float8 qv = (float8)(0.0f), gv = (float8)(0.0f);
        if (q0 + r < seq.len_q) {
            qv = LOAD8(q, q_base + (long)r * q_ss + x0);
            gv = LOAD8(dout, o_base + (long)r * o_ss + x0);
        }
        STORE8_T(Qt, BR, x0, r, qv);
        STORE8_T(dOt, BR, x0, r, gv);
    }
    for (int r = lid; r < BR; r += WG_SIZE) {
        float lv_ = INFINITY, dv_ = 0.0f;
        if (q0 + r < seq.len_q) {
            long li = fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q);
            float L = lse[li];
            lv_ = L == -INFINITY ? INFINITY : L * FA_LOG2E;
            dv_ = dvec[li];
        }
        Ls[r] = lv_;
        Ds[r] = dv_;
    }

    float acc[TR][DPT];
    for (int i = 0; i < TR; i++)
        for (int u = 0; u < DPT; u++) acc[i][u] = 0.0f;

    int k_lo, k_hi;
    fa_key_range(&mask, q0, min(q0 + BR, seq.len_q) - 1, &k_lo, &k_hi);
    const int t_begin = k_lo / BC, t_end = k_hi > k_lo ? (k_hi + BC - 1) / BC : t_begin;
    const long k_base = fa_row_index(lk, b, seq.start_k, 0, hk);
    const long v_base = fa_row_index(lv, b, seq.start_k, 0, hk);

    for (int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end); t < t_end;
         t = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end)) {
        const int k0 = t * BC;
        const int cls = fa_tile_class(&mask, tile_map, tile_cols, q0, k0);

        for (int e = lid; e < BC * D8; e += WG_SIZE) {
            int c = e / D8, x0 = (e % D8) * 8;
            float8 kv = (float8)(0.0f), vv = (float8)(0.0f);
            if (k0 + c < seq.len_k) {
                kv = LOAD8(k, k_base + (long)(k0 + c) * k_ss + x0);
                vv = LOAD8(v, v_base + (long)(k0 + c) * v_ss + x0);
            }
            float kx[8];
            vstore8(kv, 0, kx);
            for (int u = 0; u < 8; u++) Kt[(x0 + u) * BC + (c ^ KSW(x0 + u))] = kx[u];
            STORE8_T(Vt, BC, x0, c, vv);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[TR][TC], dp[TR][TC];
        for (int i = 0; i < TR; i++)
            for (int j = 0; j < TC; j++) s[i][j] = dp[i][j] = 0.0f;
        for (int x = 0; x < HEAD_DIM; x++) {
            float a[TR], g[TR], kk[TC], vv[TC];
            FA_VLOAD_TR(a, Qt + x * BR + tr * TR);
            FA_VLOAD_TR(g, dOt + x * BR + tr * TR);
            FA_VLOAD_TC(kk, Kt + x * BC + ((tc * TC) ^ KSW(x)));
            FA_VLOAD_TC(vv, Vt + x * BC + tc * TC);
            for (int i = 0; i < TR; i++)
                for (int j = 0; j < TC; j++) {
                    s[i][j] = fma(a[i], kk[j], s[i][j]);
                    dp[i][j] = fma(g[i], vv[j], dp[i][j]);
                }
        }
        FA_BWD_SOFTMAX_GRAD(tr * TR + i, tc * TC + j, dSt, 1, BR);
        for (int j = 0; j < TC; j++) {
            float col[TR];
            for (int i = 0; i < TR; i++) col[i] = dp[i][j];
            FA_VSTORE_TR(col, dSt + (tc * TC + j) * BR + tr * TR);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* dQ += dS K over the tile's keys. */
        for (int c = 0; c < BC; c++) {
            float kr[DPT];
            for (int u = 0; u < DPT; u++) {
                const int x = DIM_CLAMP(tc + u * NTC);
                kr[u] = Kt[x * BC + (c ^ KSW(x))];
            }
            float dsc[TR];
            FA_VLOAD_TR(dsc, dSt + c * BR + tr * TR);
            for (int i = 0; i < TR; i++)
                for (int u = 0; u < DPT; u++) acc[i][u] = fma(dsc[i], kr[u], acc[i][u]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int i = 0; i < TR; i++) {
        const int r = q0 + tr * TR + i;
        if (r >= seq.len_q) continue;
        const long row = fa_row_index(lq, b, seq.start_q, r, h);
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x < HEAD_DIM) STORE1(dq, row + x, acc[i][u] * scale);
        }
    }
}
