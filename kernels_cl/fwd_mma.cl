/* Forward pass on matrix units (FlashAttention-2 work partitioning): one
 * work-group per (query tile of BR rows, query head, sequence [, key
 * split]). Each sub-group owns MT strips of FA_M query rows and keeps their
 * scores, running maxima, row sums and output accumulators in fragments, so
 * the softmax exchanges only between the lanes of a row (fa_rows_max). K
 * and V tiles pass through local memory, one buffer each: V's copy runs
 * while S = Q K^T is computed, the next K's while O += P V is (asynchronous
 * where the layer's fa_copy16 is: cp.async on NVIDIA). O is rescaled once
 * per key tile and normalised once at the end.
 *
 * Local memory, exactly core/planner_cl_mma.c's forward figure (16-bit
 * elements, tiles as mma_common.h lays them out):
 *   Q [BR][LDS], K [BC][LDS], V [BC][LDS]; with QREG, Q's tile overlaps K
 *   and V (its fragments are read into registers before they load);
 *   P [BR][BC + 8] where the layout takes A operands only from memory
 *   (!FA_C2A_REGS); the fragment layer's scratch (emulated layouts).
 * At the end the start of it holds O, for 16-byte stores.
 *
 * Softmax in base 2, the row maximum m kept in score units: every
 * probability is one exp2 of s * scale log2 e - m * scale log2 e (with
 * score options the scores are base-2 logits and that factor is 1,
 * common.h). Once the
 * maxima settle most key tiles move none of a lane's rows: their factor is
 * then exactly 1 and the rescale of O is left out.
 *
 * FA_QREG_ALWAYS (a tuning option, FLASHATTN_OPENCL_OPTIONS): Q's fragments
 * in registers even where its tile fits beside K and V, trading registers
 * for the shared-memory reads of Q; the kernel then declares less local
 * memory than the plan budgets.
 *
 * With SPLITK the key tiles are cut into num_splits parts as in fwd.cl;
 * each work-group writes its normalised partial output and log-sum-exp in
 * fp32 for fa_splitk_merge (splitk.cl). */

#if defined(FA_QREG_ALWAYS) && !defined(QREG)
#define QREG
#endif

#define MT (BR / (WARPS * FA_M))
#define NT (BC / FA_N)
#define DT (D_PAD / FA_N)
#define KS (D_PAD / FA_K)
#define KP (BC / FA_K)

#if BR % (WARPS * FA_M) != 0 || BC % FA_N != 0 || BC % FA_K != 0
#error "fwd_mma: BR must be a multiple of WARPS * FA_M, BC of FA_N and FA_K"
#endif

#define Q_ELEMS (BR * LDS)
#define KV_ELEMS (BC * LDS)
#ifdef QREG
#define MAIN_ELEMS FA_MMA_MAX(Q_ELEMS, 2 * KV_ELEMS)
#define K_AT 0
#else
#define MAIN_ELEMS (Q_ELEMS + 2 * KV_ELEMS)
#define K_AT Q_ELEMS
#endif
#if FA_C2A_REGS
#define P_ELEMS 0
#else
#define LDP (BC + 8)
#define P_ELEMS (BR * LDP)
#endif

/* FA_FWD_WGMMA (the host sets it with FA_NV_SM90A on NVIDIA's sm_90):
 * S = Q K^T and O += P V as Hopper's warpgroup products (wgmma_nvidia.h)
 * on the 64 x 64 tile of four sub-groups, the work-group one warpgroup
 * whose sub-groups own 16 queries each, as the instruction's 64 rows give
 * them out. Q's and P's A fragments come from registers (Q's loaded once,
 * as QREG's), K read K-major and V N-major from swizzled tiles, each read
 * once a work-group instead of once a sub-group. The tiles start on
 * 1024-byte boundaries (the swizzle's period) within the planner's padded
 * ones; elsewhere, and with FA_FWD_NO_WGMMA (a tuning option, to time the
 * mma.sync products beside it), the option is left aside. */
#if defined(FA_FWD_WGMMA) &&                                                                                 \
    (!defined(FA_MMA_NVIDIA) || defined(FA_MMA_EMULATE) || !defined(FA_NV_SM90A) || defined(FA_FWD_NO_WGMMA) || \
     (HEAD_DIM != 64 && HEAD_DIM != 128) || D_PAD != HEAD_DIM || BR != 64 || BC != 64 || WARPS != 4 ||          \
     (FA_THREADS / D_CHUNKS) % 8 != 0 || (K_AT * 2) % 1024 != 0 || (KV_ELEMS * 2) % 1024 != 0)
#undef FA_FWD_WGMMA
#endif
#ifdef FA_FWD_WGMMA
#define FA_SMEM_ALIGN 1024
#define FA_QA /* Q's fragments in registers */
#define FA_FETCH_KV fa_fetch_rows_sw

