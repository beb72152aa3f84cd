/* Backward pass on matrix units (FlashAttention-2): dQ, dK, dV from Q, K,
 * V, O, L and dO, P recomputed from L. Built after bwd_common.cl (its
 * fa_bwd_dot runs first) as one of two programs:
 *
 *   fa_bwd_dkdv  one work-group per (key tile of BC keys, kv head,
 *                sequence); K and V stay on chip while it steps over the
 *                query heads that share the kv head and the query tiles of
 *                BR rows that see the keys. Each sub-group owns KT strips
 *                of FA_M keys and keeps their dK and dV in fragments (GQA
 *                sums there, no atomics). With DQ_ATOMIC it also adds dS K
 *                into the fp32 dQ accumulator, and bwd_common.cl's
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
 * (z the dropout keep bit; with score options S^T holds base-2 logits,
 * scale log2 e is 1 and dS takes the softcap's cap_grad: common.h). A row
 * with L = -inf (no visible key) takes L = +inf, which makes its P exactly
 * 0; hidden elements are set to 0, not multiplied by a mask. Tiles with rows past the sequence count as partial
 * in fa_bwd_dkdv (FA_ROWS_FEED_KEYS): their zero queries would otherwise
 * add 0 * inf to a key's dK and dV.
 *
 * A step of fa_bwd_dkdv (one query tile) waits once for its Q, dO, L and D
 * and meets one more barrier once dS is in local memory; the next step's
 * copies are issued as early as their buffers allow, so that they land
 * while this step computes: with STAGES 2 into the other of two Q/dO
 * buffers as the step starts, with one buffer as soon as its products are
 * done (during the dQ products and their atomics). L and D travel in
 * registers meanwhile. With VREG (where V's tile does not fit beside the
 * others) V's fragments are read from global memory into registers once,
 * and its tile is left out: in one stage this leaves local memory to a
 * larger key tile (every query tile's dQ atomics and Q/dO reads then serve
 * more keys) or a larger query tile. With KPACK (where K's tile does not
 * fit beside Q and dO even then) K and V leave local memory, and V the
 * registers: fa_bwd_pack_kv first writes each key tile once into the
 * workspace in the order of the lanes' fragments (K's and V's A fragments
 * of S^T and dP^T, K's B fragments of dQ), and every step reads them from
 * there, a lane's fragment in one load, through the cache that holds the
 * tile for the work-group's whole walk. A step of BR query rows runs in
 * chunks of QC rows (QC a build option, BR unless set): S^T, dP^T, P and dS
 * of one chunk at a time, so that a lane holds the scores of QC queries,
 * not BR, while the step's barriers, copies and dQ products serve all BR.
 *
 * Local memory, exactly core/planner_cl_mma.c's backward figures (16-bit
 * tiles as mma_common.h lays them out):
 *   fa_bwd_dkdv  K [BC][LDS] (not with KPACK), V [BC][LDS] (not with
 *                VREG or KPACK); Q, dO
 *                [STAGES][BR][LDS]; with DQ_ATOMIC dS [BR][BC + 8];
 *                without FA_C2A_REGS P^T and dS^T [BC][BR + 8]; L and D
 *                [BR] in fp32
 *   fa_bwd_dq    Q, dO [BR][LDS]; K, V [BC][LDS]; without FA_C2A_REGS dS
 *                [BR][BC + 8]
 * and the fragment layer's scratch (emulated layouts).
 *
 * Tuning options (FLASHATTN_OPENCL_OPTIONS): FA_DQ_UNIT (1, 2 or 4) fixes
 * the head-dimension n-tiles of one sub-group's unit of dQ += dS K (over
 * the plan's DQ_UNIT);
 * FA_RED_V2 (common.h) adds dQ two floats a reduction; FA_BWD_QC replaces
 * the plan's query chunk QC; FA_BWD_ROTATE has the work-group of key tile i
 * (of n) start its walk over the query tiles at the i / n-th of them and
 * wrap round, so that the work-groups of a head add into different rows of
 * dQ at a time rather than all into the same ones. */

#define DT (D_PAD / FA_N)
#define KS (D_PAD / FA_K)
#define LDD (BC + 8)

/* Without dropout z keep_scale is 1: one multiply less an element. */
#ifdef DROPOUT
#define FA_KEEP_SCALE(keep, e, scale) ((keep) >> (e) & 1u ? (scale) : 0.0f)
#else
#define FA_KEEP_SCALE(keep, e, scale) 1.0f
#endif

#ifndef FA_BWD_DQ

#ifndef STAGES
#define STAGES 1
#endif
#if STAGES != 1 && STAGES != 2
#error "bwd_mma: STAGES is 1 or 2"
#endif
#if defined(FA_BWD_QC)
#undef QC
#define QC FA_BWD_QC
#elif !defined(QC)
#define QC BR
#endif

#define KT (BC / (WARPS * FA_M))
/* n-tiles and k-steps over one chunk's queries. */
#define NQ (QC / FA_N)
#define KQ (QC / FA_K)
#define LDT (BR + 8)
/* Rows of L and D a work-item carries to the next step. */
#define LD_ITEMS ((BR + FA_THREADS - 1) / FA_THREADS)

#if BC % (WARPS * FA_M) != 0 || BR % FA_N != 0 || BR % FA_K != 0
#error "bwd_mma: BC must be a multiple of WARPS * FA_M, BR of FA_N and FA_K"
#endif
#if BR % QC != 0 || QC % FA_N != 0 || QC % FA_K != 0
#error "bwd_mma: QC must divide BR and be a multiple of FA_N and FA_K"
#endif

