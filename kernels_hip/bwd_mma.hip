/* Backward pass on matrix cores, on the fragment layer (mma_frag.h): dQ, dK,
 * dV from Q, K, V, O, L and dO, P recomputed on chip from L. Run in this
 * order:
 *
 *   fa_bwd_prep_mma    D = rowsum(dO * O), laid out as L; with DQ_ATOMIC
 *                      the fp32 dQ accumulator's rows zeroed
 *   fa_bwd_dkdv_mma    one work-group per (key tile of BC keys, kv head,
 *                      sequence): each wavefront owns STRIPS strips of
 *                      FA_OWN_T keys and keeps their dK and dV in
 *                      accumulator fragments while the work-group steps
 *                      through the query heads sharing the kv head and the
 *                      query tiles of BR rows that see the keys (GQA sums
 *                      there, no atomics). With STAGES 2 the next step's Q,
 *                      dO, L and D load while this one computes. With
 *                      DQ_ATOMIC it also adds dS K into the accumulator.
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
 * With score options s is the forward's logit (common.h fa_logit2) and,
 * with SOFTCAP, dS takes the cap's derivative (the FA_LOGITS_GRAD hooks of
 * mma_tiles.h). A row with L = -inf (no visible key) takes L = +inf here,
 * which makes its P exactly 0 instead of exp(-inf + inf). P and dS become the next
 * products' operands all at once, so their fp32 fragments die before the
 * dV and dK products (the operands take half their registers).
 *
 * Local memory (FA_LOCAL_BLOCK) of fa_bwd_dkdv_mma, exactly
 * core/planner_hip_mma.c's backward figure: K, V [BC rows]; Q, dO
 * [STAGES][BR rows] (LD 16-bit elements a row); dS as [query][key] (BC + 8
 * a row, for dQ); then L and D [STAGES][BR] fp32. fa_bwd_dq_mma's: Q, dO
 * [BR rows], K, V [BC rows]. */

#define NJB (BR / FA_OTHER_T) /* score fragments of a key strip (others: queries) */
#define PKB (BR / FA_K)       /* k-steps over queries of dV, dK */
#define NJQ (BC / FA_OTHER_T) /* score fragments of a query strip (dq kernel) */
#define PKQ (BC / FA_K)       /* k-steps over keys of dQ */
#define LDS_S (BC + 8)
#define DQ_WARPS (BR / FA_OWN_T)
#define DQ_THREADS (DQ_WARPS * FA_SG)

#ifndef STAGES
#define STAGES 1
#endif
#if STAGES != 1 && STAGES != 2
#error "bwd_mma: STAGES (query tiles in flight) must be 1 or 2"
#endif

#if BC != WARPS * STRIPS * FA_OWN_T || BR % FA_OTHER_T != 0 || BR % FA_K != 0 || BR % FA_OWN_T != 0 || \
    BC % FA_K != 0 || BR % FA_M != 0 || HEAD_DIM % FA_N != 0
#error "bwd_mma: BC must be WARPS * STRIPS * FA_OWN_T; BR and BC multiples of the fragments"
#endif
#if NJB % FA_OP_LOAD != 0 || NJQ % FA_OP_LOAD != 0 || NF % FA_OP_LOAD != 0
#error "bwd_mma: the score and accumulator fragments must come in whole loads (FA_OP_LOAD)"
#endif

#define SM_K 0
#define SM_V (SM_K + BC * LD)
#define SM_Q (SM_V + BC * LD)
#define SM_DO (SM_Q + STAGES * BR * LD)
#define SM_DS (SM_DO + STAGES * BR * LD)
#define SM_HALVES (SM_DS + BR * LDS_S)

/* dQ += dS K by units of DQ_M fragment rows of FA_M queries and DQ_UNIT
 * fragments along head_dim: each dS operand serves DQ_UNIT products, each
 * K operand DQ_M. DQ_UNIT: as many as divide head_dim while every
 * wavefront keeps a unit and a lane holds at most 16 fp32 accumulators of
 * them. DQ_M: two where the layer loads B operands in pairs (FA_NATIVE_B2:
 * the operands come through shared memory, whose bandwidth bounds these
 * products) and every wavefront still keeps a unit, else one. */
