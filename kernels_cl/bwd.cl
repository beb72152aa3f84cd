/* Backward pass: dQ, dK, dV from Q, K, V, O, L and dO, recomputing P on chip
 * from L. Kernels, run in this order:
 *
 *   fa_bwd_dot   D = rowsum(dO * O), one value per (row, head), laid out as L
 *                (and, with DQ_ATOMIC, zeroes the fp32 dQ accumulator), and
 *                the arguments the kernels share: bwd_common.cl, built first
 *   fa_bwd_dkdv  one work-group per (key tile of BC keys, kv head, sequence),
 *                looping over the query heads that share the kv head and the
 *                query tiles that can see the keys; dK and dV are summed in
 *                registers, so GQA needs no atomics
 *   fa_bwd_dq    one work-group per (query tile, query head, sequence), looping
 *                over key tiles and recomputing P and dS
 *
 * SIMT (default): K and V stay in local memory in fa_bwd_dkdv, Q and dO in
 * fa_bwd_dq, each over the whole head_dim. Every sum has a fixed order, so
 * results are bit-identical run to run.
 *
 * FA_STREAM: no operand tile over the whole head_dim in local memory (see
 * common.h). S and dP stream Q, dO, K and V in chunks of DC dimensions; dV,
 * dK (and dQ) stream rows of dO, Q (and K) beside the BR x BC tile of P,
 * then of dS. With DQ_ATOMIC (not deterministic) fa_bwd_dkdv also adds its
 * share of dQ to an fp32 accumulator with atomics, and fa_bwd_dq_convert
 * scales and stores it in place of fa_bwd_dq; without it fa_bwd_dq runs as
 * above, and results are bit-identical run to run.
 *
 * With s = q.k (scaled), P = exp(s - L), dropout keep bit z and
 * keep_scale = 1 / (1 - p):
 *   dP = z * keep_scale * dO.v,   dS = P * (dP - D)
 *   dV += P * z * keep_scale * dO,   dK += scale * dS * q,   dQ += scale * dS * k
 * A row with L = -inf (no visible key) takes L = +inf here, which makes its
 * P exactly 0 instead of exp(-inf + inf). With score options (common.h) s
 * is fa_logit2's logit, recomputed as the forward formed it, and dS takes
 * its cap_grad. */

#ifndef FA_STREAM
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
#endif

/* The score options' hook (common.h): the micro-tile's cap_grad, for dS,
 * where scores take options. */
#ifdef FA_SCORE_OPTIONS
#define FA_CAP_GRADS(name) float name[TR][TC]
#else
#define FA_CAP_GRADS(name) (void)0
#endif

#ifndef FA_STREAM

/* P (before dropout) and dP of a work-item's micro-tile, for rows stored at
 * Ls/Ds[r], from dot products already in s and dp; then dropout and dS.
 * On return p holds P * z * keep_scale and dp holds dS. */