/* FA_BWD_WGMMA (below) only on the tile it is written for, and not with
 * FA_BWD_NO_WGMMA (a tuning option, to time the mma.sync products beside
 * it); elsewhere the option is left aside. Its swizzled tiles start on
 * 1024-byte boundaries (the swizzle's period): K's at the start of local
 * memory, Q's after K's padded tile (BC LDS elements, 9 KiB), dO's 4 KiB
 * after Q's, within the padded Q/dO buffers, whose sizes stay the
 * planner's. */
#define QT_ELEMS (BR * LDS)
#if defined(FA_BWD_WGMMA) &&                                                                                   \
    (!defined(FA_NV_PTX) || !defined(FA_NV_SM90A) || defined(FA_BWD_NO_WGMMA) ||                                 \
     (HEAD_DIM != 64 && HEAD_DIM != 128) || KT != 1 || WARPS != 4 || QC != 32 || BR != 32 || !defined(VREG) ||    \
     defined(KPACK) || (BC * LDS * 2) % 1024 != 0 || (2 * QT_ELEMS * 2) % 1024 != 0 ||                          \
     (FA_THREADS / D_CHUNKS) % 8 != 0)
#undef FA_BWD_WGMMA
#endif
#ifdef FA_BWD_WGMMA
#define FA_SMEM_ALIGN 1024
#define DO_OFFSET (BR * HEAD_DIM) /* dO after Q's swizzled rows */
#else
#define FA_SMEM_ALIGN 16
#define DO_OFFSET QT_ELEMS
#endif
#ifdef KPACK
#ifdef VREG
#error "bwd_mma: KPACK reads V's fragments from the packed tile, not registers (VREG)"
#endif
#if 2 * STAGES * BR < BC
#error "bwd_mma: KPACK stages dK and dV through the Q/dO buffers, which must hold BC rows"
#endif
#define K_ELEMS 0
/* A constant, so that the fragment loads below take their source when the
 * program is built, not by a test of the pointer at every fragment. */
#define FA_KPACK 1
#else
#define K_ELEMS (BC * LDS)
#define FA_KPACK 0
#endif
#if defined(VREG) || defined(KPACK)
#define V_ELEMS 0
#else
#define V_ELEMS (BC * LDS)
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

#ifdef FA_BWD_WGMMA
/* Warpgroup products (FA_BWD_WGMMA: NVIDIA's sm_90, where the host sets it
 * with FA_NV_SM90A, the masked sm_90a lines of core/ptx_patch.h): the
 * work-group is one warpgroup whose four sub-groups own the tile's 64
 * keys, 16 each, as the instruction's 64 rows give them out, and a 64 x N
 * accumulator is N / 8 n-tiles of mma.sync's per sub-group: the layout of
 * st, pt, dva and dka. S^T = K Q^T and dP^T = V dO^T (V's fragments from
 * registers) read K, Q and dO K-major, dV += P^T dO and dK += dS^T Q (P
 * and dS from registers) read dO and Q N-major, from tiles in rows of 128
 * bytes with their 16-byte chunks swizzled (FA_LD_SW); dQ stays on
 * mma.sync, its K operand read by ldmatrix from the same tile. A tile is
 * then read once a work-group, not once a sub-group: on an H200 (fp16,
 * N 4096 / 16384, bench/results/h200.md, 2026-11-29) 187.7 / 207.8 ->
 * 214.1 / 240.7 TFLOP/s not causal, 159.8 / 195.8 -> 179.6 / 220.6
 * causal, in 159-160 registers where mma.sync took 167-168. One strip a
 * sub-group, 32 queries a step in one chunk; head_dim 64, and 128 (two
 * blocks of 64 columns a row, the second a tile's rows further; NVIDIA's
 * build: 238 registers, no spill; 184.4 / 201.1 -> 206.2 / 232.2 not
 * causal, 161.7 / 201.7 -> 178.2 / 225.8 causal). */

/* acc (this sub-group's 16 keys x 32 queries) += K Q^T over the 64 head
 * dimensions, K and Q (the chunk's rows) from their swizzled tiles: one
 * asm statement, so that nothing touches the accumulators between the
 * products. */
FA_FN void fa_wg_keys_by_queries_ss(fa_c *acc, __local const ushort *keys, __local const ushort *rows) {
    const uint ka = fa_shared_addr(keys), qa = fa_shared_addr(rows);
#if HEAD_DIM == 64
    const ulong da0 = fa_wg_desc(ka), da1 = fa_wg_desc(ka + 32u), da2 = fa_wg_desc(ka + 64u), da3 = fa_wg_desc(ka + 96u);
    const ulong db0 = fa_wg_desc(qa), db1 = fa_wg_desc(qa + 32u), db2 = fa_wg_desc(qa + 64u), db3 = fa_wg_desc(qa + 96u);
    __asm__ __volatile__(FA_WG_FENCE
                         FA_WG_OP(32) FA_WG_D16 ", %16, %20, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %17, %21, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %18, %22, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %19, %23, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_DONE
                         : FA_WG_ACC16(acc)
                         : "l"(da0), "l"(da1), "l"(da2), "l"(da3), "l"(db0), "l"(db1), "l"(db2), "l"(db3)
                         : "memory");
#else
    ulong da[8], db[8];
    FA_MMA_UNROLL for (int s = 0; s < 8; s++) {
        da[s] = fa_wg_desc(ka + FA_WG_KOFF(BC, s));
        db[s] = fa_wg_desc(qa + FA_WG_KOFF(BR, s));
    }
    __asm__ __volatile__(FA_WG_FENCE
                         FA_WG_OP(32) FA_WG_D16 ", %16, %24, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %17, %25, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %18, %26, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %19, %27, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %20, %28, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %21, %29, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %22, %30, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_OP(32) FA_WG_D16 ", %23, %31, 1, 1, 1, 0, 0;\n\t"
                         FA_WG_DONE
                         : FA_WG_ACC16(acc)
                         : "l"(da[0]), "l"(da[1]), "l"(da[2]), "l"(da[3]), "l"(da[4]), "l"(da[5]), "l"(da[6]),
                           "l"(da[7]), "l"(db[0]), "l"(db[1]), "l"(db[2]), "l"(db[3]), "l"(db[4]), "l"(db[5]),
                           "l"(db[6]), "l"(db[7])
                         : "memory");
#endif
}

