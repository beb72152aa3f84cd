/* Backward pass on matrix units (FlashAttention-2): dQ, dK, dV from Q, K,
 * V, O, L and dO, P recomputed from L. Built after bwd_common.cl (its
 * fa_bwd_dot runs first) as one of two programs:
 *
 *   fa_bwd_dkdv  one work-group per (key tile of BC keys, kv head,
 *                sequence); K and V stay in local memory while it loops
 *                over the query heads that share the kv head and the query
 *                tiles of BR rows that see the keys. Each sub-group owns KT
 *                strips of FA_M keys and keeps their dK and dV in fragments
 *                (GQA sums there, no atomics). With DQ_ATOMIC it also adds
 *                dS K into the fp32 dQ accumulator, and bwd_common.cl's
 *                fa_bwd_dq_convert finishes dQ.
 *   fa_bwd_dq    (FA_BWD_DQ, deterministic mode) one work-group per (query
 *                tile of BR rows, query head, sequence) of WARPS sub-groups,
 *                one strip of FA_M queries each, looping over key tiles of
 *                BC with P and dS recomputed; every sum has a fixed order.
 *
 * The key-side kernel computes the transposed products, so a sub-group that
 * owns a key strip holds S^T and dP^T as accumulators and feeds them back
 * as A operands:
 *   S^T = K Q^T,  dP^T = V dO^T,  P = exp2(S^T scale log2 e - L log2 e),
 *   dS = P (z keep_scale dP - D),  dV += (z keep_scale P)^T dO,  dK += dS^T Q
 * (z the dropout keep bit). A row with L = -inf (no visible key) takes
 * L = +inf, which makes its P exactly 0; hidden elements are set to 0, not
 * multiplied by a mask. Tiles with rows past the sequence count as partial
 * in fa_bwd_dkdv (FA_ROWS_FEED_KEYS): their zero queries would otherwise
 * add 0 * inf to a key's dK and dV.
 *
 * Local memory, exactly core/planner_cl_mma.c's backward figures (16-bit
 * tiles as mma_common.h lays them out):
 *   fa_bwd_dkdv  K, V [BC][LDS]; Q, dO [BR][LDS]; with DQ_ATOMIC dS
 *                [BR][BC + 8]; without FA_C2A_REGS P^T and dS^T
 *                [BC][BR + 8]; L and D [BR] in fp32
 *   fa_bwd_dq    Q, dO [BR][LDS]; K, V [BC][LDS]; without FA_C2A_REGS dS
 *                [BR][BC + 8]
 * and the fragment layer's scratch (emulated layouts). */

#define DT (D_PAD / FA_N)
#define KS (D_PAD / FA_K)
#define LDD (BC + 8)

#ifndef FA_BWD_DQ

#define KT (BC / (WARPS * FA_M))
#define NQ (BR / FA_N)
#define KQ (BR / FA_K)
#define LDT (BR + 8)

#if BC % (WARPS * FA_M) != 0 || BR % FA_N != 0 || BR % FA_K != 0
#error "bwd_mma: BC must be a multiple of WARPS * FA_M, BR of FA_N and FA_K"
#endif

