/* Backward pass on matrix cores, on the fragment layer (mma_frag.h): dQ, dK,
 * dV from Q, K, V, O, L and dO, P recomputed on chip from L. Run in this
 * order:
 *
 *   fa_bwd_prep_mma    D = rowsum(dO * O), laid out as L; with DQ_ATOMIC
 *                      the fp32 dQ accumulator's rows zeroed
 *   fa_bwd_dkdv_mma    one work-group per (key tile of BC keys, kv head,
 *                      sequence): each wavefront owns STRIPS strips of
 *                      FA_OWN_T keys and keeps their dK and dV in
 *                      accumulator fragments while the work-group loops over
 *                      the query heads sharing the kv head and the query
 *                      tiles of BR rows that see the keys (GQA sums there,
 *                      no atomics). With DQ_ATOMIC it also adds dS K into
 *                      the accumulator.
 *   fa_bwd_dq_convert  dQ = scale * accumulator, or, without DQ_ATOMIC
 *                      (deterministic mode):
 *   fa_bwd_dq_mma      one work-group per (query tile of BR rows, query
 *                      head, sequence), one strip of queries a wavefront,
 *                      looping over the key tiles with P and dS recomputed;
 *                      every sum has a fixed order, so results are
 *                      bit-identical run to run.
 *
 * With s = q.k, P = exp2(s * scale log2 e - L log2 e), dropout keep bit z
 * and keep_scale = 1 / (1 - p):
 *   dP = z keep_scale dO.v,  dS = P (dP - D),
 *   dV += z keep_scale P^T dO,  dK += scale dS^T Q,  dQ += scale dS K
 * A row with L = -inf (no visible key) takes L = +inf here, which makes its
 * P exactly 0 instead of exp(-inf + inf).
 *
 * Local memory of fa_bwd_dkdv_mma, exactly core/planner_hip_mma.c's
 * backward figure: K, V [BC rows]; Q, dO [BR rows] (LD 16-bit elements a
 * row); dS as [query][key] (BC + 8 a row, for dQ); L and D [BR] fp32.
 * fa_bwd_dq_mma declares less (Q, dO, K, V). */

#define NJB (BR / FA_OTHER_T) /* score fragments of a key strip (others: queries) */
#define PKB (BR / FA_K)       /* k-steps over queries of dV, dK */
#define NJQ (BC / FA_OTHER_T) /* score fragments of a query strip (dq kernel) */
#define PKQ (BC / FA_K)       /* k-steps over keys of dQ */
#define LDS_S (BC + 8)
#define DQ_WARPS (BR / FA_OWN_T)
#define DQ_THREADS (DQ_WARPS * FA_SG)

#if BC != WARPS * STRIPS * FA_OWN_T || BR % FA_OTHER_T != 0 || BR % FA_K != 0 || BR % FA_OWN_T != 0 || \
    BC % FA_K != 0 || BR % FA_M != 0 || HEAD_DIM % FA_N != 0
#error "bwd_mma: BC must be WARPS * STRIPS * FA_OWN_T; BR and BC multiples of the fragments"
#endif

#define SM_K 0
#define SM_V (SM_K + BC * LD)
#define SM_Q (SM_V + BC * LD)
#define SM_DO (SM_Q + BR * LD)
#define SM_DS (SM_DO + BR * LD)
#define SM_HALVES (SM_DS + BR * LDS_S)

/* The arguments the dK/dV and dQ kernels share after their tensors (those
 * of bwd.hip's kernels: the host passes both alike). */
#define FA_MMA_BWD_PARAMS                                                                  \
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
    float drop_scale

#define FA_MMA_BWD_SETUP()                                                                 \
    fa_mask mask;                                                                          \
    mask.len_q = seq.len_q;                                                                \
    mask.len_k = seq.len_k;                                                                \
    mask.window_left = window_left;                                                        \
    mask.window_right = window_right;                                                      \
    mask.block_q = block_q;                                                                \
    mask.block_k = block_k;                                                                \
    mask.block_cols = block_cols;                                                          \
    const fa_dropout drop = fa_dropout_of(drop_key0, drop_key1, drop_offset_lo, drop_threshold, drop_scale); \
    (void)drop;                                                                            \
    const fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};        \
    const fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh}