/* acc += V dO^T, V's A fragments from registers (a[ks]), dO from its
 * swizzled tile. */
FA_WG_RS_OVER_DIMS(fa_wg_keys_by_queries_rs, FA_WG_RS_PAIR16, FA_WG_ACC16, BR)

/* acc (this sub-group's 16 keys x HEAD_DIM) += A B over the chunk's 32
 * queries: A (P^T or dS^T) from registers (a[kq]), B (dO or Q) the
 * chunk's rows of its swizzled tile. */
FA_WG_RS_OVER_ROWS(fa_wg_regs_by_rows_rs, KQ, BR)

#define QROW FA_SW_ROW
#define QLD FA_LD_SW(BR)
#define KLD FA_LD_SW(BC)
#else
#define QROW LDS
#define QLD LDS
#define KLD LDS
#endif

/* One key tile's packed K and V (32-bit words; planner_cl_mma.c,
 * packed_kv_tile_words): K's A fragment of strip m (FA_M keys), k-step ks
 * of every lane at ((m KS + ks) FA_SG + lane) FA_A_WORDS; then K's B
 * fragment (keys by head dimensions) of k-step kb, n-tile j at KP_A_WORDS
 * + ((kb DT + j) FA_SG + lane) FA_B_WORDS; then V's A fragments as K's, at
 * KP_V. */
#define KP_A_WORDS ((BC / FA_M) * KS * FA_SG * FA_A_WORDS)
#define KP_B_WORDS ((BC / FA_K) * DT * FA_SG * FA_B_WORDS)
#define KP_V (KP_A_WORDS + KP_B_WORDS)
#define KP_WORDS (2 * KP_A_WORDS + KP_B_WORDS)

/* The slot of key tile k0 / BC of sequence b (kv head hk of heads_k):
 * start_k / BC + b + k0 / BC, heads within it. A sequence of len keys takes
 * ceil(len / BC) slots and the next one's first is at least floor((start_k
 * + len) / BC) + b + 1, past them; the batch's slots number at most
 * total_k / BC + batch + 1 (the workspace's). */
FA_FN long fa_bwd_k_slot(fa_seq seq, int b, int k0, int hk, int heads_k) {
    return ((seq.start_k / BC) + b + k0 / BC) * heads_k + hk;
}

#ifdef KPACK
/* K's and V's tiles into their slots, one work-group a tile as
 * fa_bwd_dkdv's: every word the pair of elements its lane's fragment holds
 * there, zero past the sequence and past HEAD_DIM (so that no key a tile
 * lacks, nor a padding dimension, reaches a product). */
__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
fa_bwd_pack_kv(__global const ushort *k, __global const ushort *v, long k_off, long k_sb, long k_ss, long k_sh,
               long v_off, long v_sb, long v_ss, long v_sh, int seqlen_k, int heads_k, __global const int *cu_q,
               __global const int *cu_k, __global uint *kpack) {
    const int lid = get_local_id(0);
    const int k0 = get_group_id(0) * BC;
    const int hk = get_group_id(1);
    const int b = get_group_id(2);
    const fa_seq seq = fa_seq_of(b, 0, seqlen_k, cu_q, cu_k);
    if (k0 >= seq.len_k) return;
    const fa_layout lk = {k_off, k_sb, k_ss, k_sh}, lv = {v_off, v_sb, v_ss, v_sh};
    __global const ushort *const kg = k + fa_row_index(lk, b, seq.start_k, k0, hk);
    __global const ushort *const vg = v + fa_row_index(lv, b, seq.start_k, k0, hk);
    __global uint *const dst = kpack + fa_bwd_k_slot(seq, b, k0, hk, heads_k) * KP_WORDS;
    const int valid = seq.len_k - k0;
    for (int i = lid; i < KP_WORDS; i += FA_THREADS) {
        int w, lane, f, key[2], dim[2];
        const int in_v = i >= KP_V, a = in_v ? i - KP_V : i;
        if (in_v || i < KP_A_WORDS) {
            w = a % FA_A_WORDS;
            lane = a / FA_A_WORDS % FA_SG;
            f = a / (FA_A_WORDS * FA_SG); /* m KS + ks */
            for (int h = 0; h < 2; h++) {
                key[h] = f / KS * FA_M + FA_A_ROW(lane, 2 * w + h);
                dim[h] = f % KS * FA_K + FA_A_COL(lane, 2 * w + h);
            }
        } else {
            const int j = i - KP_A_WORDS;
            w = j % FA_B_WORDS;
            lane = j / FA_B_WORDS % FA_SG;
            f = j / (FA_B_WORDS * FA_SG); /* kb DT + n-tile */
            for (int h = 0; h < 2; h++) {
                key[h] = f / DT * FA_K + FA_B_K(lane, 2 * w + h);
                dim[h] = f % DT * FA_N + FA_B_N(lane, 2 * w + h);
            }
        }
        uint word = 0u;
        for (int h = 0; h < 2; h++)
            if (key[h] < valid && dim[h] < HEAD_DIM)
                word |= (uint)(in_v ? vg[(long)key[h] * v_ss + dim[h]] : kg[(long)key[h] * k_ss + dim[h]]) << (16 * h);
        dst[i] = word;
    }
}
#endif