#define DQ_NT (HEAD_DIM / FA_N)
#define DQ_MT (BR / FA_M)
#if DQ_NT % 4 == 0 && DQ_MT * (DQ_NT / 4) >= WARPS && 4 * FA_C_ELEMS <= 16
#define DQ_UNIT 4
#elif DQ_NT % 2 == 0 && DQ_MT * (DQ_NT / 2) >= WARPS && 2 * FA_C_ELEMS <= 16
#define DQ_UNIT 2
#else
#define DQ_UNIT 1
#endif
#if defined(FA_NATIVE_B2) && DQ_MT % 2 == 0 && (DQ_MT / 2) * (DQ_NT / DQ_UNIT) >= WARPS
#define DQ_M 2
#else
#define DQ_M 1
#endif
#define DQ_UNITS ((DQ_MT / DQ_M) * (DQ_NT / DQ_UNIT))
/* K operands of a dQ unit loaded at once. */
#define DQ_BL (DQ_UNIT % FA_B_LOAD == 0 ? FA_B_LOAD : 1)

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
    float drop_scale, fa_uint drop_row0, fa_uint drop_col0, FA_SCORE_PARAMS

#define FA_MMA_BWD_SETUP()                                                                 \
    fa_mask mask;                                                                          \
    mask.len_q = seq.len_q;                                                                \
    mask.len_k = seq.len_k;                                                                \
    mask.window_left = window_left;                                                        \
    mask.window_right = window_right;                                                      \
    mask.block_q = block_q;                                                                \
    mask.block_k = block_k;                                                                \
    mask.block_cols = block_cols;                                                          \
    const fa_dropout drop = fa_dropout_of(drop_key0, drop_key1, drop_offset_lo, drop_threshold, drop_scale, \
                                          drop_row0, drop_col0);                           \
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

/* L in log2 units, +inf for rows without keys (L = -inf), from L as the
 * forward stored it. */
FA_FN float fa_l2_of(float L) { return L == -FA_INF ? FA_INF : L * FA_LOG2E; }

/* P and dS of a score fragment (s: scores, dp: dO.v) in place: on return s
 * holds z keep_scale P, dp holds dS. The fragment's own rows start at own0
 * and its other rows at oth0 (queries and keys as keys_own says; offsets
 * from the tile's q0 and k0); l2 and dd give L (log2) and D of element
 * e's query. */
#define FA_SOFTMAX_GRAD(S, DP, OWN0, OTH0, KEYS_OWN, L2_OF, D_OF)                            \
    do {                                                                                     \
        FA_LOGITS_GRAD(S, OWN0, OTH0, KEYS_OWN);                                             \
        if (cls == FA_TILE_PARTIAL)                                                          \
            fa_frag_mask(&(S), mask, block_mask, q0, k0, (OWN0), (OTH0), (KEYS_OWN), -FA_INF, lane); \
        FA_KEEP_BITS(OWN0, OTH0, KEYS_OWN);                                                  \
        _Pragma("unroll") for (int e = 0; e < FA_C_ELEMS; e++) {                             \
            const float p_ = fa_exp2(FA_LOGIT2_OF((S).x[e]) - (L2_OF));                     \
            const float z_ = FA_KEEP(e) ? drop_scale : 0.0f;                                 \
            (DP).x[e] = FA_DS_CAP(p_ * ((DP).x[e] * z_ - (D_OF)), e);                        \
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
/* Adds a fragment of dQ (queries m0.., head dimensions n0.. of the tile at
 * q0) to the fp32 accumulator; rows from `valid` on are past the
 * sequence. The neighbouring dimensions a lane holds go as pairs. */
FA_FN void fa_add_dq(float *dq_acc, const fa_c *c, int m0, int n0, int valid, int b, int h, int q0, int heads_q,
                     int seqlen_q, fa_long start_q, fa_long total_q, int lane) {
#if FA_C_RUN_N >= 2
#pragma unroll
    for (int e = 0; e < FA_C_ELEMS; e += 2) {
        const int r = m0 + FA_C_ROW(lane, e);
        if (r < valid)
            fa_atomic_add2(dq_acc + fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, start_q, total_q) * HEAD_DIM + n0 +
                               FA_C_COL(lane, e),
                           c->x[e], c->x[e + 1]);
    }
#else
#pragma unroll
    for (int e = 0; e < FA_C_ELEMS; e++) {
        const int r = m0 + FA_C_ROW(lane, e);
        if (r < valid)
            fa_atomic_add(dq_acc + fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, start_q, total_q) * HEAD_DIM + n0 +
                              FA_C_COL(lane, e),
                          c->x[e]);
    }
#endif
}

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

