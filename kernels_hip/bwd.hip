/* Backward pass: dQ, dK, dV from Q, K, V, O, L and dO, recomputing P on chip
 * from L. The HIP twin of kernels_cl/bwd.cl. Three kernels, run in this
 * order:
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
 * With s = q.k (scaled; with score options the forward's logit,
 * common.h fa_logit2), P = exp(s - L), dropout keep bit z and
 * keep_scale = 1 / (1 - p):
 *   dP = z * keep_scale * dO.v,   dS = P * (dP - D) [* (1 - tanh^2) with SOFTCAP]
 *   dV += P * z * keep_scale * dO,   dK += scale * dS * q,   dQ += scale * dS * k
 * A row with L = -inf (no visible key) takes L = +inf here, which makes its
 * P exactly 0 instead of exp(-inf + inf). */

#define DPT ((HEAD_DIM + NTC - 1) / NTC)
#define FA_QROW 2
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
#define DIM_CLAMP(x) fa_imin((x), HEAD_DIM - 1)
#endif
#if BC % NTR == 0
#define KEY_CLAMP(c) (c)
#else
#define KEY_CLAMP(c) fa_imin((c), BC - 1)
#endif

/* The arguments every backward kernel shares after its tensors. */
#define FA_BWD_PARAMS                                                                      \
    fa_long q_off, fa_long q_sb, fa_long q_ss, fa_long q_sh,                               \
    fa_long k_off, fa_long k_sb, fa_long k_ss, fa_long k_sh,                               \
    fa_long v_off, fa_long v_sb, fa_long v_ss, fa_long v_sh,                               \
    fa_long o_off, fa_long o_sb, fa_long o_ss, fa_long o_sh,                               \
    int seqlen_q, int seqlen_k, int heads_q, int group, fa_long total_q, float scale_log2, \
    float scale, const int *cu_q, const int *cu_k,                                         \
    int window_left, int window_right,                                                     \
    const fa_uchar *block_mask, int block_q, int block_k, int block_cols,                  \
    const fa_uchar *tile_map, int tile_cols,                                               \
    fa_uint drop_key0, fa_uint drop_key1, fa_uint drop_offset_lo, fa_uint drop_threshold,  \
    float drop_scale, fa_uint drop_row0, fa_uint drop_col0, FA_SCORE_PARAMS

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
    drop.row0 = drop_row0;                                                                 \
    drop.col0 = drop_col0;                                                                 \
    (void)drop;                                                                            \
    const fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};        \
    const fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh}

/* ------------------------------------------------------------------------ */

/* 64 work-items per group, one row each: grid (row blocks, heads, sequences). */
extern "C" __global__ __launch_bounds__(64) void
fa_bwd_dot(const store_t *__restrict__ o, const store_t *__restrict__ dout, float *__restrict__ dvec,
           fa_long o_off, fa_long o_sb, fa_long o_ss, fa_long o_sh, int seqlen_q, int heads_q, fa_long total_q,
           const int *cu_q) {
    const fa_uint t_ = blockIdx.x * 64u + threadIdx.x;
    const int h = (int)blockIdx.y, b = (int)blockIdx.z;
    (void)cu_q;
#ifdef VARLEN
    const fa_long start_q = cu_q[b];
    const int len_q = cu_q[b + 1] - cu_q[b];
#else
    const fa_long start_q = (fa_long)b * seqlen_q;
    const int len_q = seqlen_q;
#endif
    /* Unsigned: past a sequence near 2^31 tokens the row passes INT_MAX. */
    if (t_ >= (fa_uint)len_q) return;
    const int t = (int)t_;
    const fa_layout lo = {o_off, o_sb, o_ss, o_sh};
    const fa_long row = fa_row_index(lo, b, start_q, t, h);
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int x0 = 0; x0 < HEAD_DIM; x0 += 8) {
        float a[8], g[8];
        fa_load8(o, row + x0, a);
        fa_load8(dout, row + x0, g);
        for (int e = 0; e < 8; e++) acc[e] = fmaf(a[e], g[e], acc[e]);
    }
    /* Pairwise: halves, then quarters, then pairs. */
    float a4[4], a2[2];
    for (int e = 0; e < 4; e++) a4[e] = acc[e] + acc[e + 4];
    for (int e = 0; e < 2; e++) a2[e] = a4[e] + a4[e + 2];
    dvec[fa_lse_index(b, h, t, heads_q, seqlen_q, start_q, total_q)] = a2[0] + a2[1];
}