/* The walk over a head's query tiles [t_begin, t_end) goes by positions p
 * in the same range; position p is query tile p, or with FA_BWD_ROTATE
 * t_begin + (p - t_begin + rot) mod (t_end - t_begin), rot in [0, t_end -
 * t_begin). */
FA_FN int fa_bwd_tile_at(int p, int t_begin, int t_end, int rot) {
#ifdef FA_BWD_ROTATE
    const int t = p + rot;
    return t < t_end ? t : t - (t_end - t_begin);
#else
    (void)t_begin;
    (void)t_end;
    (void)rot;
    return p;
#endif
}

/* The first position from p on whose query tile the block mask leaves
 * anything of against the keys (fa_next_query_tile, rotated). */
FA_FN int fa_bwd_next_pos(__global const uchar *tile_map, int tile_cols, int k0, int p, int t_begin, int t_end,
                          int rot) {
#ifdef BLOCK_MASK
    while (p < t_end && tile_map[(long)fa_bwd_tile_at(p, t_begin, t_end, rot) * tile_cols + k0 / BC] == FA_TILE_SKIP)
        p++;
#else
    (void)tile_map;
    (void)tile_cols;
    (void)k0;
    (void)t_begin;
    (void)rot;
#endif
    return p;
}

/* The step after (hh, p): the next position whose query tile sees the
 * keys, else the next query head's first. */
FA_FN void fa_bwd_next_step(int *hh, int *p, __global const uchar *tile_map, int tile_cols, int k0, int t_begin,
                            int t_end, int rot) {
    *p = fa_bwd_next_pos(tile_map, tile_cols, k0, *p + 1, t_begin, t_end, rot);
    if (*p >= t_end) {
        (*hh)++;
        *p = fa_bwd_next_pos(tile_map, tile_cols, k0, t_begin, t_begin, t_end, rot);
    }
}

/* L and D of a query tile's rows into registers, as loaded: read only when
 * stored (fa_bwd_ld_store), so that the loads are in flight meanwhile.
 * Rows past the sequence read as L = -inf, D = 0. */
FA_FN void fa_bwd_ld_load(float *lraw, float *draw, __global const float *lse, __global const float *dvec, int b,
                          int h, int q0, int heads_q, int seqlen_q, fa_seq seq, long total_q, int lid) {
    FA_MMA_UNROLL for (int i = 0; i < LD_ITEMS; i++) {
        const int r = lid + i * FA_THREADS;
        lraw[i] = -INFINITY;
        draw[i] = 0.0f;
        if (r < BR && r < seq.len_q - q0) {
            const long li = fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q);
            lraw[i] = lse[li];
            draw[i] = dvec[li];
        }
    }
}

/* L in log2 units, +inf for rows without keys (their P is then 0). */
FA_FN void fa_bwd_ld_store(__local float *Ls, __local float *Ds, const float *lraw, const float *draw, int lid) {
    FA_MMA_UNROLL for (int i = 0; i < LD_ITEMS; i++) {
        const int r = lid + i * FA_THREADS;
        if (r < BR) {
            Ls[r] = lraw[i] == -INFINITY ? INFINITY : lraw[i] * FA_LOG2E;
            Ds[r] = draw[i];
        }
    }
}

/* acc[kt][j] += A B^T over head_dim for the key strips: A from a key-side
 * tile (K or V; or, kregs not NULL, its fragments in registers; or, with
 * KPACK, from kpack, the key tile's packed K or V), B the query-side rows
 * (Q or dO). */
FA_FN void fa_bwd_keys_by_queries(fa_c (*acc)[NQ], __local const ushort *keys, fa_a (*kregs)[KS],
                                  __global const uint *kpack, __local const ushort *rows, int key_base,
                                  fa_frag_ctx fc) {
    FA_MMA_UNROLL for (int ks = 0; ks < KS; ks++) {
        fa_a a[KT];
        FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) {
            if (FA_KPACK)
                fa_load_a_packed(&a[kt], kpack + ((key_base / FA_M + kt) * KS + ks) * (FA_SG * FA_A_WORDS), fc);
            else if (kregs)
                a[kt] = kregs[kt][ks];
            else
                fa_load_a(&a[kt], keys, LDS, key_base + kt * FA_M, ks * FA_K, fc);
        }
        FA_MMA_UNROLL for (int j = 0; j < NQ; j += FA_BP) {
            fa_b bq[FA_BP];
            fa_load_bp_nk(bq, j + 1 < NQ, rows, LDS, j * FA_N, ks * FA_K, fc);
            FA_MMA_UNROLL for (int n = 0; n < FA_BP; n++)
                if (j + n < NQ) FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) fa_mma(&acc[kt][j + n], &a[kt], &bq[n], fc);
        }
    }
}

#ifdef DQ_ATOMIC
/* dQ += dS K in units of one strip of queries by DQU n-tiles of head
 * dimensions, going round the sub-groups: as many n-tiles a unit as still
 * give every sub-group one (a unit's n-tiles share its dS fragments). */