/* L (log2 units, +inf for rows without keys) and D of query row q0 + r. */
FA_FN void fa_row_stats(const float *lse, const float *dvec, int b, int h, int q0, int r, int heads_q, int seqlen_q,
                        const fa_seq &seq, fa_long total_q, float *l2, float *dd) {
    *l2 = FA_INF;
    *dd = 0.0f;
    if (r < seq.len_q - q0) {
        const fa_long i = fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q);
        const float L = lse[i];
        *l2 = L == -FA_INF ? FA_INF : L * FA_LOG2E;
        *dd = dvec[i];
    }
}

/* P and dS of a score fragment (s: scores, dp: dO.v) in place: on return s
 * holds z keep_scale P, dp holds dS. The fragment's own rows start at own0
 * and its other rows at oth0 (queries and keys as keys_own says; offsets
 * from the tile's q0 and k0); l2 and dd give L (log2) and D of element
 * e's query. */
#define FA_SOFTMAX_GRAD(S, DP, OWN0, OTH0, KEYS_OWN, L2_OF, D_OF)                            \
    do {                                                                                     \
        if (cls == FA_TILE_PARTIAL)                                                          \
            fa_frag_mask(&(S), mask, block_mask, q0, k0, (OWN0), (OTH0), (KEYS_OWN), -FA_INF, lane); \
        FA_KEEP_BITS(OWN0, OTH0, KEYS_OWN);                                                  \
        _Pragma("unroll") for (int e = 0; e < FA_C_ELEMS; e++) {                             \
            const float p_ = fa_exp2((S).x[e] * scale_log2 - (L2_OF));                       \
            const float z_ = FA_KEEP(e) ? drop_scale : 0.0f;                                 \
            (DP).x[e] = p_ * ((DP).x[e] * z_ - (D_OF));                                      \
            (S).x[e] = p_ * z_;                                                              \
        }                                                                                    \
    } while (0)

#ifdef DROPOUT
#define FA_KEEP_BITS(OWN0, OTH0, KEYS_OWN)                                                    \
    const fa_uint keep_ = fa_frag_keep(drop, bh, q0, k0, (OWN0), (OTH0), (KEYS_OWN), lane)
#define FA_KEEP(e) ((keep_ >> (e)) & 1u)
#else
#define FA_KEEP_BITS(OWN0, OTH0, KEYS_OWN) ((void)0)
#define FA_KEEP(e) 1
#endif

/* ------------------------------------------------------------------------ */

/* Rows of FA_PREP_TEAM work-items, 8 head dimensions each at a time: a
 * team reads whole rows of O and dO in 16-byte pieces. */
#define FA_PREP_TEAM 8
#define FA_PREP_THREADS 256
#define FA_PREP_ROWS (FA_PREP_THREADS / FA_PREP_TEAM)

/* Grid: (row blocks of FA_PREP_ROWS, heads, sequences). */
extern "C" __global__ __launch_bounds__(FA_PREP_THREADS) void
fa_bwd_prep_mma(const store_t *__restrict__ o, const store_t *__restrict__ dout, float *__restrict__ dvec,
                float *__restrict__ dq_acc, fa_long o_off, fa_long o_sb, fa_long o_ss, fa_long o_sh, int seqlen_q,
                int heads_q, fa_long total_q, const int *cu_q) {
    const int part = (int)threadIdx.x % FA_PREP_TEAM;
    /* The row unsigned: past a sequence near 2^31 tokens it passes INT_MAX. */
    const fa_uint t_ = blockIdx.x * FA_PREP_ROWS + threadIdx.x / FA_PREP_TEAM;
    const int h = (int)blockIdx.y, b = (int)blockIdx.z;
    const fa_seq seq = fa_seq_of(b, seqlen_q, 0, cu_q, cu_q);
    /* Rows past the sequence take part in the exchanges below (every lane
     * of a warp must, on NVIDIA), storing nothing. */
    const bool row_ok = t_ < (fa_uint)seq.len_q;
    const int t = row_ok ? (int)t_ : 0;
    const fa_layout lo = {o_off, o_sb, o_ss, o_sh};
    const fa_long row = fa_row_index(lo, b, seq.start_q, t, h);
    const fa_long li = fa_lse_index(b, h, t, heads_q, seqlen_q, seq.start_q, total_q);
    float acc = 0.0f;
    for (int x0 = 8 * part; row_ok && x0 < HEAD_DIM; x0 += 8 * FA_PREP_TEAM) {
        float a[8], g[8];
        fa_load8(o, row + x0, a);
        fa_load8(dout, row + x0, g);
#pragma unroll
        for (int e = 0; e < 8; e++) acc = fmaf(a[e], g[e], acc);
        if (dq_acc) {
            fa_f32x4 zero;
            zero.x = zero.y = zero.z = zero.w = 0.0f;
            *(fa_f32x4 *)(dq_acc + li * HEAD_DIM + x0) = zero;
            *(fa_f32x4 *)(dq_acc + li * HEAD_DIM + x0 + 4) = zero;
        }
    }
#pragma unroll
    for (int m = FA_PREP_TEAM / 2; m > 0; m /= 2) acc += __shfl_xor(acc, m, FA_PREP_TEAM);
    if (row_ok && part == 0) dvec[li] = acc;
}