/* P (before dropout) and dP of a work-item's micro-tile, for rows stored at
 * Ls/Ds[r], from dot products already in s and dp; then dropout and dS.
 * On return s holds P * z * keep_scale and dp holds dS. The logit is the
 * forward's (fa_logit2, with the score options of the fa_score sc); with
 * SOFTCAP, dS takes the cap's derivative, held in g_ between the loops.
 * The loops are unrolled by request: with every mask on, their bodies grow
 * past what NVRTC unrolls by itself, and s and dp would move to local
 * memory. */
#define FA_BWD_SOFTMAX_GRAD(ROW, COL, PTILE, RS, CS)                                       \
    do {                                                                                   \
        float g_[TR][TC];                                                                  \
        (void)g_;                                                                          \
        _Pragma("unroll") for (int i = 0; i < TR; i++)                                     \
            _Pragma("unroll") for (int j = 0; j < TC; j++) {                               \
                const int r_ = (ROW), c_ = (COL);                                          \
                float pv = exp2f(fa_logit2(sc, s[i][j], q0, r_, k0, c_, &g_[i][j]) - Ls[r_]); \
                if (cls == FA_TILE_PARTIAL && !fa_visible(mask, block_mask, q0, r_, k0, c_))   \
                    pv = 0.0f;                                                             \
                s[i][j] = pv;                                                              \
                DROPOUT_STORE(PTILE[r_ * (RS) + c_ * (CS)] = pv);                          \
            }                                                                              \
        DROPOUT_MARK(PTILE, RS, CS);                                                       \
        _Pragma("unroll") for (int i = 0; i < TR; i++)                                     \
            _Pragma("unroll") for (int j = 0; j < TC; j++) {                               \
                const int r_ = (ROW), c_ = (COL);                                          \
                const float z_ = DROPOUT_KEEP(PTILE[r_ * (RS) + c_ * (CS)]) ? drop_scale : 0.0f; \
                const float pv = s[i][j];                                                  \
                s[i][j] = pv * z_;                                                         \
                dp[i][j] = FA_CAP_GRAD(pv * (dp[i][j] * z_ - Ds[r_]), g_[i][j]);           \
            }                                                                              \
    } while (0)

#ifdef DROPOUT
#define DROPOUT_STORE(stmt) stmt
#define DROPOUT_MARK(tile, rs, cs)                                                         \
    do {                                                                                   \
        __syncthreads();                                                                   \
        fa_dropout_mark(tile, rs, cs, drop, b, h, heads_q, q0, k0);                        \
        __syncthreads();                                                                   \
    } while (0)
#define DROPOUT_KEEP(val) (!fa_signbit(val))
#else
#define DROPOUT_STORE(stmt) ((void)0)
#define DROPOUT_MARK(tile, rs, cs) ((void)0)
#define DROPOUT_KEEP(val) 1
#endif

/* ------------------------------------------------------------------------ */