/* acc[st][j] += the wavefront's key strip st (from key row own0 of kt, K
 * or V) x the tile's query rows j (of qt, Q or dO) over head_dim. One
 * product after the other: only one product's operands are live at a
 * time (registers are this kernel's limit). */
FA_FN void fa_keys_by_queries(fa_c (*acc)[NJB], const fa_ushort *kt, const fa_ushort *qt, int own0, int lane) {
#pragma unroll
    for (int ks = 0; ks < KT; ks++) {
        fa_own_op ko[STRIPS];
#pragma unroll
        for (int st = 0; st < STRIPS; st++) fa_load_own(&ko[st], kt, LD, own0 + st * FA_OWN_T, ks * FA_K, lane);
#pragma unroll
        for (int j = 0; j < NJB; j += FA_OP_LOAD) {
            fa_other_op qo[FA_OP_LOAD];
            fa_load_other_n(qo, qt, LD, j * FA_OTHER_T, ks * FA_K, lane);
#pragma unroll
            for (int i = 0; i < FA_OP_LOAD; i++)
#pragma unroll
                for (int st = 0; st < STRIPS; st++) fa_score_mma(&acc[st][j + i], &ko[st], &qo[i]);
        }
    }
}

FA_MMA_KERNEL(WG_SIZE) void fa_bwd_dkdv_mma(const store_t *__restrict__ q, const store_t *__restrict__ k,
                               const store_t *__restrict__ v, const float *__restrict__ lse,
                               const store_t *__restrict__ dout, const float *__restrict__ dvec,
                               store_t *__restrict__ dk, store_t *__restrict__ dv, float *__restrict__ dq_acc,
                               FA_MMA_BWD_PARAMS) {
    FA_LOCAL_BLOCK(smem);
    fa_ushort *const Ks = smem + SM_K, *const Vs = smem + SM_V;
    fa_ushort *const dSt = smem + SM_DS;
    float *const Ls = (float *)(smem + SM_HALVES), *const Ds = Ls + STAGES * BR;

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

    /* The steps, in order: the query heads sharing the kv head, and for
     * each the query tiles that see the keys (the query range and the tile
     * map do not depend on the head). A step's Q and dO rows go into
     * buffer BUF with their L and D, all by asynchronous copies (L as the
     * forward stored it: a load to convert it here would stall the
     * work-group at every step; fa_l2_of converts at use). Rows past the
     * sequence read zeros: their tiles are partial, the masks hide them. */
#define FA_LOAD_STEP(HH, T, BUF)                                                                           \
    do {                                                                                                   \
        const int h_ = hk * group + (HH), q0_ = (T) * BR;                                                   \
        fa_fetch_rows(smem + SM_Q + (BUF) * BR * LD, q + fa_row_index(lq, b, seq.start_q, q0_, h_), q_ss,  \
                      BR, seq.len_q - q0_, lid, FA_THREADS);                                                \
        fa_fetch_rows(smem + SM_DO + (BUF) * BR * LD, dout + fa_row_index(lo, b, seq.start_q, q0_, h_),    \
                      o_ss, BR, seq.len_q - q0_, lid, FA_THREADS);                                          \
        for (int r_ = lid; r_ < BR; r_ += FA_THREADS) {                                                    \
            const int ok_ = r_ < seq.len_q - q0_;                                                          \
            const fa_long i_ = ok_ ? fa_lse_index(b, h_, q0_ + r_, heads_q, seqlen_q, seq.start_q, total_q) : 0; \
            fa_copy4(&Ls[(BUF) * BR + r_], lse + i_, ok_);                                                 \
            fa_copy4(&Ds[(BUF) * BR + r_], dvec + i_, ok_);                                                \
        }                                                                                                  \
    } while (0)

    int hh = 0, t = fa_next_query_tile(tile_map, tile_cols, k0, t_begin, t_end);
    if (t >= t_end) hh = group;
    if (hh < group) FA_LOAD_STEP(hh, t, 0);
    fa_copy_commit();

    int buf = 0;
    while (hh < group) {
        const int h = hk * group + hh, q0 = t * BR;
        const fa_score sc = fa_score_of(scale_log2, FA_SCORE_ARGS, b, h, seq);
        t = fa_next_query_tile(tile_map, tile_cols, k0, t + 1, t_end);
        if (t >= t_end) {
            hh++;
            t = fa_next_query_tile(tile_map, tile_cols, k0, t_begin, t_end);
        }
        const bool more = hh < group;
#if STAGES == 2
        /* The other buffer was last read before the previous step's closing
         * barrier. */
        if (more) FA_LOAD_STEP(hh, t, buf ^ 1);
        fa_copy_commit();
        fa_copy_wait(1);
#else
        fa_copy_wait(0);
#endif
        __syncthreads();
#ifdef DROPOUT
        const fa_uint bh = (fa_uint)b * (fa_uint)heads_q + (fa_uint)h;
#endif
        const int cls = fa_tile_class(mask, tile_map, tile_cols, q0, k0, FA_ROWS_FEED_KEYS);
        const fa_ushort *const Qs = smem + SM_Q + buf * BR * LD, *const dOs = smem + SM_DO + buf * BR * LD;
        const float *const Lb = Ls + buf * BR, *const Db = Ds + buf * BR;

        /* S (own: keys, other: queries) and dP, over head_dim. */
        fa_c s[STRIPS][NJB], dp[STRIPS][NJB];
#pragma unroll
        for (int st = 0; st < STRIPS; st++)
#pragma unroll
            for (int j = 0; j < NJB; j++)
#pragma unroll
                for (int e = 0; e < FA_C_ELEMS; e++) s[st][j].x[e] = dp[st][j].x[e] = 0.0f;
        fa_keys_by_queries(s, Ks, Qs, warp * STRIPS * FA_OWN_T, lane);
        fa_keys_by_queries(dp, Vs, dOs, warp * STRIPS * FA_OWN_T, lane);
#pragma unroll
        for (int st = 0; st < STRIPS; st++) {
            const int own0 = (warp * STRIPS + st) * FA_OWN_T; /* from k0 */
#pragma unroll
            for (int j = 0; j < NJB; j++)
                FA_SOFTMAX_GRAD(s[st][j], dp[st][j], own0, j * FA_OTHER_T, true,
                                fa_l2_of(Lb[j * FA_OTHER_T + FA_OTHER_OF(lane, e)]),
                                Db[j * FA_OTHER_T + FA_OTHER_OF(lane, e)]);
        }

#ifdef DQ_ATOMIC
        /* dS into local memory as [query][key] for dQ below, before its
         * fp32 fragments die (the previous step's readers are past its
         * closing barrier). */
#pragma unroll
        for (int st = 0; st < STRIPS; st++)
#pragma unroll
            for (int j = 0; j < NJB; j++)
                fa_put_score_t(dSt, LDS_S, (warp * STRIPS + st) * FA_OWN_T, j * FA_OTHER_T, &dp[st][j], lane);
#endif
        fa_p_op pp[STRIPS][PKB], pd[STRIPS][PKB];
#pragma unroll
        for (int st = 0; st < STRIPS; st++)
#pragma unroll
            for (int pk = 0; pk < PKB; pk++) {
                fa_x_to_p(&pp[st][pk], s[st], pk, lane);
                fa_x_to_p(&pd[st][pk], dp[st], pk, lane);
            }

        /* dV += (z keep_scale P)^T dO, dK += dS^T Q over the tile's queries. */
#pragma unroll
        for (int pk = 0; pk < PKB; pk++)
#pragma unroll
            for (int f = 0; f < NF; f += FA_OP_LOAD) {
                fa_z_op zg[FA_OP_LOAD], zq[FA_OP_LOAD];
                fa_load_z_n(zg, dOs, LD, pk * FA_K, f * FA_DIM_T, lane);
                fa_load_z_n(zq, Qs, LD, pk * FA_K, f * FA_DIM_T, lane);
#pragma unroll
                for (int i = 0; i < FA_OP_LOAD; i++)
#pragma unroll
                    for (int st = 0; st < STRIPS; st++) {
                        fa_acc_mma(&acc_v[st][f + i], &pp[st][pk], &zg[i]);
                        fa_acc_mma(&acc_k[st][f + i], &pd[st][pk], &zq[i]);
                    }
            }

#ifdef DQ_ATOMIC
        /* dQ += dS K for this tile's keys: units of DQ_UNIT fragments of dQ
         * shared out over the wavefronts, added to the fp32 accumulator. */
        __syncthreads();
        for (int u = warp; u < DQ_UNITS; u += WARPS) {
            const int qm = u / (DQ_NT / DQ_UNIT) * DQ_M, fn0 = (u % (DQ_NT / DQ_UNIT)) * DQ_UNIT;
            fa_c c[DQ_M][DQ_UNIT];
#pragma unroll
            for (int m = 0; m < DQ_M; m++)
#pragma unroll
                for (int n = 0; n < DQ_UNIT; n++)
#pragma unroll
                    for (int e = 0; e < FA_C_ELEMS; e++) c[m][n].x[e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < BC / FA_K; ks++) {
                fa_a a[DQ_M];
#pragma unroll
                for (int m = 0; m < DQ_M; m++) fa_load_a(&a[m], dSt, LDS_S, (qm + m) * FA_M, ks * FA_K, lane);
#pragma unroll
                for (int n = 0; n < DQ_UNIT; n += DQ_BL) {
                    fa_b bk[DQ_BL];
#if DQ_BL == 2
                    fa_load_b_kn_n(bk, Ks, LD, ks * FA_K, (fn0 + n) * FA_N, lane);
#else
                    fa_load_b_kn(bk, Ks, LD, ks * FA_K, (fn0 + n) * FA_N, lane);
#endif
#pragma unroll
                    for (int i = 0; i < DQ_BL; i++)
#pragma unroll
                        for (int m = 0; m < DQ_M; m++) fa_mma(&c[m][n + i], &a[m], &bk[i]);
                }
            }
#pragma unroll
            for (int m = 0; m < DQ_M; m++)
#pragma unroll
                for (int n = 0; n < DQ_UNIT; n++)
                    fa_add_dq(dq_acc, &c[m][n], (qm + m) * FA_M, (fn0 + n) * FA_N, seq.len_q - q0, b, h, q0, heads_q,
                              seqlen_q, seq.start_q, total_q, lane);
        }
#endif
        /* This step's buffers may be refilled. */
        __syncthreads();
#if STAGES == 2
        buf ^= 1;
#else
        if (more) FA_LOAD_STEP(hh, t, 0);
        fa_copy_commit();
#endif
    }
#undef FA_LOAD_STEP

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
    FA_LOCAL_BLOCK(smem);
    fa_ushort *const Qs = smem, *const dOs = smem + BR * LD, *const Ks = smem + 2 * BR * LD;
    fa_ushort *const Vs = Ks + BC * LD;

    const int lid = (int)threadIdx.x, warp = lid / FA_SG, lane = lid % FA_SG;
#ifdef CAUSAL
    /* The last query tiles see the most keys: start them first. */
    const int q0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * BR;
#else
    const int q0 = (int)blockIdx.x * BR;
#endif
    const int h = (int)blockIdx.y, b = (int)blockIdx.z;
    const int hk = h / group;
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (q0 >= seq.len_q) return;
    FA_MMA_BWD_SETUP();
    const fa_score sc = fa_score_of(scale_log2, FA_SCORE_ARGS, b, h, seq);
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
            for (int j = 0; j < NJQ; j += FA_OP_LOAD) {
                fa_other_op ko[FA_OP_LOAD], vo[FA_OP_LOAD];
                fa_load_other_n(ko, Ks, LD, j * FA_OTHER_T, ks * FA_K, lane);
                fa_load_other_n(vo, Vs, LD, j * FA_OTHER_T, ks * FA_K, lane);
#pragma unroll
                for (int i = 0; i < FA_OP_LOAD; i++) {
                    fa_score_mma(&s[j + i], &qo, &ko[i]);
                    fa_score_mma(&dp[j + i], &go, &vo[i]);
                }
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
            for (int f = 0; f < NF; f += FA_OP_LOAD) {
                fa_z_op z[FA_OP_LOAD];
                fa_load_z_n(z, Ks, LD, pk * FA_K, f * FA_DIM_T, lane);
#pragma unroll
                for (int i = 0; i < FA_OP_LOAD; i++) fa_acc_mma(&acc[f + i], &p, &z[i]);
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