#ifdef DQ_ATOMIC
/* dQ = scale * accumulator in the storage dtype; grid as fa_bwd_prep_mma. */
extern "C" __global__ __launch_bounds__(FA_PREP_THREADS) void
fa_bwd_dq_convert(const float *__restrict__ dq_acc, store_t *__restrict__ dq, fa_long q_off, fa_long q_sb,
                  fa_long q_ss, fa_long q_sh, int seqlen_q, int heads_q, fa_long total_q, const int *cu_q,
                  float scale) {
    const int part = (int)threadIdx.x % FA_PREP_TEAM;
    const fa_uint t_ = blockIdx.x * FA_PREP_ROWS + threadIdx.x / FA_PREP_TEAM; /* as in fa_bwd_prep_mma */
    const int h = (int)blockIdx.y, b = (int)blockIdx.z;
    const fa_seq seq = fa_seq_of(b, seqlen_q, 0, cu_q, cu_q);
    if (t_ >= (fa_uint)seq.len_q) return;
    const int t = (int)t_;
    const fa_layout lq = {q_off, q_sb, q_ss, q_sh};
    const fa_long row = fa_row_index(lq, b, seq.start_q, t, h);
    const fa_long li = fa_lse_index(b, h, t, heads_q, seqlen_q, seq.start_q, total_q);
    for (int x0 = 8 * part; x0 < HEAD_DIM; x0 += 8 * FA_PREP_TEAM) {
        const fa_f32x4 a = *(const fa_f32x4 *)(dq_acc + li * HEAD_DIM + x0);
        const fa_f32x4 c = *(const fa_f32x4 *)(dq_acc + li * HEAD_DIM + x0 + 4);
        fa_u32x4 w;
        w.x = fa_pack2(a.x * scale, a.y * scale);
        w.y = fa_pack2(a.z * scale, a.w * scale);
        w.z = fa_pack2(c.x * scale, c.y * scale);
        w.w = fa_pack2(c.z * scale, c.w * scale);
        *(fa_u32x4 *)(dq + row + x0) = w;
    }
}
#endif

/* ------------------------------------------------------------------------ */