#ifdef DQ_ATOMIC
#define DS_ELEMS (BR * LDD)
#else
#define DS_ELEMS 0
#endif
#if FA_C2A_REGS
#define T_ELEMS 0
#else
#define T_ELEMS (2 * BC * LDT)
#endif

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) FA_KERNEL_ATTRS void
fa_bwd_dkdv(__global const ushort *q, __global const ushort *k, __global const ushort *v,
            __global const float *lse, __global const ushort *dout, __global const float *dvec,
            __global ushort *dk, __global ushort *dv, FA_BWD_PARAMS, __global float *dq_acc) {
    __local ushort smem[2 * BC * LDS + 2 * BR * LDS + DS_ELEMS + T_ELEMS] __attribute__((aligned(16)));
    __local float Ls[BR], Ds[BR];
    FA_FRAG_SCRATCH(WARPS);
    __local ushort *const Ks = smem;
    __local ushort *const Vs = Ks + BC * LDS;
    __local ushort *const Qs = Vs + BC * LDS;
    __local ushort *const dOs = Qs + BR * LDS;
#ifdef DQ_ATOMIC
    __local ushort *const dSs = dOs + BR * LDS; /* dS: queries by keys */
#endif
#if !FA_C2A_REGS
    __local ushort *const PTs = dOs + BR * LDS + DS_ELEMS; /* P^T, then dS^T: keys by queries */
    __local ushort *const dSTs = PTs + BC * LDT;
#endif

    const int lid = get_local_id(0);
    const fa_frag_ctx fc = FA_FRAG_CTX(lid);
    const int k0 = get_group_id(0) * BC;
    const int hk = get_group_id(1);
    const int b = get_group_id(2);
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (k0 >= seq.len_k) return;
    FA_BWD_SETUP();
    (void)drop;
    (void)dq_acc;
    const int key_base = fc.sg * KT * FA_M; /* this sub-group's first key of the tile */

    __global ushort *const dkg = dk + fa_row_index(lk, b, seq.start_k, k0, hk);
    __global ushort *const dvg = dv + fa_row_index(lv, b, seq.start_k, k0, hk);
    fa_fetch_rows(Ks, k + fa_row_index(lk, b, seq.start_k, k0, hk), k_ss, BC, seq.len_k - k0, lid);
    fa_fetch_rows(Vs, v + fa_row_index(lv, b, seq.start_k, k0, hk), v_ss, BC, seq.len_k - k0, lid);

    fa_c dka[KT][DT], dva[KT][DT];
    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
        FA_MMA_UNROLL for (int j = 0; j < DT; j++)
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) dka[kt][j].x[e] = dva[kt][j].x[e] = 0.0f;

    int r_lo, r_hi, t_begin, t_end;
    fa_query_range(&mask, k0, k0 + min(BC, seq.len_k - k0) - 1, &r_lo, &r_hi);
    fa_tile_span(r_lo, r_hi, BR, &t_begin, &t_end);

    for (int hh = 0; hh < group; hh++) {
        const int h = hk * group + hh;
#ifdef DROPOUT
        const uint bh = (uint)b * (uint)heads_q + (uint)h;
#endif
        for (int t = fa_next_query_tile(tile_map, tile_cols, k0, t_begin, t_end); t < t_end;
             t = fa_next_query_tile(tile_map, tile_cols, k0, t + 1, t_end)) {
            const int q0 = t * BR;
            fa_fetch_rows(Qs, q + fa_row_index(lq, b, seq.start_q, q0, h), q_ss, BR, seq.len_q - q0, lid);
            fa_fetch_rows(dOs, dout + fa_row_index(lo, b, seq.start_q, q0, h), o_ss, BR, seq.len_q - q0, lid);
            for (int r = lid; r < BR; r += FA_THREADS) {
                float l2 = INFINITY, dd = 0.0f;
                if (r < seq.len_q - q0) {
                    const long li = fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q);
                    const float L = lse[li];
                    l2 = L == -INFINITY ? INFINITY : L * FA_LOG2E;
                    dd = dvec[li];
                }
                Ls[r] = l2;
                Ds[r] = dd;
            }
            fa_copy_wait();
            barrier(CLK_LOCAL_MEM_FENCE);

            /* S^T = K Q^T and dP^T = V dO^T, one after the other: only one
             * product's operands are live at a time. */
            fa_c st[KT][NQ], pt[KT][NQ];
            FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
                FA_MMA_UNROLL for (int j = 0; j < NQ; j++)
                    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) st[kt][j].x[e] = pt[kt][j].x[e] = 0.0f;
            FA_MMA_UNROLL for (int ks = 0; ks < KS; ks++) {
                fa_a a[KT];
                FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) fa_load_a(&a[kt], Ks, LDS, key_base + kt * FA_M, ks * FA_K, fc);
                FA_MMA_UNROLL for (int j = 0; j < NQ; j++) {
                    fa_b bq;
                    fa_load_b_nk(&bq, Qs, LDS, j * FA_N, ks * FA_K, fc);
                    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) fa_mma(&st[kt][j], &a[kt], &bq, fc);
                }
            }
            FA_MMA_UNROLL for (int ks = 0; ks < KS; ks++) {
                fa_a a[KT];
                FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) fa_load_a(&a[kt], Vs, LDS, key_base + kt * FA_M, ks * FA_K, fc);
                FA_MMA_UNROLL for (int j = 0; j < NQ; j++) {
                    fa_b bo;
                    fa_load_b_nk(&bo, dOs, LDS, j * FA_N, ks * FA_K, fc);
                    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) fa_mma(&pt[kt][j], &a[kt], &bo, fc);
                }
            }

            /* P (times z keep_scale) into st, dS into pt. */
            const int partial =
                fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_FEED_KEYS) == FA_TILE_PARTIAL;
            FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
                FA_MMA_UNROLL for (int j = 0; j < NQ; j++) {
                    const int kc = key_base + kt * FA_M, ql0 = j * FA_N;
                    fa_c seen;
                    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) seen.x[e] = 1.0f;
                    if (partial) fa_frag_mask(&seen, &mask, block_mask, q0, ql0, k0, kc, 1, 0.0f, fc);