/* acc (this sub-group's 16 queries x the tile's 64 keys) += Q K^T: Q's A
 * fragments from registers (a[ks]), K from its swizzled tile. */
FA_WG_RS_OVER_DIMS(fa_wg_queries_by_keys, FA_WG_RS_PAIR32, FA_WG_ACC32, BC)

/* acc (this sub-group's 16 queries x HEAD_DIM) += P V: P's A fragments
 * from registers (a[kp]), V's swizzled tile. */
FA_WG_RS_OVER_ROWS(fa_wg_probs_by_values, KP, BC)
#else
#define FA_SMEM_ALIGN 16
#ifdef QREG
#define FA_QA
#endif
#define FA_FETCH_KV fa_fetch_rows
#endif

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) FA_KERNEL_ATTRS void
fa_forward(__global const ushort *q, __global const ushort *k, __global const ushort *v,
           __global ushort *o, __global float *lse, FA_FWD_PARAMS) {
    __local ushort smem[MAIN_ELEMS + P_ELEMS] __attribute__((aligned(FA_SMEM_ALIGN)));
    FA_FRAG_SCRATCH(WARPS);
    __local ushort *const Qs = smem;
    __local ushort *const Ks = smem + K_AT;
    __local ushort *const Vs = Ks + KV_ELEMS;
#if !FA_C2A_REGS
    __local ushort *const Ps = smem + MAIN_ELEMS;
#endif

    const int lid = get_local_id(0);
    const fa_frag_ctx fc = FA_FRAG_CTX(lid);
    const int q0 = FA_QUERY_TILE() * BR;
    const int h = get_group_id(1);
    const int b = get_group_id(2) / num_splits;
    const int split = get_group_id(2) % num_splits;
    const int hk = h / group;
    (void)split;
    (void)part_o;
    (void)part_l;

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
    __global const ushort *const kg = k + fa_row_index(lk, b, seq.start_k, 0, hk);
    __global const ushort *const vg = v + fa_row_index(lv, b, seq.start_k, 0, hk);
    const int row_base = fc.sg * MT * FA_M; /* this sub-group's first row of the tile */
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
    const uint bh = (uint)b * (uint)heads_q + (uint)h;
#endif

    /* Key tiles this query tile can see, then this split's share of them. */
    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(&mask, q0, q0 + min(BR, seq.len_q - q0) - 1, &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
#ifdef SPLITK
    {
        const int per = (t_end - t_begin + num_splits - 1) / num_splits;
        const int s_begin = min(t_end, t_begin + split * per);
        t_end = min(t_end, s_begin + per);
        t_begin = s_begin;
    }
#endif

    fa_c oacc[MT][DT];
    float m_run[MT][FA_C_ROWS], l_run[MT][FA_C_ROWS];
    FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++) {
        FA_MMA_UNROLL for (int j = 0; j < DT; j++)
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) oacc[mt][j].x[e] = 0.0f;
        FA_MMA_UNROLL for (int s = 0; s < FA_C_ROWS; s++) {
            m_run[mt][s] = -INFINITY;
            l_run[mt][s] = 0.0f;
        }
    }

    fa_fetch_rows(Qs, q + fa_row_index(lq, b, seq.start_q, q0, h), q_ss, BR, seq.len_q - q0, lid);
#ifdef FA_QA
    /* Q's fragments once; with QREG its tile is K's and V's from here on. */
    fa_a qa[MT][KS];
    fa_copy_wait();
    barrier(CLK_LOCAL_MEM_FENCE);
    FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
        FA_MMA_UNROLL for (int ks = 0; ks < KS; ks++) fa_load_a(&qa[mt][ks], Qs, LDS, row_base + mt * FA_M, ks * FA_K, fc);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif

    int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end);
    if (t < t_end) FA_FETCH_KV(Ks, kg + (long)t * BC * k_ss, k_ss, BC, seq.len_k - t * BC, lid);
    while (t < t_end) {
        const int k0 = t * BC;
        const int t_next = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end);
        fa_copy_wait();
#ifdef FA_FWD_WGMMA
        fa_wg_fence();
#endif
        barrier(CLK_LOCAL_MEM_FENCE); /* K is in; every sub-group is done with V (and P) */
        FA_FETCH_KV(Vs, vg + (long)k0 * v_ss, v_ss, BC, seq.len_k - k0, lid);

        /* S = Q K^T */
        fa_c s[MT][NT];
        FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
            FA_MMA_UNROLL for (int j = 0; j < NT; j++)
                FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) s[mt][j].x[e] = 0.0f;