FA_KERNEL void fa_bwd_dkdv(const store_t *__restrict__ q, const store_t *__restrict__ k,
                           const store_t *__restrict__ v, const float *__restrict__ lse,
                           const store_t *__restrict__ dout, const float *__restrict__ dvec,
                           store_t *__restrict__ dk, store_t *__restrict__ dv, FA_BWD_PARAMS) {
    /* fa_plan_local_mem's SIMT backward figure exactly. */
    __shared__ FA_LOCAL_ALIGN float Kt[HEAD_DIM * BC]; /* transposed: [x][key] */
    __shared__ FA_LOCAL_ALIGN float Vt[HEAD_DIM * BC];
    __shared__ FA_LOCAL_ALIGN float Qs[BR * HEAD_DIM]; /* row-major: [row][x] */
    __shared__ FA_LOCAL_ALIGN float dOs[BR * HEAD_DIM];
    __shared__ FA_LOCAL_ALIGN float Ps[BR * BC];       /* row-major: [row][key] */
    __shared__ FA_LOCAL_ALIGN float dSs[BR * BC];
    __shared__ float Ls[BR], Ds[BR];

    const int lid = (int)threadIdx.x;
    const int tr = lid / NTC, tc = lid % NTC;
    const int k0 = (int)blockIdx.x * BC;
    const int hk = (int)blockIdx.y;
    const int b = (int)blockIdx.z;
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (k0 >= seq.len_k) return;
    FA_BWD_SETUP();

    const fa_long k_base = fa_row_index(lk, b, seq.start_k, k0, hk);
    const fa_long v_base = fa_row_index(lv, b, seq.start_k, k0, hk);
    for (int e = lid; e < BC * D8; e += WG_SIZE) {
        const int c = e / D8, x0 = (e % D8) * 8;
        float kv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        float vv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (c < seq.len_k - k0) {
            fa_load8(k, k_base + (fa_long)c * k_ss + x0, kv);
            fa_load8(v, v_base + (fa_long)c * v_ss + x0, vv);
        }
        fa_store8_t(Kt, BC, x0, c, kv);
        fa_store8_t(Vt, BC, x0, c, vv);
    }

    float acc_k[KPT][DPT], acc_v[KPT][DPT];
    for (int j = 0; j < KPT; j++)
        for (int u = 0; u < DPT; u++) acc_k[j][u] = acc_v[j][u] = 0.0f;

    int r_lo, r_hi, t_begin, t_end;
    fa_query_range(mask, k0, fa_tile_last(k0, BC, seq.len_k), &r_lo, &r_hi);
    fa_tile_span(r_lo, r_hi, BR, &t_begin, &t_end);

    for (int hh = 0; hh < group; hh++) {
        const int h = hk * group + hh;
        const fa_score sc = fa_score_of(scale_log2, FA_SCORE_ARGS, b, h, seq);
        for (int t = fa_next_query_tile(tile_map, tile_cols, k0, t_begin, t_end); t < t_end;
             t = fa_next_query_tile(tile_map, tile_cols, k0, t + 1, t_end)) {
            const int q0 = t * BR;
            const int cls = fa_tile_class(mask, tile_map, tile_cols, q0, k0, FA_ROWS_FEED_KEYS);

            const fa_long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
            const fa_long o_base = fa_row_index(lo, b, seq.start_q, q0, h);
            for (int e = lid; e < BR * D8; e += WG_SIZE) {
                const int r = e / D8, x0 = (e % D8) * 8;
                float qv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                float gv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                if (r < seq.len_q - q0) {
                    fa_load8(q, q_base + (fa_long)r * q_ss + x0, qv);
                    fa_load8(dout, o_base + (fa_long)r * o_ss + x0, gv);
                }
                fa_store8(Qs + r * HEAD_DIM + x0, qv);
                fa_store8(dOs + r * HEAD_DIM + x0, gv);
            }
            for (int r = lid; r < BR; r += WG_SIZE) {
                float lv_ = FA_INF, dv_ = 0.0f;
                if (r < seq.len_q - q0) {
                    const fa_long li = fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q);
                    const float L = lse[li];
                    lv_ = L == -FA_INF ? FA_INF : L * FA_LOG2E;
                    dv_ = dvec[li];
                }
                Ls[r] = lv_;
                Ds[r] = dv_;
            }
            __syncthreads();

            float s[TR][TC], dp[TR][TC];
            for (int i = 0; i < TR; i++)
                for (int j = 0; j < TC; j++) s[i][j] = dp[i][j] = 0.0f;
            /* Q and dO rows are read FA_QROW dimensions at a time: the
             * work-items of one row group share the address, so the wide
             * loads do not conflict. Two, not the OpenCL kernel's four:
             * the same sums in the same order, with fewer registers held
             * (four spill on wave32 targets at the planner's largest
             * micro-tiles). */
            for (int x = 0; x < HEAD_DIM; x += FA_QROW) {
                float a[TR][FA_QROW], g[TR][FA_QROW];
                for (int i = 0; i < TR; i++) {
                    fa_lds_get(a[i], Qs + (tr * TR + i) * HEAD_DIM + x, FA_QROW);
                    fa_lds_get(g[i], dOs + (tr * TR + i) * HEAD_DIM + x, FA_QROW);
                }
                for (int e = 0; e < FA_QROW; e++) {
                    float kk[TC], vv[TC];
                    fa_lds_get(kk, Kt + (x + e) * BC + tc * TC, TC);
                    fa_lds_get(vv, Vt + (x + e) * BC + tc * TC, TC);
                    for (int i = 0; i < TR; i++)
                        for (int j = 0; j < TC; j++) {
                            s[i][j] = fmaf(a[i][e], kk[j], s[i][j]);
                            dp[i][j] = fmaf(g[i][e], vv[j], dp[i][j]);
                        }
                }
            }
            FA_BWD_SOFTMAX_GRAD(tr * TR + i, tc * TC + j, Ps, BC, 1);
            for (int i = 0; i < TR; i++) {
                fa_lds_put(s[i], Ps + (tr * TR + i) * BC + tc * TC, TC);
                fa_lds_put(dp[i], dSs + (tr * TR + i) * BC + tc * TC, TC);
            }
            __syncthreads();

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
                        acc_v[j][u] = fmaf(pr[j], gr[u], acc_v[j][u]);
                        acc_k[j][u] = fmaf(dsr[j], qr[u], acc_k[j][u]);
                    }
            }
            __syncthreads();
        }
    }

    const fa_long dk_base = fa_row_index(lk, b, seq.start_k, k0, hk);
    const fa_long dv_base = fa_row_index(lv, b, seq.start_k, k0, hk);
    /* Unrolled by request, as the forward pass's epilogue: the exits
     * would otherwise keep the accumulators out of registers. */
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        const int c = tr + j * NTR;
        if (c >= BC || c >= seq.len_k - k0) continue;
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x >= HEAD_DIM) continue;
            fa_store1(dk, dk_base + (fa_long)c * k_ss + x, acc_k[j][u] * scale);
            fa_store1(dv, dv_base + (fa_long)c * v_ss + x, acc_v[j][u]);
        }
    }
}