#define FA_BWD_SOFTMAX_GRAD(ROW, COL, PTILE, RS, CS)                                       \
    do {                                                                                   \
        FA_CAP_GRADS(cg);                                                                  \
        for (int i = 0; i < TR; i++)                                                       \
            for (int j = 0; j < TC; j++) {                                                 \
                const int r_ = (ROW), c_ = (COL);                                          \
                float pv = exp2(FA_LOGIT2_GRAD(s[i][j], q0, r_, k0, c_, &cg[i][j]) - Ls[r_]); \
                if (cls == FA_TILE_PARTIAL && !fa_visible(&mask, block_mask, q0, r_, k0, c_)) \
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
                dp[i][j] = pv * (dp[i][j] * z_ - Ds[r_]) * FA_CAP_GRAD(cg[i][j]);          \
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
        if (c < seq.len_k - k0) {
            kv = LOAD8(k, k_base + (long)c * k_ss + x0);
            vv = LOAD8(v, v_base + (long)c * v_ss + x0);
        }
        STORE8_T(Kt, BC, x0, c, kv);
        STORE8_T(Vt, BC, x0, c, vv);
    }

    float acc_k[KPT][DPT], acc_v[KPT][DPT];
    for (int j = 0; j < KPT; j++)
        for (int u = 0; u < DPT; u++) acc_k[j][u] = acc_v[j][u] = 0.0f;

    int r_lo, r_hi, t_begin, t_end;
    fa_query_range(&mask, k0, k0 + min(BC, seq.len_k - k0) - 1, &r_lo, &r_hi);
    fa_tile_span(r_lo, r_hi, BR, &t_begin, &t_end);

    for (int hh = 0; hh < group; hh++) {
        const int h = hk * group + hh;
        FA_SCORE_DECL(b, h, seq.len_q, seq.len_k);
        for (int t = fa_next_query_tile(tile_map, tile_cols, k0, t_begin, t_end); t < t_end;
             t = fa_next_query_tile(tile_map, tile_cols, k0, t + 1, t_end)) {
            const int q0 = t * BR;
            const int cls = fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_FEED_KEYS);

            const long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
            const long o_base = fa_row_index(lo, b, seq.start_q, q0, h);
            for (int e = lid; e < BR * D8; e += WG_SIZE) {
                int r = e / D8, x0 = (e % D8) * 8;
                float8 qv = (float8)(0.0f), gv = (float8)(0.0f);
                if (r < seq.len_q - q0) {
                    qv = LOAD8(q, q_base + (long)r * q_ss + x0);
                    gv = LOAD8(dout, o_base + (long)r * o_ss + x0);
                }
                vstore8(qv, 0, Qs + r * HEAD_DIM + x0);
                vstore8(gv, 0, dOs + r * HEAD_DIM + x0);
            }
            for (int r = lid; r < BR; r += WG_SIZE) {
                float lv_ = INFINITY, dv_ = 0.0f;
                if (r < seq.len_q - q0) {
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
        if (c >= BC || c >= seq.len_k - k0) continue;
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
    FA_SCORE_DECL(b, h, seq.len_q, seq.len_k);

    const long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
    const long o_base = fa_row_index(lo, b, seq.start_q, q0, h);
    for (int e = lid; e < BR * D8; e += WG_SIZE) {
        int r = e / D8, x0 = (e % D8) * 8;
        float8 qv = (float8)(0.0f), gv = (float8)(0.0f);
        if (r < seq.len_q - q0) {
            qv = LOAD8(q, q_base + (long)r * q_ss + x0);
            gv = LOAD8(dout, o_base + (long)r * o_ss + x0);
        }
        STORE8_T(Qt, BR, x0, r, qv);
        STORE8_T(dOt, BR, x0, r, gv);
    }
    for (int r = lid; r < BR; r += WG_SIZE) {
        float lv_ = INFINITY, dv_ = 0.0f;
        if (r < seq.len_q - q0) {
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

    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(&mask, q0, q0 + min(BR, seq.len_q - q0) - 1, &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
    const long k_base = fa_row_index(lk, b, seq.start_k, 0, hk);
    const long v_base = fa_row_index(lv, b, seq.start_k, 0, hk);

    for (int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end); t < t_end;
         t = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end)) {
        const int k0 = t * BC;
        const int cls = fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED);

        for (int e = lid; e < BC * D8; e += WG_SIZE) {
            int c = e / D8, x0 = (e % D8) * 8;
            float8 kv = (float8)(0.0f), vv = (float8)(0.0f);
            if (c < seq.len_k - k0) {
                kv = LOAD8(k, k_base + ((long)k0 + c) * k_ss + x0);
                vv = LOAD8(v, v_base + ((long)k0 + c) * v_ss + x0);
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
        if (tr * TR + i >= seq.len_q - q0) continue;
        const long row = fa_row_index(lq, b, seq.start_q, q0 + tr * TR + i, h);
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x < HEAD_DIM) STORE1(dq, row + x, acc[i][u] * scale);
        }
    }
}

#else /* FA_STREAM */

/* Rows per chunk of R (query rows of dO and Q for dV and dK, key rows of K
 * for dQ) and head dimensions per chunk of S and dP (region A):
 * core/planner.c's stream_geom. */
#define RQ FA_ROWS_OF(BR)
#define RK FA_ROWS_OF(BC)
#define FA_R_WORDS (FA_MAX(RQ, RK) * HEAD_DIM)
#define FA_TR_WORDS (FA_T_WORDS + FA_R_WORDS)
#define FA_A_LIMIT FA_MAX(FA_TR_WORDS, 8192)
#if HEAD_DIM % 64 == 0 && 2 * 64 * (BR + BC) <= FA_A_LIMIT
#define DC 64
#elif HEAD_DIM % 32 == 0 && 2 * 32 * (BR + BC) <= FA_A_LIMIT
#define DC 32
#elif HEAD_DIM % 16 == 0 && 2 * 16 * (BR + BC) <= FA_A_LIMIT
#define DC 16
#else
#define DC 8
#endif
#define FA_A_WORDS (2 * DC * (BR + BC))
#define FA_MAIN_WORDS FA_MAX(FA_A_WORDS, FA_TR_WORDS)
#define NKC (HEAD_DIM / DC)         /* chunks of S and dP */
#define NRQ (BR / RQ)               /* chunks of dO (dV) and of Q (dK) */
#define NRK (BC / RK)               /* chunks of K (dQ) */
#define QN FA_COLS_ITEMS(BR, DC / 8) /* stage units of a chunk of Q (or dO), K (or V) */
#define KN FA_COLS_ITEMS(BC, DC / 8)
#define NST FA_MAX(2 * (QN + KN), FA_MAX(FA_ROWS_ITEMS(RQ), FA_ROWS_ITEMS(RK)))

/* dK and dV of a work-item: its TC keys (those of its micro-tile) x KGS
 * groups of KG dimensions spread over the NTR work-items of a key column.
 * dQ: its TR rows x QGS groups of QG dimensions spread over the NTC
 * work-items of a row (common.h). */
#if HEAD_DIM % (4 * NTR) == 0
#define KG 4
#elif HEAD_DIM % (2 * NTR) == 0
#define KG 2
#else
#define KG 1
#endif
#define KGS FA_GROUPS_OF(NTR, KG)
#define K_DIM(u, g) (((u) * NTR + tr) * KG + (g))
#if KGS * KG * NTR == HEAD_DIM
#define K_DIM_READ(x) (x)
#else
#define K_DIM_READ(x) min((x), HEAD_DIM - 1)
#endif
#if HEAD_DIM % (4 * NTC) == 0
#define QG 4
#elif HEAD_DIM % (2 * NTC) == 0
#define QG 2
#else
#define QG 1
#endif
#define QGS FA_GROUPS_OF(NTC, QG)
#define Q_DIM(u, g) (((u) * NTC + tc) * QG + (g))
#if QGS * QG * NTC == HEAD_DIM
#define Q_DIM_READ(x) (x)
#else
#define Q_DIM_READ(x) min((x), HEAD_DIM - 1)
#endif
/* dS is read four keys of a row at a time where rows allow. */
#if BC % 4 == 0 && RK % 4 == 0
#define DQ_STEP 4
#else
#define DQ_STEP 1
#endif

/* Local memory of both kernels: region A (Q, dO, K and V chunks,
 * transposed) shares its words with regions T (P, then dS, row-major) and R
 * (rows of dO, Q or K); L and D of the query tile follow. */
#define FA_BWD_LOCAL()                                                                     \
    __local float smem[FA_MAIN_WORDS + 2 * BR] FA_LOCAL_ALIGN;                             \
    __local float *const Qc = smem;                              /* [DC][BR] */            \
    __local float *const dOc = smem + DC * BR;                   /* [DC][BR] */            \
    __local float *const Kc = smem + 2 * DC * BR;                /* [DC][BC] */            \
    __local float *const Vc = smem + 2 * DC * BR + DC * BC;      /* [DC][BC] */            \
    __local float *const Ts = smem;                              /* [BR][BC] */            \
    __local float *const Rr = smem + FA_T_WORDS;                 /* [rows][HEAD_DIM] */    \
    __local float *const Ls = smem + FA_MAIN_WORDS;                                        \
    __local float *const Ds = smem + FA_MAIN_WORDS + BR

/* The stage: a chunk of A for query rows at qb_/ob_ (valid_q of them) and
 * key rows at kb_/vb_ (valid_k), dimensions x0_ on; or RQ / RK rows of one
 * operand at base_ (valid_ of them). */
#define BWD_FETCH_A(qb_, ob_, valid_q, kb_, vb_, valid_k, x0_)                             \
    do {                                                                                   \
        FA_UNROLL for (int s_ = 0; s_ < QN; s_++) {                                        \
            st[s_] = fa_stream_load_cols(q, (qb_), q_ss, BR, DC / 8, (valid_q), (x0_), lid, s_); \
            st[QN + s_] = fa_stream_load_cols(dout, (ob_), o_ss, BR, DC / 8, (valid_q), (x0_), lid, s_); \
        }                                                                                  \
        FA_UNROLL for (int s_ = 0; s_ < KN; s_++) {                                        \
            st[2 * QN + s_] = fa_stream_load_cols(k, (kb_), k_ss, BC, DC / 8, (valid_k), (x0_), lid, s_); \
            st[2 * QN + KN + s_] = fa_stream_load_cols(v, (vb_), v_ss, BC, DC / 8, (valid_k), (x0_), lid, s_); \
        }                                                                                  \
    } while (0)
#define BWD_PUT_A()                                                                        \
    do {                                                                                   \
        FA_UNROLL for (int s_ = 0; s_ < QN; s_++) {                                        \
            fa_stream_store_cols(Qc, BR, DC / 8, lid, s_, st[s_]);                         \
            fa_stream_store_cols(dOc, BR, DC / 8, lid, s_, st[QN + s_]);                   \
        }                                                                                  \
        FA_UNROLL for (int s_ = 0; s_ < KN; s_++) {                                        \
            fa_stream_store_cols(Kc, BC, DC / 8, lid, s_, st[2 * QN + s_]);                \
            fa_stream_store_cols(Vc, BC, DC / 8, lid, s_, st[2 * QN + KN + s_]);           \
        }                                                                                  \
    } while (0)
#define BWD_FETCH_ROWS(src_, base_, stride_, rows_, valid_)                                \
    do {                                                                                   \
        FA_UNROLL for (int s_ = 0; s_ < FA_ROWS_ITEMS(rows_); s_++)                        \
            st[s_] = fa_stream_load_rows((src_), (base_), (stride_), (rows_), (valid_), lid, s_); \
    } while (0)
#define BWD_PUT_ROWS(rows_)                                                                \
    do {                                                                                   \
        FA_UNROLL for (int s_ = 0; s_ < FA_ROWS_ITEMS(rows_); s_++)                        \
            fa_stream_store_rows(Rr, (rows_), lid, s_, st[s_]);                            \
    } while (0)

/* L (in base 2; +inf for a row that sees no key) and D of the query tile at
 * q0 of head h into Ls and Ds. */
#define BWD_LOAD_LD(q0_, h_)                                                               \
    do {                                                                                   \
        for (int r_ = lid; r_ < BR; r_ += WG_SIZE) {                                       \
            float lv_ = INFINITY, dv_ = 0.0f;                                              \
            if (r_ < seq.len_q - (q0_)) {                                                  \
                const long li_ = fa_lse_index(b, (h_), (q0_) + r_, heads_q, seqlen_q, seq.start_q, total_q); \
                const float L_ = lse[li_];                                                 \
                lv_ = L_ == -INFINITY ? INFINITY : L_ * FA_LOG2E;                          \
                dv_ = dvec[li_];                                                           \
            }                                                                              \
            Ls[r_] = lv_;                                                                  \
            Ds[r_] = dv_;                                                                  \
        }                                                                                  \
    } while (0)

/* S and dP of the micro-tile from the chunks of A in local memory. */
#define BWD_PRODUCTS()                                                                     \
    do {                                                                                   \
        for (int x = 0; x < DC; x++) {                                                     \
            float a[TR], g[TR], kk[TC], vv[TC];                                            \
            FA_VLOAD_TR(a, Qc + x * BR + tr * TR);                                         \
            FA_VLOAD_TR(g, dOc + x * BR + tr * TR);                                        \
            FA_VLOAD_TC(kk, Kc + x * BC + tc * TC);                                        \
            FA_VLOAD_TC(vv, Vc + x * BC + tc * TC);                                        \
            FA_UNROLL for (int i = 0; i < TR; i++)                                         \
                FA_UNROLL for (int j = 0; j < TC; j++) {                                   \
                    s[i][j] = fma(a[i], kk[j], s[i][j]);                                   \
                    dp[i][j] = fma(g[i], vv[j], dp[i][j]);                                 \
                }                                                                          \
        }                                                                                  \
    } while (0)

/* From S and dP of the micro-tile (rows q0 + tr * TR + i, keys k0 + tc * TC
 * + j): P * z * keep_scale into s, dS into dp. Dropout marks P in Ts (the
 * caller's barriers around it are inside). */
#ifdef DROPOUT
#define BWD_DROPOUT_MARK()                                                                 \
    do {                                                                                   \
        FA_UNROLL for (int i = 0; i < TR; i++) FA_VSTORE_TC(s[i], Ts + (tr * TR + i) * BC + tc * TC); \
        barrier(CLK_LOCAL_MEM_FENCE);                                                      \
        fa_dropout_mark(Ts, BC, 1, &drop, b, h, heads_q, q0, k0);                          \
        barrier(CLK_LOCAL_MEM_FENCE);                                                      \
        FA_UNROLL for (int i = 0; i < TR; i++) FA_VLOAD_TC(z[i], Ts + (tr * TR + i) * BC + tc * TC); \
    } while (0)
#define BWD_KEEP(i, j) (!signbit(z[i][j]))
#else
#define BWD_DROPOUT_MARK() ((void)0)
#define BWD_KEEP(i, j) 1
#endif
#define BWD_SOFTMAX_GRAD()                                                                 \
    do {                                                                                   \
        FA_CAP_GRADS(cg);                                                                  \
        FA_UNROLL for (int i = 0; i < TR; i++)                                             \
            FA_UNROLL for (int j = 0; j < TC; j++) {                                       \
                float pv = exp2(FA_LOGIT2_GRAD(s[i][j], q0, tr * TR + i, k0, tc * TC + j, &cg[i][j]) - \
                                Ls[tr * TR + i]);                                          \
                if (cls == FA_TILE_PARTIAL &&                                              \
                    !fa_visible(&mask, block_mask, q0, tr * TR + i, k0, tc * TC + j))      \
                    pv = 0.0f;                                                             \
                s[i][j] = pv;                                                              \
            }                                                                              \
        float z[TR][TC];                                                                   \
        (void)z;                                                                           \
        BWD_DROPOUT_MARK();                                                                \
        FA_UNROLL for (int i = 0; i < TR; i++)                                             \
            FA_UNROLL for (int j = 0; j < TC; j++) {                                       \
                const float z_ = BWD_KEEP(i, j) ? drop_scale : 0.0f, pv = s[i][j];         \
                s[i][j] = pv * z_;                                                         \
                dp[i][j] = pv * (dp[i][j] * z_ - Ds[tr * TR + i]) * FA_CAP_GRAD(cg[i][j]); \
            }                                                                              \
    } while (0)

/* acc[i][...] += sum over RK keys (from column c0_ of Ts) of Ts[row][key] *
 * Rr[key][its dims]: the dQ += dS K step of both kernels. */
#define BWD_DQ_STEP(acc_, c0_)                                                             \
    do {                                                                                   \
        for (int c_ = 0; c_ < RK; c_ += DQ_STEP) {                                         \
            float pr[TR][DQ_STEP];                                                         \
            FA_UNROLL for (int i = 0; i < TR; i++)                                         \
                FA_CAT(FA_VLOAD_, DQ_STEP)(pr[i], Ts + (tr * TR + i) * BC + (c0_) + c_);   \
            FA_UNROLL for (int e = 0; e < DQ_STEP; e++) {                                  \
                float kr[QGS * QG];                                                        \
                FA_UNROLL for (int u = 0; u < QGS; u++)                                    \
                    FA_VLOAD(QG, kr + u * QG, Rr + (c_ + e) * HEAD_DIM + Q_DIM_READ(Q_DIM(u, 0))); \
                FA_UNROLL for (int i = 0; i < TR; i++)                                     \
                    FA_UNROLL for (int x = 0; x < QGS * QG; x++) acc_[i][x] = fma(pr[i][e], kr[x], acc_[i][x]); \
            }                                                                              \
        }                                                                                  \
    } while (0)

/* acc[j][...] += sum over RQ rows (from row r0_ of Ts) of Ts[row][its key j]
 * * Rr[row][its dims]: the dV += P^T dO and dK += dS^T Q steps. */
#define BWD_KEY_STEP(acc_, r0_)                                                            \
    do {                                                                                   \
        for (int r_ = 0; r_ < RQ; r_++) {                                                  \
            float pv[TC], gv[KGS * KG];                                                    \
            FA_VLOAD_TC(pv, Ts + ((r0_) + r_) * BC + tc * TC);                             \
            FA_UNROLL for (int u = 0; u < KGS; u++)                                        \
                FA_VLOAD(KG, gv + u * KG, Rr + r_ * HEAD_DIM + K_DIM_READ(K_DIM(u, 0)));   \
            FA_UNROLL for (int j = 0; j < TC; j++)                                         \
                FA_UNROLL for (int x = 0; x < KGS * KG; x++) acc_[j][x] = fma(pv[j], gv[x], acc_[j][x]); \
        }                                                                                  \
    } while (0)

/* The loads that follow each chunk in fa_bwd_dkdv (FA_LOADS_*: common.h):
 * after chunk kc_ of S and dP, the next chunk or the first rows of dO;
 * after rows c_ of dO, the next ones or the first rows of Q; after rows c_
 * of Q, the next ones, then the first rows of K (with DQ_ATOMIC) or the
 * next query tile's first chunk; after rows c_ of K, the next ones or the
 * next query tile's first chunk. */
#define KV_NEXT_TILE()                                                                     \
    do {                                                                                   \
        if (vis_next < total)                                                              \
            BWD_FETCH_A(fa_row_index(lq, b, seq.start_q, q_next, h_next),                  \
                        fa_row_index(lo, b, seq.start_q, q_next, h_next), seq.len_q - q_next, kt_base, \
                        vt_base, valid_k, 0);                                              \
    } while (0)
#define KV_NEXT_A(kc_)                                                                     \
    do {                                                                                   \
        if ((kc_) + 1 < NKC)                                                               \
            BWD_FETCH_A(q_base, o_base, valid_q, kt_base, vt_base, valid_k, ((kc_) + 1) * DC); \
        else                                                                               \
            BWD_FETCH_ROWS(dout, o_base, o_ss, RQ, valid_q);                               \
    } while (0)
#define KV_NEXT_DV(c_)                                                                     \
    do {                                                                                   \
        if ((c_) + 1 < NRQ)                                                                \
            BWD_FETCH_ROWS(dout, o_base + (long)((c_) + 1) * RQ * o_ss, o_ss, RQ, valid_q - ((c_) + 1) * RQ); \
        else                                                                               \
            BWD_FETCH_ROWS(q, q_base, q_ss, RQ, valid_q);                                  \
    } while (0)
#ifdef DQ_ATOMIC
#define KV_AFTER_DK() BWD_FETCH_ROWS(k, kt_base, k_ss, RK, valid_k)
#else
#define KV_AFTER_DK() KV_NEXT_TILE()
#endif
#define KV_NEXT_DK(c_)                                                                     \
    do {                                                                                   \
        if ((c_) + 1 < NRQ)                                                                \
            BWD_FETCH_ROWS(q, q_base + (long)((c_) + 1) * RQ * q_ss, q_ss, RQ, valid_q - ((c_) + 1) * RQ); \
        else                                                                               \
            KV_AFTER_DK();                                                                 \
    } while (0)
#define KV_NEXT_DQ(c_)                                                                     \
    do {                                                                                   \
        if ((c_) + 1 < NRK)                                                                \
            BWD_FETCH_ROWS(k, kt_base + (long)((c_) + 1) * RK * k_ss, k_ss, RK, valid_k - ((c_) + 1) * RK); \
        else                                                                               \
            KV_NEXT_TILE();                                                                \
    } while (0)

/* The same in fa_bwd_dq: after chunk kc_ of S and dP, the next chunk or the
 * first rows of K; after rows c_ of K, the next ones or the next key tile's
 * first chunk. */
#define Q_NEXT_A(kc_)                                                                      \
    do {                                                                                   \
        if ((kc_) + 1 < NKC)                                                               \
            BWD_FETCH_A(q_base, o_base, valid_q, kt_base, vt_base, valid_k, ((kc_) + 1) * DC); \
        else                                                                               \
            BWD_FETCH_ROWS(k, kt_base, k_ss, RK, valid_k);                                 \
    } while (0)
#define Q_NEXT_K(c_)                                                                       \
    do {                                                                                   \
        if ((c_) + 1 < NRK)                                                                \
            BWD_FETCH_ROWS(k, kt_base + (long)((c_) + 1) * RK * k_ss, k_ss, RK, valid_k - ((c_) + 1) * RK); \
        else if (t_next < t_end)                                                           \
            BWD_FETCH_A(q_base, o_base, valid_q, k_base + (long)t_next * BC * k_ss,        \
                        v_base + (long)t_next * BC * v_ss, seq.len_k - t_next * BC, 0);    \
    } while (0)

/* The query tiles of a key tile, in the order fa_bwd_dkdv visits them:
 * visit v is query head hk * group + v / n of the group and query tile
 * t_begin + (v % n + rot) % n. With DQ_ATOMIC the work-groups of one head
 * start at different query tiles (rot), so that their dQ additions do not
 * pile onto the same rows at once. Returns the first visit >= v that the
 * block mask leaves anything of. */
FA_FN int fa_stream_next_visit(__global const uchar *tile_map, int tile_cols, int k0, int v, int total, int n,
                                int t_begin, int rot) {
#ifdef BLOCK_MASK
    while (v < total && tile_map[(long)(t_begin + (v % n + rot) % n) * tile_cols + k0 / BC] == FA_TILE_SKIP) v++;
#else
    (void)tile_map;
    (void)tile_cols;
    (void)k0;
    (void)n;
    (void)t_begin;
    (void)rot;
#endif
    return v;
}

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
fa_bwd_dkdv(__global const store_t *q, __global const store_t *k, __global const store_t *v,
            __global const float *lse, __global const store_t *dout, __global const float *dvec,
            __global store_t *dk, __global store_t *dv, FA_BWD_PARAMS, __global float *dq_acc) {
    FA_BWD_LOCAL();
    const int lid = get_local_id(0);
    const int tr = lid / NTC, tc = lid % NTC;
    const int k0 = get_group_id(0) * BC;
    const int hk = get_group_id(1);
    const int b = get_group_id(2);
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (k0 >= seq.len_k) return;
    FA_BWD_SETUP();
    (void)drop;
    (void)dq_acc;

    const long kt_base = fa_row_index(lk, b, seq.start_k, k0, hk);
    const long vt_base = fa_row_index(lv, b, seq.start_k, k0, hk);
    const int valid_k = seq.len_k - k0;

    float acc_k[TC][KGS * KG], acc_v[TC][KGS * KG];
    FA_UNROLL for (int j = 0; j < TC; j++)
        FA_UNROLL for (int x = 0; x < KGS * KG; x++) acc_k[j][x] = acc_v[j][x] = 0.0f;

    int r_lo, r_hi, t_begin, t_end;
    fa_query_range(&mask, k0, k0 + min(BC, seq.len_k - k0) - 1, &r_lo, &r_hi);
    fa_tile_span(r_lo, r_hi, BR, &t_begin, &t_end);
    const int n_t = t_end - t_begin;
    const int total = group * n_t;
#ifdef DQ_ATOMIC
    const int rot = n_t > 0 ? (int)(get_group_id(0) % (uint)n_t) : 0;
#else
    const int rot = 0;
#endif

    float8 st[NST];
    int vis = fa_stream_next_visit(tile_map, tile_cols, k0, 0, total, n_t, t_begin, rot);
    if (vis < total) {
        const int h0 = hk * group + vis / n_t, qa = (t_begin + (vis % n_t + rot) % n_t) * BR;
        BWD_FETCH_A(fa_row_index(lq, b, seq.start_q, qa, h0), fa_row_index(lo, b, seq.start_q, qa, h0),
                    seq.len_q - qa, kt_base, vt_base, valid_k, 0);
    }
    while (vis < total) {
        const int h = hk * group + vis / n_t;
        FA_SCORE_DECL(b, h, seq.len_q, seq.len_k);
        const int q0 = (t_begin + (vis % n_t + rot) % n_t) * BR;
        const int cls = fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_FEED_KEYS);
        const long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
        const long o_base = fa_row_index(lo, b, seq.start_q, q0, h);
        const int valid_q = seq.len_q - q0;
        const int vis_next = fa_stream_next_visit(tile_map, tile_cols, k0, vis + 1, total, n_t, t_begin, rot);
        const int h_next = hk * group + (vis_next < total ? vis_next / n_t : 0);
        const int q_next = vis_next < total ? (t_begin + (vis_next % n_t + rot) % n_t) * BR : 0;

        /* S and dP, DC dimensions at a time. */
        BWD_LOAD_LD(q0, h);
        float s[TR][TC], dp[TR][TC];
        FA_UNROLL for (int i = 0; i < TR; i++)
            FA_UNROLL for (int j = 0; j < TC; j++) s[i][j] = dp[i][j] = 0.0f;
        for (int kc = 0; kc < NKC; kc++) {
            BWD_PUT_A();
            FA_LOADS_BEFORE(KV_NEXT_A(kc));
            barrier(CLK_LOCAL_MEM_FENCE);
            FA_LOADS_AFTER(KV_NEXT_A(kc));
            BWD_PRODUCTS();
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        BWD_SOFTMAX_GRAD();

        /* dV += P^T dO, RQ rows of dO at a time. */
        FA_UNROLL for (int i = 0; i < TR; i++) FA_VSTORE_TC(s[i], Ts + (tr * TR + i) * BC + tc * TC);
        for (int c = 0; c < NRQ; c++) {
            BWD_PUT_ROWS(RQ);
            FA_LOADS_BEFORE(KV_NEXT_DV(c));
            barrier(CLK_LOCAL_MEM_FENCE);
            FA_LOADS_AFTER(KV_NEXT_DV(c));
            BWD_KEY_STEP(acc_v, c * RQ);
            barrier(CLK_LOCAL_MEM_FENCE);
        }

        /* dK += dS^T Q, RQ rows of Q at a time. */
        FA_UNROLL for (int i = 0; i < TR; i++) FA_VSTORE_TC(dp[i], Ts + (tr * TR + i) * BC + tc * TC);
        for (int c = 0; c < NRQ; c++) {
            BWD_PUT_ROWS(RQ);
            FA_LOADS_BEFORE(KV_NEXT_DK(c));
            barrier(CLK_LOCAL_MEM_FENCE);
            FA_LOADS_AFTER(KV_NEXT_DK(c));
            BWD_KEY_STEP(acc_k, c * RQ);
            barrier(CLK_LOCAL_MEM_FENCE);
        }

#ifdef DQ_ATOMIC
        /* This key tile's share of dQ = dS K, RK rows of K at a time (dS is
         * still in Ts), added to the fp32 accumulator. */
        float dq[TR][QGS * QG];
        FA_UNROLL for (int i = 0; i < TR; i++)
            FA_UNROLL for (int x = 0; x < QGS * QG; x++) dq[i][x] = 0.0f;
        for (int c = 0; c < NRK; c++) {
            BWD_PUT_ROWS(RK);
            FA_LOADS_BEFORE(KV_NEXT_DQ(c));
            barrier(CLK_LOCAL_MEM_FENCE);
            FA_LOADS_AFTER(KV_NEXT_DQ(c));
            BWD_DQ_STEP(dq, c * RK);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        FA_UNROLL for (int i = 0; i < TR; i++) {
            if (tr * TR + i >= seq.len_q - q0) continue;
            volatile __global float *row =
                dq_acc + fa_lse_index(b, h, q0 + tr * TR + i, heads_q, seqlen_q, seq.start_q, total_q) * HEAD_DIM;
            FA_UNROLL for (int u = 0; u < QGS; u++)
                FA_UNROLL for (int g = 0; g < QG; g++) {
                    const int x = Q_DIM(u, g);
                    if (x < HEAD_DIM) fa_atomic_add(row + x, dq[i][u * QG + g]);
                }
        }
#endif
        vis = vis_next;
    }

    FA_UNROLL for (int j = 0; j < TC; j++) {
        const int c = tc * TC + j;
        if (c >= seq.len_k - k0) continue;
        FA_UNROLL for (int u = 0; u < KGS; u++)
            FA_UNROLL for (int g = 0; g < KG; g++) {
                const int x = K_DIM(u, g);
                if (x >= HEAD_DIM) continue;
                STORE1(dk, kt_base + (long)c * k_ss + x, acc_k[j][u * KG + g] * scale);
                STORE1(dv, vt_base + (long)c * v_ss + x, acc_v[j][u * KG + g]);
            }
    }
}

#ifndef DQ_ATOMIC

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
fa_bwd_dq(__global const store_t *q, __global const store_t *k, __global const store_t *v,
          __global const float *lse, __global const store_t *dout, __global const float *dvec,
          __global store_t *dq, FA_BWD_PARAMS) {
    FA_BWD_LOCAL();
    const int lid = get_local_id(0);
    const int tr = lid / NTC, tc = lid % NTC;
    const int q0 = get_group_id(0) * BR;
    const int h = get_group_id(1);
    const int b = get_group_id(2);
    const int hk = h / group;
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (q0 >= seq.len_q) return;
    FA_BWD_SETUP();
    FA_SCORE_DECL(b, h, seq.len_q, seq.len_k);
    (void)drop;

    const long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
    const long o_base = fa_row_index(lo, b, seq.start_q, q0, h);
    const long k_base = fa_row_index(lk, b, seq.start_k, 0, hk);
    const long v_base = fa_row_index(lv, b, seq.start_k, 0, hk);
    const int valid_q = seq.len_q - q0;
    BWD_LOAD_LD(q0, h);

    float acc[TR][QGS * QG];
    FA_UNROLL for (int i = 0; i < TR; i++)
        FA_UNROLL for (int x = 0; x < QGS * QG; x++) acc[i][x] = 0.0f;

    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(&mask, q0, q0 + min(BR, seq.len_q - q0) - 1, &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);

    float8 st[NST];
    int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end);
    if (t < t_end)
        BWD_FETCH_A(q_base, o_base, valid_q, k_base + (long)t * BC * k_ss, v_base + (long)t * BC * v_ss,
                    seq.len_k - t * BC, 0);
    while (t < t_end) {
        const int k0 = t * BC;
        const int t_next = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end);
        const int cls = fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED);
        const long kt_base = k_base + (long)k0 * k_ss, vt_base = v_base + (long)k0 * v_ss;
        const int valid_k = seq.len_k - k0;

        float s[TR][TC], dp[TR][TC];
        FA_UNROLL for (int i = 0; i < TR; i++)
            FA_UNROLL for (int j = 0; j < TC; j++) s[i][j] = dp[i][j] = 0.0f;
        for (int kc = 0; kc < NKC; kc++) {
            BWD_PUT_A();
            FA_LOADS_BEFORE(Q_NEXT_A(kc));
            barrier(CLK_LOCAL_MEM_FENCE);
            FA_LOADS_AFTER(Q_NEXT_A(kc));
            BWD_PRODUCTS();
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        BWD_SOFTMAX_GRAD();

        /* dQ += dS K, RK rows of K at a time. */
        FA_UNROLL for (int i = 0; i < TR; i++) FA_VSTORE_TC(dp[i], Ts + (tr * TR + i) * BC + tc * TC);
        for (int c = 0; c < NRK; c++) {
            BWD_PUT_ROWS(RK);
            FA_LOADS_BEFORE(Q_NEXT_K(c));
            barrier(CLK_LOCAL_MEM_FENCE);
            FA_LOADS_AFTER(Q_NEXT_K(c));
            BWD_DQ_STEP(acc, c * RK);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        t = t_next;
    }

    FA_UNROLL for (int i = 0; i < TR; i++) {
        if (tr * TR + i >= seq.len_q - q0) continue;
        const long row = fa_row_index(lq, b, seq.start_q, q0 + tr * TR + i, h);
        FA_UNROLL for (int u = 0; u < QGS; u++)
            FA_UNROLL for (int g = 0; g < QG; g++) {
                const int x = Q_DIM(u, g);
                if (x < HEAD_DIM) STORE1(dq, row + x, acc[i][u * QG + g] * scale);
            }
    }
}

#endif /* !DQ_ATOMIC */

#endif /* FA_STREAM */