#ifdef DROPOUT
                    const uint keep = fa_frag_keep(&drop, bh, (uint)k0 + (uint)kc, (uint)q0 + (uint)ql0, 1, fc);
#else
                    const uint keep = ~0u;
#endif
                    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
                        const int ql = ql0 + FA_C_COL(fc.lane, e);
                        const float pv = exp2(fma(st[kt][j].x[e], scale_log2, -Ls[ql]));
                        const float z = keep >> e & 1u ? drop_scale : 0.0f;
                        const int vis = seen.x[e] != 0.0f;
                        pt[kt][j].x[e] = vis ? pv * (pt[kt][j].x[e] * z - Ds[ql]) : 0.0f;
                        st[kt][j].x[e] = vis ? pv * z : 0.0f;
                    }
                }

#ifdef DQ_ATOMIC
            /* dS for dQ += dS K below. */
            FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
                FA_MMA_UNROLL for (int j = 0; j < NQ; j++) fa_put_c_t(dSs, LDD, key_base + kt * FA_M, j * FA_N, &pt[kt][j], fc);
#endif

            /* dV += (z P)^T dO and dK += dS^T Q, k over the tile's queries. */
#if FA_C2A_REGS
            fa_a ap[KT][KQ], as[KT][KQ];
            FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
                FA_MMA_UNROLL for (int kq = 0; kq < KQ; kq++) {
                    fa_c_to_a(&ap[kt][kq], st[kt], kq, fc);
                    fa_c_to_a(&as[kt][kq], pt[kt], kq, fc);
                }
#define A_P(kt, kq) ap[kt][kq]
#define A_S(kt, kq) as[kt][kq]
#else
            FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
                FA_MMA_UNROLL for (int j = 0; j < NQ; j++) {
                    fa_put_c(PTs, LDT, key_base + kt * FA_M, j * FA_N, &st[kt][j], 1.0f, fc);
                    fa_put_c(dSTs, LDT, key_base + kt * FA_M, j * FA_N, &pt[kt][j], 1.0f, fc);
                }
            barrier(CLK_LOCAL_MEM_FENCE);
#endif
            FA_MMA_UNROLL for (int kq = 0; kq < KQ; kq++) {
#if !FA_C2A_REGS
                fa_a ap[KT], as[KT];
                FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) {
                    fa_load_a(&ap[kt], PTs, LDT, key_base + kt * FA_M, kq * FA_K, fc);
                    fa_load_a(&as[kt], dSTs, LDT, key_base + kt * FA_M, kq * FA_K, fc);
                }
#define A_P(kt, kq) ap[kt]
#define A_S(kt, kq) as[kt]
#endif
                FA_MMA_UNROLL for (int j = 0; j < DT; j++) {
                    fa_b bo, bq;
                    fa_load_b_kn(&bo, dOs, LDS, kq * FA_K, j * FA_N, fc);
                    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) fa_mma(&dva[kt][j], &A_P(kt, kq), &bo, fc);
                    fa_load_b_kn(&bq, Qs, LDS, kq * FA_K, j * FA_N, fc);
                    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) fa_mma(&dka[kt][j], &A_S(kt, kq), &bq, fc);
                }
            }
#undef A_P
#undef A_S

#ifdef DQ_ATOMIC
            /* dQ += dS K over the whole key tile, once every sub-group's dS
             * is in: units of one strip of queries by DQU n-tiles of head
             * dimensions go round the sub-groups, every sub-group running
             * the same number of rounds (the fragment operations are the
             * work-group's). */