#if defined(FA_DQ_UNIT)
#define DQU FA_DQ_UNIT
#elif defined(DQ_UNIT)
#define DQU DQ_UNIT
#elif DT % 4 == 0 && (BR / FA_M) * (DT / 4) >= WARPS
#define DQU 4
#elif DT % 2 == 0 && (BR / FA_M) * (DT / 2) >= WARPS
#define DQU 2
#else
#define DQU 1
#endif
#if DT % DQU != 0
#error "bwd_mma: the dQ unit must divide the head dimension's n-tiles"
#endif
#define DQ_UNITS ((BR / FA_M) * (DT / DQU))
/* Elements of dQ one reduction adds: two where runs of the accumulator's
 * columns are (FA_C_RUN even). */
#define FA_DQ_PAIR (FA_C_RUN % 2 == 0 ? 2 : 1)

/* The work-group's share of dQ += dS K for the query tile at q0 (dS in
 * dSs, every sub-group's in; K in Ks or, with KPACK, kpack). A layer whose operations take all
 * work-items together (!FA_SG_UNIFORM_OPS) has the sub-groups without a
 * unit in the last round repeat one, unstored. */
FA_FN void fa_bwd_dq_atomic(volatile __global float *dq_acc, __local const ushort *dSs, __local const ushort *Ks,
                            __global const uint *kpack, int b, int h, int q0, int heads_q, int seqlen_q, fa_seq seq,
                            long total_q, fa_frag_ctx fc) {
    for (int round = 0; round < (DQ_UNITS + WARPS - 1) / WARPS; round++) {
        const int u = round * WARPS + fc.sg;
        if (FA_SG_UNIFORM_OPS && u >= DQ_UNITS) break;
        const int uu = u < DQ_UNITS ? u : u % DQ_UNITS;
        const int mq = uu % (BR / FA_M), j0 = uu / (BR / FA_M) * DQU;
        fa_c acc[DQU];
        FA_MMA_UNROLL for (int n = 0; n < DQU; n++)
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) acc[n].x[e] = 0.0f;
        FA_MMA_UNROLL for (int kb = 0; kb < BC / FA_K; kb++) {
            fa_a a;
            fa_load_a(&a, dSs, LDD, mq * FA_M, kb * FA_K, fc);
            FA_MMA_UNROLL for (int n = 0; n < DQU; n += FA_BP) {
                fa_b bk[FA_BP];
                if (FA_KPACK)
                    FA_MMA_UNROLL for (int i = 0; i < FA_BP; i++) {
                        if (n + i < DQU)
                            fa_load_b_packed(&bk[i], kpack + KP_A_WORDS + (kb * DT + j0 + n + i) * (FA_SG * FA_B_WORDS),
                                             fc);
                    }
                else
                    fa_load_bp_kn(bk, n + 1 < DQU, Ks, KLD, kb * FA_K, (j0 + n) * FA_N, fc);
                FA_MMA_UNROLL for (int i = 0; i < FA_BP; i++)
                    if (n + i < DQU) fa_mma(&acc[n + i], &a, &bk[i], fc);
            }
        }
        if (u < DQ_UNITS) {
            /* Within a run (FA_C_RUN) elements e, e + 1 (e even) are
             * neighbouring columns of a row, the first even: 8-byte aligned
             * in the accumulator. A row's address is formed once for the
             * unit's n-tiles (per element it cost NVIDIA about seven integer
             * instructions and a branch a reduction). */
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e += FA_DQ_PAIR) {
                const int r = mq * FA_M + FA_C_ROW(fc.lane, e), x0 = j0 * FA_N + FA_C_COL(fc.lane, e);
                if (r >= seq.len_q - q0) continue;
                volatile __global float *const row =
                    dq_acc + fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q) * HEAD_DIM + x0;
                FA_MMA_UNROLL for (int n = 0; n < DQU; n++) {
                    /* Columns from HEAD_DIM to D_PAD are padding: not this row's. */
                    if (D_PAD != HEAD_DIM && x0 + n * FA_N >= HEAD_DIM) continue;
                    if (FA_DQ_PAIR == 2)
                        fa_atomic_add2(row + n * FA_N, acc[n].x[e], acc[n].x[e + 1]);
                    else
                        fa_atomic_add(row + n * FA_N, acc[n].x[e]);
                }
            }
        }
    }
}
#endif

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) FA_KERNEL_ATTRS void
fa_bwd_dkdv(__global const ushort *q, __global const ushort *k, __global const ushort *v,
            __global const float *lse, __global const ushort *dout, __global const float *dvec,
            __global ushort *dk, __global ushort *dv, FA_BWD_PARAMS, __global float *dq_acc,
            __global const uint *kpack) {
    __local ushort smem[K_ELEMS + V_ELEMS + 2 * STAGES * QT_ELEMS + DS_ELEMS + T_ELEMS]
        __attribute__((aligned(FA_SMEM_ALIGN)));
    __local float Ls[BR], Ds[BR];
    FA_FRAG_SCRATCH(WARPS);
#ifndef KPACK
    __local ushort *const Ks = smem;
#endif
#if !defined(VREG) && !defined(KPACK)
    __local ushort *const Vs = Ks + BC * LDS;
#endif
    /* Stage s: Q at qd + 2 s QT_ELEMS, dO right after it. */
    __local ushort *const qd = smem + K_ELEMS + V_ELEMS;
#ifdef DQ_ATOMIC
    __local ushort *const dSs = qd + 2 * STAGES * QT_ELEMS; /* dS: queries by keys */
#endif
#if !FA_C2A_REGS
    __local ushort *const PTs = qd + 2 * STAGES * QT_ELEMS + DS_ELEMS; /* P^T, then dS^T: keys by queries */
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
#ifdef KPACK
    /* K's and V's fragments from the tile's packed copy; the local tile of
     * the epilogue is the Q/dO buffers'. */
    __global const uint *const kp = kpack + fa_bwd_k_slot(seq, b, k0, hk, heads_q / group) * KP_WORDS;
    __local ushort *const Ks = qd;
#define K_TILE ((__local const ushort *)0)
#define K_PACKED kp
#define V_TILE ((__local const ushort *)0)
#define V_REGS ((fa_a(*)[KS])0)
#define V_PACKED (kp + KP_V)
#else
    (void)kpack;
#ifdef FA_BWD_WGMMA
    fa_fetch_rows_sw(Ks, k + fa_row_index(lk, b, seq.start_k, k0, hk), k_ss, BC, seq.len_k - k0, lid);
#else
    fa_fetch_rows(Ks, k + fa_row_index(lk, b, seq.start_k, k0, hk), k_ss, BC, seq.len_k - k0, lid);
#endif
#define K_TILE Ks
#define K_PACKED ((__global const uint *)0)
#define V_PACKED ((__global const uint *)0)
#endif
#if defined(VREG)
    fa_a va[KT][KS];
    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
        FA_MMA_UNROLL for (int ks = 0; ks < KS; ks++)
            fa_load_a_global(&va[kt][ks], v + fa_row_index(lv, b, seq.start_k, k0, hk), v_ss, key_base + kt * FA_M,
                             ks * FA_K, seq.len_k - k0, fc);
#define V_TILE ((__local const ushort *)0)
#define V_REGS va
#elif !defined(KPACK)
    fa_fetch_rows(Vs, v + fa_row_index(lv, b, seq.start_k, k0, hk), v_ss, BC, seq.len_k - k0, lid);
#define V_TILE Vs
#define V_REGS ((fa_a(*)[KS])0)
#endif

    fa_c dka[KT][DT], dva[KT][DT];
    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
        FA_MMA_UNROLL for (int j = 0; j < DT; j++)
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) dka[kt][j].x[e] = dva[kt][j].x[e] = 0.0f;

    int r_lo, r_hi, t_begin, t_end;
    fa_query_range(&mask, k0, k0 + min(BC, seq.len_k - k0) - 1, &r_lo, &r_hi);
    fa_tile_span(r_lo, r_hi, BR, &t_begin, &t_end);

    /* The steps (query head hh, query tile t), in order of their positions
     * (fa_bwd_tile_at); the query range and the tile map do not depend on
     * the head. */