#ifdef FA_FWD_WGMMA
        fa_wg_queries_by_keys(s[0], qa[0], Ks);
#else
        FA_MMA_UNROLL for (int ks = 0; ks < KS; ks++) {
#ifdef QREG
#define A_Q(mt) qa[mt][ks]
#else
            fa_a a[MT];
            FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++) fa_load_a(&a[mt], Qs, LDS, row_base + mt * FA_M, ks * FA_K, fc);
#define A_Q(mt) a[mt]
#endif
            FA_MMA_UNROLL for (int j = 0; j < NT; j += FA_BP) {
                fa_b bk[FA_BP];
                fa_load_bp_nk(bk, j + 1 < NT, Ks, LDS, j * FA_N, ks * FA_K, fc);
                FA_MMA_UNROLL for (int n = 0; n < FA_BP; n++)
                    if (j + n < NT) FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++) fa_mma(&s[mt][j + n], &A_Q(mt), &bk[n], fc);
            }
#undef A_Q
        }
#endif

#ifdef FA_SCORE_OPTIONS
        /* Score options: base-2 logits from here on (the host passes
         * scale_log2 = 1 with them; common.h). */
        FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
            FA_MMA_UNROLL for (int j = 0; j < NT; j++) {
                fa_c unused;
                fa_frag_logit2(&s[mt][j], &unused, &sc, q0, row_base + mt * FA_M, k0, j * FA_N, 0, fc);
            }
#endif

        /* Masks: whole tiles test no element. */
        if (fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED) == FA_TILE_PARTIAL) {
            FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
                FA_MMA_UNROLL for (int j = 0; j < NT; j++)
                    fa_frag_mask(&s[mt][j], &mask, block_mask, q0, row_base + mt * FA_M, k0, j * FA_N, 0, -INFINITY,
                                 fc);
        }

        /* Online softmax: new maxima over the rows' lanes, one rescale of O
         * and l. l sums this lane's columns only (fa_rows_sum at the end). */
        float alpha[MT][FA_C_ROWS];
        int moved = 0;
        FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++) {
            float mx[FA_C_ROWS], m_use[FA_C_ROWS], sum[FA_C_ROWS];
            FA_MMA_UNROLL for (int r = 0; r < FA_C_ROWS; r++) {
                mx[r] = m_run[mt][r];
                sum[r] = 0.0f;
            }
            FA_MMA_UNROLL for (int j = 0; j < NT; j++)
                FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++)
                    mx[FA_C_SLOT(e)] = fmax(mx[FA_C_SLOT(e)], s[mt][j].x[e]);
            fa_rows_max(mx, fc);
            /* A row that has seen no visible key keeps m = -inf and
             * exponentiates against 0 instead (no inf - inf). */
            FA_MMA_UNROLL for (int r = 0; r < FA_C_ROWS; r++) {
                m_use[r] = mx[r] == -INFINITY ? 0.0f : mx[r] * scale_log2;
                alpha[mt][r] = fa_exp2(m_run[mt][r] * scale_log2 - m_use[r]);
                /* Whether the maximum moved, from the maxima: where it stayed
                 * the product may contract into an FMA that leaves alpha a
                 * rounding from 1, and tested for 1 every tile would rescale
                 * O (which may leave out a factor within a rounding of 1). */
                moved |= mx[r] != m_run[mt][r];
                m_run[mt][r] = mx[r];
            }
            FA_MMA_UNROLL for (int j = 0; j < NT; j++)
                FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
                    const float p = fa_exp2(fma(s[mt][j].x[e], scale_log2, -m_use[FA_C_SLOT(e)]));
                    s[mt][j].x[e] = p;
                    sum[FA_C_SLOT(e)] += p;
                }
            FA_MMA_UNROLL for (int r = 0; r < FA_C_ROWS; r++) l_run[mt][r] = l_run[mt][r] * alpha[mt][r] + sum[r];
        }
        if (moved)
            FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
                FA_MMA_UNROLL for (int j = 0; j < DT; j++)
                    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) oacc[mt][j].x[e] *= alpha[mt][FA_C_SLOT(e)];

#ifdef DROPOUT
        /* The row sums above have P before dropout; O takes the kept ones. */
        FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
            FA_MMA_UNROLL for (int j = 0; j < NT; j++) {
                const uint keep =
                    fa_frag_keep(&drop, bh, (uint)q0 + (uint)(row_base + mt * FA_M), (uint)k0 + (uint)(j * FA_N), 0, fc);
                FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++)
                    if (!(keep >> e & 1u)) s[mt][j].x[e] = 0.0f;
            }
#endif

        /* O += P V, P as the A operand: from registers where the layout
         * allows, else through local memory. */