FA_MMA_KERNEL(WG_SIZE) void fa_bwd_dkdv_mma(const store_t *__restrict__ q, const store_t *__restrict__ k,
                               const store_t *__restrict__ v, const float *__restrict__ lse,
                               const store_t *__restrict__ dout, const float *__restrict__ dvec,
                               store_t *__restrict__ dk, store_t *__restrict__ dv, float *__restrict__ dq_acc,
                               FA_MMA_BWD_PARAMS) {
    __shared__ __attribute__((aligned(16))) fa_ushort smem[SM_HALVES];
    __shared__ float Ls[BR], Ds[BR];
    fa_ushort *const Ks = smem + SM_K, *const Vs = smem + SM_V, *const Qs = smem + SM_Q, *const dOs = smem + SM_DO;
    fa_ushort *const dSt = smem + SM_DS;

    const int lid = (int)threadIdx.x, warp = lid / FA_SG, lane = lid % FA_SG;
    const int k0 = (int)blockIdx.x * BC;
    const int hk = (int)blockIdx.y, b = (int)blockIdx.z;
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (k0 >= seq.len_k) return;
    FA_MMA_BWD_SETUP();
    (void)dSt;
    (void)dq_acc;

    fa_fetch_rows(Ks, k + fa_row_index(lk, b, seq.start_k, k0, hk), k_ss, BC, seq.len_k - k0, lid, FA_THREADS);
    fa_fetch_rows(Vs, v + fa_row_index(lv, b, seq.start_k, k0, hk), v_ss, BC, seq.len_k - k0, lid, FA_THREADS);
    fa_copy_commit();

    fa_c acc_k[STRIPS][NF], acc_v[STRIPS][NF];
#pragma unroll
    for (int st = 0; st < STRIPS; st++)
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int e = 0; e < FA_C_ELEMS; e++) acc_k[st][f].x[e] = acc_v[st][f].x[e] = 0.0f;

    int r_lo, r_hi, t_begin, t_end;
    fa_query_range(mask, k0, fa_tile_last(k0, BC, seq.len_k), &r_lo, &r_hi);
    fa_tile_span(r_lo, r_hi, BR, &t_begin, &t_end);

    for (int hh = 0; hh < group; hh++) {
        const int h = hk * group + hh;
#ifdef DROPOUT
        const fa_uint bh = (fa_uint)b * (fa_uint)heads_q + (fa_uint)h;
#endif
        const store_t *const qh = q + fa_row_index(lq, b, seq.start_q, 0, h);
        const store_t *const gh = dout + fa_row_index(lo, b, seq.start_q, 0, h);
        for (int t = fa_next_query_tile(tile_map, tile_cols, k0, t_begin, t_end); t < t_end;
             t = fa_next_query_tile(tile_map, tile_cols, k0, t + 1, t_end)) {
            const int q0 = t * BR;
            const int cls = fa_tile_class(mask, tile_map, tile_cols, q0, k0, FA_ROWS_FEED_KEYS);
            fa_fetch_rows(Qs, qh + (fa_long)q0 * q_ss, q_ss, BR, seq.len_q - q0, lid, FA_THREADS);
            fa_fetch_rows(dOs, gh + (fa_long)q0 * o_ss, o_ss, BR, seq.len_q - q0, lid, FA_THREADS);
            fa_copy_commit();
            for (int r = lid; r < BR; r += FA_THREADS)
                fa_row_stats(lse, dvec, b, h, q0, r, heads_q, seqlen_q, seq, total_q, &Ls[r], &Ds[r]);
            fa_copy_wait(0);
            __syncthreads();

            /* S (own: keys, other: queries) and dP, over head_dim. */
            fa_c s[STRIPS][NJB], dp[STRIPS][NJB];
#pragma unroll
            for (int st = 0; st < STRIPS; st++)
#pragma unroll
                for (int j = 0; j < NJB; j++)
#pragma unroll
                    for (int e = 0; e < FA_C_ELEMS; e++) s[st][j].x[e] = dp[st][j].x[e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KT; ks++) {
                fa_own_op ko[STRIPS], vo[STRIPS];
#pragma unroll
                for (int st = 0; st < STRIPS; st++) {
                    fa_load_own(&ko[st], Ks, LD, (warp * STRIPS + st) * FA_OWN_T, ks * FA_K, lane);
                    fa_load_own(&vo[st], Vs, LD, (warp * STRIPS + st) * FA_OWN_T, ks * FA_K, lane);
                }
#pragma unroll
                for (int j = 0; j < NJB; j++) {
                    fa_other_op qo, go;
                    fa_load_other(&qo, Qs, LD, j * FA_OTHER_T, ks * FA_K, lane);
                    fa_load_other(&go, dOs, LD, j * FA_OTHER_T, ks * FA_K, lane);
#pragma unroll
                    for (int st = 0; st < STRIPS; st++) {
                        fa_score_mma(&s[st][j], &ko[st], &qo);
                        fa_score_mma(&dp[st][j], &vo[st], &go);
                    }
                }
            }
#pragma unroll
            for (int st = 0; st < STRIPS; st++) {
                const int own0 = (warp * STRIPS + st) * FA_OWN_T; /* from k0 */
#pragma unroll
                for (int j = 0; j < NJB; j++)
                    FA_SOFTMAX_GRAD(s[st][j], dp[st][j], own0, j * FA_OTHER_T, true,
                                    Ls[j * FA_OTHER_T + FA_OTHER_OF(lane, e)], Ds[j * FA_OTHER_T + FA_OTHER_OF(lane, e)]);
            }

            /* dV += (z keep_scale P)^T dO, dK += dS^T Q over the tile's queries. */
#pragma unroll
            for (int pk = 0; pk < PKB; pk++) {
                fa_p_op pp[STRIPS], pd[STRIPS];
#pragma unroll
                for (int st = 0; st < STRIPS; st++) {
                    fa_x_to_p(&pp[st], s[st], pk, lane);
                    fa_x_to_p(&pd[st], dp[st], pk, lane);
                }
#pragma unroll
                for (int f = 0; f < NF; f++) {
                    fa_z_op zg, zq;
                    fa_load_z(&zg, dOs, LD, pk * FA_K, f * FA_DIM_T, lane);
                    fa_load_z(&zq, Qs, LD, pk * FA_K, f * FA_DIM_T, lane);
#pragma unroll
                    for (int st = 0; st < STRIPS; st++) {
                        fa_acc_mma(&acc_v[st][f], &pp[st], &zg);
                        fa_acc_mma(&acc_k[st][f], &pd[st], &zq);
                    }
                }
            }

#ifdef DQ_ATOMIC
            /* dQ += dS K for this tile's keys: dS through local memory as
             * [query][key], then units of one m x n fragment of dQ shared
             * out over the wavefronts, added to the fp32 accumulator. */
#pragma unroll
            for (int st = 0; st < STRIPS; st++)
#pragma unroll
                for (int j = 0; j < NJB; j++)
                    fa_put_score_t(dSt, LDS_S, (warp * STRIPS + st) * FA_OWN_T, j * FA_OTHER_T, &dp[st][j], lane);
            __syncthreads();
            for (int u = warp; u < (BR / FA_M) * (HEAD_DIM / FA_N); u += WARPS) {
                const int qm = u / (HEAD_DIM / FA_N), fn = u % (HEAD_DIM / FA_N);
                fa_c c;
#pragma unroll
                for (int e = 0; e < FA_C_ELEMS; e++) c.x[e] = 0.0f;
#pragma unroll
                for (int ks = 0; ks < BC / FA_K; ks++) {
                    fa_a a;
                    fa_b bk;
                    fa_load_a(&a, dSt, LDS_S, qm * FA_M, ks * FA_K, lane);
                    fa_load_b_kn(&bk, Ks, LD, ks * FA_K, fn * FA_N, lane);
                    fa_mma(&c, &a, &bk);
                }
#pragma unroll
                for (int e = 0; e < FA_C_ELEMS; e++) {
                    const int r = qm * FA_M + FA_C_ROW(lane, e);
                    if (r < seq.len_q - q0)
                        atomicAdd(dq_acc + fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q) * HEAD_DIM +
                                      fn * FA_N + FA_C_COL(lane, e),
                                  c.x[e]);
                }
            }
#endif
            __syncthreads();
        }
    }

    /* dK (times scale) and dV leave through the K and V tiles. */
    fa_copy_wait(0);
    __syncthreads();