#ifdef FA_BWD_ROTATE
    const int key_tiles = (seq.len_k + BC - 1) / BC;
    const int rot = t_end > t_begin ? (int)((long)(k0 / BC) * (t_end - t_begin) / key_tiles) : 0;
#else
    const int rot = 0;
#endif
    int hh = 0, pos = fa_bwd_next_pos(tile_map, tile_cols, k0, t_begin, t_begin, t_end, rot);
    if (pos >= t_end) hh = group;
    float lnext[LD_ITEMS], dnext[LD_ITEMS];
#ifdef FA_BWD_WGMMA
#define FA_FETCH_QROWS fa_fetch_rows_sw
#else
#define FA_FETCH_QROWS fa_fetch_rows
#endif
#define FA_FETCH_STEP(HH, T, ST)                                                                                    \
    do {                                                                                                            \
        const int h_ = hk * group + (HH), q0_ = (T) * BR;                                                           \
        __local ushort *const q_ = qd + 2 * (ST) * QT_ELEMS;                                                        \
        FA_FETCH_QROWS(q_, q + fa_row_index(lq, b, seq.start_q, q0_, h_), q_ss, BR, seq.len_q - q0_, lid);          \
        FA_FETCH_QROWS(q_ + DO_OFFSET, dout + fa_row_index(lo, b, seq.start_q, q0_, h_), o_ss, BR, seq.len_q - q0_,  \
                       lid);                                                                                        \
        fa_bwd_ld_load(lnext, dnext, lse, dvec, b, h_, q0_, heads_q, seqlen_q, seq, total_q, lid);                  \
    } while (0)
    if (hh < group) {
        FA_FETCH_STEP(hh, fa_bwd_tile_at(pos, t_begin, t_end, rot), 0);
        fa_bwd_ld_store(Ls, Ds, lnext, dnext, lid);
    }

    int stage = 0;
    while (hh < group) {
        const int h = hk * group + hh, q0 = fa_bwd_tile_at(pos, t_begin, t_end, rot) * BR;
        FA_SCORE_DECL(b, h, seq.len_q, seq.len_k);
        int nhh = hh, npos = pos;
        fa_bwd_next_step(&nhh, &npos, tile_map, tile_cols, k0, t_begin, t_end, rot);
        const int more = nhh < group, nt = fa_bwd_tile_at(npos, t_begin, t_end, rot);
#ifdef DROPOUT
        const uint bh = (uint)b * (uint)heads_q + (uint)h;
#else
        const uint bh = 0u;
#endif
        fa_copy_wait();
#ifdef FA_BWD_WGMMA
        fa_wg_fence();
#endif
        barrier(CLK_LOCAL_MEM_FENCE); /* this step's tiles, L and D are in; the last dQ products are done */
#if STAGES == 2
        if (more) FA_FETCH_STEP(nhh, nt, stage ^ 1);
#endif
        __local const ushort *const Qs = qd + 2 * stage * QT_ELEMS;
        __local const ushort *const dOs = Qs + DO_OFFSET;

        /* The tile's queries in chunks of QC from qc0. */
        for (int qc0 = 0; qc0 < BR; qc0 += QC) {
            __local const ushort *const Qc = Qs + qc0 * QROW;
            __local const ushort *const dOc = dOs + qc0 * QROW;

            /* S^T = K Q^T and dP^T = V dO^T, one after the other: only one
             * product's operands are live at a time. */
            fa_c st[KT][NQ], pt[KT][NQ];
            FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
                FA_MMA_UNROLL for (int j = 0; j < NQ; j++)
                    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) st[kt][j].x[e] = pt[kt][j].x[e] = 0.0f;
#ifdef FA_BWD_WGMMA
            fa_wg_keys_by_queries_ss(st[0], Ks, Qc);
            fa_wg_keys_by_queries_rs(pt[0], va[0], dOc);
#else
            fa_bwd_keys_by_queries(st, K_TILE, (fa_a(*)[KS])0, K_PACKED, Qc, key_base, fc);
            fa_bwd_keys_by_queries(pt, V_TILE, V_REGS, V_PACKED, dOc, key_base, fc);
#endif

            /* P (times z keep_scale) into st, dS into pt. Whole tiles test
             * no element. */
            const int partial = fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_FEED_KEYS) == FA_TILE_PARTIAL;
            FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
                FA_MMA_UNROLL for (int j = 0; j < NQ; j++) {
                    const int kc = key_base + kt * FA_M, ql0 = qc0 + j * FA_N;
                    fa_c seen;
                    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) seen.x[e] = 1.0f;
                    if (partial) fa_frag_mask(&seen, &mask, block_mask, q0, ql0, k0, kc, 1, 0.0f, fc);