#define DQU (DT % 4 == 0 ? 4 : DT % 2 == 0 ? 2 : 1)
#define DQ_UNITS ((BR / FA_M) * (DT / DQU))
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int round = 0; round < (DQ_UNITS + WARPS - 1) / WARPS; round++) {
                const int u = round * WARPS + fc.sg, uu = u < DQ_UNITS ? u : u % DQ_UNITS;
                const int mq = uu % (BR / FA_M), j0 = uu / (BR / FA_M) * DQU;
                fa_c acc[DQU];
                FA_MMA_UNROLL for (int n = 0; n < DQU; n++)
                    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) acc[n].x[e] = 0.0f;
                FA_MMA_UNROLL for (int kb = 0; kb < BC / FA_K; kb++) {
                    fa_a a;
                    fa_load_a(&a, dSs, LDD, mq * FA_M, kb * FA_K, fc);
                    FA_MMA_UNROLL for (int n = 0; n < DQU; n++) {
                        fa_b bk;
                        fa_load_b_kn(&bk, Ks, LDS, kb * FA_K, (j0 + n) * FA_N, fc);
                        fa_mma(&acc[n], &a, &bk, fc);
                    }
                }
                if (u < DQ_UNITS) {
                    FA_MMA_UNROLL for (int n = 0; n < DQU; n++)
                        FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
                            const int r = mq * FA_M + FA_C_ROW(fc.lane, e);
                            const int x = (j0 + n) * FA_N + FA_C_COL(fc.lane, e);
                            if (r < seq.len_q - q0 && x < HEAD_DIM)
                                fa_atomic_add(dq_acc +
                                                  fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q) *
                                                      HEAD_DIM +
                                                  x,
                                              acc[n].x[e]);
                        }
                }
            }
#endif
            barrier(CLK_LOCAL_MEM_FENCE); /* this tile's buffers may be refilled */
        }
    }
    fa_copy_wait();
    barrier(CLK_LOCAL_MEM_FENCE);

    /* dK (scaled) and dV through the K and V tiles, then 16-byte stores. */
    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
        FA_MMA_UNROLL for (int j = 0; j < DT; j++) {
            fa_put_c(Ks, LDS, key_base + kt * FA_M, j * FA_N, &dka[kt][j], scale, fc);
            fa_put_c(Vs, LDS, key_base + kt * FA_M, j * FA_N, &dva[kt][j], 1.0f, fc);
        }
    barrier(CLK_LOCAL_MEM_FENCE);
    fa_store_rows(dkg, k_ss, Ks, BC, seq.len_k - k0, lid);
    fa_store_rows(dvg, v_ss, Vs, BC, seq.len_k - k0, lid);
}

#else /* FA_BWD_DQ */

#define NT (BC / FA_N)
#define KP (BC / FA_K)

#if BR != WARPS * FA_M || BC % FA_N != 0 || BC % FA_K != 0
#error "bwd_mma (dQ): BR must be WARPS * FA_M, BC a multiple of FA_N and FA_K"
#endif