#pragma unroll
    for (int st = 0; st < STRIPS; st++)
#pragma unroll
        for (int f = 0; f < NF; f++) {
            fa_put_acc(Ks, LD, (warp * STRIPS + st) * FA_OWN_T, f * FA_DIM_T, &acc_k[st][f], scale, lane);
            fa_put_acc(Vs, LD, (warp * STRIPS + st) * FA_OWN_T, f * FA_DIM_T, &acc_v[st][f], 1.0f, lane);
        }
    __syncthreads();
    fa_store_rows(dk + fa_row_index(lk, b, seq.start_k, k0, hk), k_ss, Ks, BC, seq.len_k - k0, lid, FA_THREADS);
    fa_store_rows(dv + fa_row_index(lv, b, seq.start_k, k0, hk), v_ss, Vs, BC, seq.len_k - k0, lid, FA_THREADS);
}

/* ------------------------------------------------------------------------ */

#ifndef DQ_ATOMIC
FA_MMA_KERNEL(DQ_THREADS) void
fa_bwd_dq_mma(const store_t *__restrict__ q, const store_t *__restrict__ k, const store_t *__restrict__ v,
              const float *__restrict__ lse, const store_t *__restrict__ dout, const float *__restrict__ dvec,
              store_t *__restrict__ dq, FA_MMA_BWD_PARAMS) {
    __shared__ __attribute__((aligned(16))) fa_ushort smem[2 * (BR + BC) * LD];
    fa_ushort *const Qs = smem, *const dOs = smem + BR * LD, *const Ks = smem + 2 * BR * LD;
    fa_ushort *const Vs = Ks + BC * LD;

    const int lid = (int)threadIdx.x, warp = lid / FA_SG, lane = lid % FA_SG;
    const int q0 = (int)blockIdx.x * BR;
    const int h = (int)blockIdx.y, b = (int)blockIdx.z;
    const int hk = h / group;
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (q0 >= seq.len_q) return;
    FA_MMA_BWD_SETUP();
#ifdef DROPOUT
    const fa_uint bh = (fa_uint)b * (fa_uint)heads_q + (fa_uint)h;
#endif
    const int own0 = warp * FA_OWN_T; /* from q0 */

    fa_fetch_rows(Qs, q + fa_row_index(lq, b, seq.start_q, q0, h), q_ss, BR, seq.len_q - q0, lid, DQ_THREADS);
    fa_fetch_rows(dOs, dout + fa_row_index(lo, b, seq.start_q, q0, h), o_ss, BR, seq.len_q - q0, lid, DQ_THREADS);
    fa_copy_commit();
    float l2[FA_OWN_SLOTS], dd[FA_OWN_SLOTS];
#pragma unroll
    for (int sl = 0; sl < FA_OWN_SLOTS; sl++)
        fa_row_stats(lse, dvec, b, h, q0, own0 + FA_OWN_IDX(lane, sl), heads_q, seqlen_q, seq, total_q, &l2[sl],
                     &dd[sl]);

    fa_c acc[NF];
#pragma unroll
    for (int f = 0; f < NF; f++)
#pragma unroll
        for (int e = 0; e < FA_C_ELEMS; e++) acc[f].x[e] = 0.0f;

    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(mask, q0, fa_tile_last(q0, BR, seq.len_q), &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
    const store_t *const kh = k + fa_row_index(lk, b, seq.start_k, 0, hk);
    const store_t *const vh = v + fa_row_index(lv, b, seq.start_k, 0, hk);

    for (int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end); t < t_end;
         t = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end)) {
        const int k0 = t * BC;
        const int cls = fa_tile_class(mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED);
        fa_fetch_rows(Ks, kh + (fa_long)k0 * k_ss, k_ss, BC, seq.len_k - k0, lid, DQ_THREADS);
        fa_fetch_rows(Vs, vh + (fa_long)k0 * v_ss, v_ss, BC, seq.len_k - k0, lid, DQ_THREADS);
        fa_copy_commit();
        fa_copy_wait(0);
        __syncthreads();

        fa_c s[NJQ], dp[NJQ];
#pragma unroll
        for (int j = 0; j < NJQ; j++)
#pragma unroll
            for (int e = 0; e < FA_C_ELEMS; e++) s[j].x[e] = dp[j].x[e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KT; ks++) {
            fa_own_op qo, go;
            fa_load_own(&qo, Qs, LD, warp * FA_OWN_T, ks * FA_K, lane);
            fa_load_own(&go, dOs, LD, warp * FA_OWN_T, ks * FA_K, lane);
#pragma unroll
            for (int j = 0; j < NJQ; j++) {
                fa_other_op ko, vo;
                fa_load_other(&ko, Ks, LD, j * FA_OTHER_T, ks * FA_K, lane);
                fa_load_other(&vo, Vs, LD, j * FA_OTHER_T, ks * FA_K, lane);
                fa_score_mma(&s[j], &qo, &ko);
                fa_score_mma(&dp[j], &go, &vo);
            }
        }
#pragma unroll
        for (int j = 0; j < NJQ; j++)
            FA_SOFTMAX_GRAD(s[j], dp[j], own0, j * FA_OTHER_T, false, l2[FA_OWN_SLOT(e)], dd[FA_OWN_SLOT(e)]);

        /* dQ += dS K over the tile's keys. */
#pragma unroll
        for (int pk = 0; pk < PKQ; pk++) {
            fa_p_op p;
            fa_x_to_p(&p, dp, pk, lane);
#pragma unroll
            for (int f = 0; f < NF; f++) {
                fa_z_op z;
                fa_load_z(&z, Ks, LD, pk * FA_K, f * FA_DIM_T, lane);
                fa_acc_mma(&acc[f], &p, &z);
            }
        }
        __syncthreads();
    }

    fa_copy_wait(0);
    __syncthreads();
#pragma unroll
    for (int f = 0; f < NF; f++) fa_put_acc(Qs, LD, warp * FA_OWN_T, f * FA_DIM_T, &acc[f], scale, lane);
    __syncthreads();
    fa_store_rows(dq + fa_row_index(lq, b, seq.start_q, q0, h), q_ss, Qs, BR, seq.len_q - q0, lid, DQ_THREADS);
}
#endif