#ifdef DROPOUT
                    const uint keep = fa_frag_keep(&drop, bh, (uint)k0 + (uint)kc, (uint)q0 + (uint)ql0, 1, fc);
#endif
#ifdef FA_SCORE_OPTIONS
                    fa_c cg; /* score options: base-2 logits into st, cap_grad into cg (common.h) */
                    fa_frag_logit2(&st[kt][j], &cg, &sc, q0, ql0, k0, kc, 1, fc);
#endif
                    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
                        const int ql = ql0 + FA_C_COL(fc.lane, e);
                        const float pv = fa_exp2(fma(st[kt][j].x[e], scale_log2, -Ls[ql]));
                        const float z = FA_KEEP_SCALE(keep, e, drop_scale);
                        const int vis = seen.x[e] != 0.0f;
                        pt[kt][j].x[e] = vis ? pv * (pt[kt][j].x[e] * z - Ds[ql]) * FA_CAP_GRAD(cg.x[e]) : 0.0f;
                        st[kt][j].x[e] = vis ? pv * z : 0.0f;
                    }
                }

#ifdef DQ_ATOMIC
            /* dS for dQ += dS K below. */
            FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
                FA_MMA_UNROLL for (int j = 0; j < NQ; j++)
                    fa_put_c_t(dSs, LDD, key_base + kt * FA_M, qc0 + j * FA_N, &pt[kt][j], fc);
#endif

            /* dV += (z P)^T dO and dK += dS^T Q, k over the chunk's queries. */
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
                    fa_put_c(PTs, LDT, key_base + kt * FA_M, qc0 + j * FA_N, &st[kt][j], 1.0f, fc);
                    fa_put_c(dSTs, LDT, key_base + kt * FA_M, qc0 + j * FA_N, &pt[kt][j], 1.0f, fc);
                }
            barrier(CLK_LOCAL_MEM_FENCE);
#endif
#ifdef FA_BWD_WGMMA
            fa_wg_regs_by_rows_rs(dva[0], ap[0], dOc);
            fa_wg_regs_by_rows_rs(dka[0], as[0], Qc);
            if (0)
#endif
            FA_MMA_UNROLL for (int kq = 0; kq < KQ; kq++) {
#if !FA_C2A_REGS
                fa_a ap[KT], as[KT];
                FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) {
                    fa_load_a(&ap[kt], PTs, LDT, key_base + kt * FA_M, qc0 + kq * FA_K, fc);
                    fa_load_a(&as[kt], dSTs, LDT, key_base + kt * FA_M, qc0 + kq * FA_K, fc);
                }
#define A_P(kt, kq) ap[kt]
#define A_S(kt, kq) as[kt]
#endif
                FA_MMA_UNROLL for (int j = 0; j < DT; j += FA_BP) {
                    fa_b bo[FA_BP], bq[FA_BP];
                    fa_load_bp_kn(bo, j + 1 < DT, dOc, QLD, kq * FA_K, j * FA_N, fc);
                    FA_MMA_UNROLL for (int n = 0; n < FA_BP; n++)
                        if (j + n < DT) FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) fa_mma(&dva[kt][j + n], &A_P(kt, kq), &bo[n], fc);
                    fa_load_bp_kn(bq, j + 1 < DT, Qc, QLD, kq * FA_K, j * FA_N, fc);
                    FA_MMA_UNROLL for (int n = 0; n < FA_BP; n++)
                        if (j + n < DT) FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++) fa_mma(&dka[kt][j + n], &A_S(kt, kq), &bq[n], fc);
                }
            }
#undef A_P
#undef A_S
        }

        barrier(CLK_LOCAL_MEM_FENCE); /* dS is in; this step's Q, dO, L and D are done with */
#if STAGES == 1
        if (more) FA_FETCH_STEP(nhh, nt, 0);
#endif
#ifdef DQ_ATOMIC
        fa_bwd_dq_atomic(dq_acc, dSs, K_TILE, K_PACKED, b, h, q0, heads_q, seqlen_q, seq, total_q, fc);
#endif
        if (more) fa_bwd_ld_store(Ls, Ds, lnext, dnext, lid);
        hh = nhh;
        pos = npos;