/* ------------------------------------------------------------------------ */

FA_KERNEL void fa_bwd_dq(const store_t *__restrict__ q, const store_t *__restrict__ k,
                         const store_t *__restrict__ v, const float *__restrict__ lse,
                         const store_t *__restrict__ dout, const float *__restrict__ dvec,
                         store_t *__restrict__ dq, FA_BWD_PARAMS) {
    /* Within fa_plan_local_mem's SIMT backward figure (no P tile needed). */
    __shared__ FA_LOCAL_ALIGN float Qt[HEAD_DIM * BR]; /* transposed: [x][row] */
    __shared__ FA_LOCAL_ALIGN float dOt[HEAD_DIM * BR];
    __shared__ FA_LOCAL_ALIGN float Kt[HEAD_DIM * BC]; /* transposed: [x][key] */
    __shared__ FA_LOCAL_ALIGN float Vt[HEAD_DIM * BC];
    __shared__ FA_LOCAL_ALIGN float dSt[BC * BR];      /* transposed: [key][row] */
    __shared__ float Ls[BR], Ds[BR];

    const int lid = (int)threadIdx.x;
    const int tr = lid / NTC, tc = lid % NTC;
    const int q0 = (int)blockIdx.x * BR;
    const int h = (int)blockIdx.y;
    const int b = (int)blockIdx.z;
    const int hk = h / group;
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (q0 >= seq.len_q) return;
    FA_BWD_SETUP();
    (void)lo;
    const fa_score sc = fa_score_of(scale_log2, FA_SCORE_ARGS, b, h, seq);

    const fa_long q_base = fa_row_index(lq, b, seq.start_q, q0, h);
    const fa_long o_base = fa_row_index(lo, b, seq.start_q, q0, h);
    for (int e = lid; e < BR * D8; e += WG_SIZE) {
        const int r = e / D8, x0 = (e % D8) * 8;
        float qv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        float gv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (r < seq.len_q - q0) {
            fa_load8(q, q_base + (fa_long)r * q_ss + x0, qv);
            fa_load8(dout, o_base + (fa_long)r * o_ss + x0, gv);
        }
        fa_store8_t(Qt, BR, x0, r, qv);
        fa_store8_t(dOt, BR, x0, r, gv);
    }
    for (int r = lid; r < BR; r += WG_SIZE) {
        float lv_ = FA_INF, dv_ = 0.0f;
        if (r < seq.len_q - q0) {
            const fa_long li = fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q);
            const float L = lse[li];
            lv_ = L == -FA_INF ? FA_INF : L * FA_LOG2E;
            dv_ = dvec[li];
        }
        Ls[r] = lv_;
        Ds[r] = dv_;
    }

    float acc[TR][DPT];
    for (int i = 0; i < TR; i++)
        for (int u = 0; u < DPT; u++) acc[i][u] = 0.0f;

    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(mask, q0, fa_tile_last(q0, BR, seq.len_q), &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
    const fa_long k_base = fa_row_index(lk, b, seq.start_k, 0, hk);
    const fa_long v_base = fa_row_index(lv, b, seq.start_k, 0, hk);

    for (int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end); t < t_end;
         t = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end)) {
        const int k0 = t * BC;
        const int cls = fa_tile_class(mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED);

        for (int e = lid; e < BC * D8; e += WG_SIZE) {
            const int c = e / D8, x0 = (e % D8) * 8;
            float kv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            float vv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (c < seq.len_k - k0) {
                fa_load8(k, k_base + ((fa_long)k0 + c) * k_ss + x0, kv);
                fa_load8(v, v_base + ((fa_long)k0 + c) * v_ss + x0, vv);
            }
            for (int u = 0; u < 8; u++) Kt[(x0 + u) * BC + (c ^ KSW(x0 + u))] = kv[u];
            fa_store8_t(Vt, BC, x0, c, vv);
        }
        __syncthreads();

        float s[TR][TC], dp[TR][TC];
        for (int i = 0; i < TR; i++)
            for (int j = 0; j < TC; j++) s[i][j] = dp[i][j] = 0.0f;
        for (int x = 0; x < HEAD_DIM; x++) {
            float a[TR], g[TR], kk[TC], vv[TC];
            fa_lds_get(a, Qt + x * BR + tr * TR, TR);
            fa_lds_get(g, dOt + x * BR + tr * TR, TR);
            fa_lds_get(kk, Kt + x * BC + ((tc * TC) ^ KSW(x)), TC);
            fa_lds_get(vv, Vt + x * BC + tc * TC, TC);
            for (int i = 0; i < TR; i++)
                for (int j = 0; j < TC; j++) {
                    s[i][j] = fmaf(a[i], kk[j], s[i][j]);
                    dp[i][j] = fmaf(g[i], vv[j], dp[i][j]);
                }
        }
        FA_BWD_SOFTMAX_GRAD(tr * TR + i, tc * TC + j, dSt, 1, BR);
        for (int j = 0; j < TC; j++) {
            float col[TR];
            for (int i = 0; i < TR; i++) col[i] = dp[i][j];
            fa_lds_put(col, dSt + (tc * TC + j) * BR + tr * TR, TR);
        }
        __syncthreads();

        /* dQ += dS K over the tile's keys. */
        for (int c = 0; c < BC; c++) {
            float kr[DPT];
            for (int u = 0; u < DPT; u++) {
                const int x = DIM_CLAMP(tc + u * NTC);
                kr[u] = Kt[x * BC + (c ^ KSW(x))];
            }
            float dsc[TR];
            fa_lds_get(dsc, dSt + c * BR + tr * TR, TR);
            for (int i = 0; i < TR; i++)
                for (int u = 0; u < DPT; u++) acc[i][u] = fmaf(dsc[i], kr[u], acc[i][u]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < TR; i++) {
        if (tr * TR + i >= seq.len_q - q0) continue;
        const fa_long row = fa_row_index(lq, b, seq.start_q, q0 + tr * TR + i, h);
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (x < HEAD_DIM) fa_store1(dq, row + x, acc[i][u] * scale);
        }
    }
}