#if FA_C2A_REGS
#define DS_ELEMS 0
#else
#define DS_ELEMS (BR * LDD)
#endif

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) FA_KERNEL_ATTRS void
fa_bwd_dq(__global const ushort *q, __global const ushort *k, __global const ushort *v,
          __global const float *lse, __global const ushort *dout, __global const float *dvec,
          __global ushort *dq, FA_BWD_PARAMS) {
    __local ushort smem[2 * BR * LDS + 2 * BC * LDS + DS_ELEMS] __attribute__((aligned(16)));
    FA_FRAG_SCRATCH(WARPS);
    __local ushort *const Qs = smem;
    __local ushort *const dOs = Qs + BR * LDS;
    __local ushort *const Ks = dOs + BR * LDS;
    __local ushort *const Vs = Ks + BC * LDS;
#if !FA_C2A_REGS
    __local ushort *const dSs = Vs + BC * LDS;
#endif

    const int lid = get_local_id(0);
    const fa_frag_ctx fc = FA_FRAG_CTX(lid);
    const int q0 = get_group_id(0) * BR;
    const int h = get_group_id(1);
    const int b = get_group_id(2);
    const int hk = h / group;
    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (q0 >= seq.len_q) return;
    FA_BWD_SETUP();
    (void)drop;
    const int row_base = fc.sg * FA_M; /* one strip of queries a sub-group */
#ifdef DROPOUT
    const uint bh = (uint)b * (uint)heads_q + (uint)h;
#endif

    /* L (log2 units, +inf for rows without keys or past the end) and D of
     * the lane's rows. */
    float l2[FA_C_ROWS], dd[FA_C_ROWS];
    FA_MMA_UNROLL for (int r = 0; r < FA_C_ROWS; r++) {
        const int row = row_base + FA_C_SLOT_ROW(fc.lane, r);
        l2[r] = INFINITY;
        dd[r] = 0.0f;
        if (row < seq.len_q - q0) {
            const long li = fa_lse_index(b, h, q0 + row, heads_q, seqlen_q, seq.start_q, total_q);
            const float L = lse[li];
            l2[r] = L == -INFINITY ? INFINITY : L * FA_LOG2E;
            dd[r] = dvec[li];
        }
    }

    __global const ushort *const kg = k + fa_row_index(lk, b, seq.start_k, 0, hk);
    __global const ushort *const vg = v + fa_row_index(lv, b, seq.start_k, 0, hk);
    fa_fetch_rows(Qs, q + fa_row_index(lq, b, seq.start_q, q0, h), q_ss, BR, seq.len_q - q0, lid);
    fa_fetch_rows(dOs, dout + fa_row_index(lo, b, seq.start_q, q0, h), o_ss, BR, seq.len_q - q0, lid);

    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(&mask, q0, q0 + min(BR, seq.len_q - q0) - 1, &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);

    fa_c acc[DT];
    FA_MMA_UNROLL for (int j = 0; j < DT; j++)
        FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) acc[j].x[e] = 0.0f;

    for (int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end); t < t_end;
         t = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end)) {
        const int k0 = t * BC;
        fa_fetch_rows(Ks, kg + (long)k0 * k_ss, k_ss, BC, seq.len_k - k0, lid);
        fa_fetch_rows(Vs, vg + (long)k0 * v_ss, v_ss, BC, seq.len_k - k0, lid);
        fa_copy_wait();
        barrier(CLK_LOCAL_MEM_FENCE);

        fa_c s[NT], dp[NT];
        FA_MMA_UNROLL for (int j = 0; j < NT; j++)
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) s[j].x[e] = dp[j].x[e] = 0.0f;
        FA_MMA_UNROLL for (int ks = 0; ks < KS; ks++) {
            fa_a aq, ao;
            fa_load_a(&aq, Qs, LDS, row_base, ks * FA_K, fc);
            fa_load_a(&ao, dOs, LDS, row_base, ks * FA_K, fc);
            FA_MMA_UNROLL for (int j = 0; j < NT; j++) {
                fa_b bk, bv;
                fa_load_b_nk(&bk, Ks, LDS, j * FA_N, ks * FA_K, fc);
                fa_mma(&s[j], &aq, &bk, fc);
                fa_load_b_nk(&bv, Vs, LDS, j * FA_N, ks * FA_K, fc);
                fa_mma(&dp[j], &ao, &bv, fc);
            }
        }

        const int partial = fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED) == FA_TILE_PARTIAL;
        FA_MMA_UNROLL for (int j = 0; j < NT; j++) {
            fa_c seen;
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) seen.x[e] = 1.0f;
            if (partial) fa_frag_mask(&seen, &mask, block_mask, q0, row_base, k0, j * FA_N, 0, 0.0f, fc);
#ifdef DROPOUT
            const uint keep = fa_frag_keep(&drop, bh, (uint)q0 + (uint)row_base, (uint)k0 + (uint)(j * FA_N), 0, fc);
#else
            const uint keep = ~0u;
#endif
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
                const int r = FA_C_SLOT(e);
                const float pv = exp2(fma(s[j].x[e], scale_log2, -l2[r]));
                const float z = keep >> e & 1u ? drop_scale : 0.0f;
                dp[j].x[e] = seen.x[e] != 0.0f ? pv * (dp[j].x[e] * z - dd[r]) : 0.0f;
            }
        }

        /* dQ += dS K */
#if !FA_C2A_REGS
        FA_MMA_UNROLL for (int j = 0; j < NT; j++) fa_put_c(dSs, LDD, row_base, j * FA_N, &dp[j], 1.0f, fc);
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        FA_MMA_UNROLL for (int kp = 0; kp < KP; kp++) {
            fa_a a;
#if FA_C2A_REGS
            fa_c_to_a(&a, dp, kp, fc);
#else
            fa_load_a(&a, dSs, LDD, row_base, kp * FA_K, fc);
#endif
            FA_MMA_UNROLL for (int j = 0; j < DT; j++) {
                fa_b bk;
                fa_load_b_kn(&bk, Ks, LDS, kp * FA_K, j * FA_N, fc);
                fa_mma(&acc[j], &a, &bk, fc);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    fa_copy_wait();
    barrier(CLK_LOCAL_MEM_FENCE);

    FA_MMA_UNROLL for (int j = 0; j < DT; j++) fa_put_c(Qs, LDS, row_base, j * FA_N, &acc[j], scale, fc);
    barrier(CLK_LOCAL_MEM_FENCE);
    fa_store_rows(dq + fa_row_index(lq, b, seq.start_q, q0, h), q_ss, Qs, BR, seq.len_q - q0, lid);
}

#endif /* FA_BWD_DQ */