#if STAGES == 2
        stage ^= 1;
#endif
    }
#undef FA_FETCH_STEP
    fa_copy_wait();
    barrier(CLK_LOCAL_MEM_FENCE);

    /* dK (scaled) and dV through the K and V tiles (K's twice with VREG
     * and KPACK, where Ks is the Q/dO buffers), then 16-byte stores. */
    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
        FA_MMA_UNROLL for (int j = 0; j < DT; j++) fa_put_c(Ks, LDS, key_base + kt * FA_M, j * FA_N, &dka[kt][j], scale, fc);
#if defined(VREG) || defined(KPACK)
    barrier(CLK_LOCAL_MEM_FENCE);
    fa_store_rows(dkg, k_ss, Ks, BC, seq.len_k - k0, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
        FA_MMA_UNROLL for (int j = 0; j < DT; j++) fa_put_c(Ks, LDS, key_base + kt * FA_M, j * FA_N, &dva[kt][j], 1.0f, fc);
    barrier(CLK_LOCAL_MEM_FENCE);
    fa_store_rows(dvg, v_ss, Ks, BC, seq.len_k - k0, lid);
#else
    FA_MMA_UNROLL for (int kt = 0; kt < KT; kt++)
        FA_MMA_UNROLL for (int j = 0; j < DT; j++) fa_put_c(Vs, LDS, key_base + kt * FA_M, j * FA_N, &dva[kt][j], 1.0f, fc);
    barrier(CLK_LOCAL_MEM_FENCE);
    fa_store_rows(dkg, k_ss, Ks, BC, seq.len_k - k0, lid);
    fa_store_rows(dvg, v_ss, Vs, BC, seq.len_k - k0, lid);
#endif
#undef V_TILE
#undef V_REGS
#undef K_TILE
#undef K_PACKED
#undef V_PACKED
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

/* dS = P (z keep_scale dP - D) into dp, for the strip from row_base
 * against the key tile at k0 (s: the scores; l2, dd: L in log2 units and
 * D of the lane's row slots). `masked` as in fa_bwd_p_ds. */
FA_FN void fa_bwd_ds_rows(fa_c *dp, const fa_c *s, const float *l2, const float *dd, fa_mask mask,
                          __global const uchar *block_mask, fa_dropout drop, uint bh, int q0, int k0,
                          int row_base, float scale_log2, int masked, fa_frag_ctx fc) {
    (void)drop;
    (void)bh;
    FA_MMA_UNROLL for (int j = 0; j < NT; j++) {
        fa_c seen;
        FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) seen.x[e] = 1.0f;
        if (masked) fa_frag_mask(&seen, &mask, block_mask, q0, row_base, k0, j * FA_N, 0, 0.0f, fc);
#ifdef DROPOUT
        const uint keep = fa_frag_keep(&drop, bh, (uint)q0 + (uint)row_base, (uint)k0 + (uint)(j * FA_N), 0, fc);
#endif
        FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
            const int r = FA_C_SLOT(e);
            const float pv = fa_exp2(fma(s[j].x[e], scale_log2, -l2[r]));
            const float z = FA_KEEP_SCALE(keep, e, drop.keep_scale);
            dp[j].x[e] = !masked || seen.x[e] != 0.0f ? pv * (dp[j].x[e] * z - dd[r]) : 0.0f;
        }
    }
}

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
    FA_SCORE_DECL(b, h, seq.len_q, seq.len_k);
#ifdef DROPOUT
    const uint bh = (uint)b * (uint)heads_q + (uint)h;
#else
    const uint bh = 0u;
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
            FA_MMA_UNROLL for (int j = 0; j < NT; j += FA_BP) {
                fa_b bk[FA_BP], bv[FA_BP];
                fa_load_bp_nk(bk, j + 1 < NT, Ks, LDS, j * FA_N, ks * FA_K, fc);
                fa_load_bp_nk(bv, j + 1 < NT, Vs, LDS, j * FA_N, ks * FA_K, fc);
                FA_MMA_UNROLL for (int n = 0; n < FA_BP; n++)
                    if (j + n < NT) {
                        fa_mma(&s[j + n], &aq, &bk[n], fc);
                        fa_mma(&dp[j + n], &ao, &bv[n], fc);
                    }
            }
        }

#ifdef FA_SCORE_OPTIONS
        /* Score options: base-2 logits into s, cap_grad into cg (common.h). */
        fa_c cg[NT];
        FA_MMA_UNROLL for (int j = 0; j < NT; j++) fa_frag_logit2(&s[j], &cg[j], &sc, q0, row_base, k0, j * FA_N, 0, fc);
#endif
        if (fa_tile_class(&mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED) == FA_TILE_PARTIAL)
            fa_bwd_ds_rows(dp, s, l2, dd, mask, block_mask, drop, bh, q0, k0, row_base, scale_log2, 1, fc);
        else
            fa_bwd_ds_rows(dp, s, l2, dd, mask, block_mask, drop, bh, q0, k0, row_base, scale_log2, 0, fc);
#ifdef SOFTCAP
        FA_MMA_UNROLL for (int j = 0; j < NT; j++)
            FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) dp[j].x[e] *= cg[j].x[e];
#endif

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
            FA_MMA_UNROLL for (int j = 0; j < DT; j += FA_BP) {
                fa_b bk[FA_BP];
                fa_load_bp_kn(bk, j + 1 < DT, Ks, LDS, kp * FA_K, j * FA_N, fc);
                FA_MMA_UNROLL for (int n = 0; n < FA_BP; n++)
                    if (j + n < DT) fa_mma(&acc[j + n], &a, &bk[n], fc);
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