#if FA_C2A_REGS
        fa_a pa[MT][KP];
        FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
            FA_MMA_UNROLL for (int kp = 0; kp < KP; kp++) fa_c_to_a(&pa[mt][kp], s[mt], kp, fc);
#else
        FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
            FA_MMA_UNROLL for (int j = 0; j < NT; j++)
                fa_put_c(Ps, LDP, row_base + mt * FA_M, j * FA_N, &s[mt][j], 1.0f, fc);
#endif
        fa_copy_wait();
#ifdef FA_FWD_WGMMA
        fa_wg_fence();
#endif
        barrier(CLK_LOCAL_MEM_FENCE); /* V (and P) are in; every sub-group is done with K */
        if (t_next < t_end) FA_FETCH_KV(Ks, kg + (long)t_next * BC * k_ss, k_ss, BC, seq.len_k - t_next * BC, lid);
#ifdef FA_FWD_WGMMA
        fa_wg_probs_by_values(oacc[0], pa[0], Vs);
#else
        FA_MMA_UNROLL for (int kp = 0; kp < KP; kp++) {
#if FA_C2A_REGS
#define A_P(mt) pa[mt][kp]
#else
            fa_a pa[MT];
            FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++) fa_load_a(&pa[mt], Ps, LDP, row_base + mt * FA_M, kp * FA_K, fc);
#define A_P(mt) pa[mt]
#endif
            FA_MMA_UNROLL for (int j = 0; j < DT; j += FA_BP) {
                fa_b bv[FA_BP];
                fa_load_bp_kn(bv, j + 1 < DT, Vs, LDS, kp * FA_K, j * FA_N, fc);
                FA_MMA_UNROLL for (int n = 0; n < FA_BP; n++)
                    if (j + n < DT) FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++) fa_mma(&oacc[mt][j + n], &A_P(mt), &bv[n], fc);
            }
#undef A_P
        }
#endif
        t = t_next;
    }
    fa_copy_wait();
    barrier(CLK_LOCAL_MEM_FENCE); /* every sub-group is done with the tiles; no copy is in flight */

    /* Normalise once; a row the masks leave no key gives O = 0 (whatever
     * 0 * NaN its accumulator met) and L = -inf (fa_row_sees_key). */
    FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++) {
        fa_rows_sum(l_run[mt], fc);
        float inv[FA_C_ROWS];
        FA_MMA_UNROLL for (int r = 0; r < FA_C_ROWS; r++) {
            const float l = l_run[mt][r], m = m_run[mt][r];
            const int row = row_base + mt * FA_M + FA_C_SLOT_ROW(fc.lane, r);
            const int masked = m == -INFINITY && !fa_row_sees_key(&mask, block_mask, q0, row);
            inv[r] = masked ? 0.0f : drop_scale / l;
            const float lse_r = masked ? -INFINITY : fa_row_lse(m * scale_log2, l);
            if ((fc.lane & FA_RED_ALL) == 0 && row < seq.len_q - q0) {
#ifdef SPLITK
                part_l[(long)(split * heads_q + h) * total_q + seq.start_q + q0 + row] = lse_r;
#else
                lse[fa_lse_index(b, h, q0 + row, heads_q, seqlen_q, seq.start_q, total_q)] = lse_r;
#endif
            }
        }
        /* inv = 0 marks a masked row: 0, not 0 times what the accumulator met. */
        FA_MMA_UNROLL for (int j = 0; j < DT; j++)
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
                const float f = inv[FA_C_SLOT(e)];
                oacc[mt][j].x[e] = f == 0.0f ? 0.0f : oacc[mt][j].x[e] * f;
            }
    }
#ifdef SPLITK
    /* fp32 partial rows, element by element. */
    FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
        FA_MMA_UNROLL for (int j = 0; j < DT; j++)
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
                const int row = row_base + mt * FA_M + FA_C_ROW(fc.lane, e), x = j * FA_N + FA_C_COL(fc.lane, e);
                if (row < seq.len_q - q0 && x < HEAD_DIM)
                    part_o[((long)(split * heads_q + h) * total_q + seq.start_q + q0 + row) * HEAD_DIM + x] =
                        oacc[mt][j].x[e];
            }
#else
    /* O through local memory (Q's tile, free since the last barrier), then
     * 16 bytes a store. */
    FA_MMA_UNROLL for (int mt = 0; mt < MT; mt++)
        FA_MMA_UNROLL for (int j = 0; j < DT; j++) fa_put_c(Qs, LDS, row_base + mt * FA_M, j * FA_N, &oacc[mt][j], 1.0f, fc);
    barrier(CLK_LOCAL_MEM_FENCE);
    fa_store_rows(o + fa_row_index(lo, b, seq.start_q, q0, h), o_ss, Qs, BR, seq.len_q - q0, lid);
#endif
}
